"""Pause points (devkit/pauses.py): a job process stops at an armed point, says where, and can be killed there.

The Hudi point is checked for real: a process writing a local Hudi table pauses inside the commit (data files
and markers written, the instant inflight), is killed with SIGKILL, and the next write rolls the dead commit
back, so the table reads as before it.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from app.sink.hudi import HudiTarget, write_silver
from tests.conftest import ROOT, TESTING_JARS

# Hudi's datasource writes open the session's catalog, the stack's metastore.
pytestmark = pytest.mark.stack

NO_SYNC = {"hoodie.datasource.meta.sync.enable": "false", "hoodie.datasource.hive_sync.enable": "false"}


def _start(code: str, pause_dir: Path, points: str, **env: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        env={**os.environ, "CDC_PAUSE_AT": points, "CDC_PAUSE_DIR": str(pause_dir), **env},
        start_new_session=True,
    )


def _wait_for(path: Path, process: subprocess.Popen[bytes], timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert process.poll() is None, f"the process ended ({process.returncode}) before pausing"
        assert time.monotonic() < deadline, f"no {path.name} after {timeout_s}s"
        time.sleep(0.2)
    return json.loads(path.read_text())


def _kill(process: subprocess.Popen[bytes]) -> None:
    os.killpg(process.pid, signal.SIGKILL)  # the process and its JVM
    process.wait(30)


def test_an_armed_point_pauses_once_and_an_unarmed_one_passes(tmp_path: Path) -> None:
    code = """
        from devkit.pauses import PausingHooks
        hooks = PausingHooks.from_env()
        hooks.at("decode", batch_id=1)          # not armed: passes
        print("passed decode", flush=True)
        hooks.at("between_tables", batch_id=7, committed=["db.a"])
        print("never printed", flush=True)
    """
    process = _start(code, tmp_path, "between_tables,hudi_commit")
    try:
        reached = _wait_for(tmp_path / "between_tables.json", process, 30)
        assert reached == {"point": "between_tables", "batch_id": 7, "committed": ["db.a"]}
        time.sleep(0.5)
        assert process.poll() is None  # still paused
        assert not (tmp_path / "decode.json").exists()
    finally:
        _kill(process)


@pytest.mark.slow
def test_a_commit_killed_inside_hudi_is_rolled_back_by_the_next_write(spark: SparkSession, tmp_path: Path) -> None:
    table = tmp_path / "t"
    target = HudiTarget("db", "t", str(table), ("id",))
    schema = "id int, v string, _cdc_position string, _hoodie_is_deleted boolean"
    write_silver(spark.createDataFrame([(1, "a", "01", False)], schema), target, 0, "q", NO_SYNC)
    code = f"""
        import dataclasses
        from app.config import load_config
        from app.sink.hudi import HudiTarget, write_silver
        from app.spark import build_session
        from devkit.pauses import PausingHooks
        config = load_config("conf/local.yaml")
        spark = build_session("pause-test", dataclasses.replace(config.spark, jars_dir={str(TESTING_JARS)!r}), None)
        target = HudiTarget("db", "t", {str(table)!r}, ("id",))
        df = spark.createDataFrame([(1, "b", "02", False), (2, "c", "02", False)], {schema!r})
        write_silver(df, target, 1, "q", {{**{NO_SYNC!r}, **PausingHooks.from_env().write_options({str(table)!r})}})
        print("commit completed", flush=True)
    """
    process = _start(code, tmp_path, "hudi_commit", CDC_PAUSE_TABLE=str(table))
    try:
        reached = _wait_for(tmp_path / "hudi_commit.json", process, 240)
        instant = reached["instant"]
        timeline = {p.name for p in (table / ".hoodie" / "timeline").iterdir()}
        assert f"{instant}.inflight" in timeline
        assert not any(n.startswith(f"{instant}_") for n in timeline)  # not completed
        markers = list((table / ".hoodie" / ".temp" / instant).rglob("*"))
        assert markers, "no markers of the inflight commit"
    finally:
        _kill(process)

    assert sorted(tuple(r) for r in spark.read.format("hudi").load(str(table)).select("id", "v").collect()) == [
        (1, "a")
    ]
    write_silver(spark.createDataFrame([(3, "d", "03", False)], schema), target, 2, "q", NO_SYNC)
    rows = sorted(tuple(r) for r in spark.read.format("hudi").load(str(table)).select("id", "v").collect())
    assert rows == [(1, "a"), (3, "d")]
    timeline = {p.name for p in (table / ".hoodie" / "timeline").iterdir()}
    assert any(n.endswith(".rollback") for n in timeline), sorted(timeline)
