"""Values an event does not carry (app/cdc/unwrap.py with_carried_values / with_soft_deletes, app/cdc/unavailable.py)
and the delete ledger's verdict (app/sink/ledger.py), on small literal DataFrames (chispa)."""
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
)

from app.cdc.unavailable import filter_current_rows, with_current_rows
from app.cdc.unwrap import with_carried_values, with_latest_flag, with_soft_deletes
from app.sink.ledger import ledger_changes, with_ledger_verdict

EVENTS = StructType([
    StructField("id", IntegerType()),
    StructField("doc", StringType()),
    StructField("n", IntegerType()),
    StructField("_cdc_op", StringType()),
    StructField("_cdc_position", StringType()),
    StructField("_cdc_source_ts_ms", LongType()),
    StructField("_kafka_partition", IntegerType()),
    StructField("_kafka_offset", LongType()),
    StructField("_hoodie_is_deleted", BooleanType()),
    StructField("_cdc_unavailable", ArrayType(StringType())),
])


def _e(  # noqa: PLR0917 - one positional field per event column keeps the tables below readable
    key: int, doc: str | None, n: int | None, op: str, pos: int, offset: int, unavailable: list[str] | None = None
) -> tuple[Any, ...]:
    return (key, doc, n, op, f"{pos:08d}", 1000 * pos, 0, offset, op == "d", unavailable or [])


def test_placeholder_takes_the_previous_value_of_its_key_in_source_order(spark: SparkSession) -> None:
    events_df = spark.createDataFrame([
        _e(1, "big", 1, "c", 10, 1),
        _e(1, None, 2, "u", 20, 2, ["doc"]),  # doc untouched: carried from the insert
        _e(1, None, 3, "u", 30, 3),  # a real NULL: stays NULL
        _e(1, None, 4, "u", 40, 4, ["doc"]),  # carried: the NULL the previous update set
        _e(2, None, 5, "u", 50, 5, ["doc"]),  # no earlier version in the batch: still unavailable
        _e(3, None, 6, "u", 70, 7, ["doc"]),  # out of offset order: the insert is earlier by position
        _e(3, "v3", 6, "c", 60, 8),
    ], EVENTS)

    actual_df = events_df.transform(with_carried_values, ["id"], ["doc"])

    expected_df = spark.createDataFrame([
        _e(1, "big", 1, "c", 10, 1),
        _e(1, "big", 2, "u", 20, 2),
        _e(1, None, 3, "u", 30, 3),
        _e(1, None, 4, "u", 40, 4),
        _e(2, None, 5, "u", 50, 5, ["doc"]),
        _e(3, "v3", 6, "u", 70, 7),
        _e(3, "v3", 6, "c", 60, 8),
    ], EVENTS)
    assert_df_equality(actual_df, expected_df, ignore_row_order=True, ignore_nullable=True)


def test_an_upsert_after_a_delete_takes_nothing_from_before_it(spark: SparkSession) -> None:
    events_df = spark.createDataFrame([
        _e(1, "old", 1, "c", 10, 1),
        _e(1, None, None, "d", 20, 2),
        # a primary-key change into key 1 whose TOASTed doc was not sent: nothing before the delete applies
        _e(1, None, 3, "c", 30, 3, ["doc"]),
        _e(1, None, 4, "u", 40, 4, ["doc"]),  # the create above lacks doc too: still unresolved
    ], EVENTS)

    actual_df = events_df.transform(with_carried_values, ["id"], ["doc"])

    expected_df = spark.createDataFrame([
        _e(1, "old", 1, "c", 10, 1),
        _e(1, None, None, "d", 20, 2),
        _e(1, None, 3, "c", 30, 3, ["doc"]),
        _e(1, None, 4, "u", 40, 4, ["doc"]),
    ], EVENTS)
    assert_df_equality(actual_df, expected_df, ignore_row_order=True, ignore_nullable=True)


def test_current_row_supplies_a_value_the_batch_lacks_but_not_a_newer_one(spark: SparkSession) -> None:
    events_df = spark.createDataFrame([
        _e(2, None, 5, "u", 50, 5, ["doc"]),
        _e(4, None, 9, "u", 15, 6, ["doc"]),  # older than the table's row: the current row is not earlier
    ], EVENTS)
    current_df = spark.createDataFrame(
        [(2, "stored", 4, "00000040"), (4, "newer", 9, "00000020"), (7, "other key", 1, "00000001")],
        "id int, doc string, n int, _cdc_position string",
    )

    actual_df = (
        events_df.transform(with_current_rows, current_df, ["id"])
        .transform(with_carried_values, ["id"], ["doc"])
        .transform(filter_current_rows)
    )

    expected_df = spark.createDataFrame([
        _e(2, "stored", 5, "u", 50, 5),
        _e(4, None, 9, "u", 15, 6, ["doc"]),
    ], EVENTS)
    assert_df_equality(actual_df, expected_df, ignore_row_order=True, ignore_nullable=True)


def test_soft_delete_keeps_the_values_of_a_key_only_before_image(spark: SparkSession) -> None:
    events_df = spark.createDataFrame([_e(1, "doc", 7, "c", 10, 1), _e(1, None, None, "d", 20, 2)], EVENTS)

    actual_df = (
        events_df.transform(with_soft_deletes, ["id"], ["id", "doc", "n"])
        .transform(with_carried_values, ["id"], ["doc", "n"])
        .select("id", "doc", "n", "_cdc_op", "_hoodie_is_deleted", "_cdc_deleted", "_cdc_unavailable")
    )

    expected: list[tuple[Any, ...]] = [(1, "doc", 7, "c", False, False, []), (1, "doc", 7, "d", False, True, [])]
    assert sorted(tuple(r) for r in actual_df.collect()) == expected
    deleted_at = events_df.transform(with_soft_deletes, ["id"], ["id", "doc", "n"]).filter("_cdc_deleted").first()
    assert deleted_at is not None and deleted_at["_cdc_deleted_at"].timestamp() == 20.0


def test_a_redelivered_soft_delete_keeps_the_values_of_the_soft_deleted_row(spark: SparkSession) -> None:
    soft_df = spark.createDataFrame([_e(1, None, None, "d", 20, 2)], EVENTS).transform(
        with_soft_deletes, ["id"], ["id", "doc", "n"]
    )
    current_df = spark.createDataFrame(
        [(1, "kept", 7, "00000020", True)], "id int, doc string, n int, _cdc_position string, _cdc_deleted boolean"
    )

    actual_df = (
        soft_df.transform(with_current_rows, current_df, ["id"])
        .transform(with_carried_values, ["id"], ["doc", "n"])
        .transform(filter_current_rows)
    )

    assert [(r["doc"], r["n"], r["_cdc_deleted"]) for r in actual_df.collect()] == [("kept", 7, True)]


def test_ledger_blocks_older_upserts_and_releases_newer_ones(spark: SparkSession) -> None:
    events_df = spark.createDataFrame([
        _e(1, "stale", 1, "u", 10, 1),  # below the delete at 30: blocked
        _e(2, "again", 2, "c", 40, 2),  # above the delete at 30: a re-insert
        _e(3, "live", 3, "u", 10, 3),  # not in the ledger
        _e(4, None, None, "d", 50, 4),  # a new delete
        _e(1, "also stale", 1, "u", 30, 5),  # at the delete's own position: blocked
    ], EVENTS).transform(with_latest_flag, ["id"])
    # The ledger's keys are JSON of the key columns (app/sink/ledger.py): an int key matches a bigint one's facts
    ledger_df = spark.createDataFrame([('{"id":1}', "00000030"), ('{"id":2}', "00000030")],
                                      "_cdc_ledger_key string, _cdc_ledger_position string")

    judged_df = with_ledger_verdict(events_df, ledger_df, ["id"])

    verdicts = {(r["id"], r["_kafka_offset"]): (r["_cdc_blocked"], r["_cdc_reinsert"]) for r in judged_df.collect()}
    assert verdicts == {
        (1, 1): (True, False), (2, 2): (False, True), (3, 3): (False, False), (4, 4): (False, False),
        (1, 5): (True, False),
    }
    changes = {
        (r["_cdc_ledger_key"], r["_cdc_position"], r["_cdc_reinsert"])
        for r in ledger_changes(judged_df, ["id"]).collect()
    }
    assert changes == {('{"id":2}', "00000040", True), ('{"id":4}', "00000050", False)}  # a re-insert, a delete


def test_without_a_ledger_nothing_is_blocked(spark: SparkSession) -> None:
    events_df = spark.createDataFrame([_e(1, "x", 1, "u", 10, 1)], EVENTS)

    judged_df = with_ledger_verdict(events_df, None, ["id"])

    assert [(r["_cdc_blocked"], r["_cdc_reinsert"]) for r in judged_df.collect()] == [(False, False)]
