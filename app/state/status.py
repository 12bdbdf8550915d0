"""The job's status: one small JSON document beside the checkpoint (`<checkpoint_path>/status.json`), rewritten
at start and after every batch, and printed by `scripts/status.py --conf <file>`.

It says what the log says, in one place:
- `routes`: which Silver table each subscribed topic feeds, and why when it is not the topic's own table (a
  partition of a partitioned table, a declared shard);
- `tables`: each table's figures from the latest batch that held its topics (`TableBatchStats`, the figures of
  the per-table log line), with that batch's id and time;
- `skipped_topics`: topics whose records feed no table, and why (Debezium's transaction, heartbeat and schema
  change topics; topics refused a Silver table another topic holds, `REFUSED: ...`, until a start no longer
  refuses them; Bronze keeps their records like every other);
- `stale_tables`: Silver tables of the job's databases that no subscribed topic feeds any longer (such as the
  tables of a partitioned table's partitions, made before `catalog` was set), and why;
- `dead_letters`: per Silver table, the records sent to the dead letters so far (app/sink/deadletters.py), per
  error kind, and the record keys they concern: the table's diverged keys, whose Silver row may differ from the
  source until a replay or a re-snapshot (docs/when-things-go-wrong.md "Dead letters");
- `quarantined`: the tables whose records all go to the dead letters (app/sink/quarantine.py), why and since when;
- `last_batch` and `failure`: the latest batch's id, time, duration and tables, and the error that stopped the
  job, if one did;
- `outage`: while the job waits for a service out of reach (app/recovery.py), which one, since when, the attempt
  and the last error; cleared by the next batch;
- `heartbeat_at`: rewritten every `recovery.heartbeat_s` by a timer (`Heartbeat`), also while no batch runs and
  during an outage, so `scripts/status.py --max-age` tells a job that died without a word (SIGKILL, out of memory,
  a lost node) from one that is idle.

The status is informative: nothing decides on it, and failing to write it logs a warning and never fails a batch.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from botocore.exceptions import ClientError
from py4j.protocol import Py4JError
from pyspark.sql import SparkSession
from pyspark.sql.utils import CapturedException

from app.config import JobConfig
from app.routing.route import TableRoute
from app.sink.lakefs import fs_and_path, write_text
from app.state.stats import TableBatchStats

log = logging.getLogger(__name__)

STATUS_FILE = "status.json"
REFUSED = "REFUSED: "  # a skipped topic's reason when another topic holds its table (app/batch/planner.py)
MAX_DIVERGED_KEYS = 1000  # diverged keys listed per table; `diverged_keys_truncated` says when there are more


def status_path(config: JobConfig) -> str:
    """Where the job keeps its status: in its checkpoint folder, one per job (Spark reads only its own folders
    there, and `status.json` is none of them)."""
    return f"{config.lake.checkpoint_path.rstrip('/')}/{STATUS_FILE}"


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def why(route: TableRoute) -> str:
    """Why a topic feeds the table it feeds, when it is not simply its own table's topic; else ''."""
    if route.source_partition is not None:
        return f"partition {route.source_partition} of {route.source_schema}.{route.source_table}"
    if route.merged:
        return f"shard of {route.qualified_name}"
    return ""


@dataclass
class JobStatus:
    """The document `status.json` holds (module docstring); the batch processor keeps it up to date."""

    conf: str = ""
    started_at: str = field(default_factory=now)
    routes: dict[str, dict[str, str]] = field(default_factory=dict)
    stale_tables: dict[str, str] = field(default_factory=dict)
    tables: dict[str, dict[str, Any]] = field(default_factory=dict)
    skipped_topics: dict[str, dict[str, Any]] = field(default_factory=dict)
    dead_letters: dict[str, dict[str, Any]] = field(default_factory=dict)
    quarantined: dict[str, dict[str, Any]] = field(default_factory=dict)  # table -> reason, batch_id, at
    batches: int = 0
    last_batch: dict[str, Any] | None = None
    failure: str | None = None
    # Where the failure happened: {"batch_id", "table", "step", "error"} (None at start or when a batch passed).
    failed_at: dict[str, Any] | None = None
    # While the job waits out an outage: {"service", "since", "attempt", "error", "next_attempt_at"}.
    outage: dict[str, Any] | None = None
    heartbeat_at: str | None = None
    # Per source: when its connector last delivered a record, how long ago, whether stalled (app/state/sources.py).
    sources: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Per-table settings whose table no subscribed topic feeds yet: their key -> the topic expected.
    unmatched_settings: dict[str, str] = field(default_factory=dict)

    def set_routes(self, routes: Iterable[TableRoute]) -> None:
        self.routes = {r.topic: {"table": r.qualified_name, "why": why(r)} for r in routes}

    def record_start(
        self, conf: str, routes: Iterable[TableRoute], skipped: Mapping[str, str], stale: Mapping[str, str]
    ) -> None:
        """A run's start: its config, the subscribed topics' routes, the topics that feed no table (topic ->
        reason; their figures carried from earlier runs) and the stale tables (app/state/stale.py)."""
        self.conf = conf
        self.set_routes(routes)
        for topic in [t for t, s in self.skipped_topics.items() if str(s.get("reason", "")).startswith(REFUSED)]:
            if topic not in skipped:  # a refusal lifted (app/routing/route.py claim_tables): not carried over
                del self.skipped_topics[topic]
        for topic, reason in skipped.items():
            entry = self.skipped_topics.setdefault(topic, {"reason": reason, "batch_id": None, "at": None,
                                                           "records": 0})
            entry["reason"] = reason
        self.stale_tables = dict(stale)

    def record_batch(
        self, batch_id: int, stats: Iterable[TableBatchStats], skipped: Mapping[str, tuple[str, int]],
        duration_s: float,
    ) -> None:
        """A batch done: its tables' figures, its skipped topics (topic -> (reason, records))."""
        at = now()
        names = []
        for s in stats:
            names.append(s.table)
            self.tables[s.table] = {
                "batch_id": batch_id, "at": at,
                **{k: (list(map(str, v)) if k == "schema_ids" else v) for k, v in dataclasses.asdict(s).items()
                   if k not in ("table", "diverged_keys", "settled_keys", "pending_keys")},
            }
            if s.dead_letters or s.pending_keys is not None:
                self._record_dead_letters(s, batch_id, at)
        for topic, (reason, records) in skipped.items():
            self.skipped_topics[topic] = {"reason": reason, "batch_id": batch_id, "at": at, "records": records}
        self.batches += 1
        self.last_batch = {"batch_id": batch_id, "at": at, "duration_s": round(duration_s, 2), "tables": names,
                           "skipped_topics": sorted(skipped)}
        self.failure = None
        self.failed_at = None
        self.outage = None

    def record_outage(self, service: str, error: str, attempt: int, lasted_s: float, wait_s: float) -> None:
        """The job waits `wait_s` for `service` before its attempt `attempt` (app/job.py)."""
        at = datetime.now(UTC)
        self.outage = {
            "service": service, "since": (at - timedelta(seconds=lasted_s)).isoformat(timespec="seconds"),
            "attempt": attempt, "error": error,
            "next_attempt_at": (at + timedelta(seconds=wait_s)).isoformat(timespec="seconds"),
        }

    def _record_dead_letters(self, s: TableBatchStats, batch_id: int, at: str) -> None:
        entry = self.dead_letters.setdefault(s.table, {"records": 0, "kinds": {}, "diverged_keys": [],
                                                       "diverged_keys_truncated": False})
        entry["records"] += s.dead_letters
        for kind, n in s.dead_letter_kinds.items():
            entry["kinds"][kind] = entry["kinds"].get(kind, 0) + n
        if s.pending_keys is not None:  # after snapshot reads settled some: the dead-letter table's own list
            entry["diverged_keys_truncated"] = len(s.pending_keys) > MAX_DIVERGED_KEYS
            entry["diverged_keys"] = s.pending_keys[:MAX_DIVERGED_KEYS]
        else:
            keys = sorted(set(entry["diverged_keys"]) | set(s.diverged_keys))
            entry["diverged_keys_truncated"] = entry["diverged_keys_truncated"] or len(keys) > MAX_DIVERGED_KEYS
            entry["diverged_keys"] = keys[:MAX_DIVERGED_KEYS]
        entry["last_batch_id"], entry["at"] = batch_id, at

    def record_failure(
        self, error: BaseException, batch_id: int | None = None, table: str | None = None, step: str | None = None
    ) -> None:
        """The error that stopped the job: at start (no batch), or in a batch's step, of a table when it was in
        a table's unit (app/batch/writer.py: Step)."""
        where = "at start" if batch_id is None else ", ".join(
            [f"batch {batch_id}", *([f"table {table}"] if table else []), f"step {step}"]
        )
        self.failure = f"{where}: {type(error).__name__}: {error}"
        self.failed_at = None if batch_id is None else {
            "batch_id": batch_id, "table": table, "step": step, "error": type(error).__name__,
        }

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True, default=str)


class Heartbeat:
    """Calls `beat` (which rewrites status.json) every `interval_s` from a daemon thread, until stopped. A beat that
    fails is logged and the next one tries again."""

    def __init__(self, interval_s: float, beat: Callable[[], None]) -> None:
        self.interval_s = interval_s
        self.beat = beat
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="status-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.beat()
            except Exception as e:  # the job goes on; status.json's age will show it if beats keep failing
                log.warning("status heartbeat not written: %s: %s", type(e).__name__, e)


def load_status(spark: SparkSession, config: JobConfig) -> JobStatus:
    """The status document as the job's last run left it, for a new run to carry on (the tables' latest figures,
    the topics skipped so far); a fresh one when there is none or it cannot be read."""
    location = status_path(config)
    try:
        fs, path = fs_and_path(spark, location)
        if not fs.exists(path):
            return JobStatus()
        row = spark.read.text(location, wholetext=True).first()
        raw = json.loads(row[0]) if row is not None else {}
        return JobStatus(tables=dict(raw.get("tables", {})), skipped_topics=dict(raw.get("skipped_topics", {})),
                         dead_letters=dict(raw.get("dead_letters", {})))
    except (Py4JError, CapturedException, ValueError, AttributeError) as e:
        log.warning("previous status at %s not read (%s): starting a new one", location, e)
        return JobStatus()


def write_status(spark: SparkSession, config: JobConfig, status: JobStatus | str) -> None:
    """Rewrite the status document (one small object; on S3 a PUT replaces it whole), `status` or its JSON. Never
    raises."""
    location = status_path(config)
    try:
        write_text(spark, location, status if isinstance(status, str) else status.to_json())
    except Py4JError as e:
        log.warning("status not written to %s: %s", location, str(e).splitlines()[0] if str(e) else e)


def read_status(location: str, s3_endpoint: str | None = None) -> dict[str, Any]:
    """The status document at a local path or an s3:// / s3a:// URI (boto3; `s3_endpoint` for an S3-compatible
    server such as the local stack's).

    Raises:
        FileNotFoundError: there is none yet (the job has not started with this checkpoint).
    """
    if not location.startswith(("s3://", "s3a://")):
        with open(location, encoding="utf-8") as f:
            return dict(json.load(f))
    import boto3  # noqa: PLC0415 - here, not at the top: only tools read a status from S3; the import takes 0.08 s

    bucket, _, key = location.split("://", 1)[1].partition("/")
    client = boto3.client("s3", endpoint_url=s3_endpoint) if s3_endpoint else boto3.client("s3")
    try:
        body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    except ClientError as e:
        if e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
            raise FileNotFoundError(location) from e
        raise
    return dict(json.loads(body.decode("utf-8")))
