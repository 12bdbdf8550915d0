"""Column and table names a real schema has, through the real Debezium connector, equal the source.

The job's own frames carry Kafka's columns (`key`, `value`, `topic`, `partition`, `offset`, `timestamp`,
`headers`) next to the decoded event, and Hive's catalog folds names to lower case. A key-value table whose
columns are named like Kafka's, a table whose quoted names are in mixed case or are SQL keywords, and a table
named in mixed case are captured, then updated and partly deleted in a later batch: each Silver table holds
PostgreSQL's rows, column by column.
"""
from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

import psycopg
import pytest
from pyspark.sql import SparkSession

from app.config import JobConfig
from tests.conftest import RUN_ID
from tests.support.cdc import debezium_connector, job_config_for, wait_for_records
from tests.support.pipeline import Pipeline, source_schema

pytestmark = [pytest.mark.stack, pytest.mark.slow]

SCHEMA = f"cn_{RUN_ID}"
PREFIX = f"cn{RUN_ID}"
DATABASE = f"cn_{RUN_ID}"

DDL = f"""
create schema {SCHEMA};
create table {SCHEMA}.settings (key text primary key, value text, topic text, partition int, "offset" bigint,
  timestamp timestamptz, headers text, op text, ts_ms bigint, source text, before text, after text);
create table {SCHEMA}.quoted ("Id" int primary key, "UserName" text, "select" text, "from" int, "Order" int);
create table {SCHEMA}."MixedCase" (id int primary key, name text);
insert into {SCHEMA}.settings values
  ('a', 'one', 't1', 1, 10, '2024-01-01 00:00:00+00', 'h', 'c', 5, 'src', 'b', 'af'),
  ('b', 'two', null, null, null, null, null, null, null, null, null, null),
  ('c', 'three', 't3', 3, 30, '2024-03-03 00:00:00+00', 'h3', 'd', 7, 's', 'x', 'y');
insert into {SCHEMA}.quoted values (1, 'Ann', 'star', 2, 3), (2, 'Bob', null, null, null), (3, 'Cy', 's', 1, 1);
insert into {SCHEMA}."MixedCase" values (1, 'one'), (2, 'two'), (3, 'three');
"""

TABLES = {  # source table -> (its columns as PostgreSQL names them, the key)
    "settings": (["key", "value", "topic", "partition", "offset", "timestamp", "headers", "op", "ts_ms", "source",
                  "before", "after"], "key"),
    "quoted": (["Id", "UserName", "select", "from", "Order"], "Id"),
    "MixedCase": (["id", "name"], "id"),
}


@pytest.fixture(scope="module")
def pg_conn(stack: None) -> Iterator[psycopg.Connection]:
    with source_schema(SCHEMA, DDL) as conn:
        yield conn


@pytest.fixture(scope="module")
def pipeline(
    spark: SparkSession, local_config: JobConfig, pg_conn: psycopg.Connection, lake_root: str
) -> Iterator[Pipeline]:
    with debezium_connector(f"cn-{RUN_ID}", PREFIX, [SCHEMA]):
        yield Pipeline.of(spark, job_config_for(local_config, PREFIX, DATABASE, f"{lake_root}/column_names"))


def local(value: Any) -> Any:
    """A timestamptz as Spark collects one: the instant in the process's time zone, naive."""
    return value.astimezone().replace(tzinfo=None) if isinstance(value, datetime) and value.tzinfo else value


def assert_tables_match(p: Pipeline, conn: psycopg.Connection) -> None:
    problems = []
    for table, (columns, key) in TABLES.items():
        quoted = ", ".join(f'"{c}"' for c in columns)
        expected = {row[0]: tuple(map(local, row)) for row in conn.execute(
            f'select {quoted} from {SCHEMA}."{table}" order by "{key}"').fetchall()}
        silver_df = p.spark.read.format("hudi").load(p.config.lake.table_path(f"{SCHEMA}_{table}"))
        actual: dict[Any, tuple[Any, ...]] = {}
        for row in silver_df.collect():
            values = row.asDict()
            actual[values[key]] = tuple(values[c] for c in columns)
        if actual != expected:
            problems.append(f"{table}: {actual} != {expected}")
    assert not problems, "\n".join(problems)


def test_names_like_kafkas_keywords_and_mixed_case(pipeline: Pipeline, pg_conn: psycopg.Connection) -> None:
    for table in TABLES:
        wait_for_records(f"{PREFIX}.{SCHEMA}.{table}", 3, 120)
    pipeline.run()
    assert_tables_match(pipeline, pg_conn)

    pg_conn.execute(f"update {SCHEMA}.settings set value = value || '!', \"offset\" = 99, topic = 'moved'")
    pg_conn.execute(f"delete from {SCHEMA}.settings where key = 'b'")
    pg_conn.execute(f'update {SCHEMA}.quoted set "UserName" = \'X\', "select" = \'sel\' where "Id" < 3')
    pg_conn.execute(f'delete from {SCHEMA}.quoted where "Id" = 3')
    pg_conn.execute(f'update {SCHEMA}."MixedCase" set name = upper(name)')
    pg_conn.execute(f'delete from {SCHEMA}."MixedCase" where id = 2')
    # the snapshot, the updates, a delete and its tombstone
    for table, count in {"settings": 3 + 3 + 2, "quoted": 3 + 2 + 2, "MixedCase": 3 + 3 + 2}.items():
        wait_for_records(f"{PREFIX}.{SCHEMA}.{table}", count, 120)
    pipeline.run()
    assert_tables_match(pipeline, pg_conn)
