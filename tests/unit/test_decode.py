"""app/wire/decode.py: from_avro in the JVM against a writer schema; bodies written with fastavro, no registry."""
from __future__ import annotations

import io
import json
from typing import Any

import fastavro
from chispa import assert_df_equality
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from app.cdc.columns import ERROR_COL
from app.cdc.position import POSTGRESQL
from app.cdc.unwrap import filter_data_changes, unwrap_envelope
from app.wire.decode import DECODE, TRAILING_BYTES, decode_value

TOPIC = "tickit.crm.users"
SCHEMA_ID = 7
ENVELOPE_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "Envelope",
    "namespace": TOPIC,
    "fields": [
        {
            "name": "before",
            "type": ["null", {
                "type": "record",
                "name": "Value",
                "fields": [
                    {"name": "id", "type": "int"},
                    {"name": "name", "type": ["null", "string"], "default": None},
                ],
            }],
            "default": None,
        },
        {"name": "after", "type": ["null", f"{TOPIC}.Value"], "default": None},
        {
            "name": "source",
            "type": {
                "type": "record",
                "name": "Source",
                "fields": [
                    {"name": "lsn", "type": ["null", "long"], "default": None},
                    {"name": "ts_ms", "type": "long"},
                ],
            },
        },
        {"name": "op", "type": "string"},
        {"name": "ts_ms", "type": ["null", "long"], "default": None},
    ],
}
ENVELOPE_JSON = json.dumps(ENVELOPE_SCHEMA)

INPUT_SCHEMA = StructType([
    StructField("topic", StringType(), True),
    StructField("partition", IntegerType(), True),
    StructField("offset", LongType(), True),
    StructField("value_schema_id", LongType(), True),
    StructField("value_payload", BinaryType(), True),
])
# PERMISSIVE from_avro makes every field nullable: a failed decode is a row of nulls.
VALUE_TYPE = StructType([StructField("id", IntegerType(), True), StructField("name", StringType(), True)])
ENVELOPE_TYPE = StructType([
    StructField("before", VALUE_TYPE, True),
    StructField("after", VALUE_TYPE, True),
    StructField("source", StructType([
        StructField("lsn", LongType(), True),
        StructField("ts_ms", LongType(), True),
    ]), True),
    StructField("op", StringType(), True),
    StructField("ts_ms", LongType(), True),
])
DECODED_SCHEMA = StructType([StructField("offset", LongType(), True), StructField("envelope", ENVELOPE_TYPE, True)])

CREATE = {
    "before": None, "after": {"id": 1, "name": "alice"}, "source": {"lsn": 100, "ts_ms": 1704103872000},
    "op": "c", "ts_ms": 1704103872500,
}
DELETE = {
    "before": {"id": 1, "name": None}, "after": None, "source": {"lsn": 200, "ts_ms": 1704103873000},
    "op": "d", "ts_ms": None,
}


def _avro(schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), record)
    return buf.getvalue()


def _payloads_df(spark: SparkSession, payloads: list[bytes | None], partition: int = 0) -> DataFrame:
    rows = [(TOPIC, partition, 40 + i, SCHEMA_ID, p) for i, p in enumerate(payloads)]
    return spark.createDataFrame(rows, INPUT_SCHEMA)


def test_decode_value_reads_the_envelope(spark: SparkSession) -> None:
    payloads_df = _payloads_df(spark, [_avro(ENVELOPE_SCHEMA, CREATE), _avro(ENVELOPE_SCHEMA, DELETE)])

    actual_df = decode_value(payloads_df, ENVELOPE_JSON).select("offset", "envelope")

    expected_df = spark.createDataFrame(
        [
            (40, (None, (1, "alice"), (100, 1704103872000), "c", 1704103872500)),
            (41, ((1, None), None, (200, 1704103873000), "d", None)),
        ],
        DECODED_SCHEMA,
    )
    assert_df_equality(actual_df, expected_df)


def test_null_payload_decodes_to_null_without_failing(spark: SparkSession) -> None:
    payloads_df = _payloads_df(spark, [None, _avro(ENVELOPE_SCHEMA, CREATE)])

    actual_df = decode_value(payloads_df, ENVELOPE_JSON).select("offset", "envelope")

    expected_df = spark.createDataFrame(
        [(40, None), (41, (None, (1, "alice"), (100, 1704103872000), "c", 1704103872500))], DECODED_SCHEMA
    )
    assert_df_equality(actual_df, expected_df)


def _errors(decoded_df: DataFrame) -> list[tuple[int, bool, str | None, str | None]]:
    """(offset, envelope is null, error kind, error message) per row."""
    return [
        (r["offset"], r["envelope"] is None, r[ERROR_COL] and r[ERROR_COL]["kind"],
         r[ERROR_COL] and r[ERROR_COL]["message"])
        for r in decoded_df.orderBy("offset").collect()
    ]


def test_undecodable_payload_is_marked_with_its_writer_schema(spark: SparkSession) -> None:
    payloads_df = _payloads_df(spark, [_avro(ENVELOPE_SCHEMA, CREATE), b"\xff\xff\xff"], partition=3)

    errors = _errors(decode_value(payloads_df, ENVELOPE_JSON, "contentId:7"))

    assert errors == [
        (40, False, None, None),
        (41, True, DECODE, "the Avro body does not decode with writer schema contentId:7"),
    ]


def test_undecodable_payload_is_marked_for_a_record_of_nullable_fields(spark: SparkSession) -> None:
    # No required field to tell a failed decode apart: the all-null row marks it.
    schema = {"type": "record", "name": "Loose", "fields": [{"name": "n", "type": ["null", "long"], "default": None}]}
    payloads_df = _payloads_df(spark, [_avro(schema, {"n": 5}), b"\xff\xff\xff"])

    errors = _errors(decode_value(payloads_df, json.dumps(schema)))

    assert [(offset, kind) for offset, _, kind, _ in errors] == [(40, None), (41, DECODE)]


def test_bytes_left_over_after_the_decode_are_marked(spark: SparkSession) -> None:
    """Spark's Avro reader stops where the schema ends: a body with bytes after that decodes "fine"."""
    body = _avro(ENVELOPE_SCHEMA, CREATE)
    payloads_df = _payloads_df(spark, [body, body + b"\x02\x04", _avro(ENVELOPE_SCHEMA, DELETE)])

    errors = _errors(decode_value(payloads_df, ENVELOPE_JSON, "contentId:7"))

    assert errors == [
        (40, False, None, None),
        (41, False, TRAILING_BYTES,
         f"writer schema contentId:7 reads {len(body)} of the body's {len(body) + 2} bytes: the body is not of that "
         "schema"),
        (42, False, None, None),
    ]


def test_a_body_of_a_newer_schema_read_with_an_older_one_is_marked(spark: SparkSession) -> None:
    """A record framed with the wrong id: a body of a newer envelope (Debezium 2.6 added ts_us after ts_ms) reads
    as the older one without error, and leaves the new field's bytes over."""
    newer = {**ENVELOPE_SCHEMA, "fields": [*ENVELOPE_SCHEMA["fields"],
                                           {"name": "ts_us", "type": ["null", "long"], "default": None}]}
    body = _avro(newer, {**CREATE, "ts_us": 1704103872500123})
    decoded_df = decode_value(_payloads_df(spark, [body]), ENVELOPE_JSON)

    [(offset, _, kind, _)] = _errors(decoded_df)

    assert (offset, kind) == (40, TRAILING_BYTES)


def _executed_plan(df: DataFrame) -> str:
    return str(df._jdf.queryExecution().executedPlan().toString())


PYTHON_NODES = ("BatchEvalPython", "ArrowEvalPython", "MapInPandas")


def test_decode_and_unwrap_run_without_python_workers(spark: SparkSession) -> None:
    payloads_df = _payloads_df(spark, [_avro(ENVELOPE_SCHEMA, CREATE)])

    unwrapped_df = (
        decode_value(payloads_df, ENVELOPE_JSON)
        .transform(filter_data_changes)
        .transform(unwrap_envelope, ["id", "name"], POSTGRESQL)
    )
    plan = _executed_plan(unwrapped_df)
    # The probe sees a Python UDF when there is one.
    udf_plan = _executed_plan(payloads_df.select(F.udf(len, "int")("value_payload")))

    assert "from_avro" in plan
    assert [node for node in PYTHON_NODES if node in plan] == []
    assert "BatchEvalPython" in udf_plan
    assert [tuple(r) for r in unwrapped_df.collect()] == [
        (1, "alice", "c", "00000000/00000064:00000000/00000064", 1704103872000, 0, 40, False, [], False, None)
    ]


def test_the_decode_check_reads_one_from_avro(spark: SparkSession) -> None:
    """The check reads the decoded body; it does not copy `from_avro` into each of its conditions."""
    payloads_df = _payloads_df(spark, [_avro(ENVELOPE_SCHEMA, CREATE)])

    plan = _executed_plan(decode_value(payloads_df, ENVELOPE_JSON).select("envelope.after.name", ERROR_COL))

    assert plan.count("from_avro(") == 1, plan
    # The length check re-encodes the decoded value (its message repeats it, evaluated for bodies in error only).
    assert "to_avro(_cdc_decoded" in plan, plan


def test_filters_after_the_decode_read_the_decoded_body(spark: SparkSession) -> None:
    """The op filter and a filter on an unwrapped column stay above the decode: no copy of `from_avro` in them."""
    truncate = {**CREATE, "after": None, "op": "t"}
    payloads_df = _payloads_df(spark, [_avro(ENVELOPE_SCHEMA, CREATE), _avro(ENVELOPE_SCHEMA, truncate)])

    unwrapped_df = (
        decode_value(payloads_df, ENVELOPE_JSON)
        .transform(filter_data_changes)
        .transform(unwrap_envelope, ["id", "name"], POSTGRESQL)
        .filter(F.col("name") != "nobody")
    )
    plan = _executed_plan(unwrapped_df)

    assert plan.count("from_avro(") == 1, plan
    assert [(r["id"], r["name"]) for r in unwrapped_df.collect()] == [(1, "alice")]
