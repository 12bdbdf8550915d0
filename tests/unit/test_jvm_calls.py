"""Fewer calls from Python into the JVM (app/spark.py, app/sink/lakefs.py): a class's static methods looked up once,
a write's options set in one call, a folder's files listed in one call; each gives what pyspark's or py4j's own way
gives."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from app.sink.lakefs import list_files
from app.spark import jvm_class, with_options


@pytest.fixture
def commands(spark: SparkSession) -> Iterator[list[str]]:
    """The commands this thread sends to the JVM while the test runs."""
    client: Any = spark.sparkContext._gateway._gateway_client  # type: ignore[union-attr]
    sent: list[str] = []
    send = client.send_command

    def counted(command: str, *args: Any, **kwargs: Any) -> Any:
        sent.append(command)
        return send(command, *args, **kwargs)

    client.send_command = counted
    try:
        yield sent
    finally:
        client.send_command = send


def test_a_static_method_is_looked_up_once_and_a_field_each_time(
    spark: SparkSession, commands: list[str]
) -> None:
    math = jvm_class(spark, "java.lang.Math")
    assert [math.abs(-3), math.abs(-4), jvm_class(spark, "java.lang.Math").abs(-5)] == [3, 4, 5]
    assert float(math.PI) == float(jvm_class(spark, "java.lang.Math").PI)
    lookups = [c.split("\n")[3] for c in commands if c.startswith("r\nm\njava.lang.Math\n")]
    assert lookups == ["abs", "PI", "PI"]  # the method once, the field each time (py4j's own way)


def test_a_writes_options_go_in_one_call_as_pyspark_sets_them(
    spark: SparkSession, tmp_path: Path, commands: list[str]
) -> None:
    df = spark.createDataFrame([(1, "a"), (2, "b")], "id int, s string")
    writer = with_options(df.coalesce(1).write, {"compression": "gzip", "parquet.enable.dictionary": False,
                                                 "not.set": None})
    assert sum(1 for c in commands if "\noption\n" in c) == 0
    writer.parquet(str(tmp_path / "out"))
    written = [f.name for f in (tmp_path / "out").iterdir() if f.name.startswith("part-")]
    assert written and all(name.endswith(".gz.parquet") for name in written), written
    assert sorted(spark.read.parquet(str(tmp_path / "out")).collect()) == sorted(df.collect())


def test_a_folders_files_are_listed_in_one_call(spark: SparkSession, tmp_path: Path, commands: list[str]) -> None:
    for name in ("b/_COMPLETE", "b/part-1.parquet", "a/x.json", "top.json"):
        (tmp_path / "root" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "root" / name).write_text("x")
    before = len(commands)
    assert list_files(spark, str(tmp_path / "root")) == ["a/x.json", "b/_COMPLETE", "b/part-1.parquet", "top.json"]
    assert len([c for c in commands[before:] if c.startswith("c\n")]) <= 4  # the path, its file system, the listing
    assert list_files(spark, str(tmp_path / "root"), ".json") == ["a/x.json", "top.json"]
    assert list_files(spark, str(tmp_path / "absent")) == []
