"""A wide table (400 columns of mixed types, as ERP schemas have), through the real Debezium connector, equals the
source after the snapshot and after an update of every row: Spark's generated code for its decode and merge stays
within the JVM's method limits (or falls back), and the catalog takes its schema."""
from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from pyspark.sql import SparkSession

from app.config import JobConfig
from tests.conftest import RUN_ID
from tests.support.cdc import debezium_connector, job_config_for, wait_for_records
from tests.support.pipeline import Pipeline, source_schema

pytestmark = [pytest.mark.stack, pytest.mark.slow]

SCHEMA = f"wide_{RUN_ID}"
PREFIX = f"wide{RUN_ID}"
DATABASE = f"wide_{RUN_ID}"
TOPIC = f"{PREFIX}.{SCHEMA}.wide"
TYPES = ("int", "text", "numeric(12,2)", "bigint", "boolean", "double precision", "date", "varchar(30)")
COLUMNS = 400
VALUES = {  # a value per type, from the row number n
    "int": "n", "text": "'t' || n", "numeric(12,2)": "n * 1.25", "bigint": "n * 100000000000",
    "boolean": "n % 2 = 0", "double precision": "n / 3.0", "date": "date '2024-01-01' + n", "varchar(30)": "'v' || n",
}


def column_type(i: int) -> str:
    return TYPES[i % len(TYPES)]


DDL = (f"create schema {SCHEMA}; create table {SCHEMA}.wide (id int primary key, "
       + ", ".join(f"c{i} {column_type(i)}" for i in range(COLUMNS)) + ");"
       + f"insert into {SCHEMA}.wide select n, "
       + ", ".join(f"{VALUES[column_type(i)].replace('n', '(n + ' + str(i) + ')')}" for i in range(COLUMNS))
       + " from generate_series(1, 50) n;")


@pytest.fixture(scope="module")
def pg_conn(stack: None) -> Iterator[psycopg.Connection]:
    with source_schema(SCHEMA, DDL) as conn:
        yield conn


@pytest.fixture(scope="module")
def pipeline(
    spark: SparkSession, local_config: JobConfig, pg_conn: psycopg.Connection, lake_root: str
) -> Iterator[Pipeline]:
    with debezium_connector(f"wide-{RUN_ID}", PREFIX, [SCHEMA]):
        yield Pipeline.of(spark, job_config_for(local_config, PREFIX, DATABASE, f"{lake_root}/wide"))


def assert_equal(p: Pipeline, conn: psycopg.Connection) -> None:
    names = ["id"] + [f"c{i}" for i in range(COLUMNS)]
    text = ", ".join(f"{c}::text" for c in names)
    expected = {r[0]: r for r in conn.execute(f"select {text} from {SCHEMA}.wide").fetchall()}
    silver_df = p.spark.read.format("hudi").load(p.config.lake.table_path(f"{SCHEMA}_wide"))
    rows = silver_df.selectExpr(*[f"cast({c} as string)" for c in names]).collect()
    actual = {row[0]: tuple(row) for row in rows}
    assert actual.keys() == expected.keys()
    for key, want in expected.items():
        got = actual[key]
        for name, g, w in zip(names, got, want, strict=True):
            if name != "id" and column_type(int(name[1:])) == "double precision":
                assert float(g) == pytest.approx(float(w), rel=1e-15), (key, name)
            else:
                assert g == w, (key, name, g, w)


def test_a_wide_table_equals_the_source(pipeline: Pipeline, pg_conn: psycopg.Connection) -> None:
    wait_for_records(TOPIC, 50, 120)
    pipeline.run()
    assert_equal(pipeline, pg_conn)
    pg_conn.execute(f"update {SCHEMA}.wide set c1 = c1 || '!', c{COLUMNS - 1} = null, c5 = c5 + 1")
    wait_for_records(TOPIC, 100, 120)
    pipeline.run()
    assert_equal(pipeline, pg_conn)
