"""Entry point: `spark-submit app/main.py --conf conf/prod.yaml [--available-now]`.

The packaged job runs the same file: `spark-submit --py-files cdc_lakehouse.zip main.py --conf s3://.../prod.yaml`
(scripts/package.sh), from any working directory; `--conf` takes a local path or an s3:// / s3a:// URI.

Reads Debezium change events from Kafka, writes every record to Bronze and the latest row per key to the
Hudi Silver tables, one foreachBatch call per micro-batch.
"""
from __future__ import annotations

# ruff: noqa: E402 - every other import follows the sys.path repair below
import os
import sys

# spark-submit app/main.py runs this file as a script, and Python puts app/ (not the repository) first on sys.path.
# There app/types.py would shadow the standard library's `types` for every later import (argparse -> enum ->
# types fails on a Python that has not imported it at start-up, e.g. Debian's), so app/ leaves sys.path before
# anything else is imported, and the repository, which the package imports need, takes its place. The packaged
# copy of this file sits outside the package (app/ comes from the zip on --py-files): nothing to change, and adding
# its parent could put a stray checkout's app/ ahead of the zip.
_HERE = os.path.dirname(os.path.abspath(__file__))
if os.path.exists(os.path.join(_HERE, "__init__.py")):
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    sys.path.insert(0, os.path.dirname(_HERE))

import argparse
import logging
from pathlib import Path

from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

import app
from app.batch import BatchProcessor
from app.catalog import all_partition_roots
from app.config import JobConfig, load_config
from app.errors import ConfigError, PipelineError, RerouteError
from app.registry import RegistryClient
from app.resume import kafka_partitions, resume_offsets
from app.route import TableRoute, check_routes, skip_reason
from app.source import read_kafka
from app.spark import ABORTABLE_CHECKPOINT_MANAGER, build_session
from app.status import load_status, log_stale, stale_tables, why, write_status

log = logging.getLogger("app.main")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--conf", required=True, help="YAML job config: a path (conf/local.yaml) or an s3:// or s3a:// URI"
    )
    parser.add_argument(
        "--available-now",
        action="store_true",
        help="process every offset present at start (Hudi commits and checkpoint included), then exit 0",
    )
    parser.add_argument(
        "--from-starting-offsets",
        action="store_true",
        help="without a checkpoint, read from kafka.starting_offsets even though Silver tables exist (by default the "
        "job resumes after the offsets they committed, or refuses to start when they record none)",
    )
    return parser.parse_args(argv)


def configure_logging(level: str) -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    logging.getLogger("py4j").setLevel(logging.WARNING)


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
    status (app/status.py) is written first: routes, skipped topics, stale tables; then after every batch.

    Raises:
        ConfigError: two of the subscribed topics map to one Silver table (app/route.py).
        EnvelopeError: topics merged into one table disagree on a column's type (their latest schemas).
        RerouteError: a topic feeds another table now than the one that applied its offsets (app/status.py).
        ResumeError: the checkpoint is missing and the tables record no offsets.
    """
    if config.lake.checkpoint_path.startswith("s3a://"):
        # A rename is a copy on S3: Spark's abortable-stream manager writes checkpoint files without renames. It
        # needs a file system with abortable streams (s3a); EMRFS s3:// keeps Spark's default manager.
        spark.conf.set("spark.sql.streaming.checkpointFileManagerClass", ABORTABLE_CHECKPOINT_MANAGER)
    partitions = kafka_partitions(spark, config)
    routes = check_routes(config, partitions, all_partition_roots(spark, config))
    log.info("%d topics of %d sources: %s", len(partitions), len(config.source_list),
             ", ".join(f"{r.topic} -> {r.qualified_name}{_why(r)}" for r in routes) or "none yet")
    status = processor.status = load_status(spark, config)
    status.conf = conf_file
    for topic in sorted(partitions):
        reason = skip_reason(topic, config)
        if reason is not None:
            log.info("topic %s feeds no table: %s", topic, reason)
            status.skipped_topics.setdefault(topic, {"reason": reason, "batch_id": None, "at": None, "records": 0})
    status.set_routes(routes)
    status.stale_tables, rerouted = stale_tables(spark, config, routes)
    log_stale(status.stale_tables)
    processor.write_status = True
    try:
        if rerouted:
            raise RerouteError(
                "; ".join(r.message() for r in rerouted) + ". With this checkpoint the job would read on after "
                "those offsets, and the tables would miss them: replay them, i.e. drop "
                f"{', '.join(sorted({r.old_table for r in rerouted}))} (catalog and folder), then start with a new "
                f"lake.checkpoint_path and --from-starting-offsets (kafka.starting_offsets: earliest, within "
                f"Kafka's retention); or undo the config change (README \"Partitioned and sharded sources\")"
            )
        processor.check_merges_at_start(spark, routes)
    except PipelineError as e:
        status.failure = f"at start: {type(e).__name__}: {e}"
        raise
    finally:
        write_status(spark, config, status)
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


def run(config: JobConfig, args: argparse.Namespace) -> None:
    """Build the session, start the query and block until it ends (available-now) or fails."""
    # Which code and config this run has (a packaged run: the zip spark-submit fetched from --py-files).
    log.info("job code %s, config %s", Path(app.__file__).parent, args.conf)
    spark = build_session("cdc-lakehouse", config.spark, config.metastore)
    spark.sparkContext.setLogLevel("WARN")
    processor = BatchProcessor(config, RegistryClient.from_config(config.registry))
    query = start_query(
        spark, config, processor, args.available_now,
        conf_file=args.conf, from_starting_offsets=args.from_starting_offsets,
    )
    await_query(query, processor)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        config = load_config(args.conf)
    except ConfigError as e:
        print(f"invalid config {args.conf}: {e}", file=sys.stderr)
        return 2
    configure_logging(config.log_level)
    try:
        run(config, args)
    except PipelineError as e:
        log.error("%s: %s", type(e).__name__, e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
