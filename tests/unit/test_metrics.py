"""The job's metrics (app/state/metrics.py): the Kafka lag from the query's progress, the gauges in the driver's
Spark metrics system (io.cdclake.metrics.JobMetrics), and the structured line per batch."""
from __future__ import annotations

import json
import logging
import time

import pytest
from pyspark.sql import SparkSession

from app.config import JobConfig, SourceConfig
from app.state.metrics import JobMetrics, MetricsListener, kafka_lag
from app.state.stats import TableBatchStats


def test_kafka_lag_per_partition() -> None:
    end = '{"p.s.a": {"0": 10, "1": 5}}'
    latest = '{"p.s.a": {"0": 12, "1": 5}, "p.s.b": {"0": 3}}'
    assert kafka_lag(end, latest) == {"p.s.a": {"0": 2, "1": 0}, "p.s.b": {"0": 3}}
    assert kafka_lag(None, None) == {} and kafka_lag("not json", latest) == {}


class _Progress:
    """What the JVM hands the listener: a query progress event, of which it reads the progress's JSON."""

    def __init__(self, text: str) -> None:
        self.text = text

    def progress(self) -> _Progress:
        return self

    def json(self) -> str:
        return self.text


def test_the_listener_hands_on_each_progress_json(spark: SparkSession, local_config: JobConfig) -> None:
    """Spark's progress JSON (`StreamingQueryProgress.json()`) nests each source's offsets parsed; the Kafka sources'
    reach the lag as the JSON text `kafka_lag` reads, the others are left out."""
    config = JobConfig(kafka=local_config.kafka, registry=local_config.registry, lake=local_config.lake,
                       sources=[SourceConfig(topic_prefix="q", name="listened")])  # gauges of their own
    metrics = JobMetrics(spark, config)
    progress = {
        "id": "5b3c", "runId": "9e1f", "name": "cdc", "timestamp": "2026-12-05T12:00:00.000Z", "batchId": 7,
        "numInputRows": 12, "durationMs": {"triggerExecution": 3100}, "stateOperators": [],
        "sources": [
            {"description": "KafkaV2[SubscribePattern[q\\..*]]", "startOffset": {"q.s.a": {"0": 2}},
             "endOffset": {"q.s.a": {"0": 14, "1": 3}}, "latestOffset": {"q.s.a": {"0": 20, "1": 3}},
             "numInputRows": 12},
            {"description": "FileStreamSource[s3a://lake/x]", "startOffset": None, "endOffset": {"logOffset": 0},
             "latestOffset": None, "numInputRows": 0},
        ],
        "sink": {"description": "ForeachBatchSink", "numOutputRows": -1},
    }
    MetricsListener(metrics).onQueryProgress(_Progress(json.dumps(progress)))
    assert metrics.kafka_lag == {"listened": 6}
    MetricsListener(metrics).onQueryProgress(_Progress("not json"))  # logged, never raised into the query
    assert metrics.kafka_lag == {"listened": 6}


def test_gauges_and_the_structured_line(
    spark: SparkSession, local_config: JobConfig, caplog: pytest.LogCaptureFixture
) -> None:
    config = JobConfig(kafka=local_config.kafka, registry=local_config.registry, lake=local_config.lake,
                       sources=[SourceConfig(topic_prefix="p", name="pg"), SourceConfig(topic_prefix="m")])
    metrics = JobMetrics(spark, config)
    assert metrics._source is not None, "cdc-functions.jar on the session's class path"
    newest = int(time.time() * 1000) - 4000
    stats = [TableBatchStats("lake.s_a", rows_in=7, upserts=5, deletes=1, dead_letters=1, duration_s=1.5,
                             max_source_ts_ms=newest),
             TableBatchStats("lake.s_b", rows_in=2, upserts=2, max_source_ts_ms=newest - 6000)]
    metrics.record_batch(3, stats, 4.0, {"plan": 1.0, "tables": 3.0}, quarantined=["lake.s_b"],
                         sources={"lake.s_a": "pg", "lake.s_b": "pg"})
    source = metrics._source
    assert source.get("table.lake.s_a.rows_applied") == 6 and source.get("table.lake.s_a.dead_letters") == 1
    assert source.get("table.lake.s_b.quarantined") == 1 and source.get("job.batch_tables_s") == 3
    assert 4 <= source.get("table.lake.s_a.freshness_s") < 60  # an age: it grows while nothing is applied
    assert 4 <= source.get("source.pg.freshness_s") < 60  # the newest of its tables
    assert source.get("job.outage") == 0
    with caplog.at_level(logging.INFO, logger="app.metrics"):
        metrics.record_progress(3, [('{"p.s.a": {"0": 10}}', '{"p.s.a": {"0": 15}, "m.d.c": {"0": 2}}')])
    assert source.get("source.pg.kafka_lag") == 5 and source.get("source.m.kafka_lag") == 2
    line = json.loads(next(r.getMessage() for r in caplog.records if r.name == "app.metrics").split(" ", 1)[1])
    assert line["batch_id"] == 3 and line["tables"]["lake.s_a"]["rows_applied"] == 6
    assert line["sources"]["pg"]["kafka_lag"] == 5 and line["sources"]["m"]["freshness_s"] is None
    # A registered source of the driver's metrics system: Spark's sinks export it.
    registry = spark.sparkContext._jvm.org.apache.spark.SparkEnv.get().metricsSystem()  # type: ignore[union-attr]
    assert registry.getSourcesByName("cdc_lakehouse").size() >= 1
    metrics.record_outage()
    assert source.get("job.outage") == 1
