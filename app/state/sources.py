"""Whether each source's connector still moves along its database's log: the source-lag alarm.

A connector delivers a record to Kafka only once it has read its database's log that far: a change of a captured
table, or, on an idle database, a heartbeat (`heartbeat.interval.ms`: a record on `__debezium-heartbeat.<prefix>`;
for PostgreSQL also `heartbeat.action.query` writing a heartbeat table in the publication, so that the slot advances
and a change with a new position arrives; `sources[].heartbeat_table` keeps that table out of Silver). Each batch
reports the newest Kafka timestamp per topic (its summary aggregate, no decoding); a source's newest is when its
connector last delivered. A timer (the job's heartbeat, `recovery.heartbeat_s`) compares it with the clock, also
while no batch runs: past `recovery.source_stalled_after_s` the source is stalled (a WARNING naming it and what to
check, the gauge `source.<name>.stalled` = 1, status.json's `sources`) until a record of it arrives again.

The job knows what a source delivered only up to where it last looked: the start of its latest batch (the offsets a
trigger takes), or now while Spark's latest trigger found nothing new (the query idle). So the age is counted to the
latest batch's start while a batch runs or the next trigger is yet to look, and a long batch does not read as a
silent source. Before the first batch the job has looked only once Spark's trigger found nothing (idle): the clock
then runs from the job's start, so a slow start is not a silent source, and a source silent from the start is. A
job reading a backlog sees old timestamps: the alarm then says the lake is behind by that much, and the Kafka lag it
names tells a backlog in Kafka from a silent connector.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

from app.config import JobConfig
from app.routing.route import delivering_source

log = logging.getLogger(__name__)


class Gauges(Protocol):
    """What the watch sets (app/state/metrics.py JobMetrics)."""

    def set(self, name: str, value: float) -> None: ...

    def set_time(self, name: str, epoch_ms: int) -> None: ...


def iso(epoch_ms: int) -> str:
    return datetime.fromtimestamp(epoch_ms / 1000.0, UTC).isoformat(timespec="seconds")


class SourceWatch:
    """When each source last delivered, and which sources are stalled (module docstring). Thread-safe: batches
    report, the heartbeat's timer checks."""

    def __init__(self, config: JobConfig, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.clock = clock
        self.started_ms = int(clock() * 1000)
        self.newest_ms: dict[str, int] = {}  # source label -> newest Kafka timestamp read
        self.stalled: set[str] = set()
        self.looked_ms: int | None = None  # the start of the latest batch read: Kafka as the job last saw it
        self._starting_ms: int | None = None  # the running batch's start, until its records are read
        self._lock = threading.Lock()

    def begin_batch(self) -> None:
        self._starting_ms = int(self.clock() * 1000)

    def delivered(self, newest_by_topic: Mapping[str, int]) -> None:
        """A batch's newest Kafka timestamp per topic (app/batch/plan.py BatchSummary.newest_ms)."""
        with self._lock:
            for topic, ms in newest_by_topic.items():
                source = delivering_source(topic, self.config)
                if source is not None and ms > self.newest_ms.get(source.label, -1):
                    self.newest_ms[source.label] = ms
            self.looked_ms = self._starting_ms

    def check(
        self, gauges: Gauges | None = None, kafka_lag: Mapping[str, int] | None = None, *, idle: bool = False
    ) -> dict[str, Any]:
        """Compare each source with the clock (`idle`: Spark's latest trigger found no new record, so the job has
        seen all there is until now): log a source turning stalled (WARNING) or delivering again (INFO), set its
        gauges; returns status.json's `sources` (label -> delivered_at, age_s, stalled)."""
        after_s = self.config.recovery.source_stalled_after_s
        if idle:
            now_ms = int(self.clock() * 1000)
        else:  # what the job saw at its latest look; before any, nothing is known yet
            now_ms = self.looked_ms if self.looked_ms is not None else self.started_ms
        report: dict[str, Any] = {}
        with self._lock:
            for source in self.config.source_list:
                label = source.label
                newest = self.newest_ms.get(label)
                since = newest if newest is not None else self.started_ms
                age_s = max(0.0, (now_ms - since) / 1000.0)
                stalled = bool(after_s) and age_s >= after_s
                if stalled and label not in self.stalled:
                    self.stalled.add(label)
                    lag = (kafka_lag or {}).get(label)
                    seen = (f"its connector's newest record was written at {iso(newest)}" if newest is not None
                            else "no record of it has arrived since the job started")
                    behind = ("" if not lag else f"; the job is {lag} records behind Kafka: a backlog the job is "
                              "still reading, not a silent connector")
                    log.warning(
                        "SOURCE STALLED: source %s (topic prefix %s) has delivered nothing for %.0f s (%s; "
                        "recovery.source_stalled_after_s=%g)%s. Is its connector streaming? Kafka Connect can report "
                        "RUNNING while the connector's replication slot is held by another backend: see "
                        "docs/when-things-go-wrong.md \"Source stalled\"", label, source.topic_prefix, age_s, seen,
                        after_s, behind)
                elif not stalled and label in self.stalled:
                    self.stalled.discard(label)
                    log.info("source %s delivers again: its newest record is %.0f s old", label, age_s)
                if gauges is not None:
                    gauges.set_time(f"source.{label}.delivered_age_s", since)
                    gauges.set(f"source.{label}.stalled", int(stalled))
                report[label] = {"delivered_at": None if newest is None else iso(newest),
                                 "age_s": round(age_s, 1), "stalled": stalled}
        return report
