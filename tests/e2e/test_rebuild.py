"""A Silver table lost after Kafka dropped its records, refused by the job, rebuilt from Bronze by scripts/rebuild.py,
verified equal to PostgreSQL by scripts/verify.py; on the real stack, lake on S3.

The story, in one module (each step needs the one before):
1. a table of many types (arrays holding NULL elements, a domain, an enum, numerics, instants, json, bytes) and a
   second table flow into Silver: the snapshot, then updates, deletes and inserts in a later batch;
2. Kafka's delete-records removes every record of the first table's topic so far (retention, made to happen now),
   and its Silver folder is deleted; the catalog still holds it;
3. the job's next run refuses the lost table (REFUSED, naming the rebuild; its folder is not created again from the
   new events alone), while the second table flows;
4. the rebuild refuses to start while the job's heartbeat is recent; started anyway, it is SIGKILLed after its first
   batch: the job refuses the table as unfinished; `--resume` ends it (the batch committed before is skipped);
5. verify finds the table equal to PostgreSQL; the job then goes on from Kafka (more changes, the update path) and
   the table is still equal: no gap, no double.
Along the way, the catalog's Bronze table shows every Bronze offset once, and a range left unregistered (as a kill
between its marker and its registration leaves it) is registered by the next start.
`--help` has no side effects.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from pyspark.sql import SparkSession

from app.config import JobConfig, load_config
from app.sink.bronze import read_bronze
from app.sink.hudi import table_exists
from app.sink.lakefs import delete_path, fs_and_path
from app.sink.lost import rebuild_marker
from app.state.status import read_status, status_path
from tests.conftest import LOCAL_CONF, ROOT, RUN_ID
from tests.support.cdc import debezium_connector, wait_for_records
from tests.support.pipeline import Pipeline, source_schema

REBUILD = ROOT / "scripts" / "rebuild.py"
VERIFY = ROOT / "scripts" / "verify.py"
SCHEMA = f"rb_{RUN_ID}"
PREFIX = f"rb{RUN_ID}"
DATABASE = f"rb_{RUN_ID}"
ITEMS = f"{DATABASE}.{SCHEMA}_items"
OTHER = f"{DATABASE}.{SCHEMA}_other"
BRONZE_TABLE = f"{DATABASE}.cdc_bronze"  # lake.bronze_table, set in _conf
ROWS = 120
DDL = f"""
create schema {SCHEMA};
create type {SCHEMA}.kind as enum ('a', 'b', 'c');
create domain {SCHEMA}.rebuild_price as numeric(12,2);
create table {SCHEMA}.items (
    id int primary key, name text, amount numeric(10,2), price {SCHEMA}.rebuild_price, ratio double precision,
    at_tz timestamptz, day date, raw bytea, doc jsonb, kind {SCHEMA}.kind, tags text[], nums int[]
);
insert into {SCHEMA}.items
select i, 'item ' || i, i * 1.25, i * 2.5, i / 3.0, timestamptz '2024-06-01 10:00:00+02' + i * interval '1 minute',
       date '2024-01-01' + i, decode(lpad(to_hex(i), 4, '0'), 'hex'), jsonb_build_object('i', i),
       (array['a', 'b', 'c'])[1 + i % 3]::{SCHEMA}.kind, array['x' || i, null], array[i, null, -i]
from generate_series(1, {ROWS}) i;
create table {SCHEMA}.other (id int primary key, note text);
insert into {SCHEMA}.other select i, 'note ' || i from generate_series(1, 20) i;
"""
PG_LOGIN = [f"--source={PREFIX}=jdbc:postgresql://127.0.0.1:5432/source", "--user", "postgres",
            "--password-env", "METASTORE_PASSWORD"]


def _conf(folder: Path, lake: str) -> Path:
    raw = yaml.safe_load(LOCAL_CONF.read_text())
    raw["kafka"].update({"topic_pattern": PREFIX + r"\.[^.]+\.[^.]+", "max_offsets_per_trigger": None})
    raw.pop("sources", None)
    raw["source"] = {"topic_prefix": PREFIX, "framing": "id4", "id_type": "contentId"}
    raw["lake"].update({"database": DATABASE, "silver_path": f"{lake}/silver", "bronze_path": f"{lake}/bronze",
                        "checkpoint_path": f"{lake}/checkpoint", "bronze_table": "cdc_bronze"})
    path = folder / f"{PREFIX}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _script(script: Path, conf: Path, *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, str(script), "--conf", str(conf), *args], capture_output=True, text=True,
                          timeout=900, check=False, cwd=ROOT)
    print(done.stdout, done.stderr[-4000:])
    return done


def _verify(conf: Path, out: Path) -> tuple[int, dict[str, Any], str]:
    done = _script(VERIFY, conf, "--json", str(out), "--settle-s", "0", *PG_LOGIN)
    return done.returncode, json.loads(out.read_text()) if out.exists() else {}, done.stdout + done.stderr[-3000:]


class Story:
    def __init__(self, spark: SparkSession, pg: psycopg.Connection, conf: Path, config: JobConfig) -> None:
        self.spark, self.pg, self.conf, self.config = spark, pg, conf, config
        self.pipeline = Pipeline.of(spark, config)
        self.items_path = config.lake.table_path(f"{SCHEMA}_items")

    def run_job(self) -> Pipeline:
        """One available-now run of the job, as a fresh start would make it (a new processor, the start's checks)."""
        self.pipeline = Pipeline.of(self.spark, self.config)
        self.pipeline.run()
        return self.pipeline


@pytest.fixture(scope="module")
def story(
    spark: SparkSession, stack: None, lake_root: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Story]:
    folder = tmp_path_factory.mktemp("rebuild")
    conf = _conf(folder, f"{lake_root}/rebuild")
    with source_schema(SCHEMA, DDL) as pg, debezium_connector(f"rb-{RUN_ID}", PREFIX, [SCHEMA]):
        wait_for_records(f"{PREFIX}.{SCHEMA}.items", ROWS)
        yield Story(spark, pg, conf, load_config(conf))
        spark.sql(f"drop database if exists {DATABASE} cascade")


def test_help_has_no_side_effects(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    done = subprocess.run([sys.executable, str(REBUILD), "--help", "--json", str(out)], capture_output=True,
                          text=True, check=False, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "--resume" in done.stdout and not out.exists()


def _bronze(story: Story) -> list[tuple[str, int, int]]:
    bronze = read_bronze(story.spark, story.config.lake.bronze_path)
    assert bronze is not None
    return sorted((r.topic, r.partition, r.offset) for r in bronze.select("topic", "partition", "offset").collect())


def _catalog_bronze(spark: SparkSession) -> list[tuple[str, int, int]]:
    spark.catalog.refreshTable(BRONZE_TABLE)
    rows = spark.table(BRONZE_TABLE).select("topic", "partition", "offset").collect()
    return sorted((r.topic, r.partition, r.offset) for r in rows)


def _exists(spark: SparkSession, uri: str) -> bool:
    fs, path = fs_and_path(spark, uri)
    return bool(fs.exists(path))


def _delete_records(topic: str) -> int:
    """Kafka's delete-records up to the end of each partition of `topic` (what retention does, now); the new low
    watermark of partition 0."""
    admin = AdminClient({"bootstrap.servers": "127.0.0.1:9092"})
    partitions = admin.list_topics(topic, timeout=10).topics[topic].partitions
    consumer = Consumer({"bootstrap.servers": "127.0.0.1:9092", "group.id": f"rb-{RUN_ID}"})
    ends = [TopicPartition(topic, p, consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1])
            for p in partitions]
    for future in admin.delete_records(ends, request_timeout=30).values():
        future.result()
    low = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[0]
    consumer.close()
    return int(low)


@pytest.mark.stack
@pytest.mark.slow
def test_a_lost_table_is_refused_rebuilt_from_bronze_and_verified(
    story: Story, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pg, spark = story.pg, story.spark
    topic = f"{PREFIX}.{SCHEMA}.items"
    # 1. The snapshot, then the update path (every type rewritten), deletes and inserts, in a later batch.
    story.run_job()
    pg.execute(f"update {SCHEMA}.items set name = name || ' v2', amount = amount + 1, tags = tags || 'y'::text, "
               f"nums = array_append(nums, null::int), doc = doc || '{{\"v\": 2}}'::jsonb, at_tz = at_tz + "
               f"interval '1 second', kind = 'c' where id % 2 = 0")
    pg.execute(f"delete from {SCHEMA}.items where id % 10 = 3")
    pg.execute(f"insert into {SCHEMA}.items (id, name, tags) values (1000, 'new', array[null, 'z'])")
    wait_for_records(topic, ROWS + ROWS // 2 + ROWS // 10 + 1)
    story.run_job()
    code, report, output = _verify(story.conf, tmp_path / "before.json")
    assert code == 0 and report["tables"][ITEMS]["equal"], output

    # Bronze in the catalog (app/sink/bronze_table.py): every offset once. A range left unregistered (a kill between
    # its marker and its registration, made here by dropping its partition) is registered at the next start.
    assert _catalog_bronze(spark) == _bronze(story), "the catalog's Bronze table differs from Bronze"
    first = str(spark.sql(f"show partitions {BRONZE_TABLE}").collect()[0][0])
    values = dict(part.split("=", 1) for part in first.split("/"))
    spark.sql(f"alter table {BRONZE_TABLE} drop partition (topic='{values['topic']}', `partition`="
              f"{values['partition']}, offsets='{values['offsets']}')")
    assert len(_catalog_bronze(spark)) < len(_bronze(story))

    # 2. Kafka no longer holds the table's records, and its folder is lost; the catalog keeps it.
    assert _delete_records(topic) > ROWS
    assert delete_path(spark, story.items_path)
    assert spark.catalog.tableExists(ITEMS)

    # 3. The job refuses the lost table (the new changes stay in Bronze), and the other table flows.
    pg.execute(f"update {SCHEMA}.items set name = 'while lost' where id <= 5")
    pg.execute(f"update {SCHEMA}.other set note = 'later' where id <= 5")
    wait_for_records(f"{PREFIX}.{SCHEMA}.other", 25)
    with caplog.at_level(logging.ERROR, logger="app.sink.lost"):
        pipeline = story.run_job()
    assert not table_exists(spark, story.items_path), "a lost table must not be created again from new events"
    refused = [s for batch in pipeline.processor.history for t, s in batch.items() if t == ITEMS]
    assert refused and all(s.refused for s in refused), refused
    assert f"table={ITEMS} REFUSED" in caplog.text and "scripts/rebuild.py --conf" in caplog.text, caplog.text
    assert sum(s.upserts for b in pipeline.processor.history for t, s in b.items() if t == OTHER) == 5
    assert _catalog_bronze(spark) == _bronze(story), "the start did not register the range left unregistered"
    status = read_status(status_path(story.config), story.config.spark.conf.get("spark.hadoop.fs.s3a.endpoint"))
    assert status["skipped_topics"][topic]["reason"].startswith("REFUSED: Silver table"), status["skipped_topics"]
    assert status["tables"][ITEMS]["refused"], status["tables"][ITEMS]

    # 4. The rebuild: refused while the heartbeat is recent; then SIGKILLed after its first batch.
    done = _script(REBUILD, story.conf, "--table", ITEMS)
    assert done.returncode == 2 and "looks alive" in done.stderr, done.stderr
    killed = subprocess.Popen([sys.executable, str(REBUILD), "--conf", str(story.conf), "--table", ITEMS, "--force",
                               "--batch-records", "1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              cwd=ROOT)
    assert killed.stdout is not None
    seen = []
    for line in killed.stdout:
        seen.append(line)
        if "rebuild batch 1 of" in line:
            os.kill(killed.pid, signal.SIGKILL)
            break
    killed.wait(60)
    assert killed.returncode == -signal.SIGKILL, "".join(seen[-30:])
    marker = rebuild_marker(story.config.lake.silver_path, DATABASE, f"{SCHEMA}_items")
    assert _exists(spark, marker)
    pg.execute(f"update {SCHEMA}.items set name = 'during the cut' where id = 6")
    wait_for_records(topic, 5)  # from the low watermark delete-records left: the 4 updates while lost, this one
    with caplog.at_level(logging.ERROR):
        pipeline = story.run_job()
    unfinished = [s for b in pipeline.processor.history for t, s in b.items() if t == ITEMS]
    assert unfinished and all(s.refused and "has not ended" in s.refused for s in unfinished), unfinished
    done = _script(REBUILD, story.conf, "--table", ITEMS, "--force", "--resume", "--batch-records", "1",
                   "--json", str(tmp_path / "rebuild.json"))
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    rebuilt = json.loads((tmp_path / "rebuild.json").read_text())
    assert rebuilt["batches_skipped"] >= 1, rebuilt  # the batch committed before the kill
    assert rebuilt["tables"][0]["first_offsets"] == {f"{topic}[0]": 0}, rebuilt
    assert not _exists(spark, marker)
    print(f"rebuild: {rebuilt['records']} Bronze records in {rebuilt['seconds']:.1f} s "
          f"({rebuilt['per_100k_s']:.1f} s per 100,000)")

    # 5. Equal to PostgreSQL, with every change made while it was lost; then the job goes on from Kafka.
    code, report, output = _verify(story.conf, tmp_path / "rebuilt.json")
    assert code == 0 and report["tables"][ITEMS]["equal"], output
    pg.execute(f"update {SCHEMA}.items set amount = amount * 2, tags = array[null]::text[] where id % 3 = 0")
    pg.execute(f"delete from {SCHEMA}.items where id = 1000")
    time.sleep(2)
    pipeline = story.run_job()
    written = [s for b in pipeline.processor.history for t, s in b.items() if t == ITEMS]
    assert written and not any(s.refused for s in written), written
    code, report, output = _verify(story.conf, tmp_path / "after.json")
    assert code == 0 and report["tables"][ITEMS]["equal"] and report["tables"][OTHER]["equal"], output
