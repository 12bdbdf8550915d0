"""The lake's file system through Hadoop's FileSystem API in the session's JVM: the same code for local paths,
s3a:// and EMRFS s3://. For the scripts and tests that list or remove lake files, and the job's small files of its
own (status.json, quarantine files); its tables are written through Spark and Hudi."""
from __future__ import annotations

from typing import Any, Final

from pyspark.sql import DataFrame, DataFrameWriter, SparkSession

from app.spark import jvm_class


def fs_and_path(spark: SparkSession, uri: str) -> tuple[Any, Any]:
    """The Hadoop FileSystem of a URI (in the session's configuration) and the URI as a Hadoop Path."""
    path = jvm_class(spark, "org.apache.hadoop.fs.Path")(uri)
    return path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()), path


# jvm/src/main/java/io/cdclake/sink/DirectOutputCommitter.java: a Parquet write's tasks put their files straight into
# its folder, which the caller marks complete itself (Hadoop's committer copies each file twice on S3 on its way there).
DIRECT_COMMITTER: Final = "io.cdclake.sink.DirectOutputCommitter"
LISTING: Final = "io.cdclake.sink.Listing"  # jvm/src/main/java/io/cdclake/sink/Listing.java


def direct_parquet(df: DataFrame) -> DataFrameWriter:
    """`df.write` for Parquet files written straight into their folder (`DIRECT_COMMITTER`): for a folder that
    counts only once its caller's marker is in it (Bronze's ranges, the delete ledger's facts), never for a folder
    readers take as it is. With `spark.speculation` on, Hadoop's committer instead: two attempts of one task would
    write the same file, the one killed after the other finished possibly last."""
    if str(df.sparkSession.conf.get("spark.speculation", "false")).strip().lower() == "true":
        return df.write
    return df.write.option("spark.sql.parquet.output.committer.class", DIRECT_COMMITTER)


def list_files(spark: SparkSession, root: str, suffix: str = "") -> list[str]:
    """Paths of every file below `root` (recursively) whose name ends with `suffix`, relative to root, sorted.
    An absent root has no files. One call into the JVM (jvm/ `io.cdclake.sink.Listing`), however many files."""
    fs, path = fs_and_path(spark, root)
    return sorted(name for name in str(jvm_class(spark, LISTING).files(fs, path, suffix)).split("\n") if name)


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
