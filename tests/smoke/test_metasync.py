"""Meta sync runs only when the catalog can be behind a table (app/sink/metasync.py), on the real metastore with the
lake on the stack's S3: a table's first write in a run syncs, a write with the same columns does not, new columns
do, a restarted run syncs at its first write only when the catalog lacks the table or a column of the batch, and a
table the run skips as committed is synced once."""
from __future__ import annotations

import dataclasses
import uuid

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from app.config import PartitionSpec
from app.sink.hudi import SYNC_OFF, HudiTarget, completed_instants, write_silver
from app.sink.metasync import MetaSync
from tests.conftest import RUN_ID

pytestmark = pytest.mark.stack
DATABASE = f"ms_{RUN_ID}"


def rows(spark: SparkSession, version: int, extra: bool = False) -> DataFrame:
    df = spark.range(4).select(
        "id", F.lit(f"v{version}").alias("name"), (F.col("id") % 2).cast("string").alias("part"),
        F.lit(f"{version:04d}").alias("_cdc_position"), F.lit(False).alias("_hoodie_is_deleted"),
    )
    return df.withColumn("extra", F.lit(version)) if extra else df


def write(sync: MetaSync, target: HudiTarget, df: DataFrame, batch: int) -> dict[str, str]:
    """As the table writer does (app/batch/writer.py): the options MetaSync gives, the write, then `written`."""
    options = sync.write_options(target, df)
    write_silver(df, target, batch, RUN_ID, options)
    sync.written(target, df, options)
    return options


def last_synced(spark: SparkSession, table: str) -> str:
    found = spark.sql(f"show tblproperties {DATABASE}.{table} ('last_commit_time_sync')").collect()
    return str(found[0]["value"])


def columns(spark: SparkSession, table: str) -> list[str]:
    return [c.name for c in spark.catalog.listColumns(f"{DATABASE}.{table}")]


def test_a_table_is_synced_when_new_changed_or_first_written_by_a_run(spark: SparkSession, lake_root: str) -> None:
    table = f"cow_{uuid.uuid4().hex[:6]}"
    target = HudiTarget(DATABASE, table, f"{lake_root}/metasync/{table}", ("id",))
    sync = MetaSync()

    assert write(sync, target, rows(spark, 1), 1) == {}
    first = completed_instants(spark, target.path)[-1]
    assert last_synced(spark, table) == first
    assert write(sync, target, rows(spark, 2), 2) == SYNC_OFF  # same columns: the catalog is not behind
    assert last_synced(spark, table) == first
    assert "extra" not in columns(spark, table)

    assert write(sync, target, rows(spark, 3, extra=True), 3) == {}  # a column added upstream
    assert "extra" in columns(spark, table)
    assert last_synced(spark, table) == completed_instants(spark, target.path)[-1]

    restarted = MetaSync()  # a new run: the catalog holds the table with these columns already
    assert write(restarted, target, rows(spark, 4, extra=True), 4) == SYNC_OFF
    assert spark.table(f"{DATABASE}.{table}").filter("name = 'v4'").count() == 4

    # A commit whose sync never ran (a crash between the two) added a column: the next run's first write syncs.
    more = rows(spark, 5, extra=True).withColumn("more", F.lit("m"))
    write_silver(more, target, 5, RUN_ID, SYNC_OFF)
    assert "more" not in columns(spark, table)
    assert write(MetaSync(), target, more, 6) == {}
    assert "more" in columns(spark, table)
    assert last_synced(spark, table) == completed_instants(spark, target.path)[-1]
    spark.sql(f"drop table {DATABASE}.{table}")  # dropped by hand: the next run registers it again
    assert write(MetaSync(), target, more, 7) == {}
    assert spark.table(f"{DATABASE}.{table}").filter("name = 'v5'").count() == 4

    every = MetaSync(every_commit=True)
    assert every.write_options(target, rows(spark, 5, extra=True)) == {}
    every.written(target, rows(spark, 5, extra=True), {})
    assert every.write_options(target, rows(spark, 5, extra=True)) == {}


def test_a_partitioned_table_syncs_every_commit(spark: SparkSession, lake_root: str) -> None:
    table = f"part_{uuid.uuid4().hex[:6]}"
    target = HudiTarget(DATABASE, table, f"{lake_root}/metasync/{table}", ("id",), partition=PartitionSpec("part"))
    sync = MetaSync()
    for batch in (1, 2):
        assert write(sync, target, rows(spark, batch), batch) == {}  # a batch may add a partition
    assert last_synced(spark, table) == completed_instants(spark, target.path)[-1]


def test_a_committed_table_never_synced_is_synced_once_when_skipped(spark: SparkSession, lake_root: str) -> None:
    """A Merge-on-Read table committed without its sync (a crash between the two): the run that skips its batch
    brings the catalog up (the table, `_ro` and `_rt`), once."""
    table = f"mor_{uuid.uuid4().hex[:6]}"
    target = HudiTarget(DATABASE, table, f"{lake_root}/metasync/{table}", ("id",), table_type="MERGE_ON_READ")
    write_silver(rows(spark, 1), target, 1, RUN_ID, SYNC_OFF)
    spark.sql(f"create database if not exists {DATABASE}")
    assert not spark.catalog.tableExists(f"{DATABASE}.{table}")

    sync = MetaSync()
    sync.ensure(spark, target)
    for name in (table, f"{table}_ro", f"{table}_rt"):
        assert spark.table(f"{DATABASE}.{name}").count() == 4, name
    assert last_synced(spark, table) == completed_instants(spark, target.path)[-1]

    spark.sql(f"drop table {DATABASE}.{table}")
    sync.ensure(spark, target)  # synced by this run already: nothing to do
    assert not spark.catalog.tableExists(f"{DATABASE}.{table}")
    # Its next write with the same columns syncs: the catalog lacks the table.
    assert write(sync, dataclasses.replace(target), rows(spark, 2), 2) == {}
    assert spark.catalog.tableExists(f"{DATABASE}.{table}")
    assert write(MetaSync(), target, rows(spark, 3), 3) == SYNC_OFF  # a new run: all three are current
    spark.sql(f"drop table {DATABASE}.{table}_rt")
    assert write(MetaSync(), target, rows(spark, 4), 4) == {}  # one of the three missing
    assert spark.table(f"{DATABASE}.{table}_rt").filter("name = 'v4'").count() == 4


def test_a_new_run_finds_every_type_current_in_the_catalog(spark: SparkSession, lake_root: str) -> None:
    """The catalog's columns (as meta sync registers them from the table's Avro schema) compare equal to the
    batch's for each type the job writes: a new run's first write needs no sync."""
    table = f"types_{uuid.uuid4().hex[:6]}"
    target = HudiTarget(DATABASE, table, f"{lake_root}/metasync/{table}", ("id",))
    df = rows(spark, 1).select(
        "*", F.lit(1.5).cast("decimal(12,2)").alias("amount"), F.current_timestamp().alias("at"),
        F.current_date().alias("day"), F.lit(1.5).cast("double").alias("ratio"), F.lit(2.5).cast("float").alias("f"),
        F.lit(7).cast("short").alias("small"), F.lit(True).alias("flag"), F.lit(b"\x00\x01").alias("raw"),
        F.array(F.lit("a"), F.lit(None).cast("string")).alias("tags"),
        F.struct(F.lit(1).alias("x"), F.lit("y").alias("y")).alias("point"),
        F.create_map(F.lit("k"), F.lit(1)).alias("attrs"), F.lit(None).cast("string").alias("nothing"),
    )
    assert write(MetaSync(), target, df, 1) == {}
    assert write(MetaSync(), target, df, 2) == SYNC_OFF, columns(spark, table)
