"""Bad input stops the job with an error naming the record: undecodable body, unknown schema id, no framing."""
from __future__ import annotations

import io
import json

import fastavro
import pytest
import requests
from confluent_kafka import Producer
from pyspark.sql import SparkSession

from app.batch.processor import BatchProcessor
from app.config import JobConfig
from app.errors import RegistryError, SchemaDecodeError
from app.job import await_query, start_query
from app.wire.registry import RegistryClient
from tests.conftest import RUN_ID
from tests.support.cdc import KAFKA_BOOTSTRAP, REGISTRY_URL, job_config_for

pytestmark = pytest.mark.stack


def _schemas(namespace: str) -> tuple[dict, dict]:
    value = {
        "type": "record", "name": "Envelope", "namespace": namespace, "fields": [
            {"name": "before", "type": ["null", {"type": "record", "name": "Value",
                                                 "fields": [{"name": "id", "type": "int"}]}], "default": None},
            {"name": "after", "type": ["null", "Value"], "default": None},
            {"name": "source", "type": {"type": "record", "name": "Source", "fields": [
                {"name": "lsn", "type": ["null", "long"], "default": None}, {"name": "ts_ms", "type": "long"}]}},
            {"name": "op", "type": "string"},
        ],
    }
    key = {"type": "record", "name": "Key", "namespace": namespace, "fields": [{"name": "id", "type": "int"}]}
    return key, value


def _register(artifact_id: str, schema: dict) -> int:
    body = {"artifactId": artifact_id, "artifactType": "AVRO",
            "firstVersion": {"content": {"content": json.dumps(schema), "contentType": "application/json"}}}
    r = requests.post(f"{REGISTRY_URL}/apis/registry/v3/groups/default/artifacts", json=body, timeout=10)
    r.raise_for_status()
    return int(r.json()["version"]["contentId"])


def _framed(schema_id: int, schema: dict, record: dict) -> bytes:
    out = io.BytesIO(b"\x00" + schema_id.to_bytes(4, "big"))
    out.seek(5)
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return out.getvalue()


def _run_job(spark: SparkSession, local_config: JobConfig, prefix: str, lake: str) -> None:
    config = job_config_for(local_config, prefix, prefix, lake)
    processor = BatchProcessor(config, RegistryClient.from_config(config.registry))
    await_query(start_query(spark, config, processor, available_now=True), processor)


@pytest.fixture
def poison_topic(stack: None, request: pytest.FixtureRequest) -> tuple[str, str, int, bytes, dict]:
    """A topic with one valid Debezium event at offset 0; returns (prefix, topic, value id, key bytes, schema)."""
    prefix = f"poison{request.node.name[-6:].replace('_', '')}{RUN_ID}"
    topic = f"{prefix}.s.t"
    key_schema, value_schema = _schemas(f"{prefix}.s.t")
    key_id = _register(f"{topic}-key", key_schema)
    value_id = _register(f"{topic}-value", value_schema)
    key = _framed(key_id, key_schema, {"id": 1})
    valid = _framed(value_id, value_schema, {"before": None, "after": {"id": 1}, "source": {"lsn": 10, "ts_ms": 1},
                                             "op": "c"})
    _produce(topic, key, valid)
    return prefix, topic, value_id, key, value_schema


def _produce(topic: str, key: bytes, value: bytes) -> None:
    producer = Producer({"bootstrap.servers": KAFKA_BOOTSTRAP})
    producer.produce(topic, key=key, value=value)
    assert producer.flush(30) == 0


def test_undecodable_body_names_topic_partition_offset_and_id(
    spark: SparkSession, local_config: JobConfig, lake_root: str, poison_topic: tuple[str, str, int, bytes, dict]
) -> None:
    prefix, topic, value_id, key, _ = poison_topic
    _produce(topic, key, b"\x00" + value_id.to_bytes(4, "big") + b"\xff\xff\xff\xff\xff")
    with pytest.raises(SchemaDecodeError) as info:
        _run_job(spark, local_config, prefix, f"{lake_root}/{prefix}")
    err = info.value
    assert (err.topic, err.partition, err.offset, err.schema_id) == (topic, 0, 1, value_id)
    assert f"{topic}[0]@1" in str(err) and f"schema id {value_id}" in str(err)


def test_unknown_schema_id_names_id_and_url(
    spark: SparkSession, local_config: JobConfig, lake_root: str, poison_topic: tuple[str, str, int, bytes, dict]
) -> None:
    prefix, topic, _, key, value_schema = poison_topic
    unknown = 2_000_000_000
    _produce(topic, key, _framed(unknown, value_schema, {"before": None, "after": {"id": 2},
                                                         "source": {"lsn": 11, "ts_ms": 1}, "op": "c"}))
    with pytest.raises(RegistryError) as info:
        _run_job(spark, local_config, prefix, f"{lake_root}/{prefix}")
    assert info.value.schema_id == unknown
    assert f"/ids/contentIds/{unknown}" in str(info.value) and str(unknown) in str(info.value)


def test_value_without_framing_names_the_record(
    spark: SparkSession, local_config: JobConfig, lake_root: str, poison_topic: tuple[str, str, int, bytes, dict]
) -> None:
    prefix, topic, _, key, _ = poison_topic
    _produce(topic, key, b'{"not": "avro"}')
    with pytest.raises(SchemaDecodeError) as info:
        _run_job(spark, local_config, prefix, f"{lake_root}/{prefix}")
    assert (info.value.topic, info.value.partition, info.value.offset) == (topic, 0, 1)
    assert "framing" in str(info.value)
