"""The streaming job: start the query (status, start-up checks, resume offsets), run it, surface its typed error.

app/main.py is the command line around `run`.
"""
from __future__ import annotations

import logging
from pathlib import Path

from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

import app
from app.batch.processor import BatchProcessor
from app.config import JobConfig
from app.errors import PipelineError
from app.hooks import Hooks
from app.routing.catalog import all_partition_roots
from app.routing.route import TableRoute, check_routes, skip_reason
from app.spark import ABORTABLE_CHECKPOINT_MANAGER, build_session
from app.state.resume import kafka_partitions, resume_offsets
from app.state.stale import log_stale, reroute_error, stale_tables
from app.state.status import load_status, why, write_status
from app.wire.registry import RegistryClient
from app.wire.source import read_kafka

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
        ConfigError: two of the subscribed topics map to one Silver table (app/routing/route.py).
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
    """The checks before the first batch (start_query's Raises), and the status they leave, written whatever
    their outcome; from here on the processor writes it after every batch."""
    partitions = kafka_partitions(spark, config)
    routes = check_routes(config, partitions, all_partition_roots(spark, config))
    log.info("%d topics of %d sources: %s", len(partitions), len(config.source_list),
             ", ".join(f"{r.topic} -> {r.qualified_name}{_why(r)}" for r in routes) or "none yet")
    skipped = {topic: reason for topic in sorted(partitions) if (reason := skip_reason(topic, config)) is not None}
    for topic, reason in skipped.items():
        log.info("topic %s feeds no table: %s", topic, reason)
    stale, rerouted = stale_tables(spark, config, routes)
    log_stale(stale)
    status = processor.status = load_status(spark, config)
    status.record_start(conf_file, routes, skipped, stale)
    processor.write_status = True
    try:
        if rerouted:
            raise reroute_error(rerouted)
        processor.planner.check_merges_at_start(spark, routes)
    except PipelineError as e:
        status.record_failure(e)
        raise
    finally:
        write_status(spark, config, status)


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
    log.info("query %s finished", query.name)


def run(
    config: JobConfig, conf_file: str, *, available_now: bool = False, from_starting_offsets: bool = False,
    hooks: Hooks | None = None,
) -> None:
    """Build the session, start the query and block until it ends (available-now) or fails. `hooks`: tools'
    seams into each batch (app/hooks.py); the shipped job runs without."""
    # Which code and config this run has (a packaged run: the zip spark-submit fetched from --py-files).
    log.info("job code %s, config %s", Path(app.__file__).parent, conf_file)
    spark = build_session("cdc-lakehouse", config.spark, config.metastore)
    spark.sparkContext.setLogLevel("WARN")
    processor = BatchProcessor(config, RegistryClient.from_config(config.registry), hooks)
    query = start_query(
        spark, config, processor, available_now, conf_file=conf_file, from_starting_offsets=from_starting_offsets
    )
    await_query(query, processor)
