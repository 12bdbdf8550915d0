"""Fewer calls from Python into the JVM (app/spark.py, app/sink/lakefs.py): a class's static methods looked up once,
the packages pyspark walks looked up once, a write's options set in one call, a folder's files listed in one call;
each gives what pyspark's or py4j's own way gives. `commands`: tests/conftest.py."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from app.sink.lakefs import list_files
from app.spark import jvm_class, with_options


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


def test_the_packages_pyspark_walks_are_looked_up_once(spark: SparkSession, commands: list[str]) -> None:
    def plus_one() -> list[list[int]]:  # pyspark names the lambda's classes from the view's root
        df = spark.range(3).select(F.transform(F.array("id"), lambda x: x + 1).alias("a"))
        return [r["a"] for r in df.collect()]

    assert plus_one() == [[1], [2], [3]]
    asked = len([c for c in commands if c.startswith("r\n")])
    assert plus_one() == [[1], [2], [3]]
    assert len([c for c in commands if c.startswith("r\n")]) == asked  # no name asked for again
    jvm: Any = spark.sparkContext._jvm
    assert jvm.org.apache.spark.sql.functions is jvm.org.apache.spark.sql.functions
    names = [jvm.org.apache.spark.sql.catalyst.expressions.UnresolvedNamedLambdaVariable.freshVarName("x")
             for _ in range(2)]
    assert names[0] != names[1] and all(n.startswith("x_") for n in names)  # static methods still called each time
