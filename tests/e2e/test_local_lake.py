"""The lake on local paths (README: "local paths work too"), meta sync on: Silver, Bronze and the checkpoint in
local folders, the job as its own process under spark-submit (`scripts/submit.sh --conf ... --available-now`) over
a small PostgreSQL table captured by Debezium.

Every other end-to-end test keeps the lake on s3a. Hudi's meta sync builds its HiveConf from the Hadoop
Configuration of the table's FileSystem alone. Under spark-submit, Hadoop's cached `file:` FileSystem is made by
SparkSubmit while it resolves `--jars`, before the job reads its config, from a Configuration without the
session's spark.hadoop.* settings (the metastore's javax.jdo.*): with that instance the sync opened an empty
embedded Derby metastore and the first commit failed (`Hive metastore database is not initialized`). `python
app/main.py` hands the session's settings to the JVM it launches, so only spark-submit (scripts/submit.sh, an EMR
step, the image) shows it. The job runs in the test's folder: a Derby `metastore_db` would appear there.

Silver must equal PostgreSQL; the table and its columns must be in the PostgreSQL-backed metastore's own tables
(DBS, TBLS, SDS, COLUMNS_V2: what Athena or a plain Hive client reads), located at the local Silver folder; and the
metastore password (a sentinel here: the stack's PostgreSQL trusts local connections) is in neither the lake nor
the job's log.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import yaml
from pyspark.sql import SparkSession

from app.sink.bronze import read_bronze
from tests.conftest import LOCAL_CONF, ROOT, RUN_ID
from tests.support.cdc import debezium_connector, wait_for_records
from tests.support.metastore import metastore_table
from tests.support.pipeline import source_schema

pytestmark = [pytest.mark.stack, pytest.mark.slow]

SCHEMA = f"ll_{RUN_ID}"
PREFIX = f"ll{RUN_ID}"
DATABASE = f"ll_{RUN_ID}"
TABLE = f"{SCHEMA}_items"
ROWS = 12
PASSWORD = f"metastore-pw-{RUN_ID}"  # any password passes the stack's trust authentication

DDL = f"""
create schema {SCHEMA};
create table {SCHEMA}.items (id int primary key, name text not null, price numeric(10,2));
insert into {SCHEMA}.items select i, 'item ' || i, i * 1.25 from generate_series(1, {ROWS}) i;
"""


@pytest.fixture(scope="module")
def pg_conn(stack: None) -> Iterator[psycopg.Connection]:
    with source_schema(SCHEMA, DDL) as conn:
        yield conn


def job_conf(folder: Path) -> Path:
    """conf/local.yaml on this test's topics, with Silver, Bronze, the checkpoint and the warehouse in `folder`
    (plain local paths, no scheme); no jars_dir (scripts/submit.sh puts .deps/spark on the command line)."""
    raw = yaml.safe_load(LOCAL_CONF.read_text())
    raw["kafka"].update({"topic_pattern": PREFIX + r"\.[^.]+\.[^.]+", "max_offsets_per_trigger": None})
    raw.pop("sources", None)
    raw["source"] = {"topic_prefix": PREFIX, "framing": "id4", "id_type": "contentId"}
    raw["lake"].update({
        "database": DATABASE, "silver_path": str(folder / "silver"), "bronze_path": str(folder / "bronze"),
        "checkpoint_path": str(folder / "checkpoint"),
    })
    raw["metastore"]["warehouse_path"] = str(folder / "warehouse")
    raw["spark"].pop("jars_dir")
    # The class archive by its absolute path (the job runs in `folder`); submit.sh hands it to the driver JVM.
    raw["spark"]["class_archive"] = str(ROOT / ".deps" / "cds" / "spark.jsa")
    # conf/local.yaml's options of an --available-now run, for topics holding few records: submit.sh counts them.
    assert raw["spark"]["available_now_java_options"] == (
        "-XX:TieredStopAtLevel=1 -XX:+UseParallelGC -XX:CICompilerCount=1")
    assert raw["spark"]["available_now_java_options_max_records"] >= ROWS
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_local_lake_with_meta_sync(spark: SparkSession, pg_conn: psycopg.Connection, test_dir: Path) -> None:
    folder = test_dir / "local-lake"
    folder.mkdir()
    conf = job_conf(folder)
    log = folder / "job.log"
    tool_options = os.environ.get("JAVA_TOOL_OPTIONS", "").split()
    env = {**os.environ, "METASTORE_PASSWORD": PASSWORD, "JAVA_TOOL_OPTIONS": " ".join(
        o for o in tool_options
        if not o.startswith(("-XX:SharedArchiveFile=", "-Xlog:cds", "-XX:TieredStopAtLevel", "-XX:+UseSerialGC")))}
    with debezium_connector(f"ll-{RUN_ID}", PREFIX, [SCHEMA]):
        wait_for_records(f"{PREFIX}.{SCHEMA}.items", ROWS)
        with log.open("wb") as out:
            done = subprocess.run(
                ["bash", str(ROOT / "scripts" / "submit.sh"), "--conf", str(conf), "--available-now"],
                cwd=folder, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=600, check=False,
            )
    lines = log.read_text(errors="replace").splitlines()
    assert done.returncode == 0, "\n".join(lines[-60:])
    assert any("query cdc-lakehouse finished" in line for line in lines), "\n".join(lines[-60:])
    # Where the driver JVM's time went, at the query's end (the CPU from /proc on this Linux machine).
    assert any(re.search(r"app\.job: driver JVM up [\d.]+ s, CPU [\d.]+ s; JIT compilers busy [\d.]+ s", line)
               for line in lines), "\n".join(lines[-20:])
    # The driver JVM was given the config's class archive (scripts/test.sh makes it) and its --available-now
    # options (C1 only, the parallel collector) by submit.sh, not by the tests' JAVA_TOOL_OPTIONS, which went without
    # them: the test's topic holds its ROWS records, within the config's limit, as submit.sh's count says (the job
    # itself, started by spark-submit's driver, does not count again).
    assert any(f"app.job: the topics hold {ROWS} records, within spark.available_now_java_options_max_records"
               in line for line in lines), [line for line in lines if "app.job" in line][:5]
    assert any(f"driver class archive {ROOT}/.deps/cds/spark.jsa, compilers C1 only, collector Parallel" in line
               for line in lines), [line for line in lines if "session up" in line]
    # Every batch's metrics line was written, the last one's too (its query's progress delivered before the process
    # ended), and the JVM never called into a Python process that had left.
    done_ids = {int(line.split("batch=")[1].split()[0]) for line in lines if "app.batch.processor: batch=" in line
                and " done tables=" in line}
    metric_ids = {json.loads(line.split(" metrics ", 1)[1])["batch_id"] for line in lines
                  if "app.metrics: metrics {" in line}
    assert done_ids and metric_ids == done_ids, (done_ids, metric_ids)
    assert not [line for line in lines if "StreamingQueryListenerBus" in line], "\n".join(lines[-60:])
    # No embedded Derby metastore was opened in the job's working directory.
    assert not (folder / "metastore_db").exists()

    # Silver equals PostgreSQL.
    silver_table = folder / "silver" / DATABASE / TABLE
    silver = spark.read.format("hudi").load(str(silver_table))
    actual = sorted(tuple(r) for r in silver.selectExpr("id", "name", "cast(price as string)").collect())
    expected = sorted(pg_conn.execute(f"select id, name, price::text from {SCHEMA}.items").fetchall())
    assert len(expected) == ROWS
    assert actual == expected

    # Bronze and the checkpoint are local folders, written.
    bronze = read_bronze(spark, str(folder / "bronze"))
    assert bronze is not None and bronze.count() == ROWS
    assert any((folder / "checkpoint" / "commits").iterdir())

    # The metastore's own tables (PostgreSQL), not what a Hudi-aware session reads from the files.
    registered = metastore_table(DATABASE, TABLE)
    assert registered is not None, f"{DATABASE}.{TABLE} not in the metastore database"
    table_type, location, columns = registered
    assert table_type == "EXTERNAL_TABLE", table_type
    assert location.removeprefix("file:").rstrip("/") == str(silver_table), location
    assert {"id", "name", "price", "_hoodie_commit_time"} <= set(columns), columns

    # The password reached the metastore connection only: nothing in the lake, nothing in the log.
    for path in folder.rglob("*"):
        if path.is_file():
            assert PASSWORD.encode() not in path.read_bytes(), f"metastore password in {path}"
