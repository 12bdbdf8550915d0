"""Deletes the events imply (app/cdc/derived.py): of the rows a full snapshot did not read, a delete each at the row's
own position; of the rows written before a truncate, a delete each at its position. Judged with the batch's events
by the same ordering (app/cdc/unwrap.py with_latest_flag), on small literal DataFrames (chispa)."""
from __future__ import annotations

from typing import Any

from chispa import assert_df_equality
from pyspark.sql import SparkSession
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

from app.cdc.derived import LAST_OFFSET, with_truncate_deletes, with_unread_deletes
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
    return (key, v, op, pos, 1_000, 0, offset, deleted, [], end)


def test_keys_below_the_snapshot_with_nothing_at_or_above_it_get_a_delete(spark: SparkSession) -> None:
    events_df = spark.createDataFrame([
        _e(1, "read", "r", SNAPSHOT, 10),
        _e(6, "inserted", "c", "0040", 11),  # below the snapshot, in this batch only: not read, so gone
        _e(5, "read last", "r", SNAPSHOT, 12, end=True),
    ], EVENTS)
    current_df = spark.createDataFrame([
        ("1", 1, "old", "u", "0010", 1, 0, 3, False),  # read by this batch: left alone
        ("2", 2, "gone", "c", "0020", 1, 0, 4, False),  # not read: deleted upstream meanwhile
        ("3", 3, "read before", "r", SNAPSHOT, 1, 0, 5, False),  # read by an earlier batch of the snapshot
        ("4", 4, "changed after", "u", "0060", 1, 0, 6, False),  # changed after the snapshot
        ("5", 5, "old", "c", "0005", 1, 0, 1, False),
    ], SILVER)

    actual_df = with_unread_deletes(events_df, current_df, ["id"], SNAPSHOT, TS)

    expected_df = spark.createDataFrame([(2, "gone", "d", "0020", TS, -1, LAST_OFFSET, True, [], False),
                                         (6, "inserted", "d", "0040", TS, -1, LAST_OFFSET, True, [], False)], EVENTS)
    assert_df_equality(actual_df.filter("_kafka_partition = -1"), expected_df, ignore_row_order=True,
                       ignore_nullable=True)
    latest = actual_df.transform(with_latest_flag, ["id"]).transform(filter_latest)
    assert sorted((r.id, r._cdc_op, r.v) for r in latest.collect()) == [
        (1, "r", "read"), (2, "d", "gone"), (5, "r", "read last"), (6, "d", "inserted")]


def test_a_delete_at_the_keys_own_position_wins_over_the_event_there(spark: SparkSession) -> None:
    # Key 1's event in the batch is the very version Silver holds (a replay): same position, the delete wins.
    events_df = spark.createDataFrame([_e(1, "v1", "u", "0030", 10), _e(9, "read", "r", SNAPSHOT, 11, end=True)],
                                      EVENTS)
    current_df = spark.createDataFrame([("1", 1, "v1", "u", "0030", 1, 0, 10, False)], SILVER)

    actual_df = with_unread_deletes(events_df, current_df, ["id"], SNAPSHOT, TS)

    latest = actual_df.transform(with_latest_flag, ["id"]).transform(filter_latest).collect()
    assert sorted((r.id, r._cdc_op) for r in latest) == [(1, "d"), (9, "r")]


def test_a_key_with_an_event_in_error_is_left_alone(spark: SparkSession) -> None:
    # Key 3's read could not be applied (a dead letter): it may be a read of the snapshot, so its row stays.
    schema = StructType([*EVENTS.fields, StructField("_cdc_error", StructType(
        [StructField("kind", StringType()), StructField("message", StringType())]))])
    events_df = spark.createDataFrame([(*_e(3, None, "r", SNAPSHOT, 10), ("decode", "bad bytes")),
                                       (*_e(9, "read", "r", SNAPSHOT, 11, end=True), None)], schema)
    current_df = spark.createDataFrame([("3", 3, "kept", "c", "0020", 1, 0, 4, False)], SILVER)

    actual_df = with_unread_deletes(events_df, current_df, ["id"], SNAPSHOT, TS)

    assert actual_df.filter("_kafka_partition = -1").count() == 0


def test_rows_of_the_older_postgresql_format_compare_as_the_new_one(spark: SparkSession) -> None:
    # Written before positions led with the commit LSN: "L" sorts where "L:L" does now.
    snapshot = "00000000/0000000B:00000000/0000000B"
    events_df = spark.createDataFrame([_e(9, "read", "r", snapshot, 11, end=True)], EVENTS)
    current_df = spark.createDataFrame([
        ("1", 1, "older", "c", "00000000/0000000A", 1, 0, 1, False),  # below: not read
        ("2", 2, "read", "r", "00000000/0000000B", 1, 0, 2, False),  # the snapshot's own position: read by it
    ], SILVER)

    deletes = with_unread_deletes(events_df, current_df, ["id"], snapshot, TS).filter("_kafka_partition = -1")

    assert [(r.id, r._cdc_position) for r in deletes.collect()] == [(1, "00000000/0000000A:00000000/0000000A")]


def test_a_soft_delete_table_flags_the_unread_row_and_keeps_its_values(spark: SparkSession) -> None:
    soft = StructType([*EVENTS.fields, StructField("_cdc_deleted", BooleanType()),
                       StructField("_cdc_deleted_at", TimestampType())])
    events_df = spark.createDataFrame([(*_e(9, "x", "r", SNAPSHOT, 10, end=True), False, None)], soft)
    current_df = spark.createDataFrame([
        ("2", 2, "gone", "c", "0020", 1, 0, 4, False, False),
        ("3", 3, "deleted before", "d", "0030", 1, 0, 5, False, True),  # flagged already: left alone
    ], f"{SILVER}, _cdc_deleted boolean")

    rows = with_unread_deletes(events_df, current_df, ["id"], SNAPSHOT, TS).filter("_kafka_partition = -1").collect()

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

    deletes = actual_df.filter("_kafka_partition = -1")
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
