"""Outages ridden out (app/recovery.py): one job, a process of its own with a 2-second trigger and the lake on S3,
reaches every service through a TCP proxy of its own (tests/support/tcp_proxy.py), so each outage cuts this job
off while the shared stack, its connector and the other tests run on. Each phase changes PostgreSQL before and
during the outage, brings the service back after 60 s, and waits until both Silver tables equal PostgreSQL value by
value (one of them partitioned, so its every commit runs meta sync); the time from the service's return to that is
printed (`catch-up`). The job must have said what it waited for (an `OUTAGE` line, or the heartbeat's line on a batch
that a client's own retries keep running), and must still be the same process, except where the phase restarts it
on purpose.

    broker        the broker cut off for 60 s, longer than Spark's own Kafka retries last (the job's Kafka
                  timeouts are short here: kafka.options), so the query fails and the job starts it again (or,
                  when the cut catches a batch's tasks fetching, they wait in the consumer's poll and it goes on)
    registry      new schema ids waiting (a column added), the job killed and restarted inside the outage: a cold
                  cache; connection errors wait and never become dead letters
    object store  the S3 server cut off for 60 s (Bronze, Silver, the checkpoint and status.json on it)
    metastore     the metastore database cut off for 60 s while a new partition needs meta sync: Hive's client
                  retries on its own, or the batch fails after its commit, the job waits, and the replay skips the
                  committed table and syncs it
    give up       `recovery.give_up_after_s` passed with the registry still out: exit 1 and a message naming it

Before the outages, the source-lag alarm (app/state/sources.py): the connector sends heartbeats every 2 s through a
heartbeat table; it is then stalled as the issue found it (Kafka Connect says RUNNING while another backend holds
its replication slot), the job must warn within `recovery.source_stalled_after_s` with no batch running, and
`scripts/stack.sh unstick` must bring it back.
"""
from __future__ import annotations

import dataclasses
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
import requests
import yaml
from pyspark.sql import SparkSession

from app.config import JobConfig
from app.errors import required
from app.sink.bronze import read_bronze
from app.state.status import read_status, status_path
from devkit.connect import heartbeat_config, heartbeat_table_ddl
from tests.conftest import LOCAL_CONF, ROOT, RUN_ID
from tests.support.cdc import CONNECT_URL, PG_DSN, debezium_connector, job_config_for, wait_for_records
from tests.support.jobprocess import Job, kill
from tests.support.metastore import metastore_partitions
from tests.support.pipeline import source_schema
from tests.support.tcp_proxy import FaultProxy
from tests.support.waiting import LakeWatch

pytestmark = [pytest.mark.stack, pytest.mark.slow]

SCHEMA = f"out_{RUN_ID}"
PREFIX = f"out{RUN_ID}"
DATABASE = f"out_{RUN_ID}"
DDL = f"""
create schema {SCHEMA};
create table {SCHEMA}.items (id int primary key, name text, qty int);
create table {SCHEMA}.orders (id int primary key, region text, amount numeric(10,2));
insert into {SCHEMA}.items select i, 'item ' || i, i from generate_series(1, 30) i;
insert into {SCHEMA}.orders select i, 'r' || (i % 2), i * 1.5 from generate_series(1, 30) i;
{heartbeat_table_ddl(f"{SCHEMA}.heartbeat")};
"""
CONNECTOR = f"out-{RUN_ID}"
SLOT, PUBLICATION = f"{CONNECTOR}_slot".replace("-", "_"), f"{CONNECTOR}_pub".replace("-", "_")
STALLED_AFTER_S = 20
OUTAGE_S = 60
CATCH_UP_S = 240
KAFKA_PROXIED_LISTENER_PORT = 9094  # scripts/stack.sh: the broker's listener that advertises the proxy's port
KAFKA_PROXIED_PORT = 19094


@dataclasses.dataclass
class Setup:
    config: JobConfig  # the job's, as the test reads its lake (the stack's own endpoints)
    job: Job
    proxies: dict[str, FaultProxy]
    pg: psycopg.Connection
    next_id: int = 100
    process: Any = None
    window: tuple[datetime, datetime] | None = None  # the latest outage's, in local time (the job's log lines')

    def start(self, conf: Path | None = None) -> None:
        self.process = self.job.start(conf=conf)

    def change(self, n: int = 5, region: str = "r0") -> None:
        """Inserts, updates and a delete in both tables, in one transaction."""
        with self.pg.transaction():
            for _ in range(n):
                self.next_id += 1
                i = self.next_id
                self.pg.execute(f"insert into {SCHEMA}.items (id, name, qty) values ({i}, 'new {i}', {i})")
                self.pg.execute(f"insert into {SCHEMA}.orders values ({i}, '{region}', {i}.25)")
            self.pg.execute(f"update {SCHEMA}.items set qty = qty + 1 where id % 3 = 0")
            self.pg.execute(f"update {SCHEMA}.orders set amount = amount + 1 where id % 4 = 0")
            self.pg.execute(f"delete from {SCHEMA}.items where id = (select min(id) from {SCHEMA}.items)")
            self.pg.execute(f"delete from {SCHEMA}.orders where id = (select min(id) from {SCHEMA}.orders)")

    def outage(self, service: str, during: Any = None) -> None:
        """The service cut off for OUTAGE_S, changes made before and during it; `during(elapsed)` is called
        once after the cut."""
        self.change()
        proxy = self.proxies[service]
        proxy.down()
        cut, began = time.monotonic(), datetime.now()
        try:
            self.change()
            if during is not None:
                during()
            while time.monotonic() - cut < OUTAGE_S:
                self.change(2)
                time.sleep(10)
        finally:
            proxy.up()
            self.window = (began, datetime.now())


def _job_conf(config: JobConfig, proxies: dict[str, FaultProxy], path: Path, **recovery: float) -> Path:
    """conf/local.yaml for this module's topics and lake, every service reached through its proxy."""
    raw = yaml.safe_load(LOCAL_CONF.read_text())
    raw["kafka"].update({
        "topic_pattern": config.kafka.topic_pattern, "max_offsets_per_trigger": None,
        "bootstrap_servers": proxies["broker"].address,
        # Spark's Kafka client gives up within seconds, so the outage outlasts it (the defaults take minutes).
        "options": {"default.api.timeout.ms": "10000", "request.timeout.ms": "5000"},
    })
    raw["registry"]["url"] = f"http://{proxies['registry'].address}"
    raw["spark"]["conf"]["spark.hadoop.fs.s3a.endpoint"] = f"http://{proxies['object store'].address}"
    raw["metastore"]["jdbc_url"] = f"jdbc:postgresql://{proxies['metastore'].address}/metastore"
    raw.pop("sources", None)
    raw["source"] = {"topic_prefix": PREFIX, "framing": "id4", "id_type": "contentId", "snapshot_new_columns": "none",
                     # a misspelt table: accepted (tables may come later), said at start and in the status
                     "tables": {f"{SCHEMA}.orders": {"partition_by": "region"},
                                f"{SCHEMA}.ordres": {"delete_mode": "soft"},
                                # a table created later under the name of items' Silver table: refused
                                f"{SCHEMA}.clash": {"name": f"{SCHEMA}_items"}},
                     "heartbeat_table": f"{SCHEMA}.heartbeat"}
    lake = config.lake
    raw["lake"].update({"database": lake.database, "silver_path": lake.silver_path, "bronze_path": lake.bronze_path,
                        "checkpoint_path": lake.checkpoint_path})
    raw["trigger"] = {"processing_time": "2 seconds"}
    # The job's metrics through one of Spark's own sinks (app/state/metrics.py), every second.
    (path.parent / "metrics").mkdir(exist_ok=True)
    raw["spark"]["conf"].update({
        "spark.metrics.namespace": "cdc",
        "spark.metrics.conf.driver.sink.csv.class": "org.apache.spark.metrics.sink.CsvSink",
        "spark.metrics.conf.driver.sink.csv.period": "1", "spark.metrics.conf.driver.sink.csv.unit": "seconds",
        "spark.metrics.conf.driver.sink.csv.directory": str(path.parent / "metrics"),
    })
    raw["recovery"] = {"backoff_s": 2, "max_backoff_s": 10, "give_up_after_s": 600, "heartbeat_s": 5,
                       "source_stalled_after_s": STALLED_AFTER_S, **recovery}
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.fixture(scope="module")
def setup(
    spark: SparkSession, local_config: JobConfig, lake_root: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Setup]:
    folder = tmp_path_factory.mktemp("outages")
    proxies = {
        "broker": FaultProxy(KAFKA_PROXIED_LISTENER_PORT, KAFKA_PROXIED_PORT),
        "registry": FaultProxy(8080),
        "object store": FaultProxy(9000),
        "metastore": FaultProxy(5432),
    }
    for proxy in proxies.values():
        proxy.up()
    heartbeats = heartbeat_config(f"{SCHEMA}.heartbeat", interval_ms=2000)
    with source_schema(SCHEMA, DDL) as pg, debezium_connector(CONNECTOR, PREFIX, [SCHEMA], settings=heartbeats,
                                                               schema_publication=True):
        config = job_config_for(local_config, PREFIX, DATABASE, f"{lake_root}/outages")
        job = Job(_job_conf(config, proxies, folder / "job.yaml"), folder)
        setup = Setup(config, job, proxies, pg)
        wait_for_records(f"{PREFIX}.{SCHEMA}.items", 30)
        setup.start()
        try:
            _wait_equal(spark, setup, "the first batches")
            yield setup
        finally:
            if setup.process is not None and setup.process.poll() is None:
                kill(setup.process)
            for proxy in proxies.values():
                proxy.down()


def _silver(spark: SparkSession, config: JobConfig, table: str, columns: list[str]) -> dict[Any, tuple[Any, ...]]:
    path = config.lake.table_path(f"{SCHEMA}_{table}")
    try:
        df = spark.read.format("hudi").load(path)
    except Exception:  # not created yet
        return {}
    present = [c for c in columns if c in df.columns]
    rows = df.select(*present).collect()
    return {r[0]: tuple(r) + (None,) * (len(columns) - len(present)) for r in rows}


def _source(setup: Setup, table: str) -> tuple[list[str], dict[Any, tuple[Any, ...]]]:
    cursor = setup.pg.execute(f"select * from {SCHEMA}.{table}")
    columns = [d.name for d in cursor.description or []]
    return columns, {r[0]: tuple(r) for r in cursor.fetchall()}


def _differences(spark: SparkSession, setup: Setup) -> list[str]:
    found = []
    for table in ("items", "orders"):
        columns, expected = _source(setup, table)
        actual = _silver(spark, setup.config, table, columns)
        if actual != expected:
            missing, extra = expected.keys() - actual.keys(), actual.keys() - expected.keys()
            differing = [k for k in expected.keys() & actual.keys() if expected[k] != actual[k]]
            found.append(f"{table}: {len(missing)} missing, {len(extra)} extra, {len(differing)} differing "
                         f"(e.g. {sorted(differing)[:3]}: {[(actual[k], expected[k]) for k in sorted(differing)[:2]]})")
    return found


def _wait_equal(spark: SparkSession, setup: Setup, what: str, timeout_s: float = CATCH_UP_S) -> float:
    """Seconds until both tables equal PostgreSQL."""
    started = time.monotonic()
    watch = LakeWatch(spark, *(setup.config.lake.table_path(f"{SCHEMA}_{t}") for t in ("items", "orders")))
    found: list[str] = []
    while not watch.changed() or (found := _differences(spark, setup)):
        if setup.process.poll() is not None:
            raise AssertionError(f"the job ended ({setup.process.returncode}) before {what}:\n"
                                 + "\n".join(setup.job.log_lines()[-40:]))
        assert time.monotonic() - started < timeout_s, f"not equal {timeout_s} s after {what}: {found}"
        time.sleep(2)
    return time.monotonic() - started


def _said_during_outage(setup: Setup, *words: str) -> list[str]:
    """The job's log lines holding any of `words`, logged during the latest outage (or up to 5 s after it)."""
    began, ended = required(setup.window, "an outage")
    found = []
    for line in setup.job.log_lines():
        try:
            at = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
        except ValueError:
            continue
        if began <= at <= ended + timedelta(seconds=5) and any(w in line for w in words):
            found.append(line)
    return found


def _held_s(line: str) -> float:
    """The seconds a heartbeat line says a batch or a trigger has been held (app/job.py QueryWatch)."""
    held = re.search(r" still running after (\d+) s| for (\d+) s, between batches", line)
    return 0.0 if held is None else float(held.group(1) or held.group(2))


def _said(setup: Setup, words: str, since: int = 0) -> list[str]:
    """The job's log lines holding `words`, from its line `since` on (of the current run's log)."""
    return [line for line in setup.job.log_lines()[since:] if words in line]


def _status(conf: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "scripts/status.py", "--conf", str(conf), *args], check=False, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def _alive(setup: Setup) -> None:
    assert setup.process.poll() is None, "\n".join(setup.job.log_lines()[-40:])


def _gauge(setup: Setup, name: str) -> float:
    """The latest value the CSV sink wrote for one of the job's gauges."""
    rows = (setup.job.folder / "metrics" / f"cdc.driver.cdc_lakehouse.{name}.csv").read_text().splitlines()
    return float(rows[-1].split(",")[1])


def _wait_gauge(setup: Setup, name: str, value: float, timeout_s: float = 10) -> None:
    """The CSV sink writes every second: wait for a gauge to read `value`."""
    deadline = time.monotonic() + timeout_s
    while (seen := _gauge(setup, name)) != value:
        assert time.monotonic() < deadline, f"{name} is {seen}, not {value}"
        time.sleep(0.5)


def test_metrics_reach_sparks_sinks_and_the_log(setup: Setup) -> None:
    label = PREFIX  # the source's label: its topic prefix
    items, orders = f"{DATABASE}.{SCHEMA}_items", f"{DATABASE}.{SCHEMA}_orders"
    deadline = time.monotonic() + 60
    while not (setup.job.folder / "metrics" / f"cdc.driver.cdc_lakehouse.source.{label}.kafka_lag.csv").exists():
        assert time.monotonic() < deadline, sorted(p.name for p in (setup.job.folder / "metrics").glob("*"))
        time.sleep(1)
    assert _gauge(setup, "job.batches") >= 1
    assert _gauge(setup, f"source.{label}.kafka_lag") == 0  # all applied (the tables equal PostgreSQL)
    for table in (items, orders):
        assert _gauge(setup, f"table.{table}.quarantined") == 0
        assert _gauge(setup, f"table.{table}.freshness_s") > 0
    lines = [json.loads(line.split(" metrics ", 1)[1]) for line in _said(setup, "app.metrics: metrics {")]
    for table in (items, orders):  # the snapshot's 30 rows each, over the batches so far
        assert sum(line["tables"].get(table, {}).get("rows_applied", 0) for line in lines) == 30, lines
    unmatched = f'source.tables."{SCHEMA}.ordres"'
    assert _said(setup, f"config {unmatched} names no table yet: no subscribed topic is {PREFIX}.{SCHEMA}.ordres")
    status = read_status(status_path(setup.config), "http://127.0.0.1:9000")
    assert status["unmatched_settings"] == {unmatched: f"{PREFIX}.{SCHEMA}.ordres",
                                            f'source.tables."{SCHEMA}.clash"': f"{PREFIX}.{SCHEMA}.clash"}, \
        status["unmatched_settings"]
    first = lines[0]
    assert set(first["sources"]) == {label} and first["sources"][label]["freshness_s"] > 0, first
    print(f"\nthe first batch's metrics line: {json.dumps(first)}")


def _batches_done(setup: Setup) -> int:
    """The id of the job's latest completed batch (its log), -1 before any."""
    done = [int(line.split("batch=")[1].split()[0]) for line in setup.job.log_lines() if " done tables=" in line]
    return max(done, default=-1)


def test_a_table_created_upstream_flows_without_a_restart(spark: SparkSession, setup: Setup) -> None:
    """The connector's publication follows the schema (FOR TABLES IN SCHEMA, devkit/connect.py): a table created
    while the job and the connector run reaches the lake with neither restarted."""
    runs, before = setup.job.runs, _batches_done(setup)
    created = time.monotonic()
    with setup.pg.transaction():
        setup.pg.execute(f"create table {SCHEMA}.added (id int primary key, note text)")
        setup.pg.execute(f"insert into {SCHEMA}.added select i, 'note ' || i from generate_series(1, 5) i")
    setup.pg.execute(f"update {SCHEMA}.added set note = 'changed' where id = 2")
    setup.pg.execute(f"delete from {SCHEMA}.added where id = 5")
    expected = {r[0]: tuple(r) for r in setup.pg.execute(f"select id, note from {SCHEMA}.added").fetchall()}
    path = setup.config.lake.table_path(f"{SCHEMA}_added")
    while True:
        try:
            actual = {r[0]: tuple(r) for r in spark.read.format("hudi").load(path).select("id", "note").collect()}
        except Exception:  # not created yet
            actual = {}
        if actual == expected:
            break
        assert time.monotonic() - created < 120, (actual, expected, setup.job.log_lines()[-20:])
        time.sleep(1)
    queryable = time.monotonic() - created
    deadline = time.monotonic() + 30  # the table's log line follows its commit
    while not (lines := [line for line in setup.job.log_lines() if f"table={DATABASE}.{SCHEMA}_added " in line]):
        assert time.monotonic() < deadline
        time.sleep(0.5)
    first = min(int(line.split("batch=")[1].split()[0]) for line in lines)
    print(f"\nnew table queryable {queryable:.1f} s after its CREATE TABLE; its first rows in batch {first}, "
          f"{first - before} batches after the last one before it")
    assert setup.job.runs == runs and setup.process.poll() is None  # no restart of the job, nor of the connector
    connector = requests.get(f"{CONNECT_URL}/connectors/{CONNECTOR}/status", timeout=10).json()
    assert [t["state"] for t in connector["tasks"]] == ["RUNNING"], connector


def test_a_table_created_upstream_under_a_taken_name_is_refused_and_the_others_go_on(
    spark: SparkSession, setup: Setup
) -> None:
    """`clash` is named like items' Silver table in the job's config (a name collision that appears after start):
    created while the job runs, its topic is refused, with the setting to change, in the log and status.json;
    Bronze keeps its records, no table is quarantined, items and orders go on. The registry phase below restarts
    the job with the topic there: the start refuses it the same way, items' commits holding the table."""
    runs, since = setup.job.runs, len(setup.job.log_lines())
    topic = f"{PREFIX}.{SCHEMA}.clash"
    with setup.pg.transaction():  # keys items had: a row of clash in items would differ from PostgreSQL
        setup.pg.execute(f"create table {SCHEMA}.clash (id int primary key, name text, qty int)")
        setup.pg.execute(f"insert into {SCHEMA}.clash select i, 'clash ' || i, -i from generate_series(1, 40) i")
    deadline = time.monotonic() + 120
    while not (said := _said(setup, f"topic {topic} REFUSED", since)):
        assert time.monotonic() < deadline, setup.job.log_lines()[since:][-20:]
        time.sleep(1)
    print(f"\n{said[0][:600]}")
    key = f'source.tables."{SCHEMA}.clash".name'
    assert f"{PREFIX}.{SCHEMA}.items holds the table ({key})" in said[0], said[0]
    setup.pg.execute(f"update {SCHEMA}.clash set qty = 0 where id = 40")
    setup.change()
    _wait_equal(spark, setup, "the clashing table's rows")
    status = read_status(status_path(setup.config), "http://127.0.0.1:9000")
    refused = status["skipped_topics"][topic]
    assert refused["reason"].startswith("REFUSED: ") and key in refused["reason"] and refused["records"] > 0, refused
    assert status["quarantined"] == {}, status
    bronze_df = required(read_bronze(spark, setup.config.lake.bronze_path, [topic]), "the clashing topic's Bronze")
    bronze = {r.offset for r in bronze_df.select("offset").collect()}
    assert len(bronze) >= 40, len(bronze)
    assert setup.job.runs == runs and setup.process.poll() is None
    assert len(_said(setup, f"topic {topic} REFUSED", since)) == 1  # once per run, though refused every batch


def _slot_holder(pg: psycopg.Connection) -> tuple[int | None, str | None]:
    row = pg.execute("select s.active_pid, a.application_name from pg_replication_slots s left join "
                     "pg_stat_activity a on a.pid = s.active_pid where s.slot_name = %s", (SLOT,)).fetchone()
    return (row[0], row[1]) if row else (None, None)


def _hold_the_slot(pg: psycopg.Connection) -> subprocess.Popen[bytes]:
    """The issue's stuck connector: its walsender ended, another backend (pg_recvlogical here, an earlier task's
    connection there) takes the slot before the connector's retry does. The holder must not move the slot on (the
    connector's offset would be gone from the server): it never times out (`wal_sender_timeout=0` for its
    connection), sends no status but the first (whose position is none), and is stopped (SIGSTOP) once it holds
    the slot."""
    dsn = dict(part.split("=", 1) for part in PG_DSN.split())
    env = {"PGPASSWORD": dsn["password"], "PGOPTIONS": "-c wal_sender_timeout=0", "PATH": "/usr/bin:/bin"}
    deadline = time.monotonic() + 60
    while True:
        pid, _ = _slot_holder(pg)
        if pid is not None:
            pg.execute("select pg_terminate_backend(%s)", (pid,))
        holder = subprocess.Popen(
            ["/usr/lib/postgresql/15/bin/pg_recvlogical", "-h", dsn["host"], "-p", dsn["port"], "-U", dsn["user"],
             "-d", dsn["dbname"], "--slot", SLOT, "--start", "--no-loop", "-s", "86400", "-f", "/dev/null",
             "-o", "proto_version=1", "-o", f"publication_names={PUBLICATION}"], env=env, stderr=subprocess.DEVNULL)
        for _ in range(40):
            if holder.poll() is not None or _slot_holder(pg)[1] == "pg_recvlogical":
                break
            time.sleep(0.05)
        if holder.poll() is None and _slot_holder(pg)[1] == "pg_recvlogical":
            holder.send_signal(signal.SIGSTOP)
            return holder
        holder.kill()
        holder.wait(10)
        assert time.monotonic() < deadline, f"could not take slot {SLOT}: {_slot_holder(pg)}"


def test_a_stalled_connector_raises_the_source_lag_alarm(spark: SparkSession, setup: Setup) -> None:
    label = PREFIX
    # Idle but heartbeating: the heartbeat table's changes arrive (Bronze only), the source is not stalled.
    time.sleep(STALLED_AFTER_S + 5)
    status = read_status(status_path(setup.config), "http://127.0.0.1:9000")
    assert status["sources"][label]["stalled"] is False and status["sources"][label]["age_s"] < STALLED_AFTER_S, status
    assert f"{PREFIX}.{SCHEMA}.heartbeat" in status["skipped_topics"], status["skipped_topics"]
    assert not _said(setup, "SOURCE STALLED"), _said(setup, "SOURCE STALLED")
    since = len(setup.job.log_lines())
    holder = _hold_the_slot(setup.pg)
    stalled_at = time.monotonic()
    try:
        while not (said := _said(setup, f"SOURCE STALLED: source {label}", since)):
            assert time.monotonic() - stalled_at < STALLED_AFTER_S + 60, setup.job.log_lines()[since:][-20:]
            time.sleep(1)
        alarm_s = time.monotonic() - stalled_at
        connector = requests.get(f"{CONNECT_URL}/connectors/{CONNECTOR}/status", timeout=10).json()
        print(f"\nthe alarm {alarm_s:.0f} s after the slot was taken (threshold {STALLED_AFTER_S} s), Connect says "
              f"{connector['connector']['state']}/{[t['state'] for t in connector['tasks']]}:\n{said[0][:400]}")
        assert connector["connector"]["state"] == "RUNNING", connector
        _wait_gauge(setup, f"source.{label}.stalled", 1)
        assert _status(setup.job.conf).returncode == 4
        assert setup.process.poll() is None  # an alarm, not an exit
    finally:
        unstick = subprocess.run(["bash", "scripts/stack.sh", "unstick", CONNECTOR], cwd=ROOT, capture_output=True,
                                 text=True, timeout=120, check=False)
        holder.kill()  # its backend is gone; the stopped client itself does not notice
        holder.wait(30)
    print(unstick.stdout)
    assert unstick.returncode == 0, unstick.stderr
    setup.change()
    catch_up = _wait_equal(spark, setup, "the connector was unstuck")
    print(f"equal to PostgreSQL {catch_up:.1f} s after `scripts/stack.sh unstick`")
    deadline = time.monotonic() + 30
    while not _said(setup, f"source {label} delivers again", since):
        assert time.monotonic() < deadline, setup.job.log_lines()[since:][-20:]
        time.sleep(1)
    _wait_gauge(setup, f"source.{label}.stalled", 0)


def test_the_broker_cut_off_longer_than_sparks_retries(spark: SparkSession, setup: Setup) -> None:
    since = len(setup.job.log_lines())
    setup.outage("broker")
    catch_up = _wait_equal(spark, setup, "the broker came back")
    print(f"\ncatch-up after the broker outage: {catch_up:.1f} s")
    _alive(setup)
    # Mostly the driver's offset requests give up (kafka.options) and the query starts again; a batch whose tasks were
    # fetching when the cut came waits in the consumer's poll instead (kafkaConsumer.pollTimeoutMs: 120 s), and the
    # heartbeat says which step it is held in. Either way the job said so during the outage.
    said = [line for line in _said_during_outage(setup, "OUTAGE: cannot reach the broker (kafka.bootstrap_servers)",
                                                 "still running after", "between batches")
            if "OUTAGE" in line or _held_s(line) >= 20]  # held by the cut, not a batch a little long
    assert said, setup.job.log_lines()[since:][-40:]
    print("\n".join(line[:300] for line in said))


def test_the_registry_cut_off_with_new_schema_ids_and_a_cold_cache(spark: SparkSession, setup: Setup) -> None:
    def add_column_and_restart() -> None:
        setup.pg.execute(f"alter table {SCHEMA}.items add column note text")
        setup.pg.execute(f"insert into {SCHEMA}.items values (90, 'with a note', 1, 'the new schema')")
        kill(setup.process)  # restarted inside the outage: its schema cache starts empty
        setup.start()

    setup.outage("registry", during=add_column_and_restart)
    catch_up = _wait_equal(spark, setup, "the registry came back")
    print(f"\ncatch-up after the registry outage (restarted inside it): {catch_up:.1f} s")
    _alive(setup)
    assert _said(setup, "OUTAGE: cannot reach the registry (registry.url)"), setup.job.log_lines()[-40:]
    # The restart inside the outage found the clashing topic of the test above: refused at start, items holding
    # its table (read from its commits).
    assert _said(setup, f"topic {PREFIX}.{SCHEMA}.clash REFUSED"), setup.job.log_lines()[:40]
    status = read_status(status_path(setup.config), "http://127.0.0.1:9000")
    assert status["dead_letters"] == {} and status["outage"] is None, status  # waited; nothing dead-lettered


def test_the_object_store_cut_off(spark: SparkSession, setup: Setup) -> None:
    runs, since = setup.job.runs, len(setup.job.log_lines())
    setup.outage("object store")
    catch_up = _wait_equal(spark, setup, "the object store came back")
    print(f"\ncatch-up after the object store outage: {catch_up:.1f} s")
    _alive(setup)
    assert setup.job.runs == runs
    # s3a's own retries may ride it out inside one long batch or one trigger (the heartbeat says where it is), or
    # the job waits; either way the job said so during the outage.
    said = _said_during_outage(setup, "OUTAGE: cannot reach the object store", "still running after",
                               "between batches")
    assert said, setup.job.log_lines()[since:][-40:]
    print("\n".join(line[:300] for line in said))
    # The heartbeat is fresh while the job lives (scripts/status.py --max-age).
    assert _status(setup.job.conf, "--max-age", "30s").returncode == 0


def test_the_metastore_cut_off_during_meta_sync(spark: SparkSession, setup: Setup) -> None:
    since = len(setup.job.log_lines())
    setup.outage("metastore", during=lambda: setup.change(3, region="r9"))  # a new partition: its sync must run
    catch_up = _wait_equal(spark, setup, "the metastore came back")
    _alive(setup)
    # Hive's client retries on its own and may ride it out inside one long batch (the heartbeat says where it
    # is), or the batch fails after its commit and the job waits; the replay syncs the committed table.
    said = _said_during_outage(setup, "OUTAGE: cannot reach the metastore", "still running after",
                               "between batches")
    assert said, setup.job.log_lines()[since:][-40:]
    print("\n".join(line[:300] for line in said))
    # The catalog caught up too: the new partition, and the rows through the catalog's table.
    started = time.monotonic()
    while True:
        # The metastore's own partitions (SHOW PARTITIONS of a Hudi table needs Hudi's SQL extension, which the
        # job's session, and this one, go without: app/spark.py).
        partitions = metastore_partitions(DATABASE, f"{SCHEMA}_orders")
        if "region=r9" in partitions:
            break
        assert time.monotonic() - started < CATCH_UP_S, partitions
        time.sleep(2)
    spark.catalog.refreshTable(f"{DATABASE}.{SCHEMA}_orders")
    count = spark.sql(f"select count(*) from {DATABASE}.{SCHEMA}_orders").first()
    assert count is not None and count[0] == len(_source(setup, "orders")[1])
    print(f"\ncatch-up after the metastore outage: {catch_up:.1f} s (lake), "
          f"{catch_up + time.monotonic() - started:.1f} s (catalog)")


def test_an_outage_past_the_give_up_time_ends_the_job_naming_it(setup: Setup, tmp_path: Path) -> None:
    kill(setup.process)
    conf = _job_conf(setup.config, setup.proxies, tmp_path / "give-up.yaml", give_up_after_s=20)
    setup.proxies["registry"].down()
    try:
        setup.pg.execute(f"alter table {SCHEMA}.items add column other int")
        setup.pg.execute(f"insert into {SCHEMA}.items values (91, 'x', 1, null, 7)")  # a new schema id to fetch
        started = time.monotonic()
        setup.start(conf)
        rc = setup.process.wait(300)
        lines = setup.job.log_lines()
        assert rc == 1, lines[-40:]
        gave_up = [line for line in lines if "OutageError" in line and "gave up after" in line]
        assert gave_up and "waiting for the registry (registry.url)" in gave_up[0], lines[-40:]
        assert "recovery.give_up_after_s=20" in gave_up[0]
        print(f"\ngave up {time.monotonic() - started:.0f} s after the start: {gave_up[0]}")
        # A job that is gone: its heartbeat grows old, and scripts/status.py --max-age says so (exit 3).
        time.sleep(6)
        stale = _status(conf, "--max-age", "5s")
        assert stale.returncode == 3 and "STALE" in stale.stderr, stale
    finally:
        setup.proxies["registry"].up()
