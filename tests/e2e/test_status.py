"""The job's status and no silent drift, on the real stack (docs/sources.md "Partitioned and sharded sources",
docs/running.md "Status").

A partitioned PostgreSQL table is first captured without `catalog`: each partition lands in a table of its own
and the parent's table holds its snapshot only. The connector also writes its transaction metadata topic and a
heartbeat topic, which the job's pattern subscribes to. Then `catalog` is set: the partitions' topics feed the
parent's table, and the status (and the log) name the partitions' tables as stale, saying where their topics go
now. The README's remedy (drop them, a new checkpoint, `--from-starting-offsets`) makes the parent's table equal
the source, and the status shows no stale table. Throughout, the transaction and heartbeat topics are skipped,
named with why, and their records are in Bronze.
"""
from __future__ import annotations

import dataclasses
import logging
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession

from app.batch.processor import BatchProcessor
from app.config import JobConfig
from app.errors import RerouteError
from app.hooks import Hooks
from app.job import await_query, start_query
from app.sink.bronze import read_bronze
from app.sink.lakefs import delete_path
from app.state.status import read_status, status_path
from app.wire.registry import RegistryClient
from tests.conftest import RUN_ID
from tests.e2e.test_partitions import CATALOG
from tests.support.cdc import debezium_connector, job_config_for, read_topic
from tests.support.pipeline import Pipeline, source_schema

pytestmark = [pytest.mark.stack, pytest.mark.slow]

SCHEMA, PREFIX = f"stat_{RUN_ID}", f"stat{RUN_ID}"
DDL = f"""
create schema {SCHEMA};
create table {SCHEMA}.payment (id int not null, paid_on date not null, amount numeric(10,2),
                               primary key (id, paid_on)) partition by range (paid_on);
create table {SCHEMA}.payment_a partition of {SCHEMA}.payment for values from ('2024-01-01') to ('2024-02-01');
create table {SCHEMA}.payment_b partition of {SCHEMA}.payment for values from ('2024-02-01') to ('2024-03-01');
insert into {SCHEMA}.payment select i, date '2024-01-01' + (i * 3), i * 1.5 from generate_series(1, 16) i;
"""
TRANSACTIONS = f"{PREFIX}.transaction"
HEARTBEATS = f"__debezium-heartbeat.{PREFIX}"


def _config(base: JobConfig, lake: str, checkpoint: str, catalog: bool) -> JobConfig:
    config = job_config_for(base, PREFIX, f"status_{RUN_ID}", lake)
    assert config.source is not None
    source = dataclasses.replace(config.source, connector="postgresql")
    if catalog:
        source = dataclasses.replace(source, catalog=CATALOG)
    # the table topics, and whatever else the connector writes: its transaction and heartbeat topics
    pattern = re.escape(PREFIX) + r"(\..+)?|" + re.escape(HEARTBEATS)
    return dataclasses.replace(
        config, source=source, kafka=dataclasses.replace(config.kafka, topic_pattern=pattern),
        lake=dataclasses.replace(config.lake, checkpoint_path=f"{lake}/{checkpoint}"),
    )


def _rows(spark: SparkSession, config: JobConfig, table: str) -> list[tuple[object, ...]]:
    silver = spark.read.format("hudi").load(config.lake.table_path(table))
    return sorted(tuple(r) for r in silver.select("id", "paid_on", "amount").collect())


def _source_rows(conn: psycopg.Connection) -> list[tuple[object, ...]]:
    return sorted(conn.execute(f"select id, paid_on, amount from {SCHEMA}.payment").fetchall())


def _status(config: JobConfig) -> dict[str, Any]:
    return read_status(status_path(config), config.spark.conf.get("spark.hadoop.fs.s3a.endpoint"))


def test_status_names_skipped_topics_and_tables_no_topic_feeds(
    spark: SparkSession, local_config: JobConfig, lake_root: str, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    lake = f"{lake_root}/status"
    parent, part_a, part_b = f"{SCHEMA}_payment", f"{SCHEMA}_payment_a", f"{SCHEMA}_payment_b"
    settings = {"provide.transaction.metadata": "true", "heartbeat.interval.ms": "500"}
    with source_schema(SCHEMA, DDL) as conn, \
            debezium_connector(f"stat-{RUN_ID}", PREFIX, [SCHEMA], settings=settings):
        read_topic(f"{PREFIX}.{SCHEMA}.payment", min_records=16, timeout_s=90)
        conn.execute(f"update {SCHEMA}.payment set amount = amount + 100 where id % 3 = 0")
        conn.execute(f"delete from {SCHEMA}.payment where id in (2, 14)")
        # ids 1-10 are January's (payment_a), 11-16 February's; updates of 3, 6, 9, 12, 15, deletes of 2 and 14
        read_topic(f"{PREFIX}.{SCHEMA}.payment_a", min_records=10 + 3 + 2, timeout_s=90)
        read_topic(f"{PREFIX}.{SCHEMA}.payment_b", min_records=6 + 2 + 2, timeout_s=90)
        read_topic(HEARTBEATS, min_records=1, timeout_s=60)

        # 0. Any exception in a batch, not only the job's own error classes, is in the status with the batch, the
        # table and the step: here an OSError in the first table's upsert (raised by a hook, app/hooks.py), in a
        # lake of its own.
        failing_config = _config(local_config, f"{lake_root}/status-failing", "cp", catalog=False)
        failing = Pipeline(spark, failing_config, BatchProcessor(
            failing_config, RegistryClient.from_config(failing_config.registry), _FailingUpsert()))
        with pytest.raises(StreamingQueryException, match="no space left"):
            failing.run()
        status = _status(failing_config)
        # Every table's upsert raises, and the tables' units run at once (lake.table_writers): the first to raise
        # is named, whichever it is
        table = status["failed_at"]["table"]
        assert table in {f"{failing_config.lake.database}.{t}" for t in (parent, part_a, part_b)}, status
        assert status["failure"] == f"batch 0, table {table}, step upsert: OSError: no space left (simulated)", status
        assert status["failed_at"] == {"batch_id": 0, "table": table, "step": "upsert", "error": "OSError"}
        assert failing.processor.failure is None  # not a typed error: Spark's own surfaces

        # 1. Without catalog: a table per partition, the parent's holds its snapshot only.
        first = _config(local_config, lake, "cp1", catalog=False)
        Pipeline.of(spark, first).run()
        status = _status(first)
        database = first.lake.database
        assert {t: r["table"] for t, r in status["routes"].items()} == {
            f"{PREFIX}.{SCHEMA}.payment": f"{database}.{parent}",
            f"{PREFIX}.{SCHEMA}.payment_a": f"{database}.{part_a}",
            f"{PREFIX}.{SCHEMA}.payment_b": f"{database}.{part_b}",
        }
        skipped = status["skipped_topics"]
        assert sorted(skipped) == sorted([TRANSACTIONS, HEARTBEATS]), skipped
        assert "transaction metadata" in skipped[TRANSACTIONS]["reason"]
        assert "heartbeat" in skipped[HEARTBEATS]["reason"]
        assert status["failure"] is None and status["stale_tables"] == {}
        bronze = read_bronze(spark, first.lake.bronze_path)
        assert bronze is not None
        held = {t: bronze.filter(bronze.topic == t).count() for t in (TRANSACTIONS, HEARTBEATS)}
        assert held[TRANSACTIONS] >= 4 and held[HEARTBEATS] >= 1, held  # BEGIN and END of the two changes
        assert _rows(spark, first, parent) != _source_rows(conn)  # the snapshot only: the drift the issue saw

        # 2. With catalog and the same checkpoint: the partitions' topics would feed the parent's table from here
        # on, and it would miss what their old tables applied. The job refuses at start, naming them and the
        # remedy; the status says the same.
        conn.execute(f"update {SCHEMA}.payment set amount = 7 where id = 1")
        read_topic(f"{PREFIX}.{SCHEMA}.payment_a", min_records=10 + 3 + 2 + 1, timeout_s=90)
        second = _config(local_config, lake, "cp1", catalog=True)
        caplog.set_level(logging.WARNING, logger="app.state.status")
        with pytest.raises(RerouteError) as refused:
            Pipeline.of(spark, second).run()
        message = str(refused.value)
        assert (f"topic {PREFIX}.{SCHEMA}.payment_a feeds {database}.{parent} now (partition {SCHEMA}.payment_a of "
                f"{SCHEMA}.payment), but its offsets up to [0]@14 were applied to {database}.{part_a}") in message
        assert f"drop {database}.{part_a}, {database}.{part_b}" in message and "--from-starting-offsets" in message
        status = _status(second)
        assert sorted(status["stale_tables"]) == [f"{database}.{part_a}", f"{database}.{part_b}"]
        reason = status["stale_tables"][f"{database}.{part_a}"]
        assert reason == (f"{PREFIX}.{SCHEMA}.payment_a now feeds {database}.{parent} "
                          f"(partition {SCHEMA}.payment_a of {SCHEMA}.payment)"), reason
        assert str(status["failure"]).startswith("at start: RerouteError: topic ")
        assert f"Silver table {database}.{part_a} is fed by no topic" in caplog.text
        assert status["routes"][f"{PREFIX}.{SCHEMA}.payment_b"] == {
            "table": f"{database}.{parent}", "why": f"partition {SCHEMA}.payment_b of {SCHEMA}.payment"}
        # The script prints the same, and exits 1 (a failure recorded).
        conf_file = _write_conf(second, tmp_path / "status.yaml")
        printed = subprocess.run([sys.executable, "scripts/status.py", "--conf", conf_file],
                                 capture_output=True, text=True, check=False)
        assert printed.returncode == 1, printed.stderr
        assert f"{database}.{part_b}: {PREFIX}.{SCHEMA}.payment_b now feeds" in printed.stdout, printed.stdout
        assert f"{TRANSACTIONS}: the transaction metadata topic" in printed.stdout, printed.stdout
        assert "failure: at start: RerouteError" in printed.stdout, printed.stdout

        # 3. The remedy: drop the stale tables, a new checkpoint, read from the earliest offsets.
        for table in (part_a, part_b):
            spark.sql(f"drop table if exists {database}.{table}")
            delete_path(spark, second.lake.table_path(table))
        third = _config(local_config, lake, "cp2", catalog=True)
        remedy = Pipeline.of(spark, third)
        await_query(start_query(spark, third, remedy.processor, available_now=True, from_starting_offsets=True),
                    remedy.processor)
        assert _rows(spark, third, parent) == _source_rows(conn)
        status = _status(third)
        assert status["stale_tables"] == {} and status["failure"] is None, status
        figures = status["tables"][f"{database}.{parent}"]
        assert figures["topics"] == [f"{PREFIX}.{SCHEMA}.payment", f"{PREFIX}.{SCHEMA}.payment_a",
                                     f"{PREFIX}.{SCHEMA}.payment_b"], figures
        assert figures["replayed"] == 16 and figures["deletes"] == 2, figures  # the parent's snapshot: applied
        assert sorted(status["skipped_topics"]) == sorted([TRANSACTIONS, HEARTBEATS])
        third_conf = _write_conf(third, tmp_path / "third.yaml")
        shown = subprocess.run([sys.executable, "scripts/status.py", "--conf", third_conf],
                               capture_output=True, text=True, check=True).stdout
        assert "stale tables (fed by no subscribed topic): none" in shown and "failure: none" in shown, shown


class _FailingUpsert(Hooks):
    def write_options(self, table_path: str) -> dict[str, str]:
        raise OSError("no space left (simulated)")


def _write_conf(config: JobConfig, path: Path) -> str:
    """The config as the YAML file a user would write: every field set, the unset ones left out."""
    def unset_left_out(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: unset_left_out(v) for k, v in value.items() if v is not None}
        if isinstance(value, list):
            return [unset_left_out(v) for v in value]
        return value

    path.write_text(yaml.safe_dump(unset_left_out(dataclasses.asdict(config))))
    return str(path)
