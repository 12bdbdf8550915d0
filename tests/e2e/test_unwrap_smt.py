"""Events flattened by Debezium's unwrap SMT (ExtractNewRecordState) in Kafka Connect, on the real stack.

One PostgreSQL schema is captured by one connector per SMT setting (each under its own topic prefix):

    delete.tombstone.handling.mode   add.fields                 the job
    rewrite                          op,lsn,source.ts_ms        applies it: a delete is __deleted="true"
    rewrite-with-tombstone           op,lsn,source.ts_ms        applies it (the extra tombstone is skipped)
    rewrite                          op,source.ts_ms            refuses: no source position (names add.fields)
    tombstone (3.2's default)        op,lsn,source.ts_ms        refuses: a delete is a tombstone without its
                                                                position (names the mode to set)
    drop                             op,lsn,source.ts_ms        refuses: deletes are lost (same message)
    delete-to-tombstone              op,lsn,source.ts_ms        refuses, as tombstone

The two supported settings run as two sources of one job, each into its own database: after the snapshot and
after inserts, updates (TOASTed text left untouched, arrays holding NULL), deletes, a primary-key change and a
transaction over two tables, every Silver table equals PostgreSQL. The refused settings are read as one batch
each and planned: the batch is refused before anything is written, naming the setting.
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from pyspark.sql import SparkSession

from app.config import DeadLetterConfig, JobConfig
from app.errors import EnvelopeError
from tests.conftest import RUN_ID
from tests.support.cdc import debezium_connector, job_config_for, wait_for_records
from tests.support.pipeline import Pipeline, source_schema

pytestmark = [pytest.mark.stack, pytest.mark.slow]

SCHEMA = f"uw_{RUN_ID}"
TABLES = ("items", "notes")
BIG = "x" * 9000  # TOASTed: an update that leaves it alone sends Debezium's placeholder

DDL = f"""
create schema {SCHEMA};
create table {SCHEMA}.items (id int primary key, name text, qty int, tags int[], body text);
create table {SCHEMA}.notes (id int primary key, item_id int, note text);
insert into {SCHEMA}.items values (1, 'one', 1, array[1, null], '{BIG}'), (2, 'two', 2, null, 'short'),
                                  (3, 'three', 3, array[]::int[], null);
insert into {SCHEMA}.notes values (1, 1, 'n1'), (2, 2, 'n2');
"""

POSITION = "op,lsn,source.ts_ms"
MODES: dict[str, tuple[str, str]] = {  # prefix suffix -> (delete.tombstone.handling.mode, add.fields)
    "rw": ("rewrite", POSITION),
    "rwt": ("rewrite-with-tombstone", POSITION),
    "nolsn": ("rewrite", "op,source.ts_ms"),
    "tomb": ("tombstone", POSITION),
    "drop": ("drop", POSITION),
    "d2t": ("delete-to-tombstone", POSITION),
}
SUPPORTED = ("rw", "rwt")


def prefix(mode: str) -> str:
    return f"uw{mode}{RUN_ID}"


def smt(mode: str) -> dict[str, str]:
    handling, fields = MODES[mode]
    return {
        "transforms": "unwrap",
        "transforms.unwrap.type": "io.debezium.transforms.ExtractNewRecordState",
        "transforms.unwrap.delete.tombstone.handling.mode": handling,
        "transforms.unwrap.add.fields": fields,
    }


@pytest.fixture(scope="module")
def pg_conn(stack: None) -> Iterator[psycopg.Connection]:
    with source_schema(SCHEMA, DDL) as conn:
        yield conn


def job(base: JobConfig, lake: str, modes: tuple[str, ...]) -> JobConfig:
    config = job_config_for(base, prefix(modes[0]), f"uw_{modes[0]}_{RUN_ID}", lake)
    assert config.source is not None
    sources = [
        dataclasses.replace(
            config.source, topic_prefix=prefix(m), name=m, connector="postgresql", events="flattened",
            database=f"uw_{m}_{RUN_ID}",
        )
        for m in modes
    ]
    pattern = "(" + "|".join(re.escape(prefix(m)) for m in modes) + r")\.[^.]+\.[^.]+"
    return dataclasses.replace(
        config, source=None, tables={}, sources=sources, kafka=dataclasses.replace(config.kafka, topic_pattern=pattern)
    )


def silver(spark: SparkSession, config: JobConfig, mode: str, table: str) -> set[tuple[Any, ...]]:
    path = config.lake.table_path(f"{SCHEMA}_{table}", f"uw_{mode}_{RUN_ID}")
    df = spark.read.format("hudi").load(path)
    if table == "items":
        return {(r.id, r.name, r.qty, None if r.tags is None else tuple(r.tags), r.body) for r in df.collect()}
    return {(r.id, r.item_id, r.note) for r in df.collect()}


def source(conn: psycopg.Connection, table: str) -> set[tuple[Any, ...]]:
    if table == "items":
        found = conn.execute(f"select id, name, qty, tags, body from {SCHEMA}.items").fetchall()
        return {(i, n, q, None if t is None else tuple(t), b) for i, n, q, t, b in found}
    return {tuple(r) for r in conn.execute(f"select id, item_id, note from {SCHEMA}.notes")}


def test_rewrite_modes_apply_every_change_in_order(
    spark: SparkSession, local_config: JobConfig, pg_conn: psycopg.Connection, lake_root: str
) -> None:
    with (
        debezium_connector(f"uw-rw-{RUN_ID}", prefix("rw"), [SCHEMA], settings=smt("rw")),
        debezium_connector(f"uw-rwt-{RUN_ID}", prefix("rwt"), [SCHEMA], settings=smt("rwt")),
    ):
        for mode in SUPPORTED:
            wait_for_records(f"{prefix(mode)}.{SCHEMA}.items", 3)
            wait_for_records(f"{prefix(mode)}.{SCHEMA}.notes", 2)
        pipeline = Pipeline.of(spark, job(local_config, f"{lake_root}/unwrap", SUPPORTED))
        pipeline.run()
        for mode in SUPPORTED:
            for table in TABLES:
                assert silver(spark, pipeline.config, mode, table) == source(pg_conn, table), (mode, table)

        c = pg_conn
        c.execute(f"update {SCHEMA}.items set qty = 10, tags = array[null, 2] where id = 1")  # body TOASTed, untouched
        c.execute(f"update {SCHEMA}.items set qty = 20 where id = 2")
        c.execute(f"update {SCHEMA}.items set qty = 21 where id = 2")
        c.execute(f"delete from {SCHEMA}.items where id = 3")
        c.execute(f"update {SCHEMA}.items set id = 30 where id = 2")  # primary-key change: delete 2, create 30
        with c.transaction():
            c.execute(f"insert into {SCHEMA}.items values (4, 'four', 4, array[null]::int[], 'b4')")
            c.execute(f"insert into {SCHEMA}.notes values (3, 4, 'n3')")
            c.execute(f"delete from {SCHEMA}.notes where id = 1")
        for mode in SUPPORTED:
            # items: 3 + 3 updates + delete + pk change (delete + create) + insert; rewrite-with-tombstone adds a
            # tombstone after each of the 2 deletes.
            wait_for_records(f"{prefix(mode)}.{SCHEMA}.items", 10 + (2 if mode == "rwt" else 0))
        pipeline.run()
        for mode in SUPPORTED:
            for table in TABLES:
                assert silver(spark, pipeline.config, mode, table) == source(pg_conn, table), (mode, table)


@pytest.mark.parametrize(("mode", "message"), [
    ("nolsn", r"without its source position .* add\.fields must name the source position: lsn"),
    ("tomb", r"without __deleted: .* set the SMT's delete\.tombstone\.handling\.mode=rewrite"),
    ("drop", r"without __deleted: .* set the SMT's delete\.tombstone\.handling\.mode=rewrite"),
    ("d2t", r"without __deleted: .* set the SMT's delete\.tombstone\.handling\.mode=rewrite"),
])
def test_settings_that_lose_deletes_or_order_are_refused(
    spark: SparkSession, local_config: JobConfig, pg_conn: psycopg.Connection, lake_root: str, *, mode: str,
    message: str,
) -> None:
    with debezium_connector(f"uw-{mode}-{RUN_ID}", prefix(mode), [SCHEMA], settings=smt(mode)):
        wait_for_records(f"{prefix(mode)}.{SCHEMA}.items", 1)
        config = job(local_config, f"{lake_root}/unwrap-{mode}", (mode,))
        raw_df = (
            spark.read.format("kafka")
            .option("kafka.bootstrap.servers", config.kafka.bootstrap_servers)
            .option("subscribe", f"{prefix(mode)}.{SCHEMA}.items")
            .option("includeHeaders", "true")
            .load()
        )
        # The table's events cannot be applied: the table is quarantined, the reason naming the setting.
        [table_plan] = Pipeline.of(spark, config).processor.planner.plan(raw_df).tables
        assert table_plan.quarantine is not None and re.search(message, table_plan.quarantine), table_plan.quarantine
        assert f"{prefix(mode)}.{SCHEMA}.items" in table_plan.quarantine
        # In fail-fast mode the batch stops instead.
        fail_fast = dataclasses.replace(config, dead_letters=DeadLetterConfig(mode="fail_fast"))
        with pytest.raises(EnvelopeError, match=message):
            Pipeline.of(spark, fail_fast).processor.planner.plan(raw_df)
