"""Bronze: the raw copy of every Kafka record, as Parquet, keyed by offset range, written before Silver.

Layout, one folder per (topic, partition, first and last offset) of a batch:

    <bronze>/topic=<topic>/partition=<p>/offsets=<first>-<last>/part-*.parquet   (offsets: 20 digits)
    <bronze>/topic=<topic>/partition=<p>/offsets=<first>-<last>/_SUCCESS         (written last)

Each row keeps the key, value and header bytes, the offset, the Kafka timestamp and its type as read.

Ranges, not batch ids, name the folders, because batch ids restart when a checkpoint is lost. A range folder
is **complete** once its `_SUCCESS` marker exists, and only complete folders are read (`read_bronze`): a folder's
files appear one by one as the write's tasks finish them, so a reader may list a folder without its marker, with
some or all of its files; that folder is not part of Bronze yet. The marker is written after the write has ended,
every file in place, so a complete folder holds the whole range.

A write, per (topic, partition) of the batch:
  1. folders without a marker (a write killed half-way; it always lies at or above the batch's first offset)
     are removed: this job is the only writer of its Bronze;
  2. records inside a complete folder's range are dropped: a replayed batch writes nothing, a batch re-read
     with other boundaries (after a lost checkpoint) writes only the offsets no complete folder holds;
  3. the rest is written by one Spark write of the batch straight into the range folders (their files put in place
     by the tasks, none moved after: jvm/ `io.cdclake.sink.DirectOutputCommitter`; on S3 a move is a copy, and
     Hadoop's own committer moves each file twice), then each folder's marker written. A range folder found in
     place before the write fails it: the stream's ranges known (below) missed another writer's.
So every offset is in exactly one complete folder, whatever was killed when. A stream lists each partition's folder
at its first batch only and then keeps what it wrote (`KnownRanges`): the folder gains a range per batch, and its
listing grows with it (1.7 s for 5,000 ranges on the local stack's S3 server).
"""
from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from app.sink.lakefs import delete_path, direct_parquet, fs_and_path

log = logging.getLogger(__name__)

BRONZE_COLUMNS: Final = ("topic", "partition", "offset", "timestamp", "timestampType", "key", "value", "headers")
MARKER: Final = "_SUCCESS"
STAGING: Final = "_staging"  # where earlier versions staged a batch's files; removed at each write
RANGE_LEVEL: Final = "offsets"  # the folder level of a range, below its partition's
_RANGE = re.compile(r"offsets=(\d{20})-(\d{20})")

TopicPartition = tuple[str, int]


@dataclass(frozen=True)
class BronzeRange:
    topic: str
    partition: int
    first: int
    last: int
    complete: bool = True

    def folder(self, bronze_path: str) -> str:
        return f"{partition_folder(bronze_path, self.topic, self.partition)}/{range_name(self.first, self.last)}"


@dataclass
class BronzeWrite:
    """What one Bronze write did, for the batch's log line."""

    written: dict[TopicPartition, tuple[int, int]]
    skipped: int = 0  # records already in a complete range
    removed_incomplete: int = 0


def partition_folder(bronze_path: str, topic: str, partition: int) -> str:
    # Kafka topic names ([A-Za-z0-9._-]) hold nothing Spark escapes in partition folder names.
    return f"{bronze_path.rstrip('/')}/topic={topic}/partition={partition}"


def range_name(first: int, last: int) -> str:
    return f"{RANGE_LEVEL}={first:020d}-{last:020d}"


def bronze_rows(kafka_df: DataFrame) -> DataFrame:
    """The Bronze projection of a Kafka source frame: the raw columns."""
    return kafka_df.select(*BRONZE_COLUMNS)


def list_ranges(
    spark: SparkSession, bronze_path: str, topic: str, partition: int, since: int = 0, *,
    skip: Callable[[int, int], bool] | None = None,
) -> list[BronzeRange]:
    """The range folders of one (topic, partition) that reach offset `since` or beyond, complete or not, by first
    offset (and that `skip(first, last)` does not leave out). Only those get their marker looked up (one request
    each): a writer passes its batch's first offset.
    A folder left without a marker always reaches the next batch's start: Bronze is written before the Silver
    commits the restart resumes after, so an unfinished range lies at or above them."""
    fs, folder = fs_and_path(spark, partition_folder(bronze_path, topic, partition))
    if not fs.exists(folder):
        return []
    ranges = []
    for status in fs.listStatus(folder):
        match = _RANGE.fullmatch(status.getPath().getName())
        if not (status.isDirectory() and match) or int(match[2]) < since:
            continue
        first, last = int(match[1]), int(match[2])
        if skip is not None and skip(first, last):
            continue
        complete = fs.exists(_jpath(spark, f"{status.getPath().toString()}/{MARKER}"))
        ranges.append(BronzeRange(topic, partition, first, last, complete))
    return sorted(ranges, key=lambda r: (r.first, r.last))


class KnownRanges:
    """The range folders of each (topic, partition) that reach a stream's offsets, as one writer of a Bronze knows
    them, so that its batches list a partition's folder once, not at every batch: the folder gains a range per
    batch, and its listing grew with it (Bronze's write 0.82 s a batch in a 30-minute soak's first sixth, 0.99 s in
    its last; docs/performance.md). The job is its Bronze's only writer, so once listed a folder changes only by its
    own writes, which `write_bronze` adds. A write that fails forgets the partitions of its batch, and one that took
    ranges from what was known is made again at once from a listing, which finds what the failure left (a folder
    without its marker) and any range another writer added. Asked for offsets below those it listed (a batch read
    again from earlier offsets), a partition is listed again."""

    def __init__(self) -> None:
        self._known: dict[tuple[str, str, int], tuple[int, list[BronzeRange]]] = {}  # (path, topic, p): since, ranges

    def ranges(self, spark: SparkSession, bronze_path: str, topic: str, partition: int, since: int
               ) -> list[BronzeRange]:
        """`list_ranges(..., since=since)`, from what is known when it reaches that far back."""
        known = self._known.get((bronze_path, topic, partition))
        if known is None or since < known[0]:
            found = list_ranges(spark, bronze_path, topic, partition, since=since)
        else:  # only what reaches `since` is kept: a stream's offsets only grow, and an earlier one lists again
            found = [r for r in known[1] if r.last >= since]
        self._known[(bronze_path, topic, partition)] = (since, found)
        return list(found)

    def removed(self, bronze_path: str, gone: BronzeRange) -> None:
        known = self._known.get((bronze_path, gone.topic, gone.partition))
        if known is not None:
            known[1].remove(gone)

    def written(self, bronze_path: str, written: Mapping[TopicPartition, tuple[int, int]]) -> None:
        for (topic, partition), (first, last) in written.items():
            known = self._known.get((bronze_path, topic, partition))
            if known is not None:
                known[1].append(BronzeRange(topic, partition, first, last))
                known[1].sort(key=lambda r: (r.first, r.last))

    def serves(self, bronze_path: str, offsets: Mapping[TopicPartition, tuple[int, int]]) -> bool:
        """Whether a write of `offsets` would take a partition's ranges from what is known, without a listing."""
        return any((known := self._known.get((bronze_path, topic, partition))) is not None and first >= known[0]
                   for (topic, partition), (first, _) in offsets.items())

    def forget(self, bronze_path: str, partitions: Iterable[TopicPartition]) -> None:
        for topic, partition in partitions:
            self._known.pop((bronze_path, topic, partition), None)


def write_bronze(
    kafka_df: DataFrame, bronze_path: str, offsets: Mapping[TopicPartition, tuple[int, int]],
    known: KnownRanges | None = None,
) -> BronzeWrite:
    """Write the batch's records whose offsets no complete range holds (module docstring).

    Args:
        kafka_df: the batch as read from Kafka (or Bronze), persisted by the caller.
        offsets: the first and last offset of the batch's records per (topic, partition).
        known: the ranges this writer knows (a stream's, kept across its batches); None: each partition listed.
    """
    if known is None:
        return _write(kafka_df, bronze_path, offsets, None)
    retry = known.serves(bronze_path, offsets)
    while True:
        try:
            return _write(kafka_df, bronze_path, offsets, known)
        except BaseException as e:
            known.forget(bronze_path, offsets)
            if not retry or not isinstance(e, Exception):
                raise
            # What this writer knew may miss a range another wrote (a second writer of the same Bronze, which the
            # job never is, but a test's second processor can be): written again from a listing, as a restart would.
            log.warning("bronze: a write from the ranges known failed (%s); the partitions listed and written again",
                        str(e).splitlines()[0] if str(e) else type(e).__name__)
            retry = False


def _write(
    kafka_df: DataFrame, bronze_path: str, offsets: Mapping[TopicPartition, tuple[int, int]],
    known: KnownRanges | None,
) -> BronzeWrite:
    spark = kafka_df.sparkSession
    result = BronzeWrite(written={})
    keep: Column = F.lit(False)
    bounds: dict[TopicPartition, tuple[int, int]] = {}
    overlapped: list[TopicPartition] = []
    for (topic, partition), (first, last) in sorted(offsets.items()):
        held = _held_ranges(spark, bronze_path, topic, partition, (first, last), result=result, known=known)
        here = (F.col("topic") == topic) & (F.col("partition") == partition)
        for r in held:
            here = here & ~F.col("offset").between(r.first, r.last)
        keep = keep | here
        if held:
            overlapped.append((topic, partition))
        else:
            bounds[(topic, partition)] = (first, last)
    rows_df = bronze_rows(kafka_df).filter(keep)
    if overlapped:  # rare: a replay; the remaining bounds need a look at the data
        remaining = (
            rows_df.filter(_any_of(overlapped))
            .groupBy("topic", "partition").agg(F.min("offset").alias("first"), F.max("offset").alias("last"))
            .collect()
        )
        for row in remaining:
            bounds[(row["topic"], row["partition"])] = (row["first"], row["last"])
        total = sum(last - first + 1 for (tp, (first, last)) in offsets.items() if tp in overlapped)
        result.skipped = total - sum(last - first + 1 for tp, (first, last) in bounds.items() if tp in overlapped)
    if bounds:
        _publish(rows_df, bronze_path, bounds, result)
        if known is not None:
            known.written(bronze_path, result.written)
    return result


def _held_ranges(
    spark: SparkSession, bronze_path: str, topic: str, partition: int, span: tuple[int, int], *, result: BronzeWrite,
    known: KnownRanges | None = None,
) -> list[BronzeRange]:
    """The complete ranges of a partition that hold offsets of `span` (first, last); incomplete ones from `span`'s
    first offset on are removed (a write cut short), and counted in `result`."""
    first, last = span
    existing = (list_ranges(spark, bronze_path, topic, partition, since=first) if known is None
                else known.ranges(spark, bronze_path, topic, partition, first))
    for incomplete in (r for r in existing if not r.complete):
        delete_path(spark, incomplete.folder(bronze_path))
        if known is not None:
            known.removed(bronze_path, incomplete)
        result.removed_incomplete += 1
        log.warning("bronze: removed incomplete range %s (a write was cut short)", incomplete.folder(bronze_path))
    return [r for r in existing if r.complete and r.first <= last]


def _publish(
    rows_df: DataFrame, bronze_path: str, bounds: Mapping[TopicPartition, tuple[int, int]], result: BronzeWrite
) -> None:
    """Write the rows straight into their range folders (each row's folder named in a column the write partitions
    by; `direct_parquet`: no file moved on its way there), then mark each folder complete; the ranges written go into
    `result`."""
    spark = rows_df.sparkSession
    root = bronze_path.rstrip("/")
    delete_path(spark, f"{root}/{STAGING}")  # what a write of an earlier version of the job left there
    fs, _ = fs_and_path(spark, root)
    targets = {tp: BronzeRange(tp[0], tp[1], first, last) for tp, (first, last) in sorted(bounds.items())}
    for target in targets.values():
        if fs.exists(_jpath(spark, target.folder(root))):  # the write would add to it: a range this writer missed
            raise FileExistsError(f"bronze: {target.folder(root)} exists already: another writer of this Bronze "
                                  "wrote it")
    folder: Column | None = None
    for (topic, partition), target in targets.items():
        here = (F.col("topic") == topic) & (F.col("partition") == partition)
        name = range_name(target.first, target.last).removeprefix(f"{RANGE_LEVEL}=")
        folder = F.when(here, name) if folder is None else folder.when(here, name)
    if folder is None:
        return
    # Every row has a bound (bounds come from the rows); one without would fail the write, not land in a folder
    # no range names.
    folder = folder.otherwise(F.raise_error(F.lit("bronze: a record outside the batch's ranges")))
    (direct_parquet(rows_df.withColumn(RANGE_LEVEL, folder)).mode("append")
     .partitionBy("topic", "partition", RANGE_LEVEL).parquet(root))
    for tp, target in targets.items():
        if not fs.exists(_jpath(spark, target.folder(root))):
            continue  # no row reached it (the batch's records read again since its bounds were taken): not marked
        fs.create(_jpath(spark, f"{target.folder(root)}/{MARKER}"), True).close()
        result.written[tp] = (target.first, target.last)


def bronze_partitions(spark: SparkSession, bronze_path: str) -> dict[str, list[int]]:
    """The topics Bronze holds folders of, each with its partitions."""
    fs, root = fs_and_path(spark, bronze_path)
    if not fs.exists(root):
        return {}
    found: dict[str, list[int]] = {}
    for topic_status in fs.listStatus(root):
        name = topic_status.getPath().getName()
        if topic_status.isDirectory() and name.startswith("topic="):
            found[name.removeprefix("topic=")] = sorted(
                int(p.getPath().getName().removeprefix("partition=")) for p in fs.listStatus(topic_status.getPath())
                if p.isDirectory() and p.getPath().getName().startswith("partition="))
    return found


def read_bronze(spark: SparkSession, bronze_path: str, topics: list[str] | None = None) -> DataFrame | None:
    """Every record of the complete ranges (of `topics`, or all), with the Kafka source's columns; None when
    there are none."""
    folders = [
        r.folder(bronze_path)
        for topic, partitions in bronze_partitions(spark, bronze_path).items() if topics is None or topic in topics
        for partition in partitions for r in list_ranges(spark, bronze_path, topic, partition) if r.complete
    ]
    if not folders:
        return None
    return read_folders(spark, bronze_path, folders)


def read_folders(spark: SparkSession, bronze_path: str, folders: list[str]) -> DataFrame:
    """The records of the given range folders, with the Kafka source's columns."""
    df = spark.read.option("basePath", bronze_path.rstrip("/")).parquet(*folders)
    return df.select(
        F.col("key"), F.col("value"), F.col("topic").cast("string"), F.col("partition").cast("int"),
        F.col("offset"), F.col("timestamp"), F.col("timestampType"), F.col("headers"),
    )


def _any_of(partitions: list[TopicPartition]) -> Column:
    condition = F.lit(False)
    for topic, partition in partitions:
        condition = condition | ((F.col("topic") == topic) & (F.col("partition") == partition))
    return condition


def _jpath(spark: SparkSession, uri: str) -> Any:
    return fs_and_path(spark, uri)[1]
