"""The streaming job: start the query (status, start-up checks, resume offsets), run it, surface its typed error.

app/main.py is the command line around `run`.
"""
from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

from py4j.protocol import Py4JError
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.utils import CapturedException

import app
from app.batch.processor import BatchProcessor
from app.config import JobConfig
from app.errors import PipelineError, java_root_cause
from app.hooks import Hooks
from app.recovery import Recovery, outage_of
from app.routing.catalog import all_partition_roots
from app.routing.route import TableRoute, claim_routes, route_topic, skip_reason
from app.spark import ABORTABLE_CHECKPOINT_MANAGER, build_session, jvm_started, jvm_times
from app.state.layout import check_layouts, log_unmatched, unmatched_settings
from app.state.metrics import JobMetrics, MetricsListener
from app.state.preflight import check_services
from app.state.resume import kafka_partitions, resume_offsets
from app.state.stale import log_stale, reroute_error, stale_tables, table_holder
from app.state.status import Heartbeat, load_status, why, write_status
from app.wire.registry import RegistryClient
from app.wire.source import UncountedError, read_kafka, retained_records

log = logging.getLogger(__name__)


def start_query(
    spark: SparkSession,
    config: JobConfig,
    processor: BatchProcessor,
    available_now: bool,
    *,
    conf_file: str = "<conf.yaml>",
    from_starting_offsets: bool = False,
) -> StreamingQuery:
    """Start the streaming query: Kafka source -> foreachBatch(processor.process), checkpointed.

    Without a checkpoint over existing tables, reading resumes after the offsets the tables committed. The job's
    status (app/state/status.py) is written first: routes, skipped topics, stale tables; then after every batch.

    Raises:
        ConfigError: a service's setting is wrong (app/state/preflight.py), two of the subscribed topics map to
            one Silver table that none of them holds (app/routing/route.py `claim_routes`; one that holds it keeps
            it and the others are refused), or a table's setting would change what an existing Silver table was
            created with (app/state/layout.py).
        EnvelopeError: topics merged into one table disagree on a column's type (their latest schemas).
        RerouteError: a topic feeds another table now than the one that applied its offsets (app/state/status.py).
        ResumeError: the checkpoint is missing and the tables record no offsets.
    """
    if config.lake.checkpoint_path.startswith("s3a://"):
        # A rename is a copy on S3: Spark's abortable-stream manager writes checkpoint files without renames. It
        # needs a file system with abortable streams (s3a); EMRFS s3:// keeps Spark's default manager.
        spark.conf.set("spark.sql.streaming.checkpointFileManagerClass", ABORTABLE_CHECKPOINT_MANAGER)
    _check_start(spark, config, processor, conf_file)
    writer = (
        read_kafka(spark, config.kafka, resume_offsets(spark, config, conf_file, from_starting_offsets))
        .writeStream.foreachBatch(processor.process)
        .option("checkpointLocation", config.lake.checkpoint_path)
        .queryName("cdc-lakehouse")
    )
    if available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=config.trigger.processing_time)
    query = writer.start()
    log.info("query %s started (id %s, run %s)", query.name, query.id, query.runId)
    return query


def _check_start(spark: SparkSession, config: JobConfig, processor: BatchProcessor, conf_file: str) -> None:
    """The checks before the first batch (start_query's Raises; the services' own: app/state/preflight.py), and
    the status they leave, written whatever their outcome; from here on the processor writes it after every
    batch."""
    processor.writer.conf_file = conf_file  # for the commands its messages name
    partitions = check_services(spark, config, processor.planner.registry, lambda: kafka_partitions(spark, config))
    rebuilding = processor.writer.lost.load(spark, config.lake.silver_path, config.databases)
    if rebuilding:
        log.error("tables whose rebuild from Bronze has not ended, refused in this run: %s (scripts/rebuild.py "
                  "--resume)", ", ".join(sorted(rebuilding)))
    roots = all_partition_roots(spark, config)
    routes, refused = claim_routes(config, partitions, roots, table_holder(spark, config), processor.planner.claims)
    log.info("%d topics of %d sources: %s", len(partitions), len(config.source_list),
             ", ".join(f"{r.topic} -> {r.qualified_name}{_why(r)}" for r in routes) or "none yet")
    skipped = {topic: reason for topic in sorted(partitions) if (reason := skip_reason(topic, config)) is not None}
    for topic, reason in skipped.items():
        log.info("topic %s feeds no table: %s", topic, reason)
    for topic, reason in refused.items():
        skipped[topic] = processor.planner.refuse(topic, reason)
    stale, rerouted = stale_tables(spark, config, routes)
    log_stale(stale)
    unmatched = unmatched_settings(config, [*routes, *(route_topic(t, config, roots) for t in refused)])
    log_unmatched(unmatched)
    status = processor.status = load_status(spark, config)
    status.record_start(conf_file, routes, skipped, stale)
    status.unmatched_settings = unmatched
    processor.write_status = True
    try:
        if rerouted:
            raise reroute_error(rerouted)
        check_layouts(spark, config, routes)
        processor.planner.check_merges_at_start(spark, routes)
    except PipelineError as e:
        status.record_failure(e)
        raise
    finally:
        write_status(spark, config, status)
    try:  # after every check: a start refused writes nothing to the lake
        processor.bronze_table.repair(spark)
    except (Py4JError, CapturedException) as e:  # readers miss the newest ranges until a later start: said, not fatal
        log.warning("bronze table %s: not repaired at start: %s", processor.bronze_table.name, java_root_cause(e))


def _why(route: TableRoute) -> str:
    reason = why(route)
    return f" ({reason})" if reason else ""


def await_query(query: StreamingQuery, processor: BatchProcessor) -> None:
    """Block until the query ends; a batch failure re-raises the pipeline's own typed error."""
    try:
        query.awaitTermination()
    except StreamingQueryException as e:
        # Spark wraps what foreachBatch raised; surface the typed error (naming the record) when there is one.
        if processor.failure is not None:
            raise processor.failure from e
        raise
    spark = SparkSession.getActiveSession()
    if spark is not None:  # the last batches' Bronze ranges, registered before the end
        processor.bronze_table.register_pending(spark)
        deliver_events(spark)
    log.info("query %s finished", query.name)
    if spark is not None:
        log_jvm_times(spark)


def log_jvm_times(spark: SparkSession) -> None:
    """The driver JVM's time so far (`JvmTimes`), at the end of a query: a short run's is mostly warm-up, the JIT
    compilers' work above all (docs/performance.md "Where the time goes")."""
    try:
        log.info("driver JVM %s", jvm_times(spark))
    except Py4JError as e:  # a JVM without these beans: the line only
        log.debug("driver JVM times not read: %s", e)


def deliver_events(spark: SparkSession, timeout_s: float = 10.0) -> None:
    """Wait until Spark's listener bus has handed on every event posted so far. Listeners run on the bus's own
    thread, behind the query: without the wait, an `--available-now` run ends before its last batch's progress
    reaches MetricsListener (that batch's metrics line never written, and the JVM logging a failed call into the
    Python process that left)."""
    try:  # LiveListenerBus.waitUntilEmpty is Spark's own (private[spark], public to py4j), as is listenerBus()
        spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty(int(timeout_s * 1000))
    except Py4JError as e:  # a timeout, or a Spark without them: the line is lost, nothing else
        log.warning("Spark's listener events not all delivered in %.0f s (the last batch's metrics line may be "
                    "missing): %s", timeout_s, java_root_cause(e))


def run(
    config: JobConfig, conf_file: str, *, available_now: bool = False, from_starting_offsets: bool = False,
    hooks: Hooks | None = None,
) -> None:
    """Build the session, start the query and block until it ends (available-now) or fails. A failure an outage
    explains (app/recovery.py) starts the query again from its checkpoint after a wait, until the outage has lasted
    `recovery.give_up_after_s`. `hooks`: tools' seams into each batch (app/hooks.py); the shipped job runs without.

    Raises:
        OutageError: an outage lasted past `recovery.give_up_after_s`.
        PipelineError: any other failure of the job's own (start_query's, a batch's typed error).
    """
    # Which code and config this run has (a packaged run: the zip spark-submit fetched from --py-files).
    log.info("job code %s, config %s", Path(app.__file__).parent, conf_file)
    # Under spark-submit the driver is up before this runs: scripts/submit.sh chose its options.
    new_jvm = not jvm_started()
    quick = new_jvm and use_available_now_options(config, available_now)
    stream = new_jvm and not available_now
    spark = build_session("cdc-lakehouse", config.spark, config.metastore, with_available_now_options=quick,
                          stream=stream)
    spark.sparkContext.setLogLevel("WARN")
    processor = BatchProcessor(config, RegistryClient.from_config(config.registry), hooks)
    processor.metrics = metrics = JobMetrics(spark, config)
    listener = MetricsListener(metrics)
    listener.add_to(spark)
    recovery = Recovery(config.recovery)
    watch = QueryWatch(processor)
    heartbeat = Heartbeat(config.recovery.heartbeat_s, lambda: watch.beat(spark))
    heartbeat.start()
    try:
        while True:
            processor.failure = None  # a failed batch's typed error names that batch only
            try:
                query = watch.query = start_query(spark, config, processor, available_now, conf_file=conf_file,
                                                  from_starting_offsets=from_starting_offsets)
                await_query(query, processor)
                return
            except Exception as e:
                service = outage_of(e)
                if service is None:
                    raise
                wait = recovery.wait_for(service, e, processor.batches_done)
                metrics.record_outage()
                log.warning("OUTAGE: cannot reach %s (%s); the query starts again from its checkpoint in %.0f s "
                            "(attempt %d, outage lasting %.0f s, giving up after %s)", service, _brief(e),
                            wait.seconds, wait.attempt, wait.lasted_s, _give_up(config))
                with processor.status_lock:
                    processor.status.record_outage(service, _brief(e), wait.attempt, wait.lasted_s, wait.seconds)
                processor.save_status(spark)
                time.sleep(wait.seconds)
    finally:
        heartbeat.stop()
        # A later run in this process (tests, tools) has its own; the JVM never calls into a Python that left.
        try:
            listener.remove_from(spark)
        except Py4JError as e:  # the JVM gone with the failure being raised: that failure is the news
            log.debug("metrics listener not removed: %s", e)


def use_available_now_options(config: JobConfig, available_now: bool) -> bool:
    """Whether this run's driver JVM gets `spark.available_now_java_options`: an `--available-now` run's, when its
    topics hold at most `spark.available_now_java_options_max_records` records (if set). The options trade a
    backlog's speed for a short start (docs/performance.md): known before the JVM starts, the count is all the job
    can go by. A count that fails gives the JVM's defaults, said in a line."""
    spark = config.spark
    if not available_now or not spark.available_now_java_options:
        return False
    limit = spark.available_now_java_options_max_records
    if limit is None:
        return True
    try:
        records = retained_records(config.kafka)
    except UncountedError as e:
        log.info("spark.available_now_java_options not used: the topics' records not counted (%s)", e)
        return False
    used = records <= limit
    log.info("the topics hold %d records, %s spark.available_now_java_options_max_records (%d): driver options %s",
             records, "within" if used else "over", limit,
             spark.available_now_java_options if used else "the JVM's defaults")
    return used


class QueryWatch:
    """The heartbeat's look at the query (app/state/status.py `Heartbeat`): a log line on a batch running longer
    than a beat, and on a trigger stuck in Spark's own work between batches (Kafka offsets, the checkpoint's
    files) for as long; then status.json with the beat's time. The clients' own retries (s3a's, Kafka's, Hive's) can
    hold either through a short outage without another word."""

    def __init__(self, processor: BatchProcessor) -> None:
        self.processor = processor
        self.query: StreamingQuery | None = None
        # Between batches: the trigger's status message and the last completed batch, and since when seen.
        self._between: tuple[tuple[str, Any], float] | None = None
        self._writing = threading.Lock()

    def beat(self, spark: SparkSession) -> None:
        processor, interval = self.processor, self.processor.config.recovery.heartbeat_s
        progress = processor.progress()
        if progress is not None and (running := processor.running) is not None:
            self._between = None
            if time.monotonic() - running[1] >= interval:
                log.info("%s", progress)
        elif (stuck := self._stuck_between_batches(interval)) is not None:
            log.info("%s", stuck)
        processor.check_sources(idle=self._idle())
        # The write on a thread of its own: a write held by the file system's retries (an object store outage)
        # must not hold the next beats' look at the query; a beat while one is under way writes nothing.
        if self._writing.acquire(blocking=False):
            threading.Thread(target=self._save, args=(spark,), name="status-write", daemon=True).start()

    def _save(self, spark: SparkSession) -> None:
        try:
            self.processor.save_status(spark)
        finally:
            self._writing.release()

    def _idle(self) -> bool:
        """The query's latest trigger found no new record and no trigger runs: the job has seen all of Kafka."""
        query = self.query
        if query is None or not query.isActive:
            return False
        status = query.status
        return not status.get("isTriggerActive") and not status.get("isDataAvailable")

    def _stuck_between_batches(self, interval: float) -> str | None:
        """A line when two beats `interval` apart find the same trigger active outside foreachBatch: the same
        status message and no batch completed between them."""
        query = self.query
        if query is None or not query.isActive:
            return None
        status, last = query.status, query.lastProgress
        if not status.get("isTriggerActive"):
            self._between = None
            return None
        seen = (str(status.get("message", "")), None if last is None else last.get("batchId"))
        if self._between is None or self._between[0] != seen:
            self._between = (seen, time.monotonic())
            return None
        waited = time.monotonic() - self._between[1]
        return f"the query has been at {seen[0]!r} for {waited:.0f} s, between batches" if waited >= interval else None


def _brief(error: BaseException) -> str:
    """The error's first line; a py4j error's names only the call, so the JVM error behind it follows."""
    text = str(error).strip()
    first = text.splitlines()[0] if text else type(error).__name__
    if getattr(error, "java_exception", None) is not None:
        first = f"{first} {java_root_cause(error)}"
    return first[:500]


def _give_up(config: JobConfig) -> str:
    seconds = config.recovery.give_up_after_s
    return f"{seconds:g} s (recovery.give_up_after_s)" if seconds else "never (recovery.give_up_after_s: 0)"
