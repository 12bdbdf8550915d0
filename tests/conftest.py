"""Shared fixtures: one SparkSession for the whole run, the local stack's endpoints, a source connection.

Integration tests use the real stack started by scripts/stack.sh (scripts/test.sh starts it); they fail with
a clear message when it is not up instead of skipping.
"""
from __future__ import annotations

import dataclasses
import os
import threading
import uuid
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any, cast

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
from app.spark import build_session, is_object_store, jvm_pid, process_cpu_s
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
_module_cost: dict[str, list[float]] = {}  # module -> [driver CPU s, Spark jobs]


class _Cost:
    """What the test process itself spends: the CPU of this Python process, of the children it reaped and of its
    SparkSession's JVM, and the Spark jobs that JVM ran. Job processes killed with SIGKILL are not counted (their
    JVM is reaped by init), nor is the stack's share."""

    def __init__(self) -> None:
        self.last: tuple[float, int] | None = None
        self.jvm: int | None = None
        self.jobs = 0

    def now(self) -> tuple[float, int]:
        times = os.times()
        cpu = times.user + times.system + times.children_user + times.children_system
        session = SparkSession._instantiatedSession  # this process's session, whichever thread made it
        if session is not None:
            try:
                self.jvm = self.jvm or jvm_pid(session)
                self.jobs = int(session.sparkContext._jsc.sc().dagScheduler().nextJobId())
            except Exception:  # a session being stopped: its jobs counted up to here
                pass
        return cpu + ((process_cpu_s(self.jvm) or 0.0) if self.jvm else 0.0), self.jobs

    def since_last(self) -> tuple[float, int]:
        now = self.now()
        before = self.last or now
        self.last = now
        return now[0] - before[0], max(now[1] - before[1], 0)


_cost = _Cost()


def pytest_sessionstart(session: pytest.Session) -> None:
    _cost.since_last()  # from here: the first test's set-up counts the SparkSession's start


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Each phase's cost (`_Cost`) on its report, for the summary below (xdist carries user_properties over)."""
    report = yield
    report.user_properties.append(("cost", _cost.since_last()))
    return report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Time per test module (set-up, call and tear-down, module fixtures included), for the summary below."""
    module = report.nodeid.split("::", 1)[0]
    _module_seconds[module] = _module_seconds.get(module, 0.0) + report.duration
    for name, value in report.user_properties:
        if name == "cost":
            cpu, jobs = cast(tuple[float, int], value)
            total = _module_cost.setdefault(module, [0.0, 0.0])
            total[0] += cpu
            total[1] += jobs


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _module_seconds:
        return
    terminalreporter.section("time per module")
    terminalreporter.write_line("  wall s   driver CPU s  Spark jobs  module (driver: the test process, its Spark "
                                "JVM, reaped children)")
    for module, seconds in sorted(_module_seconds.items(), key=lambda kv: -kv[1]):
        cpu, jobs = _module_cost.get(module, (0.0, 0.0))
        terminalreporter.write_line(f"{seconds:8.1f}   {cpu:12.1f}  {int(jobs):10d}  {module}")
    cpu, jobs = (sum(c[i] for c in _module_cost.values()) for i in (0, 1))
    terminalreporter.write_line(f"{sum(_module_seconds.values()):8.1f}   {cpu:12.1f}  {int(jobs):10d}  in all")


@pytest.fixture
def commands(spark: SparkSession) -> Iterator[list[str]]:
    """The commands this thread sends to the JVM while the test runs (not py4j's own thread releasing objects)."""
    client: Any = spark.sparkContext._gateway._gateway_client  # type: ignore[union-attr]
    sent: list[str] = []
    send = client.send_command
    test_thread = threading.get_ident()

    def counted(command: str, *args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() == test_thread:
            sent.append(command)
        return send(command, *args, **kwargs)

    client.send_command = counted
    try:
        yield sent
    finally:
        client.send_command = send
