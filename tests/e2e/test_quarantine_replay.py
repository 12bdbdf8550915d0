"""A PostgreSQL column widened from numeric(6,2) to numeric(12,2): Hudi refuses the table's next write, so the table
is quarantined while the job's other table keeps flowing, also after a restart; after the fix (the table rewritten
with the new type) and its quarantine file removed, scripts/replay_dead_letters.py re-feeds its dead letters and
the table equals PostgreSQL value by value, and the job takes its changes again.

Real stack: PostgreSQL, Debezium, Kafka, the registry, Hudi on the stack's S3 server and the metastore.
"""
from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from app.config import JobConfig
from app.sink.hudi import HudiTarget, write_options
from app.sink.lakefs import delete_path, read_text
from app.sink.quarantine import Quarantine
from app.state.status import status_path
from scripts.replay_dead_letters import Selection, replay
from tests.conftest import RUN_ID
from tests.support.cdc import debezium_connector, job_config_for, read_topic
from tests.support.pipeline import Pipeline, source_schema

pytestmark = [pytest.mark.stack, pytest.mark.slow]

SCHEMA = f"qr_{RUN_ID}"
PREFIX = f"qr{RUN_ID}"
DATABASE = f"qr_{RUN_ID}"
DDL = f"""
create schema {SCHEMA};
create table {SCHEMA}.prices (id int primary key, amount numeric(6,2), note text);
create table {SCHEMA}.other (id int primary key, v text);
insert into {SCHEMA}.prices select i, i * 100.25, 'n' || i from generate_series(1, 5) i;
insert into {SCHEMA}.other select i, 'v' || i from generate_series(1, 3) i;
"""
PRICES = f"{DATABASE}.{SCHEMA}_prices"
OTHER = f"{DATABASE}.{SCHEMA}_other"


@pytest.fixture(scope="module")
def pg_conn(stack: None) -> Iterator[psycopg.Connection]:
    with source_schema(SCHEMA, DDL) as conn:
        yield conn


def _wait(table: str, count: int) -> None:
    deadline = time.monotonic() + 90
    while len(read_topic(f"{PREFIX}.{SCHEMA}.{table}")) < count:
        assert time.monotonic() < deadline, f"{table}: fewer than {count} records after 90 s"
        time.sleep(0.5)


def _silver(spark: SparkSession, config: JobConfig, table: str) -> Any:
    return spark.read.format("hudi").load(config.lake.table_path(f"{SCHEMA}_{table}"))


def _prices_equal_postgresql(spark: SparkSession, config: JobConfig, conn: psycopg.Connection) -> None:
    expected = sorted(conn.execute(f"select id, amount::text, note from {SCHEMA}.prices").fetchall())
    actual = sorted(tuple(r) for r in _silver(spark, config, "prices")
                    .selectExpr("id", "cast(amount as string)", "note").collect())
    assert actual == expected


def _other_equals_postgresql(spark: SparkSession, config: JobConfig, conn: psycopg.Connection) -> None:
    expected = sorted(conn.execute(f"select id, v from {SCHEMA}.other").fetchall())
    assert sorted(tuple(r) for r in _silver(spark, config, "other").select("id", "v").collect()) == expected


def _rewrite_with_wider_amount(spark: SparkSession, config: JobConfig) -> None:
    """The fix: the table rewritten whole with amount as decimal(12,2), the type PostgreSQL has now."""
    path = config.lake.table_path(f"{SCHEMA}_prices")
    target = HudiTarget(database=DATABASE, table=f"{SCHEMA}_prices", path=path, record_key=("id",))
    current = spark.read.format("hudi").load(path)
    rows = current.drop(*[c for c in current.columns if c.startswith("_hoodie_") and c != "_hoodie_is_deleted"])
    rows = rows.withColumn("amount", F.col("amount").cast("decimal(12,2)"))
    rows = spark.createDataFrame(rows.collect(), rows.schema)  # read whole before the overwrite removes the files
    rows.write.format("hudi").options(**write_options(target, 0, "rewrite")).mode("overwrite").save(path)


def test_a_widened_numeric_is_quarantined_then_repaired_by_replay(
    spark: SparkSession, local_config: JobConfig, lake_root: str, pg_conn: psycopg.Connection
) -> None:
    s = SCHEMA
    with debezium_connector(f"qr-{RUN_ID}", PREFIX, [SCHEMA]):
        config = job_config_for(local_config, PREFIX, DATABASE, f"{lake_root}/quarantine_replay")
        _wait("prices", 5)
        _wait("other", 3)
        Pipeline.of(spark, config).run()
        _prices_equal_postgresql(spark, config, pg_conn)

        # The widening, then an insert of a wide value, an update and a delete; the other table changes too.
        pg_conn.execute(f"alter table {s}.prices alter column amount type numeric(12,2)")
        pg_conn.execute(f"insert into {s}.prices values (6, 1234567.89, 'wide')")
        pg_conn.execute(f"update {s}.prices set amount = 99999.99 where id = 1")
        pg_conn.execute(f"delete from {s}.prices where id = 2")
        pg_conn.execute(f"insert into {s}.other values (4, 'v4')")
        _wait("prices", 9)  # 5 + insert + update + delete + its tombstone
        _wait("other", 4)
        second = Pipeline.of(spark, config)
        second.run()

        assert set(second.processor.quarantine.tables) == {PRICES}
        assert second.processor.last_stats[PRICES].quarantined
        _other_equals_postgresql(spark, config, pg_conn)

        # A restart: still quarantined, the other table still flowing.
        pg_conn.execute(f"update {s}.prices set note = 'later' where id = 3")
        pg_conn.execute(f"insert into {s}.other values (5, 'v5')")
        _wait("prices", 10)
        _wait("other", 5)
        third = Pipeline.of(spark, config)
        third.run()

        assert third.processor.last_stats[PRICES].quarantined and third.processor.last_stats[PRICES].dead_letters == 1
        _other_equals_postgresql(spark, config, pg_conn)

        # The fix, the quarantine lifted, the dead letters replayed: the table equals PostgreSQL.
        _rewrite_with_wider_amount(spark, config)
        delete_path(spark, Quarantine(config).path(DATABASE, f"{s}_prices"))
        outcomes = replay(spark, config, Selection(tables=(PRICES,)))

        assert [o.status for o in outcomes] == ["applied"] * 4, outcomes  # insert, update, delete, update
        _prices_equal_postgresql(spark, config, pg_conn)
        status = json.loads(read_text(spark, status_path(config)))
        assert status["dead_letters"][PRICES]["records"] == 4
        assert status["dead_letters"][PRICES]["diverged_keys"] == []  # settled by the replay

        # The job takes the table's changes again.
        pg_conn.execute(f"update {s}.prices set amount = 5.5 where id = 6")
        _wait("prices", 11)
        fourth = Pipeline.of(spark, config)
        fourth.run()

        assert not fourth.processor.quarantine.tables
        _prices_equal_postgresql(spark, config, pg_conn)
        _other_equals_postgresql(spark, config, pg_conn)
