"""End to end on the real stack: PostgreSQL -> Debezium -> Kafka -> the job -> Hudi (+ Bronze).

PostgreSQL is read independently (psycopg), Hudi with Spark; frames are compared typed with chispa. The job
runs in this process with an available-now trigger, through the same start/await functions as app/main.py.
Phases build on each other, so the tests in this module run in file order against one source schema.
"""
from __future__ import annotations

import dataclasses
import io
import json
import logging
import time
from collections.abc import Iterator
from typing import Any

import fastavro
import psycopg
import pytest
import requests
from chispa import assert_df_equality
from confluent_kafka import Producer
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import (
    BooleanType,
    DataType,
    DateType,
    DecimalType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from app.batch.processor import BatchProcessor
from app.config import JobConfig, TriggerConfig
from app.job import await_query, start_query
from app.sink.bronze import read_bronze
from app.sink.hudi import completed_instants
from app.sink.lakefs import list_files
from app.wire.registry import RegistryClient
from tests.conftest import RUN_ID
from tests.support.cdc import (
    KAFKA_BOOTSTRAP,
    PG_DSN,
    REGISTRY_URL,
    SILVER_EXTRA_COLUMNS,
    as_silver_value,
    debezium_connector,
    job_config_for,
    read_topic,
)
from tests.support.metastore import metastore_table

pytestmark = [pytest.mark.stack, pytest.mark.slow]

SCHEMA = f"e2e_{RUN_ID}"
PREFIX = f"e2e{RUN_ID}"
DATABASE = f"e2e_{RUN_ID}"
TABLES = ("customers", "orders", "order_lines", "marks")

# Explicit Silver column types; only the metadata columns below are left out of comparisons.
EXPECTED_TYPES: dict[str, dict[str, DataType]] = {
    "customers": {
        "id": IntegerType(), "name": StringType(), "email": StringType(), "balance": DecimalType(10, 2),
        "created_at": TimestampType(), "birthday": DateType(), "active": BooleanType(),
    },
    "orders": {
        "order_id": LongType(), "customer_id": IntegerType(), "amount": DecimalType(8, 2),
        "placed_at": TimestampType(), "note": StringType(), "channel": StringType(),
    },
    "order_lines": {
        "order_id": LongType(), "line_no": IntegerType(), "sku": StringType(), "qty": IntegerType(),
        "price": DecimalType(8, 2),
    },
}
KEYS = {"customers": ["id"], "orders": ["order_id"], "order_lines": ["order_id", "line_no"]}

DDL = f"""
create schema {SCHEMA};
create table {SCHEMA}.customers (id int primary key, name varchar(40) not null, email text,
  balance numeric(10,2), created_at timestamp, birthday date, active boolean);
alter table {SCHEMA}.customers replica identity full;
-- default replica identity: a delete's before image holds the key only
create table {SCHEMA}.orders (order_id bigint primary key, customer_id int not null, amount numeric(8,2),
  placed_at timestamp(6), note text);
create table {SCHEMA}.order_lines (order_id bigint, line_no int, sku text not null, qty int, price numeric(8,2),
  primary key (order_id, line_no));
alter table {SCHEMA}.order_lines replica identity full;
create table {SCHEMA}.marks (id serial primary key, note text);
"""

SNAPSHOT = f"""
insert into {SCHEMA}.customers values
  (1, 'ann', 'ann@x.io', 10.50, '2024-01-01 10:11:12.123456', '1990-02-03', true),
  (2, 'bob', null, -0.01, '1999-12-31 23:59:59.999999', '1969-07-20', false),
  (3, 'cy', 'cy@x.io', 0.00, null, null, null),
  (4, 'di', 'di@x.io', -12345678.90, '2024-03-10 02:30:00.000001', '2000-02-29', true),
  (5, 'ed', 'ed@x.io', 1.00, '1970-01-01 00:00:00', '1970-01-01', true),
  (6, 'fay', null, 99999999.99, '2038-01-19 03:14:08.5', '2038-01-19', false),
  (7, 'gus', 'gus@x.io', 7.77, '2020-02-29 12:00:00.000007', '1960-01-01', true),
  (8, 'hal', 'hal@x.io', 8.00, '2021-11-07 01:30:00.25', '2021-11-07', true);
insert into {SCHEMA}.orders select 100 + g, 1 + g % 8, (g * 3.5 - 20)::numeric(8,2),
  timestamp '2024-06-01 08:00:00.000001' + g * interval '1 hour 1.000001 second', 'note ' || g
  from generate_series(0, 10) g;
insert into {SCHEMA}.order_lines select 100 + g / 2, g % 2 + 1, 'sku-' || g, g, (g - 5.25)::numeric(8,2)
  from generate_series(0, 11) g;
"""


@dataclasses.dataclass
class Pipeline:
    spark: SparkSession
    config: JobConfig
    processor: BatchProcessor
    query_id: str = ""

    def run(self) -> None:
        """One available-now run of the job: every offset present now, then stop."""
        query = start_query(self.spark, self.config, self.processor, available_now=True)
        self.query_id = str(query.id)
        await_query(query, self.processor)

    def table_path(self, table: str) -> str:
        return self.config.lake.table_path(f"{SCHEMA}_{table}")


@pytest.fixture(scope="module")
def pg_conn(stack: None) -> Iterator[psycopg.Connection]:
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        conn.execute(f"drop schema if exists {SCHEMA} cascade")
        conn.execute(DDL)
        conn.execute(SNAPSHOT)
        yield conn
        conn.execute(f"drop schema if exists {SCHEMA} cascade")


@pytest.fixture(scope="module")
def connector(pg_conn: psycopg.Connection) -> Iterator[None]:
    with debezium_connector(f"e2e-{RUN_ID}", PREFIX, [SCHEMA]):
        yield


@pytest.fixture(scope="module")
def pipeline(spark: SparkSession, local_config: JobConfig, connector: None, lake_root: str) -> Pipeline:
    config = job_config_for(local_config, PREFIX, DATABASE, f"{lake_root}/e2e")
    processor = BatchProcessor(config, RegistryClient.from_config(config.registry))
    return Pipeline(spark, config, processor)


def topic(table: str) -> str:
    return f"{PREFIX}.{SCHEMA}.{table}"


def settle(conn: psycopg.Connection, label: str) -> None:
    """Wait until Debezium has delivered every change made so far.

    A marker row is written last; once it is in Kafka and no topic's end offset moves for two seconds,
    every earlier change of the WAL has been produced.
    """
    conn.execute(f"insert into {SCHEMA}.marks (note) values (%s)", (label,))
    deadline = time.monotonic() + 90
    while not any(r.value and label.encode() in r.value for r in read_topic(topic("marks"))):
        assert time.monotonic() < deadline, f"marker {label} never reached Kafka"
        time.sleep(0.5)
    previous: dict[str, int] = {}
    while True:
        ends = {t: len(read_topic(topic(t))) for t in TABLES}
        if ends == previous:
            return
        previous = ends
        time.sleep(2)


def silver(p: Pipeline, table: str) -> DataFrame:
    return p.spark.read.format("hudi").load(p.table_path(table)).drop(*SILVER_EXTRA_COLUMNS)


def assert_matches_source(p: Pipeline, conn: psycopg.Connection, table: str) -> None:
    """Silver equals the PostgreSQL table: same typed rows (sorted by key), same explicit column types."""
    actual = silver(p, table)
    types = {name: t for name, t in EXPECTED_TYPES[table].items() if name in actual.columns}
    assert {f.name: f.dataType for f in actual.schema.fields} == types
    columns = list(types)
    rows = conn.execute(f"select {', '.join(columns)} from {SCHEMA}.{table}").fetchall()
    schema = StructType([StructField(name, t, True) for name, t in types.items()])
    expected = p.spark.createDataFrame([tuple(as_silver_value(v) for v in row) for row in rows], schema)
    keys = KEYS[table]
    assert_df_equality(
        actual.select(columns).orderBy(*keys), expected.orderBy(*keys), ignore_nullable=True
    )


def assert_all_match(p: Pipeline, conn: psycopg.Connection) -> None:
    for table in KEYS:
        assert_matches_source(p, conn, table)


def batch_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("app.batch.") and " table=" in r.getMessage()]


# ---------------------------------------------------------------------------------------------------------
# Phases, in order.


def test_snapshot_and_first_changes(pipeline: Pipeline, pg_conn: psycopg.Connection) -> None:
    c = pg_conn
    with c.transaction():  # several updates to one key in one transaction
        c.execute(f"update {SCHEMA}.customers set name = 'bob2' where id = 2")
        c.execute(f"update {SCHEMA}.customers set balance = -0.02 where id = 2")
        c.execute(f"update {SCHEMA}.customers set name = 'bob3', email = 'b@x.io' where id = 2")
    c.execute(f"update {SCHEMA}.customers set name = 'ann2' where id = 1")
    c.execute(f"delete from {SCHEMA}.customers where id = 3")  # delete, then re-insert, same batch
    c.execute(f"insert into {SCHEMA}.customers values (3, 'cy2', null, -3.33, '2001-01-01 00:00:00.000001', "
              "'2001-01-01', false)")
    c.execute(f"update {SCHEMA}.customers set email = null, created_at = '2024-12-31 23:59:59.999999' where id = 4")
    c.execute(f"update {SCHEMA}.customers set id = 50 where id = 5")  # primary key change
    c.execute(f"insert into {SCHEMA}.orders values (111, 3, -12.34, '2024-07-01 00:00:00.000009', null)")
    c.execute(f"delete from {SCHEMA}.orders where order_id = 101")
    c.execute(f"update {SCHEMA}.order_lines set qty = 42 where order_id = 100 and line_no = 1")
    c.execute(f"delete from {SCHEMA}.order_lines where order_id = 100 and line_no = 2")
    c.execute(f"insert into {SCHEMA}.order_lines values (106, 1, 'sku-new', null, -0.99)")
    settle(c, "phase-1")
    pipeline.run()
    assert_all_match(pipeline, c)
    # Each commit records the batch and the streaming query in its extra metadata (replay detection later).
    timeline = pipeline.table_path("customers") + "/.hoodie/timeline"
    latest_commit = max(n for n in list_files(pipeline.spark, timeline, ".commit") if "/" not in n)
    content = pipeline.spark.sparkContext.binaryFiles(f"{timeline}/{latest_commit}").first()[1]
    assert b"_cdc.batch_id" in content and pipeline.query_id.encode() in content


def test_second_run_two_writer_schemas_in_one_batch(pipeline: Pipeline, pg_conn: psycopg.Connection) -> None:
    c = pg_conn
    c.execute(f"insert into {SCHEMA}.orders values (112, 1, 5.00, '2024-07-02 00:00:00', 'old schema')")
    c.execute(f"alter table {SCHEMA}.orders add column channel text")
    c.execute(f"insert into {SCHEMA}.orders values (113, 2, -6.50, '2024-07-03 00:00:00.5', 'new schema', 'web')")
    c.execute(f"update {SCHEMA}.orders set channel = 'store' where order_id = 100")
    c.execute(f"delete from {SCHEMA}.customers where id = 6")  # re-inserted in the next run
    c.execute(f"update {SCHEMA}.customers set id = 5 where id = 50")  # and the key changes back
    c.execute(f"update {SCHEMA}.order_lines set price = -7.01 where order_id = 101 and line_no = 1")
    c.execute(f"delete from {SCHEMA}.order_lines where order_id = 102 and line_no = 1")
    settle(c, "phase-2")
    pipeline.run()
    assert_all_match(pipeline, c)
    orders_stats = pipeline.processor.last_stats[f"{DATABASE}.{SCHEMA}_orders"]
    assert len(orders_stats.schema_ids) == 2, orders_stats


def test_catalog_follows_the_source_schema(pipeline: Pipeline, pg_conn: psycopg.Connection) -> None:
    # Hudi's meta sync after each commit: the metastore's own tables (what Athena reads) hold every source
    # column, `channel` added mid-stream included, and the table's location; the delete ledger is not there.
    for table in TABLES:
        registered = metastore_table(DATABASE, f"{SCHEMA}_{table}")
        assert registered is not None, f"{table} not in the metastore"
        table_type, location, columns = registered
        source = [r[0] for r in pg_conn.execute(
            "select column_name from information_schema.columns where table_schema = %s and table_name = %s",
            (SCHEMA, table),
        ).fetchall()]
        assert set(source) <= set(columns), (table, source, columns)
        assert location.rstrip("/").endswith(pipeline.table_path(table).split("://")[-1].rstrip("/")), location
        assert table_type == "EXTERNAL_TABLE", table_type
    assert "channel" in metastore_table(DATABASE, f"{SCHEMA}_orders")[2]  # type: ignore[index]
    assert metastore_table(DATABASE, f"{SCHEMA}_orders_cdc_delete_ledger") is None


def test_per_batch_log_lines_carry_known_counts(
    pipeline: Pipeline, pg_conn: psycopg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    c = pg_conn
    c.execute(f"insert into {SCHEMA}.orders values (120, 1, 1.20, '2024-08-01 00:00:00', 'a', 'web'), "
              f"(121, 1, 1.21, '2024-08-01 00:00:01', 'b', 'web')")
    with c.transaction():
        c.execute(f"update {SCHEMA}.orders set amount = 11.10 where order_id = 111")
        c.execute(f"update {SCHEMA}.orders set amount = 11.11 where order_id = 111")
    c.execute(f"delete from {SCHEMA}.orders where order_id = 112")
    c.execute(f"insert into {SCHEMA}.customers values (6, 'fay2', 'f@x.io', 6.06, '2024-08-06 06:06:06.060606', "
              "'1986-06-06', true)")
    settle(c, "phase-3")
    with caplog.at_level(logging.INFO, logger="app.batch"):
        pipeline.run()
    assert_all_match(pipeline, c)
    lines = batch_lines(caplog)
    # orders: 2 inserts + 2 updates of one key + 1 delete and its tombstone = 6 records;
    # written: 3 upserts (120, 121, 111 once) and 1 delete; 1 skipped (tombstone); 1 superseded update.
    orders = [line for line in lines if f"table={DATABASE}.{SCHEMA}_orders " in line]
    assert len(orders) == 1, lines
    assert "rows_in=6 upserts=3 deletes=1 skipped=1 superseded=1" in orders[0], orders[0]
    customers = [line for line in lines if f"table={DATABASE}.{SCHEMA}_customers " in line]
    assert "rows_in=1 upserts=1 deletes=0 skipped=0 superseded=0" in customers[0], customers


def _envelope_schema(raw: bytes) -> tuple[int, dict[str, Any]]:
    schema_id = int.from_bytes(raw[1:5], "big")
    text = requests.get(f"{REGISTRY_URL}/apis/registry/v3/ids/contentIds/{schema_id}", timeout=10).text
    return schema_id, json.loads(text)


def _stale_copy(raw: bytes, op: str, lsn: int, change: dict[str, Any]) -> bytes:
    """A copy of a real Debezium event with another op, an older LSN and changed row values."""
    schema_id, schema = _envelope_schema(raw)
    parsed = fastavro.parse_schema(schema)
    event = fastavro.schemaless_reader(io.BytesIO(raw[5:]), parsed, parsed)
    assert isinstance(event, dict)
    image = dict(event["after"] or event["before"])
    image.update(change)
    event["op"] = op
    event["before"], event["after"] = (image, None) if op == "d" else (event["before"], image)
    event["source"]["lsn"] = lsn
    out = io.BytesIO()
    out.write(b"\x00" + schema_id.to_bytes(4, "big"))
    fastavro.schemaless_writer(out, parsed, event)
    return out.getvalue()


def test_stale_upsert_and_stale_delete_leave_rows_unchanged(
    pipeline: Pipeline, pg_conn: psycopg.Connection
) -> None:
    records = [r for r in read_topic(topic("customers")) if r.value is not None]
    latest: dict[bytes, Any] = {}
    for r in records:
        assert r.key is not None
        latest[r.key] = r  # last record per key
    by_id = {}
    for r in latest.values():
        _, schema = _envelope_schema(r.value)
        parsed = fastavro.parse_schema(schema)
        event = fastavro.schemaless_reader(io.BytesIO(r.value[5:]), parsed, parsed)
        assert isinstance(event, dict)
        if event["after"] is not None:
            by_id[event["after"]["id"]] = r
    stale_upsert = _stale_copy(by_id[4].value, "u", 1, {"name": "STALE"})
    stale_delete = _stale_copy(by_id[7].value, "d", 1, {})
    producer = Producer({"bootstrap.servers": KAFKA_BOOTSTRAP})
    producer.produce(topic("customers"), key=by_id[4].key, value=stale_upsert)
    producer.produce(topic("customers"), key=by_id[7].key, value=stale_delete)
    assert producer.flush(30) == 0
    pipeline.run()
    stats = pipeline.processor.last_stats[f"{DATABASE}.{SCHEMA}_customers"]
    assert (stats.rows_in, stats.upserts, stats.deletes) == (2, 1, 1)
    assert_matches_source(pipeline, pg_conn, "customers")  # rows 4 and 7 as in PostgreSQL


def test_bronze_holds_every_kafka_record_byte_for_byte(pipeline: Pipeline) -> None:
    bronze = read_bronze(pipeline.spark, pipeline.config.lake.bronze_path)
    assert bronze is not None
    for table in TABLES:
        expected = {
            (r.topic, r.partition, r.offset): (r.key, r.value, tuple(sorted(r.headers)))
            for r in read_topic(topic(table))
        }
        rows = bronze.filter(bronze.topic == topic(table)).collect()
        actual = {
            (r.topic, r.partition, r.offset): (
                None if r.key is None else bytes(r.key),
                None if r.value is None else bytes(r.value),
                tuple(sorted((h.key, bytes(h.value)) for h in (r.headers or []))),
            )
            for r in rows
        }
        assert len(rows) == len(actual), f"{table}: duplicate (topic, partition, offset) in Bronze"
        assert actual == expected, table


def bronze_count(p: Pipeline) -> int:
    bronze = read_bronze(p.spark, p.config.lake.bronze_path)
    return 0 if bronze is None else bronze.count()


def _bronze_listing(p: Pipeline) -> list[str]:
    return list_files(p.spark, p.config.lake.bronze_path, ".parquet")


def test_rerun_without_new_data_writes_nothing_then_n_events_add_n_bronze_rows(
    pipeline: Pipeline, pg_conn: psycopg.Connection
) -> None:
    instants = {t: completed_instants(pipeline.spark, pipeline.table_path(t)) for t in TABLES}
    listing = _bronze_listing(pipeline)
    pipeline.run()
    assert {t: completed_instants(pipeline.spark, pipeline.table_path(t)) for t in TABLES} == instants
    assert _bronze_listing(pipeline) == listing

    bronze_rows = bronze_count(pipeline)
    kafka_before = sum(len(read_topic(topic(t))) for t in TABLES)
    pg_conn.execute(f"insert into {SCHEMA}.order_lines values (107, 1, 'n1', 1, 1.00), (107, 2, 'n2', 2, 2.00)")
    settle(pg_conn, "phase-rerun")
    new_events = sum(len(read_topic(topic(t))) for t in TABLES) - kafka_before
    assert new_events == 3  # two order_lines inserts and the marker row
    pipeline.run()
    assert bronze_count(pipeline) == bronze_rows + new_events
    assert_matches_source(pipeline, pg_conn, "order_lines")


def test_batch_plan_has_no_python_evaluation(pipeline: Pipeline) -> None:
    raw = (
        pipeline.spark.read.format("kafka")
        .option("kafka.bootstrap.servers", KAFKA_BOOTSTRAP)
        .option("subscribePattern", pipeline.config.kafka.topic_pattern)
        .option("includeHeaders", "true")
        .load()
    )
    plans = pipeline.processor.planner.plan(raw).tables
    assert {p.route.source_table for p in plans} == set(TABLES)
    for table_plan in plans:
        physical = table_plan.latest_df()._jdf.queryExecution().executedPlan().toString()
        for node in ("BatchEvalPython", "ArrowEvalPython", "MapInPandas", "PythonUDF"):
            assert node not in physical, f"{table_plan.route.topic}: {node} in plan"
        assert "from_avro" in physical


def test_silver_tables_queryable_by_name(pipeline: Pipeline, pg_conn: psycopg.Connection) -> None:
    for table in KEYS:
        count = pipeline.spark.sql(f"select count(*) from {DATABASE}.{SCHEMA}_{table}").first()
        assert count is not None
        (expected,) = pg_conn.execute(f"select count(*) from {SCHEMA}.{table}").fetchone() or (None,)
        assert count[0] == expected, table



def test_continuous_trigger_processes_new_changes(pipeline: Pipeline, pg_conn: psycopg.Connection) -> None:
    """The default mode: a processing-time trigger that keeps running until stopped."""
    config = dataclasses.replace(pipeline.config, trigger=TriggerConfig(processing_time="1 second"))
    query = start_query(pipeline.spark, config, pipeline.processor, available_now=False)
    try:
        pg_conn.execute(f"update {SCHEMA}.customers set name = 'live' where id = 8")
        settle(pg_conn, "phase-live")
        query.processAllAvailable()
        assert query.isActive
    finally:
        query.stop()
    assert_matches_source(pipeline, pg_conn, "customers")
    live = silver(pipeline, "customers").filter("id = 8").first()
    assert live is not None and live["name"] == "live"
