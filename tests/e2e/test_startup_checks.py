"""Start-up checks (app/state/preflight.py) against the real stack: each wrong setting is a ConfigError naming its
key, before any data is read; the job's command line exits 2 with it. (A refusal or a timeout at start waits
instead: tests/e2e/test_outages.py, whose give-up case starts the job with the registry cut off.)"""
from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from pyspark.sql import SparkSession

from app.config import JobConfig
from app.errors import ConfigError
from app.state.preflight import check_services
from app.state.resume import kafka_partitions
from app.wire.registry import RegistryClient
from tests.conftest import LOCAL_CONF, ROOT, RUN_ID
from tests.support.cdc import CONNECT_URL, REGISTRY_URL, job_config_for
from tests.support.http_proxy import CountingProxy

pytestmark = [pytest.mark.stack]

MISSING_BUCKET = f"s3a://no-such-bucket-{RUN_ID}/lake"


@pytest.fixture(scope="module")
def config(local_config: JobConfig, lake_root: str) -> JobConfig:
    return job_config_for(local_config, f"startup{RUN_ID}", f"startup_{RUN_ID}", f"{lake_root}/startup_checks")


def _check(spark: SparkSession, config: JobConfig, registry_url: str = REGISTRY_URL) -> object:
    registry = RegistryClient(registry_url, retries=0)
    return check_services(spark, config, registry, lambda: kafka_partitions(spark, config))


def test_the_stacks_services_pass(spark: SparkSession, config: JobConfig) -> None:
    assert _check(spark, config) == {}  # no topic of this prefix yet


@pytest.mark.parametrize("key", ["silver_path", "bronze_path", "checkpoint_path"])
def test_a_missing_bucket_names_its_path(spark: SparkSession, config: JobConfig, key: str) -> None:
    paths: dict[str, Any] = {key: f"{MISSING_BUCKET}/{key}"}
    lake = dataclasses.replace(config.lake, **paths)
    with pytest.raises(ConfigError, match="the bucket does not exist") as e:
        _check(spark, dataclasses.replace(config, lake=lake))
    assert e.value.key == f"lake.{key}"


def test_a_wrong_registry_url_names_it(spark: SparkSession, config: JobConfig) -> None:
    with pytest.raises(ConfigError, match="answered 404") as e:
        _check(spark, config, CONNECT_URL)  # Kafka Connect's REST API: it answers, but is no registry
    assert e.value.key == "registry.url"


def test_refused_registry_credentials_name_the_auth(spark: SparkSession, config: JobConfig) -> None:
    with CountingProxy(REGISTRY_URL) as proxy:
        proxy.fail_next(10, 401)
        with pytest.raises(ConfigError, match="credentials") as e:
            _check(spark, config, proxy.url)
    assert e.value.key == "registry.auth"


def test_a_broker_address_that_resolves_nowhere_names_it(spark: SparkSession, config: JobConfig) -> None:
    kafka = dataclasses.replace(config.kafka, bootstrap_servers=f"no-such-broker-{RUN_ID}.invalid:9092")
    with pytest.raises(ConfigError, match="no broker address resolves") as e:
        _check(spark, dataclasses.replace(config, kafka=kafka))
    assert e.value.key == "kafka.bootstrap_servers"


def test_a_wrong_metastore_database_exits_2_naming_it(config: JobConfig, tmp_path: Path) -> None:
    """The job's own command line, its own session on a metastore database that does not exist. Its broker
    resolves nowhere either: the metastore's check runs beside the others, and its failure is still the one
    said, as the checks' order has it."""
    raw = yaml.safe_load(LOCAL_CONF.read_text())
    raw["metastore"]["jdbc_url"] = f"jdbc:postgresql://127.0.0.1:5432/no_such_metastore_{RUN_ID}"
    raw["kafka"]["bootstrap_servers"] = f"no-such-broker-{RUN_ID}.invalid:9092"
    lake = config.lake
    raw["lake"].update({"database": lake.database, "silver_path": lake.silver_path, "bronze_path": lake.bronze_path,
                        "checkpoint_path": lake.checkpoint_path})
    conf = tmp_path / "job.yaml"
    conf.write_text(yaml.safe_dump(raw))
    # A stream: an --available-now run would first try to count the broker's records (conf/local.yaml's limit).
    run = subprocess.run([sys.executable, "app/main.py", "--conf", str(conf)], check=False,
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 2, run.stderr[-3000:]
    assert "config key 'metastore.jdbc_url': the metastore's database does not exist" in run.stderr, run.stderr[-3000:]
    assert "kafka.bootstrap_servers" not in run.stderr, run.stderr[-3000:]
