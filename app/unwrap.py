"""Debezium envelope unwrap, semantic type mapping and in-batch ordering. Pure DataFrame -> DataFrame steps.

    decoded envelope --filter_data_changes--> c/r/u/d only
                     --unwrap_envelope-----> row image + _cdc_* columns + _hoodie_is_deleted
                     --with_debezium_types-> Spark date/timestamp for Debezium's connect.name types
                     --dedupe_latest-------> one row per record key: the highest (LSN, Kafka offset)
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from app.errors import EnvelopeError

OP_CREATE = "c"
OP_READ = "r"  # snapshot read
OP_UPDATE = "u"
OP_DELETE = "d"
OP_TRUNCATE = "t"
OP_MESSAGE = "m"
DATA_OPS = (OP_CREATE, OP_READ, OP_UPDATE, OP_DELETE)
SKIPPED_OPS = (OP_TRUNCATE, OP_MESSAGE)

# Columns the pipeline adds to every Silver row.
OP_COL = "_cdc_op"
LSN_COL = "_cdc_lsn"  # the Hudi precombine/ordering field
SOURCE_TS_COL = "_cdc_source_ts_ms"
PARTITION_COL = "_kafka_partition"
OFFSET_COL = "_kafka_offset"
DELETED_COL = "_hoodie_is_deleted"
CDC_COLUMNS = (OP_COL, LSN_COL, SOURCE_TS_COL, PARTITION_COL, OFFSET_COL, DELETED_COL)


def _floor_div_1000(c: Column) -> Column:
    # `/` on a long divides as a double, off by up to ~128 ns at today's epoch: divide exactly in decimal.
    return F.floor(c.cast("decimal(20,0)") / 1000).cast("long")


# Debezium semantic types arrive as plain Avro ints/longs/strings tagged with connect.name.
# Naive source timestamps (no zone) follow Debezium's own convention: wall-clock time encoded as if UTC,
# stored as the Spark timestamp of that UTC instant (independent of the JVM's and the session's zone).
CONVERSIONS: dict[str, Callable[[Column], Column]] = {
    "io.debezium.time.Date": lambda c: F.date_add(F.lit("1970-01-01").cast("date"), c),
    "io.debezium.time.Timestamp": F.timestamp_millis,
    "io.debezium.time.MicroTimestamp": F.timestamp_micros,
    "io.debezium.time.NanoTimestamp": lambda c: F.timestamp_micros(_floor_div_1000(c)),
    "io.debezium.time.ZonedTimestamp": F.to_timestamp,
    "org.apache.kafka.connect.data.Date": lambda c: c,  # real Avro logicalType date: already a Spark date
}


def filter_tombstones(df: DataFrame) -> DataFrame:
    """Drop Kafka tombstones (null value): Debezium emits one after each delete, for log compaction."""
    return df.filter(F.col("value").isNotNull())


def filter_data_changes(df: DataFrame) -> DataFrame:
    """Keep create/read/update/delete events; truncate and logical-message events carry no row."""
    return df.filter(F.col("envelope.op").isin(*DATA_OPS))


def unwrap_envelope(df: DataFrame, value_columns: Sequence[str]) -> DataFrame:
    """Flatten each change event into its row image plus ordering and delete columns.

    Upserts take `after`; deletes take `before` (which, without REPLICA IDENTITY FULL, holds only the key
    columns: the rest become null in the delete row, which Hudi drops anyway).

    Args:
        df: rows with `envelope` (decoded Debezium Envelope), `partition`, `offset`.
        value_columns: the Value record's field names, in writer-schema order.
    Raises:
        EnvelopeError: the envelope lacks before/after/op/source.
    """
    envelope_fields = set(df.select("envelope.*").columns)
    missing = {"before", "after", "op", "source"} - envelope_fields
    if missing:
        raise EnvelopeError(f"not a Debezium envelope: missing {sorted(missing)} in {sorted(envelope_fields)}")
    is_delete = F.col("envelope.op") == OP_DELETE
    image = F.when(is_delete, F.col("envelope.before")).otherwise(F.col("envelope.after"))
    return df.select(
        *[image[name].alias(name) for name in value_columns],
        F.col("envelope.op").alias(OP_COL),
        F.col("envelope.source.lsn").cast("long").alias(LSN_COL),
        F.col("envelope.source.ts_ms").alias(SOURCE_TS_COL),
        F.col("partition").alias(PARTITION_COL),
        F.col("offset").alias(OFFSET_COL),
        is_delete.alias(DELETED_COL),
    )


def with_debezium_types(df: DataFrame, value_fields: Sequence[dict[str, Any]]) -> DataFrame:
    """Map Debezium semantic types (by the writer schema's connect.name) to Spark types.

    Args:
        value_fields: the Avro fields of the envelope's Value record (with their connect.name properties).
    """
    converted = []
    for field in value_fields:
        name = field["name"]
        connect_name = _connect_name(field["type"])
        convert = CONVERSIONS.get(connect_name or "")
        converted.append(convert(F.col(name)).alias(name) if convert else F.col(name))
    return df.select(*converted, *[c for c in df.columns if c in CDC_COLUMNS])


def _connect_name(avro_type: Any) -> str | None:
    if isinstance(avro_type, list):  # nullable union: the non-null branch carries the name
        names = [_connect_name(t) for t in avro_type if t != "null"]
        return next((n for n in names if n), None)
    if isinstance(avro_type, dict):
        return avro_type.get("connect.name")
    return None


LATEST_COL = "_cdc_is_latest"


def with_latest_flag(df: DataFrame, key_columns: Sequence[str]) -> DataFrame:
    """Flag the latest event per record key: highest LSN, ties broken by the higher Kafka offset.

    Hudi's precombine orders on the LSN alone; the offset tie-break needs the window.
    """
    order = Window.partitionBy(*key_columns).orderBy(F.col(LSN_COL).desc_nulls_last(), F.col(OFFSET_COL).desc())
    return df.withColumn(LATEST_COL, F.row_number().over(order) == 1)


def filter_latest(flagged_df: DataFrame) -> DataFrame:
    """Keep the events with_latest_flag flagged, without the flag."""
    return flagged_df.filter(F.col(LATEST_COL)).drop(LATEST_COL)


def dedupe_latest(df: DataFrame, key_columns: Sequence[str]) -> DataFrame:
    """Keep only the latest event per record key (see with_latest_flag)."""
    return df.transform(with_latest_flag, key_columns).transform(filter_latest)
