"""Bronze keyed by offset range (app/sink/bronze.py): replays write nothing twice, a batch re-read with other
boundaries writes only what no complete range holds, and a range without its marker is never read."""
from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from chispa import assert_df_equality
from pyspark.sql import DataFrame, SparkSession

from app.sink.bronze import MARKER, BronzeRange, bronze_rows, list_ranges, read_bronze, write_bronze
from app.wire.source import KAFKA_SCHEMA

TS = datetime(2024, 1, 2, 3, 30, tzinfo=UTC)


def kafka_batch(spark: SparkSession, records: dict[tuple[str, int], range]) -> DataFrame:
    rows = [
        (f"k{o}".encode(), None if o % 5 == 4 else f"v{o}".encode(), topic, partition, o, TS, 0,
         [("h", bytes([o % 256]))] if o % 2 else None)
        for (topic, partition), offsets in records.items() for o in offsets
    ]
    return spark.createDataFrame(rows, KAFKA_SCHEMA)


def offsets_of(records: dict[tuple[str, int], range]) -> dict[tuple[str, int], tuple[int, int]]:
    return {tp: (r.start, r.stop - 1) for tp, r in records.items()}


def held(spark: SparkSession, bronze: str) -> list[tuple[str, int, int]]:
    df = read_bronze(spark, bronze)
    return [] if df is None else sorted((r.topic, r.partition, r.offset) for r in df.collect())


def test_bronze_rows_keep_the_kafka_columns_as_read(spark: SparkSession) -> None:
    kafka_df = kafka_batch(spark, {("p.s.t", 0): range(7, 9)})
    assert bronze_rows(kafka_df).columns == [
        "topic", "partition", "offset", "timestamp", "timestampType", "key", "value", "headers"
    ]


def test_a_batch_lands_as_one_complete_range_per_partition_and_reads_back_as_read(
    spark: SparkSession, tmp_path: Path
) -> None:
    bronze = str(tmp_path / "bronze")
    records = {("p.s.a", 0): range(0, 10), ("p.s.a", 1): range(3, 6), ("p.s.b", 0): range(100, 104)}
    kafka_df = kafka_batch(spark, records)

    result = write_bronze(kafka_df, bronze, offsets_of(records))

    assert result.written == offsets_of(records) and result.skipped == 0
    assert list_ranges(spark, bronze, "p.s.a", 1) == [BronzeRange("p.s.a", 1, 3, 5)]
    assert (Path(BronzeRange("p.s.b", 0, 100, 103).folder(bronze)) / MARKER).exists()
    read = read_bronze(spark, bronze)
    assert read is not None
    assert_df_equality(read, kafka_df, ignore_row_order=True, ignore_nullable=True)


def test_a_replayed_batch_writes_nothing_and_an_overlapping_one_only_the_new_offsets(
    spark: SparkSession, tmp_path: Path
) -> None:
    bronze = str(tmp_path / "bronze")
    first = {("p.s.a", 0): range(0, 10)}
    write_bronze(kafka_batch(spark, first), bronze, offsets_of(first))

    replay = write_bronze(kafka_batch(spark, first), bronze, offsets_of(first))
    assert (replay.written, replay.skipped) == ({}, 10)

    # After a lost checkpoint the same offsets come back cut differently: 5..14.
    overlapping = {("p.s.a", 0): range(5, 15)}
    result = write_bronze(kafka_batch(spark, overlapping), bronze, offsets_of(overlapping))

    assert (result.written, result.skipped) == ({("p.s.a", 0): (10, 14)}, 5)
    assert held(spark, bronze) == [("p.s.a", 0, o) for o in range(15)]  # each offset once


def test_a_range_without_its_marker_is_not_read_and_the_next_write_replaces_it(
    spark: SparkSession, tmp_path: Path
) -> None:
    bronze = str(tmp_path / "bronze")
    records = {("p.s.a", 0): range(0, 4)}
    write_bronze(kafka_batch(spark, records), bronze, offsets_of(records))
    # A write killed between its files and its marker: files of offsets 4..7 in place, no marker. On S3 a reader
    # can list exactly this mid-write.
    cut = {("p.s.a", 0): range(4, 8)}
    write_bronze(kafka_batch(spark, cut), bronze, offsets_of(cut))
    (Path(BronzeRange("p.s.a", 0, 4, 7).folder(bronze)) / MARKER).unlink()
    assert [r.complete for r in list_ranges(spark, bronze, "p.s.a", 0)] == [True, False]
    assert held(spark, bronze) == [("p.s.a", 0, o) for o in range(4)]

    # The replay after the restart is cut differently again: 4..9.
    again = {("p.s.a", 0): range(4, 10)}
    result = write_bronze(kafka_batch(spark, again), bronze, offsets_of(again))

    assert (result.removed_incomplete, result.written) == (1, {("p.s.a", 0): (4, 9)})
    assert [(r.first, r.last, r.complete) for r in list_ranges(spark, bronze, "p.s.a", 0)] == [
        (0, 3, True), (4, 9, True)
    ]
    assert held(spark, bronze) == [("p.s.a", 0, o) for o in range(10)]
    assert not (tmp_path / "bronze" / "_staging").exists() or not any((tmp_path / "bronze" / "_staging").iterdir())
