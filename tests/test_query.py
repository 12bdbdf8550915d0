"""scripts/query.py: Spark SQL on the lake through the job's session settings, on the real metastore."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from pyspark.sql import SparkSession

from app.sink.hudi import completed_instants
from tests.conftest import LOCAL_CONF, ROOT

pytestmark = [pytest.mark.stack]


def _query(*statements: str) -> subprocess.CompletedProcess[str]:
    args = [a for s in statements for a in ("-e", s)]
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "query.py"), "--conf", str(LOCAL_CONF), *args],
                          capture_output=True, text=True, timeout=300, check=False, cwd=ROOT,
                          env={**os.environ, "METASTORE_PASSWORD": os.environ.get("METASTORE_PASSWORD", "postgres")})


def test_query_shows_results_and_names_an_sql_error(stack: None) -> None:
    out = _query("select 6 * 7 as answer", "show databases")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "|answer|" in out.stdout and "|42    |" in out.stdout
    assert "default" in out.stdout

    bad = _query("select * from no_such_database.no_such_table")
    assert bad.returncode == 1 and "error:" in bad.stderr and "no_such" in bad.stderr


def test_query_takes_hudi_sql(spark: SparkSession, lake_root: str, stack: None) -> None:
    """query.py's session has Hudi's SQL extension (the job's has not, app/spark.py `HUDI_SQL_CONF`): its table
    functions work there."""
    path = f"{lake_root}/query_hudi"
    options = {
        "hoodie.table.name": "query_hudi",
        "hoodie.datasource.write.recordkey.field": "id",
        "hoodie.datasource.write.precombine.field": "lsn",
        "hoodie.datasource.write.keygenerator.class": "org.apache.hudi.keygen.NonpartitionedKeyGenerator",
        "hoodie.datasource.write.partitionpath.field": "",
        "hoodie.metadata.enable": "false",
    }
    for rows in ([(1, "one", 10)], [(1, "uno", 20), (2, "two", 20)]):
        spark.createDataFrame(rows, "id int, name string, lsn long").write.format("hudi").options(**options) \
            .mode("append").save(path)
    first = completed_instants(spark, path)[0]

    out = _query(f"select id, name from hudi_table_changes('{path}', 'latest_state', '{first}') order by id")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "uno" in out.stdout and "two" in out.stdout and "one" not in out.stdout, out.stdout
