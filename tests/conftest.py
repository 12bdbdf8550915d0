"""Shared fixtures: one SparkSession for the whole run, the local stack's endpoints, a source connection.

Integration tests use the real stack started by scripts/stack.sh (scripts/test.sh starts it); they fail with
a clear message when it is not up instead of skipping.
"""
from __future__ import annotations

import dataclasses
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import psycopg
import pytest
import requests
from botocore.exceptions import ClientError
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from pyspark.sql import SparkSession
from xdist.remote import Producer

from app.config import JobConfig, load_config
from app.spark import build_session, is_object_store
from tests.support.cdc import CONNECT_URL, KAFKA_BOOTSTRAP, PG_DSN, REGISTRY_URL
from tests.support.parallel import ModuleScheduling

ROOT = Path(__file__).resolve().parent.parent
LOCAL_CONF = ROOT / "conf" / "local.yaml"
# The job's jars and jvm/'s io.cdclake.testing (the pause points inside Hudi), for sessions the tests pause in
# their own process (`spark.jars_dir`; scripts/setup.sh jvm): the shipped jars hold none of the testing classes.
TESTING_JARS = ROOT / ".deps" / "spark-testing"
# That jar alone, last on the class path of the job processes the tests start (tests/support/jobprocess.py): their
# class path then begins as every other driver's, whose class-data sharing archive (devkit/cds.py) they map.
TESTING_JAR = ROOT / ".deps" / "testing" / "cdc-testing.jar"
RUN_ID = uuid.uuid4().hex[:8]
TEST_DIR = ROOT / ".stack" / "tests" / RUN_ID



@pytest.fixture(scope="session")
def local_config() -> JobConfig:
    os.environ.setdefault("METASTORE_PASSWORD", "postgres")
    # The stack's S3 server takes any key (scripts/test.sh sets the same defaults).
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "local")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "local")
    return load_config(LOCAL_CONF)


@pytest.fixture(scope="session")
def spark(local_config: JobConfig) -> Iterator[SparkSession]:
    """The one SparkSession of the test run: local[2], Hudi/Kafka/Avro jars, the shared metastore."""
    conf = dict(local_config.spark.conf)
    # The session zone differs from UTC as well as the JVM's (TZ): no conversion may depend on either.
    conf.update({
        "spark.sql.shuffle.partitions": "2",
        "spark.ui.enabled": "false",
        "spark.sql.session.timeZone": "America/Los_Angeles",
    })
    spark_cfg = dataclasses.replace(local_config.spark, conf=conf)
    session = build_session("cdc-lakehouse-tests", spark_cfg, local_config.metastore)
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def stack() -> None:
    """Fail fast, naming the command to run, when the local stack is not up."""
    for name, url in (("registry", f"{REGISTRY_URL}/apis/registry/v3/system/info"), ("connect", CONNECT_URL)):
        try:
            requests.get(url, timeout=5).raise_for_status()
        except requests.RequestException as e:
            pytest.fail(f"local stack not up ({name} at {url}: {e}); run scripts/stack.sh up")
    try:
        with psycopg.connect(PG_DSN, connect_timeout=5):
            pass
        AdminClient({"bootstrap.servers": KAFKA_BOOTSTRAP}).list_topics(timeout=5)
    except (psycopg.Error, KafkaException) as e:
        pytest.fail(f"local stack not up ({e}); run scripts/stack.sh up")


@pytest.fixture(scope="module")
def lake_root(local_config: JobConfig, request: pytest.FixtureRequest) -> str:
    """Where a test module's lakes live: on the stack's S3 server, in a bucket of the module's own
    (s3a://t-<run>-<module>/tests/<run>), or under the run's local test folder when the local config keeps the
    lake on local disk.

    A bucket per module: a module's lakes can be listed, and dropped, without the others' keys. A module whose tests
    are units of their own (the crash tests: tests/support/parallel.py) may come back to a worker that made its bucket
    already: it is used again (each test has a lake folder of its own)."""
    silver = local_config.lake.silver_path
    if not is_object_store(silver):
        return str(TEST_DIR)
    module = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_")
    bucket = f"t-{RUN_ID}-{module}".replace("_", "-")[:63].rstrip("-")
    s3 = boto3.client("s3", endpoint_url=local_config.spark.conf["spark.hadoop.fs.s3a.endpoint"],
                      region_name=local_config.spark.conf.get("spark.hadoop.fs.s3a.endpoint.region", "us-east-1"))
    try:
        s3.create_bucket(Bucket=bucket)
    except ClientError as e:
        if e.response.get("Error", {}).get("Code") not in ("BucketAlreadyExists", "BucketAlreadyOwnedByYou"):
            raise
    return f"{silver.split('://', 1)[0]}://{bucket}/tests/{RUN_ID}"


@pytest.fixture(scope="session")
def test_dir() -> Path:
    TEST_DIR.mkdir(parents=True, exist_ok=True)
    return TEST_DIR


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> ModuleScheduling:
    """With `pytest -n <workers>` (scripts/test.sh): modules as units, longest first (tests/support/parallel.py)."""
    return ModuleScheduling(config, log)


_module_seconds: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Time per test module (set-up, call and tear-down, module fixtures included), for the summary below."""
    module = report.nodeid.split("::", 1)[0]
    _module_seconds[module] = _module_seconds.get(module, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _module_seconds:
        return
    terminalreporter.section("time per module")
    for module, seconds in sorted(_module_seconds.items(), key=lambda kv: -kv[1]):
        terminalreporter.write_line(f"{seconds:8.1f} s  {module}")
    terminalreporter.write_line(f"{sum(_module_seconds.values()):8.1f} s  in all")
