"""Per-table settings against the lake at start (app/state/layout.py): a setting that would change an existing Silver
table's record key, partitioning or type is refused, naming the setting and the rebuild; a setting naming no table
is listed. Real Hudi tables on the lake of the shipped config (S3), one partitioned Merge-on-Read."""
from __future__ import annotations

import uuid
from typing import Any

import pytest
from pyspark.sql import SparkSession

from app.config import JobConfig, PartitionSpec, parse_config
from app.errors import ConfigError
from app.routing.route import check_routes
from app.sink.hudi import HudiTarget, recorded_layout, write_silver
from app.sink.lakefs import fs_and_path
from app.state.layout import check_layouts, unmatched_settings

# Hudi's datasource writes open the session's catalog (the stack's metastore); the lake cases use its S3 server.
pytestmark = pytest.mark.stack
NO_SYNC = {"hoodie.datasource.meta.sync.enable": "false", "hoodie.datasource.hive_sync.enable": "false"}
SCHEMA = "id int, v string, region string, _cdc_position string, _hoodie_is_deleted boolean"
ROWS = [(1, "a", "r1", "01", False), (2, "b", "r2", "01", False)]


@pytest.fixture(scope="module")
def lake(spark: SparkSession, lake_root: str) -> str:
    """Two tables: s.plain (Copy-on-Write, key id, not partitioned), s.parts (Merge-on-Read, partitioned by region)."""
    silver = f"{lake_root}/layout-{uuid.uuid4().hex[:6]}/silver"
    rows = spark.createDataFrame(ROWS, SCHEMA)
    write_silver(rows, HudiTarget("lake", "s_plain", f"{silver}/lake/s_plain", ("id",)), 0, "q", NO_SYNC)
    write_silver(rows, HudiTarget("lake", "s_parts", f"{silver}/lake/s_parts", ("id",),
                                  table_type="MERGE_ON_READ", partition=PartitionSpec("region")), 0, "q", NO_SYNC)
    return silver


def _config(silver: str, tables: dict[str, Any], **lake: Any) -> JobConfig:
    return parse_config({
        "kafka": {"bootstrap_servers": "127.0.0.1:9092", "topic_pattern": r"p\..*"},
        "registry": {"url": "http://127.0.0.1:8080"},
        "lake": {"database": "lake", "silver_path": silver, "bronze_path": f"{silver}-b",
                 "checkpoint_path": f"{silver}-c", **lake},
        "source": {"topic_prefix": "p", "tables": tables},
    })


def _check(spark: SparkSession, config: JobConfig) -> None:
    check_layouts(spark, config, check_routes(config, ["p.s.plain", "p.s.parts"]))


AS_CREATED = {"s.parts": {"partition_by": "region", "table_type": "MERGE_ON_READ"}}


def test_the_layout_read_from_hoodie_properties(spark: SparkSession, lake: str) -> None:
    plain = recorded_layout(spark, f"{lake}/lake/s_plain")
    parts = recorded_layout(spark, f"{lake}/lake/s_parts")
    assert plain is not None and (plain.record_key, plain.partition_field, plain.table_type) == \
        (("id",), None, "COPY_ON_WRITE")
    assert parts is not None and (parts.record_key, parts.partition_field, parts.table_type) == \
        (("id",), "region", "MERGE_ON_READ")
    assert recorded_layout(spark, f"{lake}/lake/none") is None


def test_settings_as_the_tables_were_created_pass(spark: SparkSession, lake: str) -> None:
    _check(spark, _config(lake, {**AS_CREATED, "s.plain": {"record_key": ["id"]}}))


PLAIN, PARTS = 'source.tables."s.plain".', 'source.tables."s.parts".'


@pytest.mark.parametrize(("tables", "lake_settings", "refused"), [
    ({**AS_CREATED, "s.plain": {"record_key": ["id", "v"]}}, {},
     (f"{PLAIN}record_key", "created with record key ['id'], the config says ['id', 'v']")),
    ({**AS_CREATED, "s.plain": {"partition_by": "region"}}, {},
     (f"{PLAIN}partition_by", "created not partitioned, the config says partitioned by region")),
    ({"s.parts": {"partition_by": "month(region)", "table_type": "MERGE_ON_READ"}}, {},
     (f"{PARTS}partition_by", "created partitioned by region, the config says partitioned by region_month")),
    ({"s.parts": {"table_type": "MERGE_ON_READ"}}, {},
     (f"{PARTS}partition_by", "created partitioned by region, the config says not partitioned")),
    ({"s.parts": {"partition_by": "region"}}, {},
     (f"{PARTS}table_type", "created MERGE_ON_READ, the config says COPY_ON_WRITE (lake.table_type")),
    ({**AS_CREATED}, {"table_type": "MERGE_ON_READ"},
     (f"{PLAIN}table_type", "created COPY_ON_WRITE, the config says MERGE_ON_READ (lake.table_type; the table has")),
])
def test_a_setting_that_changes_a_table_is_refused_naming_the_rebuild(
    spark: SparkSession, lake: str, tables: dict[str, Any], lake_settings: dict[str, Any], refused: tuple[str, str],
) -> None:
    key, words = refused
    with pytest.raises(ConfigError) as e:
        _check(spark, _config(lake, tables, **lake_settings))
    assert e.value.key == key and words in e.value.message, e.value
    assert "rebuild the table" in e.value.message


def test_delete_mode_and_name_may_change(spark: SparkSession, lake: str) -> None:
    """Not fixed at creation: the delete mode (app/sink: soft deletes are rows), and the name (a new table)."""
    _check(spark, _config(lake, {**AS_CREATED, "s.plain": {"delete_mode": "soft"}}))
    config = _config(lake, {**AS_CREATED, "s.plain": {"name": "plain_2"}})
    routes = check_routes(config, ["p.s.plain", "p.s.parts"])
    assert {r.qualified_name for r in routes} == {"lake.plain_2", "lake.s_parts"}
    check_layouts(spark, config, routes)


def test_a_table_whose_creation_was_interrupted_is_not_held_to_its_layout(spark: SparkSession, lake: str) -> None:
    """hoodie.properties written, no commit completed: the next write creates the table afresh (app/sink/creation.py),
    under the config's settings."""
    fs, source = fs_and_path(spark, f"{lake}/lake/s_plain/.hoodie/hoodie.properties")
    _, target = fs_and_path(spark, f"{lake}/lake/s_new/.hoodie/hoodie.properties")
    stream, out = fs.open(source), fs.create(target)
    try:
        spark.sparkContext._jvm.org.apache.hadoop.io.IOUtils.copyBytes(stream, out, 4096)  # type: ignore[union-attr]
    finally:
        stream.close()
        out.close()
    config = _config(lake, {**AS_CREATED, "s.new": {"partition_by": "region"}})
    check_layouts(spark, config, check_routes(config, ["p.s.plain", "p.s.parts", "p.s.new"]))


def test_a_setting_naming_no_table_is_listed() -> None:
    config = _config("/l", {"s.plain": {"record_key": ["id"]}, "s.plian": {"delete_mode": "soft"}})
    routes = check_routes(config, ["p.s.plain"])
    assert unmatched_settings(config, routes) == {'source.tables."s.plian"': "p.s.plian"}
