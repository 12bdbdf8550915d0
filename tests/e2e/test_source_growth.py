"""Sources that change shape, on PostgreSQL and MariaDB alike (the job in this process, available-now runs):

- truncates, per table policy (`truncate`: `ignore`, the default, or `clear`), from connectors that send them
  (`skipped.operations=none`). Two tables per source, one of each policy, take the same statements: rows, then in
  one batch changes before a TRUNCATE and rows after it, then a batch holding the truncate alone (it has no key:
  the table's own record key is used), then rows again. After each run `cleared` equals the source and `kept`
  holds every row the source ever had since its last delete, truncates ignored;
- a table created upstream while the connector runs (PostgreSQL through a `FOR TABLES IN SCHEMA` publication,
  MariaDB from the binlog), neither the connector nor the job's config told of it.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pymysql
import pytest
from pyspark.sql import SparkSession

from app.config import JobConfig, TableConfig
from app.errors import required
from tests.conftest import RUN_ID
from tests.support.cdc import MARIADB_ROOT, PG_DSN, debezium_connector, job_config_for, mariadb_connector, read_topic
from tests.support.pipeline import Pipeline

pytestmark = [pytest.mark.stack, pytest.mark.slow]

NAMESPACE = f"trunc_{RUN_ID}"  # the PostgreSQL schema, the MariaDB database
TABLES = ("cleared", "kept")


@dataclasses.dataclass
class Source:
    kind: str
    execute: Callable[[str], None]
    query: Callable[[str], list[tuple[Any, ...]]]
    pipeline: Pipeline
    prefix: str

    def topic(self, table: str) -> str:
        return f"{self.prefix}.{NAMESPACE}.{table}"


def _pg_source(spark: SparkSession, config: JobConfig, prefix: str) -> Iterator[Source]:
    with psycopg.connect(PG_DSN, autocommit=True) as pg:
        pg.execute(f"drop schema if exists {NAMESPACE} cascade")
        pg.execute(f"create schema {NAMESPACE}")
        for table in TABLES:
            pg.execute(f"create table {NAMESPACE}.{table} (id int primary key, v text)")
        try:
            with debezium_connector(f"trunc-pg-{RUN_ID}", prefix, [NAMESPACE], schema_publication=True,
                                    settings={"skipped.operations": "none"}):
                def execute(sql: str) -> None:
                    pg.execute(sql)

                yield Source("postgresql", execute, lambda sql: pg.execute(sql).fetchall(),
                             Pipeline.of(spark, config), prefix)
        finally:
            pg.execute(f"drop schema if exists {NAMESPACE} cascade")


def _maria_source(spark: SparkSession, config: JobConfig, prefix: str) -> Iterator[Source]:
    conn = pymysql.connect(**MARIADB_ROOT, autocommit=True)

    def execute(sql: str) -> None:
        with conn.cursor() as cur:
            for statement in (s for s in sql.split(";") if s.strip()):
                cur.execute(statement)

    def query(sql: str) -> list[tuple[Any, ...]]:
        with conn.cursor() as cur:
            cur.execute(sql)
            return list(cur.fetchall())

    execute(f"drop database if exists {NAMESPACE}; create database {NAMESPACE}")
    for table in TABLES:
        execute(f"create table {NAMESPACE}.{table} (id int primary key, v text)")
    try:
        with mariadb_connector(f"trunc-maria-{RUN_ID}", prefix, [NAMESPACE], settings={"skipped.operations": "none"}):
            config = dataclasses.replace(config, source=dataclasses.replace(required(config.source, "the source"),
                                                                            connector="mariadb"))
            yield Source("mariadb", execute, query, Pipeline.of(spark, config), prefix)
    finally:
        execute(f"drop database if exists {NAMESPACE}")
        conn.close()


@pytest.fixture(scope="module", params=["postgresql", "mariadb"])
def source(request: pytest.FixtureRequest, spark: SparkSession, local_config: JobConfig,
           lake_root: str) -> Iterator[Source]:
    kind = request.param
    prefix = f"tr{kind[0]}{RUN_ID}"
    config = job_config_for(local_config, prefix, f"trunc_{kind[0]}_{RUN_ID}", f"{lake_root}/trunc_{kind[0]}")
    assert config.source is not None
    config = dataclasses.replace(config, source=dataclasses.replace(
        config.source, tables={f"{NAMESPACE}.cleared": TableConfig(truncate="clear")}))
    yield from (_pg_source if kind == "postgresql" else _maria_source)(spark, config, prefix)


def _silver(spark: SparkSession, source: Source, table: str) -> dict[int, str | None]:
    path = source.pipeline.config.lake.table_path(f"{NAMESPACE}_{table}")
    return {r.id: r.v for r in spark.read.format("hudi").load(path).select("id", "v").collect()}


def _run(source: Source, records: dict[str, int]) -> None:
    """Wait until each table's topic holds `records` change records (truncates included), then run the job."""
    deadline = time.monotonic() + 90
    for table, count in records.items():
        while len([r for r in read_topic(source.topic(table)) if r.value is not None]) < count:
            assert time.monotonic() < deadline, f"{source.topic(table)}: fewer than {count} records"
            time.sleep(1)
    source.pipeline.run()


def test_a_truncate_clears_a_table_in_source_order_or_is_ignored(spark: SparkSession, source: Source) -> None:
    ns = NAMESPACE
    both = list(TABLES)
    for table in both:
        source.execute(f"insert into {ns}.{table} values (1, 'a'), (2, 'b'), (3, 'c'), (4, 'd')")
    _run(source, dict.fromkeys(both, 4))
    ever: dict[int, str | None] = {1: "a", 2: "b", 3: "c", 4: "d"}  # `kept`: truncates ignored
    for table in both:
        assert _silver(spark, source, table) == ever

    # One batch: changes before the truncate, rows after it (one of them a key the table had before).
    for table in both:
        source.execute(f"update {ns}.{table} set v = 'a2' where id = 1")
        source.execute(f"delete from {ns}.{table} where id = 2")
        source.execute(f"truncate table {ns}.{table}")
        source.execute(f"insert into {ns}.{table} values (3, 'c again'), (5, 'e')")
        source.execute(f"update {ns}.{table} set v = 'e2' where id = 5")
    _run(source, dict.fromkeys(both, 4 + 6))
    ever.update({1: "a2", 3: "c again", 5: "e2"})
    ever.pop(2)
    assert _silver(spark, source, "cleared") == dict(source.query(f"select id, v from {ns}.cleared")) == {
        3: "c again", 5: "e2"}
    assert _silver(spark, source, "kept") == ever

    # A batch holding the truncate alone: no record of it has a key.
    source.execute(f"truncate table {ns}.cleared")
    _run(source, {"cleared": 11})
    assert _silver(spark, source, "cleared") == {}

    for table in both:
        source.execute(f"insert into {ns}.{table} values (6, 'f'), (7, 'g')")
    _run(source, {"cleared": 13, "kept": 12})
    ever.update({6: "f", 7: "g"})
    assert _silver(spark, source, "cleared") == dict(source.query(f"select id, v from {ns}.cleared")) == {
        6: "f", 7: "g"}
    assert _silver(spark, source, "kept") == ever


def test_a_table_created_upstream_flows_without_a_restart(spark: SparkSession, source: Source) -> None:
    ns = NAMESPACE
    source.execute(f"create table {ns}.added (id int primary key, v text)")
    source.execute(f"insert into {ns}.added values (1, 'one'), (2, 'two'), (3, 'three')")
    source.execute(f"update {ns}.added set v = 'TWO' where id = 2")
    source.execute(f"delete from {ns}.added where id = 3")
    created = time.monotonic()
    _run(source, {"added": 5})

    assert _silver(spark, source, "added") == dict(source.query(f"select id, v from {ns}.added")) == {
        1: "one", 2: "TWO"}
    print(f"\n{source.kind}: a table created upstream equal in the lake {time.monotonic() - created:.1f} s after "
          f"its last change (its records in Kafka, then one available-now run)")
