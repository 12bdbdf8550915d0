"""The job's health from outside: Spark metrics and one structured line per batch.

Every figure is a gauge of the source `cdc_lakehouse` in the driver's Spark metrics system (io.cdclake.metrics.
JobMetrics in cdc-functions.jar), so whatever sink Spark is given exports it beside Spark's own metrics: the
Prometheus servlet (`spark.ui.prometheus.enabled` and `*.sink.prometheusServlet.*`: `/metrics/prometheus` on the
driver's UI), JMX, CSV, or a CloudWatch sink on EMR (docs/running.md "Status and monitoring"). Names:

    table.<database>.<table>.rows_applied       upserts and deletes of its latest batch
    table.<database>.<table>.rows_in            records of its latest batch
    table.<database>.<table>.dead_letters       records sent to the dead letters in its latest batch
    table.<database>.<table>.duration_s         its unit's time in its latest batch
    table.<database>.<table>.quarantined        1 while quarantined, else 0
    table.<database>.<table>.freshness_s        now minus the newest source commit time applied (grows while idle)
    source.<label>.kafka_lag                    records in Kafka not yet applied (the query's latest offsets minus
                                                those its last batch ended at, summed over the source's partitions)
    source.<label>.freshness_s                  now minus the newest source commit time applied to its tables
    source.<label>.delivered_age_s              seconds since its connector last delivered a record, heartbeats
                                                included (app/state/sources.py), read on a timer
    source.<label>.stalled                      1 once that passes recovery.source_stalled_after_s, else 0
    job.batch_duration_s, job.batch_<phase>_s   the latest batch and its phases (plan: up to the tables' units,
                                                plan_summary: part of plan, bronze: beside the units, tables)
    job.last_batch_age_s                        seconds since the latest batch completed
    job.batches                                 batches completed by this process
    job.outage                                  1 while the job waits out an outage (app/recovery.py), else 0

The structured line (logger `app.metrics`, INFO, after each batch that held data) is `metrics <JSON>` with the same
figures: `{"batch_id", "duration_s", "phases", "tables": {<table>: {...}}, "sources": {<label>: {"kafka_lag",
"freshness_s"}}}`.
"""
from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

from py4j.protocol import Py4JError
from pyspark.java_gateway import ensure_callback_server_started
from pyspark.sql import SparkSession

from app.config import JobConfig
from app.errors import required
from app.spark import jvm_class
from app.state.stats import TableBatchStats

log = logging.getLogger(__name__)
line_log = logging.getLogger("app.metrics")

SOURCE_CLASS = "io.cdclake.metrics.JobMetrics"


class JobMetrics:
    """The gauges of the module docstring, and the structured line."""

    def __init__(self, spark: SparkSession, config: JobConfig) -> None:
        self.config = config
        self.batches = 0
        self.newest_ms: dict[str, int] = {}  # table or source -> newest source commit time applied
        self.batch: dict[str, Any] | None = None  # the latest batch's line, until the query's progress adds the lag
        self.kafka_lag: dict[str, int] = {}  # source label -> records, at the latest progress (the stall warning)
        self._source: Any = None
        try:
            self._source = jvm_class(spark, SOURCE_CLASS)()
            jvm_class(spark, "org.apache.spark.SparkEnv").get().metricsSystem().registerSource(self._source)
        except Py4JError as e:  # without cdc-functions.jar: the structured line only
            log.warning("Spark metrics source not registered (%s not on the class path?): %s", SOURCE_CLASS,
                        str(e).splitlines()[0] if str(e) else e)
            self._source = None

    def set(self, name: str, value: float) -> None:
        if self._source is not None:
            self._source.set(name, float(value))

    def set_time(self, name: str, epoch_ms: int) -> None:
        if self._source is not None:
            self._source.setTime(name, int(epoch_ms))

    def record_batch(
        self, batch_id: int, stats: Iterable[TableBatchStats], duration_s: float, phases: Mapping[str, float],
        *, sources: Mapping[str, str], quarantined: Iterable[str],
    ) -> None:
        """A batch done: its tables' figures (`sources`: table -> source label)."""
        now_ms = int(time.time() * 1000)
        quarantined = set(quarantined)
        tables = {}
        for s in stats:
            prefix, label = f"table.{s.table}", sources.get(s.table, "")
            figures = {"rows_in": s.rows_in, "rows_applied": s.upserts + s.deletes, "dead_letters": s.dead_letters,
                       "duration_s": round(s.duration_s, 3), "quarantined": int(s.table in quarantined)}
            for name, value in figures.items():
                self.set(f"{prefix}.{name}", value)
            if s.max_source_ts_ms is not None:
                self._newer(s.table, f"{prefix}.freshness_s", s.max_source_ts_ms)
                if label:
                    self._newer(label, f"source.{label}.freshness_s", s.max_source_ts_ms)
            tables[s.table] = {**figures, "freshness_s": self._age(s.table, now_ms)}
        self.set("job.batch_duration_s", round(duration_s, 3))
        for phase, seconds in phases.items():
            self.set(f"job.batch_{phase}_s", round(seconds, 3))
        self.set_time("job.last_batch_age_s", now_ms)
        self.batches += 1
        self.set("job.batches", self.batches)
        self.set("job.outage", 0)
        self.batch = {"batch_id": batch_id, "duration_s": round(duration_s, 3),
                      "phases": {k: round(v, 3) for k, v in phases.items()}, "tables": tables}

    def record_outage(self) -> None:
        self.set("job.outage", 1)

    def record_progress(self, batch_id: int, sources: Iterable[tuple[str | None, str | None]]) -> None:
        """The query's progress after a batch: each Kafka source's offsets as JSON (the batch's end, the latest
        Kafka has), for the lag; then the batch's structured line, when it held data."""
        lag: dict[str, int] = {}
        for end_json, latest_json in sources:
            for topic, partitions in kafka_lag(end_json, latest_json).items():
                source = self.config.source_of(topic)
                label = source.label if source is not None else "-"
                lag[label] = lag.get(label, 0) + sum(partitions.values())
        for source_config in self.config.source_list:
            lag.setdefault(source_config.label, 0)
        for label, records in lag.items():
            self.set(f"source.{label}.kafka_lag", records)
        self.kafka_lag = lag
        batch, self.batch = self.batch, None
        if batch is None or batch["batch_id"] != batch_id:
            return
        now_ms = int(time.time() * 1000)
        batch["sources"] = {label: {"kafka_lag": records, "freshness_s": self._age(label, now_ms)}
                            for label, records in sorted(lag.items())}
        line_log.info("metrics %s", json.dumps(batch, sort_keys=True, separators=(",", ":")))

    def _newer(self, key: str, gauge: str, ts_ms: int) -> None:
        if ts_ms > self.newest_ms.get(key, -1):
            self.newest_ms[key] = ts_ms
            self.set_time(gauge, ts_ms)

    def _age(self, key: str, now_ms: int) -> float | None:
        newest = self.newest_ms.get(key)
        return None if newest is None else round((now_ms - newest) / 1000.0, 3)


def kafka_lag(end_json: str | None, latest_json: str | None) -> dict[str, dict[str, int]]:
    """Records per topic partition between a batch's end offsets and the latest ones (Spark's Kafka source
    progress, JSON `{"topic": {"0": 12}}`); a partition absent from the end is counted from 0."""
    try:
        end = json.loads(end_json) if end_json else {}
        latest = json.loads(latest_json) if latest_json else {}
    except ValueError:
        return {}
    lag: dict[str, dict[str, int]] = {}
    for topic, partitions in latest.items():
        done = end.get(topic, {}) if isinstance(end, dict) else {}
        lag[topic] = {p: max(0, int(offset) - int(done.get(p, 0))) for p, offset in partitions.items()}
    return lag


class MetricsListener:
    """Hands each progress of the job's query to JobMetrics (its Kafka sources' offsets and its batch id).

    A py4j callback of Spark's own `PythonStreamingQueryListener` interface (`add_to`), which reads each progress as
    its JSON, one call. pyspark's `StreamingQueryListener` builds its event objects field by field instead: a few
    hundred calls into the JVM per progress, and each of its five maps ends its iteration with a Java exception that
    pyspark converts (a dozen more calls and class look-ups each). The listener's thread used 1.6 CPU-s in 90 s of a
    B3 stream this way, against 2.5-2.8 (docs/performance.md)."""

    def __init__(self, metrics: JobMetrics) -> None:
        self.metrics = metrics
        self.jlistener: Any = None  # the JVM's wrapper of this listener, while added

    def add_to(self, spark: SparkSession) -> None:
        """Listen to the session's streaming queries."""
        gateway = required(spark.sparkContext._gateway, "the Spark JVM gateway")
        ensure_callback_server_started(gateway)  # the JVM calls this object back through it
        self.jlistener = jvm_class(spark, "org.apache.spark.sql.streaming.PythonStreamingQueryListenerWrapper")(self)
        spark._jsparkSession.streams().addListener(self.jlistener)

    def remove_from(self, spark: SparkSession) -> None:
        if self.jlistener is not None:
            spark._jsparkSession.streams().removeListener(self.jlistener)
            self.jlistener = None

    def onQueryStarted(self, jevent: Any) -> None:
        pass

    def onQueryProgress(self, jevent: Any) -> None:
        try:
            progress = json.loads(jevent.progress().json())
            sources = [(_offsets(s.get("endOffset")), _offsets(s.get("latestOffset")))
                       for s in progress.get("sources", []) if "Kafka" in s.get("description", "")]
            self.metrics.record_progress(int(progress["batchId"]), sources)
        except Exception as e:  # never let the metrics stop the query
            log.warning("metrics of a progress event not recorded: %s: %s", type(e).__name__, e)

    def onQueryIdle(self, jevent: Any) -> None:
        pass

    def onQueryTerminated(self, jevent: Any) -> None:
        pass

    class Java:
        implements: ClassVar[list[str]] = ["org.apache.spark.sql.streaming.PythonStreamingQueryListener"]


def _offsets(value: Any) -> str | None:
    """A source's offsets as `kafka_lag` takes them: the JSON text Spark's progress holds them as (its `json()`
    nests them parsed)."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value)
