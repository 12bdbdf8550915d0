#!/usr/bin/env python3
"""The demo: TICKIT in PostgreSQL -> Debezium -> Kafka -> the streaming job -> Hudi, checked against the source.

Steps (the local stack must be up: scripts/demo.sh starts it):
  1. reset the demo's own state (connector, slot, topics, source schemas, lake, checkpoint);
  2. create the TICKIT schema in PostgreSQL and load generated rows (--scale);
  3. register the Debezium connector and wait for its snapshot in Kafka;
  4. run the job once (spark-submit app/main.py --conf conf/local.yaml --available-now);
  5. a burst of inserts, updates and deletes; run the job again;
  6. print per table the PostgreSQL count vs the Hudi count, and a time-travel query showing one row before
     and after its update. Exits 1 on any mismatch.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import psycopg
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.config import JobConfig, load_config  # noqa: E402
from app.connect import ConnectClient, PostgresSource, postgres_connector_config  # noqa: E402
from app.hudi import completed_instants  # noqa: E402
from app.lakefs import delete_path  # noqa: E402
from app.spark import build_session  # noqa: E402
from scripts import tickit  # noqa: E402

log = logging.getLogger("demo")
CONNECTOR = "tickit"
DSN = "host=127.0.0.1 port=5432 user=postgres password={password} dbname=source"


def reset(config: JobConfig, connect: ConnectClient, conn: psycopg.Connection) -> None:
    """Remove what an earlier demo run left, so the counts below describe this run only."""
    connect.delete_connector(CONNECTOR, reset_offsets=True)
    deadline = time.monotonic() + 30
    slot = f"{CONNECTOR}_slot"
    while (row := conn.execute("select active from pg_replication_slots where slot_name=%s", (slot,)).fetchone()):
        if not row[0]:
            conn.execute("select pg_drop_replication_slot(%s)", (slot,))
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"replication slot {slot} still active after the connector was deleted")
        time.sleep(0.5)
    admin = AdminClient({"bootstrap.servers": config.kafka.bootstrap_servers})
    topics = [t for t in admin.list_topics(timeout=10).topics if t.startswith(config.source_list[0].topic_prefix + ".")]
    if topics:
        for future in admin.delete_topics(topics, operation_timeout=30).values():
            future.result()
        _wait_topics_gone(admin, topics)
    tickit.drop(conn)
    # Through Hadoop's FileSystem: the lake may be on s3a:// (the default) or local disk. The session stays
    # up for report(), which gets the same one.
    spark = build_session("cdc-demo-report", config.spark, config.metastore)
    for path in (config.lake.silver_path, config.lake.bronze_path, config.lake.checkpoint_path):
        delete_path(spark, path)


def _wait_topics_gone(admin: AdminClient, topics: list[str]) -> None:
    deadline = time.monotonic() + 60
    while set(topics) & set(admin.list_topics(timeout=10).topics):
        if time.monotonic() > deadline:
            raise RuntimeError(f"topics not deleted: {topics}")
        time.sleep(0.5)


def topic_counts(config: JobConfig) -> dict[str, int]:
    """Records per TICKIT topic (end - start offsets), read from the broker."""
    consumer = Consumer({"bootstrap.servers": config.kafka.bootstrap_servers, "group.id": "demo-counter"})
    try:
        counts = {}
        for table in tickit.TABLES:
            topic = f"{config.source_list[0].topic_prefix}.{table}"
            meta = consumer.list_topics(topic, timeout=10).topics.get(topic)
            if meta is None or meta.error is not None:
                counts[table] = 0
                continue
            total = 0
            for p in meta.partitions:
                low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                total += high - low
            counts[table] = total
        return counts
    finally:
        consumer.close()


def wait_for_topics(config: JobConfig, expected: dict[str, int], timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while (counts := topic_counts(config)) != expected:
        short = {t: (counts[t], n) for t, n in expected.items() if counts[t] < n}
        if not short and any(counts[t] > n for t, n in expected.items()):
            raise RuntimeError(f"more records than expected in Kafka: {counts} vs {expected}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"Debezium has not delivered every change after {timeout_s}s: {short}")
        time.sleep(1)


def run_job(conf: Path) -> float:
    """One available-now run of the job, the way a user submits it."""
    started = time.monotonic()
    cmd = [str(ROOT / "scripts" / "submit.sh"), "--conf", str(conf), "--available-now"]
    log.info("running %s", " ".join(cmd))
    subprocess.run(cmd, cwd=ROOT, check=True)
    return time.monotonic() - started


def report(config: JobConfig, conn: psycopg.Connection) -> bool:
    """Print PostgreSQL vs Hudi counts per table and one row before/after its update; True when all match."""
    spark = build_session("cdc-demo-report", config.spark, config.metastore)
    spark.sparkContext.setLogLevel("ERROR")
    ok = True
    print(f"\n{'table':<28}{'postgres':>10}{'hudi':>10}  result")
    for table, pg_count in tickit.counts(conn).items():
        silver = f"{config.lake.database}.{table.replace('.', '_')}"
        row = spark.sql(f"select count(*) from {silver}").first()
        hudi_count = row[0] if row else -1
        match = hudi_count == pg_count
        ok &= match
        print(f"{silver:<28}{pg_count:>10}{hudi_count:>10}  {'ok' if match else 'MISMATCH'}")

    path = config.lake.table_path("ecomm_listing")
    instants = completed_instants(spark, path)
    first = instants[0]
    before = spark.read.format("hudi").option("as.of.instant", first).load(path)
    now = spark.read.format("hudi").load(path)
    changed = (
        now.alias("n").join(before.alias("b"), "listid")
        .where("n.priceperticket <> b.priceperticket")
        .selectExpr("listid", "b.priceperticket as price_before", "n.priceperticket as price_now",
                    "b._hoodie_commit_time as commit_before", "n._hoodie_commit_time as commit_now")
        .orderBy("listid").limit(1).collect()
    )
    print(f"\ntime travel on {config.lake.database}.ecomm_listing: commits {instants}")
    if not changed:
        print("  no listing changed price between the first and the latest commit: MISMATCH")
        return False
    r = changed[0]
    print(f"  as of {first}: listid={r.listid} priceperticket={r.price_before} (commit {r.commit_before})")
    print(f"  latest:        listid={r.listid} priceperticket={r.price_now} (commit {r.commit_now})")
    (pg_price,) = conn.execute("select priceperticket from ecomm.listing where listid=%s", (r.listid,)).fetchone() or (
        None,
    )
    print(f"  PostgreSQL now: priceperticket={pg_price}")
    ok &= pg_price == r.price_now
    spark.stop()
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conf", default=str(ROOT / "conf" / "local.yaml"), help="job config (default: local)")
    parser.add_argument("--scale", type=float, default=1.0, help="TICKIT size factor (1.0: ~3,700 rows)")
    parser.add_argument("--burst", type=int, default=200, help="changes in the burst between the two runs")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("METASTORE_PASSWORD", os.environ.get("PGPASSWORD", "postgres"))
    started = time.monotonic()
    conf = Path(args.conf)
    config = load_config(conf)
    connect = ConnectClient("http://127.0.0.1:8083")
    password = os.environ.get("PGPASSWORD", "postgres")
    with psycopg.connect(DSN.format(password=password), autocommit=True) as conn:
        reset(config, connect, conn)
        tickit.create_schema(conn)
        loaded = tickit.load(conn, scale=args.scale)
        log.info("loaded TICKIT: %s", json.dumps(loaded))
        source = PostgresSource("127.0.0.1", 5432, "postgres", password, "source")
        connect.create_fresh(CONNECTOR, postgres_connector_config(
            CONNECTOR, source, config.source_list[0].topic_prefix, ["ecomm", "ems", "crm"], config.registry.url))
        connect.wait_running(CONNECTOR)
        wait_for_topics(config, loaded)
        log.info("snapshot in Kafka: %s records", sum(loaded.values()))
        first_run = run_job(conf)

        before = topic_counts(config)
        changes = tickit.burst(conn, n=args.burst)
        log.info("burst: %s", json.dumps(changes))
        # Each insert/update is one record; each delete is a delete event plus its tombstone.
        expected = {
            t: before[t] + c.get("insert", 0) + c.get("update", 0) + 2 * c.get("delete", 0)
            for t, c in {t: changes.get(t, {}) for t in tickit.TABLES}.items()
        }
        wait_for_topics(config, expected)
        second_run = run_job(conf)
        ok = report(config, conn)
    total = time.monotonic() - started
    print(f"\njob runs: {first_run:.0f}s (snapshot), {second_run:.0f}s (burst); demo total {total:.0f}s")
    print("RESULT: " + ("all tables match PostgreSQL" if ok else "MISMATCH"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
