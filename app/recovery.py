"""Outages ridden out: which failures an outage explains, and how long the job waits before it tries again.

Any failure stops the streaming query (Spark ends it, and the batch under way is read again from the checkpoint at
the next start: nothing is skipped, and the exactly-once bookkeeping makes the replay harmless). app/job.py starts
the query again in the same process when `outage_of` says a service was out of reach:

- the broker: Kafka's client timed out or lost its connection (Spark's own Kafka retries are spent);
- the registry: connection errors, timeouts, HTTP 429 and 5xx through all of the client's retries (a 404, an
  unknown schema id, is a record's problem and goes to the dead letters instead, app/batch/planner.py);
- the object store and the metastore: connection refused, reset or timed out, HTTP 503 / SlowDown.

Any other failure (a config error, a record the job cannot apply in fail-fast mode, a bug) ends the job at once.
Waits double from `recovery.backoff_s` up to `recovery.max_backoff_s`; once an outage has lasted
`recovery.give_up_after_s` with no batch completed, the job ends with OutageError (exit 1), naming what it waited for.
"""
from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Final

from app.config import RecoveryConfig
from app.errors import OutageError, PipelineError, RegistryError, SinkWriteError

# What is out of reach, told by the words of the error; checked in this order, the first match names it.
SERVICES: list[tuple[str, re.Pattern[str]]] = [
    ("the broker (kafka.bootstrap_servers)", re.compile(
        r"org\.apache\.kafka\.common\.errors|org\.apache\.kafka\.common\.KafkaException|"
        r"Timed out waiting for a node assignment|Timed out waiting to send the call|bootstrap")),
    ("the metastore (metastore.jdbc_url)", re.compile(
        r"metastore|javax\.jdo|datanucleus|HiveSync|meta sync", re.IGNORECASE)),
    ("the object store (lake paths)", re.compile(
        r"s3a?://|amazonaws|org\.apache\.hadoop\.fs\.s3a|Unable to execute HTTP request", re.IGNORECASE)),
]
# Words of a failure to reach a service, matched in the messages of an error and its causes: refused, reset or
# timed-out connections, object-store throttling or unavailability, a metastore's transport, Kafka's client timeouts
# (its client retries on its own until the API timeout, then gives these), PostgreSQL's JDBC refusal. Also what a
# table's unit tries again before failing its batch (app/sink/quarantine.py).
UNREACHABLE: Final = (
    "Status Code: 503", "StatusCode: 503", "HTTP 503", "Service Unavailable", "SlowDown", "Throttl",
    "java.net.SocketTimeoutException", "java.net.ConnectException", "Connection refused", "Connection reset",
    "Read timed out", "connect timed out", "Broken pipe", "No route to host",
    "org.apache.thrift.transport.TTransportException", "Unable to execute HTTP request", "NoHttpResponseException",
    "ConnectTimeoutException", "ConnectionPoolTimeoutException",
    "org.apache.kafka.common.errors.TimeoutException", "org.apache.kafka.common.errors.DisconnectException",
    "org.apache.kafka.common.errors.NetworkException", "Timed out waiting for a node assignment",
    "Timed out waiting to send the call",
    "Check that the hostname and port are correct", "Communications link failure",
)


def unreachable(text: str) -> bool:
    """Whether `text` (an error's messages) says a service was out of reach."""
    return any(words in text for words in UNREACHABLE)


def outage_of(error: BaseException) -> str | None:
    """What an outage kept the job from reaching, when one explains `error` (its causes included); else None.

    A RegistryError names the registry when it was unreachable through its retries and is never an outage
    otherwise; the job's other own errors are never outages, except a failed write (SinkWriteError), whose cause
    decides."""
    for e in _chain(error):
        if isinstance(e, RegistryError):
            return "the registry (registry.url)" if e.unreachable else None
        if isinstance(e, PipelineError) and not isinstance(e, SinkWriteError):
            return None
    text = error_text(error)
    if not unreachable(text):
        return None
    for service, words in SERVICES:
        if words.search(text):
            return service
    return "a service (connection refused or timed out)"


def error_text(error: BaseException) -> str:
    """Every message of an error and its causes, JVM ones included (`_texts`), as one text to look for words in."""
    return "\n".join(_texts(error))


def _chain(error: BaseException) -> Iterator[BaseException]:
    """The error and its causes, Python's (`raise ... from`) and pyspark's (`cause` of a captured JVM error)."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [error]
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        cause = getattr(e, "cause", None)
        todo += [e.__cause__, e.__context__, cause if isinstance(cause, BaseException) else None]


def _texts(error: BaseException) -> Iterator[str]:
    """Every message of the chain: a captured JVM error's description and its stack trace with the JVM causes
    (`stackTrace`), a Py4JJavaError's text (its Java trace), a Python error's message."""
    for e in _chain(error):
        for attribute in ("desc", "stackTrace"):
            value = getattr(e, attribute, None)
            if isinstance(value, str):
                yield value
        try:
            yield str(e)
        except Exception:  # a JVM gone, say: its other texts still count
            yield type(e).__name__


@dataclass
class Wait:
    """One wait of an outage: how long, the attempt it precedes, the seconds the outage has lasted so far."""

    seconds: float
    attempt: int
    lasted_s: float


class Recovery:
    """The waits of the outages of one run: each failure an outage explains asks `wait_for`; a batch completed
    since the previous failure starts a new outage (its clock and its backoff from the beginning)."""

    def __init__(self, config: RecoveryConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.clock = clock
        self.since: float | None = None  # when the current outage began (its first failure)
        self.attempts = 0
        self._batches = -1  # batches completed at the previous failure

    def wait_for(self, service: str, error: BaseException, batches_done: int) -> Wait:
        """The wait before the next attempt.

        Raises:
            OutageError: the outage has lasted `give_up_after_s` (not 0); names the service and the last error.
        """
        now = self.clock()
        if self.since is None or batches_done != self._batches:
            self.since, self.attempts = now, 0
        self._batches = batches_done
        self.attempts += 1
        lasted = now - self.since
        give_up = self.config.give_up_after_s
        if give_up and lasted >= give_up:
            raise OutageError(
                f"gave up after {lasted:.0f} s (recovery.give_up_after_s={give_up:g}) and {self.attempts} attempts "
                f"waiting for {service}; last error: {_first_line(error)}"
            ) from error
        seconds = min(self.config.backoff_s * 2 ** (self.attempts - 1), self.config.max_backoff_s)
        if give_up:
            seconds = min(seconds, give_up - lasted)  # the last attempt comes when the time is up, not later
        return Wait(seconds, self.attempts + 1, lasted)


def _first_line(error: BaseException) -> str:
    for text in _texts(error):
        for line in text.splitlines():
            if line.strip():
                return f"{type(error).__name__}: {line.strip()[:400]}"
    return type(error).__name__
