"""Primary keys of every common PostgreSQL and MariaDB type, through the real Debezium connectors, equal the source.

A record key is a value Hudi turns into text (its key generator) and the delete ledger into JSON: a key whose text
changed between the insert and the update would leave a row twice, and one Hudi cannot turn into text would fail
the table's write. Each table below has a primary key of one type (or a composite one whose text values hold the
characters Hudi's composite keys are joined with, and empty strings), rows of edge values, and a `v` unique per row.
After the snapshot, and after a second batch that updates every row, deletes two and re-inserts one deleted key,
each Silver table holds exactly PostgreSQL's rows: the same keys (compared as PostgreSQL's text of them, timestamps
as microseconds since the epoch) and `v`. The MariaDB tables go through the same two batches.

A key that is empty in every column (a text or bytea primary key of '') is one Hudi refuses: its changes go to the
dead letters (`empty_key`), and the rest of its table and the other tables are written.

Composite keys that Hudi's own key text cannot tell apart (its `column:value` pairs are joined with commas,
unescaped, and '' is written `__empty__`) are among them: ('x,b:y', 'z') and ('x', 'y,b:z'), ('p', '') and
('p', '__empty__'), and on MariaDB ('', 1) and ('__empty__', 1). Each is a row of its own (the tables keep each text
value's length in their key: docs/sources.md "Record keys"), also after one of a pair is deleted and re-inserted.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import psycopg
import pymysql
import pytest
from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType, TimestampType

from app.config import JobConfig
from app.sink.deadletters import dead_letter_target
from tests.conftest import RUN_ID
from tests.support.cdc import MARIADB_ROOT, debezium_connector, job_config_for, mariadb_connector, wait_for_records
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
        "'__null__', 'n'", "'\"q\"', '{}'", "'x', 'y,b:z'", "'p', '__empty__'", "'a', 'b:c'",
    )),
    KeyTable("k_enum", f"m {SCHEMA}.key_mood", ("m",), ("'sad'", "'ok'", "'happy'")),
)

DDL = "\n".join(
    [f"create schema {SCHEMA};", f"create type {SCHEMA}.key_mood as enum ('sad', 'ok', 'happy');"]
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


def test_snapshot_of_every_key_type(pipeline: Pipeline, pg_conn: psycopg.Connection) -> None:
    for table in TABLES:
        wait_for_records(f"{PREFIX}.{SCHEMA}.{table.name}", len(table.values), 120)
    pipeline.run()
    assert_tables_match(pipeline, pg_conn)
    assert_empty_keys_dead_lettered(pipeline, 0)


def test_updates_deletes_and_a_reinsert_of_every_key_type(pipeline: Pipeline, pg_conn: psycopg.Connection) -> None:
    for table in TABLES:
        pg_conn.execute(f"update {SCHEMA}.{table.name} set v = v + 100")
        pg_conn.execute(f"delete from {SCHEMA}.{table.name} where v in (100, 102)")
        pg_conn.execute(f"insert into {SCHEMA}.{table.name} values ({table.values[0]}, 1000)")
    # the snapshot, an update of each row, two deletes and their tombstones, the re-insert
    for table in TABLES:
        wait_for_records(f"{PREFIX}.{SCHEMA}.{table.name}", 2 * len(table.values) + 5, 120)
    pipeline.run()
    assert_tables_match(pipeline, pg_conn)
    assert_empty_keys_dead_lettered(pipeline, 1)


# ---- MariaDB ---------------------------------------------------------------------------------------------------

MARIA_DB = f"mkt_{RUN_ID}"
MARIA_PREFIX = f"mkt{RUN_ID}"


@dataclasses.dataclass(frozen=True)
class MariaKey:
    """A key column: its type, and its canonical text in MariaDB's SQL and in Spark's."""

    name: str
    type: str
    kind: str = "text"  # text | hex | micros

    def sql(self) -> str:
        if self.kind == "hex":
            return f"lower(hex({self.name}))"
        if self.kind == "micros":
            return f"cast(timestampdiff(microsecond, '1970-01-01 00:00:00', {self.name}) as char)"
        return f"cast({self.name} as char)"

    def spark(self, column: str) -> Column:
        if self.kind == "hex":
            return F.lower(F.hex(column))
        if self.kind == "micros":
            return F.unix_micros(column).cast("string")
        return F.col(column).cast("string")


MARIA_TABLES: dict[str, tuple[tuple[MariaKey, ...], tuple[str, ...]]] = {
    "k_varchar": ((MariaKey("k", "varchar(20)"),), ("'a'", "''", "' x'", "'__empty__'", "'€'")),
    "k_varbinary": ((MariaKey("k", "varbinary(8)", "hex"),), ("x'00'", "x''", "x'0000'", "x'ff'")),
    "k_decimal": ((MariaKey("k", "decimal(12,3)"),), ("0", "1.5", "-1.5", "123456789.123")),
    "k_datetime": ((MariaKey("k", "datetime(6)", "micros"),), ("'1000-01-01 00:00:00'", "'1970-01-01 00:00:00'",
                                                             "'2024-03-10 02:30:00.000001'", "'9999-12-31 23:59:59'")),
    "k_timestamp": ((MariaKey("k", "timestamp(3)", "micros"),), ("'1970-01-02 00:00:00'", "'2024-11-03 08:30:00.5'",
                                                                "'2038-01-19 03:14:07'")),
    "k_date": ((MariaKey("k", "date"),), ("'1000-01-01'", "'1970-01-01'", "'2024-02-29'")),
    "k_enum": ((MariaKey("k", "enum('sad','ok','happy')"),), ("'sad'", "'ok'", "'happy'")),
    "k_year": ((MariaKey("k", "year"),), ("1901", "2000", "2155")),
    "k_char": ((MariaKey("k", "char(4)"),), ("'ab'", "'ab c'", "'x'")),
    "k_composite": ((MariaKey("a", "varchar(10)"), MariaKey("b", "int")), ("'x', 1", "'', 1", "'x', -1", "'y,b', 0",
                                                                              "'__empty__', 1")),
}


@pytest.fixture(scope="module")
def maria(stack: None) -> Iterator[pymysql.Connection]:
    conn = pymysql.connect(**MARIADB_ROOT, autocommit=True, charset="utf8mb4")
    try:
        with conn.cursor() as cur:
            cur.execute("set time_zone = '+00:00'")  # TIMESTAMP values read as UTC
            cur.execute(f"drop database if exists {MARIA_DB}")
            cur.execute(f"create database {MARIA_DB}")
            for table, (keys, values) in MARIA_TABLES.items():
                columns = ", ".join(f"{k.name} {k.type}" for k in keys)
                cur.execute(f"create table {MARIA_DB}.{table} ({columns}, v int not null, "
                            f"primary key ({', '.join(k.name for k in keys)}))")
                cur.execute(f"insert into {MARIA_DB}.{table} values "
                            + ", ".join(f"({row}, {n})" for n, row in enumerate(values)))
        yield conn
    finally:
        with conn.cursor() as cur:
            cur.execute(f"drop database if exists {MARIA_DB}")
        conn.close()


@pytest.fixture(scope="module")
def maria_pipeline(
    spark: SparkSession, local_config: JobConfig, maria: pymysql.Connection, lake_root: str
) -> Iterator[Pipeline]:
    with mariadb_connector(f"mkt-{RUN_ID}", MARIA_PREFIX, [MARIA_DB]):
        config = job_config_for(local_config, MARIA_PREFIX, MARIA_DB, f"{lake_root}/maria_key_types")
        assert config.source is not None
        config = dataclasses.replace(config, source=dataclasses.replace(config.source, connector="mariadb"))
        yield Pipeline.of(spark, config)


def assert_maria_tables_match(p: Pipeline, conn: pymysql.Connection) -> None:
    problems = []
    for table, (keys, _) in MARIA_TABLES.items():
        with conn.cursor() as cur:
            cur.execute(f"select {', '.join(k.sql() for k in keys)}, v from {MARIA_DB}.{table}")
            expected = {row[-1]: tuple(row[:-1]) for row in cur.fetchall()
                        if not all(k in ("", None) for k in row[:-1])}
        silver_df = p.spark.read.format("hudi").load(p.config.lake.table_path(f"{MARIA_DB}_{table}"))
        actual = [(r["v"], tuple(r[k.name] for k in keys))
                  for r in silver_df.select("v", *[k.spark(k.name).alias(k.name) for k in keys]).collect()]
        if sorted(v for v, _ in actual) != sorted(expected):
            problems.append(f"{table}: v {sorted(v for v, _ in actual)} != {sorted(expected)}")
            continue
        problems += [f"{table} v={v}: key {key} != {expected[v]}" for v, key in actual if key != expected[v]]
    assert not problems, "\n".join(problems)


def test_mariadb_keys_of_every_type(maria_pipeline: Pipeline, maria: pymysql.Connection) -> None:
    for table, (_, values) in MARIA_TABLES.items():
        wait_for_records(f"{MARIA_PREFIX}.{MARIA_DB}.{table}", len(values), 120)
    maria_pipeline.run()
    assert_maria_tables_match(maria_pipeline, maria)
    stats = maria_pipeline.processor.last_stats
    assert {t: stats[f"{MARIA_DB}.{MARIA_DB}_{t}"].dead_letters for t in MARIA_TABLES} == {
        t: 1 if t in ("k_varchar", "k_varbinary") else 0 for t in MARIA_TABLES}

    with maria.cursor() as cur:
        for table, (_, values) in MARIA_TABLES.items():
            cur.execute(f"update {MARIA_DB}.{table} set v = v + 100")
            cur.execute(f"delete from {MARIA_DB}.{table} where v in (100, 102)")
            cur.execute(f"insert into {MARIA_DB}.{table} values ({values[0]}, 1000)")
    for table, (_, values) in MARIA_TABLES.items():
        wait_for_records(f"{MARIA_PREFIX}.{MARIA_DB}.{table}", 2 * len(values) + 5, 120)
    maria_pipeline.run()
    assert_maria_tables_match(maria_pipeline, maria)
