"""The source-lag alarm (app/state/sources.py): when each source last delivered, counted to where the job last
looked, the warning once past `recovery.source_stalled_after_s`, the gauges, status.json's `sources` and
scripts/status.py's exit 4; the heartbeat table's topic kept out of Silver; the settings checked."""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from app.config import JobConfig, parse_config
from app.errors import ConfigError
from app.routing.route import check_routes, delivering_source, skip_reason
from app.state.sources import SourceWatch
from scripts.status import main as status_main

T0 = 1_800_000_000.0  # the clock's start, epoch seconds


def _config(stalled_after_s: float = 60, **source: Any) -> JobConfig:
    return parse_config({
        "kafka": {"bootstrap_servers": "127.0.0.1:9092", "topic_pattern": r".*"},
        "registry": {"url": "http://127.0.0.1:8080"},
        "lake": {"database": "lake", "silver_path": "/l/s", "bronze_path": "/l/b", "checkpoint_path": "/l/c"},
        "sources": [{"name": "pg", "topic_prefix": "p", **source}, {"topic_prefix": "m"}],
        "recovery": {"source_stalled_after_s": stalled_after_s},
    })


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


class Gauges:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.values: dict[str, float] = {}

    def set(self, name: str, value: float) -> None:
        self.values[name] = value

    def set_time(self, name: str, epoch_ms: int) -> None:  # as the JVM gauge reads it: an age at the scrape
        self.values[name] = self.clock() - epoch_ms / 1000.0


def _batch(watch: SourceWatch, clock: Clock, newest: dict[str, float]) -> None:
    """A batch starting now whose records' newest Kafka timestamps are `newest` (seconds since T0)."""
    watch.begin_batch()
    watch.delivered({topic: int((T0 + s) * 1000) for topic, s in newest.items()})


def test_a_silent_source_is_stalled_once_past_the_threshold_and_delivers_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    watch, gauges = SourceWatch(_config(), clock), Gauges(clock)
    clock.now = T0 + 10
    _batch(watch, clock, {"p.s.a": 9, "__debezium-heartbeat.m": 8})  # a heartbeat topic counts for its source
    assert watch.check(gauges, idle=True) == {
        "pg": {"delivered_at": "2027-01-15T08:00:09+00:00", "age_s": 1.0, "stalled": False},
        "m": {"delivered_at": "2027-01-15T08:00:08+00:00", "age_s": 2.0, "stalled": False},
    }
    clock.now = T0 + 70  # idle: Spark's triggers find nothing new, so the job has seen all until now
    with caplog.at_level(logging.INFO, logger="app.state.sources"):
        report = watch.check(gauges, {"pg": 0}, idle=True)
        assert report["pg"]["stalled"] and report["m"]["stalled"] and report["pg"]["age_s"] == 61.0
        watch.check(gauges, idle=True)  # said once, not at every beat
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and warnings[0].startswith("SOURCE STALLED: source pg (topic prefix p) has delivered "
                                                         "nothing for 61 s"), warnings
    assert "recovery.source_stalled_after_s=60" in warnings[0] and "behind Kafka" not in warnings[0]
    assert gauges.values["source.pg.stalled"] == 1 and gauges.values["source.pg.delivered_age_s"] == 61
    caplog.clear()
    clock.now = T0 + 75
    with caplog.at_level(logging.INFO, logger="app.state.sources"):
        _batch(watch, clock, {"p.s.heartbeat": 74})
        assert not watch.check(gauges)["pg"]["stalled"]
    assert [r.getMessage() for r in caplog.records] == ["source pg delivers again: its newest record is 1 s old"]
    assert gauges.values["source.pg.stalled"] == 0 and gauges.values["source.m.stalled"] == 1


def test_the_age_counts_to_where_the_job_last_looked() -> None:
    """A long batch, or a trigger not yet run after it, is not a silent source: the job has not looked since."""
    clock = Clock()
    watch = SourceWatch(_config(), clock)
    clock.now = T0 + 100  # before any batch: a slow start knows nothing yet; an idle query has looked
    assert watch.check()["pg"] == {"delivered_at": None, "age_s": 0.0, "stalled": False}
    assert watch.check(idle=True)["pg"] == {"delivered_at": None, "age_s": 100.0, "stalled": True}
    _batch(watch, clock, {"p.s.a": 99})
    clock.now = T0 + 400  # the batch ran for 300 s; the next trigger has not looked yet
    watch.begin_batch()  # its records not read yet
    assert watch.check()["pg"]["age_s"] == 1.0
    assert watch.check(idle=True)["pg"]["age_s"] == 301.0


def test_the_warning_tells_a_backlog_from_a_silent_connector(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    watch = SourceWatch(_config(), clock)
    _batch(watch, clock, {"p.s.a": -500})  # a backlog: old records
    with caplog.at_level(logging.WARNING, logger="app.state.sources"):
        watch.check(kafka_lag={"pg": 1200})
    assert "the job is 1200 records behind Kafka" in caplog.records[0].getMessage()


def test_zero_never_stalls() -> None:
    clock = Clock()
    watch = SourceWatch(_config(stalled_after_s=0), clock)
    clock.now = T0 + 10**6
    assert not watch.check(idle=True)["pg"]["stalled"]


def test_the_heartbeat_table_feeds_no_silver_table() -> None:
    config = _config(heartbeat_table="public.dbz_heartbeat")
    topics = ["p.public.dbz_heartbeat", "p.public.orders", "m.public.dbz_heartbeat"]
    assert skip_reason("p.public.dbz_heartbeat", config) == \
        "the heartbeat table of source pg (heartbeat.action.query)"
    assert [r.topic for r in check_routes(config, topics)] == ["m.public.dbz_heartbeat", "p.public.orders"]
    assert delivering_source("p", config).label == "pg"  # type: ignore[union-attr]
    assert delivering_source("__debezium-heartbeat.m", config).label == "m"  # type: ignore[union-attr]
    assert delivering_source("x.y.z", config) is None


@pytest.mark.parametrize(("source", "recovery", "key"), [
    ({"heartbeat_table": "dbz_heartbeat"}, {}, "sources[0].heartbeat_table"),
    ({"heartbeat_table": "public.hb", "tables": {"public.hb": {"name": "x"}}}, {}, "sources[0].heartbeat_table"),
    ({}, {"source_stalled_after_s": -1}, "recovery.source_stalled_after_s"),
])
def test_bad_settings_name_their_key(source: dict[str, Any], recovery: dict[str, Any], key: str) -> None:
    raw = {
        "kafka": {"bootstrap_servers": "127.0.0.1:9092", "topic_pattern": r".*"},
        "registry": {"url": "http://127.0.0.1:8080"},
        "lake": {"database": "lake", "silver_path": "/l/s", "bronze_path": "/l/b", "checkpoint_path": "/l/c"},
        "sources": [{"topic_prefix": "p", **source}],
        "recovery": recovery,
    }
    with pytest.raises(ConfigError) as e:
        parse_config(raw)
    assert e.value.key == key


def test_status_exits_4_for_a_stalled_source(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    checkpoint = tmp_path / "cp"
    checkpoint.mkdir()
    conf = tmp_path / "job.yaml"
    conf.write_text(json.dumps({
        "kafka": {"bootstrap_servers": "127.0.0.1:9092", "topic_pattern": "p\\..*"},
        "registry": {"url": "http://127.0.0.1:8080"},
        "lake": {"database": "lake", "silver_path": str(tmp_path / "s"), "bronze_path": str(tmp_path / "b"),
                 "checkpoint_path": str(checkpoint)},
        "source": {"topic_prefix": "p", "name": "pg"},
    }))
    status: dict[str, Any] = {
        "conf": str(conf), "started_at": "2026-11-27T06:00:00+00:00", "routes": {}, "stale_tables": {},
        "tables": {}, "skipped_topics": {}, "batches": 0, "failure": None,
        "sources": {"pg": {"delivered_at": "2026-11-27T06:00:09+00:00", "age_s": 950.0, "stalled": True}},
    }
    (checkpoint / "status.json").write_text(json.dumps(status))
    assert status_main(["--conf", str(conf)]) == 4
    out = capsys.readouterr()
    assert "source pg: STALLED, last delivered 2026-11-27T06:00:09+00:00 (950 s before the heartbeat)" in out.out
    assert "STALLED: source pg delivers nothing" in out.err
    status["sources"]["pg"]["stalled"] = False
    (checkpoint / "status.json").write_text(json.dumps(status))
    assert status_main(["--conf", str(conf)]) == 0
