"""TICKIT end to end: all 7 tables through Debezium and the job, Silver typed-equal to PostgreSQL.

Runs in a database of its own (TICKIT's schema names are fixed), so it never meets the demo's tables.
"""
from __future__ import annotations

import time
from collections.abc import Iterator

import psycopg
import pytest
from chispa import assert_df_equality
from pyspark.sql import SparkSession
from pyspark.sql.types import (
    BooleanType,
    DataType,
    DateType,
    DecimalType,
    IntegerType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from app.batch import BatchProcessor
from app.config import JobConfig
from app.connect import PostgresSource
from app.main import await_query, start_query
from app.registry import RegistryClient
from scripts import tickit
from tests.conftest import RUN_ID
from tests.support.cdc import (
    PG_DSN,
    SILVER_EXTRA_COLUMNS,
    SOURCE,
    as_silver_value,
    debezium_connector,
    job_config_for,
    read_topic,
)

pytestmark = [pytest.mark.stack, pytest.mark.slow]

DBNAME = f"tickit_{RUN_ID}"
PREFIX = f"tk{RUN_ID}"
DATABASE = f"tickit_{RUN_ID}"

S, N, D, B, T = StringType(), IntegerType(), DateType(), BooleanType(), TimestampType()
MONEY = DecimalType(8, 2)
# smallint and integer arrive as Avro int (Spark int); char/varchar as string; numeric(8,2) as decimal(8,2);
# date as io.debezium.time.Date; timestamp as io.debezium.time.MicroTimestamp.
EXPECTED_TYPES: dict[str, dict[str, DataType]] = {
    "crm.users": {
        "userid": N, "username": S, "firstname": S, "lastname": S, "city": S, "state": S, "email": S, "phone": S,
        "likesports": B, "liketheatre": B, "likeconcerts": B, "likejazz": B, "likeclassical": B, "likeopera": B,
        "likerock": B, "likevegas": B, "likebroadway": B, "likemusicals": B,
    },
    "ems.venue": {"venueid": N, "venuename": S, "venuecity": S, "venuestate": S, "venueseats": N},
    "ems.category": {"catid": N, "catgroup": S, "catname": S, "catdesc": S},
    "ecomm.date": {"dateid": N, "caldate": D, "day": S, "week": N, "month": S, "qtr": S, "year": N, "holiday": B},
    "ems.event": {"eventid": N, "venueid": N, "catid": N, "dateid": N, "eventname": S, "starttime": T},
    "ecomm.listing": {
        "listid": N, "sellerid": N, "eventid": N, "dateid": N, "numtickets": N, "priceperticket": MONEY,
        "totalprice": MONEY, "listtime": T,
    },
    "ecomm.sales": {
        "salesid": N, "listid": N, "sellerid": N, "buyerid": N, "eventid": N, "dateid": N, "qtysold": N,
        "pricepaid": MONEY, "commission": MONEY, "saletime": T,
    },
}


@pytest.fixture(scope="module")
def tickit_db(stack: None) -> Iterator[psycopg.Connection]:
    admin_dsn = PG_DSN.replace("dbname=source", "dbname=postgres")
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(f"create database {DBNAME}")
    try:
        with psycopg.connect(PG_DSN.replace("dbname=source", f"dbname={DBNAME}"), autocommit=True) as conn:
            tickit.create_schema(conn)
            yield conn
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            admin.execute(f"drop database if exists {DBNAME} with (force)")


def _run(spark: SparkSession, config: JobConfig) -> BatchProcessor:
    processor = BatchProcessor(config, RegistryClient.from_config(config.registry))
    await_query(start_query(spark, config, processor, available_now=True), processor)
    return processor


def _wait_for(expected: dict[str, int], timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        counts = {t: len(read_topic(f"{PREFIX}.{t}")) for t in tickit.TABLES}
        if counts == expected:
            return
        assert time.monotonic() < deadline, f"Kafka has {counts}, expected {expected}"
        time.sleep(1)


def _assert_typed_equal(spark: SparkSession, conn: psycopg.Connection, config: JobConfig, table: str) -> None:
    path = config.lake.table_path(table.replace(".", "_"))
    actual = spark.read.format("hudi").load(path).drop(*SILVER_EXTRA_COLUMNS)
    types = EXPECTED_TYPES[table]
    assert {f.name: f.dataType for f in actual.schema.fields} == types, table
    rows = conn.execute(f"select {', '.join(types)} from {table}").fetchall()
    expected = spark.createDataFrame(
        [tuple(as_silver_value(v) for v in row) for row in rows],
        StructType([StructField(name, t, True) for name, t in types.items()]),
    )
    keys = tickit.PRIMARY_KEYS[table]
    assert_df_equality(actual.select(*types).orderBy(*keys), expected.orderBy(*keys), ignore_nullable=True)


def test_tickit_snapshot_and_burst_typed_equal(
    spark: SparkSession, local_config: JobConfig, tickit_db: psycopg.Connection, lake_root: str
) -> None:
    loaded = tickit.load(tickit_db, scale=0.1)
    source = PostgresSource(SOURCE.host, SOURCE.port, SOURCE.user, SOURCE.password, DBNAME)
    config = job_config_for(local_config, PREFIX, DATABASE, f"{lake_root}/tickit")
    with debezium_connector(f"tk-{RUN_ID}", PREFIX, tickit.SCHEMAS, source):
        _wait_for(loaded)
        first = _run(spark, config)
        for table in tickit.TABLES:
            _assert_typed_equal(spark, tickit_db, config, table)
        assert sum(s.upserts for batch in first.history for s in batch.values()) == sum(loaded.values())

        changes = tickit.burst(tickit_db, n=40)
        expected = {
            t: loaded[t] + c.get("insert", 0) + c.get("update", 0) + 2 * c.get("delete", 0)
            for t, c in ((t, changes.get(t, {})) for t in tickit.TABLES)
        }
        _wait_for(expected)
        second = _run(spark, config)
        for table in tickit.TABLES:
            _assert_typed_equal(spark, tickit_db, config, table)
        # burst never deletes a row it inserted in the same run, so every delete reaches Silver as one.
        deleted = sum(s.deletes for batch in second.history for s in batch.values())
        assert deleted == sum(c.get("delete", 0) for c in changes.values())
