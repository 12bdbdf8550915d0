"""One error hierarchy for the pipeline: every failure a user can act on is a PipelineError."""
from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


class PipelineError(Exception):
    """Base of every error the pipeline raises on purpose."""


class ConfigError(PipelineError):
    """The YAML config is invalid; the message names the offending key."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        self.message = message
        super().__init__(f"config key '{key}': {message}")


class RegistryError(PipelineError):
    """A schema could not be fetched from the registry."""

    def __init__(
        self, schema_id: int | str, url: str, message: str, http_status: int | None = None, *, unreachable: bool = False
    ) -> None:
        self.schema_id = schema_id  # an id, or an artifact's name (its latest version)
        self.url = url
        self.http_status = http_status
        # The registry could not be reached or answered 429/5xx through every retry: an outage, never a bad record.
        self.unreachable = unreachable
        status = f" (HTTP {http_status})" if http_status is not None else ""
        what = f"schema id {schema_id}" if isinstance(schema_id, int) else f"schema {schema_id!r}"
        super().__init__(f"{what} at {url}{status}: {message}")


class RegistryAuthError(PipelineError):
    """The registry's token endpoint refused or failed; names the endpoint, never the secret."""

    def __init__(self, url: str, message: str) -> None:
        self.url = url
        super().__init__(f"registry authentication at {url}: {message}")


class SchemaDecodeError(PipelineError):
    """A Kafka record could not be decoded; names the record and the writer schema id."""

    def __init__(self, topic: str, partition: int, offset: int, schema_id: int | None, message: str) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.schema_id = schema_id
        super().__init__(
            f"cannot decode {topic}[{partition}]@{offset} (schema id {schema_id}): {message}"
        )


class EnvelopeError(PipelineError):
    """A decoded value is not a Debezium envelope the unwrap step understands."""


class SourceSettingError(EnvelopeError):
    """A topic's events contradict the job's own config (a source's `connector` or `events`, a discriminator): the
    job stops, naming the setting, rather than quarantining the table (app/sink/quarantine.py)."""


class ColumnTypeChangeError(EnvelopeError):
    """A column's type changed upstream in a way the lake cannot follow (app/sink/widening.py): the table is
    quarantined (or, in fail-fast mode, the job stops); the message names the table, the column, both types and the
    remedy."""


class SinkWriteError(PipelineError):
    """A Hudi or Bronze write failed; names the table and batch."""


def java_root_cause(exc: BaseException) -> str:
    """The innermost JVM exception behind a py4j/pyspark error, as `Class: message`; else the first line."""
    java = getattr(exc, "java_exception", None) or getattr(exc, "_origin", None)
    if java is None:
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    try:
        while java.getCause() is not None:
            java = java.getCause()
        return str(java.toString())
    except Exception:
        return str(exc).splitlines()[0]


class ResumeError(PipelineError):
    """The checkpoint is missing and the Silver tables do not say where to resume (app/state/resume.py)."""


class RerouteError(PipelineError):
    """A topic now feeds another Silver table than the one that applied its offsets so far (app/state/status.py)."""


class OutageError(PipelineError):
    """An outage (broker, registry, object store, metastore) lasted past `recovery.give_up_after_s`
    (app/recovery.py); names what the job waited for and its last error."""


class InternalError(RuntimeError):
    """Something this code's own logic guarantees did not hold: a bug to report, with what was missing."""


def required(value: T | None, what: str) -> T:
    """`value`, which the caller's logic guarantees is set. A runtime check that `python -O` keeps (an assert
    would be dropped)."""
    if value is None:
        raise InternalError(f"internal error: {what} is missing")
    return value
