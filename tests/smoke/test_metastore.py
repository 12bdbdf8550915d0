"""The metastore is shared: a table registered by one Spark process is visible from a second process, and
within one process Hudi's meta sync and Spark's own Hive client share its connection factory."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from app.sink.hudi import HudiTarget, write_silver
from tests.conftest import ROOT, RUN_ID

pytestmark = pytest.mark.stack

READER = """
import dataclasses, sys
from app.config import load_config
from app.spark import build_session
cfg = load_config("conf/local.yaml")
spark = build_session("metastore-reader", cfg.spark, cfg.metastore)
rows = spark.sql("select id, name from {table} order by id").collect()
print("ROWS=" + repr([(r.id, r.name) for r in rows]))
"""


def test_table_visible_from_second_process(spark: SparkSession, test_dir: Path) -> None:
    database, table = f"smoke_{RUN_ID}", "shared"
    path = test_dir / "metastore_shared"
    spark.sql(f"create database if not exists {database}")
    spark.createDataFrame([(1, "a"), (2, "b")], "id int, name string").write.parquet(str(path))
    spark.sql(f"create table {database}.{table} (id int, name string) using parquet location '{path}'")

    out = subprocess.run(
        [sys.executable, "-c", READER.format(table=f"{database}.{table}")],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ROWS=[(1, 'a'), (2, 'b')]" in out.stdout


def test_meta_sync_and_spark_keep_one_metastore_connection_factory(spark: SparkSession, lake_root: str) -> None:
    """A synced commit, then Spark's catalog, then another commit: the embedded metastore's connection factory
    (static in Hive's ObjectStore) is the same object throughout, not rebuilt for each client (app/spark.py
    `metastore_store_keys`)."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    field = jvm.java.lang.Class.forName("org.apache.hadoop.hive.metastore.ObjectStore").getDeclaredField("pmf")
    field.setAccessible(True)
    target = HudiTarget(database=f"smoke_{RUN_ID}", table="pmf", path=f"{lake_root}/pmf", record_key=("id",))
    rows = spark.range(3).select(
        "id", F.lit("x").alias("name"), F.lit("0").alias("_cdc_position"), F.lit(False).alias("_hoodie_is_deleted")
    )

    factories = []
    for batch in range(3):
        write_silver(rows, target, batch, RUN_ID)  # Hudi's HiveSyncTool
        assert spark.sql(f"show tables in {target.database}").filter("tableName = 'pmf'").count() == 1  # Spark's
        factories.append(jvm.java.lang.System.identityHashCode(field.get(None)))

    assert len(set(factories)) == 1, factories
