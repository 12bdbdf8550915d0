"""Per-table quarantine: a Silver table whose writes keep failing with an error that no retry can cure (Hudi refusing
an incompatible schema change) stops taking writes; its records go to the dead letters (app/sink/deadletters.py,
kind `quarantined`) and every other table goes on.

A quarantine is one small JSON file beside the table, `<silver>/<database>/_cdc_quarantine/<table>.json` (the table,
the reason, the batch and time it began, the table's topics), written before the table's records of that batch go to
the dead letters, so it survives restarts and a lost checkpoint. The job reads the files once per run; removing a
file (after the fix, docs/when-things-go-wrong.md "Quarantine") and restarting the job lifts the quarantine.

Which failures quarantine and which are waited out (`failure_kind`): only the listed deterministic errors
quarantine. A transient error (object-store throttling or unavailability, a connection or metastore timeout) is
tried again and, should it last, fails the batch (read again at the next start): it never quarantines. Any other
error fails the batch as before.
"""
from __future__ import annotations

import json
import logging
import threading
from dataclasses import asdict, dataclass
from typing import Final, Literal

from py4j.protocol import Py4JError
from pyspark.sql import SparkSession

from app.config import JobConfig
from app.errors import EnvelopeError, SourceSettingError
from app.recovery import unreachable
from app.sink.lakefs import list_files, read_text, write_text

log = logging.getLogger(__name__)

QUARANTINE_FOLDER: Final = "_cdc_quarantine"
QUARANTINED: Final = "quarantined"  # the dead letters' error kind for the records of a quarantined table

# Errors no retry cures: the table's writes would fail the same way at every batch (matched in the error's text,
# Java causes included).
QUARANTINING: Final = (
    # Hudi refuses the batch's schema (decimal(6,2) widened to decimal(12,2): MISSING_UNION_BRANCH, Avro's check)
    "org.apache.hudi.exception.SchemaBackwardsCompatibilityException",
    "org.apache.hudi.exception.SchemaCompatibilityException",
    "MISSING_UNION_BRANCH",
    "org.apache.hudi.exception.HoodieNullSchemaTypeException",
)
FailureKind = Literal["transient", "quarantine", "other"]


def failure_kind(error: BaseException) -> FailureKind:
    """What a table unit's failure calls for: `transient` (try again), `quarantine`, or `other` (fail the batch).

    Transient wins over quarantining when a text holds both: an outage must never quarantine a table.
    """
    text = _chain_text(error)
    if unreachable(text):  # app/recovery.py: the words of an outage
        return "transient"
    refused = isinstance(error, EnvelopeError) and not isinstance(error, SourceSettingError)
    if refused or any(marker in text for marker in QUARANTINING):
        return "quarantine"
    return "other"


def _chain_text(error: BaseException) -> str:
    """The messages of the error and its causes, Java's included (a Py4JJavaError's text holds the JVM's "Caused
    by:" lines), without stack frames: only what was thrown is matched, not where."""
    parts = []
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        parts.append(f"{type(current).__name__}: {current}")
        if isinstance(current, EnvelopeError):
            break
        current = current.__cause__ or current.__context__
    lines = "\n".join(parts).splitlines()
    return "\n".join(line for line in lines if not line.lstrip().startswith("at "))


@dataclass(frozen=True)
class QuarantineEntry:
    table: str  # the Silver table's qualified name
    reason: str
    batch_id: int
    at: str
    topics: tuple[str, ...]


class Quarantine:
    """The job's quarantined tables (module docstring), read once per run, shared by the planner and the writer."""

    def __init__(self, config: JobConfig) -> None:
        self.config = config
        self.tables: dict[str, QuarantineEntry] = {}
        self._loaded = False
        self._lock = threading.Lock()

    def path(self, database: str, table: str) -> str:
        return f"{self.config.lake.silver_path.rstrip('/')}/{database}/{QUARANTINE_FOLDER}/{table}.json"

    def load(self, spark: SparkSession) -> None:
        """Read the quarantine files of every database the job writes (once per run)."""
        if self._loaded:
            return
        for database in self.config.databases:
            root = f"{self.config.lake.silver_path.rstrip('/')}/{database}/{QUARANTINE_FOLDER}"
            for name in list_files(spark, root, ".json"):
                try:
                    raw = json.loads(read_text(spark, f"{root}/{name}"))
                    entry = QuarantineEntry(raw["table"], raw["reason"], int(raw["batch_id"]), raw["at"],
                                            tuple(raw.get("topics", ())))
                except (ValueError, KeyError, TypeError, Py4JError) as e:
                    log.error("quarantine file %s/%s cannot be read (%s): left alone, the table is not quarantined",
                              root, name, e)
                    continue
                self.tables[entry.table] = entry
        self._loaded = True

    def reason(self, table: str) -> str | None:
        with self._lock:
            entry = self.tables.get(table)
        return None if entry is None else entry.reason

    def add(self, spark: SparkSession, database: str, table: str, entry: QuarantineEntry) -> None:
        """Quarantine a table: its file first (one object: all or nothing on S3), then the in-memory set."""
        write_text(spark, self.path(database, table), json.dumps(asdict(entry), indent=2))
        with self._lock:
            self.tables[entry.table] = entry
