"""The metastore is shared: a table registered by one Spark process is visible from a second process."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

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
