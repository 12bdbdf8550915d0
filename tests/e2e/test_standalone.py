"""The job on a Spark standalone cluster: executors in JVMs of their own, as on EMR.

In `local[2]` the executors live in the driver's JVM, so a jar or a file only the driver has goes unnoticed. Here
the job runs on the stack's standalone cluster (scripts/stack.sh `spark`: a master on spark://127.0.0.1:7077 and two
workers, each launching an executor JVM of its own) the way an EMR step submits it: the app as the package zip
(scripts/package.sh) through --py-files, the jars through --jars, which the driver serves and each executor fetches
into its own class loader. The job's config has no `jars_dir`, so no executor class path of this machine is set.
What the executors need besides comes with the application: the s3a settings in its Spark conf, the S3 keys (read
from the environment by the credentials provider) as spark.executorEnv, as is the suite's time zone.

One available-now run over a small PostgreSQL table captured by Debezium, with a numeric(50,10) and a bit(10) column
that only the JVM functions of cdc-functions.jar decode (app/cdc/debezium_types.py calls io.cdclake.CdcValues through
`reflect`,
in the executors' tasks): Silver must equal the table, and the application's executors must have run in two JVMs
apart from the driver's, each having fetched cdc-functions.jar from the driver.
"""
from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import requests
import yaml
from pyspark.sql import SparkSession

from tests.conftest import ROOT, RUN_ID
from tests.support.cdc import debezium_connector, wait_for_records
from tests.support.pipeline import differences, source_schema, spark_submit_conf

pytestmark = [pytest.mark.stack, pytest.mark.slow]

MASTER = "spark://127.0.0.1:7077"
MASTER_UI = "http://127.0.0.1:8090"  # scripts/stack.sh SPARK_UI_PORT
SCHEMA = f"sa_{RUN_ID}"
PREFIX = f"sa{RUN_ID}"
DATABASE = f"sa_{RUN_ID}"
ROWS = 25
COLUMNS = ("id", "name", "amount", "flags", "added")
# The stack's S3 server takes any key; the driver reads them from its environment, each executor from its own.
S3_KEYS = {"AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local"}
RUN_TIMEOUT_S = 600

DDL = f"""
create schema {SCHEMA};
create table {SCHEMA}.items (
  id int primary key, name text not null, amount numeric(50,10), flags bit(10), added date
);
insert into {SCHEMA}.items
select i, 'item ' || i,
       case when i % 5 = 0 then null else (1 - 2 * (i % 2)) * (10::numeric ^ 38 * i + i / 7.0) end,
       (i * 37 % 1024)::bit(10), date '2024-01-01' + i
from generate_series(1, {ROWS}) i;
"""


@pytest.fixture(scope="module")
def cluster(stack: None) -> dict[str, Any]:
    """The master's state; fails fast, naming the command to run, when the cluster is not up with both workers."""
    try:
        state: dict[str, Any] = requests.get(f"{MASTER_UI}/json/", timeout=5).json()
    except requests.RequestException as e:
        pytest.fail(f"Spark standalone master not up ({MASTER_UI}: {e}); run scripts/stack.sh up spark")
    alive = [w for w in state["workers"] if w["state"] == "ALIVE"]
    if len(alive) < 2:
        pytest.fail(f"{len(alive)} Spark worker(s) alive at {MASTER}, 2 wanted; run scripts/stack.sh up spark")
    return state


@pytest.fixture(scope="module")
def pg_conn(stack: None) -> Iterator[psycopg.Connection]:
    with source_schema(SCHEMA, DDL) as conn:
        yield conn


def job_conf(lake: str, warehouse: Path) -> bytes:
    """conf/local.yaml on this test's topics and lake as spark-submit runs it (no jars_dir), and no master either:
    the command line's --master applies, as on EMR (conf/prod.yaml sets none)."""
    raw = yaml.safe_load(spark_submit_conf(PREFIX, DATABASE, lake, str(warehouse)))
    raw["spark"].pop("master", None)
    return yaml.safe_dump(raw).encode()


def submit_args(package: Path, conf: Path, jars: list[str], driver_classpath: list[str]) -> list[str]:
    """spark-submit in client mode against the standalone master, shaped like scripts/emr/step.json."""
    python = str(ROOT / ".venv" / "bin" / "python")
    executor_env = {**S3_KEYS, "TZ": os.environ.get("TZ", "America/Los_Angeles")}
    return [
        str(ROOT / ".venv" / "bin" / "spark-submit"),
        "--master", MASTER, "--deploy-mode", "client",
        "--conf", f"spark.pyspark.python={python}",
        "--conf", f"spark.pyspark.driver.python={python}",
        "--conf", f"spark.executorEnv.PYSPARK_PYTHON={python}",
        *[arg for name, value in executor_env.items() for arg in ("--conf", f"spark.executorEnv.{name}={value}")],
        # One executor per worker (each worker: 1 core, 2g).
        "--executor-memory", "2g",
        # Under spark-submit the driver JVM is up before the job's config is read: the metastore's JDBC driver must
        # be on its class path already (EMR's spark-defaults do that there).
        "--driver-class-path", ":".join(driver_classpath),
        "--jars", ",".join(jars),
        "--py-files", str(package / "cdc_lakehouse.zip"),
        str(package / "main.py"), "--conf", str(conf), "--available-now",
    ]


def submit(folder: Path, args: list[str]) -> tuple[int, int, list[str]]:
    """Run spark-submit from an empty working directory; (exit code, driver pid, log lines)."""
    cwd = folder / "cwd"  # nothing of the repository in it: app/ comes from the zip
    cwd.mkdir(exist_ok=True)
    env = {
        **os.environ, **S3_KEYS,
        # pip's spark-submit finds its Spark home with the python3 first on PATH.
        "PATH": f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "METASTORE_PASSWORD": os.environ.get("METASTORE_PASSWORD", "postgres"),
        # The driver binds and advertises loopback, where the workers and their executors are.
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    env.pop("PYTHONPATH", None)
    log = folder / "job.log"
    with log.open("wb") as out:
        # spark-submit execs spark-class, which execs the driver's JVM: the process's pid is the driver JVM's.
        proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            rc = proc.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
    return rc, proc.pid, log.read_text(errors="replace").splitlines()


def app_id(lines: list[str]) -> str:
    found = [m.group(1) for line in lines if (m := re.search(r"Connected to Spark cluster with app ID (\S+)", line))]
    assert len(found) == 1, "\n".join(lines[-40:])
    return found[0]


def executor_logs(app: str, timeout_s: float = 60.0) -> dict[tuple[str, str], str]:
    """Each executor of `app`, by (worker id, executor id): its stderr, read through the worker's web UI once the
    worker lists the executor as finished (the master kills them when the application ends)."""
    deadline = time.monotonic() + timeout_s
    while True:
        workers = requests.get(f"{MASTER_UI}/json/", timeout=10).json()["workers"]
        found: dict[tuple[str, str], str] = {}
        running = 0
        for worker in workers:
            state = requests.get(f"{worker['webuiaddress']}/json/", timeout=10).json()
            running += sum(e["appid"] == app for e in state["executors"])
            for executor in state["finishedexecutors"]:
                if executor["appid"] == app:
                    stderr = requests.get(f"{worker['webuiaddress']}/log", timeout=10, params={
                        "appId": app, "executorId": executor["id"], "logType": "stderr",
                        "offset": 0, "byteLength": 50_000_000,
                    })
                    found[worker["id"], str(executor["id"])] = stderr.text
        if (found and not running) or time.monotonic() > deadline:
            assert not running, f"{running} executor(s) of {app} still running {timeout_s:.0f}s after the job ended"
            return found
        time.sleep(1)


def test_job_runs_on_a_standalone_cluster_with_executors_in_their_own_jvms(
    spark: SparkSession, cluster: dict[str, Any], pg_conn: psycopg.Connection, lake_root: str, test_dir: Path
) -> None:
    folder = test_dir / "standalone"
    folder.mkdir()
    package = folder / "package"
    subprocess.run(["bash", str(ROOT / "scripts" / "package.sh"), "--out", str(package)], check=True,
                   capture_output=True)
    lake = f"{lake_root}/standalone"
    conf = folder / "conf.yaml"
    conf.write_bytes(job_conf(lake, folder / "warehouse"))
    jars = sorted(str(p) for p in (ROOT / ".deps" / "spark").glob("*.jar"))
    assert any(j.endswith("/cdc-functions.jar") for j in jars), "no cdc-functions.jar: run scripts/setup.sh jars"

    with debezium_connector(f"standalone-{RUN_ID}", PREFIX, [SCHEMA]):
        wait_for_records(f"{PREFIX}.{SCHEMA}.items", ROWS)
        rc, driver_pid, lines = submit(folder, submit_args(package, conf, jars, jars))
    tail = "\n".join(lines[-60:])
    assert rc == 0, tail
    started = [line for line in lines if "job code" in line]
    assert len(started) == 1 and "cdc_lakehouse.zip/app, config" in started[0], started
    # The command line's master, not local[2]: the config names none.
    assert any(f"session up (master {MASTER}," in line for line in lines), tail
    assert any("query cdc-lakehouse finished" in line for line in lines), tail

    # The application's executors: one per worker, each a JVM of its own (not the driver's, not this process's),
    # each having fetched cdc-functions.jar from the driver into its class loader, and tasks run between them.
    app = app_id(lines)
    logs = executor_logs(app)
    assert len(logs) == 2 and len({worker for worker, _ in logs}) == 2, sorted(logs)
    pids = set()
    for (worker, executor), stderr in logs.items():
        where = f"executor {executor} on {worker}"
        pid = re.search(r"CoarseGrainedExecutorBackend: Started daemon with process name: (\d+)@", stderr)
        assert pid, f"{where}: no start line in its stderr:\n{stderr[:2000]}"
        pids.add(int(pid.group(1)))
        assert re.search(r"Fetching spark://[^/]+/jars/cdc-functions\.jar", stderr), where
        assert re.search(r"Adding file:\S+/cdc-functions\.jar to class loader", stderr), where
    assert len(pids) == 2 and not pids & {driver_pid, os.getpid()}, (pids, driver_pid)
    assert sum(len(re.findall(r"Executor: Finished task", s)) for s in logs.values()) > 0

    silver = spark.read.format("hudi").load(f"{lake}/silver/{DATABASE}/{SCHEMA}_items")
    rows = silver.selectExpr(*COLUMNS).collect()
    actual = {r[0]: tuple(r) for r in rows}
    source = pg_conn.execute(f"select id, name, amount::text, flags::text, added from {SCHEMA}.items")
    expected = {r[0]: tuple(r) for r in source.fetchall()}
    assert len(expected) == ROWS and len(rows) == len(actual)
    assert not differences(actual, expected, COLUMNS), "\n".join(differences(actual, expected, COLUMNS))
