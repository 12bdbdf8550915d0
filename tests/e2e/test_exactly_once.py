"""Replays are harmless, on the real stack (PostgreSQL -> Debezium -> Kafka -> the job -> Hudi + Bronze on S3).

- Spark replays a batch it ran but had not recorded (its `commits/<n>` entry gone, as after a kill between the
  Silver commits and Spark's own): every table finds the batch's offsets on its timeline and skips it, Bronze
  finds them in complete ranges and writes nothing.
- The checkpoint is lost: the job resumes after the offsets the tables committed, not from `earliest`; the
  first batch holds only the records written since.
- A batch's tables are written from two writer threads at once (`lake.table_writers`), twice: the first time each
  commits its offsets, the second time each finds them on its timeline; the job's own run then writes those
  offsets to Bronze only.
- One table's write fails while the other's thread goes on: the batch raises the failure naming that table and
  its step, the other table commits; the next run writes the failed table and skips the committed one.
Afterwards every Silver table equals PostgreSQL and Bronze holds every Kafka offset exactly once.

Phases build on each other and run in file order.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from pyspark.sql import SparkSession

from app.batch.plan import TablePlan
from app.batch.processor import BatchProcessor
from app.batch.writer import Step
from app.config import JobConfig
from app.errors import SinkWriteError
from app.hooks import Hooks
from app.sink.bronze import read_bronze
from app.sink.hudi import completed_instants
from app.sink.lakefs import delete_path, list_files
from app.state.resume import committed_offsets, kafka_partitions, starting_offsets_json
from tests.conftest import RUN_ID
from tests.support.cdc import debezium_connector, job_config_for, read_topic
from tests.support.pipeline import Pipeline as JobPipeline
from tests.support.pipeline import source_schema

pytestmark = [pytest.mark.stack, pytest.mark.slow]

SCHEMA = f"xo_{RUN_ID}"
PREFIX = f"xo{RUN_ID}"
DATABASE = f"xo_{RUN_ID}"
TABLES = ("items", "notes")

DDL = f"""
create schema {SCHEMA};
create table {SCHEMA}.items (id int primary key, name text, qty int);
create table {SCHEMA}.notes (id int primary key, body text);
insert into {SCHEMA}.items select i, 'item ' || i, i from generate_series(1, 20) i;
insert into {SCHEMA}.notes select i, 'note ' || i from generate_series(1, 5) i;
"""


class Pipeline(JobPipeline):
    def run(self) -> None:
        self.processor.history.clear()
        super().run()

    def path(self, table: str) -> str:
        return self.config.lake.table_path(f"{SCHEMA}_{table}")

    def rows(self, table: str) -> set[tuple[Any, ...]]:
        df = self.spark.read.format("hudi").load(self.path(table))
        columns = ["id", "name", "qty"] if table == "items" else ["id", "body"]
        return {tuple(r) for r in df.select(*columns).collect()}

    def commits(self, table: str) -> list[str]:
        return completed_instants(self.spark, self.path(table))


@pytest.fixture(scope="module")
def pg_conn(stack: None) -> Iterator[psycopg.Connection]:
    with source_schema(SCHEMA, DDL) as conn:
        yield conn


@pytest.fixture(scope="module")
def pipeline(
    spark: SparkSession, local_config: JobConfig, pg_conn: psycopg.Connection, lake_root: str
) -> Iterator[Pipeline]:
    with debezium_connector(f"xo-{RUN_ID}", PREFIX, [SCHEMA]):
        config = job_config_for(local_config, PREFIX, DATABASE, f"{lake_root}/exactly_once")
        yield Pipeline.of(spark, config)


def topic(table: str) -> str:
    return f"{PREFIX}.{SCHEMA}.{table}"


def kafka_offsets(counts: dict[str, int]) -> set[tuple[str, int, int]]:
    """Every (topic, partition, offset) of the tables' topics, once each topic holds at least `counts[table]`."""
    found = set()
    for table, count in counts.items():
        deadline = time.monotonic() + 90
        while len(records := read_topic(topic(table))) < count:
            assert time.monotonic() < deadline, f"{topic(table)}: {len(records)} records, expected {count}"
            time.sleep(0.5)
        found |= {(r.topic, r.partition, r.offset) for r in records}
    return found


def assert_lake_equals_source(p: Pipeline, conn: psycopg.Connection, offsets: set[tuple[str, int, int]]) -> None:
    assert p.rows("items") == {tuple(r) for r in conn.execute(f"select id, name, qty from {SCHEMA}.items")}
    assert p.rows("notes") == {tuple(r) for r in conn.execute(f"select id, body from {SCHEMA}.notes")}
    bronze = read_bronze(p.spark, p.config.lake.bronze_path)
    assert bronze is not None
    held = [(r.topic, r.partition, r.offset) for r in bronze.select("topic", "partition", "offset").collect()]
    assert len(held) == len(set(held)), "an offset is in Bronze twice"
    assert set(held) == offsets


def test_snapshot(pipeline: Pipeline, pg_conn: psycopg.Connection) -> None:
    offsets = kafka_offsets({"items": 20, "notes": 5})
    pipeline.run()
    assert_lake_equals_source(pipeline, pg_conn, offsets)
    # Each table's unit times its steps (the per-table log line's `steps=`), the batch its phases.
    for stats in pipeline.processor.last_stats.values():
        assert {"plan", "commit check", "ledger read", "count", "bronze wait", "upsert"} <= set(stats.steps_s), (
            stats.steps_s)
        assert "steps=plan:" in stats.log_line(0)  # a unit's first step builds its table's plan
    assert set(pipeline.processor.phases) == {"plan", "plan_summary", "bronze", "tables"}


def test_a_batch_spark_replays_is_skipped_by_every_table_and_by_bronze(
    pipeline: Pipeline, pg_conn: psycopg.Connection
) -> None:
    pg_conn.execute(f"update {SCHEMA}.items set qty = qty * 10 where id <= 5")
    pg_conn.execute(f"delete from {SCHEMA}.notes where id = 1")
    offsets = kafka_offsets({"items": 25, "notes": 7})
    pipeline.run()
    assert_lake_equals_source(pipeline, pg_conn, offsets)
    commits = {t: pipeline.commits(t) for t in TABLES}

    # As if the job died after the tables committed and before Spark recorded the batch, `items` before its meta
    # sync too (its catalog table gone); the job restarts (a new processor).
    checkpoint = pipeline.config.lake.checkpoint_path
    entries = [f for f in list_files(pipeline.spark, f"{checkpoint}/commits") if f.rpartition("/")[2].isdigit()]
    last = max(entries, key=lambda f: int(f.rpartition("/")[2]))
    assert delete_path(pipeline.spark, f"{checkpoint}/commits/{last}")
    items_table = f"{DATABASE}.{SCHEMA}_items"
    pipeline.spark.sql(f"drop table {items_table}")
    restarted = Pipeline.of(pipeline.spark, pipeline.config)
    restarted.run()

    assert len(restarted.processor.history) == 1  # the replay, nothing else
    stats = restarted.processor.history[0]
    assert {t: (s.rows_in, s.replayed, s.upserts) for t, s in stats.items()} == {
        f"{DATABASE}.{SCHEMA}_items": (5, 5, 0), f"{DATABASE}.{SCHEMA}_notes": (2, 2, 0),
    }
    assert {t: pipeline.commits(t) for t in TABLES} == commits  # no new Silver commit
    # The skipped table was synced all the same (app/sink/metasync.py): the catalog has it, current.
    assert {tuple(r) for r in pipeline.spark.table(items_table).select("id", "name", "qty").collect()} == {
        tuple(r) for r in pg_conn.execute(f"select id, name, qty from {SCHEMA}.items")
    }
    assert_lake_equals_source(pipeline, pg_conn, offsets)


def test_a_lost_checkpoint_resumes_after_the_committed_offsets(
    pipeline: Pipeline, pg_conn: psycopg.Connection
) -> None:
    pg_conn.execute(f"insert into {SCHEMA}.items values (21, 'item 21', 21)")
    pg_conn.execute(f"update {SCHEMA}.items set name = 'renamed' where id = 6")
    pg_conn.execute(f"update {SCHEMA}.notes set body = 'edited' where id = 2")
    offsets = kafka_offsets({"items": 27, "notes": 8})
    assert delete_path(pipeline.spark, pipeline.config.lake.checkpoint_path)

    pipeline.run()

    # Only what came after the tables' last commits was read: 2 items records and 1 notes record, not 27 + 8.
    rows_in = {t: s.rows_in for batch in pipeline.processor.history for t, s in batch.items()}
    assert rows_in == {f"{DATABASE}.{SCHEMA}_items": 2, f"{DATABASE}.{SCHEMA}_notes": 1}
    assert_lake_equals_source(pipeline, pg_conn, offsets)


def test_a_batchs_tables_written_from_two_threads_at_once(pipeline: Pipeline, pg_conn: psycopg.Connection) -> None:
    pg_conn.execute(f"update {SCHEMA}.items set qty = -1 where id in (7, 8)")
    pg_conn.execute(f"insert into {SCHEMA}.notes values (6, 'note 6')")
    offsets = kafka_offsets({"items": 29, "notes": 9})
    spark, processor = pipeline.spark, pipeline.processor
    # The batch the job would read next, as a batch query from the offsets the tables committed.
    committed, _ = committed_offsets(spark, [pipeline.path(t) for t in TABLES])
    starting, _ = starting_offsets_json(kafka_partitions(spark, pipeline.config), committed)
    raw_df = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", pipeline.config.kafka.bootstrap_servers)
        .option("subscribe", ",".join(topic(t) for t in TABLES))
        .option("startingOffsets", starting)
        .option("includeHeaders", "true")
        .load()
    )
    batch = processor.planner.summarize(processor.planner.frame(raw_df))
    assert sorted(s.rows_in for s in batch.topics.values()) == [1, 2]
    commits = {t: pipeline.commits(t) for t in TABLES}
    assert pipeline.config.lake.table_writers >= 2

    def write_both() -> list[TablePlan]:
        units = processor.table_units(batch, processor.planner.table_topics(batch), 1000, "two-threads")
        processor._write_tables(spark, units, Step(1000))
        return units.plans()

    write_both()
    assert pipeline.rows("items") == {tuple(r) for r in pg_conn.execute(f"select id, name, qty from {SCHEMA}.items")}
    assert pipeline.rows("notes") == {tuple(r) for r in pg_conn.execute(f"select id, body from {SCHEMA}.notes")}
    assert {t: len(pipeline.commits(t)) - len(commits[t]) for t in TABLES} == {"items": 1, "notes": 1}
    after_first = {t: pipeline.commits(t) for t in TABLES}

    plans = write_both()  # the same batch again, both tables at once: each finds its offsets committed
    assert [p.stats.replayed for p in plans] == [p.summary.rows_in for p in plans]
    assert {t: pipeline.commits(t) for t in TABLES} == after_first

    # The job's checkpoint does not hold these offsets: its run reads them, the tables skip them, Bronze takes them.
    pipeline.run()
    replayed = {t: (s.rows_in, s.replayed) for batch in pipeline.processor.history for t, s in batch.items()}
    assert replayed == {f"{DATABASE}.{SCHEMA}_items": (2, 2), f"{DATABASE}.{SCHEMA}_notes": (1, 1)}
    assert {t: pipeline.commits(t) for t in TABLES} == after_first
    assert_lake_equals_source(pipeline, pg_conn, offsets)


class FailingNotes(Hooks):
    """A Hudi write option that fails the `notes` table's upserts (a record key column it does not have)."""

    def write_options(self, table_path: str) -> dict[str, str]:
        if table_path.endswith("_notes"):
            return {"hoodie.datasource.write.recordkey.field": "no_such_column"}
        return {}


def test_a_table_failing_on_one_writer_thread_leaves_the_other_committed(
    pipeline: Pipeline, pg_conn: psycopg.Connection
) -> None:
    pg_conn.execute(f"update {SCHEMA}.items set qty = 99 where id = 3")
    pg_conn.execute(f"insert into {SCHEMA}.notes values (7, 'note 7')")
    offsets = kafka_offsets({"items": 30, "notes": 10})
    failing = Pipeline(pipeline.spark, pipeline.config,
                       BatchProcessor(pipeline.config, pipeline.processor.planner.registry, FailingNotes()))
    items_before, notes_before = pipeline.commits("items"), pipeline.commits("notes")

    with pytest.raises(SinkWriteError, match=f"Hudi write of {DATABASE}.{SCHEMA}_notes failed"):
        failing.run()
    failed_at = failing.processor.status.failed_at or {}
    assert {k: failed_at.get(k) for k in ("table", "step", "error")} == {
        "table": f"{DATABASE}.{SCHEMA}_notes", "step": "upsert", "error": "SinkWriteError",
    }
    # The other thread's table committed its share; the failed one holds nothing of the batch.
    assert len(pipeline.commits("items")) == len(items_before) + 1
    assert pipeline.commits("notes") == notes_before
    assert pipeline.rows("items") == {tuple(r) for r in pg_conn.execute(f"select id, name, qty from {SCHEMA}.items")}
    assert (7, "note 7") not in pipeline.rows("notes")

    pipeline.run()  # the batch again: items finds its offsets committed, notes is written
    replayed = {t: (s.rows_in, s.replayed) for batch in pipeline.processor.history for t, s in batch.items()}
    assert replayed == {f"{DATABASE}.{SCHEMA}_items": (1, 1), f"{DATABASE}.{SCHEMA}_notes": (1, 0)}
    assert_lake_equals_source(pipeline, pg_conn, offsets)
