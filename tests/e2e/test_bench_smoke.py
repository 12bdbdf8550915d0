"""scripts/bench/run.py stays runnable: `--help` has no side effects, and a tiny `--smoke` run over one connector's
topics on the real stack (lake on S3) measures every figure of its scenarios (the freshness scenario with a
connector and a job process of its own), writes its report and removes what it wrote. No time is asserted: the
benchmark prints figures, the tests only keep it from rotting.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from confluent_kafka.admin import AdminClient
from pyspark.sql import SparkSession

from app.sink.lakefs import list_files
from tests.conftest import KAFKA_BOOTSTRAP, LOCAL_CONF, ROOT, RUN_ID
from tests.support.cdc import debezium_connector, wait_for_records
from tests.support.pipeline import source_schema

BENCH = ROOT / "scripts" / "bench" / "run.py"
SCHEMA = f"bs_{RUN_ID}"
PREFIX = f"bs{RUN_ID}"
DDL = f"""
create schema {SCHEMA};
create table {SCHEMA}.items (id int primary key, name text, qty int);
create table {SCHEMA}.notes (id bigint primary key, body text, at timestamptz);
insert into {SCHEMA}.items select i, 'item ' || i, i from generate_series(1, 40) i;
insert into {SCHEMA}.notes select i, 'note ' || i, now() from generate_series(1, 10) i;
"""
CHANGES = f"""
update {SCHEMA}.items set qty = -qty where id <= 5;
delete from {SCHEMA}.notes where id = 3;
"""


def test_help_has_no_side_effects(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, str(BENCH), "--help", "--out", str(out)], capture_output=True, text=True,
                          check=False, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "B1" in done.stdout and "--smoke" in done.stdout
    assert not out.exists()


def test_the_plan_build_benchmarks_help_has_no_side_effects() -> None:
    worktrees = ["git", "-C", str(ROOT), "worktree", "list"]
    before = subprocess.run(worktrees, capture_output=True, text=True, check=True).stdout
    done = subprocess.run([sys.executable, str(BENCH.parent / "plan_build.py"), "--help"], capture_output=True,
                          text=True, check=False, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "--baseline-ref" in done.stdout and "events_slice" in done.stdout
    assert subprocess.run(worktrees, capture_output=True, text=True, check=True).stdout == before


@pytest.mark.stack
@pytest.mark.slow
def test_a_smoke_run_measures_every_figure_and_cleans_up(
    spark: SparkSession, stack: None, lake_root: str, tmp_path: Path
) -> None:
    raw = yaml.safe_load(LOCAL_CONF.read_text())
    raw["kafka"]["topic_pattern"] = PREFIX + r"\.[^.]+\.[^.]+"
    raw.pop("sources", None)
    raw["source"] = {"topic_prefix": PREFIX, "framing": "id4", "id_type": "contentId"}
    lake = f"{lake_root}/bench"
    raw["lake"].update({"database": f"bs_{RUN_ID}", "silver_path": f"{lake}/silver",
                        "bronze_path": f"{lake}/bronze", "checkpoint_path": f"{lake}/checkpoint"})
    conf = tmp_path / "bench.yaml"
    conf.write_text(yaml.safe_dump(raw))
    out = tmp_path / "out"
    with source_schema(SCHEMA, DDL) as conn, debezium_connector(f"bs-{RUN_ID}", PREFIX, [SCHEMA]):
        wait_for_records(f"{PREFIX}.{SCHEMA}.items", 40)
        conn.execute(CHANGES)
        # Snapshot and changes: 40 + 5 items; 10 notes, a delete and its tombstone.
        records = len(wait_for_records(f"{PREFIX}.{SCHEMA}.items", 45)) + len(
            wait_for_records(f"{PREFIX}.{SCHEMA}.notes", 12))
        admin = AdminClient({"bootstrap.servers": KAFKA_BOOTSTRAP})
        topics_before = set(admin.list_topics(timeout=10).topics)
        done = subprocess.run(
            [sys.executable, str(BENCH), "--smoke", "--conf", str(conf), "--out", str(out)],
            capture_output=True, text=True, check=False, timeout=1200, cwd=ROOT,
        )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((out / "results.json").read_text())
    figures = {(f["scenario"], f["name"], f["side"]): f for f in report["figures"]}
    assert report["details"]["ceiling"]["records"] == records
    assert set(report["details"]["ceiling"]["tables"]) == {f"{SCHEMA}_items", f"{SCHEMA}_notes"}
    for side in ("job", "parquet"):
        assert figures["ceiling", "batch events_per_s", side]["median"] > 0
    assert ("ceiling", "job throughput as a share of the ceiling", "job") in figures
    for run in ("3", "3 naive"):  # the job, then the naive baseline (B2) under the same workload
        fresh = report["details"]["freshness"][run]
        # --smoke: 10 tx/s for 10 s, after a warm-up of 5 s whose 50 transactions reach Silver but are not measured
        assert fresh["transactions"] == 100 and len(fresh["series"]) == 100
        assert fresh["warm_up_transactions"] == 50 and fresh["series"][0][0] == 0.0
        assert 0 < fresh["p50_s"] <= fresh["p95_s"] <= fresh["max_s"]
    assert ("freshness", "3 tables: naive p95 over the job's", "job") in figures
    # B2: both sides over the same backlog (--smoke: 2 tables of 100 rows, a third updated, a tenth deleted), each
    # equal to PostgreSQL at the end (the bench exits otherwise)
    assert report["details"]["naive"]["records"] == 2 * (100 + 33 + 2 * 10)
    assert report["details"]["naive"]["options"]["hoodie.datasource.write.precombine.field"] == "_lsn"
    assert figures["naive", "job throughput over the naive baseline's", "job"]["median"] > 0
    # B4: the backlog's memory peaks measured
    backlog = report["details"]["backlog"]
    assert backlog["records"] == 2 * (300 + 100 + 2 * 30)
    assert backlog["jvm_rss_mb"] > 0 and backlog["python_rss_mb"] > 0 and backlog["events_per_s"] > 0
    assert backlog["heap_mb"] > 0 or not shutil.which("jstat")
    for layout in ("cow",):  # --smoke: one layout (the scenarios' loop is the same for each)
        assert figures["growth", f"{layout} large / small", "ratio"]["median"] > 0
        assert "hoodie.datasource.write.recordkey.field" in report["details"]["growth"]["options"][layout]
        assert figures["widen", f"{layout} rewrite / upsert", "ratio"]["median"] > 0  # a widened decimal's rewrite
    # The machine's speed before and after each scenario (a fixed loop's seconds), in the JSON and the table
    machine = report["details"]["machine"]
    assert set(machine) == {"ceiling", "naive", "freshness", "backlog", "growth", "widen"}
    assert all(m["reference_loop_before_s"] > 0 and m["reference_loop_after_s"] > 0 for m in machine.values())
    table = (out / "results.md").read_text()
    assert "| the machine's speed: a fixed Python loop, best of 3 (s) | before | after |" in table
    assert "| ceiling | job throughput as a share of the ceiling |" in table
    assert list_files(spark, f"{lake}/silver/_bench") == []
    databases = {r[0] for r in spark.sql("show databases").collect()}
    assert not {d for d in databases if d.startswith("bench_")}
    # The connectors the bench made left no topic behind (scripts/bench/source.py names them b<label><hex><n>.)
    bench_topic = re.compile(r"b[a-z][0-9a-f]{6}[0-9]+\.")
    left = {t for t in set(admin.list_topics(timeout=10).topics) - topics_before if bench_topic.match(t)}
    assert not left
