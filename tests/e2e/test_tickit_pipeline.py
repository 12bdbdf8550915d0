"""TICKIT end to end as the reference setup runs it: crm and ems on PostgreSQL, ecomm on MariaDB, one Debezium
connector each, both flattening their events with the unwrap SMT (delete.tombstone.handling.mode=rewrite), one
job reading both into one lake. Every Silver table equals its source table, typed and value by value, after the
snapshot and after a burst of inserts, updates, deletes and primary-key changes in both databases.

Runs in databases of its own (a PostgreSQL database, and a MariaDB database for ecomm mapped back to the
`ecomm_*` Silver names), so it never meets the demo's tables.
"""
from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import psycopg
import pymysql
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

from app.batch.processor import BatchProcessor
from app.config import JobConfig, SourceConfig, TableConfig
from app.job import await_query, start_query
from app.wire.registry import RegistryClient
from devkit.connect import PostgresSource, unwrap_smt_config
from scripts import tickit
from tests.conftest import RUN_ID
from tests.support.cdc import (
    MARIADB_ROOT,
    PG_DSN,
    SILVER_EXTRA_COLUMNS,
    SOURCE,
    as_silver_value,
    debezium_connector,
    job_config_for,
    mariadb_connector,
    read_topic,
)

pytestmark = [pytest.mark.stack, pytest.mark.slow]

DBNAME = f"tickit_{RUN_ID}"
ECOMM = f"ecomm_{RUN_ID}"  # ecomm's MariaDB database
PG_PREFIX, MARIADB_PREFIX = f"tkp{RUN_ID}", f"tkm{RUN_ID}"
DATABASE = f"tickit_{RUN_ID}"
PG_SYSTEMS = ["crm", "ems"]

S, N, D, B, T = StringType(), IntegerType(), DateType(), BooleanType(), TimestampType()
MONEY = DecimalType(8, 2)
# PostgreSQL: smallint and integer arrive as Avro int; char/varchar as string; numeric(8,2) as decimal(8,2);
# date as io.debezium.time.Date; timestamp as io.debezium.time.MicroTimestamp.
# MariaDB (ecomm): smallint as Avro int (INT16), boolean is tinyint(1) and arrives as a number (Silver int,
# 0/1, as MariaDB returns it); datetime(6) as MicroTimestamp.
EXPECTED_TYPES: dict[str, dict[str, DataType]] = {
    "crm.users": {
        "userid": N, "username": S, "firstname": S, "lastname": S, "city": S, "state": S, "email": S, "phone": S,
        "likesports": B, "liketheatre": B, "likeconcerts": B, "likejazz": B, "likeclassical": B, "likeopera": B,
        "likerock": B, "likevegas": B, "likebroadway": B, "likemusicals": B,
    },
    "ems.venue": {"venueid": N, "venuename": S, "venuecity": S, "venuestate": S, "venueseats": N},
    "ems.category": {"catid": N, "catgroup": S, "catname": S, "catdesc": S},
    "ecomm.date": {"dateid": N, "caldate": D, "day": S, "week": N, "month": S, "qtr": S, "year": N, "holiday": N},
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


def topic(table: str) -> str:
    system, name = table.split(".")
    return f"{PG_PREFIX}.{table}" if system in PG_SYSTEMS else f"{MARIADB_PREFIX}.{ECOMM}.{name}"


@pytest.fixture(scope="module")
def placement(stack: None) -> Iterator[tickit.Placement]:
    admin_dsn = PG_DSN.replace("dbname=source", "dbname=postgres")
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(f"create database {DBNAME}")
    maria = pymysql.connect(**MARIADB_ROOT, autocommit=True)
    try:
        with psycopg.connect(PG_DSN.replace("dbname=source", f"dbname={DBNAME}"), autocommit=True) as conn:
            placed = tickit.Placement.reference(conn, maria, {"ecomm": ECOMM})
            tickit.create_schema(placed)
            yield placed
    finally:
        with maria.cursor() as cur:
            cur.execute(f"drop database if exists `{ECOMM}`")
        maria.close()
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            admin.execute(f"drop database if exists {DBNAME} with (force)")


def reference_job(base: JobConfig, lake: str) -> JobConfig:
    """Two sources into one catalog database; MariaDB's `<ecomm db>.<table>` topics keep ecomm's Silver names."""
    config = job_config_for(base, PG_PREFIX, DATABASE, lake)
    assert config.source is not None
    postgres = dataclasses.replace(config.source, name="crm-ems", connector="postgresql", events="flattened")
    mariadb = SourceConfig(
        topic_prefix=MARIADB_PREFIX, name="ecomm", connector="mariadb", events="flattened",
        tables={f"{ECOMM}.{t.split('.')[1]}": TableConfig(name=t.replace(".", "_"))
                for t in tickit.TABLES if t.startswith("ecomm.")},
    )
    pattern = "(" + "|".join(map(re.escape, (PG_PREFIX, MARIADB_PREFIX))) + r")\.[^.]+\.[^.]+"
    return dataclasses.replace(config, source=None, tables={}, sources=[postgres, mariadb],
                               kafka=dataclasses.replace(config.kafka, topic_pattern=pattern))


def _run(spark: SparkSession, config: JobConfig) -> BatchProcessor:
    processor = BatchProcessor(config, RegistryClient.from_config(config.registry))
    await_query(start_query(spark, config, processor, available_now=True), processor)
    return processor


def _wait_for(expected: dict[str, int], timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        counts = {t: len(read_topic(topic(t))) for t in tickit.TABLES}
        if counts == expected:
            return
        assert time.monotonic() < deadline, f"Kafka has {counts}, expected {expected}"
        time.sleep(1)


def _silver_value(value: Any) -> Any:
    # MariaDB returns decimal(8,2) as Decimal and tinyint(1) as int already; naive datetimes as PostgreSQL's.
    return as_silver_value(value) if not isinstance(value, Decimal) else value


def _assert_typed_equal(spark: SparkSession, placement: tickit.Placement, config: JobConfig, table: str) -> None:
    path = config.lake.table_path(table.replace(".", "_"))
    actual = spark.read.format("hudi").load(path).drop(*SILVER_EXTRA_COLUMNS)
    types = EXPECTED_TYPES[table]
    assert {f.name: f.dataType for f in actual.schema.fields} == types, table
    db = placement.db(table)
    rows = db.rows(f"select {', '.join(map(db.quote, types))} from {db.table(table)}")
    expected = spark.createDataFrame(
        [tuple(_silver_value(v) for v in row) for row in rows],
        StructType([StructField(name, t, True) for name, t in types.items()]),
    )
    keys = tickit.PRIMARY_KEYS[table]
    assert_df_equality(actual.select(*types).orderBy(*keys), expected.orderBy(*keys), ignore_nullable=True)


def test_tickit_on_postgresql_and_mariadb_through_the_unwrap_smt(
    spark: SparkSession, local_config: JobConfig, placement: tickit.Placement, lake_root: str
) -> None:
    loaded = tickit.load(placement, scale=0.1)
    source = PostgresSource(SOURCE.host, SOURCE.port, SOURCE.user, SOURCE.password, DBNAME)
    config = reference_job(local_config, f"{lake_root}/tickit")
    with (
        debezium_connector(f"tkp-{RUN_ID}", PG_PREFIX, PG_SYSTEMS, source, unwrap_smt_config("postgresql")),
        mariadb_connector(f"tkm-{RUN_ID}", MARIADB_PREFIX, [ECOMM], unwrap_smt_config("mariadb")),
    ):
        _wait_for(loaded)
        first = _run(spark, config)
        for table in tickit.TABLES:
            _assert_typed_equal(spark, placement, config, table)
        assert sum(s.upserts for batch in first.history for s in batch.values()) == sum(loaded.values())

        # The burst goes to a new binlog file: its events must sort after the snapshot's (file index first).
        with placement.db("ecomm").conn.cursor() as cur:
            cur.execute("FLUSH BINARY LOGS")
        changes = tickit.burst(placement, n=40)
        assert changes["ecomm.listing"]["rekey"] and changes["crm.users"]["rekey"], changes
        expected = {t: loaded[t] + n for t, n in tickit.burst_records(changes).items()}
        _wait_for(expected)
        second = _run(spark, config)
        for table in tickit.TABLES:
            _assert_typed_equal(spark, placement, config, table)
        listing = spark.read.format("hudi").load(config.lake.table_path("ecomm_listing"))
        files = {r[0] for r in listing.selectExpr("substring(_cdc_position, 1, 10)").distinct().collect()}
        assert len(files) == 2, files  # snapshot rows from the first binlog file, changed rows from the next
        # burst never deletes a row it inserted in the same run, so every delete reaches Silver as one.
        deleted = sum(s.deletes for batch in second.history for s in batch.values())
        assert deleted == sum(c["delete"] + c["rekey"] for c in changes.values())
