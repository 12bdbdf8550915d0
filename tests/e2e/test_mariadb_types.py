"""Every MariaDB column type, through the real Debezium MariaDB connector in each of its modes, equals the source.

One table holds a column of each MariaDB 10.11 type and rows of edge values (the extremes of every integer and
unsigned integer, BIGINT UNSIGNED above 2^63, DECIMAL(65,30), TIME at +-838 hours, DATETIME from year 1000 to
9999, zero dates, 4-byte UTF-8, spatial values with and without an SRID) and two generated columns, virtual and
stored. Three connectors capture it, one per mode combination, into three Silver tables:

    a  the defaults: decimal.handling.mode=precise  time.precision.mode=adaptive_time_microseconds
                     bigint.unsigned.handling.mode=long  binary.handling.mode=bytes
    b  decimal.handling.mode=string  time.precision.mode=connect  bigint.unsigned.handling.mode=precise
    c  decimal.handling.mode=double  binary.handling.mode=base64

After the snapshot (read over JDBC), and again after every row is rewritten by an UPDATE (read from the binlog,
merged by Hudi through another writer than the insert), each Silver table is compared value by value with what
MariaDB says the value is: the `expected` SQL per column and mode below, after the connector's documented loss
where it has one (docs/type-mappings.md "Column types").
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pymysql
import pytest
from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
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
from app.config import JobConfig
from app.job import await_query, start_query
from app.wire.registry import RegistryClient
from tests.conftest import RUN_ID
from tests.support.cdc import MARIADB_ROOT, job_config_for, mariadb_connector, read_topic
from tests.support.pipeline import assert_columns_equal
from tests.support.values import interval_text

pytestmark = [pytest.mark.stack, pytest.mark.slow]

DB = f"mtypes_{RUN_ID}"
MODES: dict[str, dict[str, str]] = {
    "a": {},
    "b": {"decimal.handling.mode": "string", "time.precision.mode": "connect",
          "bigint.unsigned.handling.mode": "precise"},
    "c": {"decimal.handling.mode": "double", "binary.handling.mode": "base64"},
}

DDL = [
    f"create database {DB}",
    f"""create table {DB}.all_types (
  id int primary key,
  c_tinyint tinyint, c_utinyint tinyint unsigned, c_smallint smallint, c_usmallint smallint unsigned,
  c_mediumint mediumint, c_umediumint mediumint unsigned, c_int int, c_uint int unsigned,
  c_bigint bigint, c_ubigint bigint unsigned,
  c_bool boolean, c_bit1 bit(1), c_bit10 bit(10), c_bit64 bit(64),
  c_dec10_2 decimal(10,2), c_dec38_10 decimal(38,10), c_dec65_30 decimal(65,30), c_udec decimal(5,2) unsigned,
  c_float float, c_double double,
  c_char5 char(5), c_varchar varchar(20), c_utf8 varchar(20) character set utf8mb4, c_text text,
  c_longtext longtext,
  c_binary4 binary(4), c_varbinary varbinary(10), c_blob blob,
  c_date date, c_time time, c_time6 time(6), c_dt0 datetime, c_dt3 datetime(3), c_dt6 datetime(6),
  c_ts6 timestamp(6) null default null, c_year year,
  c_enum enum('sad','ok','happy'), c_set set('a','b','c'), c_json json,
  c_uuid uuid, c_point point, c_geometry geometry
)""",
    f"""insert into {DB}.all_types values (1,
  127, 255, 32767, 65535, 8388607, 16777215, 2147483647, 4294967295, 9223372036854775807, 18446744073709551615,
  true, b'1', b'1000000001', b'1000000000000000000000000000000000000000000000000000000000000001',
  12345678.91, 1234567890123456789012345678.0123456789,
  12345678901234567890123456789012345.123456789012345678901234567890, 999.99,
  3.14, 3.141592653589793,
  'ab', 'hello', 'grüße 😀 中文', 'plain text', 'long text',
  x'dead', x'beef', x'00ff00',
  '2024-02-29', '838:59:59', '-838:59:59.999999', '2024-02-29 12:34:56', '2024-02-29 12:34:56.789',
  '2024-02-29 12:34:56.123456', '2024-02-29 12:34:56.123456', 2024,
  'happy', 'a,c', '{{"a": 1,  "b": [1,2]}}',
  'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', ST_GeomFromText('POINT(1 2)'),
  ST_GeomFromText('LINESTRING(0 0,1 1,2 1)'))""",
    f"""insert into {DB}.all_types values (2,
  -128, 0, -32768, 0, -8388608, 0, -2147483648, 0, -9223372036854775808, 9223372036854775808,
  false, b'0', b'0000000000', b'0',
  -0.01, -0.0000000001, -0.000000000000000000000000000001, 0,
  -1.5, -2.5e-300,
  'abcde', '', '', 'with ''quotes''\\nnewline', '',
  x'00', x'', x'',
  '1000-01-01', '-00:00:01', '00:00:00', '1000-01-01 00:00:00', '1969-12-31 23:59:59.999',
  '9999-12-31 23:59:59.999999', '1970-01-01 00:00:01', 1901,
  'sad', '', '[]',
  '00000000-0000-0000-0000-000000000000', ST_GeomFromText('POINT(-71.06 42.36)', 4326),
  ST_GeomFromText('POLYGON((0 0,4 0,4 4,0 4,0 0))', 3857))""",
    # Zero dates: MariaDB's default sql_mode accepts them. The connector has no value for them (README).
    # (YEAR 0000 is left out: the connector's snapshot stops on it, in the MariaDB JDBC driver's YearColumn.)
    f"""insert into {DB}.all_types (id, c_date, c_time, c_dt0, c_dt6, c_ts6, c_year, c_ubigint, c_dec65_30)
values (3, '0000-00-00', '00:00:00.000001', '0000-00-00 00:00:00', '1969-12-31 23:59:59.999999',
  '2038-01-19 03:14:07.999999', 2155, 1, 0)""",
    f"insert into {DB}.all_types (id) values (9)",
    # Generated columns, a virtual and a stored one: values in the snapshot and in the binlog's row images, computed
    # by MariaDB (the rotating UPDATE below leaves them out: they cannot be assigned).
    f"""alter table {DB}.all_types add column c_gen_virtual bigint as (c_int * 2) virtual,
  add column c_gen_stored varchar(30) as (concat(c_varchar, '!')) persistent""",
]


# ---- what MariaDB says each value is, per connector mode ---------------------------------------------------

EPOCH_MICROS = "timestampdiff(microsecond, '1970-01-01 00:00:00', {c})"
# time.precision.mode=connect: Kafka Connect's Timestamp holds milliseconds (floor, also before 1970).
EPOCH_MILLIS = "floor(timestampdiff(microsecond, '1970-01-01 00:00:00', {c}) / 1000) * 1000"
TEXT = "cast({c} as char)"
DAY_MICROS = 86_400_000_000


@dataclasses.dataclass(frozen=True)
class Col:
    """One column: its Spark type and expected-value SQL per mode (a mode missing: the `*` entry). `sql` may
    select several expressions (comma-separated); `python` then combines them into the expected value."""

    name: str
    types: dict[str, DataType]
    sql: dict[str, str]
    actual: Callable[[Column], Column] | None = None  # normalises the Silver value before comparing
    python: Callable[[Any], Any] | None = None  # the fetched value(s) -> the Spark value

    def type_for(self, mode: str) -> DataType:
        return self.types[mode] if mode in self.types else self.types["*"]

    def sql_for(self, mode: str) -> str:
        return (self.sql[mode] if mode in self.sql else self.sql["*"]).replace("{c}", self.name)

    def width(self, mode: str) -> int:
        return self.sql_for(mode).count(" as __part") or 1


def _same(name: str, spark_type: DataType, sql: str = "{c}") -> Col:
    return Col(name, {"*": spark_type}, {"*": sql})


def _binary(name: str) -> Col:
    # base64 mode: the connector sends the bytes as base64 text (to_base64 wraps lines past 76 characters)
    return Col(name, {"*": BinaryType(), "c": StringType()}, {"*": "{c}", "c": "replace(to_base64({c}), '\\n', '')"})


def _decimal(name: str, spark_type: DataType) -> Col:
    return Col(name, {"a": spark_type, "b": StringType(), "c": DoubleType()}, {"*": TEXT})


def _datetime(name: str) -> Col:
    return Col(name, {"*": LongType()}, {"*": EPOCH_MICROS, "b": EPOCH_MILLIS}, actual=F.unix_micros)


def _micros(td: timedelta | None) -> int | None:
    return None if td is None else td // timedelta(microseconds=1)


def _time(name: str) -> Col:
    # adaptive_time_microseconds: MicroTime; connect: Kafka Connect's Time in milliseconds. Either way an
    # elapsed time (MariaDB's TIME spans +-838 hours), kept as interval text.
    return Col(name, {"*": StringType()}, {"*": "{c}"})


def _bits(name: str, length: int) -> Col:
    return _same(name, StringType(), f"lpad(bin({{c}} + 0), {length}, '0')")


SPATIAL = StructType([StructField("wkb", BinaryType()), StructField("srid", IntegerType())])
POINT = StructType([StructField("x", DoubleType()), StructField("y", DoubleType()), *SPATIAL.fields])
SPATIAL_SQL = "ST_AsBinary({c}) as __part1, nullif(ST_SRID({c}), 0) as __part2"

COLUMNS: list[Col] = [
    *[_same(name, IntegerType()) for name in (
        "c_tinyint", "c_utinyint", "c_smallint", "c_usmallint", "c_mediumint", "c_umediumint", "c_int")],
    _same("c_uint", LongType()),
    _same("c_bigint", LongType()),
    # long mode (the default): values above 2^63 - 1 wrap around to negative longs (the connector's loss)
    Col("c_ubigint", {"*": LongType(), "b": DecimalType(20, 0)}, {"*": "cast({c} as signed)", "b": "{c}"}),
    _same("c_bool", IntegerType()),  # BOOLEAN is TINYINT(1) in MariaDB: 0/1 as stored
    _same("c_bit1", BooleanType(), "{c} = 1"),
    _bits("c_bit10", 10),
    _bits("c_bit64", 64),
    _decimal("c_dec10_2", DecimalType(10, 2)),
    _decimal("c_dec38_10", DecimalType(38, 10)),
    _decimal("c_dec65_30", StringType()),  # over 38 digits: the exact decimal text
    _decimal("c_udec", DecimalType(5, 2)),
    _same("c_float", FloatType()),
    _same("c_double", DoubleType()),
    _same("c_char5", StringType()),
    _same("c_varchar", StringType()),
    _same("c_gen_virtual", LongType()),
    _same("c_gen_stored", StringType()),
    _same("c_utf8", StringType()),
    _same("c_text", StringType()),
    _same("c_longtext", StringType()),
    _binary("c_binary4"),
    _binary("c_varbinary"),
    _binary("c_blob"),
    _same("c_date", DateType(), "case when {c} = '0000-00-00' then null else {c} end"),
    _time("c_time"),
    _time("c_time6"),
    _datetime("c_dt0"),
    _datetime("c_dt3"),
    _datetime("c_dt6"),
    Col("c_ts6", {"*": LongType()}, {"*": EPOCH_MICROS}, actual=F.unix_micros),
    _same("c_year", IntegerType()),
    _same("c_enum", StringType()),
    _same("c_set", StringType(), TEXT),
    _same("c_json", StringType()),
    _same("c_uuid", StringType(), TEXT),
    Col("c_point", {"*": POINT}, {"*": "ST_X({c}) as __part0, ST_Y({c}) as __part3, " + SPATIAL_SQL}),
    Col("c_geometry", {"*": SPATIAL}, {"*": SPATIAL_SQL}),
]


def _python_value(col: Col, mode: str, values: tuple[Any, ...]) -> Any:
    spark_type = col.type_for(mode)
    if isinstance(spark_type, StructType):
        if values[-2] is None:
            return None
        *xy, wkb, srid = values
        return (*[float(v) for v in xy], bytes(wkb), None if srid is None else int(srid))
    (value,) = values
    if value is None:
        return None
    if col.name in ("c_time", "c_time6"):
        micros = _micros(value)
        assert micros is not None
        if mode == "b":  # connect: milliseconds of one day; the connector sends NULL outside 00:00..24:00
            return interval_text(micros - micros % 1000) if 0 <= micros < DAY_MICROS else None
        return interval_text(micros)
    if col.name.startswith("c_dec") or col.name == "c_udec":  # fetched as MariaDB's exact decimal text
        if mode == "c":
            return float(Decimal(value))
        return Decimal(value) if isinstance(spark_type, DecimalType) else str(value)
    if isinstance(spark_type, DecimalType):
        return Decimal(value)
    if isinstance(spark_type, DoubleType | FloatType):
        return float(value)
    if isinstance(spark_type, LongType | IntegerType):
        return int(value)
    if isinstance(spark_type, BinaryType):
        return bytes(value)
    if isinstance(spark_type, BooleanType):
        return bool(value)
    return value


# ---- fixtures and the comparison ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def maria(stack: None) -> Iterator[pymysql.Connection]:
    conn = pymysql.connect(**MARIADB_ROOT, autocommit=True, charset="utf8mb4")
    try:
        with conn.cursor() as cur:
            cur.execute("set time_zone = '+00:00'")  # TIMESTAMP values read as UTC
            cur.execute(f"drop database if exists {DB}")
            for statement in DDL:
                cur.execute(statement)
        yield conn
    finally:
        with conn.cursor() as cur:
            cur.execute(f"drop database if exists {DB}")
        conn.close()


@dataclasses.dataclass
class ModeRun:
    mode: str
    config: JobConfig
    processor: BatchProcessor

    @property
    def table_path(self) -> str:
        return self.config.lake.table_path(f"{DB}_all_types")


def _prefix(mode: str) -> str:
    return f"mt{mode}{RUN_ID}"


@pytest.fixture(scope="module")
def runs(spark: SparkSession, local_config: JobConfig, maria: pymysql.Connection,
         lake_root: str) -> Iterator[dict[str, ModeRun]]:
    with ExitStack() as stack:
        out = {}
        for mode, settings in MODES.items():
            stack.enter_context(mariadb_connector(f"mtypes-{mode}-{RUN_ID}", _prefix(mode), [DB], settings))
            config = job_config_for(local_config, _prefix(mode), f"mtypes_{mode}_{RUN_ID}",
                                    f"{lake_root}/mtypes_{mode}")
            assert config.source is not None
            config = dataclasses.replace(config, source=dataclasses.replace(config.source, connector="mariadb"))
            out[mode] = ModeRun(mode, config, BatchProcessor(config, RegistryClient.from_config(config.registry)))
        yield out


def _wait_for(mode: str, count: int) -> None:
    topic = f"{_prefix(mode)}.{DB}.all_types"
    deadline = time.monotonic() + 120
    while len([r for r in read_topic(topic) if r.value is not None]) < count:
        assert time.monotonic() < deadline, f"{topic}: fewer than {count} events"
        time.sleep(1)


def _run(spark: SparkSession, run: ModeRun) -> None:
    query = start_query(spark, run.config, run.processor, available_now=True)
    await_query(query, run.processor)


def _count(conn: pymysql.Connection) -> int:
    with conn.cursor() as cur:
        cur.execute(f"select count(*) from {DB}.all_types")
        (count,) = cur.fetchone() or (0,)
    return int(count)


def _assert_equal_to_source(spark: SparkSession, conn: pymysql.Connection, run: ModeRun) -> None:
    silver = spark.read.format("hudi").load(run.table_path)
    mode = run.mode
    with conn.cursor() as cur:
        cur.execute(f"select id, {', '.join(c.sql_for(mode) for c in COLUMNS)} from {DB}.all_types order by id")
        rows = cur.fetchall()
    schema = StructType([
        StructField("id", IntegerType()), *[StructField(c.name, c.type_for(mode)) for c in COLUMNS],
    ])
    expected = []
    for row in rows:
        values, at = [row[0]], 1
        for c in COLUMNS:
            width = c.width(mode)
            values.append(_python_value(c, mode, tuple(row[at:at + width])))
            at += width
        expected.append(tuple(values))
    expected_df = spark.createDataFrame(expected, schema)
    actual_df = silver.select("id", *[(c.actual or (lambda x: x))(F.col(c.name)).alias(c.name) for c in COLUMNS])
    assert {f.name: f.dataType for f in actual_df.schema.fields} == {f.name: f.dataType for f in schema.fields}
    assert_columns_equal(actual_df, expected_df, [c.name for c in COLUMNS], ignore_nullable=True)


def test_snapshot_of_every_mariadb_type_equals_the_source(
    spark: SparkSession, maria: pymysql.Connection, runs: dict[str, ModeRun]
) -> None:
    count = _count(maria)
    for run in runs.values():
        _wait_for(run.mode, count)
        _run(spark, run)
        _assert_equal_to_source(spark, maria, run)


def test_every_mariadb_type_through_the_binlog_and_the_update_path_equals_the_source(
    spark: SparkSession, maria: pymysql.Connection, runs: dict[str, ModeRun]
) -> None:
    """Every row takes the values of the next row (ids rotate), so each type is read from the binlog and
    rewritten by a merge in a later batch, values moving between NULL and not-NULL."""
    with maria.cursor() as cur:
        cur.execute("select column_name from information_schema.columns where table_schema = %s "
                    "and table_name = 'all_types' and column_name <> 'id' and is_generated = 'NEVER' "
                    "order by ordinal_position", (DB,))
        columns = [name for (name,) in cur.fetchall()]
        cur.execute(f"select id from {DB}.all_types order by id")
        ids = [i for (i,) in cur.fetchall()]
        # A temporary table is not written to the binlog in ROW format: the connector sees only the UPDATE.
        cur.execute(f"create temporary table {DB}.rotation as select * from {DB}.all_types")
        following = " ".join(f"when {i} then {n}" for i, n in zip(ids, [*ids[1:], ids[0]], strict=True))
        assignments = ", ".join(f"t.{c} = s.{c}" for c in columns)
        cur.execute(f"update {DB}.all_types t join {DB}.rotation s on s.id = case t.id {following} end "
                    f"set {assignments}")
        cur.execute(f"drop temporary table {DB}.rotation")
    count = _count(maria)
    for run in runs.values():
        _wait_for(run.mode, 2 * count)
        _run(spark, run)
        stats = run.processor.last_stats[f"{run.config.lake.database}.{DB}_all_types"]
        assert stats.upserts == count, stats
        _assert_equal_to_source(spark, maria, run)
