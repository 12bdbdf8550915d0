"""A batch's plan (app/batch/plan.py): the records summarised per topic, topics routed to tables, each writer
schema's records decoded and unwrapped into typed change events, several topics of one table merged. Lazy but for
the summary aggregate and the registry look-ups; writes nothing."""
from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, defaultdict
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.utils import AnalysisException

from app.batch.merge import check_merge_types, plans_per_table, union
from app.batch.plan import (
    BatchPlan,
    BatchSummary,
    SkippedTopic,
    Slice,
    TablePlan,
    TableTopics,
    TopicSummary,
    dead_coordinates,
    quarantined_coordinates,
)
from app.cdc.debezium_types import declares_default, placeholder_tests, reader_schema, with_debezium_types
from app.cdc.position import CONNECTOR_KINDS, connector_kind
from app.cdc.unwrap import (
    NO_KEY_CHECK,
    KeyCheck,
    filter_data_changes,
    flattened_layout,
    is_envelope,
    unwrap_envelope,
    unwrap_flattened,
    with_event_errors,
    with_soft_deletes,
)
from app.config import JobConfig
from app.errors import EnvelopeError, RegistryError, SchemaDecodeError, SourceSettingError, required
from app.routing.catalog import PartitionRoots, all_partition_roots
from app.routing.route import TableRoute, claim_tables, route_topic, skip_reason
from app.sink.hudi import key_lengths_needed, lake_target, recorded_record_key
from app.sink.quarantine import Quarantine
from app.spark import in_threads, placeholder_frame, substitute
from app.state.stats import TableBatchStats
from app.state.status import REFUSED
from app.wire.decode import decode_value, error_struct, record_fields
from app.wire.framing import Framing, with_source_framings
from app.wire.registry import HTTP_NOT_FOUND, RegistryClient, SchemaRef
from app.wire.source import KAFKA_SCHEMA

log = logging.getLogger(__name__)

# Kinds of `_cdc_error` (app/cdc/columns.py) the planner finds before decoding.
FRAMING = "framing"
UNKNOWN_SCHEMA = "unknown_schema_id"
UNKNOWN_SCHEMA_POLL_S = 5.0  # how often an unknown schema id is asked again during its grace period


class Planner:
    """Plans batches for one job config; holds the registry client (its schema cache)."""

    def __init__(self, config: JobConfig, registry: RegistryClient, quarantine: Quarantine | None = None) -> None:
        self.config = config
        self.registry = registry
        self.quarantine = quarantine or Quarantine(config)
        self._unknown_since: dict[SchemaRef, float] = {}  # schema ids the registry answered 404 for: since when
        # Each Silver table's claim (app/routing/route.py `claim_tables`; None: contested by topics that appeared
        # together): made at start (app/job.py), then by each topic that appears; the topics refused, with why.
        self.claims: dict[str, TableRoute | None] = {}
        self.refused: dict[str, str] = {}
        self.templates = SliceTemplates()

    def refuse(self, topic: str, why: str) -> str:
        """A topic refused its table: said once per run, at error level; returns the reason status.json gives."""
        reason = f"{REFUSED}{why}"
        if topic not in self.refused:
            log.error("topic %s %s. Bronze keeps its records; once the topics are told apart (restart the job), "
                      "snapshot the table of each topic refused (docs/sources.md \"Snapshots of one table\")",
                      topic, reason)
        self.refused[topic] = reason
        return reason

    def plan(self, raw_df: DataFrame, workers: int = 1) -> BatchPlan:
        """What a batch writes, per table, without writing: the Silver frames and their targets (`summarize`, then
        `plan_tables`).

        Raises:
            SchemaDecodeError: a value lacks the framing.
            EnvelopeError: a topic or writer schema is not what a Debezium connector produces.
        """
        return self.plan_tables(self.summarize(self.frame(raw_df)), workers)

    def frame(self, raw_df: DataFrame) -> DataFrame:
        """The batch's records with their framing columns (each source's framing, app/wire/framing.py)."""
        return with_source_framings(raw_df, self.framings())

    def summarize(self, framed_df: DataFrame) -> BatchSummary:
        """The batch's framed records (`frame`) summarised per topic (one Spark action, the summary aggregate); the
        topics routed. Topics that feed no table (`app/routing/route.skip_reason`), and topics refused a table another
        topic holds (`claim_tables`), are left out, in `BatchSummary.skipped`."""
        self.quarantine.load(framed_df.sparkSession)
        started = time.monotonic()
        summary = self._summarize(framed_df)
        summary_s = time.monotonic() - started
        newest = {topic: s.newest_ms for topic, s in summary.items() if s.newest_ms is not None}
        skipped = {}
        for topic in list(summary):
            reason = skip_reason(topic, self.config)
            if reason is not None:
                s = summary.pop(topic)
                skipped[topic] = SkippedTopic(reason, s.rows_in, s.offsets)
        roots = all_partition_roots(framed_df.sparkSession, self.config)
        for topic, why in claim_tables(self._routes(summary, roots), self.claims, self.config).items():
            s = summary.pop(topic)
            skipped[topic] = SkippedTopic(self.refuse(topic, why), s.rows_in, s.offsets)
        return BatchSummary(framed_df, summary, skipped, roots, newest, summary_s)

    def plan_tables(self, batch: BatchSummary, workers: int = 1) -> BatchPlan:
        """A summarised batch's plan: the framing check, then each table's plan (`plan_table`), `workers` tables at a
        time (building a plan runs no Spark job, but Spark analyses each of its steps on the driver: on threads of
        their own, tables are analysed on several cores).

        Raises:
            SchemaDecodeError: a value lacks the framing (fail-fast).
            EnvelopeError: a topic or writer schema is not what a Debezium connector produces; of several tables'
                errors, the first table's, as when they are planned one after another.
        """
        self.check_framing(batch)
        calls = [partial(self.plan_table, batch, table) for table in self.table_topics(batch)]
        return BatchPlan(in_threads(calls, workers), batch.skipped)

    def table_topics(self, batch: BatchSummary) -> list[TableTopics]:
        """The batch's topics per Silver table, in the order of their first topic by name (`TableTopics`)."""
        groups: dict[str, tuple[str | None, list[str]]] = {}
        for topic in sorted(batch.topics):
            try:
                route = route_topic(topic, self.config, batch.roots)
            except EnvelopeError:
                groups[topic] = (None, [topic])
                continue
            groups.setdefault(route.qualified_name, (route.database, []))[1].append(topic)
        return [TableTopics(name, database, tuple(topics)) for name, (database, topics) in groups.items()]

    def plan_table(self, batch: BatchSummary, table: TableTopics) -> TablePlan:
        """One table's plan: the registry look-ups and a lazy decode plan for each of its topics, several topics merged
        into one (app/batch/merge.py).

        Raises:
            EnvelopeError: a topic or writer schema is not what a Debezium connector produces, or the topics may not
                share the table.
        """
        plans = [self._plan_topic(batch.framed_df, topic, batch.topics[topic], batch.roots) for topic in table.topics]
        [plan] = plans_per_table(plans, self.config)
        return plan

    def check_framing(self, batch: BatchSummary) -> None:
        """Fail-fast mode: a value that cannot be split stops the batch before any table is planned (`_check_framing`).

        Raises:
            SchemaDecodeError: names the first such record.
        """
        if self.config.dead_letters.mode == "fail_fast":
            self._check_framing(batch.framed_df, batch.topics, batch.roots)

    def _routes(self, summary: dict[str, TopicSummary], roots: PartitionRoots) -> list[TableRoute]:
        """The batch's topics' routes; a topic of no known form is left to its plan (which names the record)."""
        routes = []
        for topic in summary:
            try:
                routes.append(route_topic(topic, self.config, roots))
            except EnvelopeError:
                continue
        return routes

    def framings(self) -> list[tuple[str, Framing]]:
        """Each source's topic prefix and wire framing."""
        return [(s.topic_prefix, Framing(s.framing, s.id_type)) for s in self.config.source_list]

    def _summarize(self, framed_df: DataFrame) -> dict[str, TopicSummary]:
        """One aggregate: per topic, key and value schema reference and whether framing failed, record count,
        newest Kafka timestamp. Drives everything after."""
        rows = (
            framed_df.groupBy(
                "topic", "partition", "key_id_type", "key_schema_id", "value_id_type", "value_schema_id",
                F.col("key_frame_error").isNotNull().alias("key_bad"),
                F.col("value_frame_error").isNotNull().alias("value_bad"),
            )
            .agg(F.count(F.lit(1)).alias("n"), F.min("offset").alias("first"), F.max("offset").alias("last"),
                 F.max(F.unix_millis("timestamp")).alias("newest_ms"))
            .collect()
        )
        summary: dict[str, TopicSummary] = defaultdict(TopicSummary)
        for row in rows:
            s = summary[row["topic"]]
            s.rows_in += row["n"]
            tp = (row["topic"], row["partition"])
            first, last = s.offsets.get(tp, (row["first"], row["last"]))
            s.offsets[tp] = (min(first, row["first"]), max(last, row["last"]))
            if row["newest_ms"] is not None:
                s.newest_ms = max(s.newest_ms or 0, row["newest_ms"])
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

    def _check_framing(self, framed_df: DataFrame, summary: dict[str, TopicSummary], roots: PartitionRoots) -> None:
        """A value that cannot be split stops the batch; so does a key, unless its table's record key is set
        in config (then the key bytes are not read, and any key converter will do)."""
        bad_values = [t for t, s in summary.items() if s.unframed]
        bad_keys = [
            t for t, s in summary.items() if s.key_unframed and not route_topic(t, self.config, roots).record_key
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

    def _plan_topic(self, framed_df: DataFrame, topic: str, summary: TopicSummary, roots: PartitionRoots) -> TablePlan:
        route = route_topic(topic, self.config, roots)
        stats = TableBatchStats(route.qualified_name, rows_in=summary.rows_in, schema_ids=sorted(summary.value_ids),
                                topics=[topic] if route.source_partition or route.merged else [])
        stats.skipped = summary.tombstones
        quarantined = self.quarantine.reason(route.qualified_name)
        if quarantined is not None:  # nothing decoded: every record goes to the dead letters
            stats.quarantined = quarantined
            return TablePlan(route, None, None, None, stats, summary, source_df=framed_df,
                             dead_df=quarantined_coordinates(framed_df, [topic], quarantined))
        try:
            return self._plan_events(framed_df, topic, summary, route, stats)
        except EnvelopeError as e:
            if self.config.dead_letters.mode == "fail_fast" or isinstance(e, SourceSettingError):
                raise
            # The topic's events cannot become rows of its table (a writer schema that is no Debezium event, nor an
            # unwrap-SMT event that keeps deletes and order): the writer quarantines the table.
            return TablePlan(route, None, None, None, stats, summary, source_df=framed_df, quarantine=str(e))

    def _plan_events(
        self, framed_df: DataFrame, topic: str, summary: TopicSummary, route: TableRoute, stats: TableBatchStats
    ) -> TablePlan:
        topic_df = framed_df.filter(F.col("topic") == topic)
        dead = []
        if summary.unframed:  # dead-letter mode only: fail-fast stopped at _check_framing
            dead.append(dead_coordinates(
                topic_df.filter(F.col("value_frame_error").isNotNull()),
                error_struct(FRAMING, F.concat(F.lit("value "), F.col("value_frame_error"))),
            ))
        key_schemas: dict[SchemaRef, str] = {}
        record_key, keys = self._record_key(route, summary.key_ids, framed_df.sparkSession, key_schemas)
        slices = []
        for ref in sorted(summary.value_ids):
            decoded = self._decode_slice(framed_df, topic, ref, route, keys)
            if isinstance(decoded, Slice):
                slices.append(decoded)
            else:
                dead.append(decoded)
        dead_df = union(dead) if dead else None
        if record_key is not None:
            record_key = route.written_key(record_key)
        if not slices:  # only tombstones, or records that cannot be decoded
            return TablePlan(route, None, None, None, stats, summary, dead_df=dead_df, source_df=framed_df,
                             key_schemas=key_schemas)
        target = None
        if record_key is not None:
            target = lake_target(self.config.lake, route.table, record_key, database=route.database,
                                 table_type=route.table_type, delete_mode=route.delete_mode, partition=route.partition,
                                 compaction_delta_commits=route.compaction_delta_commits)
        try:
            events_df = union(s.events_df for s in slices)
        except AnalysisException as e:
            raise EnvelopeError(
                f"{topic}: writer schemas {sorted(summary.value_ids)} in one batch disagree on column types: {e}"
            ) from e
        events_df = with_discriminator(events_df, route, self.config)
        if target is not None:
            target = replace(target, key_lengths=key_lengths_needed(target, events_df))
        carry = sorted({c for s in slices for c in s.placeholder_columns})
        if target is not None and target.delete_mode == "soft":
            value_columns = list(dict.fromkeys(c for s in slices for c in s.value_columns))
            events_df = events_df.transform(with_soft_deletes, target.record_key, value_columns)
            carry = [c for c in value_columns if c not in target.record_key]
        return TablePlan(route, record_key, events_df, target, stats, summary, tuple(carry), dead_df=dead_df,
                         source_df=framed_df, key_schemas=key_schemas,
                         defaulted_columns=tuple(sorted({c for s in slices for c in s.defaulted_columns})),
                         source_columns=tuple(dict.fromkeys(c for s in slices for c in s.value_columns)))

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
                empty_df = with_source_framings(spark.createDataFrame([], KAFKA_SCHEMA), self.framings())
            schemas, unknown = [], []
            for route in members:
                artifact = f"{route.topic}-value"
                schema_json = self.registry.latest_schema(artifact)
                if schema_json is None:
                    unknown.append(route.topic)
                    continue
                events_df = self.events_slice(empty_df, schema_json, route, f"{artifact} (latest)").events_df
                schemas.append((route.topic, with_discriminator(events_df, route, self.config).schema))
            check_merge_types(table, schemas)
            log.info("%s: %d merged topics agree on column types%s", table, len(schemas),
                     f"; no schema registered yet for {', '.join(unknown)}" if unknown else "")

    def _decode_slice(
        self, framed_df: DataFrame, topic: str, ref: SchemaRef, route: TableRoute, keys: KeyCheck
    ) -> Slice | DataFrame:
        """The slice of one writer schema of `topic` among the batch's framed records; its records' dead-letter
        coordinates instead when the registry does not know the id (after the grace period, `_writer_schema`). The
        slice's plan is built once per writer schema, route and key check (`SliceTemplates`)."""
        schema_json, error = self._writer_schema(ref)
        if schema_json is None:
            return dead_coordinates(slice_records(framed_df, topic, ref),
                                    error_struct(UNKNOWN_SCHEMA, F.lit(str(error))))
        key = (topic, ref, schema_json, repr(route), keys.required, tuple(sorted((keys.refused or {}).items())))
        return self.templates.slice(
            key, framed_df,
            lambda records_df: self.events_slice(slice_records(records_df, topic, ref), schema_json, route, str(ref),
                                                 keys))

    def _writer_schema(self, ref: SchemaRef) -> tuple[str | None, RegistryError | None]:
        """A writer schema from the registry. An id it answers 404 for is asked again, backing off, until
        `dead_letters.unknown_schema_grace_s` have passed since this process first met it (a lagging replica); then
        (None, the error), or in fail-fast mode the error raised. Any other registry error is raised: the batch
        fails and is read again at the next start, nothing goes to the dead letters.

        Raises:
            RegistryError: not a 404, or a 404 in fail-fast mode once the grace period is over.
        """
        grace = self.config.dead_letters.unknown_schema_grace_s
        while True:
            try:
                schema_json = self.registry.get_schema(ref.id, ref.id_type)
            except RegistryError as e:
                if e.http_status != HTTP_NOT_FOUND:
                    raise
                waited = time.monotonic() - self._unknown_since.setdefault(ref, time.monotonic())
                if waited >= grace:
                    if self.config.dead_letters.mode == "fail_fast":
                        raise
                    log.error("schema %s is unknown to the registry after %.0f s: its records go to the dead "
                              "letters (%s)", ref, waited, e)
                    return None, e
                pause = min(UNKNOWN_SCHEMA_POLL_S, grace - waited)
                log.warning("schema %s: the registry does not know it (%.0f of %.0f s grace); asking again in "
                            "%.1f s", ref, waited, grace, pause)
                time.sleep(pause)
                continue
            self._unknown_since.pop(ref, None)
            return schema_json, None

    def events_slice(
        self, slice_df: DataFrame, schema_json: str, route: TableRoute, ref: str, keys: KeyCheck = NO_KEY_CHECK
    ) -> Slice:
        """Framed records of one writer schema -> its unwrapped, typed change events (lazy); those the job cannot
        apply carry `_cdc_error` (app/wire/decode.py, app/cdc/unwrap.py `with_event_errors`)."""
        topic = route.topic
        try:
            top_fields = record_fields(schema_json)
        except ValueError as e:
            raise EnvelopeError(f"{topic}: writer schema {ref} is not a Debezium event: {e}") from e
        envelope = is_envelope([f["name"] for f in top_fields])
        if route.events != "auto" and envelope != (route.events == "envelope"):
            found = "an envelope" if envelope else "an unwrap-SMT (flattened) event"
            raise SourceSettingError(
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
            raise SourceSettingError(
                f"{topic}: writer schema {ref} is a {connector} connector's (its source position), but source "
                f"{route.source} says connector: {expected}; fix that setting (or set it to auto)"
            )
        placeholders = placeholder_tests(value_fields, schema_json)
        value_columns = [f["name"] for f in value_fields]
        decoded_df = decode_value(slice_df, reader_schema(schema_json), ref)
        decoded_df = decoded_df.transform(with_event_errors, envelope, keys)
        if envelope:
            unwrapped_df = decoded_df.transform(filter_data_changes, route.truncate == "clear").transform(
                unwrap_envelope, value_columns, connector, placeholders
            )
        else:
            unwrapped_df = decoded_df.transform(unwrap_flattened, value_columns, connector, placeholders)
        events_df = unwrapped_df.transform(with_debezium_types, value_fields, schema_json, connector)
        defaulted = tuple(f["name"] for f in value_fields if declares_default(f))
        return Slice(events_df, tuple(value_columns), tuple(placeholders), defaulted)

    def _record_key(
        self, route: TableRoute, key_ids: set[SchemaRef], spark: SparkSession, key_schemas: dict[SchemaRef, str]
    ) -> tuple[tuple[str, ...] | None, KeyCheck]:
        """Record key: the configured override, else the fields of the Debezium key schema; and what a record's key
        must be (`KeyCheck`). The key schemas found go to `key_schemas`.

        The key is None when no record of the batch has a key (truncate events only, or a table without a primary
        key), unless the table clears on truncates: then it is the existing table's. Key schemas whose fields are not
        the table's record key (as the table was created, else the newest key schema's) are refused: their records
        go to the dead letters.

        Raises:
            EnvelopeError: fail-fast mode, and a key schema is refused.
        """
        if route.record_key:
            return route.record_key, NO_KEY_CHECK
        if not key_ids:
            # A batch of truncates only (they have no key) still writes to a table that clears on them.
            recorded = None if route.truncate != "clear" else recorded_record_key(
                spark, self.config.lake.table_path(route.table, route.database))
            return recorded, KeyCheck(required=True)
        fields, refused = {}, {}
        for ref in sorted(key_ids):
            schema_json, error = self._writer_schema(ref)
            if schema_json is None:
                refused[(ref.id_type, ref.id)] = f"key schema {ref} is unknown to the registry: {error}"
            else:
                key_schemas[ref] = schema_json
                fields[ref] = tuple(f["name"] for f in record_fields(schema_json))
        if not fields:
            return None, KeyCheck(required=True, refused=refused)
        recorded = recorded_record_key(spark, self.config.lake.table_path(route.table, route.database))
        discriminator = route.discriminator
        if recorded is not None and discriminator is not None:
            recorded = tuple(c for c in recorded if c != discriminator.column)
        key = recorded if recorded is not None else fields[max(fields)]
        refused.update({
            (ref.id_type, ref.id): f"key schema {ref} has fields {list(names)}; the table's record key is {list(key)}"
            for ref, names in fields.items() if names != key
        })
        if refused and self.config.dead_letters.mode == "fail_fast":
            raise EnvelopeError(f"{route.topic}: {'; '.join(sorted(refused.values()))}")
        return key, KeyCheck(required=True, refused=refused)


def slice_records(framed_df: DataFrame, topic: str, ref: SchemaRef) -> DataFrame:
    """The framed records of `topic` whose value has the writer schema `ref`."""
    return framed_df.filter(F.col("topic") == topic).filter(
        (F.col("value_id_type") == ref.id_type) & (F.col("value_schema_id") == ref.id))


TEMPLATES_KEPT = 512  # SliceTemplates: writer schemas' plans kept, the least recently used dropped first


class SliceTemplates:
    """Each slice's plan (`Planner.events_slice`: decode, the events' errors, unwrap, types) built once, over an
    empty frame of the batch's framed records (app/spark.py `placeholder_frame`), and used again for each batch
    (`substitute`): building it from Python costs hundreds of calls into the JVM and an analysis of each step, about
    130 ms of the driver for a table of a dozen columns, every batch and table; the substitution takes one call and
    one analysis. A plan is kept per `key` (the topic, writer schema, route and key check: everything the plan is
    made of besides the records) and the records' columns; `TEMPLATES_KEPT` at most. Safe from several threads: two
    threads missing one key at once both build it."""

    def __init__(self, kept: int = TEMPLATES_KEPT) -> None:
        self.kept = kept
        self._plans: OrderedDict[tuple[Any, ...], tuple[DataFrame, Slice]] = OrderedDict()
        self._lock = threading.Lock()

    def slice(self, key: tuple[Any, ...], framed_df: DataFrame, build: Callable[[DataFrame], Slice]) -> Slice:
        """The slice `build` makes of `framed_df` (`build` takes the framed records, and must read nothing else that
        differs between batches of one `key`).

        Raises:
            EnvelopeError: as `build` (nothing is kept then).
        """
        key = (*key, framed_df.schema.json())
        with self._lock:
            found = self._plans.get(key)
            if found is not None:
                self._plans.move_to_end(key)
        if found is None:
            placeholder = placeholder_frame(framed_df.sparkSession, framed_df.schema)
            found = (placeholder, build(placeholder))
            with self._lock:
                self._plans[key] = found
                while len(self._plans) > self.kept:
                    self._plans.popitem(last=False)
        placeholder, template = found
        return replace(template, events_df=substitute(template.events_df, placeholder, framed_df))


def with_discriminator(events_df: DataFrame, route: TableRoute, config: JobConfig) -> DataFrame:
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
        key = config.table_setting_key(route.source, route.source_key, "discriminator")
        raise SourceSettingError(
            f"{route.topic}: has no column {discriminator.column!r}, its discriminator ({key}); set "
            f"{key}.value to add it"
        )
    return events_df


def _value_fields(envelope_schema_json: str) -> list[dict[str, Any]]:
    # The Value record is defined inline in whichever of before/after comes first; the other names it.
    try:
        return record_fields(envelope_schema_json, "before")
    except ValueError:
        return record_fields(envelope_schema_json, "after")
