"""One micro-batch, end to end: the summary, then each Silver table planned (framing/registry -> decode -> unwrap ->
route) and written in a unit of its own, with Bronze written beside them and complete before any Silver write, then
status.

`BatchProcessor.process` is the foreachBatch function. It is the one place where a batch's per-table writes
happen, and it takes any DataFrame with the Kafka source's columns (a Kafka micro-batch, or Bronze Parquet
read back for a replay).

Spark actions per batch: one small aggregate (writer schema ids and record counts per topic, app/batch/planner.py),
the Bronze write, and per table present in the batch those of its unit (app/batch/writer.py): the delete ledger's
read (hard-delete tables that have one); one aggregate over the persisted, judged events for the counts; only when
a row to be written lacks a value (a TOAST placeholder, a soft delete), a read of the table's current rows for those
keys and a second aggregate; the ledger write (when the batch deletes or re-inserts keys: plain Parquet); the Hudi
write; now and then the ledger's merge.

Any exception of a batch is logged and recorded in status.json with the batch, the table and the step it stopped
in (`Step`), and re-raised: Spark stops the query, and the batch is read again at the next start.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from functools import partial

from py4j.protocol import Py4JJavaError
from pyspark import InheritableThread
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.utils import CapturedException

from app.batch.plan import BatchSummary, Offsets, SkippedTopic, TablePlan, TableTopics
from app.batch.planner import Planner
from app.batch.writer import Step, TableWriter
from app.config import JobConfig
from app.errors import PipelineError, SinkWriteError, java_root_cause
from app.hooks import Hooks
from app.sink.bronze import KnownRanges, write_bronze
from app.sink.bronze_table import BronzeTable
from app.sink.quarantine import Quarantine
from app.state.metrics import JobMetrics
from app.state.sources import SourceWatch
from app.state.stats import TableBatchStats
from app.state.status import REFUSED, JobStatus, now, write_status
from app.wire.registry import RegistryClient

log = logging.getLogger(__name__)

HISTORY_BATCHES = 100  # batches kept in BatchProcessor.history, for tests and tools that look back


class BatchProcessor:
    """Processes micro-batches for one job config: the planner (with the registry client), the tables' writer,
    the job's status."""

    def __init__(
        self, config: JobConfig, registry: RegistryClient, hooks: Hooks | None = None, *, replay: bool = False,
        rebuild: bool = False,
    ) -> None:
        """`replay`: the batch is dead letters fed again (scripts/replay_dead_letters.py): Bronze holds its records
        already, and its tables take events below the offsets they committed, ordered by source position.
        `rebuild`: the batch is read from Bronze to rebuild tables (scripts/rebuild.py): Bronze is not written, and
        a table the catalog holds may be created again (app/sink/lost.py)."""
        self.config = config
        self.hooks = hooks or Hooks()
        self.replay = replay
        self.rebuild = rebuild
        self.quarantine = Quarantine(config)  # app/sink/quarantine.py: read at the first batch, shared
        self.planner = Planner(config, registry, self.quarantine)
        self.writer = TableWriter(config, self.hooks, self.quarantine, replay=replay, rebuild=rebuild)
        self.bronze_table = BronzeTable(config)  # app/sink/bronze_table.py: ranges registered after each batch
        self.bronze_ranges = KnownRanges()  # each Bronze partition folder listed once, then kept by its writes
        self.last_stats: dict[str, TableBatchStats] = {}  # the latest batch's, per table
        # The latest batches this processor wrote (a bounded window: a stream runs for months).
        self.history: deque[dict[str, TableBatchStats]] = deque(maxlen=HISTORY_BATCHES)
        self.failure: PipelineError | None = None  # the latest batch's typed error, re-raised by app/job.py
        self.batches_done = 0  # batches this process completed, empty ones included (app/recovery.py: progress)
        self.metrics: JobMetrics | None = None  # app/state/metrics.py, set by app/job.py
        self.sources = SourceWatch(config)  # when each source last delivered (the source-lag alarm)
        self.running: tuple[int, float, Step] | None = None  # the batch under way: id, start, its step
        self.units: TableUnits | None = None  # its tables' units, once they run
        self.status = JobStatus()  # app/state/status.py; written after every batch when `write_status` is on
        self.status_lock = threading.RLock()  # the document in memory; held for no I/O
        self.status_writes = threading.Lock()  # status.json's writes, one at a time, in the order of their documents
        self.write_status = False
        self.databases: set[str] = set()  # catalog databases known to exist
        # The latest batch's phases in seconds: plan (summary aggregate, registry, decode plan), plan_summary (part of
        # plan: its summary aggregate, the batch's first read of its records), bronze, tables.
        self.phases: dict[str, float] = {}

    def process(self, batch_df: DataFrame, batch_id: int) -> None:
        """foreachBatch entry point.

        Raises:
            SchemaDecodeError: a record's framing or Avro body cannot be decoded (names the record).
            SinkWriteError: a Bronze or Hudi write failed.
            Exception: any other, after it is recorded.
        """
        started = time.monotonic()
        self.failure = None
        spark = batch_df.sparkSession
        # Structured Streaming sets the query id as a local property of the thread running the batch.
        query_id = spark.sparkContext.getLocalProperty("sql.streaming.queryId") or "none"
        step = Step(batch_id)
        self.phases = {}
        self.running = (batch_id, started, step)
        self.sources.begin_batch()
        records_df: DataFrame | None = None
        try:
            records_df = kept_records(self.planner.frame(batch_df))
            if not self.rebuild and not self.writer.lost.loaded:  # a replay's: tables whose rebuild has not ended
                self.writer.lost.load(spark, self.config.lake.silver_path, self.config.databases)
            batch = self.planner.summarize(records_df)
            self.sources.delivered(batch.newest_ms)
            if batch.empty:
                log.info("batch=%s empty", batch_id)
            else:
                tables = self._write(records_df, batch, step, query_id, started)
                self._done(spark, tables, batch.skipped, batch_id, time.monotonic() - started)
            self.batches_done += 1
        except Exception as e:
            log.error("%s failed: %s: %s", step, type(e).__name__, e)
            self.failure = e if isinstance(e, PipelineError) else None
            with self.status_lock:
                self.status.record_failure(e, batch_id, step.table, step.name)
            self.save_status(spark)
            raise
        finally:
            self.running, self.units = None, None
            if records_df is not None:
                records_df.unpersist()

    def progress(self) -> str | None:
        """Where a batch running for a while is, for the heartbeat's log line (an outage that the file system's
        own retries ride out is silent otherwise); None between batches."""
        running, units = self.running, self.units
        if running is None:
            return None
        batch_id, started, step = running
        tables = ", ".join(f"{t} ({s.name})" for t, s in sorted(units.active.items())) if units else ""
        return (f"batch={batch_id} still running after {time.monotonic() - started:.0f} s: step {step.name}"
                + (f"; tables in progress: {tables}" if tables else ""))

    def _write(
        self, records_df: DataFrame, batch: BatchSummary, step: Step, query_id: str, started: float
    ) -> list[TablePlan]:
        """Each table planned and written in its unit (`TableUnits`), `lake.table_writers` at a time, with Bronze
        written on a thread beside them (`BronzeGate`): Bronze's write needs only the batch's offsets, and building a
        table's plan runs no Spark job. A unit waits for Bronze before its first write to the lake, so Bronze is
        complete before any Silver write. Returns the tables' plans, in the order of their first topic; `step` says
        where the batch is."""
        batch_id = step.batch_id
        for topic, skipped in sorted(batch.skipped.items()):
            log.info("batch=%s skipped topic=%s records=%d: %s", batch_id, topic, skipped.records, skipped.reason)
        self.hooks.at("decode", batch_id=batch_id, topics=sorted(batch.topics))
        self.planner.check_framing(batch)
        tables = self.planner.table_topics(batch)
        names = [t.name for t in tables]
        self.phases["plan"] = time.monotonic() - started
        self.phases["plan_summary"] = batch.summary_s  # part of the plan's time
        step.name = "tables"
        units = self.units = self.table_units(batch, tables, batch_id, query_id)
        tables_started = time.monotonic()
        if self.replay or self.rebuild:  # Bronze holds a replay's and a rebuild's records already: the gate stays open
            self.hooks.at("bronze_written", batch_id=batch_id, tables=names)
        else:
            units.bronze = BronzeGate(partial(self._write_bronze, records_df, batch.offsets, batch_id, names))
        self._write_tables(records_df.sparkSession, units, step)
        self.phases["bronze"] = units.bronze.seconds  # beside the tables' units
        self.phases["tables"] = time.monotonic() - tables_started
        step.table, step.name = None, "status"
        self.hooks.at("tables_committed", batch_id=batch_id, committed=names)
        return units.plans()

    def table_units(
        self, batch: BatchSummary, tables: list[TableTopics], batch_id: int, query_id: str
    ) -> TableUnits:
        """The units of a summarised batch's tables (`tables`: the planner's `table_topics`), Bronze's gate open."""
        return TableUnits(tables, partial(self.planner.plan_table, batch), batch_id, query_id, writer=self.writer,
                          hooks=self.hooks)

    def _write_tables(self, spark: SparkSession, units: TableUnits, step: Step) -> None:
        """Each table's unit (app/batch/writer.py), `lake.table_writers` at a time. A failure is raised once the units
        under way have ended (each commits or not on its own), `step` naming its table and the step it stopped in;
        a failed Bronze write is raised as it is, its table units having stopped before their first write."""
        writers = min(self.config.lake.table_writers, len(units.names))
        if writers <= 1:
            units.write()
        else:
            self._create_databases(spark, units)
            # InheritableThread: each thread's JVM side inherits the batch's local properties (the query id).
            threads = [
                InheritableThread(target=units.write, args=(spark, f"tables-{n}")) for n in range(writers)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        units.bronze.join()  # a unit with nothing to write never waits for it
        failure = units.failure()
        if failure is not None:
            error, failed = failure
            step.table, step.name = failed.table, failed.name
            raise error

    def _create_databases(self, spark: SparkSession, units: TableUnits) -> None:
        """The catalog databases of the batch's tables, created before their writer threads start: each table's
        meta sync creates a missing one, and two at once both create it (the metastore then holds the name twice
        and every later look-up of it fails)."""
        # The dead-letter table's database too: any table's unit may write dead letters.
        databases = units.databases() | {self.config.lake.database}
        for database in sorted(databases):
            if database not in self.databases and not spark.catalog.databaseExists(database):
                log.info("creating catalog database %s", database)
                spark.sql(f"CREATE DATABASE IF NOT EXISTS `{database}`")
            self.databases.add(database)

    def _write_bronze(self, records_df: DataFrame, offsets: Offsets, batch_id: int, tables: list[str]) -> None:
        """Bronze's write (of the records' raw columns), then the `bronze_written` point."""
        try:
            bronze = write_bronze(records_df, self.config.lake.bronze_path, offsets, self.bronze_ranges)
        except (Py4JJavaError, CapturedException) as e:
            raise SinkWriteError(
                f"batch {batch_id}: Bronze write to {self.config.lake.bronze_path}: {java_root_cause(e)}"
            ) from e
        if bronze.skipped:
            log.info("batch=%s bronze: %d records already held; written %s", batch_id, bronze.skipped, bronze.written)
        self.bronze_table.published(bronze.written)
        self.hooks.at("bronze_written", batch_id=batch_id, tables=tables)

    def _done(
        self, spark: SparkSession, tables: list[TablePlan], skipped_topics: dict[str, SkippedTopic], batch_id: int,
        duration_s: float,
    ) -> None:
        stats = [p.stats for p in tables]
        self.last_stats = {s.table: s for s in stats}
        self.history.append(self.last_stats)
        phases = " ".join(f"{name}_s={seconds:.2f}" for name, seconds in self.phases.items())
        log.info("batch=%s done tables=%d duration_s=%.2f %s", batch_id, len(stats), duration_s, phases)
        quarantined = dict(self.quarantine.tables)
        if quarantined:
            log.error("batch=%s QUARANTINED tables (their records go to the dead letters): %s", batch_id,
                      "; ".join(f"{t} since batch {e.batch_id}: {e.reason}" for t, e in sorted(quarantined.items())))
        self.status.quarantined = {t: {"reason": e.reason, "batch_id": e.batch_id, "at": e.at}
                                   for t, e in quarantined.items()}
        skipped = {topic: (s.reason, s.records) for topic, s in skipped_topics.items()}
        for table_plan in tables:  # lost tables (app/sink/lost.py): their topics' records were not written
            if table_plan.stats.refused:
                for topic in table_plan.topics:
                    records = sum(last - first + 1 for (t, _), (first, last) in table_plan.summary.offsets.items()
                                  if t == topic)
                    skipped[topic] = (f"{REFUSED}{table_plan.stats.refused}", records)
        if self.metrics is not None:
            self.metrics.record_batch(batch_id, stats, duration_s, self.phases, quarantined=quarantined,
                                      sources={p.route.qualified_name: p.route.source for p in tables})
        with self.status_lock:
            self.status.record_batch(batch_id, stats, skipped, duration_s)
        self.check_sources()
        self.save_status(spark)
        self.bronze_table.register_pending(spark)  # the batch's Bronze ranges, for readers of the catalog

    def check_sources(self, idle: bool = False) -> None:
        """The source-lag alarm's look (app/state/sources.py), after a batch and on the heartbeat's timer (`idle`:
        the query's latest trigger found no new record)."""
        metrics = self.metrics
        report = self.sources.check(metrics, metrics.kafka_lag if metrics is not None else None, idle=idle)
        with self.status_lock:
            self.status.sources = report

    def save_status(self, spark: SparkSession) -> None:
        """Rewrite status.json (when `write_status` is on) with a new heartbeat time; the batch's thread and the
        heartbeat's (app/state/status.py `Heartbeat`) take turns, each writing the document as it was when its turn
        came. The document's lock is not held during the write: a write the file system's retries hold through an
        object store outage must not hold the heartbeat's look at the query (`check_sources` takes that lock), which
        is then what says where the job is."""
        if self.write_status:
            with self.status_writes:
                with self.status_lock:
                    self.status.heartbeat_at = now()
                    document = self.status.to_json()
                write_status(spark, self.config, document)


def kept_records(framed_df: DataFrame) -> DataFrame:
    """The batch's records as its summary, Bronze and table units read them: framed (app/wire/framing.py) and
    persisted, in at most one partition per core (Spark's default parallelism), not one per Kafka partition.

    Framed before the cache: the summary aggregate (the batch's first action) splits every record's bytes once, and
    the units read the schema ids and bodies from the cache. Framed after it, the split ran again in every unit, twice
    per record (a unit's filter on a schema id is pushed below the framing's projection, its expressions copied), and
    its conversions are not cheap (`conv` of hex text, a higher-order function per header look-up, interpreted).

    Each table's unit reads the records again, a task per partition, and each task sets its table's decode up even
    where the table's topic has no record. On 7 tables of one Kafka partition each, B3's count step 0.28-0.30 s against
    0.38-0.40 s (docs/performance.md). Coalescing moves no record: each Kafka partition's records stay together, in
    one partition."""
    return framed_df.coalesce(framed_df.sparkSession.sparkContext.defaultParallelism).persist()


class BronzeGate:
    """Bronze's write on a thread of its own beside a batch's table units (`write`; None: nothing to write, the gate
    is open). A unit passes the gate (`wait`) before its first write to the lake: Bronze is complete before any Silver
    write, and when Bronze's write failed, no unit writes."""

    def __init__(self, write: Callable[[], object] | None) -> None:
        self.error: BaseException | None = None
        self.seconds = 0.0
        self.written = threading.Event()
        self.thread: InheritableThread | None = None
        if write is None:
            self.written.set()
        else:
            self.thread = InheritableThread(target=self._run, args=(write,), name="bronze")
            self.thread.start()

    def _run(self, write: Callable[[], object]) -> None:
        started = time.monotonic()
        try:
            write()
        except BaseException as e:  # raised by the batch's thread (`TableUnits.failure`)
            self.error = e
        finally:
            self.seconds = time.monotonic() - started
            self.written.set()

    def wait(self) -> None:
        """Returns once Bronze is written.

        Raises:
            BronzeNotWritten: its write failed (the batch raises that error itself).
        """
        self.written.wait()
        if self.error is not None:
            raise BronzeNotWritten(f"Bronze was not written: {type(self.error).__name__}") from self.error

    def join(self) -> None:
        if self.thread is not None:
            self.thread.join()


class BronzeNotWritten(Exception):
    """A table unit stopped at Bronze's gate: Bronze's write failed."""


class TableUnits:
    """A batch's table units shared by its writer threads: each thread takes the next table not yet started, plans it
    (`plan`: app/batch/planner.py `plan_table`) and writes it, until none is left or a unit failed. A unit waits for
    Bronze (`bronze`) before its first write to the lake. `between_tables` is reached after each table's commit while
    others remain."""

    def __init__(
        self, tables: list[TableTopics], plan: Callable[[TableTopics], TablePlan], batch_id: int, query_id: str, *,
        writer: TableWriter, hooks: Hooks,
    ) -> None:
        self.plan, self.batch_id, self.query_id, self.writer, self.hooks = plan, batch_id, query_id, writer, hooks
        self.tables = tables
        self.names = [t.name for t in tables]
        self.bronze = BronzeGate(None)
        self.waiting = deque(tables)
        self.planned: dict[str, TablePlan] = {}
        self.done: list[str] = []
        self.active: dict[str, Step] = {}  # the units under way, by table (the heartbeat's progress line)
        self.failures: list[tuple[Exception, Step]] = []
        self.lock = threading.Lock()

    def write(self, spark: SparkSession | None = None, pool: str | None = None) -> None:
        """A writer thread's loop; with a `pool`, its Spark jobs run in that FAIR scheduler pool."""
        if spark is not None and pool is not None:
            spark.sparkContext.setLocalProperty("spark.scheduler.pool", pool)
        while (table := self._next()) is not None:
            step = Step(self.batch_id, table.name)
            self.active[table.name] = step
            try:
                table_plan = self.plan(table)
                with self.lock:
                    self.planned[table.name] = table_plan
                self.writer.write(table_plan, self.batch_id, self.query_id, step, ready=self.bronze.wait)
            except Exception as e:
                with self.lock:
                    self.failures.append((e, step))
                return
            finally:
                self.active.pop(table.name, None)
            with self.lock:
                self.done.append(table.name)
                committed, remaining = list(self.done), [n for n in self.names if n not in self.done]
            if remaining:
                self.hooks.at("between_tables", batch_id=self.batch_id, committed=committed, remaining=remaining)

    def _next(self) -> TableTopics | None:
        with self.lock:
            return None if self.failures or not self.waiting else self.waiting.popleft()

    def databases(self) -> set[str]:
        """The catalog databases of the batch's tables (those whose topics have a known form)."""
        return {t.database for t in self.tables if t.database is not None}

    def plans(self) -> list[TablePlan]:
        """The tables' plans, in the batch's order of tables."""
        return [self.planned[name] for name in self.names]

    def failure(self) -> tuple[BaseException, Step] | None:
        """The batch's error: Bronze's, when its write failed; else the first failed unit's, in the order of tables
        (units run at once, so the first to fail in time depends on the machine)."""
        if self.bronze.error is not None:
            return self.bronze.error, Step(self.batch_id, None, "bronze")
        failures = [(e, s) for e, s in self.failures if not isinstance(e, BronzeNotWritten)]
        if not failures:
            return None
        return min(failures, key=lambda f: self.names.index(f[1].table or ""))
