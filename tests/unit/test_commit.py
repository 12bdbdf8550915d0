"""What a Silver commit records of its batch, read back from the real Hudi timeline (app/sink/commit.py), and where a
start without a checkpoint resumes (app/state/resume.py). Local Hudi tables; no Kafka. The tests that write one are
marked `stack`: Hudi's datasource write opens the session's catalog, the stack's metastore (tests/conftest.py
`spark`)."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from app.config import JobConfig, PartitionSpec, parse_config
from app.errors import ResumeError
from app.main import parse_args
from app.sink.commit import Committed, OffsetRanges, commit_metadata, last_committed, parse_committed
from app.sink.hudi import HudiTarget, meta_client, write_silver
from app.state.resume import checkpoint_applied, resume_offsets, starting_offsets_json

NO_SYNC = {"hoodie.datasource.meta.sync.enable": "false", "hoodie.datasource.hive_sync.enable": "false"}


def test_covers_overlaps_and_what_is_left() -> None:
    committed = Committed("1", {("t", 0): 9, ("t", 1): 4})
    assert committed.covers(OffsetRanges({("t", 0): (5, 9), ("t", 1): (0, 4)}))
    assert not committed.covers(OffsetRanges({("t", 0): (5, 10)}))
    assert not committed.covers(OffsetRanges({("t", 2): (0, 0)}))  # a partition never committed
    batch = OffsetRanges({("t", 0): (5, 14), ("t", 1): (5, 6), ("t", 2): (0, 3)})
    assert committed.overlaps(batch)
    assert committed.after(batch) == OffsetRanges({("t", 0): (10, 14), ("t", 1): (5, 6), ("t", 2): (0, 3)})
    assert not committed.overlaps(OffsetRanges({("t", 0): (10, 12)}))


def test_committed_offsets_accumulate_across_commits() -> None:
    first = commit_metadata(OffsetRanges({("t", 0): (0, 9), ("t", 1): (0, 2)}), None, "00000000/0000000A")
    assert json.loads(first["_cdc.offsets"]) == {"t": {"0": [0, 9], "1": [0, 2]}}
    previous = parse_committed("1", first["_cdc.committed"])
    second = commit_metadata(OffsetRanges({("t", 0): (10, 12)}), previous, None)  # partition 1 absent
    assert json.loads(second["_cdc.committed"]) == {"t": {"0": 12, "1": 2}}
    assert "_cdc.max_position" not in second


def test_starting_offsets_cover_every_partition() -> None:
    text, from_earliest = starting_offsets_json({"a": [0, 1], "b": [0]}, {("a", 0): 41, ("a", 1): 7})
    assert json.loads(text) == {"a": {"0": 42, "1": 8}, "b": {"0": -2}}
    assert from_earliest == [("b", 0)]


def _target(path: Path, table_type: str = "COPY_ON_WRITE") -> HudiTarget:
    return HudiTarget("db", path.name, str(path), ("id",), table_type=table_type, compaction_delta_commits=2)


def _write(spark: SparkSession, target: HudiTarget, ids: range, position: int, extra: dict[str, str]) -> None:
    rows = [(i, f"v{position}", f"{position:08d}", False) for i in ids]
    df = spark.createDataFrame(rows, "id int, v string, _cdc_position string, _hoodie_is_deleted boolean")
    write_silver(df, target, position, "q", {**NO_SYNC, **extra})


@pytest.mark.stack
def test_the_newest_commit_with_offsets_is_found_past_compaction(spark: SparkSession, tmp_path: Path) -> None:
    target = _target(tmp_path / "t", "MERGE_ON_READ")
    assert last_committed(spark, target.path) is None  # no table yet
    committed = None
    for n, (first, last) in enumerate([(0, 4), (5, 9), (10, 11)], start=1):
        batch = OffsetRanges({("topic", 0): (first, last)})
        _write(spark, target, range(3), n, commit_metadata(batch, committed, f"{n:08d}"))
        committed = last_committed(spark, target.path)
        assert committed is not None and dict(committed.last) == {("topic", 0): last}
        assert committed.max_position == f"{n:08d}"
        if n == 2:
            # The second delta commit compacted inline: the newest completed instant is that compaction's
            # `commit`, which records no offsets, and was passed over.
            completed = sorted(p.name for p in (tmp_path / "t" / ".hoodie" / "timeline").glob("*_*.*commit"))
            assert completed[-1].endswith(".commit"), completed


def _cleans(path: Path) -> int:
    """Completed clean instants on a table's active timeline."""
    return len(list((path / ".hoodie" / "timeline").glob("*_*.clean")))


@pytest.mark.stack
@pytest.mark.parametrize(("every", "cleans"), [(1, 5), (3, 2)])
def test_the_cleaner_runs_once_every_clean_every_commits(
    spark: SparkSession, tmp_path: Path, every: int, cleans: int
) -> None:
    # Every commit rewrites the one file group; with one commit retained, there is an old version to clean from the
    # third commit on. lake.clean_every_commits schedules the cleaner once that many commits have passed since its
    # last run: after each of commits 3 to 7, or after commits 3 and 6.
    target = dataclasses.replace(_target(tmp_path / "t"), retain_commits=1, clean_every_commits=every)
    for n in range(1, 8):
        _write(spark, target, range(3), n, {})
    assert _cleans(tmp_path / "t") == cleans


def _file_groups(path: Path) -> set[str]:
    """A table's file groups: the file ids of its base files (`<file id>_<write token>_<instant>.parquet`)."""
    return {p.name.split("_")[0] for p in path.glob("*.parquet")}


@pytest.mark.stack
@pytest.mark.parametrize(("limit", "groups"), [(100 * 1024 * 1024, 1), (1, 3)])
def test_inserts_go_into_files_below_the_small_file_limit(
    spark: SparkSession, tmp_path: Path, limit: int, groups: int
) -> None:
    # lake.small_file_limit_mb: under Hudi's default (100 MB) each batch's new keys go into the table's one small
    # file, which the commit rewrites; with a file of any size past the limit, each batch's new keys start a file
    # group of their own and the older files are left alone.
    target = dataclasses.replace(_target(tmp_path / "t"), small_file_limit_bytes=limit)
    for n, ids in enumerate([range(0, 3), range(3, 6), range(6, 9)], start=1):
        _write(spark, target, ids, n, {})
    assert len(_file_groups(tmp_path / "t")) == groups
    assert spark.read.format("hudi").load(target.path).count() == 9
    # Nor does any base file carry Hudi's bloom filter of its keys (no table has a bloom index to read it).
    for base_file in (tmp_path / "t").glob("*.parquet"):
        assert not any("bloom" in key for key in _footer_keys(spark, base_file)), base_file.name


def _footer_keys(spark: SparkSession, path: Path) -> list[str]:
    """The key-value metadata's keys of a Parquet file's footer."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    hadoop_path = jvm.org.apache.hadoop.fs.Path(str(path))
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    footer = jvm.org.apache.parquet.hadoop.ParquetFileReader.readFooter(conf, hadoop_path)
    return list(footer.getFileMetaData().getKeyValueMetaData().keySet())


@pytest.mark.stack
@pytest.mark.parametrize(("unique_rows", "rows"), [(False, 1), (True, 2)])
def test_hudi_de_duplicates_an_upserts_input_unless_told_its_rows_are_unique(
    spark: SparkSession, tmp_path: Path, unique_rows: bool, rows: int
) -> None:
    # The job's batches hold one row per key (with_latest_flag) and say so (unique_rows): Hudi skips its own pass,
    # and two rows of a key new to the table are both written. Any other caller keeps Hudi's de-duplication.
    target = _target(tmp_path / "t")
    twice = spark.createDataFrame([(1, "old", "00000001", False), (1, "new", "00000002", False)],
                                  "id int, v string, _cdc_position string, _hoodie_is_deleted boolean")
    write_silver(twice, target, 0, "q", NO_SYNC, unique_rows=unique_rows)
    written = spark.read.format("hudi").load(target.path).select("v").collect()
    assert len(written) == rows
    if not unique_rows:
        assert written[0]["v"] == "new"  # the higher position


def _operations(spark: SparkSession, path: str) -> list[str]:
    """The write operation of each completed commit or delta commit of the table, oldest first."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    timeline = meta_client(spark, path).getCommitsTimeline().filterCompletedInstants()
    return [str(jvm.org.apache.hudi.common.table.timeline.TimelineUtils.getCommitMetadata(i, timeline)
                .getOperationType()) for i in timeline.getInstants()]


@pytest.mark.stack
@pytest.mark.parametrize("table_type", ["COPY_ON_WRITE", "MERGE_ON_READ"])
def test_a_new_tables_first_commit_is_a_bulk_insert_of_its_rows_that_are_not_deletes(
    spark: SparkSession, tmp_path: Path, table_type: str
) -> None:
    # The job's first write of a table (first_rows: its upserts) bulk-inserts them: the table is empty, so its
    # deletes are dropped, and the commit records the batch's offsets as an upsert's would. The next write upserts.
    target = _target(tmp_path / "t", table_type)
    schema = "id int, v string, _cdc_position string, _hoodie_is_deleted boolean"
    first = spark.createDataFrame([(1, "a", "01", False), (2, "b", "01", False), (3, None, "01", True)], schema)
    batch = OffsetRanges({("topic", 0): (0, 2)})
    bulk = write_silver(first, target, 0, "q", {**NO_SYNC, **commit_metadata(batch, None, "01")}, unique_rows=True,
                        first_rows=2)
    assert bulk
    committed = last_committed(spark, target.path)
    assert committed is not None and dict(committed.last) == {("topic", 0): 2} and committed.max_position == "01"
    second = spark.createDataFrame([(1, "a2", "02", False), (2, None, "02", True), (4, "d", "02", False)], schema)
    again = write_silver(second, target, 1, "q", {**NO_SYNC, **commit_metadata(
        OffsetRanges({("topic", 0): (3, 5)}), committed, "02")}, unique_rows=True, first_rows=2)
    assert not again  # the table exists: an upsert
    rows = spark.read.format("hudi").load(target.path).select("id", "v").orderBy("id").collect()
    assert [tuple(r) for r in rows] == [(1, "a2"), (4, "d")]
    # (Merge-on-Read then compacts: _target's compaction_delta_commits is 2.)
    assert _operations(spark, target.path)[:2] == ["BULK_INSERT", "UPSERT"]


@pytest.mark.stack
def test_a_first_write_of_deletes_only_or_of_a_partitioned_table_is_an_upsert(
    spark: SparkSession, tmp_path: Path
) -> None:
    schema = "id int, day string, _cdc_position string, _hoodie_is_deleted boolean"
    deletes = spark.createDataFrame([(1, "d1", "01", True)], schema)
    target = _target(tmp_path / "deletes")
    assert not write_silver(deletes, target, 0, "q", NO_SYNC, unique_rows=True, first_rows=0)
    assert spark.read.format("hudi").load(target.path).count() == 0
    rows = spark.createDataFrame([(1, "d1", "01", False)], schema)
    partitioned = dataclasses.replace(_target(tmp_path / "partitioned"), partition=PartitionSpec("day", "value"))
    assert not write_silver(rows, partitioned, 0, "q", NO_SYNC, unique_rows=True, first_rows=1)
    assert _operations(spark, partitioned.path) == ["UPSERT"]


def _config(tmp_path: Path) -> JobConfig:
    return parse_config({
        "kafka": {"bootstrap_servers": "127.0.0.1:1", "topic_pattern": r"cdc\..*"},
        "registry": {"url": "http://127.0.0.1:1"},
        "source": {"topic_prefix": "cdc"},
        "lake": {
            "database": "db",
            "silver_path": str(tmp_path / "silver"),
            "bronze_path": str(tmp_path / "bronze"),
            "checkpoint_path": str(tmp_path / "checkpoint"),
        },
    })


def test_no_checkpoint_and_no_tables_is_a_first_start(spark: SparkSession, tmp_path: Path) -> None:
    assert resume_offsets(spark, _config(tmp_path)) is None


@pytest.mark.stack
def test_a_checkpoint_wins(spark: SparkSession, tmp_path: Path) -> None:
    config = _config(tmp_path)
    _write(spark, _target(Path(config.lake.table_path("a"))), range(2), 1, {})
    (tmp_path / "checkpoint" / "offsets").mkdir(parents=True)
    (tmp_path / "checkpoint" / "offsets" / "0").write_text("v1\n{}\n{}\n")
    assert resume_offsets(spark, config) is None
    assert resume_offsets(spark, config, from_starting_offsets=True) is None  # the flag changes nothing here


@pytest.mark.stack
def test_tables_without_offsets_and_no_checkpoint_refuse_to_start(spark: SparkSession, tmp_path: Path) -> None:
    config = _config(tmp_path)
    _write(spark, _target(Path(config.lake.table_path("a"))), range(2), 1, {})
    with pytest.raises(ResumeError, match=r"checkpoint .* is missing .* record no Kafka offsets.*Restore the") as e:
        resume_offsets(spark, config, "conf/prod.yaml")
    # The message ends with the command that starts anyway; its flag is one main.py accepts.
    command = "spark-submit app/main.py --conf conf/prod.yaml --from-starting-offsets"
    assert str(e.value).endswith(command)
    assert parse_args(command.split()[2:]).from_starting_offsets
    # That command reads from kafka.starting_offsets (Spark's startingOffsets option left as configured).
    assert resume_offsets(spark, config, "conf/prod.yaml", from_starting_offsets=True) is None


def test_the_offsets_a_checkpoint_applied_are_those_of_its_newest_committed_batch(
    spark: SparkSession, tmp_path: Path
) -> None:
    checkpoint = tmp_path / "checkpoint"
    assert checkpoint_applied(spark, str(checkpoint)) is None  # no checkpoint
    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "commits").mkdir()
    meta = '{"batchWatermarkMs":0,"batchTimestampMs":1764300000000,"conf":{}}'
    for batch, offsets in enumerate(['{"a":{"0":10,"1":3}}', '{"a":{"0":12,"1":3},"b":{"0":7}}',
                                     '{"a":{"0":20,"1":9},"b":{"0":8}}']):
        (checkpoint / "offsets" / str(batch)).write_text(f"v1\n{meta}\n{offsets}")
    assert checkpoint_applied(spark, str(checkpoint)) is None  # planned, none committed
    for batch in (0, 1):  # batch 2 planned, not committed (its commit file comes after every table's)
        (checkpoint / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}')
    assert checkpoint_applied(spark, str(checkpoint)) == {("a", 0): 12, ("a", 1): 3, ("b", 0): 7}
