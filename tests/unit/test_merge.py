"""Topics merged into one Silver table (partitions, shards) must agree on column types (app/batch/processor.py)."""
from __future__ import annotations

import pytest
from pyspark.sql.types import (
    ArrayType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from app.batch.merge import check_merge_types
from app.errors import EnvelopeError


def _schema(**columns: object) -> StructType:
    return StructType([StructField(name, t) for name, t in columns.items()])  # type: ignore[arg-type]


def test_same_types_and_widening_within_a_numeric_family_merge() -> None:
    check_merge_types("lake.orders", [
        ("a", _schema(id=IntegerType(), price=DecimalType(10, 2), ratio=FloatType(), tags=ArrayType(StringType()))),
        ("b", _schema(id=LongType(), price=DecimalType(12, 2), ratio=DoubleType(),
                      tags=ArrayType(StringType(), containsNull=False), extra=StringType())),
        ("c", _schema(id=IntegerType())),  # a column one topic lacks is fine
    ])


@pytest.mark.parametrize(("left", "right"), [
    (IntegerType(), StringType()),  # Spark's union would make both strings
    (DecimalType(10, 2), DoubleType()),  # exact vs nearest: not one family
    (LongType(), DecimalType(20, 0)),
    (ArrayType(IntegerType()), ArrayType(StringType())),
])
def test_a_type_conflict_names_the_column_both_topics_and_types(left: object, right: object) -> None:
    with pytest.raises(EnvelopeError) as e:
        check_merge_types("lake.orders", [("pg.shop.orders", _schema(id=IntegerType(), v=left)),
                                          ("maria.shop.orders", _schema(id=IntegerType(), v=right))])
    message = str(e.value)
    assert "lake.orders: column v is" in message
    assert "pg.shop.orders" in message and "maria.shop.orders" in message
