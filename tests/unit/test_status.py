"""The job's status document (app/state/status.py) and scripts/status.py's summary of it."""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql.utils import AnalysisException

from app.batch.processor import BatchProcessor
from app.config import JobConfig, parse_config
from app.routing.route import route_topic
from app.state.stats import TableBatchStats
from app.state.status import JobStatus, load_status, read_status, status_path, write_status
from app.wire.registry import RegistryClient, SchemaRef
from scripts.status import summary


def _config(tmp_path: Path) -> JobConfig:
    return parse_config({
        "kafka": {"bootstrap_servers": "127.0.0.1:1", "topic_pattern": r"cdc\..*"},
        "registry": {"url": "http://127.0.0.1:1"},
        "source": {"topic_prefix": "cdc"},
        "tables": {"s.orders_eu": {"name": "orders", "unique_keys": True},
                   "s.orders_us": {"name": "orders", "unique_keys": True}},
        "lake": {"database": "lake", "silver_path": str(tmp_path / "silver"), "bronze_path": str(tmp_path / "b"),
                 "checkpoint_path": str(tmp_path / "cp")},
    })


def test_a_batch_is_recorded_and_carried_into_the_next_run(spark: SparkSession, tmp_path: Path) -> None:
    config = _config(tmp_path)
    status = JobStatus(conf="conf/x.yaml")
    status.set_routes([route_topic("cdc.s.orders_eu", config), route_topic("cdc.s.items", config)])
    stats = TableBatchStats("lake.orders", rows_in=5, upserts=3, deletes=1, superseded=1,
                            schema_ids=[SchemaRef("contentId", 7)], duration_s=1.234, topics=["cdc.s.orders_eu"])
    status.record_batch(4, [stats], {"cdc.transaction": ("the transaction metadata topic", 2)}, 2.5)
    write_status(spark, config, status)

    written = read_status(status_path(config))
    assert status_path(config) == f"{tmp_path}/cp/status.json"
    assert written["routes"] == {"cdc.s.orders_eu": {"table": "lake.orders", "why": "shard of lake.orders"},
                                 "cdc.s.items": {"table": "lake.s_items", "why": ""}}
    table = written["tables"]["lake.orders"]
    assert (table["batch_id"], table["rows_in"], table["upserts"], table["deletes"], table["schema_ids"]) == (
        4, 5, 3, 1, ["contentId:7"])
    assert written["skipped_topics"]["cdc.transaction"]["records"] == 2
    assert written["last_batch"]["tables"] == ["lake.orders"] and written["failure"] is None
    assert json.loads(status.to_json()) == written

    carried = load_status(spark, config)  # a restart keeps the tables' figures and the skipped topics
    assert carried.tables == written["tables"] and carried.skipped_topics == written["skipped_topics"]
    assert carried.batches == 0 and carried.routes == {} and carried.failure is None

    printed = summary(written, status_path(config))
    assert "lake.orders: batch 4 at" in printed and "topics=cdc.s.orders_eu rows_in=5 upserts=3 deletes=1" in printed
    assert "cdc.s.orders_eu -> lake.orders (shard of lake.orders)" in printed
    assert "cdc.transaction: the transaction metadata topic (2 records in batch 4; Bronze keeps them)" in printed
    assert "stale tables (fed by no subscribed topic): none" in printed


def test_no_status_yet_is_a_fresh_one(spark: SparkSession, tmp_path: Path) -> None:
    fresh = load_status(spark, _config(tmp_path))
    assert (fresh.tables, fresh.skipped_topics, fresh.batches, fresh.last_batch) == ({}, {}, 0, None)


def test_a_batch_failing_in_spark_is_recorded_with_its_batch_and_step(spark: SparkSession, tmp_path: Path) -> None:
    """Not one of the job's error classes: Spark's AnalysisException from planning a frame that lacks the Kafka
    source's columns. The status names the batch and the step, the processor re-raises it as it came."""
    config = _config(tmp_path)
    processor = BatchProcessor(config, RegistryClient.from_config(config.registry))
    processor.write_status = True
    with pytest.raises(AnalysisException):
        processor.process(spark.createDataFrame([(1,)], "x int"), 7)
    written = read_status(status_path(config))
    assert str(written["failure"]).startswith("batch 7, step plan: AnalysisException: "), written["failure"]
    assert written["failed_at"] == {"batch_id": 7, "table": None, "step": "plan", "error": "AnalysisException"}
    assert processor.failure is None


def test_a_status_write_held_by_the_file_system_holds_neither_the_heartbeat_nor_the_document(
    spark: SparkSession, tmp_path: Path
) -> None:
    """status.json's write held, as s3a's retries hold it through an object store outage: here a named pipe with no
    reader yet, whose opening for writing waits. The heartbeat's look at the sources (`check_sources`) and a change
    to the document go on meanwhile (the heartbeat then says where the job is); the write, once let through, holds
    the document as it was when its turn came."""
    config = _config(tmp_path)
    processor = BatchProcessor(config, RegistryClient.from_config(config.registry))
    processor.write_status = True
    (tmp_path / "cp").mkdir()
    os.mkfifo(tmp_path / "cp" / "status.json")
    writer = threading.Thread(target=processor.save_status, args=(spark,), daemon=True)
    writer.start()
    try:
        writer.join(2)
        assert writer.is_alive()  # held in the pipe's opening

        def look() -> None:
            processor.check_sources(idle=True)
            with processor.status_lock:
                processor.status.record_failure(ValueError("later"), 9, None, "plan")

        beat = threading.Thread(target=look, daemon=True)
        beat.start()
        beat.join(60)  # a deadline against a hang, not a time measured
        assert not beat.is_alive(), "the heartbeat's look waited for the held write"
    finally:
        with open(tmp_path / "cp" / "status.json", encoding="utf-8") as pipe:  # lets the write through
            written = json.loads(pipe.read())
        writer.join(60)
    assert written["heartbeat_at"] and written["failure"] is None  # the document of its turn, not the later one
    assert not writer.is_alive()


def test_a_recorded_failure_is_cleared_by_the_next_batch() -> None:
    status = JobStatus()
    status.record_failure(ValueError("bad"), 3, "lake.orders", "count")
    assert status.failure == "batch 3, table lake.orders, step count: ValueError: bad"
    status.record_batch(4, [], {}, 0.1)
    assert status.failure is None and status.failed_at is None
    status.record_failure(RuntimeError("refused"))
    assert (status.failure, status.failed_at) == ("at start: RuntimeError: refused", None)


def test_dead_letters_and_diverged_keys_add_up_per_table_and_are_carried(spark: SparkSession, tmp_path: Path) -> None:
    config = _config(tmp_path)
    status = JobStatus(conf="conf/x.yaml")
    first = TableBatchStats("lake.orders", rows_in=3, dead_letters=2, dead_letter_kinds={"decode": 1, "framing": 1},
                            diverged_keys=['{"id":1}', '{"id":2}'])
    status.record_batch(1, [first], {}, 1.0)
    second = TableBatchStats("lake.orders", rows_in=2, dead_letters=1, dead_letter_kinds={"decode": 1},
                             diverged_keys=['{"id":2}'])
    clean = TableBatchStats("lake.items", rows_in=4, upserts=4)
    status.record_batch(2, [second, clean], {}, 1.0)
    status.quarantined = {"lake.prices": {"reason": "step upsert: MISSING_UNION_BRANCH", "batch_id": 2, "at": "t"}}
    write_status(spark, config, status)

    written = read_status(status_path(config))
    entry = written["dead_letters"]["lake.orders"]
    assert (entry["records"], entry["kinds"], entry["diverged_keys"]) == (
        3, {"decode": 2, "framing": 1}, ['{"id":1}', '{"id":2}'])
    assert entry["last_batch_id"] == 2 and not entry["diverged_keys_truncated"]
    assert "lake.items" not in written["dead_letters"]
    assert "diverged_keys" not in written["tables"]["lake.orders"]  # listed once, under dead_letters
    assert load_status(spark, config).dead_letters == written["dead_letters"]  # a restart carries them on

    printed = summary(written, status_path(config))
    assert "lake.orders: 3 records (decode=2, framing=1); diverged keys: 2" in printed
    assert "lake.prices: since batch 2 at t: step upsert: MISSING_UNION_BRANCH" in printed


def test_keys_settled_by_a_snapshot_read_leave_the_diverged_keys() -> None:
    status = JobStatus(conf="conf/x.yaml")
    status.record_batch(1, [TableBatchStats("lake.orders", dead_letters=3, dead_letter_kinds={"decode": 3},
                                            diverged_keys=['{"id":1}', '{"id":2}', '{"id":3}'])], {}, 1.0)
    # Batch 2 dead-letters key 4, and a snapshot read settles keys 1 and 3: the writer's list of what stays.
    settled = TableBatchStats("lake.orders", dead_letters=1, dead_letter_kinds={"decode": 1},
                              diverged_keys=['{"id":4}'], settled=2, settled_keys=['{"id":1}', '{"id":3}'],
                              pending_keys=['{"id":2}', '{"id":4}'])
    status.record_batch(2, [settled], {}, 1.0)
    # Batch 3: snapshot reads settle the rest, with no dead letter of its own.
    status.record_batch(3, [TableBatchStats("lake.orders", settled=2, pending_keys=[])], {}, 1.0)

    entry = status.dead_letters["lake.orders"]
    assert (entry["records"], entry["kinds"], entry["diverged_keys"]) == (4, {"decode": 4}, [])
    assert entry["last_batch_id"] == 3 and not entry["diverged_keys_truncated"]
    assert status.tables["lake.orders"]["settled"] == 2 and "pending_keys" not in status.tables["lake.orders"]


def test_a_refusal_is_carried_only_while_a_start_refuses_the_topic() -> None:
    """A topic refused a table another holds (app/routing/route.py claim_tables) is listed until a start no longer
    refuses it (its `name` set); the other skipped topics stay, their reasons brought up to date."""
    status = JobStatus()
    status.record_start("c.yaml", [], {"cdc.s.clash": "REFUSED: topics ...", "cdc.transaction": "metadata"}, {})
    status.record_batch(1, [], {"cdc.s.clash": ("REFUSED: topics ...", 3)}, 1.0)
    status.record_start("c.yaml", [], {"cdc.s.late": "REFUSED: other", "cdc.transaction": "the metadata"}, {})
    assert set(status.skipped_topics) == {"cdc.s.late", "cdc.transaction"}
    assert status.skipped_topics["cdc.transaction"]["reason"] == "the metadata"
