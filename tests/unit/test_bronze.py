"""Bronze keyed by offset range (app/sink/bronze.py): replays write nothing twice, a batch re-read with other
boundaries writes only what no complete range holds, and a range without its marker is never read."""
from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from chispa import assert_df_equality
from pyspark.sql import DataFrame, SparkSession

from app.sink import bronze as bronze_module
from app.sink.bronze import MARKER, BronzeRange, KnownRanges, bronze_rows, list_ranges, read_bronze, write_bronze
from app.sink.lakefs import DIRECT_COMMITTER, direct_parquet
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


def test_a_batchs_files_are_written_in_their_range_folders_and_nothing_else_is_left(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The tasks put their files straight into the range folders (no committer's `_temporary`, no staging folder,
    no `_SUCCESS` of Hadoop's in Bronze's root): each folder holds its Parquet files and, last, its marker."""
    bronze = tmp_path / "bronze"
    (bronze / "_staging" / "left-by-an-earlier-version").mkdir(parents=True)  # removed by the next write
    for records in ({("p.s.a", 0): range(0, 10), ("p.s.b", 1): range(3, 6)}, {("p.s.a", 0): range(10, 12)}):
        write_bronze(kafka_batch(spark, records), str(bronze), offsets_of(records))

    files = sorted(str(f.relative_to(bronze)) for f in bronze.rglob("*") if f.is_file() and not f.name.endswith(".crc"))
    folders = sorted({str(Path(f).parent) for f in files})
    assert folders == [
        f"topic=p.s.a/partition=0/offsets={0:020d}-{9:020d}", f"topic=p.s.a/partition=0/offsets={10:020d}-{11:020d}",
        f"topic=p.s.b/partition=1/offsets={3:020d}-{5:020d}",
    ]
    for folder in folders:
        names = [Path(f).name for f in files if str(Path(f).parent) == folder]
        assert MARKER in names and len(names) >= 2, names
        assert all(n == MARKER or (n.startswith("part-") and n.endswith(".parquet")) for n in names), names
    assert not (bronze / "_staging").exists()


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


def test_a_writers_known_ranges_list_each_partition_once_and_give_the_same_writes(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream's Bronze writes (`KnownRanges`): each partition folder listed at its first batch only, then kept by
    the writes; a replay, a batch re-read with other boundaries and a failed write give what listing gives."""
    bronze = str(tmp_path / "bronze")
    listed: list[tuple[str, int, int]] = []

    def counted(spark: SparkSession, path: str, topic: str, partition: int, since: int = 0, **kw: object
                ) -> list[BronzeRange]:
        listed.append((topic, partition, since))
        return list_ranges(spark, path, topic, partition, since, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(bronze_module, "list_ranges", counted)
    known = KnownRanges()
    for start in (10, 20, 30):
        records = {("p.s.a", 0): range(start, start + 10), ("p.s.a", 1): range(start, start + 5)}
        assert write_bronze(kafka_batch(spark, records), bronze, offsets_of(records), known).written == \
            offsets_of(records)
    assert listed == [("p.s.a", 0, 10), ("p.s.a", 1, 10)]  # the first batch's only

    replay = {("p.s.a", 0): range(30, 40)}
    assert (write_bronze(kafka_batch(spark, replay), bronze, offsets_of(replay), known).skipped, len(listed)) == (10, 2)
    earlier = {("p.s.a", 0): range(5, 10)}  # offsets below those listed: listed again
    result = write_bronze(kafka_batch(spark, earlier), bronze, offsets_of(earlier), known)
    assert (result.written, result.skipped, listed[-1]) == ({("p.s.a", 0): (5, 9)}, 0, ("p.s.a", 0, 5))

    # A write that fails after its files are in place, before its marker: the partition is forgotten, listed again
    # by the next write, which removes what the failure left.
    cut = {("p.s.a", 0): range(40, 45)}

    def failing_marker(*args: object, **kw: object) -> None:
        publish(*args, **kw)  # type: ignore[arg-type]
        (Path(BronzeRange("p.s.a", 0, 40, 44).folder(bronze)) / MARKER).unlink()
        raise OSError("killed before the marker")

    publish = bronze_module._publish
    monkeypatch.setattr(bronze_module, "_publish", failing_marker)
    with pytest.raises(OSError):  # made again from a listing (below), and failing again
        write_bronze(kafka_batch(spark, cut), bronze, offsets_of(cut), known)
    assert listed[-1] == ("p.s.a", 0, 40)
    calls = len(listed)
    monkeypatch.setattr(bronze_module, "_publish", publish)
    again = {("p.s.a", 0): range(40, 47)}
    result = write_bronze(kafka_batch(spark, again), bronze, offsets_of(again), known)
    assert (result.removed_incomplete, result.written) == (1, {("p.s.a", 0): (40, 46)})
    assert listed[calls:] == [("p.s.a", 0, 40)]  # the failed partition listed again
    assert held(spark, bronze) == sorted([("p.s.a", 0, o) for o in range(5, 47)]
                                         + [("p.s.a", 1, o) for s in (10, 20, 30) for o in range(s, s + 5)])
    calls = len(listed)  # what it knows is what a listing finds, without one
    assert known.ranges(spark, bronze, "p.s.a", 0, 40) == list_ranges(spark, bronze, "p.s.a", 0, since=40)
    assert len(listed) == calls  # (the test's own call is to the function itself, not counted)


def test_a_range_another_writer_added_is_found_by_a_listing_not_written_twice(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Two writers of one Bronze (a test's second processor; the job is its Bronze's only writer): the first's
    knowledge lacks what the second wrote, its write fails on the range folder it finds in place, and is made
    again from a listing: each offset once."""
    bronze = str(tmp_path / "bronze")
    first, second = KnownRanges(), KnownRanges()
    one, two = {("p.s.a", 0): range(0, 10)}, {("p.s.a", 0): range(10, 20)}
    write_bronze(kafka_batch(spark, one), bronze, offsets_of(one), first)
    assert write_bronze(kafka_batch(spark, two), bronze, offsets_of(two), second).written == offsets_of(two)

    again = write_bronze(kafka_batch(spark, two), bronze, offsets_of(two), first)

    assert (again.written, again.skipped) == ({}, 10)
    assert held(spark, bronze) == [("p.s.a", 0, o) for o in range(20)]
    assert [(r.first, r.last) for r in list_ranges(spark, bronze, "p.s.a", 0)] == [(0, 9), (10, 19)]


def test_with_speculation_on_the_writes_keep_hadoops_committer() -> None:
    """Two attempts of one task would write the same file straight into the folder: with `spark.speculation` on,
    Bronze's and the ledger's writes go through Hadoop's committer (app/sink/lakefs.py `direct_parquet`)."""

    class Writer:
        def __init__(self) -> None:
            self.options: dict[str, str] = {}

        def option(self, key: str, value: str) -> Writer:
            self.options[key] = value
            return self

    def frame(speculation: str | None) -> Any:
        conf = {} if speculation is None else {"spark.speculation": speculation}
        return SimpleNamespace(sparkSession=SimpleNamespace(conf=conf), write=Writer())

    assert direct_parquet(frame(None)).options == {"spark.sql.parquet.output.committer.class": DIRECT_COMMITTER}
    assert direct_parquet(frame("false")).options == {"spark.sql.parquet.output.committer.class": DIRECT_COMMITTER}
    assert direct_parquet(frame("true")).options == {}
    assert direct_parquet(frame(" TRUE ")).options == {}
