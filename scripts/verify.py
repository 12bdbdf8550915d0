#!/usr/bin/env python3
"""Compare Silver tables with their source tables, key by key and value by value, without stopping the job.

    .venv/bin/python scripts/verify.py --conf conf/local.yaml --source crm=jdbc:postgresql://127.0.0.1:5432/source
    .venv/bin/python scripts/verify.py --conf conf/prod.yaml --table crm.public_users --json verify.json

Each Silver table names the source table it holds in its commits (`_cdc.source_table`: `<source>:<schema>.<table>`);
the source is read over JDBC (`--source <label>=<jdbc url>`, or the source's `catalog` login), in partitions of its
first key column when that is an integer. Both sides become, per record key, one hash per column, computed in Spark:
the source's value is brought to the Silver column's type first (by the type mapping the job uses: decimals exactly,
instants as UTC, arrays element by element with their NULL elements, bytes as bytes), so nothing is compared as
text that is not text on both sides. Rows are never collected to the driver; only the counts and a sample of keys.

Reported per table: rows on each side, keys missing from Silver, keys only in Silver, keys whose values differ,
per column (a source value that does not cast to the Silver type differs from anything, NULL included), Silver keys
held by more than one row; columns on one side only (a source column Silver lacks makes the table differ); columns
not compared (a source type whose Silver form this script does not rebuild yet: PostgreSQL interval, timetz,
hstore, ranges, geometry; MariaDB time, geometry), each named. A soft-deleted row (`_cdc_deleted`) counts as absent.

Under live writes a key can differ only because its change is on its way. While keys differ, both sides are read
again, and a key stays only while it differs the same way with neither side's row moved since the read before (a
change on its way moves one: the lake applies it, or the source changes the key again). When the source has been
read, the Kafka end offsets of the table's topic partitions are noted (`--connector-lag-s` later, default 5: the
connector's time to publish what was committed before the read); the next read waits until the job's checkpoint
says the job has applied them. A key that still differs the same way then is diverged: the lake has had every
change the source held at the first read. Without a checkpoint to tell (the job's `lake.checkpoint_path`), the
reads are `--interval-s` apart. `--settle-s` (default 300) bounds the wait; what is left when the time is up (at
once with 0) is reported as diverged, and the report says whether the lake had caught up (`caught_up`).

Shards merged into one Silver table (`_cdc.source_table` = `merged`) are compared with the union of the source
tables the config declares for it, each with the discriminator the job adds (`--conf` must be the job's); a column
some of them lack is not compared, and named.

PostgreSQL and MariaDB/MySQL sources (`jdbc:postgresql:`, `jdbc:mariadb:` URLs; both drivers are on the job's
Spark class path); not yet SQL Server. Nothing is written, except the `--json` file.

Exit status: 0 when every table compared equal, 1 when one differs, 2 when one cannot be compared (bad arguments,
no such table, a source out of reach).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pyspark.sql import Column, DataFrame, SparkSession  # noqa: E402 - after the path above, for a run as a script
from pyspark.sql import functions as F  # noqa: E402
from pyspark.sql.types import (  # noqa: E402
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegralType,
    StringType,
    StructType,
    TimestampType,
)

from app.cdc.columns import CDC_COLUMNS, SOFT_DELETE_COLUMNS, SOFT_DELETED_COL  # noqa: E402
from app.config import DiscriminatorConfig, JobConfig, load_config  # noqa: E402
from app.errors import ConfigError  # noqa: E402
from app.routing.route import TableRoute, configured_topics, route_topic  # noqa: E402
from app.sink.commit import last_committed  # noqa: E402
from app.sink.hudi import recorded_record_key  # noqa: E402
from app.spark import build_session  # noqa: E402
from app.state.resume import checkpoint_applied, kafka_end_offsets, silver_tables  # noqa: E402

LOCAL_LOGINS = {"METASTORE_PASSWORD": "postgres", "AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local"}
KEY = "_verify_key"
ROW = "_verify_row"
RAW_PREFIX = "_verify_raw_"  # a source column's text beside its cast
SAMPLE = 10


class VerifyError(Exception):
    """A table that cannot be compared: names it and why."""


@dataclass(frozen=True)
class SourceLogin:
    url: str
    user: str
    password: str


@dataclass(frozen=True)
class SourceColumn:
    """A source column as its database's catalog has it: its name, its type (PostgreSQL: a domain's base type), and
    for a PostgreSQL array the element's."""

    name: str
    type_name: str  # PostgreSQL: pg_type.typname of the base type (int4, numeric, _text); MariaDB: data_type
    category: str = ""  # PostgreSQL's pg_type.typcategory: N numeric, S string, E enum, D datetime, A array, ...
    element: str | None = None  # an array's element typname
    element_category: str | None = None
    length: int | None = None  # MariaDB bit(n)'s n


@dataclass
class TableReport:
    table: str
    source: str
    source_rows: int = 0
    silver_rows: int = 0
    missing: int = 0
    extra: int = 0
    differing: int = 0
    by_column: dict[str, int] = field(default_factory=dict)
    only_in_source: list[str] = field(default_factory=list)
    only_in_silver: list[str] = field(default_factory=list)
    not_compared: dict[str, str] = field(default_factory=dict)
    sample: dict[str, list[Any]] = field(default_factory=dict)
    duplicates: int = 0  # Silver keys held by more than one row
    moved: int = 0  # keys that differed at a read and moved before the next (changes on their way): not reported
    reads: int = 0
    # whether the last read came after the job applied what Kafka held at the read before (None: not known, the
    # reads were time apart; not asked when the first read found nothing)
    caught_up: bool | None = None
    seconds: float = 0.0
    error: str | None = None

    @property
    def equal(self) -> bool:
        return self.error is None and not (self.missing or self.extra or self.differing or self.duplicates
                                           or self.only_in_source)


# --- the source's value in the Silver column's type ---------------------------------------------------------------

# Types whose Silver text is PostgreSQL's output form of the value (besides the S, E and I categories).
_TEXT_TYPES = {"uuid", "json", "jsonb", "xml", "macaddr", "macaddr8", "bit", "numeric"}


def _output_form(value: str) -> str:
    """PostgreSQL's output form of a value, as the connector sends it: `format('%s')` calls the type's output
    function (`::text` would trim a char(n)'s padding and add an inet's /32); NULL stays NULL."""
    return f"case when {value} is null then null else format('%s', {value}) end"


def source_expression(column: SourceColumn, silver: DataType) -> str | None:
    """PostgreSQL: the SQL that reads `column` as text Spark casts to `silver` (or as bytes for bytea), the source's
    value as the job maps it (docs/type-mappings.md); None when this script does not rebuild that mapping."""
    name = _pg_quote(column.name)
    if isinstance(silver, ArrayType):
        if column.category != "A" or column.element is None or isinstance(silver.elementType, (ArrayType, StructType)):
            return None
        element = _scalar_text("u.x", column.element, column.element_category or "", silver.elementType)
        if element is None:
            return None
        return (f"case when {name} is null then null else array(select {element} from unnest({name}) with "
                f"ordinality as u(x, n) order by u.n) end")
    if column.category == "A":
        return None
    if isinstance(silver, BinaryType):
        return name if column.type_name == "bytea" else None
    return _scalar_text(name, column.type_name, column.category, silver)


def _scalar_text(value: str, type_name: str, category: str, silver: DataType) -> str | None:
    if isinstance(silver, (TimestampType, DateType)):
        return _datetime_text(value, type_name, silver)
    if type_name == "money":
        return f"{value}::numeric::text" if isinstance(silver, (DecimalType, DoubleType, StringType)) else None
    if isinstance(silver, StringType):
        if type_name == "time":
            return f"to_char({value}, 'HH24:MI:SS.US')"
        if category in ("S", "E", "I") or type_name in _TEXT_TYPES:
            return _output_form(value)
        return None
    if isinstance(silver, (BooleanType, IntegralType, DecimalType, FloatType, DoubleType)):
        return f"{value}::text" if category in ("N", "B") or type_name == "bit" else None
    return None


def _datetime_text(value: str, type_name: str, silver: DataType) -> str | None:
    """A date or an instant as text in UTC; PostgreSQL's infinities as the job maps them."""
    if isinstance(silver, DateType):
        if type_name != "date":
            return None
        return (f"case when {value} = 'infinity' then '9999-12-31' when {value} = '-infinity' then '0001-01-01' "
                f"else to_char({value}, 'YYYY-MM-DD') end")
    if type_name == "timestamptz":
        value = f"({value} at time zone 'UTC')"
    elif type_name != "timestamp":
        return None
    # with its zone: Spark's cast reads it as that instant whatever the session's zone
    return (f"case when {value} = 'infinity' then '9999-12-31 23:59:59.999999+00:00' when {value} = '-infinity' "
            f"then '0001-01-01 00:00:00+00:00' else to_char({value}, 'YYYY-MM-DD HH24:MI:SS.US') || '+00:00' end")


_MARIA_NUMBERS = {"tinyint", "smallint", "mediumint", "int", "integer", "bigint", "decimal", "year"}
_MARIA_TEXTS = {"char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum", "set", "json"}
_MARIA_BYTES = {"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"}


def maria_expression(column: SourceColumn, silver: DataType) -> str | None:
    """MariaDB/MySQL: as `source_expression` (numbers and text as text, floating point and bytes as they are,
    datetimes as UTC text, bit(n) as its 0/1 digits); None when this script does not rebuild that mapping."""
    name, kind = _maria_quote(column.name), column.type_name
    if isinstance(silver, (ArrayType, StructType)):
        return None
    if isinstance(silver, BinaryType):
        return name if kind in _MARIA_BYTES else None
    if isinstance(silver, TimestampType):  # the session's zone is UTC (MARIADB_SESSION): a timestamp shows in it
        return f"concat(date_format({name}, '%Y-%m-%d %H:%i:%s.%f'), '+00:00')" if kind in ("datetime", "timestamp") \
            else None
    if isinstance(silver, DateType):
        return f"date_format({name}, '%Y-%m-%d')" if kind == "date" else None
    if kind == "bit":
        if isinstance(silver, BooleanType):
            return f"cast({name} + 0 as char)"
        return f"lpad(bin({name} + 0), {column.length}, '0')" if isinstance(silver, StringType) and column.length \
            else None
    if isinstance(silver, (FloatType, DoubleType)):
        # a float widened exactly: the driver's text of a float keeps 6 digits
        return f"cast({name} as double)" if kind in ("float", "double", "decimal") else None
    if kind in _MARIA_NUMBERS and isinstance(silver, (IntegralType, DecimalType, BooleanType, StringType)):
        return f"cast({name} as char)"
    if kind in ("enum", "set") and isinstance(silver, StringType):
        return f"cast({name} as char)"  # their text (the driver's own reading differs)
    return name if kind in _MARIA_TEXTS and isinstance(silver, StringType) else None


def canonical(column: Column, silver: DataType) -> Column:
    """One form of a value for both sides' hashes: equal values, equal forms (timestamps in the session's UTC)."""
    if isinstance(silver, BinaryType):
        return F.hex(column)
    if isinstance(silver, (ArrayType, StructType)):
        return F.to_json(column, {"timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX"})
    return column.cast("string")


def hashed(df: DataFrame, key: list[str], columns: dict[str, DataType]) -> DataFrame:
    """Per row: the record key as JSON text, one 64-bit hash per column (NULL stays NULL) and one of the whole row
    (ROW), which says whether a side moved between two reads."""
    hashes = df.select(
        F.to_json(F.struct(*[canonical(F.col(f"`{k}`"), columns[k]).alias(k) for k in key])).alias(KEY),
        *[_column_hash(df, c, t).alias(c) for c, t in columns.items()],
    )
    return hashes.withColumn(ROW, F.xxhash64(F.to_json(F.array(*[F.col(f"`{c}`") for c in columns]))))


def _column_hash(df: DataFrame, name: str, silver: DataType) -> Column:
    """A column's hash, NULL for NULL; a source value that does not cast to the Silver type (`RAW_PREFIX` column:
    its text) hashes apart from any value and from NULL."""
    value = F.col(f"`{name}`")
    hashed_value = F.when(value.isNull(), F.lit(None)).otherwise(F.xxhash64(canonical(value, silver)))
    raw = f"{RAW_PREFIX}{name}"
    if raw not in df.columns:
        return hashed_value
    return F.when(F.col(f"`{raw}`").isNotNull() & value.isNull(),
                  F.xxhash64(F.lit("\u0000uncastable"), F.col(f"`{raw}`"))).otherwise(hashed_value)


def compare(source_df: DataFrame, silver_df: DataFrame, columns: list[str]) -> DataFrame:
    """Keys on one side only, and keys whose column hashes differ: KEY, `kind` (missing, extra, differing), for
    `differing` `columns`, the names of the columns that differ, and each side's row hash (`source_row`,
    `silver_row`)."""
    s, t = source_df.alias("s"), silver_df.alias("t")
    joined = s.join(t, F.col(f"s.{KEY}") == F.col(f"t.{KEY}"), "full_outer")
    differs = [F.when(~F.col(f"s.`{c}`").eqNullSafe(F.col(f"t.`{c}`")), F.lit(c)) for c in columns]
    differing_columns = F.filter(F.array(*differs), lambda x: x.isNotNull()) if differs else F.array().cast(
        "array<string>")
    return joined.select(
        F.coalesce(F.col(f"s.{KEY}"), F.col(f"t.{KEY}")).alias(KEY),
        F.when(F.col(f"t.{KEY}").isNull(), F.lit("missing")).when(F.col(f"s.{KEY}").isNull(), F.lit("extra"))
        .otherwise(F.lit("differing")).alias("kind"),
        differing_columns.alias("columns"),
        F.col(f"s.{ROW}").alias("source_row"), F.col(f"t.{ROW}").alias("silver_row"),
    ).filter((F.col("kind") != "differing") | (F.size("columns") > 0))


# --- reading both sides --------------------------------------------------------------------------------------------

def _pg_quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _maria_quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def pg_columns(spark: SparkSession, login: SourceLogin, schema: str, table: str) -> list[SourceColumn]:
    """The source table's columns, in order, a domain read as its base type."""
    query = f"""
        select a.attname as name, b.typname as type_name, b.typcategory as category,
               e.typname as element, e.typcategory as element_category
        from pg_attribute a
        join pg_class c on c.oid = a.attrelid join pg_namespace s on s.oid = c.relnamespace
        join pg_type t on t.oid = a.atttypid
        join pg_type b on b.oid = case when t.typtype = 'd' then t.typbasetype else t.oid end
        left join pg_type e on e.oid = b.typelem and b.typcategory = 'A'
        where s.nspname = {_literal(schema)} and c.relname = {_literal(table)} and a.attnum > 0
          and not a.attisdropped
        order by a.attnum"""
    rows = _jdbc(spark, login, query).collect()
    return [SourceColumn(r["name"], r["type_name"], r["category"], r["element"], r["element_category"]) for r in rows]


def maria_columns(spark: SparkSession, login: SourceLogin, database: str, table: str) -> list[SourceColumn]:
    query = f"""
        select column_name as name, lower(data_type) as type_name,
               case when lower(data_type) = 'bit' then numeric_precision end as length
        from information_schema.columns
        where table_schema = {_literal(database)} and table_name = {_literal(table)}
        order by ordinal_position"""
    rows = _jdbc(spark, login, query).collect()
    return [SourceColumn(r["name"], r["type_name"], length=None if r["length"] is None else int(r["length"]))
            for r in rows]


@dataclass(frozen=True)
class Dialect:
    """How one kind of source database is read: its JDBC driver, quoting, catalog and the SQL of each column."""

    driver: str
    quote: Callable[[str], str]
    columns: Callable[[SparkSession, SourceLogin, str, str], list[SourceColumn]]
    expression: Callable[[SourceColumn, DataType], str | None]
    options: dict[str, str] = field(default_factory=dict)  # the Spark JDBC source's, for every read


POSTGRESQL = Dialect("org.postgresql.Driver", _pg_quote, pg_columns, source_expression)
# Each connection's zone UTC: a `timestamp` column shows its instant in UTC (maria_expression).
MARIADB = Dialect("org.mariadb.jdbc.Driver", _maria_quote, maria_columns, maria_expression,
                  {"sessionInitStatement": "SET time_zone = '+00:00'"})


def dialect_of(url: str) -> Dialect:
    if url.startswith("jdbc:postgresql:"):
        return POSTGRESQL
    if url.startswith("jdbc:mariadb:"):
        return MARIADB
    raise VerifyError(f"{url}: a jdbc:postgresql: or jdbc:mariadb: URL (MySQL too, through the MariaDB driver)")


def _spark_url(url: str) -> str:
    """The URL as Spark's JDBC source is given it: Spark chooses its SQL dialect (identifier quoting, types) by the
    URL's scheme, and knows MariaDB as `jdbc:mysql:`, which the MariaDB driver takes with `permitMysqlScheme`."""
    if not url.startswith("jdbc:mariadb:"):
        return url
    return "jdbc:mysql:" + url.removeprefix("jdbc:mariadb:") + ("&" if "?" in url else "?") + "permitMysqlScheme"


def _jdbc(spark: SparkSession, login: SourceLogin, query: str, **options: str) -> DataFrame:
    return (spark.read.format("jdbc").option("url", _spark_url(login.url)).option("user", login.user)
            .option("password", login.password).option("driver", dialect_of(login.url).driver)
            .option("query" if not options else "dbtable", query if not options else f"({query}) verify_source")
            .options(**options).load())


@dataclass(frozen=True)
class SourceRead:
    """One source table read for a Silver table (several for shards merged into one): its login and name, the SQL
    of each compared column, and the discriminator column the job adds to its rows with a constant, if any."""

    login: SourceLogin
    schema: str
    table: str
    expressions: dict[str, str]
    constant: tuple[str, str] | None = None  # (column, value)


Offsets = dict[tuple[str, int], int]  # per (topic, partition)


@dataclass(frozen=True)
class LakeProgress:
    """Whether the job has applied what Kafka held at a moment, for a table's topic partitions (those its commits
    name): Kafka's end offsets then, against the newest batch the job's checkpoint records as committed."""

    spark: SparkSession
    config: JobConfig
    partitions: list[tuple[str, int]]

    def ends(self) -> Offsets:
        return kafka_end_offsets(self.spark, self.config, self.partitions)

    def applied(self, ends: Offsets) -> bool | None:
        """None: the checkpoint has no committed batch (no job ran with this config's checkpoint)."""
        applied = checkpoint_applied(self.spark, self.config.lake.checkpoint_path)
        if applied is None:
            return None
        return all(applied.get(tp, 0) >= end for tp, end in ends.items())

    def wait_applied(self, ends: Offsets, deadline: float, interval_s: float) -> bool | None:
        """Until the job has applied `ends` (True), or the deadline passes first (False); None: not known."""
        while True:
            applied = self.applied(ends)
            if applied is not False or time.monotonic() >= deadline:
                return applied
            time.sleep(max(0.0, min(interval_s, deadline - time.monotonic())))


@dataclass
class Comparison:
    """One Silver table and its source tables, as compared: each source read, the record key and the columns
    compared with their Silver types."""

    reads: list[SourceRead]
    key: list[str]
    compared: dict[str, DataType]
    path: str  # the Silver table's
    topic_partitions: list[tuple[str, int]] = field(default_factory=list)  # those its commits applied offsets of
    duplicates: int = 0  # Silver keys held by more than one row, at the latest read

    def differences(
        self, spark: SparkSession, partitions: int, progress: LakeProgress | None = None, lag_s: float = 0.0
    ) -> tuple[DataFrame, int, int, Offsets | None]:
        """Both sides read now: the keys that differ (`compare`, persisted), the source's and Silver's rows, and
        when keys differ and `progress` is given, Kafka's end offsets `lag_s` after the source was read."""
        source_df = self.read_source(spark, partitions)
        typed = source_df.select(
            *[F.col(f"`{c}`").alias(c) if isinstance(t, BinaryType) else F.col(f"`{c}`").cast(t).alias(c)
              for c, t in self.compared.items()],
            *[F.col(f"`{c}`").alias(f"{RAW_PREFIX}{c}") for c, t in self.compared.items()
              if not isinstance(t, BinaryType)],
        )
        left = hashed(typed, self.key, self.compared).persist()
        source_rows = left.count()
        read_at = time.monotonic()
        # read afresh each time: the files a frame listed may be cleaned by the job's later commits
        silver_df = silver_frame(spark, self.path)
        right = hashed(silver_df.select(*[F.col(f"`{c}`") for c in self.compared]), self.key, self.compared).persist()
        silver_rows = right.count()
        self.duplicates = right.groupBy(KEY).count().filter("count > 1").count()
        found = compare(left, right, [c for c in self.compared if c not in self.key]).persist()
        ends = None
        if found.count() and progress is not None:
            time.sleep(max(0.0, read_at + lag_s - time.monotonic()))
            ends = progress.ends()
        left.unpersist()
        right.unpersist()
        return found, source_rows, silver_rows, ends

    def read_source(self, spark: SparkSession, partitions: int) -> DataFrame:
        """Every source table's rows, the compared columns as the SQL of each gives them (a constant
        discriminator added as the job adds it)."""
        frames = [self._read(spark, read, partitions) for read in self.reads]
        union = frames[0]
        for frame in frames[1:]:
            union = union.unionByName(frame)
        return union

    def _read(self, spark: SparkSession, read: SourceRead, partitions: int) -> DataFrame:
        """One source table, in `partitions` reads of the first key column when that is a number."""
        quote = dialect_of(read.login.url).quote
        select = ", ".join(f"{expression} as {quote(name)}" for name, expression in read.expressions.items())
        source, first = f"{quote(read.schema)}.{quote(read.table)}", quote(self.key[0])
        query = f"select {select} from {source}"
        options: dict[str, str] = {"fetchsize": "10000", **dialect_of(read.login.url).options}
        if partitions > 1 and isinstance(self.compared[self.key[0]], IntegralType) and self.key[0] in read.expressions:
            bounds = _jdbc(spark, read.login, f"select min({first}) as lo, max({first}) as hi from {source}")
            lo, hi = bounds.first() or (None, None)
            if lo is not None and hi is not None and hi > lo:
                # the key's own value, besides its text form, to split the reads on
                query = f"select {select}, {first} as _verify_part from {source}"
                options.update(partitionColumn="_verify_part", lowerBound=str(lo), upperBound=str(int(hi) + 1),
                               numPartitions=str(partitions))
        df = _jdbc(spark, read.login, query, **options).drop("_verify_part")
        if read.constant is not None:
            df = df.withColumn(read.constant[0], F.lit(read.constant[1]))
        return df.select(*[F.col(f"`{c}`") for c in self.compared])


def silver_frame(spark: SparkSession, path: str) -> DataFrame:
    """The Silver table as readers see it, without its soft-deleted rows and the job's own columns."""
    df = spark.read.format("hudi").load(path)
    if SOFT_DELETED_COL in df.columns:
        df = df.filter(~F.coalesce(F.col(SOFT_DELETED_COL), F.lit(False)))
    own = {*CDC_COLUMNS, *SOFT_DELETE_COLUMNS}
    return df.select(*[c for c in df.columns if not c.startswith("_hoodie_") and c not in own])


# --- one table -----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Settling:
    partitions: int = 4
    settle_s: float = 300.0
    interval_s: float = 5.0
    connector_lag_s: float = 5.0


@dataclass(frozen=True)
class SourceTable:
    """One source table of a Silver table as its database's catalog has it, and the constant discriminator the job
    adds to its rows (shards merged into one table), if any."""

    label: str
    login: SourceLogin
    schema: str
    table: str
    columns: dict[str, SourceColumn]
    constant: tuple[str, str] | None = None  # (column, value)

    @property
    def name(self) -> str:
        return f"{self.label}:{self.schema}.{self.table}"

    def provides(self, column: str) -> bool:
        return column in self.columns or (self.constant is not None and self.constant[0] == column)


def plan_comparison(
    spark: SparkSession, path: str, name: str, logins: dict[str, SourceLogin], config: JobConfig | None = None
) -> tuple[Comparison, TableReport]:
    """What is compared for one Silver table, from its commits (the source table; for shards merged into one, the
    config's declarations, `config`), its record key and both sides' columns; the report so far (the columns on one
    side only, those not compared).

    Raises:
        VerifyError: the table cannot be compared; says why.
    """
    committed = last_committed(spark, path)
    if committed is None or committed.source_table is None:
        raise VerifyError(f"{name}: its commits do not name the source table it holds (written before the job "
                          f"recorded `_cdc.source_table`, or no commit yet)")
    if committed.source_table == "merged":
        shards = merged_shards(config, name) if config is not None else []
        if not shards:
            raise VerifyError(f"{name}: shards merged into one table, and the config declares none of them")
        specs = [(r.source, r.source_key, r.discriminator) for r in shards]
    else:
        label, _, source_key = committed.source_table.partition(":")
        specs = [(label, source_key, None)]
    tables = [_source_table(spark, name, logins, spec) for spec in specs]
    key = list(recorded_record_key(spark, path) or ())
    silver_types = {f.name: f.dataType for f in silver_frame(spark, path).schema.fields}
    report = TableReport(name, committed.source_table if len(tables) == 1 else
                         "merged: " + ", ".join(t.name for t in tables))
    report.only_in_source = list(dict.fromkeys(c for t in tables for c in t.columns if c not in silver_types))
    report.only_in_silver = [c for c in silver_types if not any(t.provides(c) for t in tables)]
    reads = _reads(tables, silver_types, report)
    compared = [c for c in silver_types if any(t.provides(c) for t in tables) and c not in report.not_compared]
    reads = [dataclasses.replace(r, expressions={c: e for c, e in r.expressions.items() if c in compared})
             for r in reads]
    if not key or any(k not in compared for k in key):
        raise VerifyError(f"{name}: record key {key} not compared on both sides (columns compared: {compared})")
    return Comparison(reads, key, {c: silver_types[c] for c in compared}, path, sorted(committed.last)), report


def _reads(tables: list[SourceTable], silver_types: dict[str, DataType], report: TableReport) -> list[SourceRead]:
    """Each source table's read of the Silver columns they all provide; a column some lack, or whose source type
    this script does not rebuild, goes to the report's `not_compared`."""
    for column in silver_types:
        lacking = [t.name for t in tables if not t.provides(column)]
        if lacking and len(lacking) < len(tables):
            report.not_compared[column] = f"not in every merged table (none in {', '.join(lacking)})"
    reads = []
    for t in tables:
        expressions: dict[str, str] = {}
        for column in (c for c in t.columns if c in silver_types and c not in report.not_compared):
            if t.constant is not None and column == t.constant[0]:
                continue
            expression = dialect_of(t.login.url).expression(t.columns[column], silver_types[column])
            if expression is not None:
                expressions[column] = expression
                continue
            what = f"{t.columns[column].type_name} as {silver_types[column].simpleString()}"
            report.not_compared[column] = what if len(tables) == 1 else f"{what} ({t.name})"
        reads.append(SourceRead(t.login, t.schema, t.table, expressions, t.constant))
    return reads


def _source_table(
    spark: SparkSession, name: str, logins: dict[str, SourceLogin],
    spec: tuple[str, str, DiscriminatorConfig | None],
) -> SourceTable:
    """One source table of a Silver table (its source's label, `<schema>.<table>` and discriminator), read from its
    database's catalog."""
    label, source_key, discriminator = spec
    if label not in logins:
        raise VerifyError(f"{name}: no login for source {label!r} (--source {label}=<jdbc url>, or its catalog)")
    parts = source_key.split(".")
    if len(parts) != 2:
        raise VerifyError(f"{name}: source table {source_key}: SQL Server's sources are not read yet")
    login = logins[label]
    columns = {c.name: c for c in dialect_of(login.url).columns(spark, login, parts[0], parts[1])}
    if not columns:
        raise VerifyError(f"{name}: source table {source_key} not found at {login.url}")
    constant = None
    if discriminator is not None and discriminator.value is not None:
        constant = (discriminator.column, discriminator.value)
    return SourceTable(label, login, parts[0], parts[1], columns, constant)


def merged_shards(config: JobConfig, name: str) -> list[TableRoute]:
    """The source tables the config declares merged into Silver table `name` (<database>.<table>), as the job
    routes them."""
    routes = [route_topic(topic, config) for topic in configured_topics(config)]
    return [r for r in routes if r.merged and r.qualified_name == name]


def verify_table(
    spark: SparkSession, path: str, name: str, logins: dict[str, SourceLogin], settling: Settling, *,
    config: JobConfig | None = None,
) -> TableReport:
    """Compare one table (module docstring); keys that differ are read again, after the job has applied what
    Kafka held at the read before (`config`'s checkpoint; without it, `interval_s` apart), until the time is up."""
    started = time.monotonic()
    comparison, report = plan_comparison(spark, path, name, logins, config)
    progress = None
    if config is not None and settling.settle_s > 0:
        progress = LakeProgress(spark, config, comparison.topic_partitions)
    differences, report.source_rows, report.silver_rows, ends = comparison.differences(
        spark, settling.partitions, progress, settling.connector_lag_s)
    report.reads = 1
    deadline = time.monotonic() + settling.settle_s
    while differences.limit(1).count() and time.monotonic() < deadline:
        report.caught_up = None if progress is None or ends is None else progress.wait_applied(
            ends, deadline, settling.interval_s)
        if report.caught_up is False:
            break  # the lake is behind: what differs is reported, and why it may (caught_up)
        if report.caught_up is None:
            time.sleep(settling.interval_s)
        again, report.source_rows, report.silver_rows, ends = comparison.differences(
            spark, settling.partitions, progress, settling.connector_lag_s)
        report.reads += 1
        # A key stays only while it differs the same way with neither side moved: a change on its way moves one
        # (the lake applies it, or the source changes the key again).
        before = differences.select(KEY, "kind", "source_row", "silver_row")
        kept = again.join(before, [KEY, "kind"]).filter(
            again["source_row"].eqNullSafe(before["source_row"]) & again["silver_row"].eqNullSafe(before["silver_row"])
        ).select(again["*"]).persist()
        report.moved += differences.count() - kept.count()
        differences.unpersist()
        again.unpersist()
        differences = kept
        if report.caught_up:
            break  # read after the lake had every change the source held at the read before: what is left diverged
    report.duplicates = comparison.duplicates
    _summarize(differences, report)
    differences.unpersist()
    report.seconds = round(time.monotonic() - started, 1)
    return report


def _summarize(differences: DataFrame, report: TableReport) -> None:
    counts = {r["kind"]: r["n"] for r in differences.groupBy("kind").agg(F.count(F.lit(1)).alias("n")).collect()}
    report.missing, report.extra, report.differing = (counts.get(k, 0) for k in ("missing", "extra", "differing"))
    report.by_column = {r["column"]: r["n"] for r in differences.filter(F.col("kind") == "differing")
                        .select(F.explode("columns").alias("column")).groupBy("column")
                        .agg(F.count(F.lit(1)).alias("n")).collect()}
    for kind in ("missing", "extra", "differing"):
        keys = differences.filter(F.col("kind") == kind).select(KEY).orderBy(KEY).limit(SAMPLE).collect()
        if keys:
            report.sample[kind] = [json.loads(r[KEY]) for r in keys]


# --- the command ---------------------------------------------------------------------------------------------------

def logins_of(
    config: JobConfig, given: list[str], user: str | None, password_env: str | None
) -> dict[str, SourceLogin]:
    """Each source's JDBC login: `--source label=url` with `--user`/`--password-env`, else its `catalog`."""
    logins = {}
    for source in config.source_list:
        if source.catalog is not None:
            logins[source.label] = SourceLogin(source.catalog.jdbc_url, source.catalog.user, source.catalog.password)
    for item in given:
        label, sep, url = item.partition("=")
        if not sep or not url.startswith("jdbc:"):
            raise VerifyError(f"--source {item!r}: expected <source label>=<jdbc:postgresql: or jdbc:mariadb: URL>")
        if label not in {s.label for s in config.source_list}:
            raise VerifyError(f"--source {item!r}: no source labelled {label!r} in the config "
                              f"({', '.join(s.label for s in config.source_list)})")
        logins[label] = SourceLogin(url, user or "postgres", os.environ.get(password_env or "", "")
                                    if password_env else "")
    return logins


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conf", default=str(ROOT / "conf" / "local.yaml"), help="job config (default: local)")
    parser.add_argument("--table", action="append", default=[],
                        help="a Silver table, <database>.<table> (repeatable; default: every table of the job)")
    parser.add_argument("--source", action="append", default=[],
                        help="<source label>=<jdbc url> of a source database (repeatable; default: its catalog)")
    parser.add_argument("--user", help="the source login (default: the catalog's, else postgres)")
    parser.add_argument("--password-env", help="the environment variable holding its password")
    parser.add_argument("--partitions", type=int, default=4, help="source reads per table (default 4)")
    parser.add_argument("--settle-s", type=float, default=300.0,
                        help="at most this many seconds of reading differing keys again (default 300)")
    parser.add_argument("--interval-s", type=float, default=5.0,
                        help="between looks at the job's checkpoint, or between reads without one (default 5)")
    parser.add_argument("--connector-lag-s", type=float, default=5.0,
                        help="the connector's time to publish a committed change (default 5)")
    parser.add_argument("--json", help="write the report as JSON to this file")
    args = parser.parse_args(argv)

    if args.conf.endswith("conf/local.yaml"):  # the local stack's logins, unless set
        os.environ.update({**LOCAL_LOGINS, **os.environ})
    try:
        config = load_config(args.conf)
        logins = logins_of(config, args.source, args.user, args.password_env)
    except (ConfigError, VerifyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        spark = build_session("cdc-verify", config.spark, config.metastore)
        spark.sparkContext.setLogLevel("ERROR")
        # instants compared as text in a zone without daylight saving (two instants never print alike)
        spark.conf.set("spark.sql.session.timeZone", "UTC")
        tables = silver_tables(spark, config)
    except Exception as e:  # the lake or the metastore out of reach
        print(f"error: cannot read the lake: {_first_line(e)}", file=sys.stderr)
        return 2
    paths = {"/".join(p.rstrip("/").split("/")[-2:]).replace("/", "."): p for p in tables}
    paths = {n: p for n, p in paths.items() if not n.endswith(f".{config.dead_letters.table}")}
    unknown = [t for t in args.table if t not in paths]
    if unknown:
        print(f"error: no Silver table {', '.join(unknown)} (tables: {', '.join(sorted(paths)) or 'none'})",
              file=sys.stderr)
        return 2
    reports = []
    for name in args.table or sorted(paths):
        try:
            settling = Settling(args.partitions, args.settle_s, args.interval_s, args.connector_lag_s)
            report = verify_table(spark, paths[name], name, logins, settling, config=config)
        except VerifyError as e:
            report = TableReport(name, "", error=str(e))
        except Exception as e:  # a source out of reach, a JDBC error: named, the other tables go on
            report = TableReport(name, "", error=f"{type(e).__name__}: {_first_line(e)}")
        reports.append(report)
        print(_line(report), flush=True)
    document = {"equal": all(r.equal for r in reports),
                "tables": {r.table: {**r.__dict__, "equal": r.equal} for r in reports}}
    if args.json:
        Path(args.json).write_text(json.dumps(document, indent=2, default=str))
    return 2 if any(r.error for r in reports) else 0 if document["equal"] else 1


def _caught_up(r: TableReport) -> str:
    if r.caught_up is None:
        return ""
    return ("; the last after the lake applied what Kafka held at the one before" if r.caught_up else
            "; the lake had not applied what Kafka held at the last by the time limit")


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def _line(r: TableReport) -> str:
    if r.error:
        return f"{r.table}: NOT COMPARED: {r.error}"
    verdict = "equal" if r.equal else "DIFFERS"
    line = (f"{r.table} ({r.source}): {verdict}; rows {r.source_rows} in the source, {r.silver_rows} in Silver; "
            f"missing {r.missing}, extra {r.extra}, differing {r.differing}, keys held twice {r.duplicates}; "
            f"{r.reads} read(s) ({r.moved} key(s) moved between them{_caught_up(r)}), {r.seconds} s")
    if r.by_column:
        line += "; by column: " + ", ".join(f"{c} {n}" for c, n in sorted(r.by_column.items()))
    for kind, keys in r.sample.items():
        line += f"\n  {kind}: " + ", ".join(json.dumps(k) for k in keys)
    if r.not_compared:
        line += "\n  not compared: " + ", ".join(f"{c} ({why})" for c, why in r.not_compared.items())
    if r.only_in_source or r.only_in_silver:
        line += (f"\n  columns only in the source: {r.only_in_source or 'none'}; "
                 f"only in Silver: {r.only_in_silver or 'none'}")
    return line


if __name__ == "__main__":
    sys.exit(main())
