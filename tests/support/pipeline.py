"""The job as the end-to-end tests drive it: in this process, available-now runs, against one source schema."""
from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Self

import psycopg
import yaml
from chispa.row_comparer import are_rows_equal_enhanced
from chispa.rows_comparer import assert_basic_rows_equality, assert_generic_rows_equality
from chispa.schema_comparer import assert_schema_equality
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from app.batch.processor import BatchProcessor
from app.config import JobConfig
from app.job import await_query, start_query
from app.sink.hudi import HudiTarget, write_options
from app.wire.registry import RegistryClient
from tests.conftest import LOCAL_CONF
from tests.support.cdc import PG_DSN


@dataclasses.dataclass
class Pipeline:
    spark: SparkSession
    config: JobConfig
    processor: BatchProcessor

    @classmethod
    def of(cls, spark: SparkSession, config: JobConfig) -> Self:
        return cls(spark, config, BatchProcessor(config, RegistryClient.from_config(config.registry)))

    def run(self) -> None:
        """Every offset present now, through the same start/await functions as app/main.py."""
        query = start_query(self.spark, self.config, self.processor, available_now=True)
        await_query(query, self.processor)


@contextmanager
def source_schema(schema: str, ddl: str) -> Iterator[psycopg.Connection]:
    """A fresh PostgreSQL schema made by `ddl`, dropped afterwards; yields an autocommit connection."""
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        conn.execute(f"drop schema if exists {schema} cascade")
        conn.execute(ddl)
        yield conn
        conn.execute(f"drop schema if exists {schema} cascade")


def spark_submit_conf(prefix: str, database: str, lake: str, warehouse: str) -> bytes:
    """conf/local.yaml as YAML for a job run by spark-submit (an EMR step, the image): one source on `prefix`'s
    topics (the tests' connectors' framing), its own database, lake and metastore warehouse folder, and no
    `jars_dir` (the command line brings the jars)."""
    raw = yaml.safe_load(LOCAL_CONF.read_text())
    raw["kafka"].update({"topic_pattern": prefix + r"\.[^.]+\.[^.]+", "max_offsets_per_trigger": None})
    raw.pop("sources", None)
    raw["source"] = {"topic_prefix": prefix, "framing": "id4", "id_type": "contentId"}
    raw["lake"].update({
        "database": database, "silver_path": f"{lake}/silver", "bronze_path": f"{lake}/bronze",
        "checkpoint_path": f"{lake}/checkpoint",
    })
    raw["metastore"]["warehouse_path"] = warehouse
    raw["spark"].pop("jars_dir")
    return yaml.safe_dump(raw).encode()


def differences(
    actual: dict[int, tuple[Any, ...]], expected: dict[int, tuple[Any, ...]], columns: tuple[str, ...]
) -> list[str]:
    """Every value that differs between Silver and PostgreSQL rows by `id`, named by key and column."""
    found = [f"id {k}: missing in Silver" for k in sorted(expected.keys() - actual.keys())]
    found += [f"id {k}: in Silver only" for k in sorted(actual.keys() - expected.keys())]
    for key in sorted(expected.keys() & actual.keys()):
        for column, got, want in zip(columns, actual[key], expected[key], strict=True):
            if got != want:
                found.append(f"id {key} {column}: Silver {got!r}, PostgreSQL {want!r}")
    return found


def assert_columns_equal(actual_df: DataFrame, expected_df: DataFrame, columns: list[str], *,
                         ignore_nullable: bool = False, allow_nan_equality: bool = False) -> None:
    """chispa's equality of `id` and each column, one column at a time (a failure names the column), ordered by
    `id`: each column's schema, then its rows, as `assert_df_equality` compares them. Each side is collected once
    (a Spark job per column and side took 20 s for a table of 80 columns) and its columns compared from memory."""
    actual_rows, expected_rows = actual_df.orderBy("id").collect(), expected_df.orderBy("id").collect()
    actual_schema, expected_schema = actual_df.schema, expected_df.schema
    for column in columns:
        assert_schema_equality(StructType([actual_schema["id"], actual_schema[column]]),
                               StructType([expected_schema["id"], expected_schema[column]]), ignore_nullable)
        pair = Row("id", column)
        actual = [pair(r["id"], r[column]) for r in actual_rows]
        expected = [pair(r["id"], r[column]) for r in expected_rows]
        if allow_nan_equality:
            assert_generic_rows_equality(actual, expected, are_rows_equal_enhanced, {"allow_nan_equality": True})
        else:
            assert_basic_rows_equality(actual, expected)


def rewrite_with_type(spark: SparkSession, config: JobConfig, table: str, column: str, type_: str) -> None:
    """The fix for a type change Hudi refuses (a quarantined table): the table, keyed by `id`, rewritten whole with
    `column` cast to `type_` (Hudi's overwrite)."""
    path = config.lake.table_path(table)
    target = HudiTarget(database=config.lake.database, table=table, path=path, record_key=("id",))
    current = spark.read.format("hudi").load(path)
    rows = current.drop(*[c for c in current.columns if c.startswith("_hoodie_") and c != "_hoodie_is_deleted"])
    rows = rows.withColumn(column, F.col(column).cast(type_))
    rows = spark.createDataFrame(rows.collect(), rows.schema)  # read whole before the overwrite removes the files
    rows.write.format("hudi").options(**write_options(target, 0, "rewrite")).mode("overwrite").save(path)
