"""The EMR step as scripts/emr/deploy.sh ships it, run on the local stack: package, jars and config read from S3.

deploy.sh's dry run is played against the stack: its local commands run (package.sh, fetch_jars.py emr), its uploads
go to the stack's S3 server, and the step it renders (S3 root there, `--available-now`) runs with only the cluster's
paths swapped for local ones: spark-submit and the 3.11 interpreter from .venv/bin, and the cluster's Hudi bundle
(/usr/lib/hudi/hudi-spark-bundle.jar) for .deps/spark's. Every other jar comes off S3 as the step names it: the `emr`
set and the package's cdc-functions.jar. What the cluster's spark-defaults give a step on EMR, a local
SPARK_CONF_DIR gives here: the cluster's own classpath, standing in for EMRFS (hadoop-aws and the AWS SDK bundle,
s3:// as S3A against the stack's server) and for the Glue client's metastore (the PostgreSQL driver), and no other
jar of .deps/spark; and a hive-site.xml naming the metastore, as the spark-hive-site classification of README's
create-cluster does (Glue there). The working directory is an empty folder; the lake is on s3://, as prod.yaml has it.

The job does one available-now run over a small PostgreSQL table captured by Debezium, and Silver must equal it,
numeric(50,10) and bit(10) columns included: only cdc-functions.jar decodes those (app/cdc/debezium_types.py,
`reflect`).
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

import boto3
import psycopg
import pytest
import yaml
from pyspark.sql import SparkSession

from app.config import MetastoreConfig
from app.spark import metastore_conf
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
CLUSTER_HUDI = "/usr/lib/hudi/hudi-spark-bundle.jar"
ROWS = 25

# numeric(50,10): 40 digits before the point, some values negative, some small, some NULL; bit(10), some NULL.
DDL = f"""
create schema {SCHEMA};
create table {SCHEMA}.items (
  id int primary key, name text not null, price numeric(10,2), added date, big numeric(50,10), flags bit(10)
);
insert into {SCHEMA}.items select i, 'item ' || i, i * 1.25, date '2024-01-01' + i,
  case when i % 10 = 0 then null
       when i % 3 = 0 then i / 1000.0
       else (case when i % 2 = 0 then -1 else 1 end) * (1234567890123456789012345678901234567890.0123456789 + i) end,
  case when i % 10 = 5 then null else (i * 37 % 1024)::bit(10) end
from generate_series(1, {ROWS}) i;
"""


@pytest.fixture(scope="module")
def pg_conn(stack: None) -> Iterator[psycopg.Connection]:
    with source_schema(SCHEMA, DDL) as conn:
        yield conn


def deps_jar(pattern: str) -> Path:
    """The one jar of .deps/spark matching `pattern`."""
    found = sorted((ROOT / ".deps" / "spark").glob(pattern))
    assert len(found) == 1, f"{pattern} in .deps/spark: {found} (run scripts/setup.sh jars)"
    return found[0]


def s3_object(uri: str) -> tuple[str, str]:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bucket, key


def play_deploy(printed: str, s3: Any) -> Path:
    """deploy.sh --dry-run's commands, played against the stack: the local ones run, `aws s3 cp` uploads to the
    stack's S3 server, the cluster's calls are left out. Returns the step file `aws emr add-steps` would send."""
    step_file = None
    for line in printed.splitlines():
        argv = shlex.split(line) if line[:1].isalpha() else []  # not the step's JSON, not the closing comment
        match argv:
            case []:
                pass
            case ["bash" | "python3", *_]:
                subprocess.run(argv, check=True, capture_output=True, timeout=600)
            case ["aws", "emr", "describe-cluster", *_]:
                pass
            case ["aws", "s3", "cp", "--recursive", folder, target, "--exclude", "*", "--include", "*.jar"]:
                jars = sorted(Path(folder).glob("*.jar"))
                assert jars, f"nothing to upload in {folder}"
                for jar in jars:
                    s3.upload_file(str(jar), *s3_object(f"{target.rstrip('/')}/{jar.name}"))
            case ["aws", "s3", "cp", source, target]:
                s3.upload_file(source, *s3_object(target))
            case ["aws", "emr", "add-steps", "--cluster-id", _, "--steps", steps]:
                step_file = Path(steps.removeprefix("file://"))
            case _:
                pytest.fail(f"deploy.sh --dry-run printed a command this test does not play: {line}")
    assert step_file is not None, printed
    return step_file


def local_step_args(step_file: Path) -> list[str]:
    """The step's Args as deploy.sh rendered them, with the cluster's paths swapped for local ones."""
    steps = json.loads(step_file.read_text())
    assert len(steps) == 1
    args: list[str] = steps[0]["Args"]
    assert args[0] == "spark-submit" and args[-1] == "--available-now", args
    args[0] = str(ROOT / ".venv" / "bin" / "spark-submit")
    args = [a.replace(CLUSTER_PYTHON, str(ROOT / ".venv" / "bin" / "python")) for a in args]
    at = args.index("--jars") + 1
    jars = args[at].split(",")
    assert CLUSTER_HUDI in jars and all(j == CLUSTER_HUDI or j.startswith(f"{S3_ROOT}/") for j in jars), jars
    args[at] = ",".join(str(deps_jar("hudi-spark3.5-bundle_*.jar")) if j == CLUSTER_HUDI else j for j in jars)
    return args


def hive_site(job_conf: bytes) -> str:
    """What EMR's /etc/spark/conf/hive-site.xml (the spark-hive-site classification) says, for the stack's metastore:
    the job's own metastore settings less the password (Hudi's meta sync takes that from the session).

    Needed because Hudi's meta sync builds its Hive settings from the lake's file system, and spark-submit opened
    that one (s3://, the package's bucket) before the job's config was read: without a hive-site.xml the sync opens
    an empty Derby metastore in the working directory. On EMR the classification names Glue the same way."""
    conf = metastore_conf(MetastoreConfig(**yaml.safe_load(job_conf)["metastore"]))
    settings = {key.removeprefix("spark.hadoop."): value for key, value in conf.items()
                if key.startswith("spark.hadoop.") and not key.endswith(".ConnectionPassword")}
    settings["hive.metastore.warehouse.dir"] = conf["spark.sql.warehouse.dir"]
    properties = "".join(f"<property><name>{escape(k)}</name><value>{escape(v)}</value></property>\n"
                         for k, v in settings.items())
    return f"<?xml version=\"1.0\"?>\n<configuration>\n{properties}</configuration>\n"


def spark_defaults(folder: Path, job_conf: bytes) -> Path:
    """What EMR's /etc/spark/conf gives every step (spark-defaults.conf, hive-site.xml), for the stack."""
    folder.mkdir()
    (folder / "hive-site.xml").write_text(hive_site(job_conf))
    local = yaml.safe_load(LOCAL_CONF.read_text())["spark"]["conf"]
    s3a = {k: v for k, v in local.items() if k.startswith("spark.hadoop.fs.s3a.")}
    # The cluster's own classpath: EMRFS (here S3A: hadoop-aws and its SDK bundle) and what the Glue client reaches
    # the catalog with (here the stack's metastore: its JDBC driver, which must be on the driver's classpath before
    # the job's config is read). Nothing else of .deps/spark: the job must bring the rest itself.
    cluster = [deps_jar("hadoop-aws-*.jar"), deps_jar("aws-java-sdk-bundle-*.jar"), deps_jar("postgresql-*.jar")]
    defaults = {
        "spark.driver.extraClassPath": ":".join(map(str, cluster)),
        "spark.executor.extraClassPath": ":".join(map(str, cluster)),
        "spark.hadoop.fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
        **s3a,
    }
    (folder / "spark-defaults.conf").write_text("".join(f"{k} {v}\n" for k, v in defaults.items()))
    return folder


def test_emr_step_runs_the_deployed_package_and_jars_from_s3(
    spark: SparkSession, pg_conn: psycopg.Connection, test_dir: Path
) -> None:
    folder = test_dir / "emr-step"
    folder.mkdir()
    package = folder / "package"
    lake = f"{S3_ROOT}/lake"  # s3:// (EMRFS on EMR, S3A here)
    conf = folder / "conf.yaml"
    # conf/local.yaml on this test's topics and lake; no jars_dir (the step's --jars bring the jars, as on EMR)
    job_conf = spark_submit_conf(PREFIX, DATABASE, lake, str(folder / "warehouse"))
    conf.write_bytes(job_conf)
    s3 = boto3.client("s3", endpoint_url=S3_ENDPOINT, region_name="us-east-1",
                      aws_access_key_id="local", aws_secret_access_key="local")
    deploy = subprocess.run(
        ["bash", str(ROOT / "scripts" / "emr" / "deploy.sh"), "--cluster-id", "j-LOCAL", "--s3-root", S3_ROOT,
         "--conf", str(conf), "--available-now", "--dry-run", "--out", str(package)],
        capture_output=True, text=True, check=True, timeout=60)
    args = local_step_args(play_deploy(deploy.stdout, s3))

    cwd = folder / "cwd"  # any working directory: nothing of the repository in it
    cwd.mkdir()
    env = {
        **os.environ,
        # pip's spark-submit finds its Spark home with the python3 first on PATH.
        "PATH": f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "SPARK_CONF_DIR": str(spark_defaults(folder / "spark-conf", job_conf)),
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

    silver = spark.read.format("hudi").load(f"{lake.replace('s3://', 's3a://', 1)}/silver/{DATABASE}/{SCHEMA}_items")
    # Over 38 digits: the exact decimal text; bit(n): the text of its bits (docs/type-mappings.md "Column types").
    assert dict(silver.dtypes)["big"] == "string" and dict(silver.dtypes)["flags"] == "string", silver.dtypes
    actual = sorted(tuple(r) for r in silver.selectExpr(
        "id", "name", "cast(price as string)", "added", "big", "flags").collect())
    expected = sorted(pg_conn.execute(
        f"select id, name, price::text, added, big::text, flags::text from {SCHEMA}.items").fetchall())
    assert len(expected) == ROWS
    assert actual == expected
