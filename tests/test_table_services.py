"""A long-running table's history stays a few files (app/sink/hudi.py `table_service_options`).

Every archival moves the oldest instants of a table's timeline into a new file of its history (Hudi's LSM
timeline, `.hoodie/timeline/history/`), and Hudi 1.0.2 reads each history file of the last three days whenever it
builds a file-system view, three times a commit. With Hudi's default, a layer of the history is merged once it holds
ten files; the job merges at two, so the history's current files (its manifest's) stay about log2(archivals).

The table below is written through `write_silver` on the lake of the shipped config (S3), one small commit after
another (row 0 updated, a row inserted), with the fewest commits retained the job's settings allow (1: the timeline
archives once it holds more than 21 commits, down to 11), until the history's manifest lists a merged file. With
Hudi's default the second archival leaves two files in the manifest and nothing is merged for ten; merged at two,
the second archival's file and the first become one file of the next layer. Every row reads back as written.
"""
from __future__ import annotations

import json
import uuid

import pytest
from pyspark.sql import SparkSession

from app.sink.hudi import SYNC_OFF, HudiTarget, write_silver
from app.sink.lakefs import list_files, read_text

pytestmark = pytest.mark.stack

SCHEMA = "id int, v int, _cdc_position string, _hoodie_is_deleted boolean"
MOST_COMMITS = 45  # the history's second archival comes with the 33rd


def _manifest(spark: SparkSession, path: str) -> list[str]:
    """The files the history's latest manifest lists (none before the first archival)."""
    folder = f"{path}/.hoodie/timeline/history"
    if not list_files(spark, folder, "_version_"):
        return []
    version = read_text(spark, f"{folder}/_version_").strip()
    return sorted(f["fileName"] for f in json.loads(read_text(spark, f"{folder}/manifest_{version}"))["files"])


def test_a_long_running_tables_history_is_merged_two_files_at_a_time(spark: SparkSession, lake_root: str) -> None:
    path = f"{lake_root}/history-{uuid.uuid4().hex[:6]}/silver/h/t"
    target = HudiTarget("h", "t", path, ("id",), retain_commits=1, clean_every_commits=1)
    seen: list[list[str]] = []
    for n in range(1, MOST_COMMITS + 1):
        rows = [(0, n, f"{n:04d}", False), (n, n, f"{n:04d}", False)]  # row 0 updated, row n inserted
        write_silver(spark.createDataFrame(rows, SCHEMA), target, n, "q", SYNC_OFF)
        listed = _manifest(spark, path)
        if listed and listed not in seen:
            seen.append(listed)
        if any(name.endswith("_1.parquet") for name in listed):
            break
    # One file after the first archival, then the first two merged into one of the next layer.
    assert [len(files) for files in seen] == [1, 1], seen
    assert seen[0][0].endswith("_0.parquet") and seen[1][0].endswith("_1.parquet"), seen
    assert seen[1][0].split("_")[0] == seen[0][0].split("_")[0]  # the merged file begins where the first did
    rows = sorted(tuple(r) for r in spark.read.format("hudi").load(path).select("id", "v").collect())
    assert rows == [(0, n)] + [(k, k) for k in range(1, n + 1)]
