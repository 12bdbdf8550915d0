"""Composite record keys whose text values hold Hudi's separators stay apart (app/sink/hudi.py `key_lengths_needed`).

Hudi's composite key text joins `column:value` pairs with commas, the values unescaped: on columns (a, b), the keys
('x,b:y', 'z') and ('x', 'y,b:z') are both `a:x,b:y,b:z`, and an upsert of the second merged it into the first's
row. A new table whose composite key has a text column keeps each text value's length as its key's last field. Each
case below is written through `write_silver` on the lake of the shipped config (S3): the insert, then an update of
every row in a later batch (the merge path), then a delete, on Copy-on-Write and on a partitioned Merge-on-Read
table (the record-level index). A table created before (its key without the lengths) keeps its key; a key column
widened to text, and a table whose properties only the backup holds, keep theirs too.
"""
from __future__ import annotations

import uuid
from dataclasses import replace
from decimal import Decimal

import pytest
from pyspark.sql import DataFrame, SparkSession

from app.cdc.columns import KEY_LENGTHS_COL
from app.config import PartitionSpec
from app.sink import hudi
from app.sink.hudi import HudiTarget, key_lengths_needed, recorded_layout, write_silver
from app.sink.lakefs import fs_and_path
from app.sink.widening import Widening

pytestmark = pytest.mark.stack

NO_SYNC = {"hoodie.datasource.meta.sync.enable": "false", "hoodie.datasource.hive_sync.enable": "false"}
SCHEMA = "a string, b string, v int, region string, _cdc_position string, _hoodie_is_deleted boolean"
# Keys that Hudi's composite key text cannot tell apart, and keys beside them: null against the text `__null__`,
# '' against `__empty__` (Hudi's placeholders), separators alone.
KEYS = [("x,b:y", "z"), ("x", "y,b:z"), ("p", None), ("p", "__null__"), ("q", ""), ("q", "__empty__"),
        ("a:b", "c"), ("a", "b:c"), ("", ","), (",", "")]


def _rows(spark: SparkSession, version: int, position: str, deleted: frozenset[int] = frozenset()) -> DataFrame:
    return spark.createDataFrame(
        [(a, b, version * 100 + n, f"r{n % 2}", position, n in deleted) for n, (a, b) in enumerate(KEYS)], SCHEMA)


def _silver(spark: SparkSession, path: str) -> list[tuple[str | None, str | None, int]]:
    rows = spark.read.format("hudi").load(path).select("a", "b", "v").collect()
    return sorted(((r["a"], r["b"], r["v"]) for r in rows), key=lambda r: r[2])


@pytest.mark.parametrize("layout", ["cow", "mor_partitioned"])
def test_keys_with_separators_stay_apart_through_insert_update_and_delete(
    spark: SparkSession, lake_root: str, layout: str
) -> None:
    path = f"{lake_root}/keys-{layout}-{uuid.uuid4().hex[:6]}/silver/k/t"
    target = HudiTarget("k", "t", path, ("a", "b"))
    if layout == "mor_partitioned":
        target = replace(target, table_type="MERGE_ON_READ", partition=PartitionSpec("region"))
    first = _rows(spark, 1, "01")
    target = replace(target, key_lengths=key_lengths_needed(target, first))
    assert target.key_lengths
    write_silver(first, target, 0, "q", NO_SYNC)
    assert _silver(spark, path) == [(a, b, 100 + n) for n, (a, b) in enumerate(KEYS)]

    # A later batch: every row updated (merged with the table's), then two deleted.
    write_silver(_rows(spark, 2, "02"), target, 1, "q", NO_SYNC)
    assert _silver(spark, path) == [(a, b, 200 + n) for n, (a, b) in enumerate(KEYS)]
    write_silver(_rows(spark, 3, "03", frozenset({0, 3})), target, 2, "q", NO_SYNC)
    assert _silver(spark, path) == [(a, b, 300 + n) for n, (a, b) in enumerate(KEYS) if n not in (0, 3)]

    recorded = recorded_layout(spark, path)
    assert recorded is not None and recorded.record_key == ("a", "b") and recorded.key_lengths
    lengths = spark.read.format("hudi").load(path).filter("v = 301").select(KEY_LENGTHS_COL).first()
    assert lengths is not None and lengths[0] == "1.5"  # ('x', 'y,b:z')


def test_a_key_without_text_and_a_table_created_before_keep_hudis_key(spark: SparkSession, lake_root: str) -> None:
    root = f"{lake_root}/keys-plain-{uuid.uuid4().hex[:6]}/silver/k"
    numbers = spark.createDataFrame([(1, 2, "01", False)],
                                    "a int, b int, _cdc_position string, _hoodie_is_deleted boolean")
    assert not key_lengths_needed(HudiTarget("k", "n", f"{root}/n", ("a", "b")), numbers)
    assert not key_lengths_needed(HudiTarget("k", "one", f"{root}/one", ("a",)), _rows(spark, 1, "01"))

    # A table whose composite text key was created without the lengths (by an earlier version) keeps that key.
    before = HudiTarget("k", "before", f"{root}/before", ("a", "b"))
    write_silver(_rows(spark, 1, "01"), before, 0, "q", NO_SYNC)
    recorded = recorded_layout(spark, before.path)
    assert recorded is not None and recorded.record_key == ("a", "b") and not recorded.key_lengths
    assert not key_lengths_needed(before, _rows(spark, 2, "02"))
    write_silver(_rows(spark, 2, "02"), before, 1, "q", NO_SYNC)
    table = spark.read.format("hudi").load(before.path)
    assert KEY_LENGTHS_COL not in table.columns
    # The limitation such a table keeps: three pairs of keys are one row each (the separators, null against
    # `__null__`, '' against `__empty__`).
    assert table.count() == len(KEYS) - 3


def test_a_key_column_widened_to_text_keeps_one_row_per_key(spark: SparkSession, lake_root: str) -> None:
    """A numeric key column grown past 38 digits arrives as text (decimal -> string): the table is rewritten with the
    new type (app/sink/widening.py), and its rows' key lengths with it, so the next upserts and deletes find them."""
    path = f"{lake_root}/keys-widened-{uuid.uuid4().hex[:6]}/silver/k/w"
    columns = "_cdc_position string, _hoodie_is_deleted boolean"
    first = spark.createDataFrame([(Decimal(12345), "eu", 1, "01", False), (Decimal(7), "us", 2, "01", False)],
                                  f"amount decimal(10,0), region string, v int, {columns}")
    target = HudiTarget("k", "w", path, ("amount", "region"))
    target = replace(target, key_lengths=key_lengths_needed(target, first))
    write_silver(first, target, 0, "q", NO_SYNC)
    assert [r[0] for r in spark.read.format("hudi").load(path).select(KEY_LENGTHS_COL).collect()] == [".2", ".2"]

    wide = "1" * 42  # past the table's decimal(10,0): it must be text by now
    widened = spark.createDataFrame([("12345", "eu", 10, "02", False), ("7", "us", 20, "02", True),
                                     (wide, "x", 30, "02", False)], f"amount string, region string, v int, {columns}")
    change = Widening().apply(widened, target, 1, "q", extra=lambda: NO_SYNC)
    assert list(change.widened) == ["amount"]
    write_silver(widened, target, 1, "q", NO_SYNC)
    rows = spark.read.format("hudi").load(path).select("amount", "region", "v", KEY_LENGTHS_COL).collect()
    assert sorted(tuple(r) for r in rows) == sorted([("12345", "eu", 10, "5.2"), (wide, "x", 30, "42.1")])


def test_the_layout_read_from_the_properties_backup(spark: SparkSession, lake_root: str) -> None:
    """Hudi rewrites a table's properties through a backup (create it, delete the properties, write them anew): a
    crash in between leaves the backup only, which Hudi reads, and so does the job."""
    path = f"{lake_root}/keys-backup-{uuid.uuid4().hex[:6]}/silver/k/b"
    rows = _rows(spark, 1, "01")
    target = replace(HudiTarget("k", "b", path, ("a", "b")), key_lengths=True)
    write_silver(rows, target, 0, "q", NO_SYNC)
    fs, properties = fs_and_path(spark, f"{path}/.hoodie/hoodie.properties")
    _, backup = fs_and_path(spark, f"{path}/.hoodie/hoodie.properties.backup")
    assert fs.rename(properties, backup)
    hudi._RECORDED.pop(path, None)  # as a new process finds the table
    recorded = recorded_layout(spark, path)
    assert recorded is not None and recorded.record_key == ("a", "b") and recorded.key_lengths
    assert key_lengths_needed(replace(target, key_lengths=False), rows)
