"""Golden vectors: bytes the real Debezium PostgreSQL connector and Apicurio 2.6 converter wrote, per framing.

tests/golden/<framing>-<id type>.json were captured by scripts/capture_golden.py (it lists the connector's
converter settings in each file). Each holds the six records of one script run: two snapshot reads, an insert,
an update, a delete and its tombstone, with the schemas the registry held for their ids. Decoded here by the
job's own framing step and spark-avro, keys included, they must give the rows the script's SQL wrote.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from chispa import assert_df_equality
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.avro.functions import from_avro
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from app.cdc.debezium_types import reader_schema
from app.wire.decode import decode_value
from app.wire.framing import Framing, with_framing

GOLDEN = Path(__file__).resolve().parent.parent / "golden"
MODES = [f"{framing}-{id_type}" for framing in ("headers", "id8", "id4") for id_type in ("contentId", "globalId")]
RAW_SCHEMA = StructType([
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("key", BinaryType()),
    StructField("value", BinaryType()),
    StructField("headers", ArrayType(StructType([
        StructField("key", StringType()), StructField("value", BinaryType()),
    ]))),
])
ROW_SCHEMA = StructType([
    StructField("offset", LongType()),
    StructField("op", StringType()),
    StructField("key_region", StringType()),
    StructField("key_id", IntegerType()),
    StructField("region", StringType()),
    StructField("id", IntegerType()),
    StructField("note", StringType()),
    StructField("qty", IntegerType()),
    StructField("before_region", StringType()),
    StructField("before_id", IntegerType()),
])
# What scripts/capture_golden.py's SQL produces, record by record (REPLICA IDENTITY DEFAULT: an update has no
# before image, a delete's holds the key).
EXPECTED_ROWS = [
    (0, "r", "eu", 1, "eu", 1, "first", 1, None, None),
    (1, "r", "us", 2, "us", 2, "second", 2, None, None),
    (2, "c", "eu", 3, "eu", 3, "third", 3, None, None),
    (3, "u", "eu", 1, "eu", 1, None, 10, None, None),
    (4, "d", "us", 2, None, None, None, None, "us", 2),
    (5, None, "us", 2, None, None, None, None, None, None),  # the delete's tombstone: a key, no value
]


def _load(mode: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((GOLDEN / f"{mode}.json").read_text(encoding="utf-8"))
    return doc


def _raw_df(spark: SparkSession, doc: dict[str, Any]) -> DataFrame:
    def _bytes(hex_text: str | None) -> bytes | None:
        return None if hex_text is None else bytes.fromhex(hex_text)

    rows = [
        (doc["topic"], r["partition"], r["offset"], _bytes(r["key"]), _bytes(r["value"]),
         [(name, bytes.fromhex(value)) for name, value in r["headers"]])
        for r in doc["records"]
    ]
    return spark.createDataFrame(rows, RAW_SCHEMA)


def _single(refs: set[tuple[str, int]], doc: dict[str, Any], side: str) -> str:
    assert len(refs) == 1, f"{side}: expected one writer schema, got {refs}"
    id_type, schema_id = refs.pop()
    return str(doc["schemas"][f"{id_type}:{schema_id}"])


def _decoded_rows(spark: SparkSession, doc: dict[str, Any], framing: Framing) -> DataFrame:
    framed_df = with_framing(_raw_df(spark, doc), framing)
    errors = [r.asDict() for r in framed_df.filter(
        F.col("key_frame_error").isNotNull() | F.col("value_frame_error").isNotNull()
    ).select("offset", "key_frame_error", "value_frame_error").collect()]
    assert errors == []
    refs = framed_df.select("key_id_type", "key_schema_id", "value_id_type", "value_schema_id").collect()
    key_schema = _single({(r[0], r[1]) for r in refs}, doc, "key")
    value_schema = _single({(r[2], r[3]) for r in refs if r[3] is not None}, doc, "value")
    decoded_df = decode_value(framed_df, reader_schema(value_schema)).withColumn(
        "key_struct", from_avro(F.col("key_payload"), key_schema)
    )
    after, before, key = F.col("envelope.after"), F.col("envelope.before"), F.col("key_struct")
    return decoded_df.select(
        "offset",
        F.col("envelope.op").alias("op"),
        key["region"].alias("key_region"), key["id"].alias("key_id"),
        after["region"].alias("region"), after["id"].alias("id"), after["note"].alias("note"),
        after["qty"].alias("qty"),
        before["region"].alias("before_region"), before["id"].alias("before_id"),
    ).orderBy("offset")


@pytest.mark.parametrize("mode", MODES)
def test_golden_vectors_decode_to_the_source_rows(spark: SparkSession, mode: str) -> None:
    doc = _load(mode)
    framing_mode, id_type = mode.split("-")

    actual_df = _decoded_rows(spark, doc, Framing(framing_mode, id_type))  # type: ignore[arg-type]

    assert_df_equality(actual_df, spark.createDataFrame(EXPECTED_ROWS, ROW_SCHEMA))


@pytest.mark.parametrize("mode", MODES)
def test_auto_framing_decodes_every_golden_vector(spark: SparkSession, mode: str) -> None:
    doc = _load(mode)
    id_type = mode.split("-")[1]
    # Header framing names its id type, so auto must read it even when the configured id type is the other one.
    configured = ("globalId" if id_type == "contentId" else "contentId") if mode.startswith("headers") else id_type

    actual_df = _decoded_rows(spark, doc, Framing("auto", configured))  # type: ignore[arg-type]

    assert_df_equality(actual_df, spark.createDataFrame(EXPECTED_ROWS, ROW_SCHEMA))


@pytest.mark.parametrize(
    ("mode", "configured", "error"),
    [
        ("headers-globalId", "id4", "carries an apicurio.value.* id header"),
        ("headers-contentId", "id8", "carries an apicurio.value.* id header"),
        ("id8-globalId", "id4", "schema id 0: an 8-byte id read as 4 bytes?"),
        ("id4-contentId", "headers", "no 8-byte apicurio.value.globalId or .contentId header"),
    ],
)
def test_a_wrong_framing_refuses_every_real_record(spark: SparkSession, mode: str, configured: str, error: str) -> None:
    framed_df = with_framing(_raw_df(spark, _load(mode)), Framing(configured))  # type: ignore[arg-type]

    errors = [r[0] for r in framed_df.filter(F.col("value").isNotNull()).select("value_frame_error").collect()]

    assert len(errors) == len(EXPECTED_ROWS) - 1
    assert all(e is not None and error in e for e in errors), errors


def test_each_file_records_its_converter_settings() -> None:
    settings = {mode: _load(mode)["converter"] for mode in MODES}

    assert settings["headers-globalId"]["value.converter.apicurio.registry.headers.enabled"] == "true"
    assert settings["id8-contentId"]["value.converter.apicurio.registry.id-handler"] == (
        "io.apicurio.registry.serde.DefaultIdHandler"
    )
    assert settings["id4-globalId"]["value.converter.apicurio.registry.as-confluent"] == "true"
    assert {s["value.converter.apicurio.registry.use-id"] for s in settings.values()} == {"contentId", "globalId"}
