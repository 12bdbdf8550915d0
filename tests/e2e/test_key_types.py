"""Primary keys of every common PostgreSQL type, through the real Debezium connector, equal the source.

A record key is a value Hudi turns into text (its key generator) and the delete ledger into JSON: a key whose text
changed between the insert and the update would leave a row twice, and one Hudi cannot turn into text would fail
the table's write. Each table below has a primary key of one type (or a composite one whose text values hold the
characters Hudi's composite keys are joined with, and empty strings), rows of edge values, and a `v` unique per row.
After the snapshot, and after a second batch that updates every row, deletes two and re-inserts one deleted key,
each Silver table holds exactly PostgreSQL's rows: the same keys (compared as PostgreSQL's text of them, timestamps
as microseconds since the epoch) and `v`.

A key that is empty in every column (a text or bytea primary key of '') is one Hudi refuses: its changes go to the
dead letters (`empty_key`), and the rest of its table and the other tables are written.

Not covered, because it fails (Hudi's composite keys join `column:value` with commas, unescaped): two composite
keys such as ('x,b:y', 'z') and ('x', 'y,b:z') on columns (a, b) are one Hudi key, and the table keeps one row
for both (docs/sources.md "Record keys").
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType, TimestampType

from app.config import JobConfig
from app.sink.deadletters import dead_letter_target
from tests.conftest import RUN_ID
from tests.support.cdc import debezium_connector, job_config_for, read_topic
from tests.support.pipeline import Pipeline, source_schema

pytestmark = [pytest.mark.stack, pytest.mark.slow]

SCHEMA = f"kt_{RUN_ID}"
PREFIX = f"kt{RUN_ID}"
DATABASE = f"kt_{RUN_ID}"


@dataclasses.dataclass(frozen=True)
class KeyTable:
    name: str
    columns: str  # the key columns' definitions
    key: tuple[str, ...]
    values: tuple[str, ...]  # SQL row literals of the key columns, one per row


TABLES = (
    KeyTable("k_uuid", "id uuid", ("id",), ("'00000000-0000-0000-0000-000000000000'",
                                            "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'",
                                            "'ffffffff-ffff-ffff-ffff-ffffffffffff'")),
    KeyTable("k_numeric", "id numeric(12,3)", ("id",), ("0", "1.5", "-1.5", "1.501", "123456789.123", "0.001")),
    KeyTable("k_numeric_any", "id numeric", ("id",), ("0", "1.5", "1.25", "-7", "1e-20", "12345678901234567890123")),
    KeyTable("k_date", "d date", ("d",), ("'1969-12-31'", "'1970-01-01'", "'2024-02-29'", "'0001-01-01'")),
    KeyTable("k_ts", "ts timestamp(6)", ("ts",), ("'1969-12-31 23:59:59.999999'", "'1970-01-01 00:00:00'",
                                                 "'2024-03-10 02:30:00.000001'", "'2024-11-03 01:30:00'")),
    KeyTable("k_tstz", "ts timestamptz", ("ts",), ("'2024-11-03 01:30:00-07'", "'2024-11-03 01:30:00-08'",
                                                   "'1960-06-01 12:00:00+00'")),
    KeyTable("k_time", "t time(6)", ("t",), ("'00:00:00'", "'12:34:56.789012'", "'23:59:59.999999'")),
    KeyTable("k_bytea", "b bytea", ("b",), ("'\\x00'", "'\\x'", "'\\x0000'", "'\\xff'", "'\\x616263'")),
    KeyTable("k_text", "t text", ("t",), ("'a'", "''", "' '", "'__empty__'", "'null'", "'\\'")),
    KeyTable("k_char", "c char(4)", ("c",), ("'ab'", "'ab c'", "'x'")),
    KeyTable("k_float", "f double precision", ("f",), ("0.1", "-2.5", "1e300", "3")),
    KeyTable("k_bool_small", "flag boolean, n smallint", ("flag", "n"), ("true, 1", "false, 1", "true, -32768")),
    KeyTable("k_text2", "a text, b text", ("a", "b"), (
        "'x,b:y', 'z'", "'x', 'y:z'", "'p', ''", "'p', ' '", "'', 'q'", "'a:b', 'c'", "'null', 'n'",
        "'__null__', 'n'", "'\"q\"', '{}'",
    )),
    KeyTable("k_enum", f"m {SCHEMA}.mood", ("m",), ("'sad'", "'ok'", "'happy'")),
)

DDL = "\n".join(
    [f"create schema {SCHEMA};", f"create type {SCHEMA}.mood as enum ('sad', 'ok', 'happy');"]
    + [f"create table {SCHEMA}.{t.name} ({t.columns}, v int not null, primary key ({', '.join(t.key)}));"
       for t in TABLES]
    + [f"insert into {SCHEMA}.{t.name} values " + ", ".join(f"({row}, {n})" for n, row in enumerate(t.values))
       + ";" for t in TABLES]
)


@pytest.fixture(scope="module")
def pg_conn(stack: None) -> Iterator[psycopg.Connection]:
    with source_schema(SCHEMA, DDL) as conn:
        yield conn


@pytest.fixture(scope="module")
def pipeline(
    spark: SparkSession, local_config: JobConfig, pg_conn: psycopg.Connection, lake_root: str
) -> Iterator[Pipeline]:
    with debezium_connector(f"kt-{RUN_ID}", PREFIX, [SCHEMA]):
        yield Pipeline.of(spark, job_config_for(local_config, PREFIX, DATABASE, f"{lake_root}/key_types"))


EMPTY = ("", "\\x")  # PostgreSQL's text of an empty string and an empty bytea


def column_types(conn: psycopg.Connection, table: KeyTable) -> dict[str, str]:
    return dict(conn.execute(
        "select attname, format_type(atttypid, atttypmod) from pg_attribute "
        "where attrelid = %s::regclass and attnum > 0", (f"{SCHEMA}.{table.name}",)).fetchall())


def source_rows(conn: psycopg.Connection, table: KeyTable) -> dict[int, tuple[Any, ...]]:
    """v -> the key as PostgreSQL's text of each key column (a timestamp's: microseconds since the epoch), of the
    rows whose key Hudi can store."""
    types = column_types(conn, table)
    keys = ", ".join(
        f"(extract(epoch from {k}) * 1000000)::bigint::text" if types[k].startswith("timestamp") else f"{k}::text"
        for k in table.key
    )
    rows = conn.execute(f"select {keys}, v from {SCHEMA}.{table.name}").fetchall()
    return {row[-1]: row[:-1] for row in rows if not all(k in EMPTY for k in row[:-1])}


def silver_rows(p: Pipeline, conn: psycopg.Connection, table: KeyTable) -> list[tuple[int, tuple[Any, ...]]]:
    """(v, the key) of every Silver row, the key as PostgreSQL's text of the value Silver holds (sent back to
    PostgreSQL as a literal of the column's type; a timestamp's: microseconds since the epoch)."""
    silver_df = p.spark.read.format("hudi").load(p.config.lake.table_path(f"{SCHEMA}_{table.name}"))
    types = column_types(conn, table)
    texts = []
    for column in table.key:
        data_type = silver_df.schema[column].dataType
        if isinstance(data_type, BinaryType):
            text = F.concat(F.lit("\\x"), F.lower(F.hex(column)))
        elif isinstance(data_type, TimestampType):
            text = F.unix_micros(column).cast("string")
        else:
            text = F.col(column).cast("string")
        texts.append(text.alias(column))
    out = []
    for row in silver_df.select("v", *texts).collect():
        key = []
        for column in table.key:
            if types[column].startswith("timestamp"):
                key.append(row[column])
                continue
            found = conn.execute(f"select (%s::text)::{types[column]}::text", (row[column],)).fetchone()
            key.append(None if found is None else found[0])
        out.append((row["v"], tuple(key)))
    return out


def assert_tables_match(p: Pipeline, conn: psycopg.Connection) -> None:
    problems = []
    for table in TABLES:
        actual = silver_rows(p, conn, table)
        expected = source_rows(conn, table)
        if sorted(v for v, _ in actual) != sorted(expected):
            problems.append(f"{table.name}: v {sorted(v for v, _ in actual)} != {sorted(expected)}")
            continue
        for v, key in actual:
            if key != expected[v]:
                problems.append(f"{table.name} v={v}: key {key} != {expected[v]}")
    assert not problems, "\n".join(problems)


def assert_empty_keys_dead_lettered(p: Pipeline, batch: int) -> None:
    """The batch's one change of each table's empty key went to the dead letters, and nothing else did."""
    stats = p.processor.last_stats
    assert {t.name: stats[f"{DATABASE}.{SCHEMA}_{t.name}"].dead_letters for t in TABLES} == {
        t.name: 1 if t.name in ("k_bytea", "k_text") else 0 for t in TABLES
    }
    rows = p.spark.read.format("hudi").load(dead_letter_target(p.config).path) \
        .filter(F.col("batch_id") == batch).collect()
    assert sorted((r["source_table"], r["error_kind"]) for r in rows) == [
        (f"{DATABASE}.{SCHEMA}_k_bytea", "empty_key"), (f"{DATABASE}.{SCHEMA}_k_text", "empty_key")]
    assert all("null or empty in every column" in r["error_message"] for r in rows)


def wait_records(per_table: Callable[[KeyTable], int]) -> None:
    """Until each table's topic holds at least `per_table(table)` records (tombstones included)."""
    deadline = time.monotonic() + 120
    for table in TABLES:
        topic = f"{PREFIX}.{SCHEMA}.{table.name}"
        while len(records := read_topic(topic)) < per_table(table):
            assert time.monotonic() < deadline, f"{topic}: {len(records)} records, expected {per_table(table)}"
            time.sleep(0.5)


def test_snapshot_of_every_key_type(pipeline: Pipeline, pg_conn: psycopg.Connection) -> None:
    wait_records(lambda t: len(t.values))
    pipeline.run()
    assert_tables_match(pipeline, pg_conn)
    assert_empty_keys_dead_lettered(pipeline, 0)


def test_updates_deletes_and_a_reinsert_of_every_key_type(pipeline: Pipeline, pg_conn: psycopg.Connection) -> None:
    for table in TABLES:
        pg_conn.execute(f"update {SCHEMA}.{table.name} set v = v + 100")
        pg_conn.execute(f"delete from {SCHEMA}.{table.name} where v in (100, 102)")
        pg_conn.execute(f"insert into {SCHEMA}.{table.name} values ({table.values[0]}, 1000)")
    # the snapshot, an update of each row, two deletes and their tombstones, the re-insert
    wait_records(lambda t: 2 * len(t.values) + 5)
    pipeline.run()
    assert_tables_match(pipeline, pg_conn)
    assert_empty_keys_dead_lettered(pipeline, 1)
