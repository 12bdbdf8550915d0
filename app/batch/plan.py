"""What a batch writes, per table, before anything is written: the plan model the planner returns
(app/batch/planner.py) and the writer carries out (app/batch/writer.py). Frames are lazy until written."""
from __future__ import annotations

from dataclasses import dataclass, field

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from app.cdc.columns import (
    BLOCKED_COL,
    ERROR_COL,
    INTERNAL_COLUMNS,
    OFFSET_COL,
    PARTITION_COL,
    POSITION_COL,
    REINSERT_COL,
    TOPIC_COL,
)
from app.cdc.unavailable import filter_current_rows, with_current_rows
from app.cdc.unwrap import filter_latest, with_carried_values, with_key_errors, with_latest_flag
from app.errors import required
from app.routing.catalog import PartitionRoots
from app.routing.route import TableRoute
from app.sink.commit import Committed
from app.sink.hudi import HudiTarget
from app.sink.ledger import with_ledger_verdict
from app.sink.quarantine import QUARANTINED
from app.state.stats import TableBatchStats
from app.wire.decode import error_struct
from app.wire.registry import SchemaRef

Offsets = dict[tuple[str, int], tuple[int, int]]  # (topic, partition) -> first and last offset


@dataclass
class TopicSummary:
    rows_in: int = 0
    tombstones: int = 0
    unframed: int = 0  # records whose value framing failed
    key_unframed: int = 0
    key_ids: set[SchemaRef] = field(default_factory=set)
    value_ids: set[SchemaRef] = field(default_factory=set)
    offsets: Offsets = field(default_factory=dict)  # first, last per partition
    newest_ms: int | None = None  # the newest Kafka timestamp of its records (epoch ms): when the connector wrote it


@dataclass(frozen=True)
class Slice:
    """The events of one writer schema id of a topic."""

    events_df: DataFrame
    value_columns: tuple[str, ...]
    placeholder_columns: tuple[str, ...]  # columns that can carry Debezium's unavailable-value placeholder
    defaulted_columns: tuple[str, ...] = ()  # columns whose writer schema declares a default


@dataclass
class TablePlan:
    """One table's share of a batch: where it goes and the lazy frame of its change events. A table fed by
    several topics (partitions, shards) has one route per topic; `route` is the first, and the events of such a
    table carry their topic in `_cdc_topic` until written."""

    route: TableRoute
    record_key: tuple[str, ...] | None  # None when no record of the batch carries a key
    events_df: DataFrame | None  # unwrapped c/r/u/d events; None when the batch holds only tombstones
    target: HudiTarget | None  # None without events or without a key
    stats: TableBatchStats
    summary: TopicSummary
    carry_columns: tuple[str, ...] = ()  # columns an event may leave out (app/cdc/unavailable.py)
    routes: tuple[TableRoute, ...] = ()  # every topic's route; () means just `route`
    # Records found unusable before decoding (framing, unknown schema id), as `dead_coordinates`; those found
    # later carry `_cdc_error` among the events.
    dead_df: DataFrame | None = None
    source_df: DataFrame | None = None  # the batch's framed records: the raw bytes of its dead letters
    key_schemas: dict[SchemaRef, str] = field(default_factory=dict)  # the key schemas of its records, by id
    # Why its events cannot be planned (an EnvelopeError's message): the writer quarantines the table.
    quarantine: str | None = None
    # Columns a writer schema of the batch declares a default for: one the table lacks yet was added upstream with
    # a default, and the rows written before hold it in the source (app/batch/writer.py: widen).
    defaulted_columns: tuple[str, ...] = ()
    # The source table's columns, as the batch's writer schemas give them (not the job's own columns).
    source_columns: tuple[str, ...] = ()
    # Whether the events hold rows derived from the table (deletes of a truncate): more than the batch's records.
    derived_rows: bool = False

    def __post_init__(self) -> None:
        if not self.routes:
            self.routes = (self.route,)

    @property
    def topics(self) -> list[str]:
        return [r.topic for r in self.routes]

    def topics_per_source(self) -> dict[str, list[str]]:
        """The plan's topics by source label: positions compare only within one source server."""
        per_source: dict[str, list[str]] = {}
        for route in self.routes:
            per_source.setdefault(route.source, []).append(route.topic)
        return per_source

    def not_applied(self, committed: Committed) -> Column:
        """The events above the offsets `committed` records, of each of the plan's topics."""
        if len(self.routes) == 1:
            return committed.not_applied(PARTITION_COL, OFFSET_COL, self.route.topic)
        condition = F.lit(False)
        for topic in self.topics:
            condition = condition | (
                (F.col(TOPIC_COL) == topic) & committed.not_applied(PARTITION_COL, OFFSET_COL, topic)
            )
        return condition

    def judged_df(self, ledger_df: DataFrame | None = None, single_partition_rows: int = 0) -> DataFrame:
        """The events with the latest one per record key flagged, and the delete ledger's verdict; a key Hudi cannot
        store is an error (with_key_errors). A table with at most `single_partition_rows` records in the batch (and no
        rows derived from the table) is judged in one partition (`lake.single_partition_rows`): no shuffle for the
        window, nor for the counts."""
        events_df = required(self.events_df, f"{self.route.qualified_name}: the events")
        key = required(self.record_key, f"{self.route.qualified_name}: the record key")
        if self.summary.rows_in <= single_partition_rows and not self.derived_rows:
            events_df = events_df.coalesce(1)
        flagged_df = events_df.transform(with_key_errors, key).transform(with_latest_flag, key)
        return with_ledger_verdict(flagged_df, ledger_df, key)

    def carried_df(self, judged_df: DataFrame, current_df: DataFrame | None = None) -> DataFrame:
        """Unavailable values filled from the key's earlier events, and from `current_df` (the table as it is)."""
        key = required(self.record_key, f"{self.route.qualified_name}: the record key")
        with_history = judged_df if current_df is None else with_current_rows(judged_df, current_df, key)
        return (
            with_history.transform(with_carried_values, key, self.carry_columns)
            .transform(filter_current_rows)
        )

    def latest_df(self) -> DataFrame:
        """The latest event per key, values carried within the batch, as the Hudi upsert receives it when no
        delete ledger applies."""
        return filter_latest(self.carried_df(self.judged_df())).drop(
            *INTERNAL_COLUMNS, BLOCKED_COL, REINSERT_COL, TOPIC_COL
        )


def dead_coordinates(framed_df: DataFrame, error: Column) -> DataFrame:
    """Which records go to the dead letters and why: their topic, partition and offset (named as the events name
    them), `_cdc_error`, and the source position (unknown before decoding)."""
    return framed_df.select(
        F.col("topic").alias(TOPIC_COL),
        F.col("partition").alias(PARTITION_COL),
        F.col("offset").alias(OFFSET_COL),
        error.alias(ERROR_COL),
        F.lit(None).cast("string").alias(POSITION_COL),
    )


def quarantined_coordinates(framed_df: DataFrame, topics: list[str], reason: str) -> DataFrame:
    """Every record of a quarantined table's topics (tombstones aside: they carry no change), as dead letters of kind
    `quarantined` (app/sink/quarantine.py)."""
    return dead_coordinates(
        framed_df.filter(F.col("topic").isin(topics) & F.col("value").isNotNull()),
        error_struct(QUARANTINED, F.lit(reason)),
    )


@dataclass(frozen=True)
class SkippedTopic:
    """A topic of the batch that feeds no table (app/routing/route.py: skip_reason), or is refused the table another
    topic holds (`claim_tables`); Bronze keeps its records."""

    reason: str
    records: int
    offsets: Offsets


@dataclass(frozen=True)
class BatchSummary:
    """A batch read and summarised, its topics not planned yet (app/batch/planner.py `Planner.summarize`): enough to
    write Bronze while the topics' decode plans are built."""

    framed_df: DataFrame  # the batch's records with their framing columns (app/wire/framing.py)
    topics: dict[str, TopicSummary]  # the topics that feed a table
    skipped: dict[str, SkippedTopic]
    roots: PartitionRoots
    newest_ms: dict[str, int] = field(default_factory=dict)  # topic -> TopicSummary.newest_ms, every topic read
    summary_s: float = 0.0  # seconds of the summary aggregate, the batch's first read of its records

    @property
    def offsets(self) -> Offsets:
        """Every record's (topic, partition) offset range, of the tables' topics and the skipped ones: Bronze's
        ranges."""
        ranges = {tp: r for s in self.topics.values() for tp, r in s.offsets.items()}
        ranges.update({tp: r for s in self.skipped.values() for tp, r in s.offsets.items()})
        return ranges

    @property
    def empty(self) -> bool:
        return not self.topics and not self.skipped


@dataclass(frozen=True)
class TableTopics:
    """A Silver table's topics in a batch (app/batch/planner.py `Planner.table_topics`), before its plan is built. A
    topic of no known form is a group of its own, named after the topic, without a database: its plan raises the
    error that names the record."""

    name: str  # the table's qualified name
    database: str | None
    topics: tuple[str, ...]


@dataclass(frozen=True)
class BatchPlan:
    """A whole batch's plan: one `TablePlan` per Silver table, and the topics that feed none (the rest of what the
    batch read is in its `BatchSummary`)."""

    tables: list[TablePlan]
    skipped: dict[str, SkippedTopic]

    @property
    def table_names(self) -> list[str]:
        return [p.route.qualified_name for p in self.tables]
