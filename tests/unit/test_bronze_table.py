"""Bronze in the catalog (app/sink/bronze_table.py): only complete ranges are partitions, a range published by a
batch is registered after it, and a start registers what a kill left unregistered, once."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from app.config import JobConfig
from app.sink.bronze import MARKER, BronzeRange, write_bronze
from app.sink.bronze_table import BronzeTable
from tests.conftest import RUN_ID
from tests.unit.test_bronze import kafka_batch, offsets_of


def _shown(spark: SparkSession, table: BronzeTable) -> list[tuple[str, int, int]]:
    spark.catalog.refreshTable(f"{table.database}.{table.table}")
    rows = spark.table(f"{table.database}.{table.table}").select("topic", "partition", "offset").collect()
    return sorted((r.topic, r.partition, r.offset) for r in rows)


@pytest.mark.stack  # the table lives in the stack's metastore
def test_only_complete_ranges_are_shown_and_each_is_registered_once(
    spark: SparkSession, local_config: JobConfig, tmp_path: Path
) -> None:
    bronze = str(tmp_path / "bronze")
    database = f"bt_{RUN_ID}"
    config = dataclasses.replace(local_config, lake=dataclasses.replace(
        local_config.lake, bronze_path=bronze, database=database, bronze_table="cdc_bronze"))
    first = {("p.s.a", 0): range(0, 10), ("p.s.b", 0): range(0, 3)}
    second = {("p.s.a", 0): range(10, 15)}
    write_bronze(kafka_batch(spark, first), bronze, offsets_of(first))
    write_bronze(kafka_batch(spark, second), bronze, offsets_of(second))
    # A write cut short: the range's files, no marker (Spark's own `_SUCCESS` removed: it is Bronze's marker's name).
    cut = BronzeRange("p.s.a", 0, 15, 19).folder(bronze)
    kafka_batch(spark, {("p.s.a", 0): range(15, 20)}).write.parquet(cut)
    (Path(cut) / MARKER).unlink()
    table = BronzeTable(config)
    try:
        # The first start (Bronze written before the table existed): the complete ranges only.
        assert table.repair(spark) == 3
        expected = sorted([("p.s.a", 0, o) for o in range(15)] + [("p.s.b", 0, o) for o in range(3)])
        assert _shown(spark, table) == expected
        assert table.repair(spark) == 0  # nothing twice

        # A batch's range: registered after the batch (published, then register_pending).
        third = {("p.s.b", 0): range(3, 8)}
        table.published(write_bronze(kafka_batch(spark, third), bronze, offsets_of(third)).written)
        table.register_pending(spark)
        assert _shown(spark, table) == sorted(expected + [("p.s.b", 0, o) for o in range(3, 8)])

        # A kill between a range's marker and its registration: the next start registers it.
        fourth = {("p.s.b", 0): range(8, 9)}
        write_bronze(kafka_batch(spark, fourth), bronze, offsets_of(fourth))
        assert table.repair(spark) == 1
        assert _shown(spark, table)[-1] == ("p.s.b", 0, 8)
        # A hole below registered ranges (a statement partly applied): registered too.
        spark.sql(f"alter table {database}.cdc_bronze drop partition (topic='p.s.a', `partition`=0, "
                  f"offsets='{0:020d}-{9:020d}')")
        assert len(_shown(spark, table)) == 15 + 9 - 10
        assert table.repair(spark) == 1
        assert len(_shown(spark, table)) == 15 + 9
    finally:
        spark.sql(f"drop database if exists {database} cascade")
