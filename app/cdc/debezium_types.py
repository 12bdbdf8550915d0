"""Debezium's column encodings to faithful Spark types, read off the writer schema.

Debezium tags semantic types with a `connect.name` on plain Avro ints, longs, strings and bytes; only Kafka
Connect's own Decimal, Date, Time and Timestamp carry Avro logical types. Two steps use this module:

- `reader_schema` (before `from_avro`): logical types are stripped, so spark-avro hands over the raw ints,
  longs and bytes and every conversion happens here, once, in one place. Decimals of at most 38 digits keep
  theirs (spark-avro reads them into an exact Spark decimal).
- `with_debezium_types` (after unwrap): each value column, and each element of an array column, becomes its
  Spark type by the table in docs/type-mappings.md. Value-changing edge cases are listed there per type; the
  ones this module decides:
    * PostgreSQL `infinity`/`-infinity` dates and timestamps arrive as sentinel numbers (Debezium passes the
      JDBC driver's constants, or an overflowed day count). They become the largest/smallest Spark value,
      9999-12-31 (23:59:59.999999) and 0001-01-01 (00:00:00), which sort where infinity does.
    * A time of day becomes the string `HH:MM:SS.ffffff` (Spark has no time type; PostgreSQL's `24:00:00`
      stays `24:00:00.000000`). `timetz` stays Debezium's UTC-normalised ISO string.
    * `time.precision.mode=isostring` (PostgreSQL): the ISO text of a date, time or timestamp becomes the type
      the other modes give it, infinity included.
    * Numbers Spark's decimal cannot hold (over 38 digits, or NUMERIC without a scale) become their exact
      decimal text, decoded in the JVM by `io.cdclake.CdcValues` (jvm/): Spark SQL has no function from
      arbitrary-length two's-complement bytes to a number.
    * `MicroDuration` intervals become the text of a Spark `interval day to second` (Debezium counts a month
      as 30.4375 days); Spark cannot store intervals in Parquet. `Interval` (string mode) stays ISO 8601.

No Python runs per row: every conversion is a Spark expression or a JVM static method called by `reflect`.
"""
from __future__ import annotations

import copy
import json
from collections.abc import Callable, Sequence
from typing import Any, Final

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from app.cdc.position import MYSQL, POSTGRESQL
from app.cdc.unwrap import UNAVAILABLE_PLACEHOLDER, PlaceholderTest

Conversion = Callable[[Column], Column]

JVM_VALUES: Final = "io.cdclake.CdcValues"  # jvm/src/main/java/io/cdclake/CdcValues.java
SPARK_MAX_DECIMAL_DIGITS: Final = 38

# PostgreSQL infinity, as Debezium 3.2 sends it (checked against the real connector, docs/type-mappings.md).
DATE_INFINITY_DAYS: Final = (-622191234, -2147472692)  # snapshot, streaming
DATE_MINUS_INFINITY_DAYS: Final = (-625821272, -2147472691)
# PgJDBC's DATE_POSITIVE/NEGATIVE_INFINITY (9223372036825200000, -9223372036832400000) read as microseconds by
# Debezium: in millisecond fields they arrive divided by 1000, in microsecond fields as they are.
TIMESTAMP_INFINITY_MS: Final = 9223372036825200
TIMESTAMP_MINUS_INFINITY_MS: Final = -9223372036832400
ZONED_INFINITY: Final = ("infinity",)
# Inside timestamptz[] Debezium renders -infinity through java.time's minimum: "+292269055-12-02T23:00:00..."
ZONED_MINUS_INFINITY: Final = ("-infinity", "+292269055-12-02T23:00:00.000000Z")
# time.precision.mode=isostring renders the same sentinels as ISO text (checked against the real connector): a
# date's infinities in the snapshot (and in arrays) as the dates of Long.MAX_VALUE and Long.MIN_VALUE milliseconds
# (the latter prints a positive year), streamed as the dates of the day counts above; a timestamp's as PgJDBC's
# constants read as microseconds, in both.
ISO_DATE_INFINITY: Final = ("+292278994-08-16Z", "-5877611-06-21Z")  # snapshot, streaming
ISO_DATE_MINUS_INFINITY: Final = ("+292269055-12-02Z", "-5877611-06-22Z")
ISO_TIMESTAMP_INFINITY: Final = ("+294247-01-10T04:00:25.2Z",)
ISO_TIMESTAMP_MINUS_INFINITY: Final = ("-290308-12-21T19:59:27.6Z",)

MAX_DATE: Final = "9999-12-31"
MIN_DATE: Final = "0001-01-01"
MAX_TIMESTAMP_MICROS: Final = 253402300799999999  # 9999-12-31 23:59:59.999999 UTC
MIN_TIMESTAMP_MICROS: Final = -62135596800000000  # 0001-01-01 00:00:00 UTC

_STRIPPED_LOGICAL_TYPES: Final = frozenset({
    "date", "time-millis", "time-micros", "timestamp-millis", "timestamp-micros",
    "local-timestamp-millis", "local-timestamp-micros",
})


# ---- schema: what from_avro decodes --------------------------------------------------------------------


def reader_schema(writer_schema_json: str) -> str:
    """The writer schema with the logical types whose raw value this module converts itself stripped.

    The binary encoding does not depend on logical types, so the stripped schema reads the same bytes.
    """
    schema = copy.deepcopy(json.loads(writer_schema_json))

    def strip(node: Any) -> None:
        if isinstance(node, list):
            for item in node:
                strip(item)
        elif isinstance(node, dict):
            logical = node.get("logicalType")
            if logical in _STRIPPED_LOGICAL_TYPES or (logical == "decimal" and not _spark_decimal(node)):
                del node["logicalType"]
            for value in node.values():
                strip(value)

    strip(schema)
    return json.dumps(schema)


def named_types(schema_json: str) -> dict[str, dict[str, Any]]:
    """Every named type of a schema by full and short name, to resolve references such as an array of
    `io.debezium.data.VariableScaleDecimal` defined by an earlier column."""
    found: dict[str, dict[str, Any]] = {}

    def walk(node: Any, namespace: str) -> None:
        if isinstance(node, list):
            for item in node:
                walk(item, namespace)
        elif isinstance(node, dict):
            name = node.get("name")
            if node.get("type") in ("record", "enum", "fixed") and isinstance(name, str):
                ns = node.get("namespace", namespace)
                full = name if "." in name else f"{ns}.{name}" if ns else name
                found[full] = node
                found.setdefault(full.rsplit(".", 1)[-1], node)
                namespace = full.rsplit(".", 1)[0] if "." in full else namespace
            for key in ("type", "items", "values", "fields"):
                if key in node:
                    walk(node[key], namespace)

    walk(json.loads(schema_json), "")
    return found


# ---- conversions ---------------------------------------------------------------------------------------


def _spark_decimal(node: dict[str, Any]) -> bool:
    """A decimal spark-avro reads exactly: a declared precision of at most 38 digits."""
    declared = node.get("connect.parameters", {}).get("connect.decimal.precision")
    if declared is None:
        return False
    # PostgreSQL 15 allows numeric(3,5) and numeric(5,-2), which Avro and Spark do not: the exact text then.
    scale = int(node.get("connect.parameters", {}).get("scale", node.get("scale", 0)))
    return 0 <= scale <= int(declared) <= SPARK_MAX_DECIMAL_DIGITS


def _jvm(method: str, raw: Column, number: Column) -> Column:
    # `reflect` renders a null result as the text "null" and fails on a null int argument: call it for
    # present values only (for which these methods never return null).
    call = F.call_function("reflect", F.lit(JVM_VALUES), F.lit(method), F.hex(raw), number.cast("int"))
    return F.when(raw.isNotNull() & number.isNotNull(), call)


def _decimal_text(unscaled: Column, scale: Column | int) -> Column:
    return _jvm("decimalText", unscaled, scale if isinstance(scale, Column) else F.lit(scale))


def _bits_text(raw: Column, length: int) -> Column:
    return _jvm("bitsText", raw, F.lit(length))


def _clamped_date(day: Column, infinity: Column, minus_infinity: Column) -> Column:
    return (
        F.when(infinity, F.lit(MAX_DATE).cast("date")).when(minus_infinity, F.lit(MIN_DATE).cast("date"))
        .otherwise(day)
    )


def _days_to_date(days: Column) -> Column:
    return _clamped_date(F.date_add(F.lit("1970-01-01").cast("date"), days),
                         days.isin(*DATE_INFINITY_DAYS), days.isin(*DATE_MINUS_INFINITY_DAYS))


def _micros_to_timestamp(micros: Column, infinity: Column, minus_infinity: Column) -> Column:
    return F.timestamp_micros(
        F.when(infinity, F.lit(MAX_TIMESTAMP_MICROS)).when(minus_infinity, F.lit(MIN_TIMESTAMP_MICROS))
        .otherwise(micros)
    )


def _millis_timestamp(ms: Column) -> Column:
    return _micros_to_timestamp(
        ms.cast("long") * 1000, ms == TIMESTAMP_INFINITY_MS, ms == TIMESTAMP_MINUS_INFINITY_MS
    )


def _micros_timestamp(us: Column) -> Column:
    return _micros_to_timestamp(
        us, us == TIMESTAMP_INFINITY_MS * 1000, us == TIMESTAMP_MINUS_INFINITY_MS * 1000
    )


def _nanos_timestamp(ns: Column) -> Column:
    # `/` on a long divides as a double, off by up to ~128 ns at today's epoch: divide exactly in decimal.
    # (No PostgreSQL infinity here: the connector does not use NanoTimestamp for PostgreSQL.)
    return F.timestamp_micros(F.floor(ns.cast("decimal(20,0)") / 1000).cast("long"))


def _text_timestamp(text: Column, infinity: tuple[str, ...], minus_infinity: tuple[str, ...]) -> Column:
    """ISO text naming its instant (an offset or `Z`) as a timestamp, the texts of infinity clamped."""
    return _micros_to_timestamp(F.unix_micros(F.to_timestamp(text)), text.isin(*infinity), text.isin(*minus_infinity))


def _zoned_timestamp(text: Column) -> Column:
    return _text_timestamp(text, ZONED_INFINITY, ZONED_MINUS_INFINITY)


def _iso_date(text: Column) -> Column:
    """isostring's `yyyy-MM-ddZ` as a date (the day as written; the `Z` says nothing for a date)."""
    # A cast, not to_date: to_date parses through microseconds, and a year past ~290,000 overflows and fails the
    # task; the cast takes any year a Spark date holds (PostgreSQL's reach to 5874897 AD) and never throws.
    return _clamped_date(F.regexp_replace(text, "Z$", "").cast("date"),
                         text.isin(*ISO_DATE_INFINITY), text.isin(*ISO_DATE_MINUS_INFINITY))


def _iso_timestamp(text: Column) -> Column:
    """isostring's `yyyy-MM-ddTHH:mm:ss[.f]Z` of a timestamp without time zone: its wall-clock time as UTC, as
    MicroTimestamp's microseconds are."""
    return _text_timestamp(text, ISO_TIMESTAMP_INFINITY, ISO_TIMESTAMP_MINUS_INFINITY)


def _iso_time(text: Column) -> Column:
    """isostring's `HH:mm:ss[.f]Z` as `HH:MM:SS.ffffff` (the connector has already read 24:00:00 as 00:00:00;
    PostgreSQL holds microseconds, so digits past the sixth, which java.time could print, are zeros)."""
    parts = r"^(\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?Z$"
    fraction = F.rpad(F.substring(F.regexp_extract(text, parts, 2), 1, 6), 6, "0")
    return F.when(text.rlike(parts), F.concat(F.regexp_extract(text, parts, 1), F.lit("."), fraction))


def _time_of_day(micros: Column) -> Column:
    """`HH:MM:SS.ffffff` from microseconds past midnight, by arithmetic (24:00:00 included)."""
    us = micros.cast("long")
    return F.when(us.isNotNull(), F.format_string(
        "%02d:%02d:%02d.%06d",
        F.floor(us / 3_600_000_000).cast("long"),
        F.floor(us / 60_000_000).cast("long") % 60,
        F.floor(us / 1_000_000).cast("long") % 60,
        us % 1_000_000,
    ))


def _duration(micros: Column) -> Column:
    """Spark's interval literal text, e.g. `INTERVAL '429 04:05:06.789' DAY TO SECOND`, from microseconds.

    Exact, self-describing and `cast(... as interval day to second)` reads it back; Spark cannot store the
    interval type itself in Parquet ("Cannot save interval data type into external storage").
    """
    interval = F.make_dt_interval(
        F.lit(0), F.lit(0), F.lit(0), (micros.cast("decimal(24,0)") / 1_000_000).cast("decimal(18,6)")
    )
    return interval.cast("string")


_BY_CONNECT_NAME: dict[str, Conversion] = {
    "io.debezium.time.Date": _days_to_date,
    "org.apache.kafka.connect.data.Date": _days_to_date,
    "io.debezium.time.Timestamp": _millis_timestamp,
    "org.apache.kafka.connect.data.Timestamp": _millis_timestamp,
    "io.debezium.time.MicroTimestamp": _micros_timestamp,
    "io.debezium.time.NanoTimestamp": _nanos_timestamp,
    "io.debezium.time.ZonedTimestamp": _zoned_timestamp,
    "io.debezium.time.Time": lambda c: _time_of_day(c.cast("long") * 1000),
    "org.apache.kafka.connect.data.Time": lambda c: _time_of_day(c.cast("long") * 1000),
    "io.debezium.time.MicroTime": _time_of_day,
    "io.debezium.time.NanoTime": lambda c: _time_of_day(F.floor(c / 1000)),
    "io.debezium.time.MicroDuration": _duration,
    "io.debezium.data.VariableScaleDecimal": lambda c: _decimal_text(c["value"], c["scale"]),
}


# time.precision.mode=isostring (PostgreSQL): the same Spark types as the other modes. Not given to MySQL/MariaDB,
# where the mode is not checked (their TIME is an elapsed time, not a time of day) and the text stays as sent.
_POSTGRESQL_CONNECT_NAMES: dict[str, Conversion] = {
    **_BY_CONNECT_NAME,
    "io.debezium.time.IsoDate": _iso_date,
    "io.debezium.time.IsoTimestamp": _iso_timestamp,
    "io.debezium.time.IsoTime": _iso_time,
}


# MySQL/MariaDB TIME spans -838:59:59.999999 to 838:59:59.999999: an elapsed time, not a time of day. Whatever
# the time.precision.mode, it becomes the interval text PostgreSQL's interval gets (connect mode's milliseconds
# cover only 00:00:00 to 23:59:59.999; the connector sends NULL for other values).
_MYSQL_CONNECT_NAMES: dict[str, Conversion] = {
    **_BY_CONNECT_NAME,
    "io.debezium.time.MicroTime": _duration,
    "io.debezium.time.Time": lambda c: _duration(c.cast("long") * 1000),
    "org.apache.kafka.connect.data.Time": lambda c: _duration(c.cast("long") * 1000),
}


_CONNECT_NAMES: dict[str, dict[str, Conversion]] = {MYSQL: _MYSQL_CONNECT_NAMES, POSTGRESQL: _POSTGRESQL_CONNECT_NAMES}


def conversion(
    avro_type: Any, named: dict[str, dict[str, Any]] | None = None, connector: str | None = None
) -> Conversion | None:
    """The Spark expression turning a decoded value of `avro_type` into its Silver type; None: as decoded.
    `connector` (app/cdc/position.py kinds) picks what a connect name means where connectors differ."""
    named = named or {}
    node = _resolve(_non_null(avro_type), named)
    if not isinstance(node, dict):
        return None
    if node.get("type") == "array":
        inner = conversion(node["items"], named, connector)
        return (lambda c: F.transform(c, inner)) if inner is not None else None
    connect_name = node.get("connect.name")
    if connect_name == "org.apache.kafka.connect.data.Decimal" and not _spark_decimal(node):
        scale = int(node.get("connect.parameters", {}).get("scale", node.get("scale", 0)))
        if "connect.decimal.precision" in node.get("connect.parameters", {}):
            return lambda c: _decimal_text(c, scale)  # over 38 digits (or a scale Spark refuses): the exact text
        # No declared precision (PostgreSQL money): every value fits 38 digits.
        return lambda c: _decimal_text(c, scale).cast(f"decimal({SPARK_MAX_DECIMAL_DIGITS},{scale})")
    if connect_name == "io.debezium.data.Bits":
        # 0 (absent) or a huge length: an unbounded varbit, rendered without padding (CdcValues.bitsText).
        length = int(node.get("connect.parameters", {}).get("length", 0))
        return lambda c: _bits_text(c, length)
    return _CONNECT_NAMES.get(connector or "", _BY_CONNECT_NAME).get(connect_name or "")


def with_debezium_types(
    df: DataFrame, value_fields: Sequence[dict[str, Any]], schema_json: str = "{}", connector: str | None = None
) -> DataFrame:
    """Map each value column to its Spark type; other columns pass through in place.

    Args:
        value_fields: the Avro fields of the envelope's Value record.
        schema_json: the whole writer schema, to resolve named types that fields refer to.
        connector: the connector kind (app/cdc/position.py), where a connect name means different things.
    """
    named = named_types(schema_json)
    converted = {}
    for field in value_fields:
        convert = conversion(field["type"], named, connector)
        if convert is not None:
            converted[field["name"]] = convert(F.col(field["name"])).alias(field["name"])
    return df.select(*[converted.get(c, F.col(c)) for c in df.columns])


# ---- TOAST placeholders --------------------------------------------------------------------------------

_PLACEHOLDER_BYTES: Final = UNAVAILABLE_PLACEHOLDER.encode("ascii")


def placeholder_test(avro_type: Any, named: dict[str, dict[str, Any]] | None = None) -> PlaceholderTest | None:
    """How Debezium marks an unchanged TOASTed value of this type (checked with the real connector):

        text, varchar, json(b), xml, hstore, ...   the string "__debezium_unavailable_value"
        bytea                                      that string's bytes
        text[] (string arrays)                     a one-element array holding that string
        int[], bigint[], smallint[]                an array of that string's byte values
    """
    node = _resolve(_non_null(avro_type), named or {})
    kind = node.get("type") if isinstance(node, dict) else node
    if kind == "string":
        return lambda c: c == F.lit(UNAVAILABLE_PLACEHOLDER)
    if kind == "bytes" and not (isinstance(node, dict) and node.get("connect.name")):
        return lambda c: c == F.lit(_PLACEHOLDER_BYTES)
    if kind == "array":
        item = _resolve(_non_null(node["items"]), named or {})
        item_kind = item.get("type") if isinstance(item, dict) else item
        if item_kind == "string":
            return lambda c: (F.size(c) == 1) & (c[0] == F.lit(UNAVAILABLE_PLACEHOLDER))
        if item_kind in ("int", "long") and not (isinstance(item, dict) and item.get("connect.name")):
            codes = F.array(*[F.lit(b).cast(item_kind if item_kind == "int" else "long") for b in _PLACEHOLDER_BYTES])
            return lambda c: c == codes
    return None


def placeholder_tests(value_fields: Sequence[dict[str, Any]], schema_json: str = "{}") -> dict[str, PlaceholderTest]:
    """Per column that can carry Debezium's unavailable-value placeholder, the test for it."""
    named = named_types(schema_json)
    tests = {}
    for field in value_fields:
        test = placeholder_test(field["type"], named)
        if test is not None:
            tests[field["name"]] = test
    return tests


# Where the project's Kafka Connect SMT (jvm/ io.cdclake.connect.DefaultsAsParameters) moves an optional column's
# default, so that the converter writes a NULL as NULL; the Avro schema carries it under `connect.parameters`.
MOVED_DEFAULT: Final = "cdclake.default"


def declares_default(field: dict[str, Any]) -> bool:
    """Whether the writer schema says the column has a default: an Avro field default, or one the connector's
    DefaultsAsParameters moved into the column type's `connect.parameters`."""
    if field.get("default") is not None:
        return True
    node = _non_null(field["type"])
    return isinstance(node, dict) and MOVED_DEFAULT in node.get("connect.parameters", {})


def _non_null(avro_type: Any) -> Any:
    if isinstance(avro_type, list):
        branches = [t for t in avro_type if t != "null"]
        return branches[0] if len(branches) == 1 else avro_type
    return avro_type


def _resolve(node: Any, named: dict[str, dict[str, Any]]) -> Any:
    if isinstance(node, str) and node in named:
        return named[node]
    if isinstance(node, dict) and isinstance(node.get("type"), (dict, str)) and node["type"] in named:
        return named[node["type"]]
    return node
