"""Snapshots under live writes converge to the source: Debezium's incremental snapshot (signal table, chunks of 50
rows), a blocking snapshot, and a connector restart that snapshots again, each while a writer keeps changing the
table and the continuous job (a process of its own, 2-second trigger, lake on S3) applies what arrives.

A snapshot's read of a row is the row as the chunk's query saw it; a change of the same row can reach Kafka after
the read. The job orders events by the connector's position (app/cdc/position.py), and the lake must end equal to
PostgreSQL value by value, so no read may overwrite a newer change. The hard case is a transaction that straddles
a chunk: it changed rows before the chunk read them and commits after, so its changes stream after the reads with
LSNs lower than the reads' position. The test makes that happen on purpose (a transaction held open across the
snapshot, committed once Kafka holds the reads of its rows) and checks from the topic that it did.
"""
from __future__ import annotations

import dataclasses
import io
import itertools
import json
import random
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fastavro
import psycopg
import pytest
import requests
import yaml
from pyspark.sql import SparkSession

from app.config import JobConfig
from tests.conftest import LOCAL_CONF, RUN_ID
from tests.support.cdc import (
    PG_DSN,
    REGISTRY_URL,
    debezium_connector,
    job_config_for,
    read_topic,
    wait_for_records,
)
from tests.support.jobprocess import Job, kill
from tests.support.pipeline import source_schema
from tests.support.waiting import LakeWatch

pytestmark = [pytest.mark.stack, pytest.mark.slow]

SCHEMA = f"snap_{RUN_ID}"
PREFIX = f"snap{RUN_ID}"
DATABASE = f"snap_{RUN_ID}"
TOPIC = f"{PREFIX}.{SCHEMA}.accounts"
ROWS = 300
CHUNK = 50
DDL = f"""
create schema {SCHEMA};
create table {SCHEMA}.accounts (id int primary key, balance int not null, note text);
insert into {SCHEMA}.accounts select i, 0, 'row ' || i from generate_series(1, {ROWS}) i;
create table {SCHEMA}.debezium_signal (id varchar(64) primary key, type varchar(32) not null, data text);
"""
CONNECTOR = f"snap-{RUN_ID}"
# One row per chunk of 50 (ids 1-300), changed by a transaction held open across the snapshot; and one deleted.
STRADDLING = (10, 60, 110, 160, 210, 260)
STRADDLING_DELETE = 35
CONVERGE_S = 180
_new_ids = itertools.count(10_000)  # the writers' inserted rows, across the module's tests


@dataclasses.dataclass
class Setup:
    config: JobConfig
    job: Job
    process: Any
    pg: psycopg.Connection
    connect: Any


class Writer:
    """Changes the table from a thread of its own until stopped: updates, deletes, inserts of new rows and
    transactions of several statements, about 40 a second, never touching `spared` ids."""

    def __init__(self, spared: set[int]) -> None:
        self.spared = spared
        self.stopped = threading.Event()
        self.transactions = 0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Writer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        self.thread.join(30)
        if self.error is not None:
            raise AssertionError(f"the writer failed: {self.error!r}")

    def _run(self) -> None:
        rng = random.Random(f"{RUN_ID}{time.monotonic_ns()}")
        try:
            with psycopg.connect(PG_DSN, autocommit=True) as pg:
                while not self.stopped.is_set():
                    ids = [i for i in rng.sample(range(1, ROWS + 1), 3) if i not in self.spared]
                    kind = rng.random()
                    with pg.transaction():
                        if kind < 0.6:
                            pg.execute(f"update {SCHEMA}.accounts set balance = balance + 1, note = %s "
                                       f"where id = any(%s)", (f"w{self.transactions}", ids[:1]))
                        elif kind < 0.75:
                            pg.execute(f"delete from {SCHEMA}.accounts where id = any(%s)", (ids[:1],))
                        elif kind < 0.85:
                            pg.execute(f"insert into {SCHEMA}.accounts values (%s, 1, 'new')", (next(_new_ids),))
                        else:  # several rows in one transaction, one of them maybe re-inserted
                            pg.execute(f"update {SCHEMA}.accounts set balance = balance - 1 where id = any(%s)",
                                       (ids,))
                            pg.execute(f"insert into {SCHEMA}.accounts values (%s, 7, 'back') on conflict (id) "
                                       f"do update set note = 'kept'", (ids[-1],))
                    self.transactions += 1
                    time.sleep(0.025)
        except BaseException as e:  # reported by __exit__
            self.error = e


def _job_conf(config: JobConfig, path: Path) -> Path:
    raw = yaml.safe_load(LOCAL_CONF.read_text())
    raw["kafka"].update({"topic_pattern": re.escape(TOPIC), "max_offsets_per_trigger": None})
    raw.pop("sources", None)
    raw["source"] = {"topic_prefix": PREFIX, "framing": "id4", "id_type": "contentId", "snapshot_new_columns": "none",
                     # every full snapshot reads the whole table: the rows one did not read are gone upstream
                     "tables": {f"{SCHEMA}.accounts": {"unread_rows": "delete"}}}
    lake = config.lake
    raw["lake"].update({"database": lake.database, "silver_path": lake.silver_path, "bronze_path": lake.bronze_path,
                        "checkpoint_path": lake.checkpoint_path})
    raw["trigger"] = {"processing_time": "2 seconds"}
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.fixture(scope="module")
def setup(
    spark: SparkSession, local_config: JobConfig, lake_root: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Setup]:
    folder = tmp_path_factory.mktemp("snapshots")
    settings = {"signal.data.collection": f"{SCHEMA}.debezium_signal",
                "incremental.snapshot.chunk.size": str(CHUNK)}
    with source_schema(SCHEMA, DDL) as pg, \
            debezium_connector(CONNECTOR, PREFIX, [SCHEMA], settings=settings) as connect:
        config = job_config_for(local_config, PREFIX, DATABASE, f"{lake_root}/snapshots")
        job = Job(_job_conf(config, folder / "job.yaml"), folder)
        wait_for_records(TOPIC, ROWS)
        process = job.start()
        setup = Setup(config, job, process, pg, connect)
        try:
            _wait_equal(spark, setup, "the initial snapshot")
            yield setup
        finally:
            if process.poll() is None:
                kill(process)


def _differences(spark: SparkSession, setup: Setup) -> str:
    expected = {r[0]: tuple(r) for r in setup.pg.execute(f"select id, balance, note from {SCHEMA}.accounts")}
    try:
        rows = spark.read.format("hudi").load(setup.config.lake.table_path(f"{SCHEMA}_accounts")) \
            .select("id", "balance", "note").collect()
    except Exception:  # not created yet
        rows = []
    actual = {r[0]: tuple(r) for r in rows}
    if actual == expected:
        return ""
    missing, extra = sorted(expected.keys() - actual.keys()), sorted(actual.keys() - expected.keys())
    differing = sorted(k for k in expected.keys() & actual.keys() if expected[k] != actual[k])
    return (f"{len(missing)} missing {missing[:5]}, {len(extra)} extra {extra[:5]}, {len(differing)} differing "
            f"{[(actual[k], expected[k]) for k in differing[:5]]}")


def _wait_equal(spark: SparkSession, setup: Setup, what: str) -> float:
    """Seconds until Silver equals PostgreSQL."""
    started = time.monotonic()
    watch = LakeWatch(spark, setup.config.lake.table_path(f"{SCHEMA}_accounts"))
    found = ""
    while not watch.changed() or (found := _differences(spark, setup)):
        if setup.process.poll() is not None:
            raise AssertionError(f"the job ended ({setup.process.returncode}) before {what}:\n"
                                 + "\n".join(setup.job.log_lines()[-40:]))
        assert time.monotonic() - started < CONVERGE_S, f"not equal {CONVERGE_S} s after {what}: {found}"
        time.sleep(2)
    return time.monotonic() - started


@dataclasses.dataclass(frozen=True)
class Event:
    offset: int
    op: str
    id: int
    snapshot: str
    lsn: int | None
    sequence: tuple[int | None, int | None]


_schemas: dict[int, Any] = {}


def _events(since: int = 0) -> list[Event]:
    """The topic's change events from offset `since`, decoded (0x00 + 4-byte contentId, then Avro)."""
    events = []
    for record in read_topic(TOPIC):
        if record.value is None or record.offset < since:
            continue
        schema_id = int.from_bytes(record.value[1:5], "big")
        if schema_id not in _schemas:
            text = requests.get(f"{REGISTRY_URL}/apis/registry/v3/ids/contentIds/{schema_id}", timeout=10).text
            _schemas[schema_id] = fastavro.parse_schema(json.loads(text))
        event = fastavro.schemaless_reader(io.BytesIO(record.value[5:]), _schemas[schema_id], _schemas[schema_id])
        assert isinstance(event, dict)
        source = event["source"]
        image = event["after"] or event["before"]
        sequence = json.loads(source["sequence"]) if source.get("sequence") else [None, None]
        events.append(Event(record.offset, event["op"], image["id"], source["snapshot"], source["lsn"],
                            tuple(None if s is None else int(s) for s in sequence)))  # type: ignore[arg-type]
    return events


def _end_offset() -> int:
    records = read_topic(TOPIC)
    return max((r.offset for r in records), default=-1) + 1


def _signal(setup: Setup, name: str, kind: str) -> None:
    setup.pg.execute(f"insert into {SCHEMA}.debezium_signal values (%s, 'execute-snapshot', %s)",
                     (f"{name}-{RUN_ID}", json.dumps({"data-collections": [f"{SCHEMA}.accounts"], "type": kind})))


def _wait_reads(ids: set[int], since: int, timeout_s: float = 120) -> list[Event]:
    """The topic's events from `since` once it holds an incremental snapshot's read of every id in `ids`."""
    deadline = time.monotonic() + timeout_s
    while True:
        events = _events(since)
        read = {e.id for e in events if e.op == "r" and e.snapshot == "incremental"}
        if ids <= read:
            return events
        assert time.monotonic() < deadline, f"no snapshot read of {sorted(ids - read)} after {timeout_s} s"
        time.sleep(1)


def _wait_snapshot_end(since: int, timeout_s: float = 120) -> list[Event]:
    """The topic's events from `since` once it holds a blocking or initial snapshot's last read (`last`)."""
    deadline = time.monotonic() + timeout_s
    while True:
        events = _events(since)
        if any(e.op == "r" and e.snapshot == "last" for e in events):
            return events
        assert time.monotonic() < deadline, f"no snapshot's last read after {timeout_s} s"
        time.sleep(1)


def _read_then_changed(events: list[Event]) -> set[int]:
    """The ids whose snapshot read was followed by a change of theirs in the topic."""
    read: set[int] = set()
    changed: set[int] = set()
    for e in events:
        if e.op == "r":
            read.add(e.id)
        elif e.op in ("u", "d", "c") and e.id in read:
            changed.add(e.id)
    return changed


def test_an_incremental_snapshot_under_live_writes_converges(spark: SparkSession, setup: Setup) -> None:
    since = _end_offset()
    held = psycopg.connect(PG_DSN)  # the straddling transaction: open across the snapshot
    try:
        held.execute(f"update {SCHEMA}.accounts set balance = -1, note = 'straddled' where id = any(%s)",
                     (list(STRADDLING),))
        held.execute(f"delete from {SCHEMA}.accounts where id = %s", (STRADDLING_DELETE,))
        with Writer(spared={*STRADDLING, STRADDLING_DELETE}) as writer:
            time.sleep(2)
            signalled = time.monotonic()
            _signal(setup, "incremental", "incremental")
            # Every chunk read its rows of the held transaction before it commits: their old values.
            _wait_reads({*STRADDLING, STRADDLING_DELETE}, since)
            held.commit()
            time.sleep(10)
        events = _events(since)
        took = _wait_equal(spark, setup, "the incremental snapshot")
    finally:
        held.close()
    reads = {e.id: e for e in events if e.op == "r" and e.snapshot == "incremental"}
    assert len(reads) >= ROWS - 50, f"only {len(reads)} rows read by the incremental snapshot"
    # The straddling transaction's changes came after their rows' reads, with lower LSNs than the reads'
    # position: ordered by LSN alone, the reads' old values would have won.
    straddled = [e for e in events if e.id in {*STRADDLING, STRADDLING_DELETE} and e.op in ("u", "d")]
    assert {e.id for e in straddled} == {*STRADDLING, STRADDLING_DELETE}, straddled
    for e in straddled:
        read = reads[e.id]
        assert e.offset > read.offset and e.lsn is not None and read.sequence[1] is not None
        assert e.lsn < read.sequence[1], (e, read)
    changed = _read_then_changed([e for e in events if e.snapshot in ("incremental", "false")])
    assert len(changed - {*STRADDLING, STRADDLING_DELETE}) >= 10, f"only {sorted(changed)} changed after their read"
    print(f"\nincremental snapshot (chunks of {CHUNK}) under {writer.transactions} writer transactions: "
          f"{len(reads)} reads, {len(changed)} rows changed after their read, the straddling transaction's "
          f"{len(straddled)} changes lower in LSN than their reads; equal {took:.1f} s after the writer stopped "
          f"({time.monotonic() - signalled:.1f} s after the signal)")


def test_a_blocking_snapshot_under_live_writes_converges(spark: SparkSession, setup: Setup) -> None:
    since = _end_offset()
    with Writer(spared=set()) as writer:
        time.sleep(2)
        _signal(setup, "blocking", "blocking")
        _wait_snapshot_end(since)
        time.sleep(8)
    took = _wait_equal(spark, setup, "the blocking snapshot")
    events = _events(since)
    reads = [e for e in events if e.op == "r"]
    changed = _read_then_changed(events)
    assert len(changed) >= 10, f"only {sorted(changed)} changed after their read"
    print(f"\nblocking snapshot under {writer.transactions} writer transactions: {len(reads)} reads, "
          f"{len(changed)} rows changed after their read; equal {took:.1f} s after the writer stopped")


def test_a_connector_restart_that_snapshots_again_converges(spark: SparkSession, setup: Setup) -> None:
    """The connector's offsets reset while it is stopped (what a lost offsets topic, or a new connector of the
    same name, gives): it snapshots the table again on resume, then streams on from its slot."""
    since = _end_offset()
    with Writer(spared=set()) as writer:
        time.sleep(2)
        setup.connect.reset_offsets(CONNECTOR)
        time.sleep(3)  # changes made while the connector is stopped reach the lake through the snapshot only
        setup.connect.resume(CONNECTOR)
        _wait_snapshot_end(since)
        time.sleep(8)
    took = _wait_equal(spark, setup, "the connector's second snapshot")
    events = _events(since)
    changed = _read_then_changed(events)
    assert len(changed) >= 10, f"only {sorted(changed)} changed after their read"
    # Rows deleted while the connector was stopped never stream as deletes: the snapshot's end removes them.
    unread = [int(line.split("; ")[1].split()[0]) for line in setup.job.log_lines()
              if "it did not read deleted" in line]
    assert unread and unread[-1] > 0, unread
    print(f"\nconnector restart with its offsets reset, under {writer.transactions} writer transactions: "
          f"{sum(e.op == 'r' for e in events)} reads, {len(changed)} rows changed after their read, {unread[-1]} "
          f"rows it did not read deleted; equal {took:.1f} s after the writer stopped")
