"""Column types widened upstream that Hudi cannot take in place: the table rewritten once with the new types.

Hudi 1.0.2 refuses a decimal of another precision or scale in an existing table (its schema check: Avro reads
a fixed of one size into no other), and takes float -> double in place but reads the old files' values through
their decimal text (0.33333334 where PostgreSQL's cast gives 0.3333333432674408). Its schema-on-read mode
would take both, but is experimental and other engines do not read it. So when a batch's column is a lossless
widening of the table's:

    decimal(p, s) -> decimal(p', s')   s' >= s and p' - s' >= p - s (every value fits, unrounded)
    float, int -> double               (Spark's cast is exact: the double of the float's binary value)
    int, bigint -> decimal             when the decimal holds every digit (10 or 19 before the point)
    decimal -> string                  a numeric grown past 38 digits, which the job writes as its exact text

the table is rewritten before the batch's upsert: read whole, the columns cast, written back as one Hudi
`insert_overwrite_table` (a replacecommit: all or nothing; the old file groups are left to the cleaner). Its
commit carries no `_cdc.committed` (app/sink/commit.py passes it over), and turns Hudi's schema check off for that
commit only, so it can change the types; every other write keeps the check. int -> bigint Hudi takes in place,
exactly. Any other change of a column's type (a narrowing, text -> int, which Hudi would even take, keeping the
column a string) raises ColumnTypeChangeError: the table is quarantined (app/sink/quarantine.py), since the source
rewrote the column's values (PostgreSQL's `USING` expression) without an event the lake could follow.

A crash during the rewrite leaves an inflight replacecommit, rolled back by the next write, which finds the old
types and rewrites again; a crash after it finds the new types and goes on with the upsert. The cost is one read
and one write of the whole table, once per change: the log line says how many rows and how long.

The table's schema is read from its timeline (the latest commit's schema, not the data files), and only when the
batch's columns differ from those this process last wrote to the table.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from app.errors import ColumnTypeChangeError
from app.sink.hudi import SYNC_OFF, HudiTarget, meta_client, table_exists, with_key_lengths, write_options
from app.spark import jvm_class, with_options

log = logging.getLogger(__name__)

# A rewrite's own options: its commit changes column types, which Hudi's schema check would refuse.
REWRITE_OPTIONS = {
    "hoodie.datasource.write.operation": "insert_overwrite_table",
    "hoodie.avro.schema.validate": "false",
    "hoodie.datasource.write.schema.allow.auto.evolution.column.drop": "true",
    # Hudi would otherwise cast the rewrite's columns back to the table's types where it deems that a promotion,
    # among them text to decimal (HoodieSchemaUtils.canonicalizeSchema): a decimal column widened to text stayed
    # decimal, and its first value past the table's precision failed every later write of the table.
    "hoodie.internal.write.schema.canonicalize": "false",
    **SYNC_OFF,  # the batch's upsert right after syncs the catalog
}


def type_name(data_type: DataType) -> str:
    """A Spark type as table_column_types names the table's: `decimal(p,s)`, an Avro logical type (`date`,
    `timestamp-micros`, ...) or primitive type (`int`, `long`, `string`, ...), `record`, `array`, `map`."""
    if isinstance(data_type, DecimalType):
        return f"decimal({data_type.precision},{data_type.scale})"
    return _SPARK_NAMES.get(type(data_type), data_type.typeName())


_SPARK_NAMES: dict[type, str] = {
    ByteType: "int", ShortType: "int", IntegerType: "int", LongType: "long", FloatType: "float",
    DoubleType: "double", StringType: "string", BinaryType: "bytes", BooleanType: "boolean", DateType: "date",
    TimestampType: "timestamp-micros", TimestampNTZType: "local-timestamp-micros", StructType: "record",
    ArrayType: "array", MapType: "map",
}
# Changes Hudi applies in place, old values read exactly: the lake's type follows with nothing to rewrite.
IN_PLACE: Final = {("int", "long")}


def widened_columns(table_types: dict[str, str], batch_schema: StructType, table: str = "") -> dict[str, DataType]:
    """The batch's columns whose type is a widening of the table's that needs a rewrite (module docstring).

    Args:
        table_types: the table's columns -> their type as table_column_types names it.

    Raises:
        ColumnTypeChangeError: a column's type changed otherwise (names `table`, the column, both types, the remedy).
    """
    widened: dict[str, DataType] = {}
    for field in batch_schema.fields:
        old, new = table_types.get(field.name), type_name(field.dataType)
        if old is None or old == new or not _known(old) or not _known(new) or (old, new) in IN_PLACE:
            continue  # a type this module does not know (a union, a record, ...) is left to Hudi
        if _rewritable(old, field.dataType):
            widened[field.name] = field.dataType
            continue
        raise ColumnTypeChangeError(
            f"{table}: column {field.name} changed type from {old} (the table's) to {new} (the source's), which the "
            f"lake cannot follow: the source rewrote its values, perhaps through an expression. Remedy: drop the "
            f"table's folder and catalog entry, remove its quarantine file, and run an incremental snapshot of the "
            f"source table (docs/schema-changes.md)"
        )
    return widened


def _known(name: str) -> bool:
    return name.startswith("decimal(") or name in _PRIMITIVES


_PRIMITIVES: Final = frozenset(
    {"int", "long", "float", "double", "string", "bytes", "boolean", "date", "timestamp-micros",
     "local-timestamp-micros"}
)


def _rewritable(old: str, new: DataType) -> bool:
    """A lossless widening the table is rewritten for (module docstring)."""
    if old.startswith("decimal(") and isinstance(new, DecimalType):
        precision, scale = (int(x) for x in old[len("decimal("):-1].split(","))
        return new.scale >= scale and new.precision - new.scale >= precision - scale
    if isinstance(new, DoubleType):
        return old in ("float", "int")  # exact in a double, as PostgreSQL's cast gives it
    if isinstance(new, StringType):  # a numeric grown past 38 digits arrives as its exact decimal text
        return old.startswith("decimal(")
    if isinstance(new, DecimalType):  # an integer to a numeric holding all its digits
        return (old == "int" and new.precision - new.scale >= 10) or (old == "long" and new.precision - new.scale >= 19)
    return False


def table_column_types(spark: SparkSession, path: str) -> dict[str, str]:
    """The table's top-level columns and their types, from its latest commit's schema (the timeline, not the data):
    `decimal(p,s)` for a decimal, else the Avro type's name (`float`, `double`, `string`, `record`, ...)."""
    resolver = jvm_class(spark, "org.apache.hudi.common.table.TableSchemaResolver")(meta_client(spark, path))
    schema = json.loads(str(resolver.getTableAvroSchema(False).toString()))
    return {f["name"]: _type_name(f["type"]) for f in schema["fields"]}


def _type_name(node: Any) -> str:
    if isinstance(node, list):  # a union: its one non-null branch
        branches = [b for b in node if b != "null"]
        return _type_name(branches[0]) if len(branches) == 1 else "union"
    if isinstance(node, dict):
        if node.get("logicalType") == "decimal":
            return f"decimal({node['precision']},{node.get('scale', 0)})"
        if "logicalType" in node:
            return str(node["logicalType"])
        return _type_name(node.get("type"))
    return str(node)


@dataclass(frozen=True)
class SchemaChange:
    """What a batch changes in an existing table's columns."""

    widened: dict[str, DataType]  # columns the table was rewritten for
    added: tuple[str, ...]  # columns the table did not have


NO_CHANGE = SchemaChange({}, ())


class Widening:
    """Rewrites tables whose columns were widened upstream; remembers, per table, the batch columns it checked, so
    a batch with the same columns costs nothing. Shared by the writer threads."""

    def __init__(self) -> None:
        self._checked: dict[str, str] = {}  # table path -> the batch schema (JSON) last checked
        self._lock = threading.Lock()

    def apply(self, rows_df: DataFrame, target: HudiTarget, batch_id: int, query_id: str,
              extra: Callable[[], dict[str, str]] | None = None) -> SchemaChange:
        """Rewrite the table when the batch widens a column it needs rewriting for; returns what the batch changes
        (nothing for a new table, or columns checked before). `extra`: asked only for a rewrite, write options added
        to its own (the crash tests' pause points, app/hooks.py).

        Raises:
            ColumnTypeChangeError: a column's type changed in a way the lake cannot follow (widened_columns).
        """
        columns = rows_df.schema.json()
        with self._lock:
            if self._checked.get(target.path) == columns:
                return NO_CHANGE
        spark = rows_df.sparkSession
        change = NO_CHANGE
        if table_exists(spark, target.path):
            table_types = table_column_types(spark, target.path)
            change = SchemaChange(widened_columns(table_types, rows_df.schema, target.qualified_name),
                                  tuple(f.name for f in rows_df.schema.fields if f.name not in table_types))
        if change.widened:
            rewrite(spark, target, change.widened, batch_id, query_id, extra=extra() if extra else None)
        with self._lock:
            self._checked[target.path] = columns
        return change


def rewrite(spark: SparkSession, target: HudiTarget, widened: dict[str, DataType], batch_id: int,
            query_id: str, *, extra: dict[str, str] | None = None) -> None:
    """The table rewritten whole with `widened` columns cast (module docstring)."""
    started = time.monotonic()
    current = spark.read.format("hudi").load(target.path)
    rows = current.select(*[
        F.col(c).cast(widened[c]).alias(c) if c in widened else F.col(c)
        for c in current.columns if not c.startswith("_hoodie_") or c == "_hoodie_is_deleted"
    ])
    if target.key_lengths:  # a key column turned text (decimal -> string) has a length now
        rows = with_key_lengths(rows, target.record_key)
    options = {**write_options(target, batch_id, query_id), **REWRITE_OPTIONS, **(extra or {})}
    with_options(rows.write.format("hudi"), options).mode("append").save(target.path)
    log.warning(
        "batch=%s table=%s: columns widened upstream (%s): the table was rewritten with the new types in %.1f s "
        "(docs/schema-changes.md)", batch_id, target.qualified_name,
        ", ".join(f"{c} -> {t.simpleString()}" for c, t in sorted(widened.items())), time.monotonic() - started,
    )
