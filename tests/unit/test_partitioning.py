"""Partitioning per table (app/sink/partitioning.py) and the Hudi options each table layout gets (app/sink/hudi.py)."""
from __future__ import annotations

from dataclasses import replace
from datetime import UTC, date, datetime, timedelta, timezone

import pytest
from chispa import assert_df_equality
from pyspark.sql import SparkSession
from pyspark.sql.types import (
    DateType,
    IntegerType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from app.config import JobConfig, PartitionSpec
from app.errors import EnvelopeError
from app.sink.deadletters import dead_letter_target
from app.sink.hudi import HudiTarget, index_options, lake_target, sized_options, write_options
from app.sink.partitioning import with_partition_field

ROWS = StructType([
    StructField("id", IntegerType()),
    StructField("placed_at", TimestampType()),
    StructField("due", DateType()),
    StructField("local_at", TimestampNTZType()),
    StructField("region", StringType()),
])
PLUS_14 = timezone(timedelta(hours=14))


@pytest.mark.parametrize(
    ("text", "spec", "field"),
    [
        ("region", PartitionSpec("region"), "region"),
        ("day(placed_at)", PartitionSpec("placed_at", "day"), "placed_at_day"),
        (" month( placed_at ) ", PartitionSpec("placed_at", "month"), "placed_at_month"),
        ("year(due)", PartitionSpec("due", "year"), "due_year"),
    ],
)
def test_partition_specs_parse(text: str, spec: PartitionSpec, field: str) -> None:
    assert PartitionSpec.parse(text) == spec
    assert spec.field == field
    assert PartitionSpec.parse(str(spec)) == spec


@pytest.mark.parametrize("text", ["hour(placed_at)", "day()", "day(a, b)", "a.b", "", "day(placed_at"])
def test_bad_partition_specs_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="expected a column name or day"):
        PartitionSpec.parse(text)


def test_day_month_year_of_a_timestamp_are_utc_whatever_the_session_zone(spark: SparkSession) -> None:
    # The test session runs in America/Los_Angeles: 2024-03-01 02:30 UTC is still Feb 29 there.
    assert spark.conf.get("spark.sql.session.timeZone") != "UTC"
    rows = [
        (1, datetime(2024, 3, 1, 2, 30, tzinfo=UTC), date(2024, 3, 1), datetime(2024, 3, 1, 23, 59), "eu"),
        (2, datetime(2024, 1, 1, 0, 30, tzinfo=PLUS_14), date(1969, 12, 31), datetime(1969, 12, 31, 0, 0), "us"),
        (3, datetime(1969, 12, 31, 23, 59, 59, tzinfo=UTC), None, None, None),  # before the epoch: floor
        (4, None, None, None, None),
    ]
    df = spark.createDataFrame(rows, ROWS)

    derived = (
        df.transform(with_partition_field, PartitionSpec("placed_at", "day"))
        .transform(with_partition_field, PartitionSpec("placed_at", "month"))
        .transform(with_partition_field, PartitionSpec("placed_at", "year"))
        .transform(with_partition_field, PartitionSpec("due", "day"))
        .transform(with_partition_field, PartitionSpec("local_at", "day"))
        .select("id", "placed_at_day", "placed_at_month", "placed_at_year", "due_day", "local_at_day")
    )

    expected = spark.createDataFrame(
        [
            (1, "2024-03-01", "2024-03", "2024", "2024-03-01", "2024-03-01"),
            (2, "2023-12-31", "2023-12", "2023", "1969-12-31", "1969-12-31"),
            (3, "1969-12-31", "1969-12", "1969", None, None),
            (4, None, None, None, None, None),
        ],
        "id int, placed_at_day string, placed_at_month string, placed_at_year string, due_day string, "
        "local_at_day string",
    )
    assert_df_equality(derived, expected, ignore_row_order=True)


def test_value_partitioning_adds_no_column(spark: SparkSession) -> None:
    df = spark.createDataFrame([(1, None, None, None, "eu")], ROWS)
    assert_df_equality(df.transform(with_partition_field, PartitionSpec("region")), df)
    assert_df_equality(df.transform(with_partition_field, None), df)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (PartitionSpec("missing"), "the table has no column 'missing'"),
        (PartitionSpec("region", "day"), "'region' is string, not a date or timestamp"),
        (PartitionSpec("id", "year"), "'id' is int, not a date or timestamp"),
    ],
)
def test_partitioning_the_wrong_column_is_refused(spark: SparkSession, spec: PartitionSpec, message: str) -> None:
    df = spark.createDataFrame([], ROWS)
    with pytest.raises(EnvelopeError, match=message):
        with_partition_field(df, spec)


def test_a_derived_column_never_replaces_a_source_column(spark: SparkSession) -> None:
    df = spark.createDataFrame([], "id int, placed_at timestamp, placed_at_day string")
    with pytest.raises(EnvelopeError, match="would replace a source column"):
        with_partition_field(df, PartitionSpec("placed_at", "day"))


def _target(**kwargs: object) -> HudiTarget:
    base: dict[str, object] = {"database": "db", "table": "t", "path": "s3a://lake/silver/db/t", "record_key": ("id",)}
    return HudiTarget(**{**base, **kwargs})  # type: ignore[arg-type]


def test_a_non_partitioned_copy_on_write_table() -> None:
    options = write_options(_target(), 7, "q")
    assert options["hoodie.datasource.write.keygenerator.class"].endswith("NonpartitionedKeyGenerator")
    assert options["hoodie.datasource.hive_sync.partition_extractor_class"].endswith("NonPartitionedExtractor")
    assert "hoodie.index.type" not in options
    assert options["hoodie.metadata.enable"] == "false"  # lake.metadata_table: partitioned (the default)
    assert write_options(_target(metadata_table=True), 7, "q")["hoodie.metadata.enable"] == "true"
    assert "hoodie.compact.inline" not in options
    assert sized_options(_target(), 10**6) == {}  # the record-level index's reconcile: a partitioned table's
    assert (options["hoodie.clean.commits.retained"], options["hoodie.keep.min.commits"]) == ("10", "20")
    assert options["hoodie.clean.trigger.max.commits"] == "5"  # HudiTarget's default, as lake.clean_every_commits's
    assert options["hoodie.timeline.compaction.batch.size"] == "2"  # the history merged two files at a time
    assert options["hoodie.parquet.small.file.limit"] == str(100 * 1024 * 1024)  # lake.small_file_limit_mb's
    assert options["hoodie.parquet.bloom.filter.enabled"] == "false"  # no table has a bloom index


def test_the_simple_index_runs_in_at_most_lake_simple_index_tasks(spark: SparkSession) -> None:
    cores = str(spark.sparkContext.defaultParallelism)
    assert index_options(_target(), spark) == {"hoodie.simple.index.parallelism": cores}  # unset: the session's cores
    assert index_options(_target(simple_index_tasks=3), spark) == {"hoodie.simple.index.parallelism": "3"}
    assert index_options(_target(simple_index_tasks=0), spark) == {}  # Hudi's default, a task per base file
    assert index_options(_target(partition=PartitionSpec("placed_at", "day")), spark) == {}  # the record-level one


def test_every_table_of_the_lake_gets_the_lake_wide_settings(local_config: JobConfig) -> None:
    """The Silver tables (app/batch/planner.py) and the dead letters (app/sink/deadletters.py) are both built by
    `lake_target`: each lake-wide setting reaches every table."""
    lake = replace(local_config.lake, retain_commits=7, clean_every_commits=2, small_file_limit_mb=1.0,
                   metadata_table="all", simple_index_tasks=3)
    config = replace(local_config, lake=lake)
    silver = lake_target(lake, "orders", ("id",), database="shop", table_type="MERGE_ON_READ",
                         compaction_delta_commits=4)
    for target in (silver, dead_letter_target(config)):
        assert (target.retain_commits, target.clean_every_commits, target.small_file_limit_bytes) == (7, 2, 1 << 20)
        assert target.metadata_table and target.simple_index_tasks == 3
    assert (silver.qualified_name, silver.path) == ("shop.orders", lake.table_path("orders", "shop"))
    assert (silver.table_type, silver.compaction_delta_commits) == ("MERGE_ON_READ", 4)
    dead = dead_letter_target(config)
    assert (dead.database, dead.path) == (lake.database, lake.table_path(config.dead_letters.table))
    assert not lake_target(replace(lake, metadata_table="partitioned"), "t", ("id",)).metadata_table


@pytest.mark.parametrize(("keys", "generator"), [(("id",), "SimpleKeyGenerator"), (("a", "b"), "ComplexKeyGenerator")])
def test_a_partitioned_table_uses_the_global_record_index(keys: tuple[str, ...], generator: str) -> None:
    options = write_options(_target(record_key=keys, partition=PartitionSpec("placed_at", "day")), 7, "q")
    assert options["hoodie.datasource.write.keygenerator.class"] == f"org.apache.hudi.keygen.{generator}"
    assert options["hoodie.datasource.write.partitionpath.field"] == "placed_at_day"
    assert options["hoodie.datasource.write.hive_style_partitioning"] == "true"
    assert options["hoodie.index.type"] == "RECORD_INDEX"
    assert options["hoodie.metadata.record.index.enable"] == "true"
    assert options["hoodie.record.index.update.partition.path"] == "true"
    assert options["hoodie.datasource.hive_sync.partition_fields"] == "placed_at_day"
    assert options["hoodie.datasource.hive_sync.partition_extractor_class"].endswith("MultiPartKeysValueExtractor")


@pytest.mark.parametrize(("rows", "tasks"), [(0, "2"), (40, "2"), (50_001, "3"), (10**6, "40"), (10**8, "60")])
def test_a_partitioned_tables_index_reconciles_in_tasks_sized_to_the_batch(rows: int, tasks: str) -> None:
    options = sized_options(_target(partition=PartitionSpec("placed_at", "day")), rows)
    assert options == {"hoodie.global.index.reconcile.parallelism": tasks}


def test_a_merge_on_read_table_compacts_inline_and_cleans() -> None:
    options = write_options(
        _target(table_type="MERGE_ON_READ", compaction_delta_commits=2, retain_commits=5, clean_every_commits=2), 7,
        "q",
    )
    assert options["hoodie.datasource.write.table.type"] == "MERGE_ON_READ"
    assert options["hoodie.compact.inline"] == "true"
    assert options["hoodie.compact.inline.max.delta.commits"] == "2"
    assert options["hoodie.clean.automatic"] == "true"
    assert (options["hoodie.clean.commits.retained"], options["hoodie.keep.min.commits"]) == ("5", "15")
    assert options["hoodie.clean.trigger.max.commits"] == "2"
