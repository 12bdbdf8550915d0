"""The driver JVM's options (app/spark.py): the config's own, then its class archive's when that file exists."""
from __future__ import annotations

from pathlib import Path

from app.config import SparkConfig
from app.spark import class_archive_options, driver_java_options, session_conf

JIT = "-XX:TieredStopAtLevel=1"


def test_the_class_archive_follows_the_configs_own_options(tmp_path: Path) -> None:
    archive = tmp_path / "spark.jsa"
    archive.write_bytes(b"archive")
    spark = SparkConfig(class_archive=str(archive), conf={"spark.driver.extraJavaOptions": JIT})
    assert driver_java_options(spark) == f"{JIT} -XX:SharedArchiveFile={archive} -Xlog:cds=off -Xlog:cds+dynamic=off"
    assert session_conf(spark, None)["spark.driver.extraJavaOptions"] == driver_java_options(spark)
    assert driver_java_options(SparkConfig(class_archive=str(archive))) == class_archive_options(archive)


def test_a_missing_class_archive_leaves_the_options_as_they_are(tmp_path: Path) -> None:
    missing = SparkConfig(class_archive=str(tmp_path / "not-made.jsa"), conf={"spark.driver.extraJavaOptions": JIT})
    assert driver_java_options(missing) == JIT
    assert session_conf(missing, None)["spark.driver.extraJavaOptions"] == JIT
    assert "spark.driver.extraJavaOptions" not in session_conf(SparkConfig(class_archive=None), None)
