"""One table's share of a batch, the exactly-once unit: its named steps run in this order.

    plan           the table's decode plan built (app/batch/planner.py `plan_table`; app/batch/processor.py
                   `TableUnits`), while Bronze is written beside the units
    commit check   the table's last commit: offsets it applied already are skipped (a replayed batch), and only
                   those above are written when a lost checkpoint re-reads with other batch boundaries
    truncate       a table whose truncate policy is `clear` (its truncate events are among its events): each key
                   written before the batch's latest truncate gets a delete at its position (app/cdc/derived.py)
    ledger read    the delete ledger's folders and highest fact position (hard-delete tables; app/sink/ledger.py
                   `open_ledger`), so an older event never revives a deleted row
    count          the latest event per key judged and counted (one aggregate over the persisted events); a row
                   to write that lacks a value (TOAST placeholder, soft delete) is filled from the table first; the
                   steps after it build on the persisted events as one plan node (app/spark.py `over_cache`)
    ledger join    only when an upsert of the batch may be at or below a ledger fact (a redelivery, a replay): the
                   events judged and counted again against the ledger's keys (app/sink/ledger.py "Above the
                   ledger"); a table fed by several sources is judged against them in its count
    unread rows    a table whose `unread_rows` is `delete`, when a full snapshot of it ended in the batch (its last
                   read): the keys it did not read get a delete each (app/cdc/derived.py), and the events are
                   judged again
    bronze wait    until the batch's Bronze is written (`ready`): the steps above only read, those below write
    dead letters   the events that cannot be applied (`_cdc_error`) and the records found unusable before decoding,
                   to the dead-letter table, before the table's commit (app/sink/deadletters.py); in fail-fast
                   mode the first of them stops the batch instead
    settle         only when the batch has snapshot reads (`op=r`) of a table with pending dead letters: those of
                   the keys read later in the same partition are marked resnapshotted, before the commit (a crash
                   between the two marks them again, harmlessly: the batch is read again)
    ledger write   deletes and re-inserts recorded in the ledger, before the table (app/sink/ledger.py)
    widen          only when the batch's columns differ from those last written to the table by this process: a
                   column widened upstream that Hudi cannot take in place (a decimal's size, float -> double)
                   rewrites the table with the new types first (app/sink/widening.py); a column added upstream
                   with a default asks the connector for an incremental snapshot of the table (app/wire/signals.py)
    upsert         the Hudi write, its commit carrying the batch's offsets and highest position (app/sink/commit.py),
                   then Hudi's meta sync when the catalog can be behind (app/sink/metasync.py)
    ledger compaction  after a ledger write, once enough folders have gathered, they are merged into one (after
                   the commit: off the batch's freshness; a failure is logged and left to the next batch)

Shares nothing with other tables' units (its plan and stats are its own), so a batch's tables may be written
from several threads at once (tests/e2e/test_exactly_once.py).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from py4j.protocol import Py4JJavaError
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.utils import CapturedException

from app.batch.merge import union
from app.batch.plan import TablePlan, quarantined_coordinates
from app.batch.planner import FRAMING
from app.cdc.columns import (
    BLOCKED_COL,
    DELETED_COL,
    ERROR_COL,
    INTERNAL_COLUMNS,
    LATEST_COL,
    OFFSET_COL,
    OP_COL,
    PARTITION_COL,
    POSITION_COL,
    REINSERT_COL,
    SNAPSHOT_END_COL,
    SOURCE_TS_COL,
    TOPIC_COL,
    UNAVAILABLE_COL,
)
from app.cdc.derived import with_truncate_deletes, with_unread_deletes
from app.cdc.unavailable import is_pending, is_unresolved
from app.cdc.unwrap import OP_READ, OP_TRUNCATE, is_delete
from app.config import JobConfig
from app.errors import EnvelopeError, SchemaDecodeError, SinkWriteError, java_root_cause, required
from app.hooks import Hooks
from app.routing.route import check_owner
from app.sink.commit import Committed, OffsetRanges, commit_metadata, last_committed
from app.sink.deadletters import SAMPLE_KEYS, DeadLetters, dead_letter_rows
from app.sink.hudi import HudiTarget, sized_options, table_exists, write_silver
from app.sink.ledger import LedgerView, compact_ledger, ledger_key, open_ledger, write_ledger
from app.sink.lost import LostTables
from app.sink.metasync import MetaSync
from app.sink.partitioning import with_partition_field
from app.sink.quarantine import Quarantine, QuarantineEntry, failure_kind
from app.sink.widening import Widening
from app.spark import over_cache
from app.state.status import MAX_DIVERGED_KEYS
from app.wire.decode import DECODE, TRAILING_BYTES
from app.wire.signals import request_snapshot

log = logging.getLogger(__name__)


def columns_to_snapshot(added: Sequence[str], defaulted: Sequence[str], policy: str) -> list[str]:
    """Of the columns added upstream, those that make the job ask for an incremental snapshot of the table under
    `snapshot_new_columns` = `policy` (`defaulted`: the columns whose writer schema declares a default)."""
    if policy == "all":
        return list(added)
    if policy == "with_default":
        return [c for c in added if c in defaulted]
    return []


@dataclass
class Step:
    """Where a batch is: its id, the table being written (None outside the tables' units) and the step's name.
    A failure is recorded with it (app/state/status.py); each table's unit has its own."""

    batch_id: int
    table: str | None = None
    name: str = "plan"
    started: float = dataclasses.field(default_factory=time.monotonic)

    def enter(self, name: str, timings: dict[str, float]) -> None:
        """The next step begins: the time since the last one began goes to `timings` under its name."""
        self.close(timings)
        self.name = name

    def close(self, timings: dict[str, float]) -> None:
        """The step ends: its time goes to `timings` (a step without a name is not timed)."""
        now = time.monotonic()
        if self.name:
            timings[self.name] = timings.get(self.name, 0.0) + now - self.started
        self.started = now

    def __str__(self) -> str:
        table = f", table {self.table}" if self.table else ""
        return f"batch {self.batch_id}{table}, step {self.name}"


class TableWriter:
    """Writes tables' plans for one job config; `hooks` adds write options (tests only, app/hooks.py)."""

    def __init__(
        self, config: JobConfig, hooks: Hooks, quarantine: Quarantine | None = None, *, replay: bool = False,
        rebuild: bool = False,
    ) -> None:
        self.config = config
        self.hooks = hooks
        self.quarantine = quarantine or Quarantine(config)
        # A replay of dead letters (app/batch/processor.py): the commit check lets every event through (their
        # positions order them against the table's rows), and each event's verdict is kept for the report.
        self.replay = replay
        self.replayed: list[ReplayedEvent] = []
        # A rebuild from Bronze (scripts/rebuild.py) writes the tables the lost-table check refuses the job.
        self.rebuild = rebuild
        self.meta_sync = MetaSync(every_commit=config.lake.meta_sync == "every_commit")
        self.dead_letters = DeadLetters(config)
        self.widening = Widening()
        self.lost = LostTables()  # app/sink/lost.py: tables the catalog holds and the lake lost
        self.conf_file = "<conf file>"  # the job's config file, for the commands its messages name

    def write(
        self, plan: TablePlan, batch_id: int, query_id: str, step: Step | None = None,
        ready: Callable[[], None] = lambda: None,
    ) -> None:
        """One table's unit of the batch: the check on its timeline, the write, the offsets in the commit. A
        transient failure is tried again (`lake.write_retries`); one that quarantines (app/sink/quarantine.py)
        quarantines the table instead of failing the batch (not in fail-fast mode). `ready` returns once the unit
        may write to the lake (Bronze written: app/batch/processor.py `BronzeGate`); the unit's reads come before.

        Raises:
            SchemaDecodeError: fail-fast, and a record of the table cannot be decoded (names the record).
            SinkWriteError: the Hudi write failed, and neither a retry nor a quarantine applies.
        """
        step = step or Step(batch_id, plan.route.qualified_name)
        started = step.started  # the unit's start: its step `plan` built the plan (app/batch/processor.py TableUnits)
        step.enter("", plan.stats.steps_s)
        attempt = 0
        while True:
            try:
                if plan.quarantine is not None:  # its events could not be planned
                    step.name = "plan"
                    self._quarantine(plan, EnvelopeError(plan.quarantine), step, query_id, ready)
                    break
                self._write_unit(plan, batch_id, query_id, step, ready)
                break
            except Exception as e:
                kind = failure_kind(e)
                if kind == "transient" and attempt < self.config.lake.write_retries:
                    delay = WRITE_RETRY_BACKOFF_S * 2 ** attempt
                    attempt += 1
                    log.warning(
                        "batch=%s table=%s: step %s failed with a transient error (attempt %d of %d); the table's "
                        "unit runs again in %.0f s: %s", batch_id, plan.route.qualified_name, step.name, attempt,
                        self.config.lake.write_retries + 1, delay, _first_line(e),
                    )
                    time.sleep(delay)
                    continue
                if kind == "quarantine" and self.config.dead_letters.mode == "dead_letter":
                    self._quarantine(plan, e, step, query_id, ready)
                    break
                raise
        step.close(plan.stats.steps_s)
        plan.stats.duration_s = time.monotonic() - started
        log.info("%s", plan.stats.log_line(batch_id))

    def _write_unit(
        self, plan: TablePlan, batch_id: int, query_id: str, step: Step, ready: Callable[[], None]
    ) -> None:
        try:
            if plan.events_df is not None and plan.target is None:
                step.enter("keyless check", plan.stats.steps_s)
                self._check_keyless(plan)
                step.enter("bronze wait", plan.stats.steps_s)
                ready()
                step.enter("dead letters", plan.stats.steps_s)
                dead = self._write_dead_letters(plan, plan.events_df, step, query_id)
                plan.stats.skipped = max(0, plan.stats.skipped - dead)
            elif plan.events_df is not None and plan.target is not None:
                self._write_events(plan, plan.target, step, query_id, ready)
            elif plan.dead_df is not None:
                step.enter("bronze wait", plan.stats.steps_s)
                ready()
                step.enter("dead letters", plan.stats.steps_s)
                self._write_dead_letters(plan, None, step, query_id)
        except (Py4JJavaError, CapturedException) as e:
            raise SinkWriteError(
                f"batch {batch_id}: Hudi write of {plan.route.qualified_name} failed: {java_root_cause(e)}"
            ) from e

    def _keep_verdicts(self, plan: TablePlan, target: HudiTarget, judged_df: DataFrame) -> None:
        """A replay: each event's verdict (in error, the latest of its key, blocked by the delete ledger, columns
        still unavailable), for scripts/replay_dead_letters.py's report."""
        topic = F.col(TOPIC_COL) if TOPIC_COL in judged_df.columns else F.lit(plan.route.topic)
        rows = judged_df.select(
            topic.alias("topic"), F.col(PARTITION_COL).alias("partition"), F.col(OFFSET_COL).alias("offset"),
            F.col(POSITION_COL).alias("position"), F.col(LATEST_COL).alias("latest"),
            F.col(BLOCKED_COL).alias("blocked"), is_delete(judged_df.columns).alias("delete"),
            F.col(f"{ERROR_COL}.kind").alias("error_kind"), F.col(f"{ERROR_COL}.message").alias("error_message"),
            ledger_key(target.record_key).alias("key"), F.col(UNAVAILABLE_COL).alias("unavailable"),
        ).collect()
        self.replayed.extend(ReplayedEvent(target, r.asDict()) for r in rows)

    def _quarantine(
        self, plan: TablePlan, error: Exception, step: Step, query_id: str, ready: Callable[[], None]
    ) -> None:
        """Quarantine the table (its file first: app/sink/quarantine.py), then send the batch's records of its topics
        to the dead letters, kind `quarantined`; the batch goes on with the other tables."""
        table, failed_step = plan.route.qualified_name, step.name
        ready()
        reason = f"step {failed_step}: {type(error).__name__}: {_first_line(error)}"
        source_df = required(plan.source_df, f"{table}: the batch's records")
        entry = QuarantineEntry(table, reason, step.batch_id, datetime.now(UTC).isoformat(timespec="seconds"),
                                tuple(plan.topics))
        self.quarantine.add(source_df.sparkSession, plan.route.database, plan.route.table, entry)
        self.hooks.at("quarantined", batch_id=step.batch_id, table=table)
        log.error(
            "batch=%s table=%s QUARANTINED: %s. Its records go to the dead letters from now on, every other table "
            "goes on; after the fix, remove %s and restart (docs/when-things-go-wrong.md \"Quarantine\")",
            step.batch_id, table, reason, self.quarantine.path(plan.route.database, plan.route.table),
        )
        step.enter("quarantine", plan.stats.steps_s)
        rows_df = dead_letter_rows(quarantined_coordinates(source_df, plan.topics, reason), source_df, table,
                                   plan.key_schemas, step.batch_id)
        summary = self.dead_letters.write(rows_df, step.batch_id, query_id, table)
        stats = plan.stats
        stats.quarantined, stats.upserts, stats.deletes, stats.superseded = reason, 0, 0, 0
        stats.dead_letters = summary.records
        stats.dead_letter_kinds, stats.diverged_keys = summary.kinds, summary.keys
        stats.skipped = max(0, plan.summary.rows_in - summary.records)

    def _write_events(
        self, plan: TablePlan, target: HudiTarget, step: Step, query_id: str, ready: Callable[[], None]
    ) -> None:
        """The steps of the module docstring, for a table with a record key."""
        step.enter("commit check", plan.stats.steps_s)
        checked = self._commit_check(plan, target, step.batch_id)
        if checked is None:
            return
        plan, batch_offsets, committed = checked
        plan = self._with_truncate_deletes(plan, target, step)
        events_df = required(plan.events_df, f"{plan.route.qualified_name}: the events")
        spark = events_df.sparkSession
        step.enter("ledger read", plan.stats.steps_s)
        hard = target.delete_mode == "hard"
        ledger = open_ledger(spark, target.ledger_path, target.record_key) if hard else None
        judged_df, counts, ledger_df = self._judged(plan, target, ledger, step)
        recorded = False
        try:
            if counts["snapshot_end"] is not None and plan.route.unread_rows == "delete" and not self.replay:
                step.enter("unread rows", plan.stats.steps_s)
                judged_df, counts = self._with_unread_deletes(plan, target, judged_df, ledger_df, counts=counts,
                                                               batch_id=step.batch_id)
            # The steps below build on the cache as one node (over_cache); judged_df is what to unpersist.
            cached_df = over_cache(judged_df)
            if self.replay:
                self._keep_verdicts(plan, target, cached_df)
            step.enter("bronze wait", plan.stats.steps_s)
            ready()
            step.enter("dead letters", plan.stats.steps_s)
            dead = self._write_dead_letters(plan, cached_df if counts["poison"] else None, step, query_id)
            # Records found unusable before decoding were counted as skipped (not among the events).
            plan.stats.skipped = max(0, plan.stats.skipped - (dead - counts["poison"]))
            if (counts["snapshot_reads"] and not self.replay
                    and self.dead_letters.has_pending(spark, target.qualified_name)):
                step.enter("settle", plan.stats.steps_s)
                self._settle(plan, target, cached_df, step, query_id)
            step.enter("ledger write", plan.stats.steps_s)
            # The ledger first: a failure between the two writes leaves the deletes recorded (app/sink/ledger.py).
            if hard and (counts["deletes"] or counts["reinserts"]):
                write_ledger(cached_df, target.ledger_path, target.record_key, step.batch_id,
                             highest=counts["max_fact_position"])
                recorded = True
                self.hooks.at("ledger_written", batch_id=step.batch_id, table=target.qualified_name)
            step.enter("widen", plan.stats.steps_s)
            rows_df = self._rows(plan, target, cached_df)
            self._widen(plan, target, rows_df, step, query_id)
            step.enter("upsert", plan.stats.steps_s)
            max_position = _max_position(counts, plan.topics_per_source())
            self._upsert(target, rows_df, step, query_id, rows=counts["upserts"] + counts["deletes"],
                         metadata=commit_metadata(batch_offsets, committed, max_position, plan.route.source_identity),
                         first_rows=counts["upserts"] if committed is None else 0)
        finally:
            judged_df.unpersist()
        if recorded:
            step.enter("ledger compaction", plan.stats.steps_s)
            self._compact_ledger(spark, target, step.batch_id)

    def _judged(
        self, plan: TablePlan, target: HudiTarget, ledger: LedgerView | None, step: Step
    ) -> tuple[DataFrame, dict[str, Any], DataFrame | None]:
        """The count step, and the ledger join when due: the events judged (persisted: the counts, the ledger write
        and the Silver write read one decode of the batch), their counts, and the ledger's keys they were judged
        against (None: without). The facts are joined only when an upsert may be at or below one of them
        (app/sink/ledger.py "Above the ledger"); positions of several sources do not compare, so a table fed by
        several always joins them."""
        spark = required(plan.events_df, "the events").sparkSession
        sources, single = plan.topics_per_source(), self.config.lake.single_partition_rows
        ledger_df = ledger.current_df(spark) if ledger is not None and len(sources) > 1 else None
        step.enter("count", plan.stats.steps_s)  # from building the judged events' plan (Spark's analysis) on
        judged_df = plan.judged_df(ledger_df, single).persist()
        try:
            counts = _count(judged_df, sources)
            if ledger is not None and ledger_df is None and ledger.could_block(counts["lowest_upsert"]):
                step.enter("ledger join", plan.stats.steps_s)
                judged_df.unpersist()
                ledger_df = ledger.current_df(spark)
                judged_df = plan.judged_df(ledger_df, single).persist()
                counts = _count(judged_df, sources)
            judged_df, counts = self._judge(plan, target, judged_df, counts)
        except BaseException:
            judged_df.unpersist()
            raise
        return judged_df, counts, ledger_df

    def _upsert(
        self, target: HudiTarget, rows_df: DataFrame, step: Step, query_id: str, *, rows: int,
        metadata: dict[str, str], first_rows: int = 0,
    ) -> None:
        """The Hudi write of the table's rows (one per key: the latest event of each, `_written`), the batch's offsets
        in its commit's `metadata`; meta sync when due. `first_rows`: the rows that are not deletes, when the table
        recorded no offsets yet (a new table's first commit is a bulk insert of them: app/sink/hudi.py
        `write_silver`)."""
        sync = self.meta_sync.write_options(target, rows_df)
        options = {**sized_options(target, rows), **self.hooks.write_options(target.path), **metadata, **sync}
        write_silver(rows_df, target, step.batch_id, query_id, options, unique_rows=True, first_rows=first_rows)
        self.meta_sync.written(target, rows_df, options)

    def _with_truncate_deletes(self, plan: TablePlan, target: HudiTarget, step: Step) -> TablePlan:
        """A table whose truncate policy is `clear`: the plan without its truncate events, and, when it has some, a
        delete for each key written before the latest (app/cdc/derived.py). A table fed by several topics is left as
        it is, its truncates skipped: one topic's truncate says nothing of the others' rows."""
        if plan.route.truncate != "clear":
            return plan
        step.enter("truncate", plan.stats.steps_s)
        batch_id = step.batch_id
        events_df = required(plan.events_df, f"{plan.route.qualified_name}: the events")
        truncate = F.col(OP_COL) == OP_TRUNCATE
        row = events_df.filter(truncate).agg(F.count(F.lit(1)).alias("n"), F.max(POSITION_COL).alias("position"),
                                             F.max(SOURCE_TS_COL).alias("ts_ms")).first()
        rest_df = events_df.filter(~truncate)
        if row is None or not row["n"]:
            return dataclasses.replace(plan, events_df=rest_df)
        if len(plan.topics) > 1:
            log.warning("batch=%s table=%s: %d truncate(s) not applied: the table is fed by %d topics (%s), and one "
                        "topic's truncate says nothing of the others' rows", batch_id, target.qualified_name,
                        row["n"], len(plan.topics), ", ".join(plan.topics))
            return dataclasses.replace(plan, events_df=rest_df)
        spark = events_df.sparkSession
        current_df = spark.read.format("hudi").load(target.path) if table_exists(spark, target.path) else None
        key = required(plan.record_key, f"{plan.route.qualified_name}: the record key")
        log.info("batch=%s table=%s: truncated upstream at %s: the rows written before it are deleted",
                 batch_id, target.qualified_name, row["position"])
        partitions = sorted({p for _, p in plan.summary.offsets})
        if len(partitions) > 1:
            log.warning("batch=%s table=%s: its topic has several partitions (%s here): a change written before the "
                        "truncate that reaches the job in a later batch would stay; give a table that clears on "
                        "truncates a topic of one partition (docs/sources.md \"Truncates\")", batch_id,
                        target.qualified_name, ", ".join(map(str, partitions)))
        return dataclasses.replace(  # the table's keys too: judged in its partitions (`derived_rows`)
            plan, events_df=with_truncate_deletes(rest_df, current_df, key, row["position"], row["ts_ms"]),
            derived_rows=True)

    def _with_unread_deletes(
        self, plan: TablePlan, target: HudiTarget, judged_df: DataFrame, ledger_df: DataFrame | None, *,
        counts: dict[str, Any], batch_id: int,
    ) -> tuple[DataFrame, dict[str, Any]]:
        """A full snapshot of the table ended in the batch: its rows the snapshot did not read get a delete each
        (app/cdc/derived.py), and the events are judged again. Left alone, with a warning: a table fed by several
        topics (each a data collection of its own, whose last read says nothing of the others'), and a table with
        dead letters (one may be a read of the snapshot)."""
        spark = judged_df.sparkSession
        if not table_exists(spark, target.path):
            return judged_df, counts
        table = target.qualified_name
        why = (f"it is fed by {len(plan.topics)} topics" if len(plan.topics) > 1
               else "it has dead letters, one of which may be a read of the snapshot"
               if counts["poison"] or self.dead_letters.has_pending(spark, table) else None)
        if why is not None:
            log.warning("batch=%s table=%s: a full snapshot of the table ended at %s; the rows it did not read are "
                        "kept (unread_rows: delete), as %s: check the table against its source", batch_id, table,
                        counts["snapshot_end"], why)
            return judged_df, counts
        key = required(plan.record_key, f"{plan.route.qualified_name}: the record key")
        events_df = with_unread_deletes(required(plan.events_df, "the events"),
                                        spark.read.format("hudi").load(target.path), key, counts["snapshot_end"],
                                        counts["snapshot_end_ts_ms"])
        with_unread = dataclasses.replace(plan, events_df=events_df)
        judged_df.unpersist()
        rejudged_df = with_unread.judged_df(ledger_df).persist()  # the table's keys too: its partitions kept
        try:
            judged_df, counts = self._judge(with_unread, target, rejudged_df)
        except Exception:
            rejudged_df.unpersist()
            raise
        log.info(
            "batch=%s table=%s: a full snapshot of the table ended at %s; %d row(s) it did not read deleted (gone "
            "upstream while no change streamed)", batch_id, target.qualified_name, counts["snapshot_end"],
            counts["derived_deletes"],
        )
        return judged_df, counts

    def _settle(self, plan: TablePlan, target: HudiTarget, judged_df: DataFrame, step: Step, query_id: str) -> None:
        """The table's dead letters a snapshot read of the batch settles (module docstring: settle)."""
        topic = F.col(TOPIC_COL) if TOPIC_COL in judged_df.columns else F.lit(plan.route.topic)
        good = F.col(ERROR_COL).isNull() if ERROR_COL in judged_df.columns else F.lit(True)
        reads_df = judged_df.filter(good & (F.col(OP_COL) == OP_READ)).select(
            topic.alias("topic"), F.col(PARTITION_COL).alias("partition"), F.col(OFFSET_COL).alias("offset"),
            ledger_key(target.record_key).alias("record_key"),
        )
        settlement = self.dead_letters.settle(reads_df, target.qualified_name, step.batch_id, query_id,
                                              MAX_DIVERGED_KEYS + 1)
        self.hooks.at("dead_letters_settled", batch_id=step.batch_id, table=target.qualified_name)
        stats = plan.stats
        stats.settled, stats.settled_keys, stats.pending_keys = (
            settlement.records, settlement.keys, settlement.pending_keys)
        if settlement.records:
            log.info(
                "batch=%s table=%s: %d dead letters settled by snapshot reads (keys: %s); still diverged: %d key(s)",
                step.batch_id, target.qualified_name, settlement.records,
                ", ".join(settlement.keys[:SAMPLE_KEYS]) + (" ..." if len(settlement.keys) > SAMPLE_KEYS else ""),
                len(settlement.pending_keys),
            )

    def _widen(self, plan: TablePlan, target: HudiTarget, rows_df: DataFrame, step: Step, query_id: str) -> None:
        """The widen step (module docstring)."""
        change = self.widening.apply(rows_df, target, step.batch_id, query_id,
                                     lambda: self.hooks.write_options(target.path))
        if change.widened:
            self.hooks.at("table_rewritten", batch_id=step.batch_id, table=target.qualified_name)
        added = [c for c in change.added if c in plan.source_columns]
        if added:
            self._snapshot_for_added(plan, added, rows_df.sparkSession, step.batch_id)

    def _snapshot_for_added(self, plan: TablePlan, added: list[str], spark: SparkSession, batch_id: int) -> None:
        """Columns added upstream: the rows written before may hold a default in the source, but no event says which
        value (a function default arrives as 0 or without one, a changed default as its newest value), so the job
        asks the connector for an incremental snapshot of the table (for which columns: the source's
        `snapshot_new_columns`), before the commit (a crash in between asks again), or says which to run when the
        source has no `signal_topic` (docs/schema-changes.md)."""
        route = plan.route
        collection = ".".join(p for p in (route.source_database, route.source_schema, route.source_table) if p)
        source = next(s for s in self.config.source_list if s.label == route.source)
        key = self.config.source_key(self.config.source_list.index(source))
        defaulted = [c for c in added if c in plan.defaulted_columns]
        policy = source.snapshot_new_columns
        wanted = columns_to_snapshot(added, plan.defaulted_columns, policy)
        if not wanted:
            if defaulted:
                log.warning("batch=%s table=%s: columns %s were added upstream with a default: rows written before "
                            "read as null here until they change (%s.snapshot_new_columns: none). Run an incremental "
                            "snapshot of %s (docs/schema-changes.md)", batch_id, route.qualified_name,
                            ", ".join(defaulted), key, collection)
            else:
                log.info("batch=%s table=%s: columns %s were added upstream, none with a declared default "
                         "(%s.snapshot_new_columns: %s)", batch_id, route.qualified_name, ", ".join(added), key, policy)
            return
        if source.signal_topic is None:
            log.warning("batch=%s table=%s: columns %s were added upstream: rows written before read as null here "
                        "until they change, where the source may show a default. Run an incremental snapshot of %s, "
                        "or set %s.signal_topic for the job to ask for it (docs/schema-changes.md)", batch_id,
                        route.qualified_name, ", ".join(wanted), collection, key)
            return
        request_snapshot(spark, self.config.kafka, source.signal_topic, source.topic_prefix, collection)
        self.hooks.at("snapshot_requested", batch_id=batch_id, table=route.qualified_name)
        log.warning("batch=%s table=%s: columns %s were added upstream: asked the connector for an incremental "
                    "snapshot of %s, which brings the rows written before as the source has them", batch_id,
                    route.qualified_name, ", ".join(wanted), collection)

    @staticmethod
    def _compact_ledger(spark: SparkSession, target: HudiTarget, batch_id: int) -> None:
        """Merge the ledger's folders when enough have gathered; the batch is committed already, so a failure
        is logged (naming the table) and the next batch tries again."""
        try:
            compact_ledger(spark, target.ledger_path, batch_id)
        except (Py4JJavaError, CapturedException) as e:
            log.warning("batch=%s table=%s: the delete ledger's compaction failed (the next batch retries): %s",
                        batch_id, target.qualified_name, java_root_cause(e))

    def _commit_check(
        self, plan: TablePlan, target: HudiTarget, batch_id: int
    ) -> tuple[TablePlan, OffsetRanges, Committed | None] | None:
        """The commit check: the plan's events to write, their offsets and the table's last commit; None when there
        is nothing to write (applied already, or the table refused)."""
        committed = last_committed(required(plan.events_df, "the events").sparkSession, target.path)
        if not self.rebuild and self._refused(plan, target, committed):
            return None
        unapplied = self._unapplied(plan, target, committed, batch_id)
        return None if unapplied is None else (*unapplied, committed)

    def _refused(self, plan: TablePlan, target: HudiTarget, committed: Committed | None) -> bool:
        """Whether the table is lost (app/sink/lost.py), or a rebuild of it was cut short: then none of the batch's
        records of it is written (Bronze keeps them)."""
        spark = required(plan.events_df, "the events").sparkSession
        reason = self.lost.reason(spark, target, self.conf_file, committed is not None)
        if reason is None:
            return False
        plan.stats.refused = reason
        plan.stats.skipped = plan.summary.rows_in
        return True

    def _unapplied(
        self, plan: TablePlan, target: HudiTarget, committed: Committed | None, batch_id: int
    ) -> tuple[TablePlan, OffsetRanges] | None:
        """The plan's events the table has not applied yet, and their offsets; None when it applied them all.

        Raises:
            RerouteError: the table's last commit came from another topic (app/routing/route.py: check_owner).
        """
        batch_offsets = OffsetRanges(plan.summary.offsets)
        if committed is None:
            return plan, batch_offsets
        if not plan.route.merged:  # declared shards were checked when grouped
            check_owner(plan.route, {topic for topic, _ in committed.last}, self.config, committed.source_table)
        if self.replay:  # dead letters lie below the committed offsets: their positions decide instead
            return plan, batch_offsets
        if committed.covers(batch_offsets):
            plan.stats.replayed = plan.summary.rows_in
            plan.stats.skipped = 0
            log.info(
                "batch=%s table=%s already committed at %s (offsets %s): skipped",
                batch_id, target.qualified_name, committed.instant, batch_offsets,
            )
            # Its sync may never have run (a crash right after the commit): app/sink/metasync.py.
            self.meta_sync.ensure(required(plan.events_df, "the events").sparkSession, target)
            return None
        if not committed.overlaps(batch_offsets):
            return plan, batch_offsets
        # Re-read after a lost checkpoint, with other batch boundaries: apply only what was not applied.
        new_offsets = committed.after(batch_offsets)
        log.info(
            "batch=%s table=%s offsets %s committed up to %s at %s: writing %s only",
            batch_id, target.qualified_name, batch_offsets, dict(committed.last), committed.instant, new_offsets,
        )
        events_df = required(plan.events_df, f"{plan.route.qualified_name}: the events")
        # Counted as offsets: Kafka transaction markers (a connector with exactly-once delivery) would make this an
        # overestimate, hence the floor on `skipped` (_judge).
        plan.stats.replayed = sum(last - first + 1 for first, last in batch_offsets.ranges.values()) - sum(
            last - first + 1 for first, last in new_offsets.ranges.values()
        )
        return dataclasses.replace(plan, events_df=events_df.filter(plan.not_applied(committed))), new_offsets

    def _judge(
        self, plan: TablePlan, target: HudiTarget, judged_df: DataFrame, counts: dict[str, Any] | None = None
    ) -> tuple[DataFrame, dict[str, Any]]:
        """Count the judged events into the plan's stats (`counts`: _count's of them, when made already); fill the
        values a row to write lacks from the table as it is. Returns the events to write from (persisted) and the
        counts."""
        sources = plan.topics_per_source()
        counts = _count(judged_df, sources) if counts is None else counts
        if counts["pending"]:  # rare: a TOAST placeholder or a soft delete among the rows to write
            spark = judged_df.sparkSession
            current_df = spark.read.format("hudi").load(target.path) if table_exists(spark, target.path) else None
            carried_df = plan.carried_df(judged_df, current_df).persist()
            counts = _count(carried_df, sources)  # materialises the carried rows before their source is released
            judged_df.unpersist()
            judged_df = carried_df
        stats = plan.stats
        stats.upserts, stats.deletes = counts["upserts"], counts["deletes"]
        stats.blocked, stats.unresolved = counts["blocked"], counts["unresolved"]
        stats.max_source_ts_ms = counts["max_source_ts_ms"]
        # Rows that are neither tombstones nor data changes: truncate and logical-message events.
        events = counts["events"] - counts["derived"]  # the batch's own, not the deletes derived from them
        stats.skipped = max(0, plan.summary.rows_in - stats.replayed - events - counts["poison"])
        stats.superseded = events - stats.upserts - (stats.deletes - counts["derived_deletes"]) - stats.blocked
        if stats.unresolved:
            self._warn_unresolved(judged_df.filter(_written() & is_unresolved()), plan)
        return judged_df, counts

    def _rows(self, plan: TablePlan, target: HudiTarget, judged_df: DataFrame) -> DataFrame:
        """The rows the upsert receives: the latest event per key not blocked by the ledger, in the table's columns.

        Raises:
            EnvelopeError: the table's partition column cannot be derived (names the config key).
        """
        rows_df = judged_df.filter(_written()).drop(*INTERNAL_COLUMNS, BLOCKED_COL, REINSERT_COL, TOPIC_COL)
        try:
            return with_partition_field(rows_df, target.partition)
        except EnvelopeError as e:
            route = plan.route
            key = self.config.table_setting_key(route.source, route.source_key, "partition_by")
            raise EnvelopeError(f"{route.qualified_name} ({key}): {e}") from e

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
        """No record in the batch had a key: fine for truncates and messages only, else the table has no key: its
        change events are dead letters (`missing_key`, with_event_errors), or stop the batch in fail-fast mode."""
        if self.config.dead_letters.mode == "fail_fast" and required(
            plan.events_df, f"{plan.route.qualified_name}: the events"
        ).filter(F.col(OP_COL) != OP_TRUNCATE).limit(1).count():
            route = plan.route
            key = self.config.table_setting_key(route.source, route.source_key, "record_key")
            raise EnvelopeError(
                f"{route.topic}: change events without a key (a table without a primary key?); set {key}"
            )
        plan.stats.skipped = plan.summary.rows_in

    def _write_dead_letters(
        self, plan: TablePlan, events_df: DataFrame | None, step: Step, query_id: str
    ) -> int:
        """The plan's dead letters: its records found unusable before decoding, and its events in error among
        `events_df` (when given); returns how many. In fail-fast mode the first of them is raised instead.

        Raises:
            SchemaDecodeError: fail-fast, and the first is a record that does not decode.
            EnvelopeError: fail-fast, and the first is an event that cannot be applied.
        """
        coordinates = [] if plan.dead_df is None else [plan.dead_df]
        if events_df is not None:
            topic = F.col(TOPIC_COL) if TOPIC_COL in events_df.columns else F.lit(plan.route.topic)
            coordinates.append(events_df.filter(F.col(ERROR_COL).isNotNull()).select(
                topic.alias(TOPIC_COL), PARTITION_COL, OFFSET_COL, ERROR_COL, POSITION_COL,
            ))
        if not coordinates:
            return 0
        table = plan.route.qualified_name
        rows_df = dead_letter_rows(union(coordinates), required(plan.source_df, f"{table}: the batch's records"),
                                   table, plan.key_schemas, step.batch_id)
        if self.config.dead_letters.mode == "fail_fast":
            _raise_first(rows_df, table)
        summary = self.dead_letters.write(rows_df, step.batch_id, query_id, table)
        if not summary.records:
            return 0
        self.hooks.at("dead_letters_written", batch_id=step.batch_id, table=table)
        stats = plan.stats
        stats.dead_letters, stats.dead_letter_kinds, stats.diverged_keys = summary.records, summary.kinds, summary.keys
        log.warning(
            "batch=%s table=%s dead letters=%d (%s) into %s; first: %s; diverged keys (%d): %s",
            step.batch_id, table, summary.records, ", ".join(f"{k}={n}" for k, n in sorted(summary.kinds.items())),
            self.dead_letters.target.qualified_name, summary.first, len(summary.keys),
            ", ".join(summary.keys[:SAMPLE_KEYS]) + (" ..." if len(summary.keys) > SAMPLE_KEYS else ""),
        )
        return summary.records


@dataclass(frozen=True)
class ReplayedEvent:
    """One event of a replay and its verdict (TableWriter._keep_verdicts): topic, partition, offset, position,
    latest, blocked, delete, error_kind, error_message, key (JSON), unavailable."""

    target: HudiTarget
    fields: dict[str, Any]


WRITE_RETRY_BACKOFF_S = 5.0  # before a table's unit runs again after a transient failure; doubled each time


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _raise_first(rows_df: DataFrame, table: str) -> None:
    """Fail-fast: raise the error of the first dead letter (by topic, partition, offset).

    Raises:
        SchemaDecodeError: its bytes do not decode (framing, Avro body).
        EnvelopeError: any other.
    """
    first = rows_df.orderBy("topic", "kafka_partition", "kafka_offset").first()
    if first is None:
        return
    topic, partition, offset = first["topic"], first["kafka_partition"], first["kafka_offset"]
    kind, message = first["error_kind"], first["error_message"]
    if kind in (DECODE, TRAILING_BYTES, FRAMING):
        raise SchemaDecodeError(topic, partition, offset, first["schema_id"], f"{kind}: {message}")
    raise EnvelopeError(f"{topic}[{partition}]@{offset} ({table}): {kind}: {message} (dead_letters.mode: fail_fast)")


def _written() -> Column:
    """The events the table receives: the latest per key, unless the delete ledger blocks it."""
    return F.col(LATEST_COL) & ~F.col(BLOCKED_COL)


def _count(judged_df: DataFrame, sources: dict[str, list[str]] | None = None) -> dict[str, Any]:
    """Events (and those in error: poison; snapshot reads among the good), and among the latest per key:
    upserts, deletes, blocked, re-inserts, pending (to be written but lacking a value), unresolved, and the highest
    position written (`max_position`; with several `sources`, {label: topics}, one per source as
    `max_position:<label>`). One aggregate."""
    latest, deleted, blocked = F.col(LATEST_COL), is_delete(judged_df.columns), F.col(BLOCKED_COL)
    good = F.col(ERROR_COL).isNull() if ERROR_COL in judged_df.columns else F.lit(True)
    snapshot_end = F.coalesce(F.col(SNAPSHOT_END_COL), F.lit(False)) if SNAPSHOT_END_COL in judged_df.columns \
        else F.lit(False)
    derived = F.col(PARTITION_COL) == -1
    per_source = [
        F.max(F.when(latest & ~blocked & F.col(TOPIC_COL).isin(topics), F.col(POSITION_COL)))
        .alias(f"max_position:{label}")
        for label, topics in sources.items()
    ] if sources and len(sources) > 1 else []
    row = judged_df.agg(
        F.count(F.when(good, 1)).alias("events"),
        F.count(F.when(~good, 1)).alias("poison"),
        F.count(F.when(good & (F.col(OP_COL) == OP_READ), 1)).alias("snapshot_reads"),
        # A full snapshot's last read; the deletes derived from the events (partition -1: app/cdc/derived.py).
        F.max(F.when(good & snapshot_end, F.col(POSITION_COL))).alias("snapshot_end"),
        F.max(F.when(good & snapshot_end, F.col(SOURCE_TS_COL))).alias("snapshot_end_ts_ms"),
        F.count(F.when(derived, 1)).alias("derived"),
        F.count(F.when(derived & latest & deleted & ~blocked, 1)).alias("derived_deletes"),
        F.count(F.when(latest & ~deleted & ~blocked, 1)).alias("upserts"),
        F.count(F.when(latest & deleted, 1)).alias("deletes"),
        F.count(F.when(latest & blocked, 1)).alias("blocked"),
        F.count(F.when(latest & F.col(REINSERT_COL), 1)).alias("reinserts"),
        F.count(F.when(latest & ~blocked & is_pending(), 1)).alias("pending"),
        F.count(F.when(latest & ~blocked & is_unresolved(), 1)).alias("unresolved"),
        F.max(F.when(latest & ~blocked, F.col(POSITION_COL))).alias("max_position"),
        # The lowest upsert, against the delete ledger's highest fact; the highest fact the batch records.
        F.min(F.when(latest & ~F.col(DELETED_COL), F.col(POSITION_COL))).alias("lowest_upsert"),
        F.max(F.when(latest & (F.col(DELETED_COL) | F.col(REINSERT_COL)), F.col(POSITION_COL)))
        .alias("max_fact_position"),
        # The newest source time applied (app/state/metrics.py: event-time freshness).
        F.max(F.when(good, F.col(SOURCE_TS_COL)) if SOURCE_TS_COL in judged_df.columns else F.lit(None))
        .alias("max_source_ts_ms"),
        *per_source,
    ).first()
    return required(row, "the row of a global aggregate").asDict()


def _max_position(counts: dict[str, Any], sources: dict[str, list[str]]) -> str | None:
    """`_cdc.max_position` (app/sink/commit.py): the highest position written; for a table fed by several source
    servers, whose positions do not compare, JSON {source label: its highest position}."""
    if len(sources) < 2:
        value = counts["max_position"]
        return None if value is None else str(value)
    per_source = {label: counts[f"max_position:{label}"] for label in sorted(sources)}
    written = {label: str(value) for label, value in per_source.items() if value is not None}
    return json.dumps(written, separators=(",", ":")) if written else None
