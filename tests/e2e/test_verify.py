"""scripts/verify.py compares Silver tables with PostgreSQL over JDBC, on the real stack (lake on S3).

One table of many column types (a domain, an enum, arrays holding NULL elements, infinities, NaN, bytes, json,
money, time; an interval, which the script does not compare and must name) goes through the connector and the job:
- after the snapshot and again after every row is rewritten, verify finds it equal (exit 0);
- differences planted in Silver (a value changed, a row added, a row deleted, each through a Hudi upsert of the
  test's own) are each found, by key and by column (exit 1): at once with `--settle-s 0`, and after one read again
  once the job's checkpoint shows it applied what Kafka held (it had: the job is idle); the source's own changes
  of those keys then repair them through the job;
- under a live workload (a writer changing keys while available-now runs of the job follow it), verify settles
  on the job's checkpoint: no false difference (exit 0);
- a MariaDB table of its own types (through the binlog connector): after the snapshot only its float column
  differs (the connector's 6-digit snapshot reading), after the update path (streamed exact) equal; its `time`
  column named as not compared.
`--help` has no side effects.
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pymysql
import pytest
import yaml
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from app.cdc.columns import DELETED_COL, POSITION_COL
from app.config import JobConfig, load_config
from app.sink.hudi import HudiTarget, write_options
from tests.conftest import LOCAL_CONF, ROOT, RUN_ID
from tests.support.cdc import MARIADB_ROOT, PG_DSN, debezium_connector, mariadb_connector, wait_for_records
from tests.support.pipeline import Pipeline, source_schema

VERIFY = ROOT / "scripts" / "verify.py"
SCHEMA = f"vf_{RUN_ID}"
PREFIX = f"vf{RUN_ID}"
DATABASE = f"vf_{RUN_ID}"
TABLE = f"{DATABASE}.{SCHEMA}_things"
ROWS = 200
DDL = f"""
create schema {SCHEMA};
create type {SCHEMA}.verify_mood as enum ('sad', 'ok', 'happy');
create domain {SCHEMA}.verify_price as numeric(12,2);
create table {SCHEMA}.things (
    id int primary key, name text, code char(4), amount numeric(10,2), price {SCHEMA}.verify_price,
    ratio double precision, score real, big bigint, flag boolean, day date, at timestamp(6), at_tz timestamptz,
    raw bytea, uid uuid,
    doc jsonb, body json, mood {SCHEMA}.verify_mood, tags text[], nums int[], amounts numeric(6,2)[],
    stamps timestamptz[], tod time, cash money, bits bit(3), span interval, addr inet
);
insert into {SCHEMA}.things
select i, 'name ' || i, 'c' || (i % 10), i * 1.25, i * 2.5, i / 3.0, i / 7.0, i::bigint * 100000000000, i % 2 = 0,
       date '2024-01-01' + i, timestamp '2024-01-01 10:00:00.123456' + i * interval '1 hour',
       timestamptz '2024-06-01 10:00:00+02' + i * interval '1 minute', decode(lpad(to_hex(i), 4, '0'), 'hex'),
       md5(i::text)::uuid, jsonb_build_object('i', i, 'tags', jsonb_build_array('a', i)),
       ('{{"i": ' || i || '}}')::json,
       (array['sad', 'ok', 'happy'])[1 + i % 3]::{SCHEMA}.verify_mood, array['x' || i, null, 'ü'], array[i, null, -i],
       array[i * 0.5, null]::numeric(6,2)[],
       array[timestamptz '2024-01-01 00:00:00.123456+05' + i * interval '1 day', null],
       time '10:00:00' + i * interval '1 second', i * 10.5, (i % 8)::bit(3), i * interval '1 day',
       case when i % 2 = 0 then ('10.0.' || (i % 256) || '.1')::inet else ('10.' || (i % 256) || '.0.0/16')::inet end
from generate_series(1, {ROWS}) i;
insert into {SCHEMA}.things (id, name, ratio, day, at, at_tz, tags, nums, tod, doc)
values ({ROWS + 1}, '', 'NaN', 'infinity', '-infinity', 'infinity', array[]::text[], array[null]::int[], '24:00:00',
        '{{}}'),
       ({ROWS + 2}, null, '-Infinity', '1900-02-28', '1969-12-31 23:59:59.999999', '1970-01-01 00:00:00+00', null,
        null, '00:00:00', 'null');
"""
# Every column rewritten, through the update path (another writer than the snapshot's inserts).
REWRITE = f"""
update {SCHEMA}.things set name = name || ' again', amount = amount + 1, ratio = ratio * 2,
    tags = tags || 'y'::text, nums = array_append(nums, null::int), at_tz = at_tz + interval '1 second',
    doc = doc || '{{"v": 2}}'::jsonb, cash = cash + '1'::money, bits = ~bits, span = span + interval '1 hour',
    stamps = array_prepend(null::timestamptz, stamps), day = day - 1
"""


def _conf(folder: Path, lake: str, prefix: str = PREFIX, database: str = DATABASE, **source: str) -> Path:
    raw = yaml.safe_load(LOCAL_CONF.read_text())
    raw["kafka"].update({"topic_pattern": prefix + r"\.[^.]+\.[^.]+", "max_offsets_per_trigger": None})
    raw.pop("sources", None)
    raw["source"] = {"topic_prefix": prefix, "framing": "id4", "id_type": "contentId", **source}
    raw["lake"].update({"database": database, "silver_path": f"{lake}/silver", "bronze_path": f"{lake}/bronze",
                        "checkpoint_path": f"{lake}/checkpoint"})
    path = folder / f"{prefix}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


PG_LOGIN = (f"{PREFIX}=jdbc:postgresql://127.0.0.1:5432/source", "postgres", "METASTORE_PASSWORD")


def _verify(
    conf: Path, out: Path, *args: str, login: tuple[str, str, str] = PG_LOGIN
) -> tuple[int, dict[str, Any], str]:
    source, user, password_env = login
    done = subprocess.run(
        [sys.executable, str(VERIFY), "--conf", str(conf), "--json", str(out), "--source", source, "--user", user,
         "--password-env", password_env, *args],
        capture_output=True, text=True, timeout=600, check=False, cwd=ROOT,
        env={**os.environ, "VERIFY_MARIADB_PASSWORD": str(MARIADB_ROOT["password"])},
    )
    print(done.stdout)
    report = json.loads(out.read_text()) if out.exists() else {}
    return done.returncode, report, done.stdout + done.stderr[-3000:]


class Setup:
    def __init__(self, spark: SparkSession, pg: psycopg.Connection, conf: Path, config: JobConfig) -> None:
        self.spark, self.pg, self.conf, self.config = spark, pg, conf, config
        self.pipeline = Pipeline.of(spark, config)


@pytest.fixture(scope="module")
def setup(
    spark: SparkSession, stack: None, lake_root: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Setup]:
    folder = tmp_path_factory.mktemp("verify")
    conf = _conf(folder, f"{lake_root}/verify")
    with source_schema(SCHEMA, DDL) as pg, debezium_connector(f"vf-{RUN_ID}", PREFIX, [SCHEMA]):
        wait_for_records(f"{PREFIX}.{SCHEMA}.things", ROWS + 2)
        s = Setup(spark, pg, conf, load_config(conf))
        s.pipeline.run()
        yield s


def test_help_has_no_side_effects(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    done = subprocess.run([sys.executable, str(VERIFY), "--help", "--json", str(out)], capture_output=True, text=True,
                          check=False, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "--settle-s" in done.stdout and not out.exists()


@pytest.mark.stack
@pytest.mark.slow
def test_the_snapshot_and_the_update_path_verify_equal(setup: Setup, tmp_path: Path) -> None:
    code, report, output = _verify(setup.conf, tmp_path / "a.json", "--settle-s", "0")
    assert code == 0, output
    table = report["tables"][TABLE]
    assert table["equal"] and table["source_rows"] == table["silver_rows"] == ROWS + 2, table
    assert table["not_compared"] == {"span": "interval as string"}, table["not_compared"]
    assert table["source"] == f"{PREFIX}:{SCHEMA}.things"

    setup.pg.execute(REWRITE)
    wait_for_records(f"{PREFIX}.{SCHEMA}.things", 2 * (ROWS + 2))
    setup.pipeline.run()
    code, report, output = _verify(setup.conf, tmp_path / "b.json", "--settle-s", "0")
    assert code == 0, output
    assert report["tables"][TABLE]["equal"]


@pytest.mark.stack
@pytest.mark.slow
def test_differences_planted_in_silver_are_each_found(setup: Setup, tmp_path: Path) -> None:
    spark, path = setup.spark, setup.config.lake.table_path(f"{SCHEMA}_things")
    current = spark.read.format("hudi").load(path)
    rows = current.drop(*[c for c in current.columns if c.startswith("_hoodie_") and c != DELETED_COL])
    above = F.concat(F.col(POSITION_COL), F.lit("~"))  # above every event's position: the planted row wins
    changed = rows.filter("id = 5").withColumn("name", F.lit("planted")).withColumn("amount", F.col("amount") + 1)
    extra = rows.filter("id = 6").withColumn("id", F.lit(100_000))
    deleted = rows.filter("id = 7").withColumn(DELETED_COL, F.lit(True))
    planted = changed.unionByName(extra).unionByName(deleted).withColumn(POSITION_COL, above)
    target = HudiTarget(database=DATABASE, table=f"{SCHEMA}_things", path=path, record_key=("id",))
    options = {**write_options(target, 0, "planted"), "hoodie.datasource.meta.sync.enable": "false",
               "hoodie.datasource.hive_sync.enable": "false"}
    planted.write.format("hudi").options(**options).mode("append").save(path)

    for settle in ("0", "120"):
        code, report, output = _verify(setup.conf, tmp_path / "c.json", "--settle-s", settle, "--connector-lag-s", "1")
        assert code == 1, output
        table = report["tables"][TABLE]
        assert (table["missing"], table["extra"], table["differing"]) == (1, 1, 1), table
        assert table["sample"] == {"missing": [{"id": "7"}], "extra": [{"id": "100000"}], "differing": [{"id": "5"}]}
        assert table["by_column"] == {"name": 1, "amount": 1}, table["by_column"]
        assert "DIFFERS" in output
        # with time to settle: read again once, as soon as the checkpoint says the (idle) job applied Kafka's offsets
        assert (table["reads"], table["caught_up"]) == ((1, None) if settle == "0" else (2, True)), table

    # The source's own changes of those keys, through the job, make the table equal again (the live test below
    # verifies it, after its workload).
    setup.pg.execute(f"update {SCHEMA}.things set name = 'fixed' where id in (5, 7)")
    setup.pg.execute(f"insert into {SCHEMA}.things (id, name) values (100000, 'real')")


@pytest.mark.stack
@pytest.mark.slow
def test_a_live_workload_reports_no_false_difference(setup: Setup, tmp_path: Path) -> None:
    stop, errors = threading.Event(), []
    rng = random.Random(RUN_ID)

    def write() -> None:
        with psycopg.connect(PG_DSN, autocommit=True) as pg:
            while not stop.is_set():
                i = rng.randint(1, ROWS)
                pg.execute(f"update {SCHEMA}.things set name = 'live ' || %s, nums = array[%s, null] where id = %s",
                           (rng.randint(0, 10**6), i, i))
                time.sleep(0.2)

    def follow() -> None:
        try:
            while not stop.is_set():
                setup.pipeline.run()
        except Exception as e:  # shown by the test
            errors.append(e)

    writer, follower = threading.Thread(target=write, daemon=True), threading.Thread(target=follow, daemon=True)
    writer.start()
    follower.start()
    try:
        time.sleep(10)
        code, report, output = _verify(setup.conf, tmp_path / "e.json", "--settle-s", "150", "--interval-s", "5")
    finally:
        stop.set()
        writer.join(30)
        follower.join(300)
    assert not errors, errors
    table = report["tables"][TABLE]
    print(f"verified under a live workload: {table['reads']} reads, {table['moved']} keys moved, "
          f"{table['seconds']} s")
    assert code == 0, output
    # the keys in flight at the first read settled on the job's checkpoint, not on time
    assert table["reads"] == 1 or table["caught_up"] is True, table


MARIA_DB = f"vfm_{RUN_ID}"
MARIA_PREFIX = f"vfm{RUN_ID}"
MARIA_DDL = f"""
create table {MARIA_DB}.things (
    id int primary key, name varchar(40), note text, amount decimal(10,2), big bigint, ratio double, score float,
    flag tinyint(1), bits bit(5), one bit(1), day date, at datetime(6), at_ts timestamp(6) null, raw blob,
    mood enum('sad', 'ok', 'happy'), tags set('a', 'b', 'c'), doc json, yr year, tod time(6)
);
insert into {MARIA_DB}.things
select seq, concat('name ', seq), repeat('ü', seq % 5), seq * 1.25, seq * 100000000000, seq / 3, seq / 7e0, seq % 2,
       seq % 32, seq % 2, date '2024-01-01' + interval seq day,
       timestamp '2024-01-01 10:00:00.123456' + interval seq hour,
       timestamp '2024-06-01 10:00:00' + interval seq minute, unhex(lpad(hex(seq), 4, '0')),
       elt(1 + seq % 3, 'sad', 'ok', 'happy'), elt(1 + seq % 3, 'a', 'a,c', ''), json_object('i', seq), 2000 + seq,
       sec_to_time(seq * 61)
from {MARIA_DB}.seq_1_to_50;
insert into {MARIA_DB}.things (id) values (51);
"""
MARIA_LOGIN = (f"{MARIA_PREFIX}=jdbc:mariadb://127.0.0.1:3306/{MARIA_DB}", "root", "VERIFY_MARIADB_PASSWORD")


@pytest.mark.stack
@pytest.mark.slow
def test_a_mariadb_table_verifies_equal_through_the_snapshot_and_the_update_path(
    spark: SparkSession, stack: None, lake_root: str, tmp_path: Path
) -> None:
    conf = _conf(tmp_path, f"{lake_root}/verify-maria", MARIA_PREFIX, MARIA_DB, connector="mariadb")
    conn = pymysql.connect(**MARIADB_ROOT, autocommit=True, charset="utf8mb4")

    def execute(sql: str) -> None:
        with conn.cursor() as cur:
            for statement in (part for part in sql.split(";") if part.strip()):
                cur.execute(statement)

    execute(f"drop database if exists {MARIA_DB}; create database {MARIA_DB}")
    try:
        execute(MARIA_DDL)
        with mariadb_connector(f"vfm-{RUN_ID}", MARIA_PREFIX, [MARIA_DB]):
            topic = f"{MARIA_PREFIX}.{MARIA_DB}.things"
            wait_for_records(topic, 51)
            pipeline = Pipeline.of(spark, load_config(conf))
            pipeline.run()
            code, report, output = _verify(conf, tmp_path / "m1.json", "--settle-s", "0", login=MARIA_LOGIN)
            # The connector's snapshot reads a float as MariaDB prints it, 6 digits (docs/type-mappings.md): the lake
            # differs there, and only there.
            assert code == 1, output
            table = report["tables"][f"{MARIA_DB}.{MARIA_DB}_things"]
            assert table["source_rows"] == table["silver_rows"] == 51, table
            assert set(table["by_column"]) == {"score"} and table["missing"] == table["extra"] == 0, table
            assert table["not_compared"] == {"tod": "time as string"}, table["not_compared"]

            execute(f"update {MARIA_DB}.things set name = concat(name, ' again'), amount = amount + 1, "
                    f"bits = bits ^ 31, at_ts = at_ts + interval 1 second, doc = json_set(doc, '$.v', 2), "
                    f"tags = 'b', raw = concat(raw, 0x00)")
            wait_for_records(topic, 102)
            pipeline.run()
            code, report, output = _verify(conf, tmp_path / "m2.json", "--settle-s", "0", login=MARIA_LOGIN)
            assert code == 0, output
    finally:
        execute(f"drop database if exists {MARIA_DB}")
        conn.close()

