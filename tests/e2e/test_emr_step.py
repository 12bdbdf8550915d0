"""The EMR step's own spark-submit command line, run on the local stack: package and config read from S3.

scripts/emr/step.json is rendered as scripts/emr/deploy.sh renders it (its S3 root here on the stack's S3 server,
`--available-now` appended) and run with only the cluster's paths swapped for local ones: spark-submit and the
3.11 interpreter from .venv/bin, the jars (the cluster's Hudi bundle and the uploaded set) from .deps/spark. What
the cluster's spark-defaults give a step on EMR, a local SPARK_CONF_DIR gives here: the driver's classpath, and
s3:// (EMRFS there) as S3A against the stack's server. The working directory is an empty folder.

The job does one available-now run over a small PostgreSQL table captured by Debezium, and Silver must equal it.
"""
from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import boto3
import psycopg
import pytest
import yaml
from pyspark.sql import SparkSession

from tests.conftest import LOCAL_CONF, ROOT, RUN_ID
from tests.support.cdc import debezium_connector, wait_for_records
from tests.support.pipeline import source_schema, spark_submit_conf

pytestmark = [pytest.mark.stack, pytest.mark.slow]

SCHEMA = f"emr_{RUN_ID}"
PREFIX = f"emr{RUN_ID}"
DATABASE = f"emr_{RUN_ID}"
S3_ENDPOINT = "http://127.0.0.1:9000"
BUCKET = "lake"
S3_ROOT = f"s3://{BUCKET}/tests/{RUN_ID}/emr-step"
CLUSTER_PYTHON = "/opt/cdc-lakehouse/python/bin/python"
ROWS = 25

DDL = f"""
create schema {SCHEMA};
create table {SCHEMA}.items (id int primary key, name text not null, price numeric(10,2), added date);
insert into {SCHEMA}.items select i, 'item ' || i, i * 1.25, date '2024-01-01' + i from generate_series(1, {ROWS}) i;
"""


@pytest.fixture(scope="module")
def pg_conn(stack: None) -> Iterator[psycopg.Connection]:
    with source_schema(SCHEMA, DDL) as conn:
        yield conn


def job_conf(lake: str, warehouse: Path) -> bytes:
    """conf/local.yaml on this test's topics and lake; no jars_dir (the step's --jars bring the jars, as on EMR)."""
    return spark_submit_conf(PREFIX, DATABASE, lake, str(warehouse))


def local_step_args(jars: list[str]) -> list[str]:
    """The step's Args as deploy.sh renders them, with the cluster's paths swapped for local ones."""
    steps = json.loads((ROOT / "scripts" / "emr" / "step.json").read_text().replace("@S3_ROOT@", S3_ROOT))
    args: list[str] = [*steps[0]["Args"], "--available-now"]
    assert args[0] == "spark-submit"
    args[0] = str(ROOT / ".venv" / "bin" / "spark-submit")
    args = [a.replace(CLUSTER_PYTHON, str(ROOT / ".venv" / "bin" / "python")) for a in args]
    args[args.index("--jars") + 1] = ",".join(jars)
    return args


def spark_defaults(folder: Path, jars: list[str]) -> Path:
    """What EMR's /etc/spark/conf/spark-defaults.conf gives every step, for the stack."""
    folder.mkdir()
    local = yaml.safe_load(LOCAL_CONF.read_text())["spark"]["conf"]
    s3a = {k: v for k, v in local.items() if k.startswith("spark.hadoop.fs.s3a.")}
    defaults = {
        # Under spark-submit the driver JVM is up before the job's config is read: the metastore's JDBC driver
        # must already be on its classpath (EMR's defaults put the Glue client there).
        "spark.driver.extraClassPath": ":".join(jars),
        "spark.hadoop.fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
        **s3a,
    }
    (folder / "spark-defaults.conf").write_text("".join(f"{k} {v}\n" for k, v in defaults.items()))
    return folder


def test_emr_step_command_line_runs_the_package_from_s3(
    spark: SparkSession, pg_conn: psycopg.Connection, lake_root: str, test_dir: Path
) -> None:
    folder = test_dir / "emr-step"
    folder.mkdir()
    package = folder / "package"
    subprocess.run(["bash", str(ROOT / "scripts" / "package.sh"), "--out", str(package)], check=True,
                   capture_output=True)
    lake = f"{lake_root}/emr-step"
    s3 = boto3.client("s3", endpoint_url=S3_ENDPOINT, region_name="us-east-1",
                      aws_access_key_id="local", aws_secret_access_key="local")
    prefix = S3_ROOT.removeprefix(f"s3://{BUCKET}/")
    for name in ("cdc_lakehouse.zip", "main.py"):
        s3.upload_file(str(package / name), BUCKET, f"{prefix}/{name}")
    s3.put_object(Bucket=BUCKET, Key=f"{prefix}/conf.yaml", Body=job_conf(lake, folder / "warehouse"))

    jars = sorted(str(p) for p in (ROOT / ".deps" / "spark").glob("*.jar"))
    args = local_step_args(jars)
    cwd = folder / "cwd"  # any working directory: nothing of the repository in it
    cwd.mkdir()
    env = {
        **os.environ,
        # pip's spark-submit finds its Spark home with the python3 first on PATH.
        "PATH": f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "SPARK_CONF_DIR": str(spark_defaults(folder / "spark-conf", jars)),
        "AWS_ENDPOINT_URL_S3": S3_ENDPOINT,  # boto3 reads the config from the stack's S3 server
        "AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local", "AWS_DEFAULT_REGION": "us-east-1",
    }
    env.pop("PYTHONPATH", None)
    log = folder / "job.log"
    with debezium_connector(f"emr-{RUN_ID}", PREFIX, [SCHEMA]):
        wait_for_records(f"{PREFIX}.{SCHEMA}.items", ROWS)
        with log.open("wb") as out:
            done = subprocess.run(args, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=600,
                                  check=False)
    lines = log.read_text(errors="replace").splitlines()
    assert done.returncode == 0, "\n".join(lines[-40:])
    # The job ran from the downloaded package: app/ from the zip --py-files fetched, the config from S3.
    started = [line for line in lines if "job code" in line]
    assert len(started) == 1 and f"cdc_lakehouse.zip/app, config {S3_ROOT}/conf.yaml" in started[0], started
    assert any("query cdc-lakehouse finished" in line for line in lines), "\n".join(lines[-40:])

    silver = spark.read.format("hudi").load(f"{lake}/silver/{DATABASE}/{SCHEMA}_items")
    actual = sorted(tuple(r) for r in silver.selectExpr("id", "name", "cast(price as string)", "added").collect())
    expected = sorted(pg_conn.execute(f"select id, name, price::text, added from {SCHEMA}.items").fetchall())
    assert len(expected) == ROWS
    assert actual == expected
