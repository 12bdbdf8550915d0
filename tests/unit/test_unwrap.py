"""app/cdc/unwrap.py: one test per CDC case on small literal DataFrames (chispa), no Kafka and no registry.

The suite runs with TZ=America/Los_Angeles: timestamps are compared as instants, built on the expected side
from timezone-aware UTC datetimes (pyspark turns those into the instant, then both sides collect the same way).
"""
from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, date, datetime
from typing import Any

import pytest
from chispa import assert_df_equality
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DateType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from app.cdc.columns import ERROR_COL
from app.cdc.debezium_types import MAX_TIMESTAMP_MICROS, MIN_TIMESTAMP_MICROS, with_debezium_types
from app.cdc.position import MYSQL, POSTGRESQL, SQLSERVER
from app.cdc.unwrap import (
    EMPTY_KEY,
    KEY_FRAMING,
    KEY_SCHEMA,
    MISSING_KEY,
    NULL_IMAGE,
    UNKNOWN_OP,
    KeyCheck,
    dedupe_latest,
    filter_data_changes,
    filter_tombstones,
    flattened_layout,
    is_envelope,
    struct_fields,
    unwrap_envelope,
    unwrap_flattened,
    with_event_errors,
    with_key_errors,
    with_latest_flag,
)
from app.errors import EnvelopeError

ROW_TYPE = StructType([
    StructField("id", IntegerType(), True),
    StructField("name", StringType(), True),
])
SOURCE_TYPE = StructType([
    StructField("lsn", LongType(), True),
    StructField("ts_ms", LongType(), True),
])
ENVELOPE_TYPE = StructType([
    StructField("before", ROW_TYPE, True),
    StructField("after", ROW_TYPE, True),
    StructField("op", StringType(), True),
    StructField("source", SOURCE_TYPE, True),
])
EVENT_SCHEMA = StructType([
    StructField("value", BinaryType(), True),
    StructField("envelope", ENVELOPE_TYPE, True),
    StructField("partition", IntegerType(), True),
    StructField("offset", LongType(), True),
])
VALUE_COLUMNS = ["id", "name"]

CDC_FIELDS = [
    StructField("_cdc_op", StringType(), True),
    StructField("_cdc_position", StringType(), False),
    StructField("_cdc_source_ts_ms", LongType(), True),
    StructField("_kafka_partition", IntegerType(), True),
    StructField("_kafka_offset", LongType(), True),
    StructField("_hoodie_is_deleted", BooleanType(), True),
    StructField("_cdc_unavailable", ArrayType(StringType(), True), False),
]
UNWRAPPED_SCHEMA = StructType([*ROW_TYPE.fields, *CDC_FIELDS])
# What the unwrap gives: also whether the event is a full snapshot's last read (app/cdc/derived.py).
UNWRAP_OUT_SCHEMA = StructType([*UNWRAPPED_SCHEMA.fields, StructField("_cdc_snapshot_end", BooleanType(), False)])
FLAGGED_SCHEMA = StructType([*UNWRAPPED_SCHEMA.fields, StructField("_cdc_is_latest", BooleanType(), False)])
COMPOSITE_SCHEMA = StructType([StructField("tenant", StringType(), True), *UNWRAPPED_SCHEMA.fields])

VALUE_BYTES = b"\x00\x00\x00\x00\x07avro"
TS_MS = 1704103872000


def pos(lsn: int) -> str:
    """The ordering string of a PostgreSQL event without `sequence` (app/cdc/position.py): its LSN twice."""
    text = f"{lsn >> 32:08X}/{lsn & 0xFFFFFFFF:08X}"
    return f"{text}:{text}"


def _event(
    op: str, before: tuple[Any, ...] | None, after: tuple[Any, ...] | None, lsn: int, offset: int
) -> tuple[Any, ...]:
    return (VALUE_BYTES, (before, after, op, (lsn, TS_MS)), 1, offset)


# ---- unwrap: c, r, u, d ---------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["c", "r"])
def test_create_and_snapshot_read_upsert_the_after_image(spark: SparkSession, op: str) -> None:
    events_df = spark.createDataFrame([_event(op, None, (1, "alice"), 100, 5)], EVENT_SCHEMA)

    actual_df = events_df.transform(filter_data_changes).transform(unwrap_envelope, VALUE_COLUMNS, POSTGRESQL)

    expected_df = spark.createDataFrame([(1, "alice", op, pos(100), TS_MS, 1, 5, False, [], False)], UNWRAP_OUT_SCHEMA)
    assert_df_equality(actual_df, expected_df)


def test_update_upserts_the_after_image_not_the_before(spark: SparkSession) -> None:
    events_df = spark.createDataFrame([_event("u", (1, "alice"), (1, "alicia"), 200, 6)], EVENT_SCHEMA)

    actual_df = events_df.transform(filter_data_changes).transform(unwrap_envelope, VALUE_COLUMNS, POSTGRESQL)

    expected_df = spark.createDataFrame([(1, "alicia", "u", pos(200), TS_MS, 1, 6, False, [], False)],
                                        UNWRAP_OUT_SCHEMA)
    assert_df_equality(actual_df, expected_df)


def test_delete_takes_the_before_image_and_carries_its_lsn(spark: SparkSession) -> None:
    # Without REPLICA IDENTITY FULL the before image holds only the key columns.
    events_df = spark.createDataFrame([_event("d", (1, None), None, 300, 7)], EVENT_SCHEMA)

    actual_df = events_df.transform(filter_data_changes).transform(unwrap_envelope, VALUE_COLUMNS, POSTGRESQL)

    expected_df = spark.createDataFrame([(1, None, "d", pos(300), TS_MS, 1, 7, True, [], False)], UNWRAP_OUT_SCHEMA)
    assert_df_equality(actual_df, expected_df)


def test_a_full_snapshots_last_read_is_flagged(spark: SparkSession) -> None:
    """`source.snapshot` says which read is a full snapshot's last, of the whole snapshot or of one table
    (app/cdc/derived.py); an incremental snapshot's reads and streamed changes never are."""
    source = StructType([*SOURCE_TYPE.fields, StructField("snapshot", StringType(), True)])
    envelope = StructType([*ENVELOPE_TYPE.fields[:3], StructField("source", source, True)])
    schema = StructType([EVENT_SCHEMA.fields[0], StructField("envelope", envelope, True), *EVENT_SCHEMA.fields[2:]])
    snapshots = ["first", "true", "last_in_data_collection", "last", "incremental", "false", None]
    rows = [(VALUE_BYTES, (None, (i, "x"), "r" if s != "false" else "u", (100, TS_MS, s)), 0, i)
            for i, s in enumerate(snapshots)]

    actual = spark.createDataFrame(rows, schema).transform(unwrap_envelope, VALUE_COLUMNS, POSTGRESQL).collect()

    assert [r["_cdc_snapshot_end"] for r in sorted(actual, key=lambda r: r["_kafka_offset"])] == [
        False, False, True, True, False, False, False]


# ---- events the unwrap SMT flattened ---------------------------------------------------------------------

FLAT_TYPE = StructType([
    *ROW_TYPE.fields,
    StructField("__op", StringType(), True),
    StructField("__lsn", LongType(), True),
    StructField("__source_ts_ms", LongType(), True),
    StructField("__deleted", StringType(), True),
])
FLAT_SCHEMA = StructType([
    StructField("envelope", FLAT_TYPE, True),
    StructField("partition", IntegerType(), True),
    StructField("offset", LongType(), True),
])


def test_flattened_events_unwrap_to_the_envelope_columns(spark: SparkSession) -> None:
    """rewrite mode: a delete is its before image with __deleted "true", its op and LSN kept."""
    rows = [
        ((1, "alice", "r", 100, TS_MS, "false"), 1, 5),
        ((1, "alicia", "u", 200, TS_MS, "false"), 1, 6),
        ((1, None, "d", 300, TS_MS, "true"), 1, 7),
    ]

    actual_df = spark.createDataFrame(rows, FLAT_SCHEMA).transform(unwrap_flattened, VALUE_COLUMNS, POSTGRESQL)

    expected_df = spark.createDataFrame([
        (1, "alice", "r", pos(100), TS_MS, 1, 5, False, [], False),
        (1, "alicia", "u", pos(200), TS_MS, 1, 6, False, [], False),
        (1, None, "d", pos(300), TS_MS, 1, 7, True, [], False),
    ], UNWRAP_OUT_SCHEMA)
    assert_df_equality(actual_df, expected_df)


def test_flattened_events_without_op_or_source_time_and_with_source_named_fields(spark: SparkSession) -> None:
    """add.fields=source.file,source.pos,source.row: `__source_file`...; no __op: a delete is `d`, else `u`."""
    flat = StructType([
        *ROW_TYPE.fields,
        StructField("__source_file", StringType(), True), StructField("__source_pos", LongType(), True),
        StructField("__source_row", IntegerType(), True), StructField("__deleted", StringType(), True),
    ])
    schema = StructType([StructField("envelope", flat), *FLAT_SCHEMA.fields[1:]])
    binlog = "mysql-bin.000003"
    rows = [((1, "a", binlog, 154, 0, "false"), 0, 1), ((1, None, binlog, 200, 1, "true"), 0, 2)]

    actual = spark.createDataFrame(rows, schema).transform(unwrap_flattened, VALUE_COLUMNS, MYSQL).collect()

    assert [(r["_cdc_op"], r["_cdc_position"], r["_hoodie_is_deleted"], r["_cdc_source_ts_ms"]) for r in actual] == [
        ("u", "0000000003:00000000000000000154:0000000000", False, None),
        ("d", "0000000003:00000000000000000200:0000000001", True, None),
    ]


def test_envelopes_and_flattened_events_are_told_apart() -> None:
    assert is_envelope(["before", "after", "op", "source", "ts_ms", "transaction"])
    assert not is_envelope(["id", "name", "__deleted", "__lsn"])
    assert flattened_layout(["id", "name", "__op", "__lsn", "__deleted"]) == (["id", "name"], POSTGRESQL)
    assert flattened_layout(["id", "__source_file", "__source_pos", "__source_row", "__deleted"])[1] == MYSQL


@pytest.mark.parametrize(("fields", "message"), [
    (["id", "__op", "__lsn"], r"without __deleted: .*delete\.tombstone\.handling\.mode=rewrite"),
    (["id"], r"without __deleted"),  # no add.fields at all, tombstone mode
    (["id", "__op", "__source_ts_ms", "__deleted"], r"without its source position .*add\.fields=op,lsn,source\.ts_ms"),
])
def test_flattened_settings_that_lose_deletes_or_order_are_refused(fields: list[str], message: str) -> None:
    with pytest.raises(EnvelopeError, match=message):
        flattened_layout(fields)


def test_unwrap_selects_only_the_given_value_columns_in_their_order(spark: SparkSession) -> None:
    events_df = spark.createDataFrame([_event("c", None, (1, "alice"), 100, 5)], EVENT_SCHEMA)

    actual_df = events_df.transform(unwrap_envelope, ["name", "id"], POSTGRESQL)

    assert actual_df.columns == [
        "name", "id", "_cdc_op", "_cdc_position", "_cdc_source_ts_ms", "_kafka_partition", "_kafka_offset",
        "_hoodie_is_deleted", "_cdc_unavailable", "_cdc_snapshot_end",
    ]
    assert [tuple(r) for r in actual_df.collect()] == [("alice", 1, "c", pos(100), TS_MS, 1, 5, False, [], False)]


# ---- rows that carry no change ---------------------------------------------------------------------------


def test_tombstone_is_dropped(spark: SparkSession) -> None:
    events_df = spark.createDataFrame(
        [(None, None, 1, 8), _event("d", (1, None), None, 300, 7)], EVENT_SCHEMA
    )

    actual_df = events_df.transform(filter_tombstones)

    expected_df = spark.createDataFrame([_event("d", (1, None), None, 300, 7)], EVENT_SCHEMA)
    assert_df_equality(actual_df, expected_df)


@pytest.mark.parametrize("op", ["t", "m"], ids=["truncate", "message"])
def test_truncate_and_message_are_dropped(spark: SparkSession, op: str) -> None:
    events_df = spark.createDataFrame(
        [_event("c", None, (1, "alice"), 100, 5), _event(op, None, None, 150, 6), _event("d", (1, None), None, 200, 7)],
        EVENT_SCHEMA,
    )

    actual_df = events_df.transform(filter_data_changes)

    expected_df = spark.createDataFrame(
        [_event("c", None, (1, "alice"), 100, 5), _event("d", (1, None), None, 200, 7)], EVENT_SCHEMA
    )
    assert_df_equality(actual_df, expected_df)


def test_unwrap_rejects_a_struct_that_is_not_an_envelope(spark: SparkSession) -> None:
    schema = StructType([
        StructField("envelope", StructType([
            StructField("after", ROW_TYPE, True),
            StructField("op", StringType(), True),
        ]), True),
        StructField("partition", IntegerType(), True),
        StructField("offset", LongType(), True),
    ])
    df = spark.createDataFrame([(((1, "alice"), "c"), 0, 1)], schema)

    with pytest.raises(EnvelopeError, match=r"missing \['before', 'source'\]"):
        unwrap_envelope(df, VALUE_COLUMNS, POSTGRESQL)


def test_struct_fields_reads_a_nested_structs_fields_off_the_schema(spark: SparkSession) -> None:
    schema = StructType([
        StructField("envelope", StructType([
            StructField("op", StringType(), True),
            StructField("source", SOURCE_TYPE, True),
        ]), True),
        StructField("offset", LongType(), True),
    ])
    df = spark.createDataFrame([(("c", (5, 1000)), 1)], schema)

    assert struct_fields(df, "envelope") == ["op", "source"]
    assert struct_fields(df, "envelope", "source") == ["lsn", "ts_ms"]
    assert struct_fields(df, "envelope", "op") == []  # not a struct
    assert struct_fields(df, "envelope", "before") == []  # no such field
    assert struct_fields(df, "missing", "source") == []
    assert struct_fields(df) == ["envelope", "offset"]


# ---- Debezium semantic types -----------------------------------------------------------------------------


def _typed_df(spark: SparkSession, value_type: DataType, values: list[Any]) -> DataFrame:
    schema = StructType([
        StructField("id", IntegerType(), True),
        StructField("v", value_type, True),
        StructField("_cdc_op", StringType(), True),
        StructField("_cdc_lsn", LongType(), True),
    ])
    return spark.createDataFrame([(i, v, "c", 100 + i) for i, v in enumerate(values)], schema)


def _fields(connect_name: str | None, avro_type: str) -> list[dict[str, Any]]:
    v_type: dict[str, Any] = {"type": avro_type}
    if connect_name is not None:
        v_type["connect.name"] = connect_name
    return [{"name": "id", "type": "int"}, {"name": "v", "type": ["null", v_type], "default": None}]


def _convert(
    spark: SparkSession, connect_name: str, avro_type: str, value_type: DataType, values: list[Any]
) -> DataFrame:
    return with_debezium_types(_typed_df(spark, value_type, values), _fields(connect_name, avro_type))


def _utc(iso: str) -> datetime:
    """The instant of a UTC wall-clock time, as a timezone-aware datetime."""
    return datetime.fromisoformat(iso).replace(tzinfo=UTC)


def test_debezium_date_days_become_a_date(spark: SparkSession) -> None:
    actual_df = _convert(spark, "io.debezium.time.Date", "int", IntegerType(), [19000, 0])

    expected_df = _typed_df(spark, DateType(), [date(2022, 1, 8), date(1970, 1, 1)])
    assert_df_equality(actual_df, expected_df)


def test_debezium_date_negative_days_are_before_1970(spark: SparkSession) -> None:
    actual_df = _convert(spark, "io.debezium.time.Date", "int", IntegerType(), [-1, -365, -25567])

    expected_df = _typed_df(spark, DateType(), [date(1969, 12, 31), date(1969, 1, 1), date(1900, 1, 1)])
    assert_df_equality(actual_df, expected_df)


def test_micro_timestamp_becomes_the_utc_instant(spark: SparkSession) -> None:
    actual_df = _convert(
        spark, "io.debezium.time.MicroTimestamp", "long", LongType(), [1704103872123456, -1]
    )

    expected_df = _typed_df(
        spark, TimestampType(), [_utc("2024-01-01 10:11:12.123456"), _utc("1969-12-31 23:59:59.999999")]
    )
    assert_df_equality(actual_df, expected_df)


@pytest.fixture(params=["UTC", "America/Los_Angeles", "Asia/Kolkata"])
def session_zone(spark: SparkSession, request: pytest.FixtureRequest) -> Iterator[str]:
    previous = spark.conf.get("spark.sql.session.timeZone")
    assert previous is not None
    spark.conf.set("spark.sql.session.timeZone", request.param)
    try:
        yield str(request.param)
    finally:
        spark.conf.set("spark.sql.session.timeZone", previous)


def test_micro_timestamp_keeps_the_raw_micros_in_any_session_zone(spark: SparkSession, session_zone: str) -> None:
    raw = [1704103872123456, 1719835200000001, -86400000000]  # winter, summer (DST), before 1970

    converted_df = _convert(spark, "io.debezium.time.MicroTimestamp", "long", LongType(), raw)

    assert converted_df.schema["v"].dataType == TimestampType()
    micros = [r["micros"] for r in converted_df.select(F.unix_micros("v").alias("micros")).orderBy("id").collect()]
    assert micros == raw, session_zone


def test_millis_timestamp_becomes_the_utc_instant(spark: SparkSession) -> None:
    actual_df = _convert(spark, "io.debezium.time.Timestamp", "long", LongType(), [1704103872123])

    expected_df = _typed_df(spark, TimestampType(), [_utc("2024-01-01 10:11:12.123000")])
    assert_df_equality(actual_df, expected_df)


def test_nano_timestamp_floors_to_the_microsecond_exactly(spark: SparkSession) -> None:
    # 1704103872123024000 is not a double: dividing it as one lands a microsecond early.
    raw = [1704103872123024000, 1704103872123456789, -1]

    actual_df = _convert(spark, "io.debezium.time.NanoTimestamp", "long", LongType(), raw)

    expected_df = _typed_df(spark, TimestampType(), [
        _utc("2024-01-01 10:11:12.123024"),
        _utc("2024-01-01 10:11:12.123456"),
        _utc("1969-12-31 23:59:59.999999"),
    ])
    assert_df_equality(actual_df, expected_df)
    micros = [r[0] for r in actual_df.select(F.unix_micros("v")).orderBy("id").collect()]
    assert micros == [1704103872123024, 1704103872123456, -1]


def test_zoned_timestamp_iso_string_becomes_its_instant(spark: SparkSession) -> None:
    raw = ["2024-01-01T10:11:12.123456Z", "2024-01-01T12:11:12.123456+02:00"]

    actual_df = _convert(spark, "io.debezium.time.ZonedTimestamp", "string", StringType(), raw)

    instant = _utc("2024-01-01 10:11:12.123456")
    expected_df = _typed_df(spark, TimestampType(), [instant, instant])
    assert_df_equality(actual_df, expected_df)


def _convert_pg(connect_name: str, value_type: DataType, values: list[Any], spark: SparkSession) -> DataFrame:
    return with_debezium_types(_typed_df(spark, value_type, values), _fields(connect_name, "string"), "{}",
                               POSTGRESQL)


def test_isostring_dates_become_dates_with_infinity_clamped(spark: SparkSession) -> None:
    # infinity and -infinity as the snapshot sends them, then as streamed changes do
    raw = ["2024-02-29Z", "1900-01-01Z", "0001-01-01Z", "+292278994-08-16Z", "+292269055-12-02Z",
           "-5877611-06-21Z", "-5877611-06-22Z", None]

    actual_df = _convert_pg("io.debezium.time.IsoDate", StringType(), raw, spark)

    expected_df = _typed_df(spark, DateType(), [date(2024, 2, 29), date(1900, 1, 1), date(1, 1, 1),
                                                date(9999, 12, 31), date(1, 1, 1), date(9999, 12, 31),
                                                date(1, 1, 1), None])
    assert_df_equality(actual_df, expected_df)


def test_isostring_dates_past_year_9999_keep_their_day(spark: SparkSession) -> None:
    """PostgreSQL dates reach 5874897 AD: such a day is the one its ISO text says (as the other modes' day counts
    give it), and text beyond any Spark date (no PostgreSQL date is) becomes NULL instead of failing the batch."""
    raw = ["+300000-01-01Z", "+292278994-08-17Z"]

    actual_df = _convert_pg("io.debezium.time.IsoDate", StringType(), raw, spark)

    days = [r[0] for r in actual_df.select(F.datediff("v", F.lit("1970-01-01").cast("date"))).orderBy("id").collect()]
    assert days[0] == 108853222  # 1970-01-01 to 300000-01-01, proleptic Gregorian
    assert days[1] is None  # beyond any Spark date: NULL, not an exception


def test_isostring_timestamps_keep_their_micros_in_any_session_zone(spark: SparkSession, session_zone: str) -> None:
    raw = ["2024-02-29T12:34:56.123456Z", "1969-12-31T23:59:59.999Z", "1900-01-01T00:00:00Z",
           "+294247-01-10T04:00:25.2Z", "-290308-12-21T19:59:27.6Z", None]

    actual_df = _convert_pg("io.debezium.time.IsoTimestamp", StringType(), raw, spark)

    assert actual_df.schema["v"].dataType == TimestampType()
    micros = [r[0] for r in actual_df.select(F.unix_micros("v")).orderBy("id").collect()]
    assert micros == [1709210096123456, -1000, -2208988800000000, MAX_TIMESTAMP_MICROS, MIN_TIMESTAMP_MICROS,
                      None], session_zone


def test_isostring_times_become_the_time_of_day_text(spark: SparkSession) -> None:
    raw = ["00:00:00Z", "12:34:56.789Z", "23:59:59.999999Z", "07:08:09.1Z", "01:02:03.123456000Z", None]

    actual_df = _convert_pg("io.debezium.time.IsoTime", StringType(), raw, spark)

    expected_df = _typed_df(spark, StringType(), ["00:00:00.000000", "12:34:56.789000", "23:59:59.999999",
                                                  "07:08:09.100000", "01:02:03.123456", None])
    assert_df_equality(actual_df, expected_df)


def test_isostring_names_stay_text_for_other_connectors(spark: SparkSession) -> None:
    input_df = _typed_df(spark, StringType(), ["2024-02-29Z"])

    for connector in (MYSQL, SQLSERVER, None):
        actual_df = with_debezium_types(input_df, _fields("io.debezium.time.IsoDate", "string"), "{}", connector)
        assert_df_equality(actual_df, input_df)


def test_null_semantic_value_stays_null(spark: SparkSession) -> None:
    actual_df = _convert(
        spark, "io.debezium.time.MicroTimestamp", "long", LongType(), [None, 1704103872123456]
    )

    expected_df = _typed_df(spark, TimestampType(), [None, _utc("2024-01-01 10:11:12.123456")])
    assert_df_equality(actual_df, expected_df)


def test_column_without_connect_name_passes_unchanged(spark: SparkSession) -> None:
    input_df = _typed_df(spark, LongType(), [1704103872123456, None])

    plain_df = with_debezium_types(input_df, _fields(None, "long"))
    unknown_df = with_debezium_types(input_df, _fields("io.debezium.data.SomethingNew", "long"))

    assert_df_equality(plain_df, input_df)
    assert_df_equality(unknown_df, input_df)


# ---- ordering within a batch -----------------------------------------------------------------------------


def _unwrapped(key: int, lsn: int, offset: int, op: str = "u") -> tuple[Any, ...]:
    deleted = op == "d"
    return (key, None if deleted else f"k{key}@{lsn}", op, pos(lsn), TS_MS, 0, offset, deleted, [])


# Out of offset order: key 1 by LSN, key 2 tied on LSN (offset breaks it), key 3 ends in a delete.
EVENTS = [
    _unwrapped(1, 30, 5),
    _unwrapped(1, 20, 6),
    _unwrapped(1, 10, 7),
    _unwrapped(2, 40, 8),
    _unwrapped(2, 40, 9),
    _unwrapped(3, 50, 10, "c"),
    _unwrapped(3, 60, 11, "d"),
]
LATEST = {(1, 5), (2, 9), (3, 11)}


def test_dedupe_latest_keeps_one_row_per_key(spark: SparkSession) -> None:
    events_df = spark.createDataFrame(EVENTS, UNWRAPPED_SCHEMA)

    actual_df = events_df.transform(dedupe_latest, ["id"])

    expected_df = spark.createDataFrame(
        [_unwrapped(1, 30, 5), _unwrapped(2, 40, 9), _unwrapped(3, 60, 11, "d")], UNWRAPPED_SCHEMA
    )
    assert_df_equality(actual_df, expected_df, ignore_row_order=True)


def test_with_latest_flag_flags_the_latest_event_of_each_key(spark: SparkSession) -> None:
    events_df = spark.createDataFrame(EVENTS, UNWRAPPED_SCHEMA)

    actual_df = events_df.transform(with_latest_flag, ["id"])

    expected_df = spark.createDataFrame(
        [(*e, (e[0], e[6]) in LATEST) for e in EVENTS], FLAGGED_SCHEMA
    )
    assert_df_equality(actual_df, expected_df, ignore_row_order=True)


def test_dedupe_latest_on_a_composite_key(spark: SparkSession) -> None:
    # The same id under two tenants is two records; (tenant, id) decides.
    events_df = spark.createDataFrame(
        [
            ("a", *_unwrapped(1, 20, 3)),
            ("a", *_unwrapped(1, 10, 4)),
            ("b", *_unwrapped(1, 15, 5)),
            ("b", *_unwrapped(1, 25, 2, "d")),
            ("b", *_unwrapped(2, 5, 6)),
        ],
        COMPOSITE_SCHEMA,
    )

    actual_df = events_df.transform(dedupe_latest, ["tenant", "id"])

    expected_df = spark.createDataFrame(
        [("a", *_unwrapped(1, 20, 3)), ("b", *_unwrapped(1, 25, 2, "d")), ("b", *_unwrapped(2, 5, 6))],
        COMPOSITE_SCHEMA,
    )
    assert_df_equality(actual_df, expected_df, ignore_row_order=True)


# ---- events the job cannot apply: `_cdc_error` (app/cdc/unwrap.py with_event_errors) ----------------------

KEYED_SCHEMA = StructType([
    StructField("key", BinaryType(), True),
    StructField("key_frame_error", StringType(), True),
    StructField("key_id_type", StringType(), True),
    StructField("key_schema_id", LongType(), True),
    *EVENT_SCHEMA.fields,
    StructField(ERROR_COL, StructType([
        StructField("kind", StringType(), True), StructField("message", StringType(), True),
    ]), True),
])
KEY_BYTES = b"\x00\x00\x00\x00\x05key"


def _keyed(event: tuple[Any, ...], key: bytes | None = KEY_BYTES, key_error: str | None = None,
           key_id: int = 5, error: tuple[str, str] | None = None) -> tuple[Any, ...]:
    return (key, key_error, "contentId", key_id if key is not None else None, *event, error)


def _kinds(df: DataFrame) -> list[tuple[int, str | None]]:
    return [(r["offset"], r[ERROR_COL] and r[ERROR_COL]["kind"]) for r in df.orderBy("offset").collect()]


def test_event_errors_name_ops_images_and_keys_the_job_cannot_apply(spark: SparkSession) -> None:
    rows = [
        _keyed(_event("c", None, (1, "alice"), 100, 1)),
        _keyed(_event("x", None, (1, "alice"), 110, 2)),  # no Debezium op
        _keyed(_event("u", (1, "alice"), None, 120, 3)),  # update without after
        _keyed(_event("d", None, None, 130, 4)),  # delete without before
        _keyed(_event("c", None, (2, "bob"), 140, 5), key=None),  # no Kafka key
        _keyed(_event("c", None, (3, "carol"), 150, 6), key=b"{}", key_error="lacks the 0x00 + 4-byte id prefix"),
        _keyed(_event("c", None, (4, "dan"), 160, 7), key_id=9),  # a refused key schema
        _keyed(_event("t", None, None, 170, 8), key=None),  # a truncate: no key needed, skipped
        _keyed(_event("c", None, (5, "eve"), 180, 9), error=("decode", "the body")),  # the decode's error stays
    ]
    keys = KeyCheck(required=True, refused={("contentId", 9): "key schema contentId:9 has fields ['id', 'x']"})

    checked_df = spark.createDataFrame(rows, KEYED_SCHEMA).transform(with_event_errors, True, keys)

    assert _kinds(checked_df) == [
        (1, None), (2, UNKNOWN_OP), (3, NULL_IMAGE), (4, NULL_IMAGE), (5, MISSING_KEY), (6, KEY_FRAMING),
        (7, KEY_SCHEMA), (8, None), (9, "decode"),
    ]
    # The op filter keeps every event in error (for the dead letters) and drops the truncate.
    assert [o for o, _ in _kinds(checked_df.transform(filter_data_changes))] == [1, 2, 3, 4, 5, 6, 7, 9]


def test_keys_are_not_checked_when_the_record_key_is_configured(spark: SparkSession) -> None:
    rows = [_keyed(_event("c", None, (2, "bob"), 140, 5), key=None)]

    checked_df = spark.createDataFrame(rows, KEYED_SCHEMA).transform(with_event_errors, True, KeyCheck())

    assert _kinds(checked_df) == [(5, None)]


KEYS_SCHEMA = StructType([
    StructField("_kafka_offset", LongType(), True),
    StructField("_cdc_op", StringType(), True),
    StructField("code", StringType(), True),
    StructField("raw", BinaryType(), True),
    StructField("n", IntegerType(), True),
    StructField(ERROR_COL, KEYED_SCHEMA[ERROR_COL].dataType, True),
])


@pytest.mark.parametrize("key", [("code",), ("raw",), ("n",), ("code", "raw", "n")])
def test_a_key_hudi_cannot_store_is_an_error(spark: SparkSession, key: tuple[str, ...]) -> None:
    """Hudi's key generators refuse a key that is null or empty in every column (its whole write would fail): such
    a data change is an `empty_key` error; a key empty in some columns only is stored (Hudi writes `__empty__`)."""
    rows = [
        (1, "c", "", b"", None, None),
        (2, "u", "", b"", None, None),
        (3, "d", None, None, None, None),
        (4, "c", "a", b"\x00", 0, None),
        (5, "c", " ", b"\x00\x00", -1, None),
        (6, "t", None, None, None, None),  # a truncate has no key
        (7, "c", "", b"", None, ("decode", "the body")),  # an earlier error stays
        (8, "r", "", b"x", None, None),  # empty in some of the columns
    ]

    checked_df = spark.createDataFrame(rows, KEYS_SCHEMA).transform(with_key_errors, list(key))

    kinds = {r["_kafka_offset"]: r[ERROR_COL] and r[ERROR_COL]["kind"] for r in checked_df.collect()}
    composite = len(key) > 1
    assert kinds == {1: EMPTY_KEY, 2: EMPTY_KEY, 3: EMPTY_KEY, 4: None, 5: None, 6: None, 7: "decode",
                     8: None if composite or key == ("raw",) else EMPTY_KEY}
    first = checked_df.filter(F.col("_kafka_offset") == 1).first()
    assert first is not None
    assert f"record key ({', '.join(key)}) is null or empty in every column" in first[ERROR_COL]["message"]


def test_an_event_in_error_neither_orders_nor_hides_its_keys_latest_event(spark: SparkSession) -> None:
    """A later event of the same key still applies; the event in error is never the latest."""
    rows = [
        _keyed(_event("c", None, (1, "alice"), 100, 1)),
        _keyed(_event("u", (1, "alice"), (1, "alicia"), 300, 3), error=("trailing_bytes", "x")),  # highest LSN
        _keyed(_event("u", (1, "alice"), (1, "ali"), 200, 2)),
    ]
    unwrapped_df = (
        spark.createDataFrame(rows, KEYED_SCHEMA)
        .transform(with_event_errors, True, KeyCheck(required=True))
        .transform(filter_data_changes)
        .transform(unwrap_envelope, VALUE_COLUMNS, POSTGRESQL)
    )

    flagged = {(r["_kafka_offset"], r["_cdc_is_latest"]) for r in with_latest_flag(unwrapped_df, ["id"]).collect()}

    assert flagged == {(1, False), (2, True), (3, False)}
