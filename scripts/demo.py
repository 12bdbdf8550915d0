#!/usr/bin/env python3
"""The demo, as the reference setup runs: TICKIT's crm and ems in PostgreSQL, ecomm in MariaDB -> one Debezium
connector each, flattening events with the unwrap SMT -> Kafka -> the streaming job -> Hudi, checked against
both sources.

Steps (the local stack must be up: scripts/demo.sh starts it):
  1. reset the demo's own state (connectors, slot, topics, source schemas and database, lake, checkpoint);
  2. create the TICKIT tables (crm, ems in PostgreSQL; ecomm in MariaDB) and load generated rows (--scale);
  3. register both Debezium connectors (conf/local.yaml's two sources) and wait for their snapshots in Kafka;
  4. run the job once (spark-submit app/main.py --conf conf/local.yaml --available-now);
  5. a burst of inserts, updates, deletes and primary-key changes in both databases; run the job again;
  6. print per table the source count vs the Hudi count, and a time-travel query showing one MariaDB row
     before and after its update. Exits 1 on any mismatch.

It prints a line per step and the result; the job's, Spark's and Hive's own logs go to the log file it names
(default .stack/logs/demo.log). A failure prints the log's last error lines and its path.
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
import pymysql
from confluent_kafka import Consumer, TopicPartition

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.config import JobConfig, SourceConfig, load_config  # noqa: E402
from app.routing.route import silver_name  # noqa: E402
from app.sink.hudi import completed_instants  # noqa: E402
from app.sink.lakefs import delete_path  # noqa: E402
from app.spark import build_session  # noqa: E402
from devkit.connect import (  # noqa: E402
    ConnectClient,
    MariaDbSource,
    PostgresSource,
    delete_topics,
    mariadb_connector_config,
    postgres_connector_config,
    unwrap_smt_config,
)
from scripts import tickit  # noqa: E402

log = logging.getLogger("demo")
LOG_FILE = ROOT / ".stack" / "logs" / "demo.log"
ERROR_MARKS = ("ERROR", "Error", "Exception", "Traceback", "MISMATCH")


def step(text: str) -> None:
    """A progress line on the terminal (and in the log)."""
    print(f"[demo] {text}", flush=True)
    log.info("%s", text)


def last_errors(path: Path, lines: int = 15) -> str:
    """The log's last lines that look like an error, else its last lines."""
    text = path.read_text(errors="replace").splitlines() if path.exists() else []
    errors = [line for line in text if any(mark in line for mark in ERROR_MARKS)]
    return "\n".join((errors or text)[-lines:])
PG_CONNECTOR, MARIADB_CONNECTOR = "tickit", "tickit-ecomm"
PG_SYSTEMS = ["crm", "ems"]
MARIADB_SERVER_ID = 184054  # the connector's binlog client id: unique among the server's replicas
DSN = "host=127.0.0.1 port=5432 user=postgres password={password} dbname=source"
MARIADB = {"host": "127.0.0.1", "port": 3306, "user": "root", "password": "mariadb"}  # stack.sh's local login


def sources(config: JobConfig) -> tuple[SourceConfig, SourceConfig]:
    """conf/local.yaml's two sources: PostgreSQL (crm, ems) and MariaDB (ecomm)."""
    by_connector = {s.connector: s for s in config.source_list}
    if set(by_connector) != {"postgresql", "mariadb"}:
        raise SystemExit(f"the demo needs one postgresql and one mariadb source in the config; got {by_connector}")
    return by_connector["postgresql"], by_connector["mariadb"]


def topic(config: JobConfig, table: str) -> str:
    postgres, mariadb = sources(config)
    return f"{(postgres if table.split('.', maxsplit=1)[0] in PG_SYSTEMS else mariadb).topic_prefix}.{table}"


def reset(config: JobConfig, connect: ConnectClient, placement: tickit.Placement) -> None:
    """Remove what an earlier demo run left, so the counts below describe this run only."""
    connect.delete_connector(PG_CONNECTOR, reset_offsets=True)
    connect.delete_connector(MARIADB_CONNECTOR, reset_offsets=True)
    conn = placement.db("crm").conn
    deadline = time.monotonic() + 30
    slot = f"{PG_CONNECTOR}_slot"
    while (row := conn.execute("select active from pg_replication_slots where slot_name=%s", (slot,)).fetchone()):
        if not row[0]:
            conn.execute("select pg_drop_replication_slot(%s)", (slot,))
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"replication slot {slot} still active after the connector was deleted")
        time.sleep(0.5)
    delete_topics(config.kafka.bootstrap_servers, tuple(s.topic_prefix + "." for s in sources(config)))
    tickit.drop(conn)  # all three systems in PostgreSQL, as an earlier PostgreSQL-only demo made them
    tickit.drop(placement)
    # Through Hadoop's FileSystem: the lake may be on s3a:// (the default) or local disk. The session stays
    # up for report(), which gets the same one.
    spark = build_session("cdc-demo-report", config.spark, config.metastore)
    for path in (config.lake.silver_path, config.lake.bronze_path, config.lake.checkpoint_path):
        delete_path(spark, path)
    # The catalog's entries too: a table the catalog holds without its folder is one the job refuses as lost.
    for database in {*config.databases, config.lake.database}:
        spark.sql(f"DROP DATABASE IF EXISTS `{database}` CASCADE")


def topic_counts(config: JobConfig) -> dict[str, int]:
    """Records per TICKIT topic (end - start offsets), read from the broker."""
    consumer = Consumer({"bootstrap.servers": config.kafka.bootstrap_servers, "group.id": "demo-counter"})
    try:
        counts = {}
        for table in tickit.TABLES:
            name = topic(config, table)
            meta = consumer.list_topics(name, timeout=10).topics.get(name)
            if meta is None or meta.error is not None:
                counts[table] = 0
                continue
            total = 0
            for p in meta.partitions:
                low, high = consumer.get_watermark_offsets(TopicPartition(name, p), timeout=10)
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


def run_job(conf: Path, log_file: Path) -> float:
    """One available-now run of the job, the way a user submits it; its output appended to `log_file`."""
    started = time.monotonic()
    cmd = [str(ROOT / "scripts" / "submit.sh"), "--conf", str(conf), "--available-now"]
    log.info("running %s", " ".join(cmd))
    with log_file.open("a") as out:
        subprocess.run(cmd, cwd=ROOT, check=True, stdout=out, stderr=subprocess.STDOUT)
    return time.monotonic() - started


def quiet_stderr(log_file: Path) -> None:
    """This process's own stderr (Spark's JVM logs to it) to the log file from now on."""
    sys.stderr.flush()
    fd = os.open(log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.dup2(fd, 2)
    os.close(fd)


def report(config: JobConfig, placement: tickit.Placement) -> bool:
    """Print source vs Hudi counts per table and one row before/after its update; True when all match."""
    spark = build_session("cdc-demo-report", config.spark, config.metastore)
    spark.sparkContext.setLogLevel("ERROR")
    ok = True
    print(f"\n{'table':<28}{'source':<12}{'rows':>8}{'hudi':>8}  result")
    for table, source_count in tickit.counts(placement).items():
        silver = f"{config.lake.database}.{silver_name(*table.split('.'))}"
        row = spark.sql(f"select count(*) from {silver}").first()
        hudi_count = row[0] if row else -1
        match = hudi_count == source_count
        ok &= match
        kind = placement.db(table).kind
        print(f"{silver:<28}{kind:<12}{source_count:>8}{hudi_count:>8}  {'ok' if match else 'MISMATCH'}")

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
    db = placement.db("ecomm.listing")
    found = db.rows(f"select priceperticket from {db.table('ecomm.listing')} where listid = %s", (r.listid,))
    source_price = found[0][0] if found else None
    print(f"  {db.kind} now: priceperticket={source_price}")
    ok &= source_price == r.price_now
    spark.stop()
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conf", default=str(ROOT / "conf" / "local.yaml"), help="job config (default: local)")
    parser.add_argument("--scale", type=float, default=1.0, help="TICKIT size factor (1.0: ~3,700 rows)")
    parser.add_argument("--burst", type=int, default=200, help="changes in the burst between the two runs")
    parser.add_argument("--log", type=Path, default=LOG_FILE, help=f"where the logs go (default {LOG_FILE})")
    args = parser.parse_args()
    args.log.parent.mkdir(parents=True, exist_ok=True)
    args.log.write_text("")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        filename=str(args.log))
    print(f"[demo] logs: {args.log}", flush=True)
    quiet_stderr(args.log)
    try:
        return demo(args)
    except Exception as e:  # every failure: one line, the log's last errors, the path
        log.exception("demo failed")
        print(f"[demo] FAILED: {type(e).__name__}: {e}\n[demo] last errors in {args.log}:\n"
              f"{last_errors(args.log)}", flush=True)
        return 1


def demo(args: argparse.Namespace) -> int:
    os.environ.setdefault("METASTORE_PASSWORD", os.environ.get("PGPASSWORD", "postgres"))
    started = time.monotonic()
    conf = Path(args.conf)
    config = load_config(conf)
    connect = ConnectClient("http://127.0.0.1:8083")
    password = os.environ.get("PGPASSWORD", "postgres")
    postgres, mariadb = sources(config)
    with (
        psycopg.connect(DSN.format(password=password), autocommit=True) as conn,
        pymysql.connect(**MARIADB, autocommit=True) as maria,
    ):
        placement = tickit.Placement.reference(conn, maria)
        reset(config, connect, placement)
        step("reset the demo's connectors, topics, tables and lake")
        tickit.create_schema(placement)
        loaded = tickit.load(placement, scale=args.scale)
        log.info("loaded TICKIT: %s", json.dumps(loaded))
        step(f"loaded TICKIT: {sum(loaded.values())} rows in {len(loaded)} tables (PostgreSQL crm, ems; MariaDB ecomm)")
        source = PostgresSource("127.0.0.1", 5432, "postgres", password, "source")
        connect.create_fresh(PG_CONNECTOR, {
            **postgres_connector_config(PG_CONNECTOR, source, postgres.topic_prefix, PG_SYSTEMS, config.registry.url),
            **unwrap_smt_config("postgresql"),
        })
        connect.create_fresh(MARIADB_CONNECTOR, {
            **mariadb_connector_config(
                MARIADB_CONNECTOR, MariaDbSource("127.0.0.1", 3306, "debezium", "debezium"), mariadb.topic_prefix,
                ["ecomm"], registry_url=config.registry.url, kafka_bootstrap=config.kafka.bootstrap_servers,
                server_id=MARIADB_SERVER_ID,
            ),
            **unwrap_smt_config("mariadb"),
        })
        connect.wait_running(PG_CONNECTOR)
        connect.wait_running(MARIADB_CONNECTOR)
        wait_for_topics(config, loaded)
        step(f"both Debezium connectors running; their snapshots in Kafka: {sum(loaded.values())} records")
        step("job run 1 of 2 (the snapshots) ...")
        first_run = run_job(conf, args.log)
        step(f"job run 1 of 2 done in {first_run:.0f} s")

        before = topic_counts(config)
        changes = tickit.burst(placement, n=args.burst)
        log.info("burst: %s", json.dumps(changes))
        step(f"burst: {sum(sum(c.values()) for c in changes.values())} changes (inserts, updates, deletes, key "
             "changes) in both databases")
        expected = {t: before[t] + n for t, n in tickit.burst_records(changes).items()}
        wait_for_topics(config, expected)
        step("job run 2 of 2 (the burst) ...")
        second_run = run_job(conf, args.log)
        step(f"job run 2 of 2 done in {second_run:.0f} s; reading the lake")
        ok = report(config, placement)
    total = time.monotonic() - started
    print(f"\njob runs: {first_run:.0f}s (snapshot), {second_run:.0f}s (burst); demo total {total:.0f}s")
    print("RESULT: " + ("all tables match their source (PostgreSQL, MariaDB)" if ok else "MISMATCH"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
