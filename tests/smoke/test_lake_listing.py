"""The lake's file system as conf/local.yaml sets it up (s3a on the stack's S3 server, or local folders): a folder
lists each of its children once, whether it was made empty, has files or has folders below it.

gofakes3 1.2.0 lists a kept folder marker of a non-empty folder twice in its parent's listing (as a folder and as an
object); conf/local.yaml therefore lets s3a remove markers once a file is written below them. Table discovery,
Bronze's topic and partition folders and the tests' catalog checks all list folders."""
from __future__ import annotations

import pytest
from pyspark.sql import SparkSession

from app.sink.lakefs import fs_and_path

pytestmark = pytest.mark.stack


def test_a_folder_lists_each_child_once(spark: SparkSession, lake_root: str) -> None:
    root = f"{lake_root}/listing"
    fs, base = fs_and_path(spark, root)
    for folder in ("empty", "with_file", "nested/deeper"):
        assert fs.mkdirs(fs_and_path(spark, f"{root}/{folder}")[1])
    for file in ("with_file/part-0.parquet", "nested/deeper/part-0.parquet", "top.json"):
        fs.create(fs_and_path(spark, f"{root}/{file}")[1]).close()

    children = sorted((str(s.getPath().getName()), bool(s.isDirectory())) for s in fs.listStatus(base))
    assert children == [("empty", True), ("nested", True), ("top.json", False), ("with_file", True)]
    nested = [str(s.getPath().getName()) for s in fs.listStatus(fs_and_path(spark, f"{root}/nested")[1])]
    assert nested == ["deeper"]
