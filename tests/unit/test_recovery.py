"""Which failures an outage explains, and the waits of an outage (app/recovery.py); the status's outage and
heartbeat (app/state/status.py, scripts/status.py --max-age). Pure: no Spark, no stack."""
from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest

from app.config import RecoveryConfig
from app.errors import (
    ConfigError,
    EnvelopeError,
    OutageError,
    RegistryError,
    SchemaDecodeError,
    SinkWriteError,
)
from app.recovery import Recovery, outage_of
from app.state.status import Heartbeat, JobStatus
from scripts.status import heartbeat_age, parse_age

KAFKA_DOWN = ("[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: Timed out waiting for a node "
              "assignment. Call: listOffsets\n\nJVM stacktrace:\norg.apache.spark.sql.streaming.StreamingQueryException"
              "\nCaused by: org.apache.kafka.common.errors.TimeoutException: Timed out waiting for a node assignment.")
S3_DOWN = ("An error occurred while calling o81.save.\n: org.apache.hadoop.fs.s3a.AWSClientIOException: getFileStatus "
           "on s3a://lake/silver/t/.hoodie: com.amazonaws.SdkClientException: Unable to execute HTTP request: Connect "
           "to 127.0.0.1:41000 [/127.0.0.1] failed: Connection refused")
METASTORE_DOWN = ("An error occurred while calling o90.sql.\n: org.apache.hadoop.hive.ql.metadata.HiveException: "
                  "javax.jdo.JDOFatalDataStoreException: Unable to open a test connection to the given database. "
                  "JDBC url = jdbc:postgresql://127.0.0.1:41001/metastore\nCaused by: org.postgresql.util."
                  "PSQLException: Connection to 127.0.0.1:41001 refused. Check that the hostname and port are correct "
                  "and that the postmaster is accepting TCP/IP connections.")
WRONG_METASTORE_DATABASE = ("org.apache.hadoop.hive.ql.metadata.HiveException: javax.jdo.JDOFatalDataStoreException: "
                            "Unable to open a test connection to the given database. JDBC url = jdbc:postgresql://"
                            '127.0.0.1:5432/nope\nCaused by: org.postgresql.util.PSQLException: FATAL: database "nope" '
                            "does not exist")


class Captured(Exception):
    """The shape of pyspark's CapturedException: a description, the JVM stack trace with its causes, a cause."""

    def __init__(self, desc: str, stack: str = "", cause: BaseException | None = None) -> None:
        super().__init__(desc)
        self.desc, self.stackTrace, self.cause = desc, stack, cause


def _raised_from(error: BaseException, cause: BaseException) -> BaseException:
    try:
        raise error from cause
    except BaseException as e:
        return e


@pytest.mark.parametrize("error, service", [
    (Captured(KAFKA_DOWN), "the broker (kafka.bootstrap_servers)"),
    (Exception(S3_DOWN), "the object store (lake paths)"),
    (Exception(METASTORE_DOWN), "the metastore (metastore.jdbc_url)"),
    (_raised_from(SinkWriteError("batch 3: Bronze write to s3a://lake/bronze: Unable to execute HTTP request"),
                  Exception(S3_DOWN)), "the object store (lake paths)"),
    (RegistryError(7, "http://r/ids/7", "gave up after 5 attempts; last: ConnectionError", unreachable=True),
     "the registry (registry.url)"),
    (RegistryError(7, "http://r/ids/7", "gave up after 5 attempts; last: HTTP 503", 503, unreachable=True),
     "the registry (registry.url)"),
    (Captured("query terminated", "java.net.ConnectException: Connection refused"),
     "a service (connection refused or timed out)"),
])
def test_failures_an_outage_explains_name_the_service(error: BaseException, service: str) -> None:
    assert outage_of(error) == service


def test_the_registry_error_behind_a_failed_query_counts() -> None:
    registry = RegistryError(9, "http://r/ids/9", "gave up", unreachable=True)
    assert outage_of(_raised_from(registry, Captured("[STREAM_FAILED] query terminated"))) is not None
    # Spark's error raised by the job, with the batch's typed error as its cause (pyspark's `cause`).
    assert outage_of(Captured("[STREAM_FAILED]", "", cause=registry)) == "the registry (registry.url)"


@pytest.mark.parametrize("error", [
    RegistryError(7, "http://r/ids/7", "unknown schema id", 404),
    RegistryError(7, "http://r/ids/7", "credentials refused", 401),
    ConfigError("lake.silver_path", "bucket missing; Connection refused"),  # the job's own verdict wins over words
    EnvelopeError("t: not a Debezium event"),
    SchemaDecodeError("t", 0, 5, 3, "malformed data"),
    OutageError("gave up after 60 s waiting for the registry; Connection refused"),
    Captured("[STREAM_FAILED] terminated", "java.lang.NullPointerException\n\tat org.apache.hudi.Foo"),
    Exception(WRONG_METASTORE_DATABASE),  # a wrong setting, not an outage (app/state/preflight.py names it)
    ValueError("a bug"),
])
def test_other_failures_are_not_outages(error: BaseException) -> None:
    assert outage_of(error) is None


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_waits_double_up_to_the_maximum_and_give_up_on_time() -> None:
    clock = Clock()
    recovery = Recovery(RecoveryConfig(backoff_s=5, max_backoff_s=30, give_up_after_s=100), clock)
    error = Exception("Connection refused")
    waits = []
    gave_up = r"gave up after 100 s .* waiting for the broker; last error: Exception: Connection refused"
    with pytest.raises(OutageError, match=gave_up):
        while True:
            wait = recovery.wait_for("the broker", error, batches_done=3)
            waits.append(wait.seconds)
            clock.now += wait.seconds
    assert waits == [5, 10, 20, 30, 30, 5]  # the last one ends at the give-up time
    assert sum(waits) == 100


def test_a_completed_batch_starts_a_new_outage() -> None:
    clock = Clock()
    recovery = Recovery(RecoveryConfig(backoff_s=2, max_backoff_s=60, give_up_after_s=50), clock)
    for _ in range(4):
        clock.now += recovery.wait_for("the registry", Exception(), batches_done=1).seconds
    assert clock.now == 1030
    wait = recovery.wait_for("the registry", Exception(), batches_done=2)  # a batch completed in between
    assert (wait.seconds, wait.attempt, wait.lasted_s) == (2, 2, 0)


def test_zero_never_gives_up() -> None:
    clock = Clock()
    recovery = Recovery(RecoveryConfig(backoff_s=1, max_backoff_s=120, give_up_after_s=0), clock)
    for _ in range(200):
        clock.now += recovery.wait_for("the metastore", Exception(), batches_done=0).seconds
    assert clock.now - 1000 > 20000


def test_the_outage_is_in_the_status_until_the_next_batch() -> None:
    status = JobStatus()
    status.record_outage("the registry (registry.url)", "gave up after 5 attempts", attempt=3, lasted_s=40,
                         wait_s=20)
    outage = status.outage
    assert outage is not None and outage["attempt"] == 3 and outage["service"].startswith("the registry")
    since, next_at = (datetime.fromisoformat(outage[k]) for k in ("since", "next_attempt_at"))
    assert timedelta(seconds=59) <= next_at - since <= timedelta(seconds=61)
    status.record_batch(4, [], {}, 1.0)
    assert status.outage is None


def test_heartbeat_age_and_max_age() -> None:
    now = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
    assert heartbeat_age({"heartbeat_at": "2026-11-27T11:58:00+00:00"}, now) == 120
    assert heartbeat_age({"started_at": "2026-11-27T11:00:00+00:00"}, now) == 3600  # an older job's status
    assert heartbeat_age({}, now) is None
    assert [parse_age(a) for a in ("300", "300s", "5m", "1h")] == [300, 300, 300, 3600]


def test_the_heartbeat_beats_until_stopped() -> None:
    beats = threading.Semaphore(0)
    failed: list[bool] = []

    def beat() -> None:
        beats.release()
        if not failed:
            failed.append(True)
            raise OSError("object store down")  # a failed beat: logged, the next one comes

    heartbeat = Heartbeat(0.01, beat)
    heartbeat.start()
    assert all(beats.acquire(timeout=5) for _ in range(3))
    heartbeat.stop()
