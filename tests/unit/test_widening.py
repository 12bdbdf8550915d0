"""Which upstream type changes rewrite a table, which Hudi takes in place, which quarantine (app/sink/widening.py)."""
from __future__ import annotations

import pytest
from pyspark.sql.types import (
    ArrayType,
    DataType,
    DecimalType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from app.batch.writer import columns_to_snapshot
from app.errors import ColumnTypeChangeError
from app.sink.widening import _type_name, widened_columns


def _batch(**columns: DataType) -> StructType:
    return StructType([StructField(name, type_) for name, type_ in columns.items()])


@pytest.mark.parametrize(("old", "new"), [
    ("decimal(6,2)", DecimalType(12, 2)),  # more digits before the point
    ("decimal(5,2)", DecimalType(7, 4)),  # more scale, as many before the point
    ("float", DoubleType()),
    ("int", DoubleType()),
    ("int", DecimalType(10, 0)),
    ("long", DecimalType(21, 2)),
    ("decimal(30,2)", StringType()),  # numeric(30,2) -> numeric(40,2): past Spark's 38 digits, exact text
])
def test_lossless_widenings_rewrite_the_table(old: str, new: DataType) -> None:
    assert widened_columns({"id": "int", "c": old}, _batch(id=IntegerType(), c=new)) == {"c": new}


@pytest.mark.parametrize(("old", "new"), [
    ("int", LongType()),  # Hudi's own promotion, exact
    ("string", StringType()),  # varchar(10) -> varchar(50)
    ("decimal(12,2)", DecimalType(12, 2)),
    ("timestamp-micros", TimestampType()),
    ("array", ArrayType(IntegerType())),  # inside a nested type: left to Hudi
    ("uuid", StringType()),  # a logical type this module does not know: left to Hudi
])
def test_unchanged_or_in_place_types_need_nothing(old: str, new: DataType) -> None:
    assert widened_columns({"c": old}, _batch(c=new)) == {}


def test_a_new_column_needs_nothing() -> None:
    assert widened_columns({"id": "int"}, _batch(id=IntegerType(), added=DecimalType(6, 2))) == {}


@pytest.mark.parametrize(("old", "new"), [
    ("string", IntegerType()),  # text -> int USING code::int
    ("long", IntegerType()),  # a narrowing
    ("decimal(12,2)", DecimalType(6, 2)),
    ("decimal(6,2)", DecimalType(6, 3)),  # more scale, fewer digits before the point: values may not fit
    ("double", DecimalType(38, 10)),
    ("int", StringType()),
])
def test_any_other_change_names_table_column_types_and_remedy(old: str, new: DataType) -> None:
    with pytest.raises(ColumnTypeChangeError) as info:
        widened_columns({"c": old}, _batch(c=new), "lake.items")
    message = str(info.value)
    assert "lake.items: column c changed type from " + old in message
    assert "incremental snapshot" in message


def test_the_table_schema_names_its_types() -> None:
    assert _type_name(["null", {"type": "fixed", "name": "f", "size": 6, "logicalType": "decimal",
                                "precision": 12, "scale": 2}]) == "decimal(12,2)"
    assert _type_name(["null", {"type": "long", "logicalType": "timestamp-micros"}]) == "timestamp-micros"
    assert _type_name(["null", "float"]) == "float"
    assert _type_name({"type": "array", "items": "int"}) == "array"
    assert _type_name(["null", "int", "string"]) == "union"


@pytest.mark.parametrize(("policy", "expected"), [
    ("all", ["color", "n"]),  # a function default may arrive without one (MariaDB: always)
    ("with_default", ["n"]),
    ("none", []),
])
def test_which_added_columns_ask_for_a_snapshot(policy: str, expected: list[str]) -> None:
    assert columns_to_snapshot(["color", "n"], ("n",), policy) == expected
