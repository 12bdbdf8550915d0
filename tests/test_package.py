"""The deployable job: the package scripts/package.sh builds, conf/prod.yaml for MSK with IAM, a config read from
S3, and the EMR step and deploy script of scripts/emr/. No stack needed (tests/e2e/test_emr_step.py runs the step).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml
from moto import mock_aws

from app.config import load_config
from app.errors import ConfigError
from app.wire.source import read_kafka
from scripts.fetch_jars import LIST, parse
from tests.conftest import LOCAL_CONF, ROOT

PROD_CONF = ROOT / "conf" / "prod.yaml"
STEP = ROOT / "scripts" / "emr" / "step.json"
PLACEHOLDER = re.compile(r"<[a-z][a-z0-9-]*>")
MSK_IAM_OPTIONS = {
    "security.protocol": "SASL_SSL",
    "sasl.mechanism": "AWS_MSK_IAM",
    "sasl.jaas.config": "software.amazon.msk.auth.iam.IAMLoginModule required;",
    "sasl.client.callback.handler.class": "software.amazon.msk.auth.iam.IAMClientCallbackHandler",
}


def filled_prod_conf(path: Path) -> Path:
    """conf/prod.yaml with every placeholder in a value (not in a comment) filled."""
    lines = []
    for line in PROD_CONF.read_text().splitlines():
        value, hash_, comment = line.partition("#")
        lines.append(PLACEHOLDER.sub("filled", value) + hash_ + comment)
    path.write_text("\n".join(lines) + "\n")
    return path


class RecordingReader:
    """Stands in for spark.readStream: records the options app/source.read_kafka sets."""

    def __init__(self) -> None:
        self.options: dict[str, str] = {}

    @property
    def readStream(self) -> RecordingReader:
        return self

    def format(self, source: str) -> RecordingReader:
        self.options["<format>"] = source
        return self

    def option(self, key: str, value: str) -> RecordingReader:
        self.options[key] = value
        return self

    def load(self) -> RecordingReader:
        return self


def test_prod_conf_filled_gives_the_kafka_source_msk_iam_auth(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REGISTRY_CLIENT_SECRET", "not-a-real-secret")
    config = load_config(filled_prod_conf(tmp_path / "prod.yaml"))
    assert config.kafka.options == MSK_IAM_OPTIONS

    reader = RecordingReader()
    read_kafka(reader, config.kafka)  # type: ignore[arg-type]
    kafka_options = {k.removeprefix("kafka."): v for k, v in reader.options.items() if k.startswith("kafka.")}
    assert kafka_options == {"bootstrap.servers": "filled", "fetch.max.wait.ms": "10", **MSK_IAM_OPTIONS}

    # The catalog is Glue through Spark's Hive client; no JDBC metastore; the lake on EMRFS.
    assert config.metastore is None
    assert config.spark.conf["spark.sql.catalogImplementation"] == "hive"
    assert config.spark.conf["spark.hadoop.hive.metastore.client.factory.class"] == (
        "com.amazonaws.glue.catalog.metastore.AWSGlueDataCatalogHiveClientFactory"
    )
    assert all(p.startswith("s3://filled/") for p in
               (config.lake.silver_path, config.lake.bronze_path, config.lake.checkpoint_path))
    assert config.spark.jars_dir is None and config.spark.master is None  # the step and the cluster give both


def test_msk_iam_classes_are_in_the_emr_jar_set() -> None:
    """The classes prod.yaml names come with the jars the EMR step adds (deps/jvm-artifacts.txt, set emr)."""
    coords = {a.coords for a in parse(LIST)["emr"]}
    assert "software.amazon.msk:aws-msk-iam-auth:2.3.9:jar:all" in coords
    jar = ROOT / ".deps" / "emr" / "aws-msk-iam-auth-2.3.9-all.jar"
    assert jar.exists(), "run scripts/setup.sh jars (or python3 scripts/fetch_jars.py emr)"
    names = set(zipfile.ZipFile(jar).namelist())
    for option in ("sasl.client.callback.handler.class", "sasl.jaas.config"):
        class_name = MSK_IAM_OPTIONS[option].split()[0]
        assert class_name.replace(".", "/") + ".class" in names


@mock_aws
def test_config_from_s3_and_s3a_uri_equals_the_local_file(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):  # moto intercepts in-process; no server
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("METASTORE_PASSWORD", "postgres")
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="jobs")
    s3.put_object(Bucket="jobs", Key="cdc/local.yaml", Body=LOCAL_CONF.read_bytes())
    local = load_config(LOCAL_CONF)
    assert load_config("s3://jobs/cdc/local.yaml") == local
    assert load_config("s3a://jobs/cdc/local.yaml") == local


@mock_aws
def test_config_missing_on_s3_names_the_uri_not_the_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "sekrit-sentinel-value")
    boto3.client("s3").create_bucket(Bucket="jobs")
    with pytest.raises(ConfigError) as e:
        load_config("s3://jobs/absent.yaml")
    assert "s3://jobs/absent.yaml" in str(e.value) and "NoSuchKey" in str(e.value)
    assert "sekrit" not in str(e.value)
    with pytest.raises(ConfigError, match="expected s3://<bucket>/<key>"):
        load_config("s3://jobs")


def test_package_runs_from_any_directory_with_app_from_the_zip(tmp_path: Path) -> None:
    out = tmp_path / "package"
    subprocess.run(["bash", str(ROOT / "scripts" / "package.sh"), "--out", str(out)], check=True,
                   capture_output=True, cwd=tmp_path)
    names = zipfile.ZipFile(out / "cdc_lakehouse.zip").namelist()
    assert {"app/__init__.py", "app/main.py", "app/config/model.py"} <= set(names)
    assert all(n.startswith("app/") and n.endswith(".py") for n in names)
    assert not any(n.startswith(("devkit/", "tests/", "scripts/")) for n in names)  # no test tooling shipped
    assert (out / "main.py").read_bytes() == (ROOT / "app" / "main.py").read_bytes()
    pins = (out / "requirements.txt").read_text().split()
    assert "boto3==1.44.8" in pins and not any(p.startswith("pyspark") for p in pins)
    # The JVM functions app/cdc/debezium_types.py calls through `reflect` ship with the package (the step's --jars).
    jar = zipfile.ZipFile(out / "cdc-functions.jar").namelist()
    assert "io/cdclake/CdcValues.class" in jar
    assert not any(n.startswith(("io/cdclake/testing/", "io/cdclake/connect/")) for n in jar)  # tests', Connect's
    smt = zipfile.ZipFile(out / "cdc-connect.jar").namelist()  # the connector side's SMT, a jar of its own
    assert "io/cdclake/connect/DefaultsAsParameters.class" in smt
    assert not any(n.endswith("CdcValues.class") for n in smt)
    assert "META-INF/services/org.apache.kafka.connect.transforms.Transformation" in smt
    assert (out / "cdc-functions.jar").read_bytes() == (ROOT / ".deps" / "spark" / "cdc-functions.jar").read_bytes()

    # What --py-files does: the zip on PYTHONPATH, the entry script run from another folder.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(out / "cdc_lakehouse.zip")}
    where = subprocess.run([sys.executable, "-c", "import app.config.model; print(app.config.model.__file__)"],
                           env=env, cwd=elsewhere, capture_output=True, text=True, check=True)
    assert where.stdout.strip() == str(out / "cdc_lakehouse.zip" / "app" / "config" / "model.py")
    bad = yaml.safe_load(LOCAL_CONF.read_text())
    bad["kafka"]["bootstrap_server"] = "typo:9092"
    (elsewhere / "bad.yaml").write_text(yaml.safe_dump(bad))
    run = subprocess.run([sys.executable, str(out / "main.py"), "--conf", "bad.yaml"],
                         env=env, cwd=elsewhere, capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 2, run.stderr
    assert "kafka.bootstrap_server" in run.stderr


def step_args() -> list[str]:
    steps: list[dict[str, Any]] = json.loads(STEP.read_text())
    assert len(steps) == 1 and steps[0]["Jar"] == "command-runner.jar"
    return list(steps[0]["Args"])


def test_step_submits_the_package_with_the_bootstrap_python() -> None:
    args = step_args()
    assert args[0] == "spark-submit"
    venv = re.search(r"^VENV=(\S+)$", (ROOT / "scripts" / "emr" / "bootstrap.sh").read_text(), re.M)
    assert venv is not None
    python = f"{venv.group(1)}/bin/python"
    confs = [args[i + 1] for i, a in enumerate(args) if a == "--conf" and i < args.index("@S3_ROOT@/main.py")]
    assert {f"spark.pyspark.python={python}", f"spark.pyspark.driver.python={python}",
            f"spark.executorEnv.PYSPARK_PYTHON={python}"} <= set(confs)
    assert args[args.index("--py-files") + 1] == "@S3_ROOT@/cdc_lakehouse.zip"
    assert args[args.index("--jars") + 1].split(",") == [
        "/usr/lib/hudi/hudi-spark-bundle.jar", "@S3_ROOT@/cdc-functions.jar", "@S3_ROOT@/jars/*.jar"]
    assert args[-3:] == ["@S3_ROOT@/main.py", "--conf", "@S3_ROOT@/conf.yaml"]


def test_deploy_dry_run_prints_uploads_and_add_steps(tmp_path: Path) -> None:
    conf = filled_prod_conf(tmp_path / "prod.yaml")
    out = tmp_path / "out"
    cmd = ["bash", str(ROOT / "scripts" / "emr" / "deploy.sh"), "--cluster-id", "j-TEST", "--s3-root",
           "s3://bkt/cdc/", "--conf", str(conf), "--registry-secret-id", "registry-secret", "--dry-run",
           "--out", str(out)]
    run = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=60)
    for line in ("aws s3 cp " + str(conf) + " s3://bkt/cdc/conf.yaml",
                 f"aws s3 cp {out}/cdc_lakehouse.zip s3://bkt/cdc/cdc_lakehouse.zip",
                 f"aws s3 cp {out}/cdc-functions.jar s3://bkt/cdc/cdc-functions.jar",
                 f"aws emr add-steps --cluster-id j-TEST --steps file://{out}/step.json"):
        assert line in run.stdout
    assert not (out / "cdc_lakehouse.zip").exists()  # printed, not run
    rendered = json.loads((out / "step.json").read_text())[0]["Args"]
    assert rendered[:2] == ["bash", "-c"] and rendered[3] == "registry-secret"
    assert rendered[4:] == [a.replace("@S3_ROOT@", "s3://bkt/cdc") for a in step_args()]

    unfilled = subprocess.run([*cmd[:7], str(PROD_CONF), "--dry-run", "--out", str(out)],
                              capture_output=True, text=True, check=False)
    assert unfilled.returncode == 2 and "placeholders" in unfilled.stderr


def _rendered_step(tmp_path: Path, *options: str) -> list[str]:
    conf = filled_prod_conf(tmp_path / "prod.yaml")
    out = tmp_path / "out"
    subprocess.run(["bash", str(ROOT / "scripts" / "emr" / "deploy.sh"), "--cluster-id", "j-TEST", "--s3-root",
                    "s3://bkt/cdc/", "--conf", str(conf), *options, "--dry-run", "--out", str(out)],
                   capture_output=True, text=True, check=True, timeout=60)
    return list(json.loads((out / "step.json").read_text())[0]["Args"])


def test_the_continuous_step_restarts_a_job_that_died_and_not_a_wrong_config(tmp_path: Path) -> None:
    """deploy.sh's restart policy, run here with a stand-in for spark-submit: exits it restarts after, 2 it does
    not, and the limit of restarts in a row."""
    rendered = _rendered_step(tmp_path, "--restarts", "3", "--restart-delay", "0")
    assert rendered[:2] == ["bash", "-c"] and rendered[3] == "cdc-lakehouse"
    assert rendered[4:] == [a.replace("@S3_ROOT@", "s3://bkt/cdc") for a in step_args()]
    assert _rendered_step(tmp_path, "--restarts", "0") == rendered[4:]  # 0: the step as it is
    assert _rendered_step(tmp_path, "--available-now")[0] == "spark-submit"  # a run that ends: no restarts
    runs = tmp_path / "runs"

    def policy(*exits: int) -> tuple[int, int, str]:
        """The policy over a job whose n-th run exits exits[n]; (its exit, runs made, what it said)."""
        runs.write_text("")
        job = (f'echo run >> {runs}; codes=({" ".join(map(str, exits))}); '
               f'exit ${{codes[$(($(wc -l < {runs}) - 1))]}}')
        done = subprocess.run(["bash", "-c", rendered[2], "cdc-lakehouse", "bash", "-c", job],
                              capture_output=True, text=True, timeout=60, check=False)
        return done.returncode, len(runs.read_text().splitlines()), done.stderr

    rc, count, said = policy(137, 1, 0)  # killed, an outage past its give-up time, then a run that ends well
    assert (rc, count) == (0, 3) and "the job exited 137; starting it again from its checkpoint" in said, said
    assert policy(137, 2)[:2] == (2, 2)  # a config error is not restarted
    rc, count, said = policy(1, 1, 1, 1, 1)
    assert (rc, count) == (1, 4) and "3 restarts in a row: giving up" in said, said
