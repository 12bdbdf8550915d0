"""app/framing.py: Confluent framing (0x00 + 4-byte big-endian id + body) split in the JVM, on literal bytes."""
from __future__ import annotations

import struct

from chispa import assert_df_equality
from pyspark.sql import SparkSession
from pyspark.sql.types import BinaryType, BooleanType, LongType, StructField, StructType

from app.framing import with_framing

RAW_SCHEMA = StructType([
    StructField("key", BinaryType(), True),
    StructField("value", BinaryType(), True),
    StructField("offset", LongType(), True),
])
FRAMED_SCHEMA = StructType([
    *RAW_SCHEMA.fields,
    StructField("value_framed", BooleanType(), True),
    StructField("value_schema_id", LongType(), True),
    StructField("value_payload", BinaryType(), True),
    StructField("key_schema_id", LongType(), True),
])
BODY = b"\x02\x0aalice"
KEY = b"\x00" + struct.pack(">I", 3) + b"\x02"


def _framed(schema_id: int, body: bytes = BODY) -> bytes:
    return b"\x00" + struct.pack(">I", schema_id) + body


def test_framed_value_splits_into_schema_id_and_payload(spark: SparkSession) -> None:
    raw_df = spark.createDataFrame([(KEY, _framed(42), 0), (KEY, _framed(7, b"\x00"), 1)], RAW_SCHEMA)

    actual_df = with_framing(raw_df)

    expected_df = spark.createDataFrame(
        [
            (KEY, _framed(42), 0, True, 42, BODY, 3),
            (KEY, _framed(7, b"\x00"), 1, True, 7, b"\x00", 3),
        ],
        FRAMED_SCHEMA,
    )
    assert_df_equality(actual_df, expected_df)


def test_schema_id_above_2_31_reads_unsigned(spark: SparkSession) -> None:
    high = bytes.fromhex("00fffffffe") + BODY
    sign_bit = bytes.fromhex("0080000000") + BODY
    raw_df = spark.createDataFrame([(KEY, high, 0), (KEY, sign_bit, 1)], RAW_SCHEMA)

    actual_df = with_framing(raw_df)

    expected_df = spark.createDataFrame(
        [(KEY, high, 0, True, 4294967294, BODY, 3), (KEY, sign_bit, 1, True, 2147483648, BODY, 3)],
        FRAMED_SCHEMA,
    )
    assert_df_equality(actual_df, expected_df)


def test_tombstone_is_framed_and_has_no_value_id(spark: SparkSession) -> None:
    raw_df = spark.createDataFrame([(KEY, None, 0)], RAW_SCHEMA)

    actual_df = with_framing(raw_df)

    expected_df = spark.createDataFrame([(KEY, None, 0, True, None, None, 3)], FRAMED_SCHEMA)
    assert_df_equality(actual_df, expected_df)


def test_wrong_magic_byte_is_unframed(spark: SparkSession) -> None:
    wrong_magic = b"\x01" + struct.pack(">I", 42) + BODY
    raw_df = spark.createDataFrame([(KEY, wrong_magic, 0)], RAW_SCHEMA)

    actual_df = with_framing(raw_df)

    expected_df = spark.createDataFrame([(KEY, wrong_magic, 0, False, None, None, 3)], FRAMED_SCHEMA)
    assert_df_equality(actual_df, expected_df)


def test_value_of_five_bytes_or_fewer_is_unframed(spark: SparkSession) -> None:
    # Header only (no body), shorter than a header, and empty: none carries an Avro body.
    values = [_framed(42, b""), b"\x00\x00\x00", b""]
    raw_df = spark.createDataFrame([(KEY, v, i) for i, v in enumerate(values)], RAW_SCHEMA)

    actual_df = with_framing(raw_df)

    expected_df = spark.createDataFrame(
        [(KEY, v, i, False, None, None, 3) for i, v in enumerate(values)], FRAMED_SCHEMA
    )
    assert_df_equality(actual_df, expected_df)


def test_key_schema_ids_are_parsed_likewise(spark: SparkSession) -> None:
    keys = [
        _framed(5, b"\x02"),
        bytes.fromhex("00fffffffe02"),
        b"user-1",  # a plain string key: no framing, no id
        b"\x00\x00\x00\x00\x05",  # header only
        None,
    ]
    raw_df = spark.createDataFrame([(k, _framed(9), i) for i, k in enumerate(keys)], RAW_SCHEMA)

    actual_df = with_framing(raw_df)

    key_ids = [5, 4294967294, None, None, None]
    expected_df = spark.createDataFrame(
        [(k, _framed(9), i, True, 9, BODY, key_ids[i]) for i, k in enumerate(keys)], FRAMED_SCHEMA
    )
    assert_df_equality(actual_df, expected_df)
