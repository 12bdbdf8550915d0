"""What a Silver commit records of its batch, and whether a batch was committed already.

Every Silver commit carries, in its extra metadata (Hudi copies write options with the `_cdc.` prefix there):

    _cdc.offsets      the Kafka offsets this commit applied, per topic and partition: {"t": {"0": [first, last]}}
    _cdc.committed    every offset of the table's topics applied so far: {"t": {"0": last}} (this commit's
                      offsets merged into the previous commit's)
    _cdc.max_position the highest source position (`_cdc_position`) among the events written; a table fed by
                      several source servers (shards), whose positions do not compare, records JSON
                      {"<source>": position} instead
    _cdc.source_table the source table whose rows the Silver table holds (`<source>:<schema>.<table>`; a
                      partition's rows count as their partitioned table's), or `merged` for declared shards
    _cdc.batch_id, _cdc.query_id  Spark's batch id and query id, for people (batch ids restart when a
                      checkpoint is lost, so nothing is decided on them)

Before a table is written, the newest completed commit carrying `_cdc.committed` is read from the table's
timeline (`.hoodie/`, not the data files). A batch whose offsets are all at or below it was committed already
(Spark replays a batch it had not recorded): the table is skipped. A batch that overlaps it (re-read after a
lost checkpoint, with other batch boundaries) writes only the offsets above it. Offsets are kept per topic and
partition (a table fed by several topics keeps each), and Kafka offsets only grow, so "at or below the committed
last offset" is exactly "already applied".
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as F

from app.sink.hudi import COMMIT_META_PREFIX, meta_client, table_exists
from app.spark import jvm_class

OFFSETS_KEY: Final = f"{COMMIT_META_PREFIX}offsets"
COMMITTED_KEY: Final = f"{COMMIT_META_PREFIX}committed"
MAX_POSITION_KEY: Final = f"{COMMIT_META_PREFIX}max_position"
SOURCE_TABLE_KEY: Final = f"{COMMIT_META_PREFIX}source_table"

TopicPartition = tuple[str, int]


@dataclass(frozen=True)
class OffsetRanges:
    """The first and last Kafka offset of a batch's records, per (topic, partition)."""

    ranges: Mapping[TopicPartition, tuple[int, int]]

    def to_json(self) -> str:
        return _per_topic_json({tp: [first, last] for tp, (first, last) in self.ranges.items()})

    def __str__(self) -> str:
        return ", ".join(f"{t}[{p}]@{a}-{b}" for (t, p), (a, b) in sorted(self.ranges.items()))


@dataclass(frozen=True)
class Committed:
    """The newest commit of a table that recorded offsets: its instant and the last offset applied per
    (topic, partition)."""

    instant: str
    last: Mapping[TopicPartition, int]
    source_table: str | None = None  # None: written before commits recorded it
    max_position: str | None = None  # `_cdc.max_position` of that commit

    def covers(self, batch: OffsetRanges) -> bool:
        """Every offset of the batch was applied already."""
        return all(last <= self.last.get(tp, -1) for tp, (_, last) in batch.ranges.items())

    def overlaps(self, batch: OffsetRanges) -> bool:
        """Some offsets of the batch were applied already."""
        return any(first <= self.last.get(tp, -1) for tp, (first, _) in batch.ranges.items())

    def after(self, batch: OffsetRanges) -> OffsetRanges:
        """The part of the batch not applied yet."""
        return OffsetRanges({
            tp: (max(first, self.last.get(tp, -1) + 1), last)
            for tp, (first, last) in batch.ranges.items()
            if last > self.last.get(tp, -1)
        })

    def not_applied(self, partition_col: str, offset_col: str, topic: str) -> Column:
        """Rows of `topic` (as partition and offset columns) above the applied offsets."""
        condition = F.lit(True)
        for (t, partition), last in self.last.items():
            if t == topic:
                condition = condition & ((F.col(partition_col) != partition) | (F.col(offset_col) > last))
        return condition


def committed_json(previous: Committed | None, batch: OffsetRanges) -> str:
    """`_cdc.committed` after this batch: the previous commit's last offsets, raised by the batch's."""
    last = dict(previous.last) if previous else {}
    for tp, (_, batch_last) in batch.ranges.items():
        last[tp] = max(last.get(tp, -1), batch_last)
    return _per_topic_json(last)


def _per_topic_json(values: Mapping[TopicPartition, Any]) -> str:
    """{(topic, partition): value} as compact JSON {"topic": {"partition": value}}, sorted."""
    nested: dict[str, dict[str, Any]] = {}
    for (topic, partition), value in sorted(values.items()):
        nested.setdefault(topic, {})[str(partition)] = value
    return json.dumps(nested, separators=(",", ":"))


def parse_committed(
    instant: str, text: str, source_table: str | None = None, max_position: str | None = None
) -> Committed:
    nested = json.loads(text)
    last = {(t, int(p)): int(o) for t, parts in nested.items() for p, o in parts.items()}
    return Committed(instant, last, source_table, max_position)


def commit_metadata(
    batch: OffsetRanges, previous: Committed | None, max_position: str | None, source_table: str | None = None
) -> dict[str, str]:
    """The `_cdc.*` write options a Silver commit records (module docstring)."""
    meta = {OFFSETS_KEY: batch.to_json(), COMMITTED_KEY: committed_json(previous, batch)}
    if max_position is not None:
        meta[MAX_POSITION_KEY] = max_position
    if source_table is not None:
        meta[SOURCE_TABLE_KEY] = source_table
    return meta


def last_committed(spark: SparkSession, table_path: str) -> Committed | None:
    """The newest completed commit of the table carrying `_cdc.committed`, read from its timeline; None for a
    table that does not exist yet or never recorded offsets.

    Compaction, clean and clustering instants carry no `_cdc.*` metadata and are passed over. Safe to call
    from several threads: each call builds its own meta client.
    """
    if not table_exists(spark, table_path):
        return None
    timeline_utils = jvm_class(spark, "org.apache.hudi.common.table.timeline.TimelineUtils")
    timeline = meta_client(spark, table_path).getCommitsTimeline().filterCompletedInstants()
    instants = timeline.getReverseOrderedInstants().iterator()
    while instants.hasNext():
        instant = instants.next()
        metadata = timeline_utils.getCommitMetadata(instant, timeline)
        value = metadata.getMetadata(COMMITTED_KEY)
        if value:
            source_table = metadata.getMetadata(SOURCE_TABLE_KEY)
            max_position = metadata.getMetadata(MAX_POSITION_KEY)
            instant_time = str(instant.requestedTime())
            return parse_committed(instant_time, str(value), str(source_table) if source_table else None,
                                   str(max_position) if max_position else None)
    return None
