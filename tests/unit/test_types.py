"""app/cdc/debezium_types.py: Debezium encodings to Spark types, on small literal DataFrames (chispa).

Raw values are the ones the real Debezium 3.2.3 PostgreSQL connector sent for the PostgreSQL values named in
each test (captured on the local stack); the end-to-end check of every type is tests/e2e/test_types.py.
"""
from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

from chispa import assert_df_equality
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    DecimalType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from app.cdc.debezium_types import (
    conversion,
    declares_default,
    named_types,
    placeholder_test,
    reader_schema,
    with_debezium_types,
)
from app.cdc.position import MYSQL, POSTGRESQL
from app.cdc.unwrap import UNAVAILABLE_PLACEHOLDER


def _convert(spark: SparkSession, avro_type: Any, raw_type: DataType, values: list[Any]) -> list[Any]:
    df = spark.createDataFrame([(i, v) for i, v in enumerate(values)], StructType([
        StructField("i", IntegerType()), StructField("v", raw_type, True),
    ]))
    convert = conversion(avro_type)
    assert convert is not None
    converted = df.select("i", convert(F.col("v")).alias("v"))
    if isinstance(converted.schema["v"].dataType, TimestampType):
        # Collected as micros: Python's local-time conversion cannot hold 0001-01-01 in a zone west of UTC.
        converted = converted.select("i", F.unix_micros("v").alias("v"))
    return [r["v"] for r in converted.orderBy("i").collect()]


def _utc(iso: str) -> int:
    """Microseconds since the epoch of a UTC wall-clock time."""
    instant = datetime.fromisoformat(iso).replace(tzinfo=UTC)
    return (instant - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


def test_date_days_with_pre_1970_and_infinity(spark: SparkSession) -> None:
    days = [19782, -25567, -719162, 0, -622191234, -625821272, -2147472692, -2147472691, None]

    actual = _convert(spark, {"type": "int", "connect.name": "io.debezium.time.Date"}, IntegerType(), days)

    assert actual == [
        date(2024, 2, 29), date(1900, 1, 1), date(1, 1, 1), date(1970, 1, 1),
        date(9999, 12, 31), date(1, 1, 1), date(9999, 12, 31), date(1, 1, 1), None,
    ]


def test_connect_date_without_its_logical_type_is_the_same(spark: SparkSession) -> None:
    avro = {"type": "int", "connect.name": "org.apache.kafka.connect.data.Date", "logicalType": "date"}
    assert _convert(spark, avro, IntegerType(), [19782, -622191234]) == [date(2024, 2, 29), date(9999, 12, 31)]


def test_timestamps_millis_micros_nanos_and_infinity(spark: SparkSession) -> None:
    millis = {"type": "long", "connect.name": "io.debezium.time.Timestamp"}
    micros = {"type": "long", "connect.name": "io.debezium.time.MicroTimestamp"}
    nanos = {"type": "long", "connect.name": "io.debezium.time.NanoTimestamp"}
    top, bottom = _utc("9999-12-31 23:59:59.999999"), _utc("0001-01-01 00:00:00")

    assert _convert(spark, millis, LongType(), [1709210096789, -1, 9223372036825200, -9223372036832400]) == [
        _utc("2024-02-29 12:34:56.789"), _utc("1969-12-31 23:59:59.999"), top, bottom,
    ]
    assert _convert(spark, micros, LongType(), [
        1709210096123456, -2208988799999999, 9223372036825200000, -9223372036832400000,
    ]) == [_utc("2024-02-29 12:34:56.123456"), _utc("1900-01-01 00:00:00.000001"), top, bottom]
    assert _convert(spark, nanos, LongType(), [1704103872123456789, -1]) == [
        _utc("2024-01-01 10:11:12.123456"), _utc("1969-12-31 23:59:59.999999"),
    ]


def test_zoned_timestamp_text_and_infinity(spark: SparkSession) -> None:
    avro = {"type": "string", "connect.name": "io.debezium.time.ZonedTimestamp"}
    raw = ["2024-02-29T10:34:56.123456Z", "infinity", "-infinity", "+292269055-12-02T23:00:00.000000Z"]

    assert _convert(spark, avro, StringType(), raw) == [
        _utc("2024-02-29 10:34:56.123456"), _utc("9999-12-31 23:59:59.999999"), _utc("0001-01-01 00:00:00"),
        _utc("0001-01-01 00:00:00"),
    ]


def test_times_of_day_become_fixed_width_text_including_24_00(spark: SparkSession) -> None:
    millis = {"type": "int", "connect.name": "io.debezium.time.Time"}
    micros = {"type": "long", "connect.name": "io.debezium.time.MicroTime"}
    connect = {"type": "int", "connect.name": "org.apache.kafka.connect.data.Time", "logicalType": "time-millis"}

    assert _convert(spark, millis, IntegerType(), [0, 45296789, 86400000, None]) == [
        "00:00:00.000000", "12:34:56.789000", "24:00:00.000000", None,
    ]
    assert _convert(spark, micros, LongType(), [45296123456, 86399999999]) == ["12:34:56.123456", "23:59:59.999999"]
    assert _convert(spark, connect, IntegerType(), [86399999]) == ["23:59:59.999000"]


def test_micro_duration_becomes_interval_text_that_casts_back(spark: SparkSession) -> None:
    avro = {"type": "long", "connect.name": "io.debezium.time.MicroDuration"}
    # '1 year 2 mons 3 days 04:05:06.789' (months at 30.4375 days), '-1 mons', '1 day 00:00:00.000001'
    raw = [37091106789000, -2629800000000, 86400000001, None]

    actual = _convert(spark, avro, LongType(), raw)

    assert actual == [
        "INTERVAL '429 07:05:06.789' DAY TO SECOND", "INTERVAL '-30 10:30:00' DAY TO SECOND",
        "INTERVAL '1 00:00:00.000001' DAY TO SECOND", None,
    ]
    back = spark.createDataFrame([(a,) for a in actual], "a string").select(
        F.expr("cast(a as interval day to second)").alias("i")
    )
    assert [r["i"] for r in back.collect()] == [None if us is None else timedelta(microseconds=us) for us in raw]


def test_mysql_time_is_an_elapsed_time_not_a_time_of_day(spark: SparkSession) -> None:
    """MySQL/MariaDB TIME (MicroTime from those connectors) spans +-838:59:59.999999: the interval text, as for
    PostgreSQL's interval; PostgreSQL's time (MicroTime too) stays a time of day."""
    avro = {"type": "long", "connect.name": "io.debezium.time.MicroTime"}
    raw = [3020399999999, -3020399999999, 0, 45296123456, None]
    df = spark.createDataFrame([(i, v) for i, v in enumerate(raw)], "i int, v long")
    mysql, postgres = conversion(avro, connector=MYSQL), conversion(avro, connector=POSTGRESQL)
    assert mysql is not None and postgres is not None

    actual = [r["v"] for r in df.select("i", mysql(F.col("v")).alias("v")).orderBy("i").collect()]

    assert actual == [
        "INTERVAL '34 22:59:59.999999' DAY TO SECOND", "INTERVAL '-34 22:59:59.999999' DAY TO SECOND",
        "INTERVAL '0 00:00:00' DAY TO SECOND", "INTERVAL '0 12:34:56.123456' DAY TO SECOND", None,
    ]
    back = spark.createDataFrame([(a,) for a in actual], "a string").select(
        F.expr("cast(a as interval day to second)").alias("i")
    )
    assert [r["i"] for r in back.collect()] == [None if us is None else timedelta(microseconds=us) for us in raw]
    assert df.select(postgres(F.col("v"))).collect()[3][0] == "12:34:56.123456"


def test_mysql_time_in_connect_mode_is_the_same_interval_text(spark: SparkSession) -> None:
    """time.precision.mode=connect sends MySQL/MariaDB TIME as Kafka Connect's Time (milliseconds of a day): the
    same interval text as the default mode's MicroTime, so a column reads alike whatever the mode."""
    avro = {"type": "int", "connect.name": "org.apache.kafka.connect.data.Time", "logicalType": "time-millis"}
    df = spark.createDataFrame([(0, 45296123), (1, 0), (2, None)], "i int, v int")
    mysql = conversion(avro, connector=MYSQL)
    assert mysql is not None

    actual = [r["v"] for r in df.select("i", mysql(F.col("v")).alias("v")).orderBy("i").collect()]

    assert actual == ["INTERVAL '0 12:34:56.123' DAY TO SECOND", "INTERVAL '0 00:00:00' DAY TO SECOND", None]


def test_decimals_beyond_spark_and_without_scale_become_exact_text(spark: SparkSession) -> None:
    wide = {
        "type": "bytes", "scale": 10, "precision": 50, "logicalType": "decimal",
        "connect.name": "org.apache.kafka.connect.data.Decimal",
        "connect.parameters": {"scale": "10", "connect.decimal.precision": "50"},
    }
    raw = [
        bytes.fromhex("08727f6369aaf83ca15026747af8c7f1968c04d515"),
        bytes.fromhex("f78d809c965507c35eafd98b8507380e6973fb2aeb"),
        bytes.fromhex("01"),
        None,
    ]
    assert _convert(spark, wide, BinaryType(), raw) == [
        "1234567890123456789012345678901234567890.0123456789",
        "-1234567890123456789012345678901234567890.0123456789",
        "0.0000000001",
        None,
    ]

    variable = {
        "type": "record", "name": "VariableScaleDecimal", "namespace": "io.debezium.data",
        "connect.name": "io.debezium.data.VariableScaleDecimal",
        "fields": [{"name": "scale", "type": "int"}, {"name": "value", "type": "bytes"}],
    }
    vsd_type = StructType([StructField("scale", IntegerType()), StructField("value", BinaryType())])
    assert _convert(spark, variable, vsd_type, [
        (1, bytes.fromhex("0f")),
        (6, bytes.fromhex("ff")),
        (0, bytes.fromhex("058936e527ad679ec3aa92ef5b7c74f1e2df79")),
        None,
    ]) == ["1.5", "-0.000001", "123456789012345678901234567890123456789012345", None]


def test_money_has_no_declared_precision_and_becomes_decimal_38_2(spark: SparkSession) -> None:
    money = {
        "type": "bytes", "scale": 2, "precision": 64, "logicalType": "decimal",
        "connect.name": "org.apache.kafka.connect.data.Decimal", "connect.parameters": {"scale": "2"},
    }
    actual = _convert(spark, money, BinaryType(), [bytes.fromhex("04d2"), bytes.fromhex("8000000000000000"), None])

    assert actual == [Decimal("12.34"), Decimal("-92233720368547758.08"), None]


def test_decimal_with_a_scale_spark_refuses_becomes_text(spark: SparkSession) -> None:
    # PostgreSQL 15: numeric(3,5) holds 0.00012; Avro and Spark have no such decimal.
    odd = {
        "type": "bytes", "scale": 5, "precision": 3, "logicalType": "decimal",
        "connect.name": "org.apache.kafka.connect.data.Decimal",
        "connect.parameters": {"scale": "5", "connect.decimal.precision": "3"},
    }
    schema = {"type": "record", "name": "V", "fields": [{"name": "x", "type": odd}]}

    assert "logicalType" not in json.loads(reader_schema(json.dumps(schema)))["fields"][0]["type"]
    assert _convert(spark, odd, BinaryType(), [bytes.fromhex("0c")]) == ["0.00012"]


def test_unbounded_varbit_is_not_padded(spark: SparkSession) -> None:
    unbounded = {
        "type": "bytes", "connect.name": "io.debezium.data.Bits", "connect.parameters": {"length": "2147483647"},
    }
    no_length = {"type": "bytes", "connect.name": "io.debezium.data.Bits"}

    raw = [bytes.fromhex("05"), bytes.fromhex("0102")]
    assert _convert(spark, unbounded, BinaryType(), raw) == ["101", "1000000001"]
    assert _convert(spark, no_length, BinaryType(), [bytes.fromhex("05")]) == ["101"]


def test_bits_become_postgres_bit_text(spark: SparkSession) -> None:
    bits = {"type": "bytes", "connect.name": "io.debezium.data.Bits", "connect.parameters": {"length": "10"}}
    raw = [bytes.fromhex("0102"), bytes.fromhex("0003"), bytes.fromhex("01"), None]

    assert _convert(spark, bits, BinaryType(), raw) == ["1000000001", "1100000000", "0000000001", None]


def test_array_elements_convert_and_keep_their_nulls(spark: SparkSession) -> None:
    dates = {"type": "array", "items": ["null", {"type": "int", "connect.name": "io.debezium.time.Date"}]}

    actual = _convert(spark, ["null", dates], ArrayType(IntegerType(), True), [[19782, None, -622191234], None, []])

    assert actual == [[date(2024, 2, 29), None, date(9999, 12, 31)], None, []]


def test_array_items_referring_to_a_named_type_resolve_it() -> None:
    envelope: dict[str, Any] = {
        "type": "record", "name": "Value", "fields": [
            {"name": "n", "type": ["null", {
                "type": "record", "name": "VariableScaleDecimal", "namespace": "io.debezium.data",
                "connect.name": "io.debezium.data.VariableScaleDecimal",
                "fields": [{"name": "scale", "type": "int"}, {"name": "value", "type": "bytes"}],
            }]},
            {"name": "ns", "type": ["null", {
                "type": "array", "items": ["null", "io.debezium.data.VariableScaleDecimal"],
            }]},
        ],
    }
    named = named_types(json.dumps(envelope))

    assert conversion(envelope["fields"][1]["type"], named) is not None
    assert conversion(envelope["fields"][1]["type"]) is None  # unresolved: passed through


def test_reader_schema_strips_logical_types_this_module_converts() -> None:
    schema = {"type": "record", "name": "V", "fields": [
        {"name": "d", "type": {
            "type": "int", "logicalType": "date", "connect.name": "org.apache.kafka.connect.data.Date",
        }},
        {"name": "small", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2,
                                   "connect.parameters": {"scale": "2", "connect.decimal.precision": "10"}}},
        {"name": "wide", "type": {"type": "bytes", "logicalType": "decimal", "precision": 50, "scale": 2,
                                  "connect.parameters": {"scale": "2", "connect.decimal.precision": "50"}}},
        {"name": "money", "type": {"type": "bytes", "logicalType": "decimal", "precision": 64, "scale": 2,
                                   "connect.parameters": {"scale": "2"}}},
    ]}

    fields = {f["name"]: f["type"] for f in json.loads(reader_schema(json.dumps(schema)))["fields"]}

    assert "logicalType" not in fields["d"]
    assert fields["small"]["logicalType"] == "decimal"  # spark-avro reads it exactly
    assert "logicalType" not in fields["wide"] and "logicalType" not in fields["money"]


def test_placeholders_per_type(spark: SparkSession) -> None:
    codes = list(UNAVAILABLE_PLACEHOLDER.encode())
    schema = StructType([
        StructField("t", StringType()), StructField("b", BinaryType()),
        StructField("ta", ArrayType(StringType())), StructField("ia", ArrayType(IntegerType())),
    ])
    df = spark.createDataFrame([
        (UNAVAILABLE_PLACEHOLDER, UNAVAILABLE_PLACEHOLDER.encode(), [UNAVAILABLE_PLACEHOLDER], codes),
        ("x", b"x", ["x", None], [1, None]),
        (None, None, None, None),
    ], schema)
    tests = {
        "t": placeholder_test(["null", "string"]),
        "b": placeholder_test(["null", "bytes"]),
        "ta": placeholder_test(["null", {"type": "array", "items": ["null", "string"]}]),
        "ia": placeholder_test(["null", {"type": "array", "items": ["null", "int"]}]),
    }
    flags = df.select(*[F.coalesce(test(F.col(c)), F.lit(False)).alias(c) for c, test in tests.items() if test])

    assert [tuple(r) for r in flags.collect()] == [(True,) * 4, (False,) * 4, (False,) * 4]


def test_with_debezium_types_converts_by_field_and_keeps_other_columns(spark: SparkSession) -> None:
    fields: list[dict[str, Any]] = [
        {"name": "id", "type": "int"},
        {"name": "price", "type": ["null", {
            "type": "bytes", "connect.name": "org.apache.kafka.connect.data.Decimal", "precision": 64,
            "scale": 2, "connect.parameters": {"scale": "2"},
        }]},
    ]
    df = spark.createDataFrame([(1, bytes.fromhex("04d2"), "c")], "id int, price binary, _cdc_op string")

    actual_df = with_debezium_types(df, fields)

    expected_df = spark.createDataFrame([(1, Decimal("12.34"), "c")], StructType([
        StructField("id", IntegerType()),
        StructField("price", DecimalType(38, 2)),
        StructField("_cdc_op", StringType()),
    ]))
    assert_df_equality(actual_df, expected_df, ignore_nullable=True)


def test_a_default_is_declared_by_the_field_or_moved_into_its_connect_parameters() -> None:
    # As the registry holds them: a plain Avro default, and what the connector's DefaultsAsParameters SMT (jvm/)
    # leaves of PostgreSQL's `n int default 7` and `t timestamptz default now()` (captured on the local stack).
    plain = {"name": "n", "type": ["int", "null"], "default": 7}
    moved = {"name": "n", "type": ["null", {"type": "int", "connect.parameters": {"cdclake.default": "7"}}],
             "default": None}
    moved_now = {"name": "t", "type": ["null", {"type": "string", "connect.version": 1, "connect.parameters": {
        "cdclake.default": "1970-01-01T00:00:00.000000Z"}, "connect.name": "io.debezium.time.ZonedTimestamp"}],
        "default": None}
    none = {"name": "d", "type": ["null", {"type": "int", "connect.name": "io.debezium.time.Date"}], "default": None}
    other_parameters = {"name": "p", "type": ["null", {"type": "bytes", "connect.parameters": {"scale": "2"}}],
                        "default": None}

    assert [declares_default(f) for f in (plain, moved, moved_now, none, other_parameters)] == [
        True, True, True, False, False]
