"""One micro-batch, end to end: framing/registry -> decode -> unwrap -> route -> write (Bronze + Hudi).

`BatchProcessor.process` is the foreachBatch function. It is the one place where a batch's per-table writes
happen, and it takes any DataFrame with the Kafka source's columns (a Kafka micro-batch, or Bronze Parquet
read back for a replay).

Spark actions per batch: one small aggregate (writer schema ids and record counts per topic), the Bronze write,
and per table present in the batch: the delete ledger's read (hard-delete tables that have one); one aggregate
over the persisted, judged events for the counts; only when a row to be written lacks a value (a TOAST
placeholder, a soft delete), a read of the table's current rows for those keys and a second aggregate; the
ledger write (when the batch deletes or re-inserts keys); the Hudi write.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections import defaultdict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from py4j.protocol import Py4JJavaError
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, DecimalType, DoubleType, FloatType, IntegralType, StructType
from pyspark.sql.utils import AnalysisException, CapturedException

from app.bronze import write_bronze
from app.catalog import PartitionRoots, all_partition_roots
from app.commit import Committed, OffsetRanges, commit_metadata, last_committed
from app.config import JobConfig
from app.decode import decode_error_from, decode_value, record_fields
from app.deletes import BLOCKED_COL, REINSERT_COL, ledger_changes, read_ledger, with_ledger_verdict
from app.errors import EnvelopeError, PipelineError, SchemaDecodeError, SinkWriteError, java_root_cause, required
from app.framing import Framing, with_source_framings
from app.hudi import LEDGER_OPTIONS, HudiTarget, table_exists, write_silver
from app.partitioning import with_partition_field
from app.pause import pause_point
from app.position import CONNECTOR_KINDS, POSITION_COL, connector_kind
from app.registry import RegistryClient, SchemaRef
from app.route import TableRoute, check_owner, collision, route_topic, skip_reason
from app.source import KAFKA_SCHEMA
from app.status import JobStatus, write_status
from app.types import placeholder_tests, reader_schema, with_debezium_types
from app.unavailable import filter_current_rows, is_pending, is_unresolved, with_current_rows
from app.unwrap import (
    INTERNAL_COLUMNS,
    LATEST_COL,
    OFFSET_COL,
    PARTITION_COL,
    TOPIC_COL,
    UNAVAILABLE_COL,
    filter_data_changes,
    filter_latest,
    flattened_layout,
    is_delete,
    is_envelope,
    unwrap_envelope,
    unwrap_flattened,
    with_carried_values,
    with_latest_flag,
    with_soft_deletes,
)

log = logging.getLogger(__name__)

HISTORY_BATCHES = 100  # batches kept in BatchProcessor.history, for tests and tools that look back


@dataclass
class TableBatchStats:
    """Counts for one table in one batch; `log_line` is the per-table batch log line."""

    table: str
    rows_in: int = 0
    upserts: int = 0
    deletes: int = 0
    skipped: int = 0
    superseded: int = 0
    blocked: int = 0
    unresolved: int = 0
    replayed: int = 0  # records whose offsets the table had committed already (a replayed batch)
    schema_ids: list[SchemaRef] = field(default_factory=list)
    duration_s: float = 0.0
    topics: list[str] = field(default_factory=list)  # set when the table is not just its topic's own

    def log_line(self, batch_id: int) -> str:
        fed_by = f"topics={','.join(self.topics)} " if self.topics else ""
        return (
            f"batch={batch_id} table={self.table} {fed_by}rows_in={self.rows_in} upserts={self.upserts} "
            f"deletes={self.deletes} skipped={self.skipped} superseded={self.superseded} "
            f"blocked={self.blocked} unresolved={self.unresolved} replayed={self.replayed} "
            f"schema_ids={','.join(map(str, self.schema_ids))} duration_s={self.duration_s:.2f}"
        )


class BatchProcessor:
    """Processes micro-batches for one job config; holds the registry client and table registrations."""

    def __init__(self, config: JobConfig, registry: RegistryClient) -> None:
        self.config = config
        self.registry = registry
        self.last_stats: dict[str, TableBatchStats] = {}  # the latest batch's, per table
        # The latest batches this processor wrote (a bounded window: a stream runs for months).
        self.history: deque[dict[str, TableBatchStats]] = deque(maxlen=HISTORY_BATCHES)
        self.failure: PipelineError | None = None
        self.roots: PartitionRoots = {}  # partitions -> partitioned tables, read per batch (app/catalog.py)
        # The latest planned batch's topics that feed no table: topic -> (why, records, offsets per partition).
        self.skipped: dict[str, tuple[str, int, dict[tuple[str, int], tuple[int, int]]]] = {}
        self.status = JobStatus()  # app/status.py; written after every batch when `write_status` is on
        self.write_status = False

    def process(self, batch_df: DataFrame, batch_id: int) -> None:
        """foreachBatch entry point.

        Raises:
            SchemaDecodeError: a record's framing or Avro body cannot be decoded (names the record).
            SinkWriteError: a Bronze or Hudi write failed.
        """
        started = time.monotonic()
        self.failure = None
        spark = batch_df.sparkSession
        # Structured Streaming sets the query id as a local property of the thread running the batch.
        query_id = spark.sparkContext.getLocalProperty("sql.streaming.queryId") or "none"
        raw_df = batch_df.persist()
        try:
            self._process(raw_df, batch_id, query_id, started)
        except PipelineError as e:
            log.error("batch=%s failed: %s: %s", batch_id, type(e).__name__, e)
            self.failure = e
            self.status.failure = f"batch {batch_id}: {type(e).__name__}: {e}"
            self._save_status(spark)
            raise
        finally:
            raw_df.unpersist()

    def _save_status(self, spark: SparkSession) -> None:
        if self.write_status:
            write_status(spark, self.config, self.status)

    def _process(self, raw_df: DataFrame, batch_id: int, query_id: str, started: float) -> None:
        plans = self.plan_batch(raw_df)
        for topic, (reason, records, _) in sorted(self.skipped.items()):
            log.info("batch=%s skipped topic=%s records=%d: %s", batch_id, topic, records, reason)
        if not plans and not self.skipped:
            log.info("batch=%s empty", batch_id)
            return
        names = [p.route.qualified_name for p in plans]
        pause_point("decode", batch_id=batch_id, tables=names)
        try:
            offsets = {tp: r for plan in plans for tp, r in plan.summary.offsets.items()}
            offsets.update({tp: r for _, _, ranges in self.skipped.values() for tp, r in ranges.items()})
            bronze = write_bronze(raw_df, self.config.lake.bronze_path, offsets)
            if bronze.skipped:
                log.info(
                    "batch=%s bronze: %d records already held; written %s", batch_id, bronze.skipped, bronze.written
                )
        except (Py4JJavaError, CapturedException) as e:
            raise SinkWriteError(
                f"batch {batch_id}: Bronze write to {self.config.lake.bronze_path}: {java_root_cause(e)}"
            ) from e
        pause_point("bronze_written", batch_id=batch_id, tables=names)
        for n, table_plan in enumerate(plans):
            if n:
                pause_point("between_tables", batch_id=batch_id, committed=names[:n], remaining=names[n:])
            self.write_table(table_plan, batch_id, query_id)
        pause_point("tables_committed", batch_id=batch_id, committed=names)
        self.last_stats = {p.stats.table: p.stats for p in plans}
        self.history.append(self.last_stats)
        duration_s = time.monotonic() - started
        log.info("batch=%s done tables=%d duration_s=%.2f", batch_id, len(plans), duration_s)
        skipped = {topic: (reason, records) for topic, (reason, records, _) in self.skipped.items()}
        self.status.record_batch(batch_id, [p.stats for p in plans], skipped, duration_s)
        self._save_status(raw_df.sparkSession)

    def plan_batch(self, raw_df: DataFrame) -> list[TablePlan]:
        """What a batch writes, per table, without writing: the Silver frames and their targets.

        Runs one Spark action (the summary aggregate) and the registry look-ups; the returned frames are lazy.
        Topics that feed no table (`app/route.skip_reason`) are left out and kept in `self.skipped`.

        Raises:
            SchemaDecodeError: a value lacks the framing.
            EnvelopeError: a topic or writer schema is not what a Debezium connector produces.
        """
        framed_df = with_source_framings(raw_df, self._framings())
        summary = self._summarize(framed_df)
        self.skipped = {}
        for topic in list(summary):
            reason = skip_reason(topic, self.config)
            if reason is not None:
                skipped = summary.pop(topic)
                self.skipped[topic] = (reason, skipped.rows_in, skipped.offsets)
        self.roots = all_partition_roots(raw_df.sparkSession, self.config)
        self._check_framing(framed_df, summary)
        topic_plans = [self._plan_topic(framed_df, topic, s) for topic, s in sorted(summary.items())]
        return _plans_per_table(topic_plans, self.config)

    def _framings(self) -> list[tuple[str, Framing]]:
        """Each source's topic prefix and wire framing."""
        return [(s.topic_prefix, Framing(s.framing, s.id_type)) for s in self.config.source_list]

    def _summarize(self, framed_df: DataFrame) -> dict[str, _TopicSummary]:
        """One aggregate: per topic, key and value schema reference and whether framing failed, record count.
        Drives everything after."""
        rows = (
            framed_df.groupBy(
                "topic", "partition", "key_id_type", "key_schema_id", "value_id_type", "value_schema_id",
                F.col("key_frame_error").isNotNull().alias("key_bad"),
                F.col("value_frame_error").isNotNull().alias("value_bad"),
            )
            .agg(F.count(F.lit(1)).alias("n"), F.min("offset").alias("first"), F.max("offset").alias("last"))
            .collect()
        )
        summary: dict[str, _TopicSummary] = defaultdict(_TopicSummary)
        for row in rows:
            s = summary[row["topic"]]
            s.rows_in += row["n"]
            tp = (row["topic"], row["partition"])
            first, last = s.offsets.get(tp, (row["first"], row["last"]))
            s.offsets[tp] = (min(first, row["first"]), max(last, row["last"]))
            if row["key_bad"]:
                s.key_unframed += row["n"]
            if row["value_bad"]:
                s.unframed += row["n"]
            elif row["value_schema_id"] is None:
                s.tombstones += row["n"]
            else:
                s.value_ids.add(SchemaRef(row["value_id_type"], row["value_schema_id"]))
            if row["key_schema_id"] is not None:
                s.key_ids.add(SchemaRef(row["key_id_type"], row["key_schema_id"]))
        return dict(summary)

    def _check_framing(self, framed_df: DataFrame, summary: dict[str, _TopicSummary]) -> None:
        """A value that cannot be split stops the batch; so does a key, unless its table's record key is set
        in config (then the key bytes are not read, and any key converter will do)."""
        bad_values = [t for t, s in summary.items() if s.unframed]
        bad_keys = [
            t for t, s in summary.items() if s.key_unframed and not route_topic(t, self.config, self.roots).record_key
        ]
        if not bad_values and not bad_keys:
            return
        bad_value = F.col("topic").isin(bad_values) & F.col("value_frame_error").isNotNull()
        bad_key = F.col("topic").isin(bad_keys) & F.col("key_frame_error").isNotNull()
        bad = (
            framed_df.filter(bad_value | bad_key)
            .select("topic", "partition", "offset", "key_frame_error", "value_frame_error")
            .orderBy("topic", "partition", "offset")
            .first()
        )
        bad = required(bad, "a badly framed row the summary counted")
        side = "value" if bad["topic"] in bad_values and bad["value_frame_error"] is not None else "key"
        raise SchemaDecodeError(
            bad["topic"], bad["partition"], bad["offset"], None, f"{side} {bad[f'{side}_frame_error']}"
        )

    def _plan_topic(self, framed_df: DataFrame, topic: str, summary: _TopicSummary) -> TablePlan:
        route = route_topic(topic, self.config, self.roots)
        stats = TableBatchStats(route.qualified_name, rows_in=summary.rows_in, schema_ids=sorted(summary.value_ids),
                                topics=[topic] if route.source_partition or route.merged else [])
        stats.skipped = summary.tombstones
        if not summary.value_ids:  # only tombstones
            return TablePlan(route, None, None, None, stats, summary)
        topic_df = framed_df.filter(F.col("topic") == topic)
        slices = [self._decode_slice(topic_df, ref, route) for ref in sorted(summary.value_ids)]
        record_key = self._record_key(route, summary.key_ids)
        discriminator = route.discriminator
        if record_key is not None and discriminator is not None and discriminator.column not in record_key:
            record_key = (*record_key, discriminator.column)
        target = None
        if record_key is not None:
            target = HudiTarget(
                database=route.database,
                table=route.table,
                path=self.config.lake.table_path(route.table, route.database),
                record_key=record_key,
                table_type=route.table_type,
                delete_mode=route.delete_mode,
                partition=route.partition,
                compaction_delta_commits=route.compaction_delta_commits,
                retain_commits=self.config.lake.retain_commits,
            )
        try:
            events_df = _union(s.events_df for s in slices)
        except AnalysisException as e:
            raise EnvelopeError(
                f"{topic}: writer schemas {sorted(summary.value_ids)} in one batch disagree on column types: {e}"
            ) from e
        events_df = _with_discriminator(events_df, route)
        carry = sorted({c for s in slices for c in s.placeholder_columns})
        if target is not None and target.delete_mode == "soft":
            value_columns = list(dict.fromkeys(c for s in slices for c in s.value_columns))
            events_df = events_df.transform(with_soft_deletes, target.record_key, value_columns)
            carry = [c for c in value_columns if c not in target.record_key]
        return TablePlan(route, record_key, events_df, target, stats, summary, tuple(carry))

    def write_table(self, plan: TablePlan, batch_id: int, query_id: str) -> None:
        """One table's unit of the batch: the check on its timeline, the write, the offsets in the commit.

        Shares nothing with other tables' units (its plan and stats are its own), so a batch's tables may be
        written from several threads at once (tests/e2e/test_exactly_once.py).

        Raises:
            SchemaDecodeError: a record of the table cannot be decoded (names the record).
            SinkWriteError: the Hudi write failed.
        """
        started = time.monotonic()
        try:
            if plan.events_df is not None and plan.target is None:
                self._check_keyless(plan)
            elif plan.events_df is not None and plan.target is not None:
                self._write_events(plan, plan.target, batch_id, query_id)
        except (Py4JJavaError, CapturedException) as e:
            decode_error = decode_error_from(e)
            if decode_error is not None:
                raise decode_error from e
            raise SinkWriteError(
                f"batch {batch_id}: Hudi write of {plan.route.qualified_name} failed: {java_root_cause(e)}"
            ) from e
        plan.stats.duration_s = time.monotonic() - started
        log.info("%s", plan.stats.log_line(batch_id))

    def _write_events(self, plan: TablePlan, target: HudiTarget, batch_id: int, query_id: str) -> None:
        """One table's share of the batch: judge the events (latest per key, delete ledger), count, fill
        unavailable values when an event to be written lacks some, record deletes in the ledger, upsert."""
        events_df = required(plan.events_df, f"{plan.route.qualified_name}: the events")
        spark = events_df.sparkSession
        stats = plan.stats
        keys = target.record_key
        batch_offsets = OffsetRanges(plan.summary.offsets)
        committed = last_committed(spark, target.path)
        if committed is not None and not plan.route.merged:  # declared shards were checked when grouped
            check_owner(plan.route, {topic for topic, _ in committed.last}, self.config, committed.source_table)
        if committed is not None and committed.covers(batch_offsets):
            stats.replayed = plan.summary.rows_in
            stats.skipped = 0
            log.info(
                "batch=%s table=%s already committed at %s (offsets %s): skipped",
                batch_id, target.qualified_name, committed.instant, batch_offsets,
            )
            return
        if committed is not None and committed.overlaps(batch_offsets):
            # Re-read after a lost checkpoint, with other batch boundaries: apply only what was not applied.
            new_offsets = committed.after(batch_offsets)
            log.info(
                "batch=%s table=%s offsets %s committed up to %s at %s: writing %s only",
                batch_id, target.qualified_name, batch_offsets, dict(committed.last), committed.instant, new_offsets,
            )
            plan = dataclasses.replace(plan, events_df=events_df.filter(plan.not_applied(committed)))
            # Counted as offsets: Kafka transaction markers (a connector with exactly-once delivery) would make
            # this an overestimate, hence the floor on `skipped` below.
            stats.replayed = sum(last - first + 1 for first, last in batch_offsets.ranges.values()) - sum(
                last - first + 1 for first, last in new_offsets.ranges.values()
            )
            batch_offsets = new_offsets
        ledger_df = read_ledger(spark, target.ledger.path, keys) if target.delete_mode == "hard" else None
        # Persisted: the counts, the ledger write and the Silver write read one decode of the batch.
        judged_df = plan.judged_df(ledger_df).persist()
        try:
            sources = plan.topics_per_source()
            counts = _count(judged_df, sources)
            if counts["pending"]:  # rare: a TOAST placeholder or a soft delete among the rows to write
                current_df = spark.read.format("hudi").load(target.path) if table_exists(spark, target.path) else None
                carried_df = plan.carried_df(judged_df, current_df).persist()
                counts = _count(carried_df, sources)  # materialises the carried rows before their source is released
                judged_df.unpersist()
                judged_df = carried_df
            stats.upserts, stats.deletes = counts["upserts"], counts["deletes"]
            stats.blocked, stats.unresolved = counts["blocked"], counts["unresolved"]
            # Rows that are neither tombstones nor data changes: truncate and logical-message events.
            stats.skipped = max(0, plan.summary.rows_in - stats.replayed - counts["events"])
            stats.superseded = counts["events"] - stats.upserts - stats.deletes - stats.blocked
            written = F.col(LATEST_COL) & ~F.col(BLOCKED_COL)
            if stats.unresolved:
                self._warn_unresolved(judged_df.filter(written & is_unresolved()), plan)
            # The ledger first: a failure between the two writes leaves the deletes recorded (app/deletes.py).
            if target.delete_mode == "hard" and (counts["deletes"] or counts["reinserts"]):
                write_silver(ledger_changes(judged_df, keys), target.ledger, batch_id, query_id, LEDGER_OPTIONS)
            rows_df = (
                judged_df.filter(written)
                .drop(*INTERNAL_COLUMNS, BLOCKED_COL, REINSERT_COL, TOPIC_COL)
            )
            try:
                rows_df = with_partition_field(rows_df, target.partition)
            except EnvelopeError as e:
                route = plan.route
                raise EnvelopeError(
                    f"{route.qualified_name} (tables.{route.source_schema}.{route.source_table}.partition_by): {e}"
                ) from e
            max_position = _max_position(counts, sources)
            extra = commit_metadata(batch_offsets, committed, max_position, plan.route.source_identity)
            write_silver(rows_df, target, batch_id, query_id, extra)
        finally:
            judged_df.unpersist()

    def _warn_unresolved(self, unresolved_df: DataFrame, plan: TablePlan) -> None:
        key = required(plan.record_key, f"{plan.route.qualified_name}: the record key")
        sample = unresolved_df.select(*key, UNAVAILABLE_COL).limit(5).collect()
        log.warning(
            "%s: %d upserts carry Debezium's unavailable-value placeholder and no earlier version of their key is "
            "known (a primary-key change of a row with TOASTed values?); those columns are written as null. "
            "First keys: %s",
            plan.route.qualified_name, plan.stats.unresolved, [r.asDict() for r in sample],
        )

    def _check_keyless(self, plan: TablePlan) -> None:
        """No record in the batch had a key: fine for truncates and messages only, else the table has no key."""
        if required(plan.events_df, f"{plan.route.qualified_name}: the events").limit(1).count():
            route = plan.route
            raise EnvelopeError(
                f"{route.topic}: change events without a key (a table without a primary key?); "
                f"set tables.{route.source_key}.record_key (of source {route.source})"
            )
        plan.stats.skipped = plan.summary.rows_in

    def check_merges_at_start(self, spark: SparkSession, routes: list[TableRoute]) -> None:
        """Refuse, before the first batch, topics merged into one table whose latest value schemas disagree on a
        column's type (`check_merge_types`). The schemas are the topics' latest versions in the registry
        (`<topic>-value`), turned into Silver columns by the very code a batch runs, on an empty frame; a topic
        with none registered yet is checked by its first batch. Checked: declared shards. The partitions of one
        partitioned table have its columns (PostgreSQL refuses anything else), so their topics are left to the
        batch check, which every merged batch runs.

        Raises:
            EnvelopeError: names the table, the column, both topics and both types.
        """
        by_table: dict[str, list[TableRoute]] = defaultdict(list)
        for route in routes:
            by_table[route.qualified_name].append(route)
        empty_df = None
        for table, members in sorted(by_table.items()):
            if len(members) < 2 or not any(r.merged for r in members):
                continue
            if empty_df is None:
                empty_df = with_source_framings(spark.createDataFrame([], KAFKA_SCHEMA), self._framings())
            schemas, unknown = [], []
            for route in members:
                artifact = f"{route.topic}-value"
                schema_json = self.registry.latest_schema(artifact)
                if schema_json is None:
                    unknown.append(route.topic)
                    continue
                events_df = self._events_slice(empty_df, schema_json, route, f"{artifact} (latest)").events_df
                schemas.append((route.topic, _with_discriminator(events_df, route).schema))
            check_merge_types(table, schemas)
            log.info("%s: %d merged topics agree on column types%s", table, len(schemas),
                     f"; no schema registered yet for {', '.join(unknown)}" if unknown else "")

    def _decode_slice(self, topic_df: DataFrame, ref: SchemaRef, route: TableRoute) -> _Slice:
        schema_json = self.registry.get_schema(ref.id, ref.id_type)
        slice_df = topic_df.filter((F.col("value_id_type") == ref.id_type) & (F.col("value_schema_id") == ref.id))
        return self._events_slice(slice_df, schema_json, route, str(ref))

    def _events_slice(self, slice_df: DataFrame, schema_json: str, route: TableRoute, ref: str) -> _Slice:
        """Framed records of one writer schema -> its unwrapped, typed change events (lazy)."""
        topic = route.topic
        try:
            top_fields = record_fields(schema_json)
        except ValueError as e:
            raise EnvelopeError(f"{topic}: writer schema {ref} is not a Debezium event: {e}") from e
        envelope = is_envelope([f["name"] for f in top_fields])
        if route.events != "auto" and envelope != (route.events == "envelope"):
            found = "an envelope" if envelope else "an unwrap-SMT (flattened) event"
            raise EnvelopeError(
                f"{topic}: writer schema {ref} is {found}, but source {route.source} says events: {route.events}; "
                f"fix that setting (or set it to auto)"
            )
        try:
            if envelope:
                value_fields = _value_fields(schema_json)
                connector = connector_kind([f["name"] for f in record_fields(schema_json, "source")])
            else:
                value_names, connector = flattened_layout([f["name"] for f in top_fields])
                value_fields = [f for f in top_fields if f["name"] in value_names]
        except (ValueError, EnvelopeError) as e:
            raise EnvelopeError(f"{topic}: writer schema {ref}: {e}") from e
        expected = route.connector
        if expected != "auto" and CONNECTOR_KINDS[expected] != connector:
            raise EnvelopeError(
                f"{topic}: writer schema {ref} is a {connector} connector's (its source position), but source "
                f"{route.source} says connector: {expected}; fix that setting (or set it to auto)"
            )
        placeholders = placeholder_tests(value_fields, schema_json)
        value_columns = [f["name"] for f in value_fields]
        decoded_df = decode_value(slice_df, reader_schema(schema_json))
        if envelope:
            unwrapped_df = decoded_df.transform(filter_data_changes).transform(
                unwrap_envelope, value_columns, connector, placeholders
            )
        else:
            unwrapped_df = decoded_df.transform(unwrap_flattened, value_columns, connector, placeholders)
        events_df = unwrapped_df.transform(with_debezium_types, value_fields, schema_json, connector)
        return _Slice(events_df, tuple(value_columns), tuple(placeholders))

    def _record_key(self, route: TableRoute, key_ids: set[SchemaRef]) -> tuple[str, ...] | None:
        """Record key: the configured override, else the fields of the Debezium key schema.

        None when no record of the batch has a key (truncate events only, or a table without a primary key).
        """
        if route.record_key:
            return route.record_key
        if not key_ids:
            return None
        key_sets = {
            tuple(f["name"] for f in record_fields(self.registry.get_schema(ref.id, ref.id_type)))
            for ref in sorted(key_ids)
        }
        if len(key_sets) > 1:
            raise EnvelopeError(f"{route.topic}: key schemas {sorted(key_ids)} disagree on fields {sorted(key_sets)}")
        return key_sets.pop()


@dataclass
class _TopicSummary:
    rows_in: int = 0
    tombstones: int = 0
    unframed: int = 0  # records whose value framing failed
    key_unframed: int = 0
    key_ids: set[SchemaRef] = field(default_factory=set)
    value_ids: set[SchemaRef] = field(default_factory=set)
    offsets: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)  # first, last per partition


@dataclass(frozen=True)
class _Slice:
    """The events of one writer schema id of a topic."""

    events_df: DataFrame
    value_columns: tuple[str, ...]
    placeholder_columns: tuple[str, ...]  # columns that can carry Debezium's unavailable-value placeholder


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
    summary: _TopicSummary
    carry_columns: tuple[str, ...] = ()  # columns an event may leave out (app/unavailable.py)
    routes: tuple[TableRoute, ...] = ()  # every topic's route; () means just `route`

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

    def judged_df(self, ledger_df: DataFrame | None = None) -> DataFrame:
        """The events with the latest one per record key flagged, and the delete ledger's verdict."""
        events_df = required(self.events_df, f"{self.route.qualified_name}: the events")
        key = required(self.record_key, f"{self.route.qualified_name}: the record key")
        flagged_df = events_df.transform(with_latest_flag, key)
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


def _plans_per_table(topic_plans: list[TablePlan], config: JobConfig) -> list[TablePlan]:
    """One plan per Silver table. Topics share a table only when they may (app/route.py): two other topics
    writing one table would interleave positions of different tables, so they are refused."""
    grouped: dict[str, list[TablePlan]] = {}
    for plan in topic_plans:
        group = grouped.setdefault(plan.route.qualified_name, [])
        if group and not group[0].route.may_share_table_with(plan.route):
            key, message = collision(group[0].route, plan.route, config)
            raise EnvelopeError(f"{message} ({key})")
        group.append(plan)
    return [group[0] if len(group) == 1 else _merged_plan(group) for group in grouped.values()]


def check_merge_types(table: str, schemas: list[tuple[str, StructType]]) -> None:
    """Topics merged into one table must agree on each column's type, up to widening within one numeric family
    (integers, decimals, floating point), which a source's schema change brings (a partition's events written
    before an ALTER, another's after). Spark's union would also turn an int and a string into a string: refused.

    Raises:
        EnvelopeError: names the table, the column, both topics and both types.
    """
    seen: dict[str, tuple[str, DataType]] = {}
    for topic, schema in schemas:
        for f in schema.fields:
            if f.name not in seen:
                seen[f.name] = (topic, f.dataType)
                continue
            other_topic, other = seen[f.name]
            # simpleString leaves out nullability (an array's containsNull, a struct field's nullable)
            if other.simpleString() != f.dataType.simpleString() and not any(
                isinstance(other, family) and isinstance(f.dataType, family)
                for family in _WIDENING_FAMILIES
            ):
                raise EnvelopeError(
                    f"{table}: column {f.name} is {other.simpleString()} in {other_topic} but "
                    f"{f.dataType.simpleString()} in {topic}; the topics merged into one table must agree (give "
                    f"one its own table name, or align the source columns)"
                )


# Explicit classes: in PySpark DecimalType is a FractionalType too, and decimal + double must not widen.
_WIDENING_FAMILIES: tuple[tuple[type[DataType], ...], ...] = ((IntegralType,), (DecimalType,), (FloatType, DoubleType))


def _merged_plan(plans: list[TablePlan]) -> TablePlan:
    """The plans of several topics feeding one table, as one: events unioned by column name (a column one
    topic lacks is null in its rows), each tagged with its topic; offsets, counts and schema ids added up.

    Raises:
        EnvelopeError: the topics' record keys differ, or a column has different types in two topics.
    """
    first = plans[0]
    keys = {p.record_key for p in plans if p.record_key is not None}
    if len(keys) > 1:
        raise EnvelopeError(
            f"{first.route.qualified_name}: topics {', '.join(p.route.topic for p in plans)} feed one table but "
            f"their record keys differ: {sorted(keys)}"
        )
    tagged = [(p.route.topic, p.events_df.withColumn(TOPIC_COL, F.lit(p.route.topic)))
              for p in plans if p.events_df is not None]
    check_merge_types(first.route.qualified_name, [(topic, df.schema) for topic, df in tagged])
    events_df = None
    if tagged:
        try:
            events_df = _union(df for _, df in tagged)
        except AnalysisException as e:
            raise EnvelopeError(
                f"{first.route.qualified_name}: topics {', '.join(t for t, _ in tagged)} feed one table but "
                f"disagree on a column's type: {e}"
            ) from e
    summary = _TopicSummary()
    stats = TableBatchStats(first.stats.table, topics=[p.route.topic for p in plans])
    for p in plans:
        summary.rows_in += p.summary.rows_in
        summary.tombstones += p.summary.tombstones
        summary.key_ids |= p.summary.key_ids
        summary.value_ids |= p.summary.value_ids
        summary.offsets.update(p.summary.offsets)
        stats.rows_in += p.stats.rows_in
        stats.skipped += p.stats.skipped
    stats.schema_ids = sorted(summary.value_ids)
    target = next((p.target for p in plans if p.target is not None), None)
    carry = tuple(sorted({c for p in plans for c in p.carry_columns}))
    return TablePlan(first.route, keys.pop() if keys else None, events_df, target, stats, summary, carry,
                     routes=tuple(p.route for p in plans))


def _with_discriminator(events_df: DataFrame, route: TableRoute) -> DataFrame:
    """The shard's discriminator column: its configured value, else the source's own column (which must exist).

    Raises:
        EnvelopeError: the source table has no such column and no value is configured.
    """
    discriminator = route.discriminator
    if discriminator is None:
        return events_df
    if discriminator.value is not None:
        return events_df.withColumn(discriminator.column, F.lit(discriminator.value))
    if discriminator.column not in events_df.columns:
        raise EnvelopeError(
            f"{route.topic}: has no column {discriminator.column!r}, its discriminator "
            f"(tables.{route.source_key}.discriminator of source {route.source}); set a value to add it"
        )
    return events_df


def _value_fields(envelope_schema_json: str) -> list[dict[str, Any]]:
    # The Value record is defined inline in whichever of before/after comes first; the other names it.
    try:
        return record_fields(envelope_schema_json, "before")
    except ValueError:
        return record_fields(envelope_schema_json, "after")


def _count(judged_df: DataFrame, sources: dict[str, list[str]] | None = None) -> dict[str, Any]:
    """Events, and among the latest per key: upserts, deletes, blocked, re-inserts, pending (to be written but
    lacking a value), unresolved, and the highest position written (`max_position`; with several `sources`,
    {label: topics}, one per source as `max_position:<label>`). One aggregate."""
    latest, deleted, blocked = F.col(LATEST_COL), is_delete(judged_df.columns), F.col(BLOCKED_COL)
    per_source = [
        F.max(F.when(latest & ~blocked & F.col(TOPIC_COL).isin(topics), F.col(POSITION_COL)))
        .alias(f"max_position:{label}")
        for label, topics in sources.items()
    ] if sources and len(sources) > 1 else []
    row = judged_df.agg(
        F.count(F.lit(1)).alias("events"),
        F.count(F.when(latest & ~deleted & ~blocked, 1)).alias("upserts"),
        F.count(F.when(latest & deleted, 1)).alias("deletes"),
        F.count(F.when(latest & blocked, 1)).alias("blocked"),
        F.count(F.when(latest & F.col(REINSERT_COL), 1)).alias("reinserts"),
        F.count(F.when(latest & ~blocked & is_pending(), 1)).alias("pending"),
        F.count(F.when(latest & ~blocked & is_unresolved(), 1)).alias("unresolved"),
        F.max(F.when(latest & ~blocked, F.col(POSITION_COL))).alias("max_position"),
        *per_source,
    ).first()
    return required(row, "the row of a global aggregate").asDict()


def _max_position(counts: dict[str, Any], sources: dict[str, list[str]]) -> str | None:
    """`_cdc.max_position` (app/commit.py): the highest position written; for a table fed by several source
    servers, whose positions do not compare, JSON {source label: its highest position}."""
    if len(sources) < 2:
        value = counts["max_position"]
        return None if value is None else str(value)
    per_source = {label: counts[f"max_position:{label}"] for label in sorted(sources)}
    written = {label: str(value) for label, value in per_source.items() if value is not None}
    return json.dumps(written, separators=(",", ":")) if written else None


def _union(frames: Iterable[DataFrame]) -> DataFrame:
    frames = list(frames)
    result = frames[0]
    for frame in frames[1:]:
        # Writer schemas differ when a column was added between them: missing columns become null.
        result = result.unionByName(frame, allowMissingColumns=True)
    return result

