"""SQL Server through the whole batch function, from golden vectors (SQL Server cannot run here).

tests/golden/sqlserver/orders.json holds the key and value schemas of Debezium 3.x's SQL Server connector for
`testDB.dbo.orders` (the documented envelope and `io.debezium.connector.sqlserver.Source` record, with
`commit_lsn`, `change_lsn` and `event_serial_no`), and events in Kafka order over two batches: snapshot reads,
inserts, two updates of one key in one commit arriving in reverse order, a primary-key change (delete and create
sharing a change_lsn, told apart by event_serial_no), a delete with its tombstone; then, in the later batch,
events older than what is already in Silver (one of a deleted key), and updates of every column. The test
registers the schemas in Apicurio, produces the events framed as the Apicurio converter frames them, runs the job
on a `connector: sqlserver` source with SQL Server's three-part topic, and compares Silver value by value.
"""
from __future__ import annotations

import dataclasses
import io
import json
import re
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import fastavro
import pytest
from chispa import assert_df_equality
from confluent_kafka import Producer
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BooleanType,
    DateType,
    DecimalType,
    IntegerType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from app.config import JobConfig
from tests.conftest import RUN_ID
from tests.e2e.test_poison import _register
from tests.support.cdc import KAFKA_BOOTSTRAP, job_config_for
from tests.support.pipeline import Pipeline

pytestmark = pytest.mark.stack

GOLDEN = json.loads((Path(__file__).parent.parent / "golden" / "sqlserver" / "orders.json").read_text("utf-8"))
PREFIX = f"mssql{RUN_ID}"
TOPIC = f"{PREFIX}.{GOLDEN['topic_suffix']}"
DATABASE = f"mssql_{RUN_ID}"
SILVER_TYPES = StructType([
    StructField("id", IntegerType()), StructField("name", StringType()), StructField("qty", IntegerType()),
    StructField("amount", DecimalType(10, 2)), StructField("active", BooleanType()),
    StructField("created", TimestampType()), StructField("order_day", DateType()),
    StructField("pickup", StringType()), StructField("placed_at", TimestampType()), StructField("note", StringType()),
])


def _avro_value(row: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if row is None else {**row, "amount": None if row["amount"] is None else Decimal(row["amount"])}


def _framed(schema_id: int, schema: Any, record: dict[str, Any]) -> bytes:
    out = io.BytesIO(b"\x00" + schema_id.to_bytes(4, "big"))
    out.seek(5)
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return out.getvalue()


def _produce(batch: int, key_id: int, value_id: int) -> None:
    producer = Producer({"bootstrap.servers": KAFKA_BOOTSTRAP})
    for event in (e for e in GOLDEN["events"] if e["batch"] == batch):
        key = _framed(key_id, GOLDEN["key_schema"], event["key"])
        value = event["value"]
        if value is not None:
            value = _framed(value_id, GOLDEN["value_schema"], {
                **value, "before": _avro_value(value["before"]), "after": _avro_value(value["after"]),
            })
        producer.produce(TOPIC, key=key, value=value)
    assert producer.flush(30) == 0


def _silver_row(row: dict[str, Any]) -> tuple[Any, ...]:
    """What Silver holds for a golden row: the documented Spark type of each Debezium encoding."""
    def nanos(ns: int | None) -> datetime | None:
        return None if ns is None else datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=ns // 1000)

    def time_of_day(ns: int | None) -> str | None:
        if ns is None:
            return None
        us = ns // 1000
        return f"{us // 3_600_000_000:02d}:{us // 60_000_000 % 60:02d}:{us // 1_000_000 % 60:02d}.{us % 1_000_000:06d}"

    def zoned(text: str | None) -> datetime | None:
        if text is None:
            return None
        match = re.fullmatch(r"(.*?T\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", text)
        assert match is not None, text
        whole, fraction, zone = match.groups()
        at = datetime.fromisoformat(whole + ("+00:00" if zone == "Z" else zone))
        return (at + timedelta(microseconds=int(((fraction or "") + "000000")[:6]))).astimezone(UTC)

    return (
        row["id"], row["name"], row["qty"], None if row["amount"] is None else Decimal(row["amount"]),
        row["active"], nanos(row["created"]),
        None if row["order_day"] is None else date(1970, 1, 1) + timedelta(days=row["order_day"]),
        time_of_day(row["pickup"]), zoned(row["placed_at"]), row["note"],
    )


def _expected_rows() -> list[dict[str, Any]]:
    """The latest row per key by source position (commit_lsn, change_lsn, event_serial_no), deletes removing."""
    def position(source: dict[str, Any]) -> tuple[str, str, int]:
        zero = "00000000:00000000:0000"
        return (source["commit_lsn"] or zero, source["change_lsn"] or zero, source["event_serial_no"] or 0)

    latest: dict[int, tuple[tuple[str, str, int], dict[str, Any] | None]] = {}
    for event in GOLDEN["events"]:
        value = event["value"]
        if value is None:
            continue
        key, at = event["key"]["id"], position(value["source"])
        if key not in latest or at > latest[key][0]:
            latest[key] = (at, value["after"])
    return [row for _, row in latest.values() if row is not None]


@pytest.fixture(scope="module")
def schema_ids(stack: None) -> tuple[int, int]:
    return _register(f"{TOPIC}-key", GOLDEN["key_schema"]), _register(f"{TOPIC}-value", GOLDEN["value_schema"])


def sqlserver_job(base: JobConfig, lake: str) -> JobConfig:
    config = job_config_for(base, PREFIX, DATABASE, lake)
    assert config.source is not None
    return dataclasses.replace(
        config, source=dataclasses.replace(config.source, name="mssql", connector="sqlserver"),
        kafka=dataclasses.replace(config.kafka, topic_pattern=PREFIX + r"\.[^.]+\.[^.]+\.[^.]+"),
    )


def test_sqlserver_events_in_source_order_across_batches(
    spark: SparkSession, local_config: JobConfig, lake_root: str, schema_ids: tuple[int, int]
) -> None:
    pipeline = Pipeline.of(spark, sqlserver_job(local_config, f"{lake_root}/mssql"))
    path = pipeline.config.lake.table_path("testDB_dbo_orders", DATABASE)
    key_id, value_id = schema_ids

    _produce(1, key_id, value_id)
    pipeline.run()
    silver = spark.read.format("hudi").load(path)
    assert {r.id: r.name for r in silver.collect()} == {1: "ann-3", 4: "dee", 30: "cy"}
    positions = {r.id: r._cdc_position for r in silver.collect()}
    assert positions[1] == "0000002C:00000200:0004:0000002C:00000190:0002:00000000000000000001"
    assert positions[30] == "0000002D:00000300:0003:0000002D:000002F0:0002:00000000000000000002"

    _produce(2, key_id, value_id)
    pipeline.run()
    silver = spark.read.format("hudi").load(path)
    expected = spark.createDataFrame([_silver_row(r) for r in _expected_rows()], SILVER_TYPES)
    assert sorted(r["name"] or r["note"] for r in _expected_rows()) == sorted(GOLDEN["expected"].values())
    assert_df_equality(
        silver.select(*SILVER_TYPES.names).orderBy("id"), expected.orderBy("id"), ignore_nullable=True
    )
    batches = pipeline.processor.history
    table = f"{DATABASE}.testDB_dbo_orders"
    assert batches[-1][table].blocked == 1  # bob's stale update, older than his delete
    assert silver.where(F.col("id") == 2).count() == 0
