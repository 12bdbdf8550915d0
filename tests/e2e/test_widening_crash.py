"""The crash windows of a table changed upstream while the job runs, each a SIGKILL of the job in a process of its
own (devkit/pauses.py), on the real stack with the lake on S3, on a Merge-on-Read table partitioned by a column
(record-level index): the layout whose rewrite costs most (docs/schema-changes.md).

A column widened (app/sink/widening.py):

    hudi_commit         inside the rewrite's Hudi commit: its data files written, the replacecommit inflight
    table_rewritten     the rewrite committed, the batch's upsert not yet

The restart repairs both: the table equals PostgreSQL value by value, with the new type, every row once.

A column added with a default (app/batch/writer.py: widen asks the connector for an incremental snapshot):

    snapshot_requested  the signal on the connector's signal topic, the batch's upsert not yet

The restart asks again (a second snapshot, harmless) and the table ends equal to PostgreSQL, the default in every
row written before.
"""
from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import psycopg
import pytest
import yaml
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.sql import SparkSession

from app.config import JobConfig, TableConfig
from app.errors import required
from app.sink.lakefs import list_files
from app.sink.widening import table_column_types
from tests.conftest import LOCAL_CONF, RUN_ID
from tests.support.cdc import KAFKA_BOOTSTRAP, debezium_connector, job_config_for, read_topic, wait_for_records
from tests.support.jobprocess import Job, kill, wait
from tests.support.pipeline import Pipeline, source_schema

pytestmark = [pytest.mark.stack, pytest.mark.slow]

SCHEMA = f"wc_{RUN_ID}"
PREFIX = f"wc{RUN_ID}"
DATABASE = f"wc_{RUN_ID}"
DDL = f"""
create schema {SCHEMA};
create table {SCHEMA}.prices (id int primary key, amount numeric(6,2), note text, region text);
insert into {SCHEMA}.prices select i, i * 100.25, 'n' || i, 'r' || (i % 3) from generate_series(1, 50) i;
create table {SCHEMA}.debezium_signal (id varchar(64) primary key, type varchar(32) not null, data varchar(2048));
"""
TABLE = f"{SCHEMA}_prices"
SIGNALS = f"{PREFIX}-signals"
LAYOUT = {"table_type": "MERGE_ON_READ", "partition_by": "region"}


@pytest.fixture(scope="module")
def pg_conn(stack: None) -> Iterator[psycopg.Connection]:
    with source_schema(SCHEMA, DDL) as conn:
        yield conn


def _conf(config: JobConfig, path: Path) -> Path:
    """conf/local.yaml pointed at this test's topics and lake, with the pause points' jars."""
    raw = yaml.safe_load(LOCAL_CONF.read_text())
    raw["kafka"].update({"topic_pattern": config.kafka.topic_pattern, "max_offsets_per_trigger": None})
    raw.pop("sources", None)
    raw["source"] = {"topic_prefix": PREFIX, "framing": "id4", "id_type": "contentId", "signal_topic": SIGNALS,
                     "tables": {f"{SCHEMA}.prices": LAYOUT}}
    lake = config.lake
    raw["lake"].update({"database": lake.database, "silver_path": lake.silver_path, "bronze_path": lake.bronze_path,
                        "checkpoint_path": lake.checkpoint_path})
    path.write_text(yaml.safe_dump(raw))
    return path


def _pending(spark: SparkSession, path: str) -> list[str]:
    """The table's instants requested or inflight but not completed."""
    timeline = [n for n in list_files(spark, f"{path}/.hoodie/timeline") if "/" not in n]
    completed = {n.split("_")[0] for n in timeline if "_" in n.split(".")[0]}
    return sorted(n for n in timeline if n.split(".")[0].split("_")[0] not in completed)


def _completed_rewrites(spark: SparkSession, path: str) -> int:
    return sum(1 for n in list_files(spark, f"{path}/.hoodie/timeline") if "/" not in n and "_" in n.split(".")[0]
               and n.endswith(".replacecommit"))


def _rows(spark: SparkSession, path: str) -> list[tuple[object, ...]]:
    return sorted(tuple(r) for r in spark.read.format("hudi").load(path).select("id", "amount", "note", "region",
                                                                               "flag").collect())


def test_kills_while_a_column_is_widened_and_while_one_is_added_are_repaired(
    spark: SparkSession, local_config: JobConfig, lake_root: str, pg_conn: psycopg.Connection, tmp_path: Path
) -> None:
    admin = AdminClient({"bootstrap.servers": KAFKA_BOOTSTRAP})
    for future in admin.create_topics([NewTopic(SIGNALS, 1, 1)]).values():
        future.result()
    signals = {"signal.data.collection": f"{SCHEMA}.debezium_signal", "signal.enabled.channels": "source,kafka",
               "signal.kafka.topic": SIGNALS, "signal.kafka.bootstrap.servers": KAFKA_BOOTSTRAP}
    with debezium_connector(f"wc-{RUN_ID}", PREFIX, [SCHEMA], settings=signals):
        config = job_config_for(local_config, PREFIX, DATABASE, f"{lake_root}/widening_crash")
        source = dataclasses.replace(required(config.source, "the source"), signal_topic=SIGNALS,
                                     tables={f"{SCHEMA}.prices": TableConfig(table_type="MERGE_ON_READ",
                                                                             partition_by="region")})
        config = dataclasses.replace(config, source=source)
        path = config.lake.table_path(TABLE)
        wait_for_records(f"{PREFIX}.{SCHEMA}.prices", 50)
        Pipeline.of(spark, config).run()
        pg_conn.execute(f"alter table {SCHEMA}.prices alter column amount type numeric(12,2)")
        pg_conn.execute(f"update {SCHEMA}.prices set amount = 1234567.89 where id = 1")
        wait_for_records(f"{PREFIX}.{SCHEMA}.prices", 51)
        job = Job(_conf(config, tmp_path / "job.yaml"), tmp_path)

        # Inside the rewrite's commit.
        process = job.start("hudi_commit", available_now=True, table=f"{DATABASE}/{TABLE}")
        try:
            assert wait(lambda: job.pause_file("hudi_commit").exists(), process, 300, "hudi_commit", job)
        finally:
            kill(process)
        instant = json.loads(job.pause_file("hudi_commit").read_text())["instant"]
        assert any(n.startswith(instant) and "replacecommit" in n for n in _pending(spark, path)), _pending(spark, path)
        assert table_column_types(spark, path)["amount"] == "decimal(6,2)"

        # After the rewrite, before the upsert.
        process = job.start("table_rewritten", available_now=True)
        try:
            assert wait(lambda: job.pause_file("table_rewritten").exists(), process, 300, "table_rewritten", job)
        finally:
            kill(process)
        assert table_column_types(spark, path)["amount"] == "decimal(12,2)"
        assert _completed_rewrites(spark, path) == 1
        rows = spark.read.format("hudi").load(path)
        assert [r["amount"] for r in rows.filter("id = 1").collect()] == [Decimal("100.25")]  # the update not yet

        # The restart.
        Pipeline.of(spark, config).run()

        expected = sorted(pg_conn.execute(f"select id, amount, note, region from {SCHEMA}.prices").fetchall())
        rows = spark.read.format("hudi").load(path)
        assert sorted(tuple(r) for r in rows.select("id", "amount", "note", "region").collect()) == expected
        assert rows.count() == 50 and rows.select("_hoodie_record_key").distinct().count() == 50
        assert table_column_types(spark, path)["amount"] == "decimal(12,2)"
        assert _completed_rewrites(spark, path) == 1  # the restart found the new type and rewrote nothing more

        # A column added with a default: killed once the snapshot is asked for, before the batch's upsert.
        pg_conn.execute(f"alter table {SCHEMA}.prices add column flag int default 3")
        pg_conn.execute(f"update {SCHEMA}.prices set note = 'changed' where id = 2")
        wait_for_records(f"{PREFIX}.{SCHEMA}.prices", 52)
        process = job.start("snapshot_requested", available_now=True)
        try:
            assert wait(lambda: job.pause_file("snapshot_requested").exists(), process, 300, "snapshot_requested", job)
        finally:
            kill(process)
        asked = read_topic(SIGNALS, 1, 30)
        assert len(asked) == 1 and f"{SCHEMA}.prices" in (asked[0].value or b"").decode(), asked
        assert "flag" not in table_column_types(spark, path)  # the batch's upsert not yet

        # The restart asks again; the snapshot reads bring the default of every row written before.
        expected = sorted(pg_conn.execute(f"select id, amount, note, region, flag from {SCHEMA}.prices").fetchall())
        assert {r[4] for r in expected} == {3}
        deadline = time.monotonic() + 180
        actual: list[tuple[object, ...]] = []
        while actual != expected:
            assert time.monotonic() < deadline, f"not equal after 180 s: {set(actual) ^ set(expected)}"
            Pipeline.of(spark, config).run()
            actual = _rows(spark, path)
            time.sleep(0 if actual == expected else 3)
        assert len(read_topic(SIGNALS, 2, 30)) == 2  # asked again at the restart

    rows = spark.read.format("hudi").load(path)
    assert rows.count() == 50 and rows.select("_hoodie_record_key").distinct().count() == 50
    properties = {r.value for r in spark.read.text(f"{path}/.hoodie/hoodie.properties").collect()}
    assert {"hoodie.table.type=MERGE_ON_READ", "hoodie.table.partition.fields=region"} <= properties
