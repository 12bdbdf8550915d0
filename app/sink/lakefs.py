"""The lake's file system through Hadoop's FileSystem API in the session's JVM: the same code for local paths,
s3a:// and EMRFS s3://. For the scripts and tests that list or remove lake files, and the job's small files of its
own (status.json, quarantine files); its tables are written through Spark and Hudi."""
from __future__ import annotations

from typing import Any

from pyspark.sql import SparkSession

from app.spark import jvm_class


def fs_and_path(spark: SparkSession, uri: str) -> tuple[Any, Any]:
    """The Hadoop FileSystem of a URI (in the session's configuration) and the URI as a Hadoop Path."""
    path = jvm_class(spark, "org.apache.hadoop.fs.Path")(uri)
    return path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()), path


def list_files(spark: SparkSession, root: str, suffix: str = "") -> list[str]:
    """Paths of every file below `root` (recursively) whose name ends with `suffix`, relative to root, sorted.
    An absent root has no files."""
    fs, path = fs_and_path(spark, root)
    if not fs.exists(path):
        return []
    base = fs.makeQualified(path).toString().rstrip("/") + "/"
    found = []
    files = fs.listFiles(path, True)
    while files.hasNext():
        name = files.next().getPath().toString()
        if name.endswith(suffix):
            found.append(name.removeprefix(base))
    return sorted(found)


def delete_path(spark: SparkSession, uri: str) -> bool:
    """Remove a file or a folder and everything below it; False when there was nothing."""
    fs, path = fs_and_path(spark, uri)
    return bool(fs.delete(path, True))


def read_text(spark: SparkSession, uri: str) -> str:
    """A small UTF-8 file's text."""
    fs, path = fs_and_path(spark, uri)
    stream = fs.open(path)
    try:
        jvm = spark.sparkContext._jvm
        reader = jvm.java.io.BufferedReader(jvm.java.io.InputStreamReader(stream, "UTF-8"))  # type: ignore[union-attr]
        lines = []
        while (line := reader.readLine()) is not None:
            lines.append(str(line))
        return "\n".join(lines)
    finally:
        stream.close()


def write_text(spark: SparkSession, uri: str, text: str) -> None:
    """Write a small file whole (on S3 one PUT: all or nothing)."""
    fs, path = fs_and_path(spark, uri)
    out = fs.create(path, True)
    try:
        out.write(bytearray(text.encode("utf-8")))
    finally:
        out.close()
