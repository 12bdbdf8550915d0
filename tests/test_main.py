"""The entry point validates the config before Spark starts and names the bad key."""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

import app.main as app_main
from app.errors import ConfigError
from tests.conftest import LOCAL_CONF, ROOT


def _run_main(conf: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "app" / "main.py"), "--conf", str(conf), "--available-now"],
        capture_output=True, text=True, timeout=60, check=False,
    )


def test_unknown_key_exits_2_naming_the_key_before_spark(tmp_path: Path) -> None:
    raw = yaml.safe_load(LOCAL_CONF.read_text())
    raw["kafka"]["bootstrap_server"] = "typo:9092"
    conf = tmp_path / "bad.yaml"
    conf.write_text(yaml.safe_dump(raw))
    out = _run_main(conf)
    assert out.returncode == 2
    assert "kafka.bootstrap_server" in out.stderr and "unknown key" in out.stderr
    # Spark's own start-up lines (it logs to stderr) must not appear: the config is rejected first.
    assert "SparkContext" not in out.stderr and "Running Spark version" not in out.stderr


def test_wrong_type_exits_2_naming_the_key(tmp_path: Path) -> None:
    raw = yaml.safe_load(LOCAL_CONF.read_text())
    raw["registry"]["retries"] = "many"
    conf = tmp_path / "bad.yaml"
    conf.write_text(yaml.safe_dump(raw))
    out = _run_main(conf)
    assert out.returncode == 2
    assert "registry.retries" in out.stderr


def test_missing_file_exits_2(tmp_path: Path) -> None:
    out = _run_main(tmp_path / "absent.yaml")
    assert out.returncode == 2
    assert "absent.yaml" in out.stderr


def test_main_runs_as_a_script_on_a_python_that_has_not_imported_types(tmp_path: Path) -> None:
    """`spark-submit app/main.py` puts app/ first on sys.path, where app/cdc/debezium_types.py would shadow the standard
    library's `types`. pyenv's Python imports `types` at start-up and hides that; `-S` (no site) starts like
    Debian's python3, which does not (site-packages come through PYTHONPATH instead)."""
    site_packages = subprocess.run(
        [sys.executable, "-c", "import site; print(site.getsitepackages()[0])"], capture_output=True, text=True,
        check=True,
    ).stdout.strip()
    done = subprocess.run(
        [sys.executable, "-S", str(ROOT / "app" / "main.py"), "--help"], cwd=tmp_path, capture_output=True,
        text=True, env={"PYTHONPATH": site_packages, "PATH": "/usr/bin:/bin"}, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "--conf" in done.stdout


def _check(conf: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "app" / "main.py"), "--conf", str(conf), "--check-config"],
        capture_output=True, text=True, timeout=60, check=False, env={**os.environ, "METASTORE_PASSWORD": "x"},
    )


def test_check_config_says_valid_and_exits_0_without_spark(tmp_path: Path) -> None:
    out = _check(LOCAL_CONF)
    assert out.returncode == 0, out.stderr
    assert "is valid" in out.stdout and "conf/local.yaml" in out.stdout
    assert "SparkContext" not in out.stderr and "Running Spark version" not in out.stderr


def test_check_config_names_each_kind_of_mistake_and_exits_2(tmp_path: Path) -> None:
    def broken(change: Callable[[dict[str, Any]], None]) -> Path:
        raw = yaml.safe_load(LOCAL_CONF.read_text())
        change(raw)
        conf = tmp_path / "bad.yaml"
        conf.write_text(yaml.safe_dump(raw))
        return conf

    mistakes: list[tuple[Callable[[dict[str, Any]], None], str]] = [
        (lambda raw: raw["kafka"].update(bootstrap_server="typo:9092"), "kafka.bootstrap_server"),  # unknown key
        (lambda raw: raw["kafka"].pop("topic_pattern"), "kafka.topic_pattern"),  # missing
        (lambda raw: raw["registry"].update(retries="many"), "registry.retries"),  # type
        (lambda raw: raw["lake"].update(table_type="FAST"), "lake.table_type"),  # not allowed
        (lambda raw: raw["lake"].update(table_writers=0), "lake.table_writers"),  # out of range
        (lambda raw: raw["sources"][0].update(snapshot_new_columns="sometimes"), "sources[0].snapshot_new_columns"),
        (lambda raw: raw["metastore"].update(password_env="CDC_NO_SUCH_VARIABLE"), "metastore.password_env"),  # secret
        # Two configured source tables given one Silver name, neither a declared shard.
        (lambda raw: raw["sources"][0].update(tables={"crm.a": {"name": "t"}, "crm.b": {"name": "t"}}),
         "sources[0].tables.crm.b.discriminator"),
        # Two configured source tables the naming rule maps to one Silver table (a_b_c): known before Kafka is read.
        (lambda raw: raw["sources"][0].update(tables={"a_b.c": {"record_key": ["id"]},
                                                      "a.b_c": {"record_key": ["id"]}}),
         'sources[0].tables."a_b.c".name'),
    ]
    for change, key in mistakes:
        out = _check(broken(change))
        assert out.returncode == 2 and key in out.stderr, (key, out.stdout, out.stderr)


def test_a_config_error_found_once_the_topics_are_known_exits_2(monkeypatch: pytest.MonkeyPatch) -> None:
    # Two subscribed topics mapping to one table are known only after Spark started and Kafka was listed
    # (app/job.py); that is still a config error: exit 2, naming the key, like one found before Spark.
    def collide(*_: Any, **__: Any) -> None:
        raise ConfigError('sources[0].tables."a_b.c".name', "topics 'p.a.b_c' and 'p.a_b.c' both map to p.a_b_c")

    monkeypatch.setenv("METASTORE_PASSWORD", "x")
    monkeypatch.setattr(app_main, "run", collide)
    assert app_main.main(["--conf", str(LOCAL_CONF)]) == 2
