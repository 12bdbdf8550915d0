"""Kill -9 the job at its worst moments, on the real stack, while PostgreSQL keeps changing; nothing is lost or
duplicated.

A workload thread runs transactions on three tables (inserts, updates, deletes, primary-key changes and
transactions spanning tables). The job runs as its own process (`app/main.py`, continuous trigger, small
batches, lake and checkpoint on S3; `events` is Merge-on-Read, compacting every 2 delta commits) and is
killed with SIGKILL again and again, each time restarted:

- in its first minute on an empty lake, at random moments (its first batch creates the tables);
- at every named pause point (devkit/pauses.py): `decode`, `bronze_written`, `dead_letters_written` (a table's dead
  letters committed, its Silver commit not yet), `ledger_written` (a table's delete ledger holds the batch's facts,
  its Silver commit not yet), `between_tables`, `hudi_commit` (inside a Hudi
  commit, markers present) and `tables_committed` (Spark has not recorded the batch: it replays it); and during
  a compaction of `events`, seen on its timeline;
- at random moments mid-batch.

Each kill records what was in flight (inflight instants, marker folders, the tables the batch had committed),
and the test fails unless each named point was reached with its precondition observed. Then the workload
stops, one `--available-now` run catches up, and:
- every Silver table equals its PostgreSQL table, typed and value by value;
- no record key appears twice;
- Bronze holds every Kafka offset of the run exactly once;
- the dead-letter table holds every poison record exactly once: before each kill the test adds three to the
  accounts topic (a JSON value, a real record with bytes appended, one without its key; `Poison`).

A second test kills the job inside the creation of each kind of table (app/sink/creation.py), at the creation points
of jvm/'s pausing file systems, and checks the same at the end.
"""
from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from confluent_kafka import Producer
from pyspark.sql import DataFrame, SparkSession

from app.cdc.columns import LEDGER_FOLDER
from app.config import DeadLetterConfig
from app.sink.bronze import read_bronze
from app.sink.lakefs import fs_and_path, list_files
from app.sink.ledger import ledger_folders, read_ledger
from tests.conftest import LOCAL_CONF, RUN_ID
from tests.support.cdc import KAFKA_BOOTSTRAP, PG_DSN, KafkaRecord, debezium_connector, read_topic, wait_for_records
from tests.support.jobprocess import Job, kill, wait
from tests.support.pipeline import source_schema

pytestmark = [pytest.mark.stack, pytest.mark.slow]
log = logging.getLogger(__name__)

DEAD_LETTER_TABLE = DeadLetterConfig().table
SCHEMA = f"cr_{RUN_ID}"
PREFIX = f"cr{RUN_ID}"
DATABASE = f"cr_{RUN_ID}"
TABLES = ("accounts", "transfers", "events")
NAMED = (
    "decode", "bronze_written", "dead_letters_written", "ledger_written", "between_tables", "hudi_commit",
    "tables_committed", "compaction",
)
# Random moments of the job's first minute on an empty lake (8-40 s after the start, then 0-20 s after the first
# batch's first table line, while it creates the others), every named
# point, a second round of the two inside and after a commit (tables that already hold Merge-on-Read logs), and random
# moments mid-batch: 16 kills.
PLAN = [
    "random_start", *["random_first_batch"] * 2, *NAMED,
    "hudi_commit", "tables_committed", *["random"] * 3,
]

DDL = f"""
create schema {SCHEMA};
create table {SCHEMA}.accounts (id int primary key, owner text not null, balance numeric(12,2), tags text[],
                                updated_at timestamptz);
create table {SCHEMA}.transfers (id bigint primary key, from_id int, to_id int, amount numeric(12,2), note text,
                                 at timestamp);
create table {SCHEMA}.events (id int primary key, kind text, payload jsonb, happened_on date);
insert into {SCHEMA}.accounts select i, 'owner ' || i, i * 10, array['t' || i, null], now()
  from generate_series(1, 30) i;
insert into {SCHEMA}.events select i, 'k' || (i % 3), jsonb_build_object('n', i), date '2024-01-01' + i
  from generate_series(1, 100) i;
"""


class Workload(threading.Thread):
    """Random transactions on the three tables until stopped."""

    def __init__(self, seed: int) -> None:
        super().__init__(daemon=True)
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.transactions = 0
        self.error: BaseException | None = None
        self.next_account = 1000
        self.next_transfer = 1

    def run(self) -> None:
        try:
            with psycopg.connect(PG_DSN) as conn:
                while not self.stop.is_set():
                    with conn.transaction():
                        self.step(conn)
                    self.transactions += 1
                    time.sleep(self.rng.uniform(0.2, 0.8))
        except BaseException as e:  # reported by the test
            self.error = e

    def step(self, conn: psycopg.Connection) -> None:
        s, r = SCHEMA, self.rng.random()
        ids = [row[0] for row in conn.execute(f"select id from {s}.accounts order by id")]
        if r < 0.25 or len(ids) < 5:
            self.next_account += 1
            conn.execute(
                f"insert into {s}.accounts values (%s, %s, %s, %s, now())",
                (self.next_account, f"new {self.next_account}", self.rng.randint(0, 10_000),
                 ["x", None] if self.rng.random() < 0.5 else None),
            )
        elif r < 0.55:  # a transfer: one transaction over two tables
            a, b = self.rng.sample(ids, 2)
            amount = round(self.rng.uniform(1, 100), 2)
            self.next_transfer += 1
            conn.execute(f"insert into {s}.transfers values (%s, %s, %s, %s, %s, now())",
                         (self.next_transfer, a, b, amount, f"t{self.next_transfer}"))
            move = f"update {s}.accounts set balance = balance + %s, updated_at = now() where id = %s"
            conn.execute(move, (-amount, a))
            conn.execute(move, (amount, b))
        elif r < 0.65:
            conn.execute(f"delete from {s}.accounts where id = %s", (self.rng.choice(ids),))
        elif r < 0.72:  # a primary-key change
            self.next_account += 1
            conn.execute(f"update {s}.accounts set id = %s where id = %s", (self.next_account, self.rng.choice(ids)))
        elif r < 0.80:
            conn.execute(f"delete from {s}.transfers where id = (select min(id) from {s}.transfers)")
        elif r < 0.98:
            # events only changes rows of its snapshot: an update of a Merge-on-Read table goes to a log file
            # (inserts would go to its small base file instead), so compactions have work to do.
            conn.execute(f"update {s}.events set payload = payload || '{{\"u\": 1}}', kind = 'upd' "
                         f"where id = (select id from {s}.events order by random() limit 1)")
        else:
            conn.execute(f"delete from {s}.events where id = (select id from {s}.events order by random() limit 1)")


@dataclass
class Kill:
    n: int
    point: str
    landed: str = ""
    observed: dict[str, Any] = field(default_factory=dict)


@pytest.fixture(scope="module")
def pg_conn(stack: None) -> Iterator[psycopg.Connection]:
    with source_schema(SCHEMA, DDL) as conn:
        yield conn


def job_conf(
    lake: str, path: Path, max_offsets: int | None, *, prefix: str = PREFIX, database: str = DATABASE,
    tables: dict[str, Any] | None = None, spark_conf: dict[str, str] | None = None,
    lake_settings: dict[str, Any] | None = None,
) -> Path:
    """conf/local.yaml pointed at one test's topics and lake; small batches while killing, none at the end."""
    raw = yaml.safe_load(LOCAL_CONF.read_text())
    raw["kafka"].update({"topic_pattern": prefix + r"\.[^.]+\.[^.]+", "max_offsets_per_trigger": max_offsets})
    raw.pop("sources", None)  # the demo's two sources: this test reads one connector's envelopes
    raw["source"] = {"topic_prefix": prefix, "framing": "id4", "id_type": "contentId"}
    raw["lake"].update({
        "database": database, "silver_path": f"{lake}/silver", "bronze_path": f"{lake}/bronze",
        "checkpoint_path": f"{lake}/checkpoint", **(lake_settings or {}),
    })
    raw["trigger"] = {"processing_time": "1 second"}
    raw["tables"] = tables if tables is not None else {
        f"{SCHEMA}.events": {"table_type": "MERGE_ON_READ", "compaction_delta_commits": 2}
    }
    raw["spark"]["conf"].update(spark_conf or {})
    path.write_text(yaml.safe_dump(raw))
    return path


def in_flight(
    spark: SparkSession, silver: str, tables: tuple[str, ...] = TABLES, database: str = DATABASE, schema: str = SCHEMA
) -> dict[str, Any]:
    """Per Silver table: instants requested or inflight but not completed, and marker folders."""
    state: dict[str, Any] = {}
    for table in tables:
        path = f"{silver}/{database}/{schema}_{table}"
        timeline = [n for n in list_files(spark, f"{path}/.hoodie/timeline") if "/" not in n]
        completed = {n.split("_")[0] for n in timeline if "_" in n.split(".")[0]}
        pending = sorted(n for n in timeline if n.split(".")[0].split("_")[0] not in completed)
        markers = sorted({f.split("/")[0] for f in list_files(spark, f"{path}/.hoodie/.temp")})
        created = fs_and_path(spark, f"{path}/.hoodie")[0].exists(fs_and_path(spark, f"{path}/.hoodie")[1])
        state[table] = {"pending": pending, "markers": markers, "completed": len(completed), "created": created}
    return state


def precondition(point: str, reached: dict[str, Any], state: dict[str, Any]) -> bool:
    """What must be true at the moment of the kill for it to count as that point."""
    if point == "hudi_commit":
        instant = reached["instant"]
        accounts = state["accounts"]
        return any(p.startswith(instant) for p in accounts["pending"]) and instant in accounts["markers"]
    if point == "between_tables":
        return bool(reached["committed"]) and bool(reached["remaining"])
    if point == "dead_letters_written":  # the batch's dead letters committed, its table's commit not yet
        return reached["batch_id"] in state["dead_letter_batches"]
    if point == "ledger_written":  # a complete folder of the batch's facts
        return any(f.startswith(f"b{reached['batch_id']:012d}-") for f in state["ledger"])
    if point == "tables_committed":
        return bool(reached["committed"])
    return "batch_id" in reached


def dead_letters(spark: SparkSession, silver: str) -> DataFrame:
    return spark.read.format("hudi").load(f"{silver}/{DATABASE}/{DEAD_LETTER_TABLE}")


class Poison:
    """Records the job cannot apply, produced into the accounts topic between kills: a JSON value (its framing
    fails), a copy of a real record with two bytes appended (more than its writer schema reads) and one without
    its key (the table's key comes from the Debezium key). Remembers their offsets."""

    def __init__(self) -> None:
        self.topic = f"{PREFIX}.{SCHEMA}.accounts"
        self.producer = Producer({"bootstrap.servers": KAFKA_BOOTSTRAP, "enable.idempotence": True})
        self.sample: KafkaRecord | None = None
        self.produced: set[str] = set()

    def produce(self, n: int) -> None:
        if self.sample is None:
            self.sample = next(r for r in read_topic(self.topic, min_records=1) if r.value is not None)
        sample = self.sample
        for key, value in ((sample.key, b'{"poison": %d}' % n), (sample.key, (sample.value or b"") + b"\x02\x04"),
                           (None, sample.value)):
            self.producer.produce(self.topic, key=key, value=value, on_delivery=self._delivered)
        assert self.producer.flush(30) == 0

    def _delivered(self, err: Any, msg: Any) -> None:
        assert err is None, err
        self.produced.add(f"{msg.topic()}/{msg.partition()}/{msg.offset()}")


def silver_rows(spark: SparkSession, silver: str, table: str) -> DataFrame:
    return spark.read.format("hudi").load(f"{silver}/{DATABASE}/{SCHEMA}_{table}")


# Per table: key, PostgreSQL query, Silver expressions (typed values compared as text or epoch microseconds).
COMPARE: dict[str, tuple[str, str, list[str]]] = {
    "accounts": ("id", "select id, owner, balance::text, tags, (extract(epoch from updated_at) * 1e6)::bigint "
                       "from {s}.accounts",
                 ["id", "owner", "cast(balance as string)", "tags", "unix_micros(updated_at)"]),
    "transfers": ("id", "select id, from_id, to_id, amount::text, note, (extract(epoch from at) * 1e6)::bigint "
                        "from {s}.transfers",
                  ["id", "from_id", "to_id", "cast(amount as string)", "note", "unix_micros(at)"]),
    "events": ("id", "select id, kind, payload::text, happened_on from {s}.events",
               ["id", "kind", "payload", "happened_on"]),
}


@pytest.mark.timeout(2400)  # 16 kills and restarts, each bounded (kill_once); about 13 min alone
def test_kill_9_at_every_point_loses_and_duplicates_nothing(
    spark: SparkSession, pg_conn: psycopg.Connection, lake_root: str, test_dir: Path
) -> None:
    folder = test_dir / "crash"
    folder.mkdir()
    lake = f"{lake_root}/crash"
    silver = f"{lake}/silver"
    job = Job(job_conf(lake, folder / "job.yaml", 200), folder)
    rng = random.Random(RUN_ID)
    kills: list[Kill] = []
    poison = Poison()
    with debezium_connector(f"cr-{RUN_ID}", PREFIX, [SCHEMA]):
        workload = Workload(seed=int(RUN_ID, 16))
        workload.start()
        try:
            for n, point in enumerate(PLAN, start=1):
                poison.produce(n)
                kills.append(kill_once(spark, job, silver, Kill(n, point), rng))
                log.warning("kill %d at %s: %s %s", n, point, kills[-1].landed, kills[-1].observed)
        finally:
            workload.stop.set()
            workload.join(30)
        assert workload.error is None, workload.error

        # Catch up, in one uncapped batch: every offset now in Kafka.
        process = job.start(available_now=True, conf=job_conf(lake, folder / "final.yaml", None))
        assert process.wait(900) == 0, "\n".join(job.log_lines()[-40:])

    report = "\n".join(f"kill {k.n:2d} {k.point:16s} {k.landed}  {json.dumps(k.observed)}" for k in kills)
    print(f"\n{len(kills)} kills, {workload.transactions} source transactions\n{report}")
    compared = {}
    for table, (key, sql, columns) in COMPARE.items():
        df = silver_rows(spark, silver, table)
        assert df.count() == df.select(key).distinct().count(), f"{table}: a record key appears twice"
        actual = sorted(tuple(r) for r in df.selectExpr(*columns).collect())
        expected = sorted(tuple(r) for r in pg_conn.execute(sql.format(s=SCHEMA)).fetchall())
        assert actual == expected, f"{table}: Silver differs from PostgreSQL"
        compared[table] = len(expected)

    bronze = read_bronze(spark, f"{lake}/bronze")
    assert bronze is not None
    held = [(r.topic, r.partition, r.offset) for r in bronze.select("topic", "partition", "offset").collect()]
    kafka = {(r.topic, r.partition, r.offset) for t in TABLES for r in read_topic(f"{PREFIX}.{SCHEMA}.{t}")}
    assert len(held) == len(set(held)), "an offset is in Bronze twice"
    assert set(held) == kafka, f"Bronze misses {len(kafka - set(held))} offsets, has {len(set(held) - kafka)} extra"
    print(f"rows compared: {compared}; Kafka offsets in Bronze exactly once: {len(kafka)}")

    dead = [r.dead_letter_id for r in dead_letters(spark, silver).select("dead_letter_id").collect()]
    assert len(dead) == len(set(dead)), "a record is in the dead letters twice"
    assert set(dead) == poison.produced, (
        f"dead letters miss {sorted(poison.produced - set(dead))}, have extra {sorted(set(dead) - poison.produced)}"
    )
    print(f"poison records in the dead letters exactly once: {len(dead)}")

    missed = [p for p in NAMED if not any(k.point == p and k.landed == "hit" for k in kills)]
    assert not missed, f"named points never hit with their precondition: {missed}\n{report}"


def not_reached(job: Job, point: str, seconds: int) -> AssertionError:
    """A kill whose moment never came: the job stalled (or never got there), which fails the test at once, with the
    job's last log lines, rather than after every later kill has waited as long."""
    return AssertionError(f"run {job.runs}: {point} not reached in {seconds} s; the job's last lines:\n"
                          + "\n".join(job.log_lines()[-40:]))


def kill_once(spark: SparkSession, job: Job, silver: str, k: Kill, rng: random.Random) -> Kill:
    armed = k.point if k.point in ("decode", "bronze_written", "dead_letters_written", "ledger_written",
                                   "between_tables", "hudi_commit", "tables_committed") else ""
    process = job.start(armed, table=f"{DATABASE}/{SCHEMA}_accounts")  # Copy-on-Write (devkit/pauses.py)
    try:
        if armed:
            reached_file = wait(lambda: job.pause_file(armed).exists(), process, 300, armed, job)
            if not reached_file:
                raise not_reached(job, armed, 300)
            reached = json.loads(job.pause_file(armed).read_text())
            state = in_flight(spark, silver)
            if armed == "ledger_written":
                table = reached["table"].split(".", 1)[1]
                state["ledger"] = ledger_folders(spark, f"{silver}/{DATABASE}/{LEDGER_FOLDER}/{table}")[0]
            if armed == "dead_letters_written":
                state["dead_letter_batches"] = sorted(
                    r.batch_id for r in dead_letters(spark, silver).select("batch_id").distinct().collect()
                )
            k.observed = {"reached": reached, "in_flight": state}
            k.landed = "hit" if precondition(armed, reached, state) else "precondition not observed"
        elif k.point == "compaction":
            timeline = f"{silver}/{DATABASE}/{SCHEMA}_events/.hoodie/timeline"

            def compacting() -> Any:  # an inflight compaction not completed yet
                names = list_files(spark, timeline)
                done = {n.split("_")[0] for n in names if "_" in n.split(".")[0]}
                return [n for n in names if n.endswith(".compaction.inflight") and n.split(".")[0] not in done]
            if not wait(compacting, process, 420, "a compaction", job):
                raise not_reached(job, "a compaction", 420)
            k.observed = {"in_flight": in_flight(spark, silver)}
            k.landed = "hit"
        elif k.point in ("random_start", "random_first_batch"):
            # 8-40 s after the process started, as a user's kill would land; or 0-20 s after the first batch's
            # first table line, while the first batch writes (and creates) the other tables.
            if k.point == "random_first_batch":
                wait(lambda: any("batch=" in line for line in job.log_lines()), process, 300, "a batch", job)
                wait_s = rng.uniform(0, 20)
            else:
                wait_s = rng.uniform(8, 40) - (time.monotonic() - job.started)
            time.sleep(max(0.0, wait_s))
            state = in_flight(spark, silver)
            creating = [t for t, s in state.items() if s["created"] and not s["completed"]]
            k.observed = {"after_s": round(time.monotonic() - job.started, 1), "in_flight": state}
            k.landed = f"random, creating {','.join(creating)}" if creating else "random"
        else:  # random: some moment after a batch began
            wait(lambda: any("batch=" in line for line in job.log_lines()), process, 300, "a batch", job)
            time.sleep(rng.uniform(0.5, 15))
            lines = [line for line in job.log_lines() if "batch=" in line]
            k.observed = {"last_batch_line": lines[-1][-160:] if lines else None, "in_flight": in_flight(spark, silver)}
            k.landed = "random"
    finally:
        if process.poll() is None:
            kill(process)
    return k


# Kills inside the creation of each kind of table, through the whole job on S3 (app/sink/creation.py).
C_SCHEMA = f"cc_{RUN_ID}"
C_PREFIX = f"cc{RUN_ID}"
C_DATABASE = f"cc_{RUN_ID}"
# Written in this order within a batch (plans are sorted by topic), so each table is still new when its kills
# come: a Copy-on-Write table, a Merge-on-Read table, a partitioned table (record-level index) and d_led, whose
# deletes go to its delete ledger (Parquet folders, app/sink/ledger.py; killed at `ledger_written` by the test above).
C_TABLES = ("a_cow", "b_mor", "c_part", "d_led")
C_DDL = f"""
create schema {C_SCHEMA};
create table {C_SCHEMA}.a_cow (id int primary key, name text, tags text[], amount numeric(12,2));
create table {C_SCHEMA}.b_mor (id int primary key, kind text, payload jsonb);
create table {C_SCHEMA}.c_part (id int primary key, region text not null, at timestamptz);
create table {C_SCHEMA}.d_led (id int primary key, name text);
insert into {C_SCHEMA}.a_cow select i, 'n' || i, array['t' || i, null], i * 1.5 from generate_series(1, 40) i;
insert into {C_SCHEMA}.b_mor select i, 'k' || (i % 3), jsonb_build_object('n', i) from generate_series(1, 40) i;
insert into {C_SCHEMA}.c_part
  select i, (array['eu', 'us', 'apac'])[i % 3 + 1], timestamptz '2024-01-01' + i * interval '1 day'
  from generate_series(1, 40) i;
insert into {C_SCHEMA}.d_led select i, 'n' || i from generate_series(1, 40) i;
"""
# After the snapshot: updates of every table, a partition move, a primary-key change and deletes (d_led's make
# its ledger).
C_CHANGES = f"""
update {C_SCHEMA}.a_cow set amount = amount + 1, tags = array[null, 'u'] where id <= 10;
delete from {C_SCHEMA}.a_cow where id in (11, 12);
update {C_SCHEMA}.a_cow set id = 100 where id = 13;
update {C_SCHEMA}.b_mor set payload = payload || '{{"u": 1}}' where id % 4 = 0;
update {C_SCHEMA}.c_part set region = 'eu' where region = 'us' and id < 20;
delete from {C_SCHEMA}.c_part where id = 5;
delete from {C_SCHEMA}.d_led where id % 5 = 0;
update {C_SCHEMA}.d_led set name = 'u' || id where id % 7 = 0;
"""
# Records per topic once the changes are in: snapshot, changes, a tombstone after each delete (3 for the key change).
C_RECORDS = {"a_cow": 40 + 10 + 2 * 2 + 3, "b_mor": 40 + 10, "c_part": 40 + 7 + 2, "d_led": 40 + 2 * 8 + 4}
C_COMPARE: dict[str, tuple[str, str, list[str]]] = {
    "a_cow": ("id", "select id, name, tags, amount::text from {s}.a_cow",
              ["id", "name", "tags", "cast(amount as string)"]),
    "b_mor": ("id", "select id, kind, payload::text from {s}.b_mor", ["id", "kind", "payload"]),
    "c_part": ("id", "select id, region, (extract(epoch from at) * 1e6)::bigint from {s}.c_part",
               ["id", "region", "unix_micros(at)"]),
    "d_led": ("id", "select id, name from {s}.d_led", ["id", "name"]),
}
C_TABLE_CONF = {
    f"{C_SCHEMA}.b_mor": {"table_type": "MERGE_ON_READ"},
    f"{C_SCHEMA}.c_part": {"partition_by": "region"},
}
# Every table keeps a metadata table (the non-partitioned ones too: their creation has that step then), and the
# tables are created one after another, in CREATION_PLAN's order (a creation paused on one writer thread would let
# the others create the remaining tables before the kill).
C_LAKE_SETTINGS = {"metadata_table": "all", "table_writers": 1}
# jvm/'s io.cdclake.testing file systems: they pause before a given file of a table's creation is created.
PAUSING_FS = {
    "spark.hadoop.fs.s3a.impl": "io.cdclake.testing.PausingS3AFileSystem",
    "spark.hadoop.fs.file.impl": "io.cdclake.testing.PausingLocalFileSystem",
}
# (point, table): every creation point of each kind of table, in the order the job reaches them.
CREATION_PLAN = [
    ("create_layout", "a_cow"), ("create_metadata", "a_cow"), ("create_first_commit", "a_cow"),
    ("create_layout", "b_mor"), ("create_metadata", "b_mor"), ("create_first_commit", "b_mor"),
    ("create_layout", "c_part"), ("create_record_index", "c_part"), ("create_first_commit", "c_part"),
]


def creation_state(spark: SparkSession, path: str) -> dict[str, bool]:
    """What a table folder holds, as the creation points' preconditions name it."""
    files = list_files(spark, path)
    timeline = [f.removeprefix(".hoodie/timeline/") for f in files if f.startswith(".hoodie/timeline/")]
    timeline = [f for f in timeline if "/" not in f]
    metadata = [f.removeprefix(".hoodie/metadata/.hoodie/timeline/") for f in files
                if f.startswith(".hoodie/metadata/.hoodie/timeline/")]
    fs, meta = fs_and_path(spark, f"{path}/.hoodie")
    return {
        "created": bool(fs.exists(meta)),
        "properties": ".hoodie/hoodie.properties" in files or ".hoodie/hoodie.properties.backup" in files,
        "completed": any("_" in f.split(".")[0] for f in timeline),
        "pending": any(f.endswith((".requested", ".inflight")) for f in timeline),
        "metadata_files_done": any(f.startswith("00000000000000000_") for f in metadata),
        "metadata_pending": any(f.endswith(".inflight") and "_" not in f.split(".")[0] for f in metadata),
        "data": any(f.endswith(".parquet") and not f.startswith(".hoodie/") for f in files),
    }


# What each point must find in the table when the job is killed there.
CREATION_PRECONDITION: dict[str, dict[str, bool]] = {
    "create_layout": {"created": True, "properties": False, "completed": False},
    "create_metadata": {"properties": True, "pending": True, "metadata_pending": True, "completed": False,
                        "data": False},
    "create_record_index": {"properties": True, "pending": True, "metadata_files_done": True, "completed": False,
                            "data": False},
    "create_first_commit": {"properties": True, "pending": True, "completed": False, "data": True},
}


@pytest.fixture(scope="module")
def creation_source(stack: None) -> Iterator[psycopg.Connection]:
    with source_schema(C_SCHEMA, C_DDL) as conn:
        yield conn


def test_kill_9_inside_table_creation_is_repaired_on_restart(
    spark: SparkSession, creation_source: psycopg.Connection, lake_root: str, test_dir: Path
) -> None:
    folder = test_dir / "crash-creation"
    folder.mkdir()
    lake = f"{lake_root}/crash-creation"
    silver = f"{lake}/silver"
    paths = {t: f"{silver}/{C_DATABASE}/{C_SCHEMA}_{t}" for t in C_TABLES}
    conf = job_conf(lake, folder / "job.yaml", None, prefix=C_PREFIX, database=C_DATABASE, tables=C_TABLE_CONF,
                    spark_conf=PAUSING_FS, lake_settings=C_LAKE_SETTINGS)
    job = Job(conf, folder)
    kills: list[Kill] = []
    with debezium_connector(f"cc-{RUN_ID}", C_PREFIX, [C_SCHEMA]):
        for t in C_TABLES:
            wait_for_records(f"{C_PREFIX}.{C_SCHEMA}.{t}", 40, timeout_s=120)
        creation_source.execute(C_CHANGES)
        # Every change in Kafka before the job starts: each run replays one batch 0 holding all of them.
        for t, count in C_RECORDS.items():
            wait_for_records(f"{C_PREFIX}.{C_SCHEMA}.{t}", count, timeout_s=120)
        for n, (point, table) in enumerate(CREATION_PLAN, start=1):
            k = Kill(n, f"{point}:{table}")
            end = paths[table].split("/silver/", 1)[1]  # <database>/<table>
            process = job.start(point, available_now=True, table=end)
            try:
                if wait(lambda: job.pause_file(point).exists(), process, 300, point, job):  # noqa: B023
                    state = creation_state(spark, paths[table])
                    expected = CREATION_PRECONDITION[point]
                    k.observed = {"reached": json.loads(job.pause_file(point).read_text())["path"], "state": state}
                    k.landed = "hit" if all(state[c] == v for c, v in expected.items()) else "precondition not observed"
                else:
                    raise not_reached(job, point, 300)
            finally:
                if process.poll() is None:
                    kill(process)
            kills.append(k)
            log.warning("creation kill %d at %s: %s %s", n, k.point, k.landed, k.observed)
        process = job.start(available_now=True)
        assert process.wait(900) == 0, "\n".join(job.log_lines()[-40:])
        runs = job.runs

    report = "\n".join(f"kill {k.n:2d} {k.point:32s} {k.landed}  {json.dumps(k.observed)}" for k in kills)
    print(f"\n{len(kills)} kills inside table creation\n{report}")
    missed = [k.point for k in kills if k.landed != "hit"]
    assert not missed, f"creation points not hit with their precondition: {missed}\n{report}"

    # The job's repair named what it removed, after each kill that left nothing committed.
    repairs = [
        line for run in range(1, runs + 1) for line in (folder / f"job-{run}.log").read_text(errors="replace")
        .splitlines() if "creation at" in line and "was interrupted" in line
    ]
    repaired_tables = {t for t in C_TABLES for line in repairs if paths[t] + " " in line}
    assert repaired_tables == {table for _, table in CREATION_PLAN}, repairs

    compared = {}
    for table, (key, sql, columns) in C_COMPARE.items():
        df = spark.read.format("hudi").load(paths[table])
        assert df.count() == df.select(key).distinct().count(), f"{table}: a record key appears twice"
        actual = sorted(tuple(r) for r in df.selectExpr(*columns).collect())
        expected_rows = sorted(tuple(r) for r in creation_source.execute(sql.format(s=C_SCHEMA)).fetchall())
        assert actual == expected_rows, f"{table}: Silver differs from PostgreSQL"
        compared[table] = len(expected_rows)
    ledger_df = read_ledger(spark, f"{silver}/{C_DATABASE}/{LEDGER_FOLDER}/{C_SCHEMA}_d_led", ["id"])
    assert ledger_df is not None
    ledger_keys = {json.loads(r["_cdc_ledger_key"])["id"] for r in ledger_df.collect()}
    assert ledger_keys == {i for i in range(1, 41) if i % 5 == 0}, sorted(ledger_keys)

    bronze = read_bronze(spark, f"{lake}/bronze")
    assert bronze is not None
    held = [(r.topic, r.partition, r.offset) for r in bronze.select("topic", "partition", "offset").collect()]
    kafka = {(r.topic, r.partition, r.offset) for t in C_TABLES for r in read_topic(f"{C_PREFIX}.{C_SCHEMA}.{t}")}
    assert len(held) == len(set(held)), "an offset is in Bronze twice"
    assert set(held) == kafka, f"Bronze misses {len(kafka - set(held))} offsets, has {len(set(held) - kafka)} extra"
    print(f"rows compared: {compared}; ledger keys {len(ledger_keys)}; Kafka offsets in Bronze exactly once: "
          f"{len(kafka)}")
