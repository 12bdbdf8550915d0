"""Every PostgreSQL column type, through the real Debezium connector in each of its modes, equals the source.

One table holds a column of each type and rows of edge values (NULL, NaN, ±Infinity, more than 38 digits,
pre-1970 and infinite dates, intervals with months, arrays holding NULLs). Four connectors capture it, one
per mode combination, into four Silver tables (the connectors are the four sources of one job config, each
with a database of its own, so each phase below is one available-now run writing the four tables in one batch):

    a  decimal.handling.mode=precise  time.precision.mode=adaptive                    interval.handling.mode=numeric
    b  decimal.handling.mode=double   time.precision.mode=adaptive_time_microseconds  interval.handling.mode=string
    c  decimal.handling.mode=string   time.precision.mode=connect                     interval.handling.mode=numeric
    d  as a, with time.precision.mode=isostring, hstore.handling.mode=map and binary.handling.mode=hex

After the snapshot, and again after every row is rewritten by an UPDATE (the merge path, through another
writer than the insert), each Silver table is compared value by value with what PostgreSQL says the value is
(the `expected` SQL per column and mode below: the source value, after the connector's documented loss where
it has one). The run is under TZ=America/Los_Angeles with a Los Angeles session zone.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from app.batch.processor import BatchProcessor
from app.config import JobConfig, LakeConfig, SourceConfig
from app.job import await_query, start_query
from app.wire.registry import RegistryClient
from tests.conftest import RUN_ID
from tests.support.cdc import PG_DSN, debezium_connector, job_config_for, read_topic
from tests.support.pipeline import assert_columns_equal
from tests.support.values import interval_text

pytestmark = [pytest.mark.stack, pytest.mark.slow]

SCHEMA = f"types_{RUN_ID}"
MODES: dict[str, dict[str, str]] = {
    "a": {"decimal.handling.mode": "precise", "time.precision.mode": "adaptive", "interval.handling.mode": "numeric"},
    "b": {"decimal.handling.mode": "double", "time.precision.mode": "adaptive_time_microseconds",
          "interval.handling.mode": "string"},
    "c": {"decimal.handling.mode": "string", "time.precision.mode": "connect", "interval.handling.mode": "numeric"},
    # As a, with temporal values as ISO text, and the two modes that change how hstore and bytea arrive.
    "d": {"decimal.handling.mode": "precise", "time.precision.mode": "isostring", "interval.handling.mode": "numeric",
          "hstore.handling.mode": "map", "binary.handling.mode": "hex"},
}
BASE_MODE = {"d": "a"}  # a mode whose columns are as another's unless they say otherwise

# The enum's name is this module's alone (the others say key_mood, verify_mood): Debezium looks array types up by
# name, so when another module dropped its schema's `mood` while this connector streamed, c_enum_arr's changes
# arrived NULL (docs/type-mappings.md).
DDL = f"""
create extension if not exists postgis;
create extension if not exists hstore;
create extension if not exists citext;
create extension if not exists ltree;
create schema {SCHEMA};
create type {SCHEMA}.mood as enum ('sad', 'ok', 'happy');
create type {SCHEMA}.ty_label as enum ('a,b', 'très', 'x y');
create domain {SCHEMA}.amount as numeric(10,2);
create domain {SCHEMA}.email as text check (value like '%@%');
create domain {SCHEMA}.codes as varchar(5)[];
create table {SCHEMA}.all_types (
  id int primary key,
  c_smallint smallint, c_integer integer, c_bigint bigint, c_real real, c_double double precision,
  c_num10_2 numeric(10,2), c_num50_10 numeric(50,10), c_numeric numeric, c_money money, c_domain {SCHEMA}.amount,
  c_bool boolean, c_char5 char(5), c_varchar20 varchar(20), c_text text,
  c_time0 time(0), c_time3 time(3), c_time6 time(6), c_timetz timetz, c_interval interval,
  c_date date, c_ts0 timestamp(0), c_ts3 timestamp(3), c_ts6 timestamp(6), c_tstz timestamptz,
  c_json json, c_jsonb jsonb, c_xml xml, c_uuid uuid, c_enum {SCHEMA}.mood,
  c_bit1 bit(1), c_bit10 bit(10), c_varbit20 varbit(20), c_bytea bytea,
  c_inet inet, c_cidr cidr, c_macaddr macaddr,
  c_int4range int4range, c_numrange numrange, c_tsrange tsrange, c_tstzrange tstzrange, c_daterange daterange,
  c_hstore hstore, c_geometry geometry, c_geography geography,
  c_int_arr int[], c_text_arr text[], c_num10_2_arr numeric(10,2)[], c_numeric_arr numeric[], c_date_arr date[],
  c_ts_arr timestamp[], c_tstz_arr timestamptz[], c_uuid_arr uuid[], c_jsonb_arr jsonb[], c_bytea_arr bytea[],
  c_enum_arr {SCHEMA}.mood[], c_time_arr time[], c_bool_arr boolean[], c_inet_arr inet[], c_float8_arr float8[],
  c_varchar_arr varchar(10)[],
  c_point point, c_citext citext, c_ltree ltree, c_int8range int8range, c_char_arr char(3)[], c_timetz_arr timetz[],
  c_json_arr json[], c_qchar "char", c_oid oid, c_tsrange_arr tsrange[], c_email {SCHEMA}.email,
  c_codes {SCHEMA}.codes, c_label {SCHEMA}.ty_label, c_label_arr {SCHEMA}.ty_label[], c_cidr_arr cidr[],
  c_macaddr8 macaddr8, c_float4_arr real[], c_bigint_arr bigint[], c_smallint_arr smallint[], c_hstore_arr hstore[],
  c_bit_arr bit(3)[], c_int2vector int2vector
);
"""

# Edge values. Left out on purpose, each a documented connector loss (docs/type-mappings.md): money beyond
# 2^53 cents and money with trailing zeros in string mode (the snapshot reads money through a double),
# timestamps before 1582 (the snapshot reads them in the Julian calendar), NaN/Infinity inside numeric[]
# (the connector nulls the whole array), multi-dimensional arrays (the connector nulls their elements).
ROWS = f"""
set timezone = 'UTC';
insert into {SCHEMA}.all_types values (1,
  32767, 2147483647, 9223372036854775807, 3.14, 3.141592653589793,
  12345678.91, 1234567890123456789012345678901234567890.0123456789, 1.5, 12.34, 1.23,
  true, 'ab', 'hello', 'plain text',
  '00:00:00', '12:34:56.789', '12:34:56.123456', '12:34:56.789+02', '1 year 2 months 3 days 04:05:06.789',
  '2024-02-29', '2024-02-29 12:34:56', '2024-02-29 12:34:56.789', '2024-02-29 12:34:56.123456',
  '2024-02-29 12:34:56.123456+02',
  '{{"a": 1,  "b": [1,2]}}', '{{"a": 1,  "b": [1,2]}}', '<a x="1">t</a>', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
  'happy',
  B'1', B'1000000001', B'101', '\\xdeadbeef',
  '192.168.1.1/24', '10.0.0.0/8', '08:00:2b:01:02:03',
  '[1,10)', '[1.5,2.5]', '[2024-01-01 00:00,2024-12-31 23:59:59.999999)',
  '[2024-01-01 00:00+00,2024-06-01 00:00+02)', '[2024-01-01,2024-02-01)',
  'a=>1, b=>NULL, "c d"=>"e"', ST_GeomFromText('POINT(1 2)', 4326), 'SRID=4326;POINT(-71.06 42.36)',
  '{{1,NULL,3}}', '{{"a",NULL,"b c","NULL"}}', '{{1.5,-2.25,NULL}}',
  '{{1.5,-0.000001,123456789012345678901234567890,NULL}}',
  '{{2024-01-01,NULL,1900-01-01,infinity,-infinity}}',
  '{{"2024-01-01 12:00:00.123456",NULL,"1900-01-01 00:00:00",infinity,-infinity}}',
  '{{"2024-01-01 12:00:00+02",NULL,infinity,-infinity}}',
  '{{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11,NULL}}',
  ARRAY['{{"a":1}}'::jsonb, NULL, '[1, 2]'::jsonb], ARRAY['\\xdead'::bytea, NULL, '\\x'::bytea],
  '{{sad,happy}}', '{{12:34:56.123456,NULL,24:00:00}}', '{{true,NULL,false}}', '{{10.0.0.1,NULL,::1/128}}',
  '{{1.5,NULL,NaN,Infinity,-Infinity}}', '{{a,NULL,"b c"}}');
insert into {SCHEMA}.all_types values (2,
  -32768, -2147483648, -9223372036854775808, 'NaN', 'NaN',
  -0.01, -1234567890123456789012345678901234567890.0123456789, -0.000001, -1234.56, -99999999.99,
  false, 'abcde', '', E'with ''quotes''\\nnewline',
  '23:59:59', '24:00:00', '24:00:00', '00:00:00-08', '-1 year -2 months -3 days -04:05:06.789',
  '1900-01-01', '1900-01-01 00:00:00', '1969-12-31 23:59:59.999', '1900-01-01 00:00:00.000001',
  '1900-01-01 00:00:00+00',
  '[]', '[]', '<r/>', '00000000-0000-0000-0000-000000000000', 'sad',
  B'0', B'1100000000', B'', '\\x',
  '::1', '2001:db8::/32', 'ff:ff:ff:ff:ff:ff',
  'empty', 'empty', '(,infinity)', '(,)', '[2024-01-01,2024-01-01]',
  '', ST_GeomFromText('LINESTRING(0 0,1 1,2 1)'), 'POINT(0 0)',
  '{{}}', '{{}}', '{{}}', '{{-1}}', '{{}}', '{{}}', '{{}}', '{{}}', '{{}}', '{{}}', '{{}}',
  '{{}}', '{{}}', '{{}}', '{{}}', '{{}}');
insert into {SCHEMA}.all_types (id, c_real, c_double, c_numeric, c_num10_2, c_num50_10, c_money, c_time0, c_time3,
  c_time6, c_timetz, c_interval, c_date, c_ts0, c_ts3, c_ts6, c_tstz, c_json, c_jsonb, c_bit10, c_varbit20, c_bytea,
  c_inet, c_int4range, c_text_arr)
values (3, 'Infinity', 'Infinity', 123456789012345678901234567890123456789012345, 0, 0.0000000001, 0.01,
  '24:00:00', '23:59:59.999', '23:59:59.999999', '23:59:59.999999+00', '-1 mons', '0001-01-01', '1969-12-31 23:59:59',
  '1969-12-31 23:59:59.999', '1969-12-31 23:59:59.999999', '1969-12-31 23:59:59.999999+00',
  'null', 'null', B'0000000001', B'11111111111111111111', '\\x00ff', '10.0.0.1', '(,5]', '{{"x"}}');
insert into {SCHEMA}.all_types (id, c_real, c_double, c_numeric, c_interval, c_date, c_ts0, c_ts3, c_ts6, c_tstz,
  c_json, c_jsonb, c_varbit20, c_int4range)
values (4, '-Infinity', '-Infinity', 'NaN', '0', 'infinity', 'infinity', 'infinity', 'infinity', 'infinity',
  '"str"', '"str"', B'1000000001', '[3,)');
insert into {SCHEMA}.all_types (id, c_numeric, c_interval, c_date, c_ts0, c_ts3, c_ts6, c_tstz)
values (5, 'Infinity', '100 years', '-infinity', '-infinity', '-infinity', '-infinity', '-infinity');
insert into {SCHEMA}.all_types (id, c_numeric, c_interval, c_date, c_ts6, c_tstz)
values (6, '-Infinity', '1 day 00:00:00.000001', '1970-01-01', '1970-01-01 00:00:00', '1970-01-01 00:00:00+00');
insert into {SCHEMA}.all_types (id) values (9);
update {SCHEMA}.all_types set (c_point, c_citext, c_ltree, c_int8range, c_char_arr, c_timetz_arr, c_json_arr, c_qchar,
  c_oid, c_tsrange_arr, c_email, c_codes, c_label, c_label_arr, c_cidr_arr, c_macaddr8, c_float4_arr, c_bigint_arr,
  c_smallint_arr, c_hstore_arr, c_bit_arr, c_int2vector) = (point(1.5, -2), 'MiXed Case', 'a.b_c.d', '[1,10)',
  '{{ab,NULL,abc}}', '{{12:00+02,NULL,23:59:59.999999-08}}', ARRAY['{{"a": 1}}'::json, NULL, '[]'::json], 'x',
  4294967295, ARRAY['[2024-01-01,2024-02-01)'::tsrange, NULL], 'a@b.c', '{{ab,NULL,""}}', 'a,b', '{{"a,b",très,"x y"}}',
  '{{10.0.0.0/8,NULL,2001:db8::/32}}', '08:00:2b:01:02:03:04:05', '{{1.5,NULL,NaN,-Infinity}}',
  '{{9223372036854775807,NULL,-9223372036854775808}}', '{{32767,NULL,-32768}}', ARRAY['a=>1, b=>NULL'::hstore, NULL],
  '{{101,NULL}}', '1 2') where id = 1;
update {SCHEMA}.all_types set (c_point, c_citext, c_int8range, c_char_arr, c_label, c_label_arr, c_float4_arr,
  c_bit_arr) = (point(0, 0), '', 'empty', '{{}}', 'très', '{{"x y",NULL}}', '{{}}', '{{000}}') where id = 2;
"""

# The update path: every row takes the values of another row (ids rotate), so each type is rewritten by a
# merge in a later batch, and values move between NULL and not-NULL.
COLUMNS_SQL = f"select string_agg(quote_ident(attname), ', ' order by attnum) from pg_attribute " \
    f"where attrelid = '{SCHEMA}.all_types'::regclass and attnum > 1 and not attisdropped"


def _rotate_sql(columns: str) -> str:
    return (
        f"with ids as (select id, lead(id, 1, (select min(id) from {SCHEMA}.all_types)) over (order by id) nxt "
        f"from {SCHEMA}.all_types) "
        f"update {SCHEMA}.all_types t set ({columns}) = (select {columns} from {SCHEMA}.all_types s "
        f"where s.id = ids.nxt) from ids where t.id = ids.id"
    )


# ---- what PostgreSQL says each value is, per connector mode ------------------------------------------------

def _arr(expr: str, column: str) -> str:
    """An array expression over the elements of `column` (NULL array stays NULL, element order kept)."""
    return (f"case when {column} is null then null else array(select {expr} from unnest({column}) "
            f"with ordinality u(x, o) order by o) end")


DATE_SQL = ("case when {c} = 'infinity' then date '9999-12-31' when {c} = '-infinity' then date '0001-01-01' "
            "else {c} end")
MAX_US, MIN_US = 253402300799999999, -62135596800000000


def _micros_sql(c: str, millis: bool = False) -> str:
    exact = f"floor(extract(epoch from {c}) * 1000) * 1000" if millis else f"extract(epoch from {c}) * 1000000"
    return (f"case when {c} = 'infinity' then {MAX_US} when {c} = '-infinity' then {MIN_US} "
            f"else ({exact})::bigint end")


def _time_sql(c: str, millis: bool = False, wrap: bool = False) -> str:
    us = f"(extract(epoch from {c}) * 1000000)::bigint"
    if millis:
        us = f"(floor(extract(epoch from {c}) * 1000) * 1000)::bigint"
    if wrap:  # 24:00:00 read as a java.time.LocalTime: 00:00:00
        us = f"({us} % 86400000000)"
    return (f"lpad((({us}) / 3600000000)::text, 2, '0') || ':' || lpad(((({us}) / 60000000) % 60)::text, 2, '0') "
            f"|| ':' || lpad(((({us}) / 1000000) % 60)::text, 2, '0') || '.' || lpad((({us}) % 1000000)::text, 6, '0')")


INTERVAL_PARTS = ("extract(year from {c})::int, extract(month from {c})::int, extract(day from {c})::int, "
                  "extract(hour from {c})::int, extract(minute from {c})::int, extract(second from {c})")


@dataclasses.dataclass(frozen=True)
class Col:
    """One column: its Spark type and expected-value SQL per mode (a key missing: the `*` entry)."""

    name: str
    types: dict[str, DataType]
    sql: dict[str, str]
    actual: Callable[[Column], Column] | None = None  # normalises the Silver value before comparing
    actual_in: dict[str, Callable[[Column], Column]] = dataclasses.field(default_factory=dict)  # per mode
    both: Callable[[Column], Column] | None = None  # normalises both sides (e.g. JSON key order)
    python: Callable[[Any], Any] | None = None  # turns the fetched expected value into the Spark value

    def type_for(self, mode: str) -> DataType:
        return self.types[_key(self.types, mode)]

    def actual_for(self, mode: str) -> Callable[[Column], Column]:
        return self.actual_in.get(mode) or self.actual or (lambda c: c)

    def sql_for(self, mode: str) -> str:
        return self.sql[_key(self.sql, mode)].format(c=self.name)


def _key(entries: dict[str, Any], mode: str) -> str:
    """The entry for `mode`: its own, else its base mode's (BASE_MODE), else the `*` entry."""
    return next(m for m in (mode, BASE_MODE.get(mode), "*") if m in entries)


def _same(name: str, spark_type: DataType, sql: str = "{c}") -> Col:
    return Col(name, {"*": spark_type}, {"*": sql})


def _ts(name: str, millis_in_c: bool = True, array: bool = False) -> Col:
    if array:
        return Col(name, {"*": ArrayType(LongType())},
                   {"*": _arr(_micros_sql("x"), "{c}"), "c": _arr(_micros_sql("x", millis=True), "{c}")},
                   actual=lambda c: F.transform(c, F.unix_micros))
    return Col(name, {"*": LongType()}, {"*": _micros_sql("{c}"), "c": _micros_sql("{c}", millis=millis_in_c)},
               actual=F.unix_micros)


def _time(name: str) -> Col:
    # isostring: the connector reads 24:00:00 as 00:00:00
    return Col(name, {"*": StringType()},
               {"*": _time_sql("{c}"), "c": _time_sql("{c}", millis=True), "d": _time_sql("{c}", wrap=True)})


def _json_text(c: Column) -> Column:
    """A map as JSON text; one argument, as `F.transform` needs (it passes an index to a function of two)."""
    return F.to_json(c)


def _hstore_entries(c: Column) -> Column:
    return F.array_sort(F.map_entries(F.from_json(c, "map<string,string>")))


def _spark_interval_text(parts: tuple[int, int, int, int, int, Decimal] | None) -> str | None:
    """Debezium's MicroDuration (a month is 30.4375 days) as Spark prints an interval day to second."""
    if parts is None or parts[0] is None:
        return None
    years, months, days, hours, minutes, seconds = parts
    micros = int((Decimal((years * 12 + months)) * Decimal("30.4375") + days) * 86400 * 10**6
                 + (hours * 3600 + minutes * 60) * 10**6 + Decimal(seconds) * 10**6)
    return interval_text(micros)


def _iso_interval_text(parts: tuple[int, int, int, int, int, Decimal] | None) -> str | None:
    """Debezium's string interval mode: ISO 8601 with every field, e.g. P1Y2M3DT4H5M6.789S."""
    if parts is None or parts[0] is None:
        return None
    years, months, days, hours, minutes, seconds = parts
    sec = format(Decimal(seconds).normalize(), "f")
    return f"P{years}Y{months}M{days}DT{hours}H{minutes}M{sec}S"


def _interval_col() -> Col:
    parts = "row(" + INTERVAL_PARTS + ")"
    return Col("c_interval", {"*": StringType()}, {"*": parts}, python=None)


# PostgreSQL's output function for the type (format('%s', NULL) is '', not NULL).
OUTPUT = "case when {c} is null then null else format('%s', {c}) end"

COLUMNS: list[Col] = [
    _same("c_smallint", IntegerType()),
    _same("c_integer", IntegerType()),
    _same("c_bigint", LongType()),
    _same("c_real", FloatType()),
    _same("c_double", DoubleType()),
    Col("c_num10_2", {"a": DecimalType(10, 2), "b": DoubleType(), "c": StringType()},
        {"a": "{c}", "b": "{c}::float8", "c": "{c}::text"}),
    Col("c_num50_10", {"a": StringType(), "b": DoubleType(), "c": StringType()},
        {"a": "{c}::text", "b": "{c}::float8", "c": "{c}::text"}),
    Col("c_numeric", {"a": StringType(), "b": DoubleType(), "c": StringType()}, {
        # precise mode: the connector sends NaN and ±Infinity as null
        "a": "case when {c} in ('NaN', 'Infinity', '-Infinity') then null else {c}::text end",
        "b": "{c}::float8",
        "c": "case {c}::text when 'NaN' then 'NAN' when 'Infinity' then 'POSITIVE_INFINITY' "
             "when '-Infinity' then 'NEGATIVE_INFINITY' else {c}::text end",
    }),
    Col("c_money", {"a": DecimalType(38, 2), "b": DoubleType(), "c": StringType()},
        {"a": "{c}::numeric", "b": "{c}::numeric::float8", "c": "{c}::numeric::text"}),
    Col("c_domain", {"a": DecimalType(10, 2), "b": DoubleType(), "c": StringType()},
        {"a": "{c}", "b": "{c}::float8", "c": "{c}::text"}),
    _same("c_bool", BooleanType()),
    _same("c_char5", StringType(), "case when {c} is null then null else rpad({c}, 5) end"),
    _same("c_varchar20", StringType()),
    _same("c_text", StringType()),
    _time("c_time0"),
    _time("c_time3"),
    _time("c_time6"),
    _same("c_timetz", StringType(), "regexp_replace(({c} at time zone 'UTC')::text, '\\+00$', 'Z')"),
    _interval_col(),
    _same("c_date", DateType(), DATE_SQL),
    _ts("c_ts0"),
    _ts("c_ts3"),
    _ts("c_ts6"),
    Col("c_tstz", {"*": LongType()}, {"*": _micros_sql("{c}")}, actual=F.unix_micros),
    _same("c_json", StringType(), "{c}::text"),
    _same("c_jsonb", StringType(), "{c}::text"),
    _same("c_xml", StringType(), "{c}::text"),
    _same("c_uuid", StringType(), "{c}::text"),
    _same("c_enum", StringType(), "{c}::text"),
    _same("c_bit1", BooleanType(), "{c} = B'1'"),
    _same("c_bit10", StringType(), "{c}::text"),
    # varbit: the connector sends the declared length only; shorter values come back left-padded with zeros
    _same("c_varbit20", StringType(), "lpad({c}::text, 20, '0')"),
    Col("c_bytea", {"*": BinaryType(), "d": StringType()}, {"*": "{c}", "d": "encode({c}, 'hex')"}),
    _same("c_inet", StringType(), OUTPUT),
    _same("c_cidr", StringType(), OUTPUT),
    _same("c_macaddr", StringType(), OUTPUT),
    _same("c_int4range", StringType(), OUTPUT),
    _same("c_numrange", StringType(), OUTPUT),
    _same("c_tsrange", StringType(), OUTPUT),
    _same("c_tstzrange", StringType(), OUTPUT),
    _same("c_daterange", StringType(), OUTPUT),
    Col("c_hstore", {"*": StringType()}, {"*": "hstore_to_json({c})::text"}, both=_hstore_entries,
        actual_in={"d": F.to_json}),
    Col("c_geometry", {"*": StructType([StructField("wkb", BinaryType()), StructField("srid", IntegerType())])},
        {"*": "case when {c} is null then null else row(ST_AsEWKB({c}), nullif(ST_SRID({c}), 0)) end"}),
    Col("c_geography", {"*": StructType([StructField("wkb", BinaryType()), StructField("srid", IntegerType())])},
        {"*": "case when {c} is null then null else row(ST_AsEWKB({c}::geometry), ST_SRID({c}::geometry)) end"}),
    _same("c_int_arr", ArrayType(IntegerType())),
    _same("c_text_arr", ArrayType(StringType())),
    Col("c_num10_2_arr", {"a": ArrayType(DecimalType(10, 2)), "b": ArrayType(DoubleType()),
                          "c": ArrayType(StringType())},
        {"a": "{c}", "b": "{c}::float8[]", "c": "{c}::text[]"}),
    Col("c_numeric_arr", {"a": ArrayType(StringType()), "b": ArrayType(DoubleType()), "c": ArrayType(StringType())},
        {"a": "{c}::text[]", "b": "{c}::float8[]", "c": "{c}::text[]"}),
    _same("c_date_arr", ArrayType(DateType()), _arr(DATE_SQL.format(c="x"), "{c}")),
    _ts("c_ts_arr", array=True),
    Col("c_tstz_arr", {"*": ArrayType(LongType())}, {"*": _arr(_micros_sql("x"), "{c}")},
        actual=lambda c: F.transform(c, F.unix_micros)),
    _same("c_uuid_arr", ArrayType(StringType()), "{c}::text[]"),
    _same("c_jsonb_arr", ArrayType(StringType()), "{c}::text[]"),
    Col("c_bytea_arr", {"*": ArrayType(BinaryType()), "d": ArrayType(StringType())},
        {"*": "{c}", "d": _arr("encode(x, 'hex')", "{c}")}),
    _same("c_enum_arr", ArrayType(StringType()), "{c}::text[]"),
    # time[] elements: the connector reads them at millisecond precision and wraps 24:00:00 to 00:00:00, in
    # every mode, although the element schema says MicroTime.
    Col("c_time_arr", {"*": ArrayType(StringType())}, {"*": _arr(_time_sql("x", millis=True, wrap=True), "{c}")}),
    _same("c_bool_arr", ArrayType(BooleanType())),
    _same("c_inet_arr", ArrayType(StringType()), _arr(OUTPUT.format(c="x"), "{c}")),
    _same("c_float8_arr", ArrayType(DoubleType())),
    _same("c_varchar_arr", ArrayType(StringType())),
    # PostgreSQL's point: the connector's Point struct (x, y, WKB, no SRID), compared as x, y and the WKB's hex
    Col("c_point", {"*": StringType()},
        {"*": "case when {c} is null then null else concat_ws(',', ({c}[0])::numeric(20,6), ({c}[1])::numeric(20,6), "
              "upper(encode(ST_AsBinary(ST_MakePoint({c}[0], {c}[1]), 'NDR'), 'hex')), '-') end"},
        actual=lambda c: F.when(c.isNotNull(), F.concat_ws(
            ",", c.x.cast("decimal(20,6)"), c.y.cast("decimal(20,6)"), F.hex(c.wkb),
            F.coalesce(c.srid.cast("string"), F.lit("-"))))),
    _same("c_citext", StringType(), "{c}::text"),
    _same("c_ltree", StringType(), "{c}::text"),
    _same("c_int8range", StringType(), OUTPUT),
    _same("c_char_arr", ArrayType(StringType()), _arr("rpad(x, 3)", "{c}")),
    # connector loss: timetz[] elements arrive without their fraction of a second
    _same("c_timetz_arr", ArrayType(StringType()),
          _arr("regexp_replace(regexp_replace((x at time zone 'UTC')::text, '\\.[0-9]+', ''), '\\+00$', 'Z')", "{c}")),
    _same("c_json_arr", ArrayType(StringType()), "{c}::text[]"),
    _same("c_qchar", StringType(), "{c}::text"),
    _same("c_oid", LongType(), "{c}::bigint"),
    _same("c_tsrange_arr", ArrayType(StringType()), "{c}::text[]"),
    _same("c_email", StringType(), "{c}::text"),
    _same("c_codes", ArrayType(StringType()), "{c}::text[]"),
    _same("c_label", StringType(), "{c}::text"),
    # connector loss: an enum array holding a NULL element arrives NULL (its element schema is not optional)
    _same("c_label_arr", ArrayType(StringType()),
          "case when array_position({c}, null) is not null then null else {c}::text[] end"),
    _same("c_cidr_arr", ArrayType(StringType()), _arr(OUTPUT.format(c="x"), "{c}")),
    _same("c_macaddr8", StringType(), OUTPUT),
    _same("c_float4_arr", ArrayType(FloatType())),
    _same("c_bigint_arr", ArrayType(LongType())),
    _same("c_smallint_arr", ArrayType(IntegerType())),
    Col("c_hstore_arr", {"*": ArrayType(StringType())}, {"*": _arr("hstore_to_json(x)::text", "{c}")},
        both=lambda c: F.transform(c, lambda x: F.to_json(_hstore_entries(x))),
        actual_in={"d": lambda c: F.transform(c, _json_text)}),
    # connector losses: bit(n)[] arrives NULL, int2vector an empty array
    _same("c_bit_arr", StringType(), "null::text"),
    _same("c_int2vector", ArrayType(IntegerType()), "case when {c} is null then null else '{{}}'::int[] end"),
]


def _python_value(col: Col, mode: str, value: Any) -> Any:
    if col.name == "c_interval":
        parts = None if value is None else tuple(value)
        if parts is not None and parts[0] is None:
            parts = None
        typed = parts if parts is None else (int(parts[0]), int(parts[1]), int(parts[2]), int(parts[3]),
                                             int(parts[4]), Decimal(str(parts[5])))
        return _iso_interval_text(typed) if mode == "b" else _spark_interval_text(typed)
    if isinstance(col.type_for(mode), StructType) and isinstance(value, tuple):
        return (bytes.fromhex(value[0][2:]) if isinstance(value[0], str) else value[0],
                None if value[1] is None else int(value[1]))
    if isinstance(col.type_for(mode), DoubleType | FloatType) and value is not None:
        return float(value)
    spark_type = col.type_for(mode)
    if isinstance(spark_type, ArrayType) and isinstance(spark_type.elementType, DoubleType) and value is not None:
        return [None if v is None else float(v) for v in value]
    return value


# ---- fixtures and the comparison ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pg_conn(stack: None) -> Iterator[psycopg.Connection]:
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        conn.execute(f"drop schema if exists {SCHEMA} cascade")
        conn.execute(DDL)
        conn.execute(ROWS)
        yield conn
        conn.execute(f"drop schema if exists {SCHEMA} cascade")


@dataclasses.dataclass
class ModeRun:
    mode: str
    prefix: str  # its connector's topic prefix
    database: str  # its Silver table's catalog database (its source's `database`)
    lake: LakeConfig

    @property
    def table_path(self) -> str:
        return self.lake.table_path(f"{SCHEMA}_all_types", self.database)


@dataclasses.dataclass
class Runs:
    """The four modes' connectors as the four sources of one job config: one available-now run writes all four
    Silver tables (each in a database of its own) in one batch."""

    config: JobConfig
    processor: BatchProcessor
    modes: dict[str, ModeRun]


@pytest.fixture(scope="module")
def runs(spark: SparkSession, local_config: JobConfig, pg_conn: psycopg.Connection, lake_root: str) -> Iterator[Runs]:
    base = job_config_for(local_config, f"ty{RUN_ID}", f"types_{RUN_ID}", f"{lake_root}/types")
    modes = {mode: ModeRun(mode, f"ty{mode}{RUN_ID}", f"types_{mode}_{RUN_ID}", base.lake) for mode in MODES}
    config = dataclasses.replace(
        base,
        kafka=dataclasses.replace(base.kafka, topic_pattern=rf"ty[{''.join(MODES)}]{RUN_ID}\.[^.]+\.[^.]+"),
        source=None,
        sources=[SourceConfig(topic_prefix=m.prefix, framing="id4", id_type="contentId", database=m.database)
                 for m in modes.values()],
    )
    with ExitStack() as stack:
        for mode, settings in MODES.items():
            stack.enter_context(debezium_connector(f"types-{mode}-{RUN_ID}", modes[mode].prefix, [SCHEMA],
                                                   settings=settings))
        yield Runs(config, BatchProcessor(config, RegistryClient.from_config(config.registry)), modes)


def _wait_for(prefix: str, count: int) -> None:
    topic = f"{prefix}.{SCHEMA}.all_types"
    deadline = time.monotonic() + 90
    while len([r for r in read_topic(topic) if r.value is not None]) < count:
        assert time.monotonic() < deadline, f"{topic}: fewer than {count} events"
        time.sleep(1)


def _run(spark: SparkSession, runs: Runs, count: int) -> None:
    """Once every mode's topic holds `count` events: one available-now run over them all."""
    for run in runs.modes.values():
        _wait_for(run.prefix, count)
    query = start_query(spark, runs.config, runs.processor, available_now=True)
    await_query(query, runs.processor)


def _assert_equal_to_source(spark: SparkSession, conn: psycopg.Connection, run: ModeRun) -> None:
    silver = spark.read.format("hudi").load(run.table_path)
    mode = run.mode
    conn.execute("set timezone = 'UTC'")
    select = ", ".join(f"{c.sql_for(mode)} as {c.name}" for c in COLUMNS)
    rows = conn.execute(f"select id, {select} from {SCHEMA}.all_types order by id").fetchall()
    schema = StructType([
        StructField("id", IntegerType()), *[StructField(c.name, c.type_for(mode)) for c in COLUMNS],
    ])
    expected_df = spark.createDataFrame(
        [(row[0], *[_python_value(c, mode, v) for c, v in zip(COLUMNS, row[1:], strict=True)]) for row in rows],
        schema,
    )
    actual_df = silver.select("id", *[c.actual_for(mode)(F.col(c.name)).alias(c.name) for c in COLUMNS])
    assert {f.name: f.dataType for f in actual_df.schema.fields} == {f.name: f.dataType for f in schema.fields}

    def both(df: DataFrame) -> DataFrame:
        return df.select("id", *[(c.both(F.col(c.name)) if c.both else F.col(c.name)).alias(c.name) for c in COLUMNS])

    assert_columns_equal(both(actual_df), both(expected_df), [c.name for c in COLUMNS],
                         ignore_nullable=True, allow_nan_equality=True)


def test_snapshot_of_every_type_equals_the_source(
    spark: SparkSession, pg_conn: psycopg.Connection, runs: Runs
) -> None:
    (count,) = pg_conn.execute(f"select count(*) from {SCHEMA}.all_types").fetchone() or (0,)
    _run(spark, runs, count)
    for run in runs.modes.values():
        _assert_equal_to_source(spark, pg_conn, run)


def test_every_type_through_the_update_path_equals_the_source(
    spark: SparkSession, pg_conn: psycopg.Connection, runs: Runs
) -> None:
    (columns,) = pg_conn.execute(COLUMNS_SQL).fetchone() or ("",)
    pg_conn.execute(_rotate_sql(columns))
    (count,) = pg_conn.execute(f"select count(*) from {SCHEMA}.all_types").fetchone() or (0,)
    _run(spark, runs, 2 * count)
    for run in runs.modes.values():
        stats = runs.processor.last_stats[f"{run.database}.{SCHEMA}_all_types"]
        assert stats.upserts == count, (run.mode, stats)
        _assert_equal_to_source(spark, pg_conn, run)
