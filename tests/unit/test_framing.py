"""app/wire/framing.py: every Apicurio framing split in the JVM, on literal bytes; tests/unit/test_golden.py runs the
same code on bytes captured from the real connector."""
from __future__ import annotations

import struct

import pytest
from chispa import assert_df_equality
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from app.wire.framing import Framing, framing_columns, with_framing, with_source_framings

HEADERS_TYPE = ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))
RAW_SCHEMA = StructType([
    StructField("key", BinaryType(), True),
    StructField("value", BinaryType(), True),
    StructField("headers", HEADERS_TYPE, True),
    StructField("offset", LongType(), True),
])
SPLIT_SCHEMA = StructType([
    StructField("offset", LongType(), True),
    StructField("id_type", StringType(), True),
    StructField("schema_id", LongType(), True),
    StructField("payload", BinaryType(), True),
    StructField("frame_error", StringType(), True),
])
BODY = b"\x00\x02\x0aalice"  # a raw Avro body starting with 0x00, as a null `before` does
KEY_BODY = b"\x02"


def _id4(schema_id: int, body: bytes = BODY) -> bytes:
    return b"\x00" + struct.pack(">I", schema_id) + body


def _id8(schema_id: int, body: bytes = BODY) -> bytes:
    return b"\x00" + struct.pack(">Q", schema_id) + body


def _id_header(side: str, id_type: str, schema_id: int) -> tuple[str, bytes]:
    return (f"apicurio.{side}.{id_type}", struct.pack(">Q", schema_id))


def _split(spark: SparkSession, rows: list[tuple], framing: Framing, side: str = "value") -> DataFrame:
    raw_df = spark.createDataFrame(rows, RAW_SCHEMA)
    cols = framing_columns(side)
    return with_framing(raw_df, framing).select(
        "offset", *[F.col(c).alias(c.removeprefix(f"{side}_")) for c in cols]
    )


def _expected(spark: SparkSession, rows: list[tuple]) -> DataFrame:
    return spark.createDataFrame(rows, SPLIT_SCHEMA)


def test_id4_splits_id_and_body_and_reads_ids_unsigned(spark: SparkSession) -> None:
    rows = [(None, _id4(42), None, 0), (None, _id4(0xFFFFFFFE), None, 1), (None, _id4(0x80000000), None, 2)]

    actual_df = _split(spark, rows, Framing("id4", "globalId"))

    expected_df = _expected(spark, [
        (0, "globalId", 42, BODY, None),
        (1, "globalId", 4294967294, BODY, None),
        (2, "globalId", 2147483648, BODY, None),
    ])
    assert_df_equality(actual_df, expected_df)


def test_id8_splits_any_8_byte_id(spark: SparkSession) -> None:
    rows = [(None, _id8(7), None, 0), (None, _id8(2**40 + 3), None, 1), (None, _id8(2**63), None, 2)]

    actual_df = _split(spark, rows, Framing("id8", "contentId"))

    expected_df = _expected(spark, [
        (0, "contentId", 7, BODY, None),
        (1, "contentId", 2**40 + 3, BODY, None),
        (2, None, None, None, "schema id out of range (above 2^63 - 1)"),
    ])
    assert_df_equality(actual_df, expected_df)


def test_headers_mode_reads_the_id_header_and_keeps_the_raw_body(spark: SparkSession) -> None:
    encoding = ("apicurio.value.encoding", b"BINARY")
    rows = [
        (None, BODY, [_id_header("value", "globalId", 12), encoding], 0),
        (None, BODY, [_id_header("value", "contentId", 5)], 1),
        # Kafka's lastHeader: a repeated header's last value counts.
        (None, BODY, [_id_header("value", "globalId", 1), _id_header("value", "globalId", 99)], 2),
        # The key's header is not the value's.
        (None, BODY, [_id_header("key", "globalId", 3)], 3),
        (None, BODY, [("apicurio.value.globalId", b"\x00\x01")], 4),
        (None, None, [_id_header("key", "globalId", 3)], 5),  # tombstone
        # The last of a repeated header, other headers after it; no headers at all.
        (None, BODY, [_id_header("value", "globalId", 1), _id_header("value", "globalId", 98), encoding], 6),
        (None, BODY, [], 7),
    ]

    actual_df = _split(spark, rows, Framing("headers", "contentId"))

    no_header = "no 8-byte apicurio.value.globalId or .contentId header (framing: headers)"
    expected_df = _expected(spark, [
        (0, "globalId", 12, BODY, None),
        (1, "contentId", 5, BODY, None),
        (2, "globalId", 99, BODY, None),
        (3, None, None, None, no_header),
        (4, None, None, None, no_header),
        (5, None, None, None, None),
        (6, "globalId", 98, BODY, None),
        (7, None, None, None, no_header),
    ])
    assert_df_equality(actual_df, expected_df)


def test_json_encoding_in_headers_is_refused(spark: SparkSession) -> None:
    rows = [(None, b'{"a":1}', [_id_header("value", "globalId", 12), ("apicurio.value.encoding", b"JSON")], 0)]

    actual_df = _split(spark, rows, Framing("headers"))

    expected_df = _expected(spark, [
        (0, None, None, None,
         "apicurio.value.encoding is JSON; only BINARY Avro is read (converter apicurio.registry.avro.encoding)"),
    ])
    assert_df_equality(actual_df, expected_df)


def test_payload_framing_refuses_header_framed_records(spark: SparkSession) -> None:
    # BODY starts with 0x00: read as id4 it would parse as id 0x020a616c, a wrong schema, silently.
    rows = [(None, BODY, [_id_header("value", "globalId", 12)], 0)]

    actual_df = _split(spark, rows, Framing("id4"))

    expected_df = _expected(spark, [
        (0, None, None, None,
         "carries an apicurio.value.* id header: the producer writes header framing; "
         "set source.framing to headers (or auto)"),
    ])
    assert_df_equality(actual_df, expected_df)


def test_id4_refuses_an_8_byte_id(spark: SparkSession) -> None:
    rows = [(None, _id8(300), None, 0)]

    actual_df = _split(spark, rows, Framing("id4"))

    expected_df = _expected(spark, [
        (0, None, None, None, "schema id 0: an 8-byte id read as 4 bytes? set source.framing to id8 (or auto)"),
    ])
    assert_df_equality(actual_df, expected_df)


@pytest.mark.parametrize("mode", ["id4", "id8"])
def test_bad_magic_and_too_short_values_are_unframed(spark: SparkSession, mode: str) -> None:
    values = [b"\x01" + _id8(3)[1:], _id4(42, b"") if mode == "id4" else _id8(42, b""), b"\x00\x00\x00", b""]
    rows = [(None, v, None, i) for i, v in enumerate(values)]

    actual_df = _split(spark, rows, Framing(mode))  # type: ignore[arg-type]

    width = 4 if mode == "id4" else 8
    error = f"lacks the 0x00 + {width}-byte id prefix (framing: {mode})"
    expected_df = _expected(spark, [(i, None, None, None, error) for i in range(len(values))])
    assert_df_equality(actual_df, expected_df)


def test_auto_detects_each_framing_per_record(spark: SparkSession) -> None:
    rows = [
        (None, BODY, [_id_header("value", "globalId", 12)], 0),
        (None, _id8(70), None, 1),
        (None, _id4(70), None, 2),
        (None, b"plain", None, 3),
        (None, None, None, 4),
    ]

    actual_df = _split(spark, rows, Framing("auto", "contentId"))

    expected_df = _expected(spark, [
        (0, "globalId", 12, BODY, None),
        (1, "contentId", 70, BODY, None),
        (2, "contentId", 70, BODY, None),
        (3, None, None, None, "neither an apicurio id header nor the 0x00 + 4/8-byte id prefix (framing: auto)"),
        (4, None, None, None, None),
    ])
    assert_df_equality(actual_df, expected_df)


def test_keys_are_split_like_values(spark: SparkSession) -> None:
    rows = [
        (_id4(5, KEY_BODY), _id4(9), None, 0),
        (b"user-1", _id4(9), None, 1),  # a plain string key: no framing
        (None, _id4(9), None, 2),  # no key (a table without primary key)
    ]

    actual_df = _split(spark, rows, Framing("id4"), side="key")

    expected_df = _expected(spark, [
        (0, "contentId", 5, KEY_BODY, None),
        (1, None, None, None, "lacks the 0x00 + 4-byte id prefix (framing: id4)"),
        (2, None, None, None, None),
    ])
    assert_df_equality(actual_df, expected_df)


def test_without_a_headers_column_payload_framings_apply(spark: SparkSession) -> None:
    raw_df = spark.createDataFrame([(_id4(5, KEY_BODY), _id4(9), 0)], "key binary, value binary, offset long")

    row = with_framing(raw_df, Framing("auto")).first()

    assert row is not None
    assert (row["key_schema_id"], row["value_schema_id"], row["value_frame_error"]) == (5, 9, None)


def test_each_source_frames_its_own_topics(spark: SparkSession) -> None:
    """Two sources, two converters: `crm` frames ids in headers, `crm.eu` (a longer prefix) and `shop` as 0x00 +
    4 bytes. A topic takes the framing of the longest prefix it starts with; a topic of no source, the first's."""
    schema = StructType([*RAW_SCHEMA.fields, StructField("topic", StringType(), True)])
    rows = [
        (None, BODY, [_id_header("value", "globalId", 12)], 0, "crm.public.users"),
        (None, _id4(7), None, 1, "shop.inventory.items"),
        (None, _id4(8), None, 2, "crm.eu.public.users"),
        (None, _id4(9), None, 3, "other.public.users"),
    ]
    framings = [
        ("crm", Framing("headers", "contentId")), ("shop", Framing("id4", "contentId")),
        ("crm.eu", Framing("id4", "globalId")),
    ]

    framed_df = with_source_framings(spark.createDataFrame(rows, schema), framings)

    split = [F.col(c).alias(c.removeprefix("value_")) for c in framing_columns("value")]
    actual_df = framed_df.select("offset", *split)
    no_header = "no 8-byte apicurio.value.globalId or .contentId header (framing: headers)"
    expected_df = _expected(spark, [
        (0, "globalId", 12, BODY, None),
        (1, "contentId", 7, BODY, None),
        (2, "globalId", 8, BODY, None),
        (3, None, None, None, no_header),
    ])
    assert_df_equality(actual_df, expected_df)
    # One source (or sources framed alike): the plain framing, the same columns.
    assert with_source_framings(spark.createDataFrame(rows, schema), framings[1:2]).columns == framed_df.columns
