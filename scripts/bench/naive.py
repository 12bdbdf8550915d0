#!/usr/bin/env python3
"""B2's naive baseline: what a data engineer writes first from Hudi's docs. One Structured Streaming query per
topic, `from_avro` with the topic's latest value schema from the registry, the Debezium envelope's `after` (its
`before` for a delete, flagged `_hoodie_is_deleted`), and `writeStream.format("hudi")` with exactly the options
of Hudi 1.0.2's streaming-write page (`OPTIONS`, website/docs writing_tables_streaming_writes) plus the record
key, the ordering field (the event's `source.lsn`) and the table name, in a session with Hudi's quick-start
settings (its SQL extension and catalog included); no meta sync, no Bronze copy, no exactly-once bookkeeping of its
own (Spark's checkpoint only).

Hudi's own HoodieStreamer (hudi-utilities) would be the other baseline; it cannot be obtained or built here: its
bundles are not served by the reachable registries and its module needs artifacts outside them.

The tables go to `<root>/silver/<table>`, the checkpoints to `<root>/checkpoint/<table>`. With --available-now
each query reads what its topic holds and the process ends when all have; else each runs with a --trigger-s
trigger until the process is stopped.

Usage: .venv/bin/python scripts/bench/naive.py --conf conf/local.yaml --root s3a://lake/x --topic a.b.t0 ...
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from pyspark.sql import DataFrame, SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402
from pyspark.sql.avro.functions import from_avro  # noqa: E402
from pyspark.sql.streaming import StreamingQuery  # noqa: E402

from app.config import load_config  # noqa: E402
from app.spark import build_session  # noqa: E402
from app.wire.registry import RegistryClient  # noqa: E402

# Hudi 1.0.2's streaming-write page, the Python tab, without its partition path (the tables are not partitioned);
# the record key, ordering field and table name are added per table (options()).
OPTIONS = {
    "hoodie.datasource.write.operation": "upsert",
    "hoodie.upsert.shuffle.parallelism": "2",
    "hoodie.insert.shuffle.parallelism": "2",
}
ORDERING = "_lsn"
log = logging.getLogger("bench.naive")


def options(table: str, key: str = "id") -> dict[str, str]:
    return {**OPTIONS, "hoodie.table.name": table, "hoodie.datasource.write.table.name": table,
            "hoodie.datasource.write.recordkey.field": key, "hoodie.datasource.write.precombine.field": ORDERING}


def rows(records_df: DataFrame, value_schema: str) -> DataFrame:
    """Debezium envelopes (a 5-byte id4 frame, then Avro) as table rows, deletes flagged; tombstones dropped."""
    envelope = from_avro(F.expr("substring(value, 6)"), value_schema).alias("e")
    events = records_df.where(F.col("value").isNotNull()).select(envelope)
    return events.select(
        F.when(F.col("e.op") == "d", F.col("e.before")).otherwise(F.col("e.after")).alias("row"),
        (F.col("e.op") == "d").alias("_hoodie_is_deleted"),
        F.col("e.source.lsn").alias(ORDERING),
    ).select("row.*", "_hoodie_is_deleted", ORDERING)


def start(spark: SparkSession, bootstrap: str, registry: RegistryClient, topic: str, root: str, *,
          available_now: bool, trigger_s: float) -> StreamingQuery:
    schema = registry.latest_schema(f"{topic}-value")
    if schema is None:
        raise SystemExit(f"{topic}: no value schema in the registry")
    table = topic.rsplit(".", 1)[1]
    records_df = (
        spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic).option("startingOffsets", "earliest").load()
    )
    writer = (
        rows(records_df, schema).writeStream.format("hudi").options(**options(table)).outputMode("append")
        .option("path", f"{root}/silver/{table}").option("checkpointLocation", f"{root}/checkpoint/{table}")
        .queryName(table)
    )
    writer = writer.trigger(availableNow=True) if available_now else writer.trigger(
        processingTime=f"{trigger_s:g} seconds")
    return writer.start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conf", required=True, help="job config: its Kafka, registry and Spark settings")
    parser.add_argument("--root", required=True, help="folder (or s3a:// prefix) for the tables and checkpoints")
    parser.add_argument("--topic", action="append", required=True, help="repeatable: one query per topic")
    parser.add_argument("--available-now", action="store_true", help="read what the topics hold, then end")
    parser.add_argument("--trigger-s", type=float, default=1.0, help="processing-time trigger (default 1 s)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    config = load_config(args.conf)
    # Hudi's quick-start session settings, its SQL extension and catalog included, as a user following its docs has.
    spark = build_session("bench-naive", config.spark, None, hudi_sql=True)
    spark.sparkContext.setLogLevel("WARN")
    with RegistryClient.from_config(config.registry) as registry:
        queries = [start(spark, config.kafka.bootstrap_servers, registry, topic, args.root,
                         available_now=args.available_now, trigger_s=args.trigger_s) for topic in args.topic]
    log.info("naive: %d queries started", len(queries))
    for query in queries:
        query.awaitTermination()
    log.info("naive: all queries ended")
    return 0


if __name__ == "__main__":
    sys.exit(main())
