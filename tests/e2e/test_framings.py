"""Every wire framing end to end: the real connector writes it, the job reads it into Silver, Silver equals PostgreSQL.

One Debezium connector per framing and id type (app/connect.converter_config), each capturing its own schema
under one topic prefix, so one job can also read two topics framed differently. Each schema's table has a
composite primary key: the key's framing decides the record key. Snapshot, then an insert, an update, a delete
and a primary-key change, before the job runs.
"""
from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Iterator
from contextlib import ExitStack
from decimal import Decimal

import psycopg
import pytest
from pyspark.sql import SparkSession
from pyspark.sql.types import DecimalType, IntegerType, StringType

from app.batch.processor import BatchProcessor
from app.config import JobConfig
from app.job import await_query, start_query
from app.wire.registry import RegistryClient
from tests.conftest import RUN_ID
from tests.support.cdc import PG_DSN, SILVER_EXTRA_COLUMNS, debezium_connector, job_config_for, wait_for_records

pytestmark = [pytest.mark.stack, pytest.mark.slow]

PREFIX = f"fr{RUN_ID}"
MODES = [(framing, id_type) for framing in ("headers", "id8", "id4") for id_type in ("globalId", "contentId")]
SNAPSHOT_ROWS = 3
# 3 snapshot reads; insert; update; delete + tombstone; key change = delete + tombstone + create.
RECORDS = SNAPSHOT_ROWS + 1 + 1 + 2 + 3


def _schema(framing: str, id_type: str) -> str:
    return f"fr_{framing}_{id_type.lower()}"


def _setup_sql(schema: str) -> str:
    return f"""
drop schema if exists {schema} cascade;
create schema {schema};
create table {schema}.items (region text, id int, name text, price numeric(10,2), primary key (region, id));
insert into {schema}.items values ('eu', 1, 'one', 1.10), ('eu', 2, 'two', 2.20), ('us', 1, 'uno', 3.30);
"""


def _changes_sql(schema: str) -> str:
    return f"""
insert into {schema}.items values ('us', 2, 'dos', 4.40);
update {schema}.items set name = 'ONE', price = null where region = 'eu' and id = 1;
delete from {schema}.items where region = 'eu' and id = 2;
update {schema}.items set region = 'ap', id = 9 where region = 'us' and id = 1;
"""


@pytest.fixture(scope="module")
def connectors(stack: None) -> Iterator[None]:
    """One running connector per framing, its snapshot and changes all in Kafka."""
    with psycopg.connect(PG_DSN, autocommit=True) as conn, ExitStack() as exits:
        for framing, id_type in MODES:
            schema = _schema(framing, id_type)
            conn.execute(_setup_sql(schema))
            exits.enter_context(debezium_connector(
                f"fr-{framing}-{id_type.lower()}-{RUN_ID}", PREFIX, [schema], framing=framing, id_type=id_type
            ))
        for framing, id_type in MODES:
            schema = _schema(framing, id_type)
            wait_for_records(f"{PREFIX}.{schema}.items", SNAPSHOT_ROWS, timeout_s=120)
            conn.execute(_changes_sql(schema))
        for framing, id_type in MODES:
            wait_for_records(f"{PREFIX}.{_schema(framing, id_type)}.items", RECORDS, timeout_s=120)
        yield
        for framing, id_type in MODES:
            conn.execute(f"drop schema if exists {_schema(framing, id_type)} cascade")


def _run_job(
    spark: SparkSession, base: JobConfig, lake: str, schemas: list[str], *, framing: str, id_type: str
) -> JobConfig:
    config = job_config_for(base, PREFIX, f"fr_{lake.rsplit('/', 1)[-1]}", lake)
    pattern = re.escape(PREFIX) + r"\.(" + "|".join(map(re.escape, schemas)) + r")\.items"
    assert config.source is not None
    config = dataclasses.replace(
        config,
        kafka=dataclasses.replace(config.kafka, topic_pattern=pattern),
        source=dataclasses.replace(config.source, framing=framing, id_type=id_type),  # type: ignore[arg-type]
    )
    processor = BatchProcessor(config, RegistryClient.from_config(config.registry))
    await_query(start_query(spark, config, processor, available_now=True), processor)
    return config


def _assert_silver_equals_source(spark: SparkSession, config: JobConfig, schema: str) -> None:
    silver = spark.read.format("hudi").load(config.lake.table_path(f"{schema}_items")).drop(*SILVER_EXTRA_COLUMNS)
    assert {f.name: f.dataType for f in silver.schema.fields} == {
        "region": StringType(), "id": IntegerType(), "name": StringType(), "price": DecimalType(10, 2),
    }
    actual = sorted(tuple(r) for r in silver.select("region", "id", "name", "price").collect())
    with psycopg.connect(PG_DSN) as conn:
        expected = sorted(conn.execute(f"select region, id, name, price from {schema}.items").fetchall())
    assert actual == expected
    assert expected == [("ap", 9, "uno", Decimal("3.30")), ("eu", 1, "ONE", None), ("us", 2, "dos", Decimal("4.40"))]


@pytest.mark.usefixtures("connectors")
@pytest.mark.parametrize("mode", [f"{f}-{i}" for f, i in MODES])
def test_each_framing_lands_equal_to_the_source(
    spark: SparkSession, local_config: JobConfig, lake_root: str, caplog: pytest.LogCaptureFixture, mode: str
) -> None:
    framing, id_type = mode.split("-")
    schema = _schema(framing, id_type)

    with caplog.at_level(logging.INFO, logger="app.batch"):
        config = _run_job(spark, local_config, f"{lake_root}/{schema}", [schema], framing=framing, id_type=id_type)

    _assert_silver_equals_source(spark, config, schema)
    table = f"table={config.lake.database}.{schema}_items "
    lines = [r.getMessage() for r in caplog.records if table in r.getMessage()]
    assert lines, "no batch log line for the table"
    assert re.search(rf"schema_ids={id_type}:\d+ ", lines[0]), lines[0]


def test_one_job_reads_two_topics_in_different_framings(
    spark: SparkSession, local_config: JobConfig, connectors: None, lake_root: str
) -> None:
    headers, payload = _schema("headers", "globalId"), _schema("id4", "contentId")

    # auto: the header names its id type; the 0x00 + 4-byte ids are the configured contentIds.
    lake = f"{lake_root}/fr_mixed"
    config = _run_job(spark, local_config, lake, [headers, payload], framing="auto", id_type="contentId")

    _assert_silver_equals_source(spark, config, headers)
    _assert_silver_equals_source(spark, config, payload)
