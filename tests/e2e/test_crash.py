"""Kill -9 the job at its worst moments, on the real stack, while PostgreSQL keeps changing; nothing is lost or
duplicated.

A workload thread runs transactions on three tables (inserts, updates, deletes, primary-key changes and
transactions spanning tables). The job runs as its own process (`app/main.py`, continuous trigger, small
batches, lake and checkpoint on S3; `events` is Merge-on-Read, compacting every 2 delta commits) and is
killed with SIGKILL again and again, each time restarted:

- at every named pause point (app/pause.py): `decode`, `bronze_written`, `between_tables`, `hudi_commit`
  (inside a Hudi commit, markers present) and `tables_committed` (Spark has not recorded the batch: it
  replays it); and during a compaction of `events`, seen on its timeline;
- at random moments mid-batch.

Each kill records what was in flight (inflight instants, marker folders, the tables the batch had committed),
and the test fails unless each named point was reached with its precondition observed. Then the workload
stops, one `--available-now` run catches up, and:
- every Silver table equals its PostgreSQL table, typed and value by value;
- no record key appears twice;
- Bronze holds every Kafka offset of the run exactly once.
"""
from __future__ import annotations

import json
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from pyspark.sql import DataFrame, SparkSession

from app.bronze import read_bronze
from app.lakefs import list_files
from tests.conftest import LOCAL_CONF, ROOT, RUN_ID
from tests.support.cdc import PG_DSN, debezium_connector, read_topic
from tests.support.pipeline import source_schema

pytestmark = [pytest.mark.stack, pytest.mark.slow]
log = logging.getLogger(__name__)

SCHEMA = f"cr_{RUN_ID}"
PREFIX = f"cr{RUN_ID}"
DATABASE = f"cr_{RUN_ID}"
TABLES = ("accounts", "transfers", "events")
NAMED = ("decode", "bronze_written", "between_tables", "hudi_commit", "tables_committed", "compaction")
# Every named point, a second round of the in-batch ones, and random moments: 15 kills at least.
PLAN = [*NAMED, "decode", "between_tables", "hudi_commit", "tables_committed", *["random"] * 5]

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


def job_conf(lake: str, path: Path, max_offsets: int | None) -> Path:
    """conf/local.yaml pointed at this test's topics and lake; small batches while killing, none at the end."""
    raw = yaml.safe_load(LOCAL_CONF.read_text())
    raw["kafka"].update({"topic_pattern": PREFIX + r"\.[^.]+\.[^.]+", "max_offsets_per_trigger": max_offsets})
    raw.pop("sources", None)  # the demo's two sources: this test reads one connector's envelopes
    raw["source"] = {"topic_prefix": PREFIX, "framing": "id4", "id_type": "contentId"}
    raw["lake"].update({
        "database": DATABASE, "silver_path": f"{lake}/silver", "bronze_path": f"{lake}/bronze",
        "checkpoint_path": f"{lake}/checkpoint",
    })
    raw["trigger"] = {"processing_time": "1 second"}
    raw["tables"] = {f"{SCHEMA}.events": {"table_type": "MERGE_ON_READ", "compaction_delta_commits": 2}}
    path.write_text(yaml.safe_dump(raw))
    return path


class Job:
    """The job as its own process (and JVM), killed with SIGKILL."""

    def __init__(self, conf: Path, folder: Path) -> None:
        self.conf = conf
        self.folder = folder
        self.runs = 0

    def start(
        self, points: str = "", available_now: bool = False, conf: Path | None = None
    ) -> subprocess.Popen[bytes]:
        self.runs += 1
        pauses = self.folder / f"pauses-{self.runs}"
        pauses.mkdir()
        env = {
            **os.environ, "CDC_PAUSE_AT": points, "CDC_PAUSE_DIR": str(pauses),
            "CDC_PAUSE_TABLE": f"{DATABASE}/{SCHEMA}_accounts",  # Copy-on-Write (app/pause.py)
        }
        args = [sys.executable, "app/main.py", "--conf", str(conf or self.conf)]
        args += ["--available-now"] if available_now else []
        self.log = self.folder / f"job-{self.runs}.log"
        return subprocess.Popen(
            args, cwd=ROOT, env=env, stdout=self.log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True
        )

    def pause_file(self, point: str) -> Path:
        return self.folder / f"pauses-{self.runs}" / f"{point}.json"

    def log_lines(self) -> list[str]:
        return self.log.read_text(errors="replace").splitlines()


def in_flight(spark: SparkSession, silver: str) -> dict[str, Any]:
    """Per Silver table: instants requested or inflight but not completed, and marker folders."""
    state: dict[str, Any] = {}
    for table in TABLES:
        path = f"{silver}/{DATABASE}/{SCHEMA}_{table}"
        timeline = [n for n in list_files(spark, f"{path}/.hoodie/timeline") if "/" not in n]
        completed = {n.split("_")[0] for n in timeline if "_" in n.split(".")[0]}
        pending = sorted(n for n in timeline if n.split(".")[0].split("_")[0] not in completed)
        markers = sorted({f.split("/")[0] for f in list_files(spark, f"{path}/.hoodie/.temp")})
        state[table] = {"pending": pending, "markers": markers, "completed": len(completed)}
    return state


def wait(condition: Any, process: subprocess.Popen[bytes], timeout_s: float, what: str, job: Job) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if process.poll() is not None:
            raise AssertionError(f"the job ended ({process.returncode}) waiting for {what}:\n"
                                 + "\n".join(job.log_lines()[-30:]))
        if time.monotonic() > deadline:
            return None
        time.sleep(0.1)


def kill(process: subprocess.Popen[bytes]) -> None:
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(60)


def precondition(point: str, reached: dict[str, Any], state: dict[str, Any]) -> bool:
    """What must be true at the moment of the kill for it to count as that point."""
    if point == "hudi_commit":
        instant = reached["instant"]
        accounts = state["accounts"]
        return any(p.startswith(instant) for p in accounts["pending"]) and instant in accounts["markers"]
    if point == "between_tables":
        return bool(reached["committed"]) and bool(reached["remaining"])
    if point == "tables_committed":
        return bool(reached["committed"])
    return "batch_id" in reached


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
    with debezium_connector(f"cr-{RUN_ID}", PREFIX, [SCHEMA]):
        workload = Workload(seed=int(RUN_ID, 16))
        workload.start()
        try:
            for n, point in enumerate(PLAN, start=1):
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

    missed = [p for p in NAMED if not any(k.point == p and k.landed == "hit" for k in kills)]
    assert not missed, f"named points never hit with their precondition: {missed}\n{report}"
    assert len(kills) >= 15


def kill_once(spark: SparkSession, job: Job, silver: str, k: Kill, rng: random.Random) -> Kill:
    armed = k.point if k.point in ("decode", "bronze_written", "between_tables", "hudi_commit",
                                   "tables_committed") else ""
    process = job.start(armed)
    try:
        if armed:
            reached_file = wait(lambda: job.pause_file(armed).exists(), process, 300, armed, job)
            if not reached_file:
                k.landed = "not reached in 300 s"
                return k
            reached = json.loads(job.pause_file(armed).read_text())
            state = in_flight(spark, silver)
            k.observed = {"reached": reached, "in_flight": state}
            k.landed = "hit" if precondition(armed, reached, state) else "precondition not observed"
        elif k.point == "compaction":
            timeline = f"{silver}/{DATABASE}/{SCHEMA}_events/.hoodie/timeline"

            def compacting() -> Any:  # an inflight compaction not completed yet
                names = list_files(spark, timeline)
                done = {n.split("_")[0] for n in names if "_" in n.split(".")[0]}
                return [n for n in names if n.endswith(".compaction.inflight") and n.split(".")[0] not in done]
            found = wait(compacting, process, 420, "a compaction", job)
            k.observed = {"in_flight": in_flight(spark, silver)}
            k.landed = "hit" if found else "no compaction seen in 420 s"
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
