"""TOAST placeholders and deletes that stay deleted, on the real stack (PostgreSQL -> Debezium -> the job -> Hudi).

- TOAST: an UPDATE that leaves a TOASTed value untouched sends Debezium's placeholder; Silver keeps the value,
  for text, bytea, jsonb, text[] and int[] columns over 8 KB of incompressible data, default replica identity,
  with the insert and the update in separate batches and in one batch. A real `set t = null` still nulls it.
- Hard deletes: a redelivered older event of a deleted key (the original Kafka record, produced again) does
  not bring the row back (judged against the delete ledger's keys); a newer re-insert does (judged without them:
  above every fact), and an older event after it still changes nothing.
- Soft deletes (per table): the row stays, flagged, with the delete's source time and its values, although the
  delete's before image holds only the key; an older replay leaves it deleted; a newer re-insert revives it.

Phases build on each other and run in file order.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from app.config import JobConfig, TableConfig
from app.sink.ledger import read_ledger
from tests.conftest import RUN_ID
from tests.support.cdc import KafkaRecord, debezium_connector, job_config_for, produce_again, read_topic
from tests.support.pipeline import Pipeline as JobPipeline
from tests.support.pipeline import source_schema

pytestmark = [pytest.mark.stack, pytest.mark.slow]

SCHEMA = f"td_{RUN_ID}"
PREFIX = f"td{RUN_ID}"
DATABASE = f"td_{RUN_ID}"

DDL = f"""
create schema {SCHEMA};
-- default replica identity everywhere: updates carry no before image, deletes only the key
create table {SCHEMA}.docs (id int primary key, other int, t text, b bytea, j jsonb, ta text[], ia int[]);
create table {SCHEMA}.items (id int primary key, name text, qty int);
create table {SCHEMA}.soft_items (id int primary key, name text, qty int, note text);
insert into {SCHEMA}.items values (1, 'one', 1), (2, 'two', 2), (3, 'three', 3);
insert into {SCHEMA}.soft_items values (1, 'one', 10, 'n1'), (2, 'two', 20, 'n2');
"""

# Incompressible values well over the 2 KB TOAST threshold (and over 8 KB): chained md5 text.
RANDOM_TEXT = "(select string_agg(md5(random()::text), '') from generate_series(1, {n}))"
INSERT_DOC = f"""
insert into {SCHEMA}.docs values (%s, 0,
  {RANDOM_TEXT.format(n=400)},
  decode({RANDOM_TEXT.format(n=600)}, 'hex'),
  (select jsonb_agg(md5(random()::text)) from generate_series(1, 400)),
  (select array_agg(md5(random()::text)) from generate_series(1, 400)),
  (select array_agg((random() * 2e9)::int) from generate_series(1, 3000)))
"""


class Pipeline(JobPipeline):
    def silver(self, table: str) -> Any:
        return self.spark.read.format("hudi").load(self.config.lake.table_path(f"{SCHEMA}_{table}"))

    def stats(self, table: str) -> Any:
        return self.processor.last_stats[f"{DATABASE}.{SCHEMA}_{table}"]


@pytest.fixture(scope="module")
def pg_conn(stack: None) -> Iterator[psycopg.Connection]:
    with source_schema(SCHEMA, DDL) as conn:
        yield conn


@pytest.fixture(scope="module")
def pipeline(
    spark: SparkSession, local_config: JobConfig, pg_conn: psycopg.Connection, lake_root: str
) -> Iterator[Pipeline]:
    with debezium_connector(f"td-{RUN_ID}", PREFIX, [SCHEMA]):
        config = job_config_for(local_config, PREFIX, DATABASE, f"{lake_root}/toast_deletes")
        config = dataclasses.replace(config, tables={f"{SCHEMA}.soft_items": TableConfig(delete_mode="soft")})
        yield Pipeline.of(spark, config)


def topic(table: str) -> str:
    return f"{PREFIX}.{SCHEMA}.{table}"


def wait_records(table: str, count: int) -> list[KafkaRecord]:
    """Every record of the table's topic, once there are at least `count` (tombstones included)."""
    deadline = time.monotonic() + 90
    while len(records := read_topic(topic(table))) < count:
        assert time.monotonic() < deadline, f"{topic(table)}: {len(records)} records, expected {count}"
        time.sleep(0.5)
    return records


def assert_docs_match(p: Pipeline, conn: psycopg.Connection) -> None:
    expected = {
        row[0]: row[1:]
        for row in conn.execute(f"select id, other, t, b, j::text, ta, ia from {SCHEMA}.docs").fetchall()
    }
    actual = {
        r["id"]: (r["other"], r["t"], None if r["b"] is None else bytes(r["b"]), r["j"], r["ta"], r["ia"])
        for r in p.silver("docs").select("id", "other", "t", "b", "j", "ta", "ia").collect()
    }
    assert actual.keys() == expected.keys()
    for key, row in expected.items():
        for name, want, got in zip(("other", "t", "b", "j", "ta", "ia"), row, actual[key], strict=True):
            assert got == want, f"docs id={key} column {name}: {str(got)[:80]!r} != {str(want)[:80]!r}"


def test_toast_values_survive_updates_in_separate_batches(pipeline: Pipeline, pg_conn: psycopg.Connection) -> None:
    pg_conn.execute(INSERT_DOC, (1,))
    sizes = pg_conn.execute(
        f"select pg_column_size(t), pg_column_size(b), pg_column_size(j), pg_column_size(ta), pg_column_size(ia) "
        f"from {SCHEMA}.docs where id = 1"
    ).fetchone()
    assert sizes is not None and min(sizes) > 8192, sizes  # each over 8 KB as stored: incompressible
    wait_records("docs", 1)
    pipeline.run()
    assert_docs_match(pipeline, pg_conn)

    pg_conn.execute(f"update {SCHEMA}.docs set other = 1 where id = 1")  # every TOASTed column untouched
    records = wait_records("docs", 2)
    assert b"__debezium_unavailable_value" in (records[-1].value or b"")  # the placeholder really came
    pipeline.run()

    assert_docs_match(pipeline, pg_conn)
    assert pipeline.stats("docs").unresolved == 0


def test_toast_insert_and_update_in_one_batch_and_a_real_null(pipeline: Pipeline, pg_conn: psycopg.Connection) -> None:
    pg_conn.execute(INSERT_DOC, (2,))
    pg_conn.execute(f"update {SCHEMA}.docs set other = 2 where id = 2")
    pg_conn.execute(f"update {SCHEMA}.docs set other = 3 where id = 2")
    pg_conn.execute(f"update {SCHEMA}.docs set t = null, other = 4 where id = 1")  # a real NULL still nulls
    wait_records("docs", 6)
    pipeline.run()

    assert_docs_match(pipeline, pg_conn)
    t1 = pipeline.silver("docs").filter("id = 1").select("t", "b").first()
    assert t1 is not None and t1["t"] is None and t1["b"] is not None


def test_hard_delete_stays_deleted_when_an_older_event_is_redelivered(
    pipeline: Pipeline, pg_conn: psycopg.Connection
) -> None:
    snapshot = {r.key: r for r in wait_records("items", 3)}
    original = next(r for r in snapshot.values() if r.value and b"one" in r.value)  # id 1's snapshot read
    pipeline.run()
    pg_conn.execute(f"delete from {SCHEMA}.items where id = 1")
    wait_records("items", 5)  # the delete and its tombstone
    pipeline.run()
    assert sorted(r["id"] for r in pipeline.silver("items").collect()) == [2, 3]
    assert "ledger join" not in pipeline.stats("items").steps_s  # no upsert in it: nothing the ledger could block

    produce_again(original)  # an older upsert of the deleted key, in a later batch
    pipeline.run()

    assert sorted(r["id"] for r in pipeline.silver("items").collect()) == [2, 3]
    stats = pipeline.stats("items")
    assert (stats.rows_in, stats.upserts, stats.blocked) == (1, 0, 1), stats
    assert "ledger join" in stats.steps_s  # below the ledger's highest fact: judged against its keys
    ledger = read_ledger(pipeline.spark, pipeline.config.lake.table_path(f"_cdc_delete_ledger/{SCHEMA}_items"), ["id"])
    assert ledger is not None and [r["_cdc_ledger_key"] for r in ledger.collect()] == ['{"id":1}']


def test_a_newer_reinsert_brings_a_hard_deleted_key_back(pipeline: Pipeline, pg_conn: psycopg.Connection) -> None:
    original = next(r for r in wait_records("items", 6) if r.value and b"one" in r.value)
    pg_conn.execute(f"insert into {SCHEMA}.items values (1, 'one again', 11)")
    wait_records("items", 7)
    pipeline.run()
    rows = {r["id"]: (r["name"], r["qty"]) for r in pipeline.silver("items").collect()}
    assert rows == {1: ("one again", 11), 2: ("two", 2), 3: ("three", 3)}
    # Above every fact: judged without the ledger, so the key keeps its delete fact, which blocks only older events.
    assert "ledger join" not in pipeline.stats("items").steps_s
    ledger = read_ledger(pipeline.spark, pipeline.config.lake.table_path(f"_cdc_delete_ledger/{SCHEMA}_items"), ["id"])
    assert ledger is not None and [r["_cdc_ledger_key"] for r in ledger.collect()] == ['{"id":1}']

    produce_again(original)  # older than the re-insert: Hudi's ordering rejects it
    pipeline.run()
    rows = {r["id"]: (r["name"], r["qty"]) for r in pipeline.silver("items").collect()}
    assert rows[1] == ("one again", 11)


def _soft_rows(p: Pipeline) -> dict[int, tuple[Any, ...]]:
    rows = p.silver("soft_items").select(
        "id", "name", "qty", "note", "_cdc_deleted", F.unix_millis("_cdc_deleted_at").alias("deleted_ms")
    ).collect()
    return {r["id"]: (r["name"], r["qty"], r["note"], r["_cdc_deleted"], r["deleted_ms"]) for r in rows}


def test_soft_delete_keeps_the_row_and_its_values(pipeline: Pipeline, pg_conn: psycopg.Connection) -> None:
    snapshot = wait_records("soft_items", 2)
    pipeline.run()
    pg_conn.execute(f"delete from {SCHEMA}.soft_items where id = 1")  # before image: the key only
    pg_conn.execute(f"insert into {SCHEMA}.soft_items values (3, 'three', 30, 'n3')")
    pg_conn.execute(f"delete from {SCHEMA}.soft_items where id = 3")  # insert and delete in one batch
    wait_records("soft_items", 7)
    pipeline.run()

    rows = _soft_rows(pipeline)
    assert rows[1][:4] == ("one", 10, "n1", True)
    assert rows[3][:4] == ("three", 30, "n3", True)
    assert rows[2] == ("two", 20, "n2", False, None)
    # the delete's source time (PostgreSQL's commit time), minutes ago at most
    assert rows[1][4] is not None and abs(rows[1][4] - datetime.now(UTC).timestamp() * 1000) < 600_000

    produce_again(next(r for r in snapshot if r.value and b"one" in r.value))  # older: stays deleted
    pipeline.run()
    assert _soft_rows(pipeline)[1][:4] == ("one", 10, "n1", True)


def test_soft_deleted_key_comes_back_with_a_newer_insert(pipeline: Pipeline, pg_conn: psycopg.Connection) -> None:
    pg_conn.execute(f"insert into {SCHEMA}.soft_items values (1, 'uno', 100, null)")
    wait_records("soft_items", 9)
    pipeline.run()

    assert _soft_rows(pipeline)[1] == ("uno", 100, None, False, None)
    expected = {r[0]: r[1:] for r in pg_conn.execute(f"select id, name, qty, note from {SCHEMA}.soft_items")}
    live = {k: v[:3] for k, v in _soft_rows(pipeline).items() if not v[3]}
    assert live == expected
