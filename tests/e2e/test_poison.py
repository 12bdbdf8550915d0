"""Bad input through the job on the real stack (Kafka, the registry, Hudi on the stack's S3 server).

Dead-letter mode (the default): every poison kind goes to the dead-letter table, once, with its bytes and why; the
other records of its table and every other table keep flowing; a later event of a key with a dead-lettered change
still applies; status.json lists that key as diverged. Fail-fast mode: the job stops, naming the record.
"""
from __future__ import annotations

import dataclasses
import io
import json
import logging
import socket
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import fastavro
import pytest
import requests
from confluent_kafka import Producer
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession

from app.batch.processor import BatchProcessor
from app.config import DeadLetterConfig, JobConfig
from app.errors import EnvelopeError, RegistryError, SchemaDecodeError
from app.hooks import Hooks
from app.job import await_query, start_query
from app.sink.deadletters import dead_letter_target
from app.sink.lakefs import delete_path
from app.sink.quarantine import Quarantine
from app.state.status import read_status, status_path
from app.wire.registry import RegistryClient
from scripts.replay_dead_letters import Selection, replay
from tests.conftest import ROOT, RUN_ID
from tests.support.cdc import KAFKA_BOOTSTRAP, REGISTRY_URL, job_config_for
from tests.support.pipeline import rewrite_with_type

pytestmark = [pytest.mark.stack, pytest.mark.slow]

UNKNOWN_ID = 2_000_000_000


def _schemas(namespace: str, value_fields: list[dict[str, Any]] | None = None) -> tuple[dict, dict]:
    fields = value_fields or [{"name": "id", "type": "int"}]
    value = {
        "type": "record", "name": "Envelope", "namespace": namespace, "fields": [
            {"name": "before", "type": ["null", {"type": "record", "name": "Value", "fields": fields}],
             "default": None},
            {"name": "after", "type": ["null", "Value"], "default": None},
            {"name": "source", "type": {"type": "record", "name": "Source", "fields": [
                {"name": "lsn", "type": ["null", "long"], "default": None}, {"name": "ts_ms", "type": "long"}]}},
            {"name": "op", "type": "string"},
        ],
    }
    key = {"type": "record", "name": "Key", "namespace": namespace, "fields": [{"name": "id", "type": "int"}]}
    return key, value


def _register(artifact_id: str, schema: dict) -> int:
    """Register a schema (a new artifact, or a new version of one); returns its contentId."""
    content = {"content": json.dumps(schema), "contentType": "application/json"}
    body = {"artifactId": artifact_id, "artifactType": "AVRO", "firstVersion": {"content": content}}
    r = requests.post(f"{REGISTRY_URL}/apis/registry/v3/groups/default/artifacts", json=body, timeout=10,
                      params={"ifExists": "FIND_OR_CREATE_VERSION"})
    r.raise_for_status()
    return int(r.json()["version"]["contentId"])


def _framed(schema_id: int, schema: dict, record: dict) -> bytes:
    out = io.BytesIO(b"\x00" + schema_id.to_bytes(4, "big"))
    out.seek(5)
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return out.getvalue()


def _produce(topic: str, records: list[tuple[bytes | None, bytes | None]],
             headers: list[tuple[str, str | bytes | None]] | None = None) -> list[int]:
    """Produce in order to partition 0; returns the offsets."""
    offsets: list[int] = []
    producer = Producer({"bootstrap.servers": KAFKA_BOOTSTRAP, "enable.idempotence": True})
    for key, value in records:
        producer.produce(topic, key=key, value=value, partition=0, headers=headers,
                         on_delivery=lambda err, msg: offsets.append(_offset(err, msg)))
    assert producer.flush(30) == 0
    return sorted(offsets)


def _offset(err: Any, msg: Any) -> int:
    assert err is None, err
    return int(msg.offset())


def _job(local_config: JobConfig, prefix: str, lake: str, **dead_letters: Any) -> JobConfig:
    config = job_config_for(local_config, prefix, prefix, lake)
    return dataclasses.replace(config, dead_letters=DeadLetterConfig(**dead_letters))


class CrashAt(Hooks):
    """Ends the batch at a point with an error, as a kill there would: nothing after it is written."""

    def __init__(self, point: str) -> None:
        self.point = point

    def at(self, point: str, **context: Any) -> None:
        if point == self.point:
            raise RuntimeError(f"simulated crash at {point} ({context})")


def _run_job(spark: SparkSession, config: JobConfig, hooks: Hooks | None = None) -> BatchProcessor:
    processor = BatchProcessor(config, RegistryClient.from_config(config.registry), hooks)
    await_query(start_query(spark, config, processor, available_now=True), processor)
    return processor


class Topic:
    """One table's topic with its registered schemas: id int key, value (id int, v string) or `fields`."""

    def __init__(self, prefix: str, table: str, fields: list[dict[str, Any]] | None = None) -> None:
        self.name = f"{prefix}.s.{table}"
        self.key_schema, self.value_schema = _schemas(
            self.name,
            fields or [{"name": "id", "type": "int"}, {"name": "v", "type": ["null", "string"], "default": None}],
        )
        self.key_id = _register(f"{self.name}-key", self.key_schema)
        self.value_id = _register(f"{self.name}-value", self.value_schema)

    def key(self, id_: int) -> bytes:
        return _framed(self.key_id, self.key_schema, {"id": id_})

    def body(self, op: str, id_: int | None, v: str | None, lsn: int, *, before: bool = False) -> bytes:
        image = None if id_ is None else {"id": id_, "v": v}
        record = {"before": image if before else None, "after": None if before else image,
                  "source": {"lsn": lsn, "ts_ms": 1}, "op": op}
        return _framed(self.value_id, self.value_schema, record)


@pytest.fixture(scope="module")
def poisoned(
    spark: SparkSession, local_config: JobConfig, lake_root: str, stack: None
) -> Iterator[dict[str, Any]]:
    """Two tables: `a` gets every poison kind among good events, `b` only good events. The first job run creates
    both tables from good events; the second reads the poison and what follows it; a third reads nothing new."""
    prefix = f"dl{RUN_ID}"
    a, b = Topic(prefix, "a"), Topic(prefix, "b")
    config = _job(local_config, prefix, f"{lake_root}/{prefix}", unknown_schema_grace_s=1.0)
    _produce(a.name, [(a.key(1), a.body("c", 1, "one", 10)), (a.key(2), a.body("c", 2, "two", 11))])
    _produce(b.name, [(b.key(1), b.body("c", 1, "b-one", 12))])
    _run_job(spark, config)

    # A second key schema for `a` whose fields are not the table's record key.
    wide_key = {**a.key_schema, "fields": [*a.key_schema["fields"], {"name": "tenant", "type": "string"}]}
    wide_key_id = _register(f"{a.name}-key", wide_key)
    good = a.body("u", 1, "one-v2", 20)
    poison = {
        "decode": (a.key(1), good[:-4]),  # a truncated payload
        "framing": (a.key(1), b"\x01" + good[1:]),  # a wrong magic byte
        "unknown_schema_id": (a.key(1), b"\x00" + UNKNOWN_ID.to_bytes(4, "big") + good[5:]),
        "trailing_bytes": (a.key(1), good + b"\x02\x04"),  # bytes that do not match their writer schema
        "json": (a.key(1), b'{"id": 1, "v": "one-json"}'),  # a JSON value on an Avro topic
        "missing_key": (None, a.body("u", 1, "one-nokey", 22)),
        "key_schema_mismatch": (_framed(wide_key_id, wide_key, {"id": 1, "tenant": "x"}),
                                a.body("u", 1, "one-widekey", 23)),
        "null_image": (a.key(2), a.body("c", None, None, 24)),  # a null after on c
        "unknown_op": (a.key(2), a.body("x", 2, "two-x", 25)),
    }
    headers: list[tuple[str, str | bytes | None]] = [("origin", b"poison-test")]
    offsets = dict(zip(poison, _produce(a.name, list(poison.values()), headers), strict=True))
    # Later changes of the same keys still apply, in source order.
    _produce(a.name, [(a.key(1), a.body("u", 1, "one-v3", 30)), (a.key(3), a.body("c", 3, "three", 31))])
    _produce(b.name, [(b.key(2), b.body("c", 2, "b-two", 32))])
    second = _run_job(spark, config)
    _run_job(spark, config)
    yield {"config": config, "a": a, "b": b, "poison": poison, "offsets": offsets, "processor": second}


def _dead_letters(spark: SparkSession, config: JobConfig) -> list[dict[str, Any]]:
    rows = spark.read.format("hudi").load(dead_letter_target(config).path).collect()
    return sorted((r.asDict() for r in rows), key=lambda r: r["kafka_offset"])


EXPECTED_KINDS = {
    "decode": "decode", "framing": "framing", "unknown_schema_id": "unknown_schema_id",
    "trailing_bytes": "trailing_bytes", "json": "framing", "missing_key": "missing_key",
    "key_schema_mismatch": "key_schema_mismatch", "null_image": "null_image", "unknown_op": "unknown_op",
}


def test_every_poison_kind_is_a_dead_letter_once_with_its_bytes(spark: SparkSession, poisoned: dict) -> None:
    config, a, poison, offsets = poisoned["config"], poisoned["a"], poisoned["poison"], poisoned["offsets"]

    rows = _dead_letters(spark, config)

    assert [(r["kafka_offset"], r["error_kind"]) for r in rows] == [
        (offsets[name], EXPECTED_KINDS[name]) for name in poison
    ]
    for name, row in zip(poison, rows, strict=True):
        key, value = poison[name]
        assert (row["topic"], row["kafka_partition"], row["key"], row["value"]) == (a.name, 0, key, value), name
        assert row["dead_letter_id"] == f"{a.name}/0/{offsets[name]}"
        assert [(h["key"], h["value"]) for h in row["headers"]] == [("origin", b"poison-test")]
        assert row["source_table"] == f"{config.lake.database}.s_a"
        assert row["error_message"], name
        assert row["batch_id"] == 1 and row["dead_lettered_at"] is not None
    by_kind = {r["error_kind"]: r for r in rows}
    assert by_kind["unknown_schema_id"]["schema_id"] == UNKNOWN_ID
    assert str(UNKNOWN_ID) in by_kind["unknown_schema_id"]["error_message"]
    assert by_kind["decode"]["schema_id"] == a.value_id
    assert by_kind["decode"]["schema_id_type"] == "contentId"
    assert "reads" in by_kind["trailing_bytes"]["error_message"]
    assert by_kind["key_schema_mismatch"]["record_key"] == '{"id":1,"tenant":"x"}'
    assert by_kind["decode"]["record_key"] == '{"id":1}'
    assert by_kind["missing_key"]["record_key"] is None


def test_the_tables_keep_flowing_and_later_changes_of_a_key_apply(spark: SparkSession, poisoned: dict) -> None:
    config = poisoned["config"]
    silver = config.lake.silver_path

    a_rows = spark.read.format("hudi").load(f"{silver}/{config.lake.database}/s_a").select("id", "v").collect()
    b_rows = spark.read.format("hudi").load(f"{silver}/{config.lake.database}/s_b").select("id", "v").collect()

    assert sorted(map(tuple, a_rows)) == [(1, "one-v3"), (2, "two"), (3, "three")]
    assert sorted(map(tuple, b_rows)) == [(1, "b-one"), (2, "b-two")]


def test_status_lists_the_dead_letters_and_diverged_keys_per_table(poisoned: dict, local_config: JobConfig) -> None:
    config, processor = poisoned["config"], poisoned["processor"]
    endpoint = local_config.spark.conf.get("spark.hadoop.fs.s3a.endpoint")

    status = read_status(status_path(config), endpoint)

    table = f"{config.lake.database}.s_a"
    entry = status["dead_letters"][table]
    assert entry["records"] == len(poisoned["poison"])
    assert entry["kinds"] == {"decode": 1, "framing": 2, "unknown_schema_id": 1, "trailing_bytes": 1,
                              "missing_key": 1, "key_schema_mismatch": 1, "null_image": 1, "unknown_op": 1}
    assert entry["diverged_keys"] == ['{"id":1,"tenant":"x"}', '{"id":1}', '{"id":2}']
    assert f"{config.lake.database}.s_b" not in status["dead_letters"]
    assert status["tables"][table]["skipped"] == 0  # every record of `a` was applied or dead-lettered
    assert processor.history[-1][table].dead_letters == len(poisoned["poison"])


def test_the_dead_letter_table_is_in_the_catalog(spark: SparkSession, poisoned: dict) -> None:
    target = dead_letter_target(poisoned["config"])

    names = {c.name for c in spark.catalog.listColumns(target.qualified_name)}

    assert {"dead_letter_id", "topic", "kafka_offset", "key", "value", "error_kind", "record_key"} <= names


# ---- a re-snapshot settles a diverged key ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def resnapshot(
    spark: SparkSession, local_config: JobConfig, lake_root: str, stack: None
) -> Iterator[dict[str, Any]]:
    """Table `e`: run 1 creates keys 1-3; in run 2 an update of key 1 and one of key 2 do not decode (dead letters);
    run 3 reads a snapshot read (`r`, as a Debezium incremental snapshot emits) of key 1 and a plain update of key 2,
    and dies right after marking the settled dead letter, before the table's commit; run 4 is the restart."""
    prefix = f"rs{RUN_ID}"
    e = Topic(prefix, "e")
    config = _job(local_config, prefix, f"{lake_root}/{prefix}")
    _produce(e.name, [(e.key(i), e.body("c", i, f"v{i}", 10 + i)) for i in (1, 2, 3)])
    _run_job(spark, config)
    lost = _produce(e.name, [(e.key(1), e.body("u", 1, "lost-1", 20)[:-4]),
                             (e.key(2), e.body("u", 2, "lost-2", 21)[:-4])])
    _run_job(spark, config)
    after_loss = read_status(status_path(config), local_config.spark.conf.get("spark.hadoop.fs.s3a.endpoint"))
    read = _produce(e.name, [(e.key(1), e.body("r", 1, "lost-1", 30)), (e.key(2), e.body("u", 2, "v2-later", 31))])
    with pytest.raises(StreamingQueryException):
        _run_job(spark, config, CrashAt("dead_letters_settled"))
    restart = _run_job(spark, config)
    yield {"config": config, "e": e, "lost": lost, "read": read, "after_loss": after_loss, "restart": restart}


def test_a_snapshot_read_of_a_diverged_key_settles_it(
    spark: SparkSession, resnapshot: dict, local_config: JobConfig
) -> None:
    config, e, lost, read = resnapshot["config"], resnapshot["e"], resnapshot["lost"], resnapshot["read"]
    table = f"{config.lake.database}.s_e"

    status = read_status(status_path(config), local_config.spark.conf.get("spark.hadoop.fs.s3a.endpoint"))
    dead = _dead_letters(spark, config)
    rows = spark.read.format("hudi").load(config.lake.table_path("s_e")).select("id", "v").collect()

    assert resnapshot["after_loss"]["dead_letters"][table]["diverged_keys"] == ['{"id":1}', '{"id":2}']
    # Key 1's snapshot read settled it; key 2's later update is no snapshot: its lost change may hide in other
    # columns (or a TOASTed one), so it stays diverged until a replay or a re-snapshot.
    assert status["dead_letters"][table]["diverged_keys"] == ['{"id":2}']
    assert [(r["kafka_offset"], r["error_kind"], r["replay_status"]) for r in dead] == [
        (lost[0], "decode", "resnapshotted"), (lost[1], "decode", None)]
    assert dead[0]["replay_detail"].startswith(f"the snapshot read at {e.name}[0]@{read[0]} ")
    assert sorted(map(tuple, rows)) == [(1, "lost-1"), (2, "v2-later"), (3, "v3")]
    # The crashed run had marked key 1 already: the restart found it settled and wrote the table.
    restart = resnapshot["restart"].history[-1][table]
    assert (restart.upserts, restart.settled, restart.pending_keys) == (2, 0, ['{"id":2}'])


# ---- fail-fast mode: the job stops, naming the record --------------------------------------------------------


@pytest.fixture
def poison_topic(stack: None, request: pytest.FixtureRequest) -> tuple[str, str, int, bytes, dict]:
    """A topic with one valid Debezium event at offset 0; returns (prefix, topic, value id, key bytes, schema)."""
    prefix = f"poison{zlib.crc32(request.node.name.encode()):08x}{RUN_ID}"
    topic = f"{prefix}.s.t"
    key_schema, value_schema = _schemas(f"{prefix}.s.t")
    key_id = _register(f"{topic}-key", key_schema)
    value_id = _register(f"{topic}-value", value_schema)
    key = _framed(key_id, key_schema, {"id": 1})
    valid = _framed(value_id, value_schema, {"before": None, "after": {"id": 1}, "source": {"lsn": 10, "ts_ms": 1},
                                             "op": "c"})
    _produce(topic, [(key, valid)])
    return prefix, topic, value_id, key, value_schema


def _run_fail_fast(spark: SparkSession, local_config: JobConfig, prefix: str, lake: str) -> None:
    _run_job(spark, _job(local_config, prefix, lake, mode="fail_fast", unknown_schema_grace_s=0.0))


def test_fail_fast_undecodable_body_names_topic_partition_offset_and_id(
    spark: SparkSession, local_config: JobConfig, lake_root: str, poison_topic: tuple[str, str, int, bytes, dict]
) -> None:
    prefix, topic, value_id, key, _ = poison_topic
    _produce(topic, [(key, b"\x00" + value_id.to_bytes(4, "big") + b"\xff\xff\xff\xff\xff")])
    with pytest.raises(SchemaDecodeError) as info:
        _run_fail_fast(spark, local_config, prefix, f"{lake_root}/{prefix}")
    err = info.value
    assert (err.topic, err.partition, err.offset, err.schema_id) == (topic, 0, 1, value_id)
    assert f"{topic}[0]@1" in str(err) and f"schema id {value_id}" in str(err)


def test_fail_fast_unknown_schema_id_names_id_and_url(
    spark: SparkSession, local_config: JobConfig, lake_root: str, poison_topic: tuple[str, str, int, bytes, dict]
) -> None:
    prefix, topic, _, key, value_schema = poison_topic
    _produce(topic, [(key, _framed(UNKNOWN_ID, value_schema, {"before": None, "after": {"id": 2},
                                                              "source": {"lsn": 11, "ts_ms": 1}, "op": "c"}))])
    with pytest.raises(RegistryError) as info:
        _run_fail_fast(spark, local_config, prefix, f"{lake_root}/{prefix}")
    assert info.value.schema_id == UNKNOWN_ID
    assert f"/ids/contentIds/{UNKNOWN_ID}" in str(info.value) and str(UNKNOWN_ID) in str(info.value)


def test_fail_fast_value_without_framing_names_the_record(
    spark: SparkSession, local_config: JobConfig, lake_root: str, poison_topic: tuple[str, str, int, bytes, dict]
) -> None:
    prefix, topic, _, key, _ = poison_topic
    _produce(topic, [(key, b'{"not": "avro"}')])
    with pytest.raises(SchemaDecodeError) as info:
        _run_fail_fast(spark, local_config, prefix, f"{lake_root}/{prefix}")
    assert (info.value.topic, info.value.partition, info.value.offset) == (topic, 0, 1)
    assert "framing" in str(info.value)


def test_fail_fast_unknown_op_names_the_record(
    spark: SparkSession, local_config: JobConfig, lake_root: str, poison_topic: tuple[str, str, int, bytes, dict]
) -> None:
    prefix, topic, value_id, key, value_schema = poison_topic
    _produce(topic, [(key, _framed(value_id, value_schema, {"before": None, "after": {"id": 1},
                                                            "source": {"lsn": 12, "ts_ms": 1}, "op": "x"}))])
    with pytest.raises(EnvelopeError) as info:
        _run_fail_fast(spark, local_config, prefix, f"{lake_root}/{prefix}")
    assert f"{topic}[0]@1" in str(info.value) and "unknown_op" in str(info.value)


# ---- per-table quarantine: Hudi refuses one table's write; the other tables go on ---------------------------------


def _decimal(precision: int) -> dict[str, Any]:
    return {"type": "bytes", "logicalType": "decimal", "precision": precision, "scale": 2,
            "connect.name": "org.apache.kafka.connect.data.Decimal",
            "connect.parameters": {"scale": "2", "connect.decimal.precision": str(precision)}}


class DecimalTopic(Topic):
    """A table with `amount numeric(6,2)`, narrowed to numeric(5,2) by `narrow` (a new value schema version): a
    type change the lake cannot follow (app/sink/widening.py)."""

    def __init__(self, prefix: str, table: str) -> None:
        super().__init__(prefix, table, self._fields(6))

    @staticmethod
    def _fields(precision: int) -> list[dict[str, Any]]:
        return [{"name": "id", "type": "int"}, {"name": "amount", "type": ["null", _decimal(precision)],
                                                 "default": None}]

    def narrow(self) -> None:
        self.value_schema = _schemas(self.name, self._fields(5))[1]
        self.value_id = _register(f"{self.name}-value", self.value_schema)

    def change(self, op: str, id_: int, amount: str, lsn: int) -> bytes:
        record = {"before": None, "after": {"id": id_, "amount": Decimal(amount)}, "source": {"lsn": lsn, "ts_ms": 1},
                  "op": op}
        return _framed(self.value_id, self.value_schema, record)


@pytest.fixture(scope="module")
def quarantined(
    spark: SparkSession, local_config: JobConfig, lake_root: str, stack: None
) -> Iterator[dict[str, Any]]:
    """`c` (numeric(6,2)) and `d`. Run 1 creates both; before run 2 `c` is narrowed to numeric(5,2), which the lake
    cannot follow: `c` is quarantined, `d` goes on; run 3 (a restart) finds `c` still quarantined."""
    prefix = f"qt{RUN_ID}"
    c, d = DecimalTopic(prefix, "c"), Topic(prefix, "d")
    # `f` carries rows that are neither Debezium envelopes nor unwrap-SMT events (no __deleted): its events cannot
    # be planned at all, and its table is quarantined from the first batch.
    f_topic = f"{prefix}.s.f"
    f_key, f_value = _schemas(f_topic)[0], {"type": "record", "name": "Row", "fields": [{"name": "id", "type": "int"}]}
    f_ids = (_register(f"{f_topic}-key", f_key), _register(f"{f_topic}-value", f_value))
    config = _job(local_config, prefix, f"{lake_root}/{prefix}")
    _produce(c.name, [(c.key(1), c.change("c", 1, "123.50", 10))])
    _produce(d.name, [(d.key(1), d.body("c", 1, "d-one", 11))])
    f_offsets = _produce(f_topic, [(_framed(f_ids[0], f_key, {"id": 1}), _framed(f_ids[1], f_value, {"id": 1}))])
    _run_job(spark, config)
    c.narrow()
    widened = _produce(c.name, [(c.key(2), c.change("c", 2, "234.56", 20))])
    _produce(d.name, [(d.key(2), d.body("c", 2, "d-two", 21))])
    # The process dies right after the quarantine file is written (the crash window before its dead letters):
    # the restart finds the table quarantined and the batch's records go to the dead letters then.
    with pytest.raises(StreamingQueryException):
        _run_job(spark, config, CrashAt("quarantined"))
    second = _run_job(spark, config)
    later = _produce(c.name, [(c.key(2), c.change("u", 2, "99.99", 35)), (c.key(3), c.change("c", 3, "7.25", 30))])
    _produce(d.name, [(d.key(3), d.body("c", 3, "d-three", 31))])
    third = _run_job(spark, config)
    yield {"config": config, "c": c, "d": d, "offsets": widened + later, "second": second, "third": third,
           "f": (f_topic, f_offsets)}


def test_a_refused_schema_change_quarantines_its_table_only(spark: SparkSession, quarantined: dict) -> None:
    config, c = quarantined["config"], quarantined["c"]
    database, silver = config.lake.database, config.lake.silver_path
    table = f"{database}.s_c"

    c_rows = spark.read.format("hudi").load(f"{silver}/{database}/s_c").select("id").collect()
    d_rows = spark.read.format("hudi").load(f"{silver}/{database}/s_d").select("id", "v").collect()
    dead = [r for r in _dead_letters(spark, config) if r["topic"] == c.name]

    assert [r["id"] for r in c_rows] == [1]  # as before the narrowing
    assert sorted(map(tuple, d_rows)) == [(1, "d-one"), (2, "d-two"), (3, "d-three")]
    assert [(r["kafka_offset"], r["error_kind"]) for r in dead] == [
        (offset, "quarantined") for offset in quarantined["offsets"]
    ]
    assert all("ColumnTypeChangeError" in r["error_message"] and "from decimal(6,2) (the table's) to decimal(5,2)"
               in r["error_message"] for r in dead), dead[0]["error_message"]
    second, third = quarantined["second"].history[-1][table], quarantined["third"].history[-1][table]
    assert second.quarantined and third.quarantined
    assert (second.upserts, second.dead_letters, third.dead_letters) == (0, 1, 2)


def test_the_quarantine_survives_restarts_and_is_in_status(quarantined: dict, local_config: JobConfig) -> None:
    config = quarantined["config"]
    table = f"{config.lake.database}.s_c"

    status = read_status(status_path(config), local_config.spark.conf.get("spark.hadoop.fs.s3a.endpoint"))

    assert set(status["quarantined"]) == {table, f"{config.lake.database}.s_f"}
    assert status["quarantined"][table]["batch_id"] == 1  # where it began (the crashed run); read back from the lake
    assert "step widen: ColumnTypeChangeError" in status["quarantined"][table]["reason"]
    assert status["tables"][table]["quarantined"]
    assert status["failure"] is None


def test_a_topic_whose_events_cannot_be_planned_quarantines_its_table(
    spark: SparkSession, quarantined: dict, local_config: JobConfig
) -> None:
    config = quarantined["config"]
    f_topic, f_offsets = quarantined["f"]
    table = f"{config.lake.database}.s_f"

    status = read_status(status_path(config), local_config.spark.conf.get("spark.hadoop.fs.s3a.endpoint"))
    dead = [r for r in _dead_letters(spark, config) if r["topic"] == f_topic]

    assert status["quarantined"][table]["batch_id"] == 0
    assert "step plan: EnvelopeError" in status["quarantined"][table]["reason"]
    assert "__deleted" in status["quarantined"][table]["reason"]
    assert [(r["kafka_offset"], r["error_kind"]) for r in dead] == [(f_offsets[0], "quarantined")]


# ---- a transient failure is waited out, never quarantined ----------------------------------------------------------


class S3Server:
    """A private S3 server (gofakes3 keeping its objects in a file, so a restart loses none), stopped and started by
    the test to make a real outage under one table's write."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.port = folder, _free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.bucket = f"transient-{RUN_ID}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [str(ROOT / ".deps" / "bin" / "gofakes3"), "-backend", "bolt", "-bolt.db", str(self.folder / "s3.db"),
             "-host", f"127.0.0.1:{self.port}", "-initialbucket", self.bucket, "-quiet"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if requests.get(f"{self.url}/{self.bucket}", timeout=1).ok:
                    return
            except requests.RequestException:
                time.sleep(0.2)
        raise AssertionError(f"gofakes3 did not start on {self.url}")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(30)
            self.process = None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class OutageHooks(Hooks):
    """At the first Silver write of the table, stop the table's S3 server for `outage_s`, then start it again."""

    def __init__(self, server: S3Server, table_path: str, outage_s: float) -> None:
        self.server, self.table_path, self.outage_s = server, table_path, outage_s
        self.done = False
        self.restarted = threading.Event()

    def write_options(self, table_path: str) -> dict[str, str]:
        if not self.done and table_path == self.table_path:
            self.done = True
            self.server.stop()
            threading.Timer(self.outage_s, self._restart).start()
        return {}

    def _restart(self) -> None:
        self.server.start()
        self.restarted.set()


@pytest.mark.usefixtures("stack")
def test_an_object_store_outage_mid_write_is_waited_out_not_quarantined(
    spark: SparkSession, local_config: JobConfig, lake_root: str, test_dir: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    folder = test_dir / f"transient-{RUN_ID}"
    folder.mkdir(parents=True, exist_ok=True)
    server = S3Server(folder)
    server.start()
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    # The private bucket's own endpoint; s3a gives up at once, so the outage reaches the job's own retries.
    for key, value in {"endpoint": server.url, "retry.limit": "0", "attempts.maximum": "0",
                       "connection.establish.timeout": "1000", "retry.throttle.limit": "0"}.items():
        hadoop.set(f"fs.s3a.bucket.{server.bucket}.{key}", value)
    try:
        prefix = f"tr{RUN_ID}"
        e = Topic(prefix, "e")
        config = _job(local_config, prefix, f"{lake_root}/{prefix}")
        silver = f"s3a://{server.bucket}/silver"
        config = dataclasses.replace(config, lake=dataclasses.replace(config.lake, silver_path=silver))
        _produce(e.name, [(e.key(1), e.body("c", 1, "one", 10)), (e.key(2), e.body("c", 2, "two", 11))])
        hooks = OutageHooks(server, config.lake.table_path("s_e"), outage_s=8.0)
        processor = BatchProcessor(config, RegistryClient.from_config(config.registry), hooks)
        with caplog.at_level(logging.WARNING, logger="app.batch.writer"):
            await_query(start_query(spark, config, processor, available_now=True), processor)
        assert hooks.restarted.wait(30)

        rows = spark.read.format("hudi").load(config.lake.table_path("s_e")).select("id", "v").collect()
        stats = processor.history[-1][f"{config.lake.database}.s_e"]
        assert sorted(map(tuple, rows)) == [(1, "one"), (2, "two")]
        assert not stats.quarantined and not processor.quarantine.tables
        retries = [r.getMessage() for r in caplog.records if "transient error" in r.getMessage()]
        assert retries, "the outage never reached the job's retries"
    finally:
        server.stop()


# ---- replay: the quarantined table repaired ------------------------------------------------------------------------


def test_replay_repairs_the_quarantined_table_in_source_order(spark: SparkSession, quarantined: dict) -> None:
    config, c = quarantined["config"], quarantined["c"]
    database, table = config.lake.database, f"{config.lake.database}.s_c"
    widened, updated, inserted = quarantined["offsets"]
    rewrite_with_type(spark, config, "s_c", "amount", "decimal(5,2)")
    quarantine = Quarantine(config)
    delete_path(spark, quarantine.path(database, "s_c"))

    outcomes = replay(spark, config, Selection(tables=(table,)))

    assert [(o.dead_letter_id, o.status) for o in outcomes] == [
        (f"{c.name}/0/{widened}", "superseded"), (f"{c.name}/0/{updated}", "applied"),
        (f"{c.name}/0/{inserted}", "applied"),
    ]
    assert "later replayed record" in outcomes[0].detail
    rows = spark.read.format("hudi").load(config.lake.table_path("s_c")).select("id", "amount").collect()
    assert sorted((r["id"], str(r["amount"])) for r in rows) == [(1, "123.50"), (2, "99.99"), (3, "7.25")]
    marks = {r["dead_letter_id"]: r["replay_status"] for r in _dead_letters(spark, config) if r["topic"] == c.name}
    assert marks == {f"{c.name}/0/{widened}": "superseded", f"{c.name}/0/{updated}": "applied",
                     f"{c.name}/0/{inserted}": "applied"}

    # An old dead letter replayed again never overwrites the newer row.
    again = replay(spark, config, Selection(topic=c.name, from_offset=widened, to_offset=widened, again=True))

    assert [(o.status, "newer change" in o.detail) for o in again] == [("superseded", True)]
    rows = spark.read.format("hudi").load(config.lake.table_path("s_c")).select("id", "amount").collect()
    assert sorted((r["id"], str(r["amount"])) for r in rows) == [(1, "123.50"), (2, "99.99"), (3, "7.25")]

    # The job takes the table's changes again.
    later = _produce(c.name, [(c.key(4), c.change("c", 4, "456.78", 40))])
    _run_job(spark, config)
    rows = spark.read.format("hudi").load(config.lake.table_path("s_c")).select("id", "amount").collect()
    assert (4, "456.78") in {(r["id"], str(r["amount"])) for r in rows}, later


def test_replay_reports_records_that_still_fail(spark: SparkSession, poisoned: dict) -> None:
    config, a = poisoned["config"], poisoned["a"]
    offsets = poisoned["offsets"]

    outcomes = replay(spark, config, Selection(kinds=("trailing_bytes", "unknown_op")))

    assert [(o.dead_letter_id, o.status) for o in outcomes] == [
        (f"{a.name}/0/{offsets['trailing_bytes']}", "failed"), (f"{a.name}/0/{offsets['unknown_op']}", "failed"),
    ]
    assert "trailing_bytes" in outcomes[0].detail and "unknown_op" in outcomes[1].detail
    rows = spark.read.format("hudi").load(f"{config.lake.silver_path}/{config.lake.database}/s_a").select("id", "v")
    assert sorted(map(tuple, rows.collect())) == [(1, "one-v3"), (2, "two"), (3, "three")]


def test_replay_help_has_no_side_effects() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "replay_dead_letters.py"), "--help"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0 and "--table" in done.stdout and "superseded" in done.stdout
