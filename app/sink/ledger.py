"""Deletes that stay deleted: the delete ledger of a hard-delete table, and the verdict on each event.

A hard delete removes the row from the Silver table, and with it the position Hudi's ordering would compare a
later event against. An older upsert of that key arriving in a later batch (Debezium redelivery after a
connector restart, a rebuild from Bronze, a replay) would then bring the row back. So each hard-delete table
keeps a ledger beside it. Before a batch is written, its events are judged against the ledger:

    an upsert at or below the key's ledger position   -> blocked: not written (`blocked` in the log line)
    an upsert above it (a re-insert)                  -> written, and the key leaves the ledger
    a delete                                          -> written, and recorded (the ledger keeps the highest)

Above the ledger: the facts are joined to a batch's events only when one of its upserts could be at or below one
of them. The job knows each ledger's highest fact position (`LedgerView`: read once per process, then kept up to
date by its own writes; any folder it did not write, found by the listing every batch makes, reads it again). A
batch of a table fed by one source whose lowest latest upsert is above that position can block nothing, so it is
judged without the facts (a streaming table's batches are, each newer than the last); otherwise it is judged again
with them (a redelivery, a replay, a rebuild). Judged without them, a re-insert is written but not recorded: its
key keeps its delete fact, which still blocks only events at or below the delete, older than it, as before; the
ledger then holds keys that are live again, which no reader takes for deleted (only the writer reads the ledger).

The ledger is a set of facts about the source, plain Parquet: "key K was deleted at position P" and "key K was
re-inserted at position P", the key as JSON of its columns (`{"id":5}`: the same text for an int and a bigint, so a
key column widened later still matches its older facts; the schema of the facts never changes). A key is in the ledger,
at its delete's position, when its fact of the highest position is a delete. A fact recorded twice, early or late
changes nothing: a delete at P only ever blocks events at or below P, which are older than the delete and must never
be written after it. So the ledger's file states are all safe as long as a batch's facts are complete before its
Silver commit, and no file is rewritten:

    <ledger>/b<batch id, 12 digits>-<8 hex>/part-*.parquet, _COMPLETE   one write of a batch's facts
    <ledger>/c<batch id>-<8 hex>/...                                     a compaction of earlier folders

A folder counts once its `_COMPLETE` marker exists (written after Spark's write has put its file in the folder, where
its task writes it: app/sink/lakefs.py `direct_parquet`): one without it is a write killed half-way, whose facts a
replay of the batch writes again in a folder of its own. Written before the Silver commit of the same batch: a batch
killed between the two has its facts recorded, and its replay writes both again (the duplicate facts are harmless).

Compaction: once `COMPACT_AFTER` folders have gathered, they are read, each key's highest fact kept (keys whose
highest fact is a re-insert dropped: the live row's own position protects them through Hudi's ordering), written
as one `c` folder, and only then the merged folders (and any incomplete ones) removed. Killed before the new folder
has its marker, the old ones stand; killed after, old and new hold the same facts until the next compaction.

Retention: a deleted key's fact is kept for good: an older event can come back at any time (Bronze replays have
no horizon), so there is no age after which dropping one is safe. One small row per deleted key: the key as
JSON, position and source time.

Until 2026-11 the ledger was a Hudi table at the same path; such a ledger is read once and turned into a folder
of facts (`migrate_legacy`), then its Hudi files are removed.

One writer per table (this job): a second job or a replay writing the same table at the same time could race it.
Soft-delete tables need no ledger: the deleted row stays, flagged, with its position (see app/cdc/unwrap.py).
"""
from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Sequence
from typing import Final

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from app.cdc.columns import (
    BLOCKED_COL,
    DELETED_COL,
    LATEST_COL,
    LEDGER_KEY_COL,
    LEDGER_POSITION_COL,
    POSITION_COL,
    REINSERT_COL,
    SOURCE_TS_COL,
)
from app.sink.lakefs import delete_path, direct_parquet, fs_and_path, list_files

log = logging.getLogger(__name__)

COMPACT_AFTER: Final = 16  # complete fact folders before they are merged into one
MARKER: Final = "_COMPLETE"
FACTS_SCHEMA: Final = (
    f"{LEDGER_KEY_COL} string, {POSITION_COL} string, {SOURCE_TS_COL} bigint, {REINSERT_COL} boolean"
)
_migrated: set[str] = set()  # ledgers this process found free of a legacy Hudi table


@dataclasses.dataclass(frozen=True)
class LedgerView:
    """A hard-delete table's ledger as a batch finds it: its complete fact folders and the highest position among
    their facts (None: no fact yet)."""

    path: str
    folders: frozenset[str]
    highest: str | None

    def could_block(self, lowest_upsert: str | None) -> bool:
        """Whether a batch whose lowest latest upsert is at `lowest_upsert` (None: no upsert) needs the facts joined:
        some upsert may be at or below one of them (module docstring, "Above the ledger")."""
        return self.highest is not None and lowest_upsert is not None and lowest_upsert <= self.highest

    def current_df(self, spark: SparkSession) -> DataFrame | None:
        """The keys the ledger holds, as `read_ledger` gives them; None without a fact."""
        return _current(_facts(spark, self.path, sorted(self.folders))) if self.folders else None


_seen: dict[str, LedgerView] = {}  # each ledger as this process last found or wrote it (by path)


def ledger_folders(spark: SparkSession, path: str) -> tuple[list[str], list[str]]:
    """The ledger's complete fact folders and its incomplete ones (names, sorted): one recursive listing."""
    files: dict[str, set[str]] = {}
    for name in list_files(spark, path):
        folder, _, rest = name.partition("/")
        if rest and folder[:1] in ("b", "c"):
            files.setdefault(folder, set()).add(rest)
    complete = sorted(f for f, names in files.items() if MARKER in names)
    return complete, sorted(set(files) - set(complete))


def ledger_key(key_columns: Sequence[str]) -> Column:
    """An event's record key as the ledger spells it: JSON of its key columns."""
    return F.to_json(F.struct(*[F.col(c) for c in key_columns]))


def read_ledger(spark: SparkSession, path: str, key_columns: Sequence[str]) -> DataFrame | None:
    """The ledger's (`_cdc_ledger_key`, `_cdc_ledger_position`, source time) rows of the keys it holds, or None
    before the table's first delete. `key_columns`: the table's, for a legacy ledger's migration."""
    migrate_legacy(spark, path, key_columns)
    complete, _ = ledger_folders(spark, path)
    if not complete:
        return None
    return _current(_facts(spark, path, complete))


def open_ledger(spark: SparkSession, path: str, key_columns: Sequence[str]) -> LedgerView:
    """The ledger's complete folders (one recursive listing) and its highest fact position: the one this process
    knows while the folders are those it knows, else read from the facts (one Spark job)."""
    migrate_legacy(spark, path, key_columns)
    complete, _ = ledger_folders(spark, path)
    folders = frozenset(complete)
    known = _seen.get(path)
    if known is not None and known.folders == folders:
        return known
    row = _facts(spark, path, complete).agg(F.max(POSITION_COL)).first() if complete else None
    view = _seen[path] = LedgerView(path, folders, None if row is None else row[0])
    return view


def _facts(spark: SparkSession, path: str, folders: Sequence[str]) -> DataFrame:
    # The schema given: no file is opened to infer it
    return spark.read.schema(FACTS_SCHEMA).parquet(*[f"{path}/{folder}" for folder in folders])


def _current(facts_df: DataFrame) -> DataFrame:
    """Each key's fact of the highest position; the keys whose highest fact is a delete, with its position."""
    highest = F.max(F.struct(F.col(POSITION_COL), F.col(REINSERT_COL), F.col(SOURCE_TS_COL))).alias("f")
    return (
        facts_df.groupBy(LEDGER_KEY_COL).agg(highest)
        .where(~F.col(f"f.{REINSERT_COL}"))
        .select(LEDGER_KEY_COL, F.col(f"f.{POSITION_COL}").alias(LEDGER_POSITION_COL),
                F.col(f"f.{SOURCE_TS_COL}").alias(SOURCE_TS_COL))
    )


def write_ledger(
    judged_df: DataFrame, path: str, key_columns: Sequence[str], batch_id: int, *, highest: str | None = None
) -> str:
    """Record the batch's facts (ledger_changes) in a folder of their own; returns its name. `highest`: the highest
    position among them, when the caller knows it (keeps this process's `LedgerView` of the ledger current)."""
    folder = f"b{batch_id:012d}-{uuid.uuid4().hex[:8]}"
    _write_facts(ledger_changes(judged_df, key_columns), f"{path}/{folder}")
    known = _seen.pop(path, None)  # forgotten (the next batch reads it) unless `highest` keeps it current
    if known is not None and highest is not None:
        _seen[path] = LedgerView(path, known.folders | {folder}, max(highest, known.highest or highest))
    return folder


def _write_facts(facts_df: DataFrame, folder: str) -> None:
    """One Parquet file of facts, written straight into the folder (`direct_parquet`), then the folder's marker."""
    direct_parquet(facts_df.coalesce(1)).parquet(folder)
    fs, marker = fs_and_path(facts_df.sparkSession, f"{folder}/{MARKER}")
    fs.create(marker, True).close()


def compact_ledger(spark: SparkSession, path: str, batch_id: int) -> str | None:
    """Merge the fact folders into one once COMPACT_AFTER of them have gathered (module docstring); returns the new
    folder's name, None when there was nothing to do."""
    complete, incomplete = ledger_folders(spark, path)
    if len(complete) < COMPACT_AFTER:
        return None
    folder = f"c{batch_id:012d}-{uuid.uuid4().hex[:8]}"
    merged_df = _current(_facts(spark, path, complete)).select(
        LEDGER_KEY_COL, F.col(LEDGER_POSITION_COL).alias(POSITION_COL), SOURCE_TS_COL, F.lit(False).alias(REINSERT_COL))
    _write_facts(merged_df, f"{path}/{folder}")
    for old in (*complete, *incomplete):
        delete_path(spark, f"{path}/{old}")
    # The merged facts are a subset of the folders' (keys re-inserted last dropped): the highest stays a bound.
    known = _seen.pop(path, None)
    if known is not None and known.folders == frozenset(complete):
        _seen[path] = dataclasses.replace(known, folders=frozenset({folder}))
    log.info("delete ledger %s: %d folders merged into %s (%d incomplete ones removed)",
             path, len(complete), folder, len(incomplete))
    return folder


def migrate_legacy(spark: SparkSession, path: str, key_columns: Sequence[str]) -> bool:
    """A ledger written as a Hudi table (before 2026-11) turned into a folder of facts, then its Hudi files removed;
    checked once per process and path. Killed before the removal, the next run converts it again (the same facts).
    Returns whether there was one."""
    if path in _migrated:
        return False
    fs, hoodie = fs_and_path(spark, f"{path}/.hoodie")
    if not fs.exists(hoodie):
        _migrated.add(path)
        return False
    legacy_df = spark.read.format("hudi").load(path).select(
        ledger_key(key_columns).alias(LEDGER_KEY_COL), POSITION_COL, F.col(SOURCE_TS_COL).cast("bigint"),
        F.lit(False).alias(REINSERT_COL))
    folder = f"c{0:012d}-{uuid.uuid4().hex[:8]}"
    _write_facts(legacy_df, f"{path}/{folder}")
    fs.delete(hoodie, True)
    _, root = fs_and_path(spark, path)
    for status in fs.listStatus(root):  # the Hudi table's own files, beside the fact folders
        if status.isFile():
            fs.delete(status.getPath(), False)
    log.warning("delete ledger %s: the Hudi table of an earlier version turned into %s", path, folder)
    _migrated.add(path)
    return True


def with_ledger_verdict(events_df: DataFrame, ledger_df: DataFrame | None, key_columns: Sequence[str]) -> DataFrame:
    """Add `_cdc_blocked` and `_cdc_reinsert` to each event (see the module docstring)."""
    if ledger_df is None:
        return events_df.withColumn(BLOCKED_COL, F.lit(False)).withColumn(REINSERT_COL, F.lit(False))
    keyed = events_df.withColumn(LEDGER_KEY_COL, ledger_key(key_columns))
    joined = keyed.join(ledger_df.select(LEDGER_KEY_COL, LEDGER_POSITION_COL), LEDGER_KEY_COL, "left")
    upsert: Column = ~F.col(DELETED_COL)
    ledgered = F.col(LEDGER_POSITION_COL).isNotNull()
    above = F.col(POSITION_COL) > F.col(LEDGER_POSITION_COL)
    return joined.select(
        *[F.col(c) for c in events_df.columns],
        (upsert & ledgered & ~above).alias(BLOCKED_COL),
        (upsert & ledgered & above).alias(REINSERT_COL),
    )


def ledger_changes(judged_df: DataFrame, key_columns: Sequence[str]) -> DataFrame:
    """The batch's facts: each latest delete, and each re-insert (an upsert above its key's delete position).

    Takes the events with the latest flag and the verdict columns.
    """
    latest = F.col(LATEST_COL)
    return judged_df.filter(latest & (F.col(DELETED_COL) | F.col(REINSERT_COL))).select(
        ledger_key(key_columns).alias(LEDGER_KEY_COL),
        F.col(POSITION_COL),
        F.col(SOURCE_TS_COL).cast("bigint"),
        F.col(REINSERT_COL),
    )
