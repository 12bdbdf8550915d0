"""CDC path on the real stack: PostgreSQL -> Debezium (Kafka Connect) -> Kafka, schemas in Apicurio.

An independent consumer checks the framing and resolves each id through the registry's v3 API; Spark then
reads the same topic with its Kafka source and decodes it with from_avro after stripping the framing.
"""
from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from decimal import Decimal

import psycopg
import pytest
import requests
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.avro.functions import from_avro

from tests.conftest import RUN_ID
from tests.support.cdc import KAFKA_BOOTSTRAP, PG_DSN, REGISTRY_URL, KafkaRecord, debezium_connector, wait_for_records

pytestmark = pytest.mark.stack

SCHEMA = f"smoke_{RUN_ID}"
PREFIX = f"smoke{RUN_ID}"
TOPIC = f"{PREFIX}.{SCHEMA}.items"


@pytest.fixture(scope="module")
def cdc_records(stack: None) -> Iterator[list[KafkaRecord]]:
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        conn.execute(f"create schema {SCHEMA}")
        conn.execute(f"create table {SCHEMA}.items (id int primary key, name text, price numeric(8,2))")
        conn.execute(f"insert into {SCHEMA}.items values (1, 'one', 1.50), (2, 'two', -2.25)")
        with debezium_connector(f"smoke-{RUN_ID}", PREFIX, [SCHEMA]):
            # 2 snapshot reads, then 1 insert and 1 update streamed from the WAL.
            conn.execute(f"insert into {SCHEMA}.items values (3, 'three', 3.00)")
            conn.execute(f"update {SCHEMA}.items set name = 'TWO' where id = 2")
            yield wait_for_records(TOPIC, 4)
        conn.execute(f"drop schema {SCHEMA} cascade")


def _schema_for(schema_id: int) -> dict:
    r = requests.get(f"{REGISTRY_URL}/apis/registry/v3/ids/contentIds/{schema_id}", timeout=10)
    r.raise_for_status()
    return dict(json.loads(r.text))


def test_framing_and_registry_ids(cdc_records: list[KafkaRecord]) -> None:
    assert len(cdc_records) == 4
    for record in cdc_records:
        for side, data, expected_name in (("key", record.key, "Key"), ("value", record.value, "Envelope")):
            assert data is not None and len(data) > 5, (side, record)
            assert data[0:1] == b"\x00", f"{side} magic byte at offset {record.offset}: {data[:5].hex()}"
            (schema_id,) = struct.unpack(">I", data[1:5])
            schema = _schema_for(schema_id)
            assert schema["name"] == expected_name
            assert schema["namespace"] == f"{PREFIX}.{SCHEMA}.items"


def test_spark_kafka_source_decodes_with_from_avro(spark: SparkSession, cdc_records: list[KafkaRecord]) -> None:
    value = cdc_records[0].value
    assert value is not None
    (schema_id,) = struct.unpack(">I", value[1:5])
    schema_json = json.dumps(_schema_for(schema_id))
    raw = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", KAFKA_BOOTSTRAP)
        .option("subscribe", TOPIC)
        .option("startingOffsets", "earliest")
        .load()
    )
    # Strip the 5-byte framing (magic byte + 4-byte id); Avro binary follows.
    decoded = raw.select(from_avro(F.expr("substring(value, 6)"), schema_json).alias("e")).select(
        "e.op", "e.after.id", "e.after.name", "e.after.price"
    )
    rows = sorted((r.op, r.id, r.name, r.price) for r in decoded.collect())
    assert rows == sorted([
        ("r", 1, "one", Decimal("1.50")),
        ("r", 2, "two", Decimal("-2.25")),
        ("c", 3, "three", Decimal("3.00")),
        ("u", 2, "TWO", Decimal("-2.25")),
    ])
