"""Several sources in one job, on the real stack: two Debezium connectors capture the same PostgreSQL schema under
two topic prefixes, with different wire framings (0x00 + 4-byte contentId; globalId in Apicurio headers). One
job reads both; each source's tables land in its own catalog database, equal to PostgreSQL.

Also: a source whose `connector` setting names another connector is refused at decode, naming the setting; and
topics whose Silver names collide (`x_y.z` and `x.y_z`) stop the job at start, naming the setting that
separates them.
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.sql import SparkSession

from app.config import JobConfig, SourceConfig
from app.errors import ConfigError, EnvelopeError
from app.job import start_query
from tests.conftest import RUN_ID
from tests.support.cdc import debezium_connector, job_config_for, wait_for_records
from tests.support.pipeline import Pipeline, source_schema

pytestmark = [pytest.mark.stack, pytest.mark.slow]

SCHEMA = f"ms_{RUN_ID}"
PREFIXES = (f"msa{RUN_ID}", f"msb{RUN_ID}")
DATABASES = (f"ms_a_{RUN_ID}", f"ms_b_{RUN_ID}")

DDL = f"""
create schema {SCHEMA};
create table {SCHEMA}.users (id int primary key, name text, tags text[]);
insert into {SCHEMA}.users values (1, 'ann', array['a', null]), (2, 'bob', null), (3, 'cy', array[]::text[]);
"""


@pytest.fixture(scope="module")
def pg_conn(stack: None) -> Iterator[psycopg.Connection]:
    with source_schema(SCHEMA, DDL) as conn:
        yield conn


def two_sources(base: JobConfig, lake: str, second_connector: Any = "postgresql") -> JobConfig:
    config = job_config_for(base, PREFIXES[0], DATABASES[0], lake)
    assert config.source is not None
    first = dataclasses.replace(config.source, name="pg-a", connector="postgresql")
    second = SourceConfig(
        topic_prefix=PREFIXES[1], name="pg-b", connector=second_connector, framing="headers", id_type="globalId",
        database=DATABASES[1],
    )
    pattern = "(" + "|".join(map(re.escape, PREFIXES)) + r")\.[^.]+\.[^.]+"
    return dataclasses.replace(
        config, source=None, tables={}, sources=[first, second],
        kafka=dataclasses.replace(config.kafka, topic_pattern=pattern),
    )


def rows(spark: SparkSession, config: JobConfig, database: str) -> set[tuple[Any, ...]]:
    df = spark.read.format("hudi").load(config.lake.table_path(f"{SCHEMA}_users", database))
    return {(r.id, r.name, None if r.tags is None else tuple(r.tags)) for r in df.collect()}


def source_rows(conn: psycopg.Connection) -> set[tuple[Any, ...]]:
    found = conn.execute(f"select id, name, tags from {SCHEMA}.users")
    return {(i, n, None if t is None else tuple(t)) for i, n, t in found}


def test_two_sources_land_in_their_own_databases(
    spark: SparkSession, local_config: JobConfig, pg_conn: psycopg.Connection, lake_root: str
) -> None:
    lake = f"{lake_root}/sources"
    with (
        debezium_connector(f"msa-{RUN_ID}", PREFIXES[0], [SCHEMA]),
        debezium_connector(f"msb-{RUN_ID}", PREFIXES[1], [SCHEMA], framing="headers", id_type="globalId"),
    ):
        for prefix in PREFIXES:
            wait_for_records(f"{prefix}.{SCHEMA}.users", 3)

        # The second source claims to be MariaDB: its PostgreSQL events are refused, naming the setting.
        wrong = Pipeline.of(spark, two_sources(local_config, lake, second_connector="mariadb"))
        with pytest.raises(EnvelopeError, match=r"a postgresql connector's .* source pg-b says connector: mariadb"):
            wrong.run()

        pipeline = Pipeline.of(spark, two_sources(local_config, lake))
        pipeline.run()
        for database in DATABASES:
            assert rows(spark, pipeline.config, database) == source_rows(pg_conn)

        # Later changes, through the update path of both tables.
        pg_conn.execute(f"update {SCHEMA}.users set name = 'ann2', tags = array[null, 'b'] where id = 1")
        pg_conn.execute(f"delete from {SCHEMA}.users where id = 2")
        pg_conn.execute(f"insert into {SCHEMA}.users values (4, 'dee', array[null]::text[])")
        for prefix in PREFIXES:
            wait_for_records(f"{prefix}.{SCHEMA}.users", 7)  # 3 + update + delete and its tombstone + insert
        pipeline.run()
        for database in DATABASES:
            assert rows(spark, pipeline.config, database) == source_rows(pg_conn)
        stats = {t for batch in pipeline.processor.history for t in batch}
        assert stats == {f"{DATABASES[0]}.{SCHEMA}_users", f"{DATABASES[1]}.{SCHEMA}_users"}


def test_topics_whose_names_collide_stop_the_job_at_start(
    spark: SparkSession, local_config: JobConfig, lake_root: str
) -> None:
    prefix = f"msc{RUN_ID}"
    topics = [f"{prefix}.x_y.z", f"{prefix}.x.y_z"]
    admin = AdminClient({"bootstrap.servers": local_config.kafka.bootstrap_servers})
    for future in admin.create_topics([NewTopic(t, 1, 1) for t in topics]).values():
        future.result()
    try:
        config = job_config_for(local_config, prefix, f"ms_c_{RUN_ID}", f"{lake_root}/collide")
        pipeline = Pipeline.of(spark, config)
        with pytest.raises(ConfigError) as e:
            start_query(spark, config, pipeline.processor, available_now=True)
        assert e.value.key == 'tables."x_y.z".name'
        assert f"both map to Silver table ms_c_{RUN_ID}.x_y_z" in str(e.value)
    finally:
        for future in admin.delete_topics(topics).values():
            future.result()
