"""The dead letters: every Kafka record the job cannot decode or apply, one row each, in a Hudi table of the lake
(`<lake.silver_path>/<lake.database>/<dead_letters.table>`, synced to the catalog like the Silver tables).

A row holds the record as it came (key, value and header bytes; topic, partition, offset, Kafka timestamp), the
Silver table it was meant for, its record key as JSON when the key bytes decode with their key schema, why
(`error_kind`, `error_message`: app/cdc/columns.py ERROR_COL), the value's writer schema id, the source position
(empty when it was not readable; null in rows written before 2026-11-29), and the batch and time it was dead-lettered.

Exactly once: the row's key is `<topic>/<partition>/<offset>` and the write is an insert that drops the keys the
table holds already (`hoodie.datasource.insert.dup.policy=drop`), so a batch read again (after a crash, or a lost
checkpoint) adds nothing twice and never overwrites a row. A table's dead letters are written before its own
commit: a crash between the two leaves them written and the table's offsets not, so the batch read again finds the
same records (and the insert drops them). Writes from the writer threads of one batch take turns (one lock).

A row's replay columns (`replay_status`, `replay_detail`, `replayed_at`) stay null until the record is settled:
    applied       scripts/replay_dead_letters.py fed it again and the table holds its change
    superseded    the replay found a newer change of its key in the table
    resnapshotted the job wrote a snapshot read of its key (a Debezium incremental or blocking snapshot), later in
                  the same topic partition: the key's row is the source's again (`DeadLetters.settle`)
    incomplete    replayed, but a column it left out (a TOAST placeholder) had no value to take: a re-snapshot of
                  the key settles it
    failed        the replay met an error again
A key is diverged while one of its dead letters is pending: neither applied, superseded nor resnapshotted.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.avro.functions import from_avro

from app.cdc.columns import ERROR_COL, OFFSET_COL, PARTITION_COL, POSITION_COL, TOPIC_COL
from app.cdc.debezium_types import reader_schema
from app.config import JobConfig
from app.sink.creation import repair_interrupted_creation
from app.sink.hudi import HudiTarget, index_options, lake_target, table_exists, write_options
from app.spark import with_options
from app.wire.registry import SchemaRef
from app.wire.source import KAFKA_SCHEMA

log = logging.getLogger(__name__)

DEAD_LETTER_KEY = "dead_letter_id"
SAMPLE_KEYS = 20  # record keys named per kind in the log line and the batch's figures

# A dead letter's replay state (module docstring).
APPLIED, SUPERSEDED, RESNAPSHOTTED = "applied", "superseded", "resnapshotted"
INCOMPLETE, FAILED = "incomplete", "failed"
SETTLED: Final = (APPLIED, SUPERSEDED, RESNAPSHOTTED)
REPLAY_COLUMNS: Final = {"replay_status": "string", "replay_detail": "string", "replayed_at": "timestamp"}


def is_unsettled() -> Column:
    """A dead letter whose key is still diverged: neither replayed with success nor settled by a snapshot read."""
    return F.col("replay_status").isNull() | ~F.col("replay_status").isin(*SETTLED)


@dataclass
class DeadLetterSummary:
    """What one write added: records per error kind, and the record keys they concern (diverged keys)."""

    kinds: dict[str, int] = field(default_factory=dict)
    keys: list[str] = field(default_factory=list)  # every record key concerned, sorted
    first: str = ""  # the first record, `topic[partition]@offset kind: message`

    @property
    def records(self) -> int:
        return sum(self.kinds.values())


@dataclass
class Settlement:
    """What one table's snapshot reads settled (`DeadLetters.settle`)."""

    records: int = 0  # dead letters marked resnapshotted
    keys: list[str] = field(default_factory=list)  # their record keys, sorted
    pending_keys: list[str] = field(default_factory=list)  # the table's keys still diverged, sorted (up to a limit)


def dead_letter_target(config: JobConfig) -> HudiTarget:
    return lake_target(config.lake, config.dead_letters.table, (DEAD_LETTER_KEY,))


def dead_letter_rows(
    coordinates_df: DataFrame, source_df: DataFrame, table: str, key_schemas: Mapping[SchemaRef, str], batch_id: int
) -> DataFrame:
    """The dead-letter rows of `coordinates_df` (app/batch/plan.py `dead_coordinates`' columns), their bytes read
    from `source_df` (the batch's framed records)."""
    coordinates = coordinates_df.select(
        F.col(TOPIC_COL).alias("topic"), F.col(PARTITION_COL).alias("partition"), F.col(OFFSET_COL).alias("offset"),
        F.col(ERROR_COL), F.col(POSITION_COL),
    )
    joined = coordinates.join(source_df, ["topic", "partition", "offset"])
    return joined.select(
        F.concat_ws("/", "topic", "partition", "offset").alias(DEAD_LETTER_KEY),
        F.col("topic"),
        F.col("partition").alias("kafka_partition"),
        F.col("offset").alias("kafka_offset"),
        F.col("timestamp").alias("kafka_timestamp"),
        F.col("key"),
        F.col("value"),
        F.col("headers") if "headers" in source_df.columns
        else F.lit(None).cast(KAFKA_SCHEMA["headers"].dataType).alias("headers"),
        F.lit(table).alias("source_table"),
        _record_key_json(key_schemas).alias("record_key"),
        F.col(f"{ERROR_COL}.kind").alias("error_kind"),
        F.col(f"{ERROR_COL}.message").alias("error_message"),
        F.col("value_schema_id").alias("schema_id"),
        F.col("value_id_type").alias("schema_id_type"),
        # Never null: a record that never decoded has no position, and Hudi holds a column to the nullability of
        # the table's first write (a table first written by an event in error, whose position is known, would
        # refuse every undecodable record and quarantine after it, and stop the job)
        F.coalesce(F.col(POSITION_COL), F.lit("")).alias("source_position"),
        F.lit(batch_id).cast("long").alias("batch_id"),
        F.current_timestamp().alias("dead_lettered_at"),
        *[F.lit(None).cast(type_).alias(name) for name, type_ in REPLAY_COLUMNS.items()],
    )


def _record_key_json(key_schemas: Mapping[SchemaRef, str]) -> Column:
    """The record's key as JSON, decoded with its key schema; null without a key or a known key schema."""
    key = F.when(F.lit(False), F.lit(None).cast("string"))
    for ref, schema_json in sorted(key_schemas.items()):
        decoded = from_avro(F.col("key_payload"), reader_schema(schema_json), {"mode": "PERMISSIVE"})
        key = key.when(
            (F.col("key_id_type") == ref.id_type) & (F.col("key_schema_id") == ref.id), F.to_json(decoded)
        )
    return key


class DeadLetters:
    """Writes dead letters for one job config; one write at a time."""

    def __init__(self, config: JobConfig) -> None:
        self.config = config
        self.target = dead_letter_target(config)
        self._lock = threading.Lock()
        # The Silver tables with pending dead letters: read from the dead-letter table when first asked, then kept.
        self._pending: set[str] | None = None

    def has_pending(self, spark: SparkSession, table: str) -> bool:
        """Whether `table` has pending dead letters (diverged keys). The first call reads the dead-letter table."""
        with self._lock:
            if self._pending is None:
                self._pending = set()
                if table_exists(spark, self.target.path):
                    rows = self._read(spark).filter(is_unsettled()).select("source_table").distinct().collect()
                    self._pending = {r["source_table"] for r in rows if r["source_table"] is not None}
            return table in self._pending

    def _read(self, spark: SparkSession) -> DataFrame:
        rows = spark.read.format("hudi").load(self.target.path)
        for name, type_ in REPLAY_COLUMNS.items():
            if name not in rows.columns:  # a table written before the replay columns existed
                rows = rows.withColumn(name, F.lit(None).cast(type_))
        return rows

    def write(self, rows_df: DataFrame, batch_id: int, query_id: str, table: str) -> DeadLetterSummary:
        """Insert the rows of `table`'s records (module docstring: exactly once); returns what they hold."""
        rows_df = rows_df.persist()
        try:
            summary = summarize(rows_df)
            options = {
                **write_options(self.target, batch_id, query_id),
                **index_options(self.target, rows_df.sparkSession),
                "hoodie.datasource.write.operation": "insert",
                "hoodie.datasource.insert.dup.policy": "drop",
                "hoodie.datasource.write.precombine.field": "batch_id",
            }
            with self._lock:
                repair_interrupted_creation(rows_df.sparkSession, self.target.path, self.target.qualified_name)
                with_options(rows_df.write.format("hudi"), options).mode("append").save(self.target.path)
                if summary.records and self._pending is not None:
                    self._pending.add(table)
        finally:
            rows_df.unpersist()
        return summary

    def mark(self, rows_df: DataFrame, marks_df: DataFrame, batch_id: int, query_id: str) -> None:
        """Write replay states: `marks_df` (dead_letter_id, replay_status, replay_detail) onto their rows among
        `rows_df` (dead-letter rows as read), an upsert stamped with the time."""
        base = rows_df.drop(*[c for c in rows_df.columns if c.startswith("_hoodie_")], *REPLAY_COLUMNS)
        marked = base.join(marks_df, DEAD_LETTER_KEY).withColumn("replayed_at", F.current_timestamp())
        options = {**write_options(self.target, batch_id, query_id), **index_options(self.target, marked.sparkSession),
                   "hoodie.datasource.write.operation": "upsert",
                   "hoodie.datasource.write.precombine.field": "batch_id"}
        with self._lock:
            with_options(marked.write.format("hudi"), options).mode("append").save(self.target.path)

    def settle(self, reads_df: DataFrame, table: str, batch_id: int, query_id: str, limit: int) -> Settlement:
        """Mark `table`'s pending dead letters that a snapshot read settles: a read of the same record key, later in
        the same topic partition (its row is the source's as of after the dead-lettered change). Returns what was
        settled and the table's keys still diverged (up to `limit`).

        Args:
            reads_df: the batch's snapshot reads of the table: topic, partition, offset, record_key (JSON).
        """
        spark = reads_df.sparkSession
        rows = self._read(spark)
        letters = (rows.filter((F.col("source_table") == table) & is_unsettled())
                   .drop(*[c for c in rows.columns if c.startswith("_hoodie_")]).persist())
        try:
            reads = reads_df.groupBy("topic", "partition", "record_key").agg(F.max("offset").alias("read_offset"))
            settled = letters.alias("l").join(
                reads.alias("r"),
                (F.col("l.topic") == F.col("r.topic")) & (F.col("l.kafka_partition") == F.col("r.partition"))
                & (F.col("l.record_key") == F.col("r.record_key")) & (F.col("l.kafka_offset") < F.col("r.read_offset")),
            ).select(
                F.col(f"l.{DEAD_LETTER_KEY}").alias(DEAD_LETTER_KEY),
                F.lit(RESNAPSHOTTED).alias("replay_status"),
                F.format_string("the snapshot read at %s[%d]@%d (batch %d)", F.col("r.topic"), F.col("r.partition"),
                                F.col("read_offset"), F.lit(batch_id)).alias("replay_detail"),
                F.col("l.record_key").alias("record_key"),
            ).collect()
            if settled:
                marks = spark.createDataFrame([(r[DEAD_LETTER_KEY], r["replay_status"], r["replay_detail"])
                                               for r in settled],
                                              f"{DEAD_LETTER_KEY} string, replay_status string, replay_detail string")
                self.mark(letters, marks, batch_id, query_id)
            ids = [r[DEAD_LETTER_KEY] for r in settled]
            remaining = letters.filter(~F.col(DEAD_LETTER_KEY).isin(*ids)) if ids else letters
            still = [r["record_key"] for r in remaining.filter(F.col("record_key").isNotNull())
                     .select("record_key").distinct().orderBy("record_key").limit(limit).collect()]
            if not remaining.limit(1).count():
                with self._lock:
                    if self._pending is not None:
                        self._pending.discard(table)
        finally:
            letters.unpersist()
        return Settlement(len(settled), sorted({r["record_key"] for r in settled}), still)


def summarize(rows_df: DataFrame) -> DeadLetterSummary:
    """Records per kind, the record keys concerned and the first record: one aggregate."""
    rows = (
        rows_df.groupBy("error_kind")
        .agg(
            F.count(F.lit(1)).alias("n"),
            F.collect_set("record_key").alias("keys"),
            F.min(F.struct("topic", "kafka_partition", "kafka_offset", "error_message")).alias("first"),
        )
        .collect()
    )
    summary = DeadLetterSummary()
    firsts = []
    keys: set[str] = set()
    for row in rows:
        summary.kinds[row["error_kind"]] = row["n"]
        keys.update(row["keys"])
        f = row["first"]
        firsts.append((f["topic"], f["kafka_partition"], f["kafka_offset"], row["error_kind"], f["error_message"]))
    summary.keys = sorted(keys)
    if firsts:
        topic, partition, offset, kind, message = min(firsts)
        summary.first = f"{topic}[{partition}]@{offset} {kind}: {message}"
    return summary
