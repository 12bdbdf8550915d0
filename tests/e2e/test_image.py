"""The container image (Dockerfile), built and run here: one available-now job through the image's own entrypoint.

scripts/image.sh builds the image on its debootstrap base (podman's layer cache keeps an unchanged rebuild to
seconds) and runs it: the image's ENTRYPOINT (spark-submit app/main.py with the image's jars) with the image's ENV,
WORKDIR and non-root USER, through chroot --userspec into the mounted image, because podman run cannot run in this
sandbox. The host's loopback is shared, so the job reaches the local stack; its config comes from the stack's S3
server (`--conf s3://...`), as a container's would from a bucket.

The job does one available-now run over a small PostgreSQL table captured by Debezium, and Silver must equal it value
by value, a bit(10) column included: only the image's own cdc-functions.jar decodes that one.
"""
from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import boto3
import psycopg
import pytest
from pyspark.sql import SparkSession

from tests.conftest import ROOT, RUN_ID
from tests.support.cdc import debezium_connector, wait_for_records
from tests.support.pipeline import differences, source_schema, spark_submit_conf

pytestmark = [pytest.mark.stack, pytest.mark.slow]

IMAGE_SH = ROOT / "scripts" / "image.sh"
TAG = "localhost/cdc-lakehouse"
SCHEMA = f"img_{RUN_ID}"
PREFIX = f"img{RUN_ID}"
DATABASE = f"img_{RUN_ID}"
S3_ENDPOINT = "http://127.0.0.1:9000"
BUCKET = "lake"
CONF_KEY = f"tests/{RUN_ID}/image/conf.yaml"
ROWS = 25
# A cold build (no base image, no layer cache) downloads Debian packages, wheels and jars; a warm one takes seconds.
BUILD_TIMEOUT_S = 3600
RUN_TIMEOUT_S = 600
COLUMNS = ("id", "name", "price", "added", "flags", "note")

DDL = f"""
create schema {SCHEMA};
create table {SCHEMA}.items (
  id int primary key, name text not null, price numeric(10,2), added date, flags bit(10), note text
);
insert into {SCHEMA}.items
select i, 'item ' || i, i * 1.25, date '2024-01-01' + i, (i * 37 % 1024)::bit(10),
       case when i % 2 = 0 then 'note ' || i end
from generate_series(1, {ROWS}) i;
"""


@pytest.fixture(scope="module")
def pg_conn(stack: None) -> Iterator[psycopg.Connection]:
    with source_schema(SCHEMA, DDL) as conn:
        yield conn


@pytest.fixture(scope="module")
def image() -> str:
    """The image, built (or found up to date in podman's layer cache) by scripts/image.sh."""
    build = subprocess.run(["bash", str(IMAGE_SH)], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S,
                           check=False)
    assert build.returncode == 0, f"{build.stdout[-4000:]}\n{build.stderr[-4000:]}"
    # The script's own summary: build times (base and image) and the image's size.
    print("".join(line + "\n" for line in build.stderr.splitlines() if line.startswith("[image]")), end="")
    print(build.stdout.splitlines()[-1])
    return TAG


def image_config(tag: str, field: str) -> str:
    return subprocess.run(["podman", "image", "inspect", "--format", f"{{{{.Config.{field}}}}}", tag],
                          capture_output=True, text=True, check=True).stdout.strip()


def job_conf(lake: str) -> bytes:
    """conf/local.yaml on this test's topics and lake. No jars_dir (the entrypoint's --jars bring the image's jars);
    the metastore's warehouse folder inside the image, under the run's fresh /tmp."""
    return spark_submit_conf(PREFIX, DATABASE, lake, "/tmp/warehouse")


def run_image(args: list[str], log: Path) -> int:
    """scripts/image.sh run in a session of its own: on a timeout the whole group (script, chroot, JVM, Python) gets
    SIGTERM, so the script's trap still unmounts what it mounted."""
    with log.open("wb") as out:
        proc = subprocess.Popen(["bash", str(IMAGE_SH), "run", *args], stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            return proc.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
            raise


def test_image_entrypoint_runs_the_job_as_its_own_user(
    spark: SparkSession, pg_conn: psycopg.Connection, image: str, lake_root: str, test_dir: Path
) -> None:
    user = image_config(image, "User")
    assert user.split(":")[0] not in ("", "0", "root"), f"the image runs as {user!r}"

    folder = test_dir / "image"
    folder.mkdir()
    lake = f"{lake_root}/image"
    s3 = boto3.client("s3", endpoint_url=S3_ENDPOINT, region_name="us-east-1",
                      aws_access_key_id="local", aws_secret_access_key="local")
    s3.put_object(Bucket=BUCKET, Key=CONF_KEY, Body=job_conf(lake))
    conf_uri = f"s3://{BUCKET}/{CONF_KEY}"

    # What a container gets with `-e`: the stack's S3 keys (s3a and boto3), where boto3 finds that S3 server for the
    # s3:// config, the metastore's password, and the suite's time zone (no conversion may depend on it).
    env = {
        "AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local", "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL_S3": S3_ENDPOINT, "METASTORE_PASSWORD": "postgres",
        "TZ": os.environ.get("TZ", "America/Los_Angeles"),
    }
    args = [arg for name, value in env.items() for arg in ("-e", f"{name}={value}")]
    log = folder / "job.log"
    with debezium_connector(f"image-{RUN_ID}", PREFIX, [SCHEMA]):
        wait_for_records(f"{PREFIX}.{SCHEMA}.items", ROWS)
        rc = run_image([*args, "--", "--conf", conf_uri, "--available-now"], log)
    lines = log.read_text(errors="replace").splitlines()
    tail = "\n".join(lines[-40:])
    assert rc == 0, f"the image's job exited {rc}:\n{tail}"
    # Run as the image's user, the job's code and jars from the image, the config from S3.
    assert any(line.startswith("[image] run ") and f" as {user} " in line for line in lines), tail
    started = [line for line in lines if "job code" in line]
    assert len(started) == 1 and f"job code /opt/cdc-lakehouse/app, config {conf_uri}" in started[0], started
    assert any("query cdc-lakehouse finished" in line for line in lines), tail

    silver = spark.read.format("hudi").load(f"{lake}/silver/{DATABASE}/{SCHEMA}_items")
    rows = silver.selectExpr("id", "name", "cast(price as string)", "added", "flags", "note").collect()
    actual = {r[0]: tuple(r) for r in rows}
    source = pg_conn.execute(f"select id, name, price::text, added, flags::text, note from {SCHEMA}.items")
    expected = {r[0]: tuple(r) for r in source.fetchall()}
    assert len(expected) == ROWS and len(rows) == len(actual)
    assert not differences(actual, expected, COLUMNS), "\n".join(differences(actual, expected, COLUMNS))
