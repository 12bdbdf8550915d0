"""The dead letters: every Kafka record the job cannot decode or apply, one row each, in a Hudi table of the lake
(`<lake.silver_path>/<lake.database>/<dead_letters.table>`, synced to the catalog like the Silver tables).

A row holds the record as it came (key, value and header bytes; topic, partition, offset, Kafka timestamp), the
Silver table it was meant for, its record key as JSON when the key bytes decode with their key schema, why
(`error_kind`, `error_message`: app/cdc/columns.py ERROR_COL), the value's writer schema id, the source position
when it was readable, and the batch and time it was dead-lettered.

Exactly once: the row's key is `<topic>/<partition>/<offset>` and the write is an insert that drops the keys the
table holds already (`hoodie.datasource.insert.dup.policy=drop`), so a batch read again (after a crash, or a lost
checkpoint) adds nothing twice and never overwrites a row. A table's dead letters are written before its own
commit: a crash between the two leaves them written and the table's offsets not, so the batch read again finds the
same records (and the insert drops them). Writes from the writer threads of one batch take turns (one lock).
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.avro.functions import from_avro

from app.cdc.columns import ERROR_COL, OFFSET_COL, PARTITION_COL, POSITION_COL, TOPIC_COL
from app.cdc.debezium_types import reader_schema
from app.config import JobConfig
from app.sink.creation import repair_interrupted_creation
from app.sink.hudi import HudiTarget, write_options
from app.wire.registry import SchemaRef
from app.wire.source import KAFKA_SCHEMA

log = logging.getLogger(__name__)

DEAD_LETTER_KEY = "dead_letter_id"
SAMPLE_KEYS = 20  # record keys named per kind in the log line and the batch's figures


@dataclass
class DeadLetterSummary:
    """What one write added: records per error kind, and the record keys they concern (diverged keys)."""

    kinds: dict[str, int] = field(default_factory=dict)
    keys: list[str] = field(default_factory=list)  # every record key concerned, sorted
    first: str = ""  # the first record, `topic[partition]@offset kind: message`

    @property
    def records(self) -> int:
        return sum(self.kinds.values())


def dead_letter_target(config: JobConfig) -> HudiTarget:
    table = config.dead_letters.table
    return HudiTarget(
        database=config.lake.database,
        table=table,
        path=config.lake.table_path(table),
        record_key=(DEAD_LETTER_KEY,),
        retain_commits=config.lake.retain_commits,
    )


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
        F.col(POSITION_COL).alias("source_position"),
        F.lit(batch_id).cast("long").alias("batch_id"),
        F.current_timestamp().alias("dead_lettered_at"),
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

    def write(self, rows_df: DataFrame, batch_id: int, query_id: str) -> DeadLetterSummary:
        """Insert the rows (module docstring: exactly once); returns what they hold."""
        rows_df = rows_df.persist()
        try:
            summary = summarize(rows_df)
            options = {
                **write_options(self.target, batch_id, query_id),
                "hoodie.datasource.write.operation": "insert",
                "hoodie.datasource.insert.dup.policy": "drop",
                "hoodie.datasource.write.precombine.field": "batch_id",
            }
            with self._lock:
                repair_interrupted_creation(rows_df.sparkSession, self.target.path, self.target.qualified_name)
                rows_df.write.format("hudi").options(**options).mode("append").save(self.target.path)
        finally:
            rows_df.unpersist()
        return summary


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
