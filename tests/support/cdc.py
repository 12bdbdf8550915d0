"""Test helpers for the CDC path: a Debezium connector per test scope, and an independent Kafka reader."""
from __future__ import annotations

import dataclasses
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from app.cdc.columns import CDC_COLUMNS
from app.config import JobConfig, SourceConfig
from devkit.connect import (
    ConnectClient,
    MariaDbSource,
    PostgresSource,
    check_publication_mode,
    create_schema_publication,
    drop_replication_slot,
    mariadb_connector_config,
    postgres_connector_config,
)

REGISTRY_URL = "http://127.0.0.1:8080"
CONNECT_URL = "http://127.0.0.1:8083"
KAFKA_BOOTSTRAP = "127.0.0.1:9092"
PG_DSN = "host=127.0.0.1 port=5432 user=postgres password=postgres dbname=source"
SOURCE = PostgresSource("127.0.0.1", 5432, "postgres", "postgres", "source")
# The stack's MariaDB (scripts/stack.sh): the connector's login, and root for tests that create tables.
MARIADB_SOURCE = MariaDbSource("127.0.0.1", 3306, "debezium", "debezium")
MARIADB_ROOT = {"host": "127.0.0.1", "port": 3306, "user": "root", "password": "mariadb"}


@dataclass(frozen=True)
class KafkaRecord:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]


@contextmanager
def debezium_connector(
    name: str,
    topic_prefix: str,
    schemas: list[str],
    source: PostgresSource = SOURCE,
    settings: dict[str, str] | None = None,
    *,
    framing: str = "id4",
    id_type: str = "contentId",
    publish_via_partition_root: bool = False,
    schema_publication: bool = False,
) -> Iterator[ConnectClient]:
    """Register a connector for `schemas`, wait until it runs; delete it and drop its slot and publication
    afterwards. `settings` add or override connector settings (e.g. decimal.handling.mode); `framing` and
    `id_type` choose the converters' wire framing (app/connect.converter_config). An existing publication of
    the other partition-root mode is refused (app/connect.check_publication_mode). `schema_publication`: a
    `FOR TABLES IN SCHEMA` publication made first, so tables created later are captured without a restart."""
    client = ConnectClient(CONNECT_URL)
    base = postgres_connector_config(
        name, source, topic_prefix, schemas, REGISTRY_URL, framing=framing, id_type=id_type,
        publish_via_partition_root=publish_via_partition_root, schema_publication=schema_publication,
    )
    config = {**base, **(settings or {})}
    with psycopg.connect(PG_DSN.replace("dbname=source", f"dbname={source.dbname}"), autocommit=True) as conn:
        if schema_publication:
            create_schema_publication(conn, config["publication.name"], schemas, publish_via_partition_root)
        check_publication_mode(conn, config["publication.name"], config["publish.via.partition.root"] == "true")
    client.put_connector(name, config)
    client.wait_running(name)
    try:
        yield client
    finally:
        client.delete_connector(name)
        _drop_slot(config["slot.name"], source.dbname)
        with psycopg.connect(PG_DSN.replace("dbname=source", f"dbname={source.dbname}"), autocommit=True) as conn:
            conn.execute(f"drop publication if exists {config['publication.name']}")


# MariaDB connectors' server ids: unique per run, and per pytest-xdist worker (gw0, gw1, ...) running at once.
_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
_server_ids = iter(range(184_000 + _WORKER * 1_000_000 + (time.time_ns() // 1000) % 10_000 * 10, 10**9))


@contextmanager
def mariadb_connector(
    name: str,
    topic_prefix: str,
    databases: list[str],
    settings: dict[str, str] | None = None,
    *,
    framing: str = "id4",
    id_type: str = "contentId",
) -> Iterator[ConnectClient]:
    """Register a Debezium MariaDB connector for `databases` (a fresh snapshot, its own binlog client id), wait
    until it runs; delete it and its Connect offsets afterwards. `settings` add or override connector settings
    (e.g. the unwrap SMT's `transforms.*`)."""
    client = ConnectClient(CONNECT_URL)
    base = mariadb_connector_config(
        name, MARIADB_SOURCE, topic_prefix, databases, registry_url=REGISTRY_URL,
        kafka_bootstrap=KAFKA_BOOTSTRAP, server_id=next(_server_ids), framing=framing, id_type=id_type,
    )
    client.create_fresh(name, {**base, **(settings or {})})
    client.wait_running(name)
    try:
        yield client
    finally:
        client.delete_connector(name, reset_offsets=True)


def _drop_slot(slot: str, dbname: str) -> None:
    with psycopg.connect(PG_DSN.replace("dbname=source", f"dbname={dbname}"), autocommit=True) as conn:
        drop_replication_slot(conn, slot)


def read_topic(topic: str, min_records: int = 0, timeout_s: float = 60.0) -> list[KafkaRecord]:
    """Every record between the low and high watermarks of each partition, read by an independent consumer.

    Waits until at least `min_records` exist (Debezium writes asynchronously).
    """
    consumer = Consumer({
        "bootstrap.servers": KAFKA_BOOTSTRAP,
        "group.id": f"test-reader-{time.monotonic_ns()}",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
    })
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            bounds = _watermarks(consumer, topic)
            total = sum(high - low for _, low, high in bounds)
            if total >= min_records or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        records: list[KafkaRecord] = []
        for partition, low, high in bounds:
            if high <= low:
                continue
            consumer.assign([TopicPartition(topic, partition, low)])
            while True:
                msg = consumer.poll(10)
                if msg is None:
                    raise TimeoutError(f"{topic}[{partition}] stalled before offset {high}")
                if msg.error():
                    raise RuntimeError(str(msg.error()))
                offset = msg.offset()
                assert offset is not None
                records.append(KafkaRecord(topic, partition, offset, msg.key(), msg.value(), _headers(msg.headers())))
                if offset >= high - 1:
                    break
        return records
    finally:
        consumer.close()


def _headers(raw: Any) -> tuple[tuple[str, bytes], ...]:
    # confluent-kafka returns a list of (name, bytes) pairs, or None when the record has no headers.
    return tuple((str(name), bytes(value or b"")) for name, value in (raw or []))


# A topic a connector has just created: the broker may still be electing its partitions' leader.
_LEADER_PENDING = {KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
                   KafkaError.UNKNOWN_TOPIC_OR_PART}


def _watermarks(consumer: Consumer, topic: str, patience_s: float = 20.0) -> list[tuple[int, int, int]]:
    """Each partition's (partition, low, high) watermarks; asked again while the partitions' leader is pending."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            return _watermarks_once(consumer, topic)
        except KafkaException as e:
            error = e.args[0] if e.args else None
            if not isinstance(error, KafkaError) or error.code() not in _LEADER_PENDING or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _watermarks_once(consumer: Consumer, topic: str) -> list[tuple[int, int, int]]:
    meta = consumer.list_topics(topic, timeout=10).topics.get(topic)
    if meta is None or meta.error is not None:
        return []
    out = []
    for p in sorted(meta.partitions):
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
        out.append((p, low, high))
    return out


def produce_again(record: KafkaRecord) -> None:
    """Redeliver a Kafka record as it was (what a connector restart or a replay does)."""
    producer = Producer({"bootstrap.servers": KAFKA_BOOTSTRAP})
    producer.produce(record.topic, key=record.key, value=record.value, headers=list(record.headers) or None)
    assert producer.flush(30) == 0


def wait_for_records(topic: str, count: int, timeout_s: float = 60.0) -> list[KafkaRecord]:
    records = read_topic(topic, count, timeout_s)
    if len(records) < count:
        raise TimeoutError(f"{topic}: {len(records)} records after {timeout_s}s, expected >= {count}")
    return records


# Columns Silver adds to the source's: Hudi's metadata and the pipeline's own; left out of comparisons.
HUDI_META_COLUMNS = (
    "_hoodie_commit_time", "_hoodie_commit_seqno", "_hoodie_record_key", "_hoodie_partition_path",
    "_hoodie_file_name",
)
SILVER_EXTRA_COLUMNS = HUDI_META_COLUMNS + CDC_COLUMNS


def as_silver_value(value: Any) -> Any:
    """A psycopg value as Silver holds it: naive source timestamps are wall-clock times that Debezium encodes
    as UTC, so Silver holds that UTC instant."""
    if isinstance(value, datetime) and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


def job_config_for(base: JobConfig, prefix: str, database: str, lake: str) -> JobConfig:
    """The local job config pointed at one connector's topics (one source, `prefix`) and a private lake (a
    folder or s3a:// prefix), database and checkpoint."""
    return dataclasses.replace(
        base,
        kafka=dataclasses.replace(base.kafka, topic_pattern=re.escape(prefix) + r"\.[^.]+\.[^.]+"),
        # What the tests' connectors write: envelopes, 0x00 + 4-byte contentId (not the demo's two sources).
        source=SourceConfig(topic_prefix=prefix, framing="id4", id_type="contentId"),
        sources=[],
        tables={},
        lake=dataclasses.replace(
            base.lake,
            database=database,
            silver_path=f"{lake}/silver",
            bronze_path=f"{lake}/bronze",
            checkpoint_path=f"{lake}/checkpoint",
        ),
    )
