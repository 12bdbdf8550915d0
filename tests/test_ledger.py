"""The delete ledger's file states (app/sink/ledger.py), on the lake as the shipped config puts it (S3) and on a local
path: every state a kill can leave (a write without its marker, a replay's second folder, each moment of a
compaction, a legacy Hudi ledger half migrated) reads as the same ledger. The job killed right after a ledger write
is tests/e2e/test_crash.py's `ledger_written` point."""
from __future__ import annotations

import json
import uuid

import pytest
from pyspark.sql import DataFrame, SparkSession

from app.sink import ledger as ledger_module
from app.sink.hudi import SYNC_OFF, HudiTarget, write_silver
from app.sink.lakefs import delete_path, list_files
from app.sink.ledger import (
    COMPACT_AFTER,
    MARKER,
    compact_ledger,
    ledger_folders,
    open_ledger,
    read_ledger,
    with_ledger_verdict,
    write_ledger,
)
from tests.conftest import TEST_DIR

pytestmark = pytest.mark.stack

JUDGED = ("id int, _cdc_position string, _cdc_source_ts_ms long, _hoodie_is_deleted boolean, _cdc_is_latest boolean, "
          "_cdc_reinsert boolean")


def _judged(spark: SparkSession, rows: list[tuple[int, str, bool, bool]]) -> DataFrame:
    """Latest events (id, position, deleted, re-insert) as the writer judges them."""
    return spark.createDataFrame([(i, p, 1000, d, True, r) for i, p, d, r in rows], JUDGED)


def _ledger(spark: SparkSession, path: str) -> dict[int, str]:
    found = read_ledger(spark, path, ["id"])
    return {} if found is None else {json.loads(r["_cdc_ledger_key"])["id"]: r["_cdc_ledger_position"]
                                     for r in found.collect()}


@pytest.fixture(params=["lake", "local"])
def path(request: pytest.FixtureRequest, lake_root: str) -> str:
    root = lake_root if request.param == "lake" else str(TEST_DIR / "ledger-local")
    return f"{root}/ledger/{uuid.uuid4().hex[:8]}"


def test_facts_of_several_batches_make_one_ledger(spark: SparkSession, path: str) -> None:
    assert _ledger(spark, path) == {}
    write_ledger(_judged(spark, [(1, "030", True, False), (2, "030", True, False)]), path, ["id"], 1)
    write_ledger(_judged(spark, [(2, "040", False, True), (3, "050", True, False)]), path, ["id"], 2)
    # 2 was re-inserted above its delete: out of the ledger; 3 deleted later
    assert _ledger(spark, path) == {1: "030", 3: "050"}


def test_a_killed_write_and_a_replayed_one_change_nothing(spark: SparkSession, path: str) -> None:
    write_ledger(_judged(spark, [(1, "030", True, False)]), path, ["id"], 1)
    killed = write_ledger(_judged(spark, [(2, "040", True, False)]), path, ["id"], 2)
    delete_path(spark, f"{path}/{killed}/{MARKER}")  # the write killed before its marker
    assert ledger_folders(spark, path)[1] == [killed]
    assert _ledger(spark, path) == {1: "030"}
    # The batch's replay writes its facts again, in a folder of its own; the first batch's replay too
    write_ledger(_judged(spark, [(2, "040", True, False)]), path, ["id"], 2)
    write_ledger(_judged(spark, [(1, "030", True, False)]), path, ["id"], 1)
    assert _ledger(spark, path) == {1: "030", 2: "040"}


def _unread(patch: pytest.MonkeyPatch) -> None:
    """From now on, reading the facts fails: what follows must come from what the process knows."""
    def refused(*args: object) -> DataFrame:
        raise AssertionError("the facts were read")
    patch.setattr(ledger_module, "_facts", refused)


def test_the_ledgers_highest_position_is_read_once_then_kept_by_its_writes(
    spark: SparkSession, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """"Above the ledger": a batch skips the facts only while the highest position the process holds is the
    ledger's, so each way the ledger changes is followed: its own writes and compactions without a read, another
    writer's folder by a read."""
    empty = open_ledger(spark, path, ["id"])
    assert (empty.folders, empty.highest, empty.could_block("001")) == (frozenset(), None, False)
    write_ledger(_judged(spark, [(1, "030", True, False), (2, "020", True, False)]), path, ["id"], 1)
    first = open_ledger(spark, path, ["id"])  # written without `highest`: read from the facts
    assert first.highest == "030" and len(first.folders) == 1
    # A delete blocks upserts at or below it: "030" could be blocked, "031" and no upsert at all cannot.
    assert (first.could_block("030"), first.could_block("031"), first.could_block(None)) == (True, False, False)

    with monkeypatch.context() as patch:
        _unread(patch)
        write_ledger(_judged(spark, [(3, "050", True, False)]), path, ["id"], 2, highest="050")
        assert open_ledger(spark, path, ["id"]).highest == "050"
        write_ledger(_judged(spark, [(4, "040", True, False)]), path, ["id"], 3, highest="040")  # a lower batch
        kept = open_ledger(spark, path, ["id"])
        assert kept.highest == "050" and len(kept.folders) == 3

    # Another writer's folder (a replay's process): unknown to this one, so the facts are read again.
    ledger_module._write_facts(_judged_facts(spark, [(5, "070")]), f"{path}/b000000000009-0ther0ne")
    assert open_ledger(spark, path, ["id"]).highest == "070"

    for n in range(COMPACT_AFTER):
        write_ledger(_judged(spark, [(10 + n, f"{100 + n:03d}", True, False)]), path, ["id"], 10 + n,
                     highest=f"{100 + n:03d}")
    merged = compact_ledger(spark, path, 50)
    with monkeypatch.context() as patch:
        _unread(patch)
        compacted = open_ledger(spark, path, ["id"])
    assert (compacted.folders, compacted.highest) == (frozenset({merged}), "115")
    assert max(_ledger(spark, path).values()) == "115"  # the merged facts hold it


def _judged_facts(spark: SparkSession, rows: list[tuple[int, str]]) -> DataFrame:
    """Delete facts as another process's write_ledger leaves them."""
    return ledger_module.ledger_changes(_judged(spark, [(i, p, True, False) for i, p in rows]), ["id"])


class Killed(Exception):
    """Stands for a SIGKILL at that call: what the lake holds then is what a kill leaves."""


def _killed_after(monkeypatch: pytest.MonkeyPatch, name: str, calls: int) -> None:
    """The ledger module's `name` works `calls` times, then the process "dies" there."""
    real, made = getattr(ledger_module, name), []

    def stop(*args: object) -> object:
        made.append(args)
        if len(made) > calls:
            raise Killed(name)
        return real(*args)
    monkeypatch.setattr(ledger_module, name, stop)


def test_every_moment_of_a_compaction_reads_the_same(
    spark: SparkSession, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for n in range(COMPACT_AFTER):  # keys 0..15 deleted; every other one re-inserted in a later batch
        write_ledger(_judged(spark, [(n, f"{100 + n:03d}", True, False)]), path, ["id"], n)
    for n in range(0, COMPACT_AFTER, 2):
        write_ledger(_judged(spark, [(n, f"{200 + n:03d}", False, True)]), path, ["id"], 100 + n)
    incomplete = write_ledger(_judged(spark, [(99, "999", True, False)]), path, ["id"], 999)
    delete_path(spark, f"{path}/{incomplete}/{MARKER}")  # a write killed before its marker
    expected = {n: f"{100 + n:03d}" for n in range(1, COMPACT_AFTER, 2)}
    assert _ledger(spark, path) == expected
    old, _ = ledger_folders(spark, path)

    def unmarked(facts_df: DataFrame, folder: str) -> None:  # the merged folder's files, killed before its marker
        facts_df.coalesce(1).write.parquet(folder)
        raise Killed("_write_facts")
    with monkeypatch.context() as patch:
        patch.setattr(ledger_module, "_write_facts", unmarked)
        with pytest.raises(Killed):
            compact_ledger(spark, path, 500)
    assert ledger_folders(spark, path)[0] == old
    assert _ledger(spark, path) == expected
    for removed in (0, 5):  # merged folder complete, then killed before removing any old folder, or after five
        with monkeypatch.context() as patch:
            _killed_after(patch, "delete_path", removed)
            with pytest.raises(Killed):
                compact_ledger(spark, path, 501 + removed)
        complete, _ = ledger_folders(spark, path)
        assert len([f for f in complete if f.startswith("c")]) == 1 + (removed > 0)
        assert _ledger(spark, path) == expected

    merged = compact_ledger(spark, path, 600)
    assert merged is not None and merged.startswith("c000000000600-")
    assert ledger_folders(spark, path) == ([merged], [])  # merged folders and the incomplete ones removed
    assert _ledger(spark, path) == expected
    assert compact_ledger(spark, path, 601) is None  # one folder: nothing to do


def test_a_hudi_ledger_of_an_earlier_version_is_migrated(
    spark: SparkSession, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ledger_module, "_migrated", set())
    legacy = HudiTarget("db", "t_cdc_delete_ledger", path, ("id",))
    rows = spark.createDataFrame([(1, "030", 1000, False), (2, "040", 1000, False)],
                                 "id int, _cdc_position string, _cdc_source_ts_ms long, _hoodie_is_deleted boolean")
    write_silver(rows, legacy, 0, "q", {"hoodie.metadata.enable": "false", **SYNC_OFF})

    assert _ledger(spark, path) == {1: "030", 2: "040"}  # the first read after the upgrade migrates it
    files = list_files(spark, path)
    assert not [f for f in files if f.startswith(".hoodie/") or "/" not in f], files  # the Hudi table is gone
    write_ledger(_judged(spark, [(3, "050", True, False), (1, "060", False, True)]), path, ["id"], 7)
    assert len(ledger_folders(spark, path)[0]) == 2
    monkeypatch.setattr(ledger_module, "_migrated", set())
    assert _ledger(spark, path) == {2: "040", 3: "050"}  # a later process finds nothing to migrate


def test_facts_of_an_int_key_still_match_after_it_was_widened_to_bigint(spark: SparkSession, path: str) -> None:
    write_ledger(_judged(spark, [(1, "030", True, False)]), path, ["id"], 1)  # id int
    events_df = spark.createDataFrame([(1, "020", False, True)],
                                      "id bigint, _cdc_position string, _hoodie_is_deleted boolean, "
                                      "_cdc_is_latest boolean")
    judged_df = with_ledger_verdict(events_df, read_ledger(spark, path, ["id"]), ["id"])
    assert [(r["id"], r["_cdc_blocked"]) for r in judged_df.collect()] == [(1, True)]
