"""Deletes the events imply (app/cdc/derived.py): of the rows a full snapshot did not read, a delete each at the row's
own position; of the rows written before a truncate, a delete each at its position. Judged with the batch's events
by the same ordering (app/cdc/unwrap.py with_latest_flag), on small literal DataFrames (chispa)."""
from __future__ import annotations

from typing import Any

from chispa import assert_df_equality
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from app.cdc.derived import with_truncate_deletes, with_unread_deletes
from app.cdc.unwrap import filter_latest, with_latest_flag

EVENTS = StructType([
    StructField("id", IntegerType()),
    StructField("v", StringType()),
    StructField("_cdc_op", StringType()),
    StructField("_cdc_position", StringType()),
    StructField("_cdc_source_ts_ms", LongType()),
    StructField("_kafka_partition", IntegerType()),
    StructField("_kafka_offset", LongType()),
    StructField("_hoodie_is_deleted", BooleanType()),
    StructField("_cdc_unavailable", ArrayType(StringType())),
    StructField("_cdc_snapshot_end", BooleanType()),
])
# The Silver table as read: Hudi's columns and the job's, no internal ones.
SILVER = "_hoodie_record_key string, id int, v string, _cdc_op string, _cdc_position string, " \
         "_cdc_source_ts_ms long, _kafka_partition int, _kafka_offset long, _hoodie_is_deleted boolean"
SNAPSHOT = "0050"  # every read of the full snapshot carries its position
TS = 5_000


def _e(key: int, v: str | None, op: str, pos: str, offset: int, *, end: bool = False) -> tuple[Any, ...]:
    deleted = op == "d"
    return (key, v, op, pos, None if offset < 0 else 1_000, 0 if offset >= 0 else -1, offset, deleted, [], end)


def _unread_delete(key: int, v: str, pos: str) -> tuple[Any, ...]:
    return (key, v, "d", pos, TS, -1, -1, True, [], False)


def test_rows_below_the_snapshot_not_read_get_a_delete_and_the_reads_win(spark: SparkSession) -> None:
    events_df = spark.createDataFrame([
        _e(1, "read", "r", SNAPSHOT, 10),
        _e(5, "read last", "r", SNAPSHOT, 11, end=True),
    ], EVENTS).withColumn("_cdc_source_ts_ms", F.lit(TS).cast("long"))
    current_df = spark.createDataFrame([
        ("1", 1, "old", "u", "0010", 1, 0, 3, False),  # read by this batch: the read wins
        ("2", 2, "gone", "c", "0020", 1, 0, 4, False),  # not read: deleted upstream meanwhile
        ("3", 3, "read before", "r", SNAPSHOT, 1, 0, 5, False),  # read by an earlier batch of the snapshot
        ("4", 4, "changed after", "u", "0060", 1, 0, 6, False),  # changed after the snapshot
        ("5", 5, "old", "c", "0005", 1, 0, 1, False),
    ], SILVER)

    actual_df = with_unread_deletes(events_df, current_df, ["id"], SNAPSHOT, TS)

    expected_df = spark.createDataFrame([
        _e(1, "read", "r", SNAPSHOT, 10),
        _e(5, "read last", "r", SNAPSHOT, 11, end=True),
        _unread_delete(1, "old", "0010"),
        _unread_delete(2, "gone", "0020"),
        _unread_delete(5, "old", "0005"),
    ], EVENTS).withColumn("_cdc_source_ts_ms", F.lit(TS).cast("long"))
    assert_df_equality(actual_df, expected_df, ignore_row_order=True, ignore_nullable=True)
    latest = actual_df.transform(with_latest_flag, ["id"]).transform(filter_latest)
    assert sorted((r.id, r._cdc_op, r.v) for r in latest.collect()) == [
        (1, "r", "read"), (2, "d", "gone"), (5, "r", "read last")]


def test_a_delete_at_the_rows_position_loses_to_a_real_event_at_the_same_position(spark: SparkSession) -> None:
    # The snapshot's read of key 1 at a position equal to the row's: the read (a real offset) is the latest.
    events_df = spark.createDataFrame([_e(1, "read", "r", SNAPSHOT, 10, end=True)], EVENTS)
    current_df = spark.createDataFrame([("1", 1, "old", "u", "0010", 1, 0, 3, False)], SILVER)

    actual_df = with_unread_deletes(events_df, current_df, ["id"], "0011", TS)

    latest = actual_df.transform(with_latest_flag, ["id"]).transform(filter_latest).collect()
    assert [(r.id, r._cdc_op) for r in latest] == [(1, "r")]


def test_a_soft_delete_table_flags_the_unread_row_and_keeps_its_values(spark: SparkSession) -> None:
    soft = StructType([*EVENTS.fields, StructField("_cdc_deleted", BooleanType()),
                       StructField("_cdc_deleted_at", TimestampType())])
    events_df = spark.createDataFrame([(*_e(9, "x", "r", SNAPSHOT, 10, end=True), False, None)], soft)
    current_df = spark.createDataFrame([
        ("2", 2, "gone", "c", "0020", 1, 0, 4, False, False),
        ("3", 3, "deleted before", "d", "0030", 1, 0, 5, False, True),  # flagged already: left alone
    ], f"{SILVER}, _cdc_deleted boolean")

    rows = with_unread_deletes(events_df, current_df, ["id"], SNAPSHOT, TS).filter("_kafka_offset = -1").collect()

    assert [(r.id, r.v, r._hoodie_is_deleted, r._cdc_deleted, r._cdc_deleted_at is not None) for r in rows] == [
        (2, "gone", False, True, True)]


def test_a_truncate_deletes_every_key_written_before_it_and_later_events_win(spark: SparkSession) -> None:
    truncated = "0040"
    events_df = spark.createDataFrame([
        _e(1, "before", "u", "0030", 10),  # in the batch, before the truncate: gone
        _e(2, "after", "c", "0045", 12),  # inserted after it: stays
        _e(3, "before", "c", "0035", 11),
        _e(3, "again", "c", "0050", 13),  # re-inserted after it: stays, its later value
    ], EVENTS)
    current_df = spark.createDataFrame([
        ("1", 1, "old", "c", "0010", 1, 0, 1, False),
        ("4", 4, "old", "c", "0020", 1, 0, 2, False),  # only in Silver: gone
    ], SILVER)

    actual_df = with_truncate_deletes(events_df, current_df, ["id"], truncated, TS)

    deletes = actual_df.filter("_kafka_offset = -1")
    assert sorted((r.id, r._cdc_op, r._cdc_position, r._hoodie_is_deleted) for r in deletes.collect()) == [
        (1, "d", truncated, True), (3, "d", truncated, True), (4, "d", truncated, True)]
    latest = actual_df.transform(with_latest_flag, ["id"]).transform(filter_latest)
    assert sorted((r.id, r._cdc_op, r.v) for r in latest.collect()) == [
        (1, "d", "before"), (2, "c", "after"), (3, "c", "again"), (4, "d", "old")]


def test_a_truncate_before_the_table_exists_deletes_the_batchs_earlier_rows_only(spark: SparkSession) -> None:
    events_df = spark.createDataFrame([_e(1, "before", "c", "0030", 10), _e(2, "after", "c", "0045", 12)], EVENTS)

    latest = (with_truncate_deletes(events_df, None, ["id"], "0040", TS)
              .transform(with_latest_flag, ["id"]).transform(filter_latest))

    assert sorted((r.id, r._cdc_op) for r in latest.collect()) == [(1, "d"), (2, "c")]
