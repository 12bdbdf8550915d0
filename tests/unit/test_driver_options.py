"""The driver JVM's options (app/spark.py): the config's own, then its class archive's when that file exists, then
an --available-now run's own; the session-up line's account of the JVM; and the JVM's times at a query's end."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml
from pyspark.sql import SparkSession

from app.config import SparkConfig, parse_config
from app.errors import ConfigError
from app.spark import (
    class_archive_options,
    driver_java_options,
    jvm_class,
    jvm_summary,
    jvm_times,
    process_cpu_s,
    session_conf,
)
from tests.conftest import LOCAL_CONF

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


def test_an_available_now_run_adds_its_options_last(tmp_path: Path) -> None:
    archive = tmp_path / "spark.jsa"
    archive.write_bytes(b"archive")
    quick = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
    spark = SparkConfig(class_archive=str(archive), available_now_java_options=quick,
                        conf={"spark.driver.extraJavaOptions": "-Dx=1"})
    assert driver_java_options(spark, available_now=True) == f"-Dx=1 {class_archive_options(archive)} {quick}"
    assert driver_java_options(spark) == f"-Dx=1 {class_archive_options(archive)}"  # a stream: without them
    assert session_conf(spark, None, available_now=True)["spark.driver.extraJavaOptions"].endswith(quick)
    assert driver_java_options(SparkConfig(available_now_java_options=quick), available_now=True) == quick


def test_two_collectors_are_a_config_error() -> None:
    raw = yaml.safe_load(LOCAL_CONF.read_text())
    raw["spark"]["available_now_java_options"] = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
    raw["spark"]["conf"]["spark.driver.extraJavaOptions"] = "-XX:+UseG1GC"
    with pytest.raises(ConfigError) as error:
        parse_config(raw)
    assert error.value.key == "spark.available_now_java_options"
    assert "Serial" in str(error.value) and "G1" in str(error.value)
    raw["spark"]["conf"]["spark.driver.extraJavaOptions"] = "-XX:+UseSerialGC -Dx=1"  # the same one: fine
    assert parse_config(raw).spark.available_now_java_options == "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def test_the_session_names_its_jvms_compilers_and_collector(spark: SparkSession) -> None:
    summary = jvm_summary(spark)
    assert re.fullmatch(r"(driver class archive \S+|no driver class archive), compilers (C1 only|C1 and C2|C2 only), "
                        r"collector (Serial|Parallel|G1|Z|Shenandoah)", summary), summary
    arguments = [str(a) for a in jvm_class(spark, "java.lang.management.ManagementFactory")
                 .getRuntimeMXBean().getInputArguments()]
    if "-XX:TieredStopAtLevel=1" in arguments:
        assert "compilers C1 only" in summary
    if "-XX:+UseSerialGC" in arguments:
        assert summary.endswith("collector Serial")


def test_the_jvms_times_grow_with_its_work(spark: SparkSession) -> None:
    before = jvm_times(spark)
    spark.range(200_000).selectExpr("sum(id * 3) as s", "max(id % 7) as m").collect()
    after = jvm_times(spark)
    # The session's JVM has run for a while and compiled code; the JIT's time never falls, uptime always grows.
    assert before.up_s > 0 and before.jit_s > 0 and before.gc_s >= 0
    assert after.up_s > before.up_s and after.jit_s >= before.jit_s and after.gc_s >= before.gc_s
    if Path("/proc/self/stat").exists():  # Linux: the process's CPU from /proc
        assert before.cpu_s is not None and after.cpu_s is not None and after.cpu_s > before.cpu_s
    assert re.fullmatch(r"up [\d.]+ s(, CPU [\d.]+ s)?; JIT compilers busy [\d.]+ s, garbage collection [\d.]+ s",
                        str(after)), str(after)


def test_a_gone_process_has_no_cpu_time() -> None:
    assert process_cpu_s(2**22 + 12345) is None  # above Linux's largest pid
    assert process_cpu_s(os.getpid()) is not None or not Path("/proc/self/stat").exists()
