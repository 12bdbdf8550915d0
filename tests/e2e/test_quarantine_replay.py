"""A PostgreSQL column narrowed from numeric(6,2) to numeric(5,2), a type change the lake cannot follow
(app/sink/widening.py): the table is quarantined while the job's other table keeps flowing, also after a restart;
after the fix (the table rewritten with the new type) and its quarantine file removed,
scripts/replay_dead_letters.py re-feeds its dead letters and the table equals PostgreSQL value by value, and the job
takes its changes again.

The table has a TOASTed column (`doc`, stored out of line, default replica identity): an update that leaves it alone
carries Debezium's placeholder instead. Replayed, such an update takes the value from the table's row; one whose
key has no row (its insert left out of the replay) is reported `incomplete`, naming the key to re-snapshot, and the
key stays diverged until a Debezium incremental snapshot of it (a signal) brings its snapshot read, which the job
writes and which settles its dead letters.

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

from app.config import JobConfig
from app.sink.lakefs import delete_path, read_text
from app.sink.quarantine import Quarantine
from app.state.status import status_path
from scripts.replay_dead_letters import Selection, replay
from tests.conftest import RUN_ID
from tests.support.cdc import debezium_connector, job_config_for, read_topic
from tests.support.pipeline import Pipeline, rewrite_with_type, source_schema

pytestmark = [pytest.mark.stack, pytest.mark.slow]

SCHEMA = f"qr_{RUN_ID}"
PREFIX = f"qr{RUN_ID}"
DATABASE = f"qr_{RUN_ID}"
DDL = f"""
create schema {SCHEMA};
create table {SCHEMA}.prices (id int primary key, amount numeric(6,2), note text, doc text);
alter table {SCHEMA}.prices alter column doc set storage external;
create table {SCHEMA}.other (id int primary key, v text);
create table {SCHEMA}.debezium_signal (id varchar(64) primary key, type varchar(32) not null, data varchar(2048));
insert into {SCHEMA}.prices select i, i * 100.25, 'n' || i, repeat(md5(i::text), 250) from generate_series(1, 5) i;
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
    expected = sorted(conn.execute(f"select id, amount::text, note, doc from {SCHEMA}.prices").fetchall())
    actual = sorted(tuple(r) for r in _silver(spark, config, "prices")
                    .selectExpr("id", "cast(amount as string)", "note", "doc").collect())
    assert actual == expected


def _other_equals_postgresql(spark: SparkSession, config: JobConfig, conn: psycopg.Connection) -> None:
    expected = sorted(conn.execute(f"select id, v from {SCHEMA}.other").fetchall())
    assert sorted(tuple(r) for r in _silver(spark, config, "other").select("id", "v").collect()) == expected


def _offsets(table: str) -> list[int]:
    return [r.offset for r in read_topic(f"{PREFIX}.{SCHEMA}.{table}")]


def test_a_narrowed_numeric_is_quarantined_then_repaired_by_replay(
    spark: SparkSession, local_config: JobConfig, lake_root: str, pg_conn: psycopg.Connection
) -> None:
    s = SCHEMA
    signals = {"signal.data.collection": f"{SCHEMA}.debezium_signal"}
    with debezium_connector(f"qr-{RUN_ID}", PREFIX, [SCHEMA], settings=signals):
        config = job_config_for(local_config, PREFIX, DATABASE, f"{lake_root}/quarantine_replay")
        _wait("prices", 5)
        _wait("other", 3)
        Pipeline.of(spark, config).run()
        _prices_equal_postgresql(spark, config, pg_conn)

        # The narrowing, then an insert, an update and a delete; the other table changes too. The
        # updates leave the TOASTed doc alone: their events carry the placeholder.
        pg_conn.execute(f"alter table {s}.prices alter column amount type numeric(5,2)")
        pg_conn.execute(f"insert into {s}.prices values (6, 999.99, 'wide')")
        pg_conn.execute(f"update {s}.prices set amount = 888.88 where id = 1")
        pg_conn.execute(f"delete from {s}.prices where id = 2")
        pg_conn.execute(f"insert into {s}.prices values (7, 7.77, 'seven', repeat(md5('seven'), 250))")
        pg_conn.execute(f"update {s}.prices set amount = 777.77 where id = 7")
        pg_conn.execute(f"insert into {s}.other values (4, 'v4')")
        _wait("prices", 11)  # 5 + insert + update + delete + its tombstone + insert + update
        _wait("other", 4)
        second = Pipeline.of(spark, config)
        second.run()

        assert set(second.processor.quarantine.tables) == {PRICES}
        assert second.processor.last_stats[PRICES].quarantined
        _other_equals_postgresql(spark, config, pg_conn)

        # A restart: still quarantined, the other table still flowing.
        pg_conn.execute(f"update {s}.prices set note = 'later' where id = 3")
        pg_conn.execute(f"insert into {s}.other values (5, 'v5')")
        _wait("prices", 12)
        _wait("other", 5)
        third = Pipeline.of(spark, config)
        third.run()

        assert third.processor.last_stats[PRICES].quarantined and third.processor.last_stats[PRICES].dead_letters == 1
        _other_equals_postgresql(spark, config, pg_conn)

        # The fix, the quarantine lifted. First the records from key 7's update on: the updates of keys 7 and 3
        # carry the doc placeholder; key 3's row in the table supplies it, key 7 has no row (its insert is not among
        # these): incomplete, naming the re-snapshot.
        rewrite_with_type(spark, config, f"{s}_prices", "amount", "decimal(5,2)")
        delete_path(spark, Quarantine(config).path(DATABASE, f"{s}_prices"))
        update_7, update_3 = _offsets("prices")[-2:]
        outcomes = replay(spark, config, Selection(topic=f"{PREFIX}.{SCHEMA}.prices", from_offset=update_7))

        assert [(o.dead_letter_id.rsplit("/", 1)[1], o.status) for o in outcomes] == [
            (str(update_7), "incomplete"), (str(update_3), "applied")], outcomes
        assert "columns doc were not in the event" in outcomes[0].detail and '{"id":7}' in outcomes[0].detail
        # Then the rest: the insert of key 7 is older than its replayed update.
        outcomes = replay(spark, config, Selection(tables=(PRICES,)))

        assert [o.status for o in outcomes] == ["applied", "applied", "applied", "superseded"], outcomes
        status = json.loads(read_text(spark, status_path(config)))
        assert status["dead_letters"][PRICES]["records"] == 6
        assert status["dead_letters"][PRICES]["diverged_keys"] == ['{"id":7}']  # only the incomplete one
        rows = {r["id"]: r for r in _silver(spark, config, "prices").collect()}
        assert (rows[1]["doc"],) == pg_conn.execute(f"select doc from {s}.prices where id = 1").fetchone()
        assert rows[7]["doc"] is None and str(rows[7]["amount"]) == "777.77"

        # The re-snapshot of key 7 the report named (a Debezium incremental snapshot, by its signal table), and a
        # later change: the job takes the table's changes again and the snapshot read settles key 7.
        signal = {"data-collections": [f"{s}.prices"], "type": "incremental",
                  "additional-conditions": [{"data-collection": f"{s}.prices", "filter": "id = 7"}]}
        pg_conn.execute(f"insert into {s}.debezium_signal values ('resnapshot-7', 'execute-snapshot', %s)",
                        (json.dumps(signal),))
        pg_conn.execute(f"update {s}.prices set amount = 5.5 where id = 6")
        _wait("prices", 14)  # + the snapshot read + the update
        fourth = Pipeline.of(spark, config)
        fourth.run()

        assert not fourth.processor.quarantine.tables
        # Key 7's incomplete update (its insert was superseded: settled already).
        assert sum(b[PRICES].settled for b in fourth.processor.history if PRICES in b) == 1
        _prices_equal_postgresql(spark, config, pg_conn)
        _other_equals_postgresql(spark, config, pg_conn)
        status = json.loads(read_text(spark, status_path(config)))
        assert status["dead_letters"][PRICES]["diverged_keys"] == []
