"""The driver JVM's options (app/spark.py): the config's own, then its class archive's when that file exists, then
a stream's own, or an --available-now run's own, given only while the topics' records are within their limit
(app/job.py `use_available_now_options`, counted in Kafka before the JVM starts); the session-up line's account of
the JVM; and the JVM's times at a query's end."""
from __future__ import annotations

import dataclasses
import logging
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark import SparkContext
from pyspark.sql import SparkSession

from app import job
from app.config import JobConfig, KafkaConfig, SparkConfig, parse_config
from app.errors import ConfigError, required
from app.job import use_available_now_options
from app.spark import (
    CORE_HADOOP_DEFAULTS,
    ENVIRONMENT_JAVA_OPTIONS,
    QUIET_LOGGERS,
    class_archive_options,
    describe_jvm,
    driver_java_options,
    jvm_class,
    jvm_started,
    jvm_summary,
    jvm_times,
    process_cpu_s,
    session_conf,
)
from app.wire.source import UncountedError, retained_records
from tests.conftest import LOCAL_CONF, ROOT, RUN_ID
from tests.support.cdc import KAFKA_BOOTSTRAP

JIT = "-XX:TieredStopAtLevel=1"
QUICK = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


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
    with_options = driver_java_options(spark, with_available_now_options=True)
    assert with_options == f"-Dx=1 {class_archive_options(archive)} {quick}"
    assert driver_java_options(spark) == f"-Dx=1 {class_archive_options(archive)}"  # a stream: without them
    assert session_conf(spark, None, with_available_now_options=True)["spark.driver.extraJavaOptions"].endswith(quick)
    assert driver_java_options(SparkConfig(available_now_java_options=quick), with_available_now_options=True) == quick


def test_a_stream_adds_its_own_options_last_and_an_available_now_run_does_not(tmp_path: Path) -> None:
    archive = tmp_path / "spark.jsa"
    archive.write_bytes(b"archive")
    c2 = "-XX:Tier4InvocationThreshold=50000"
    spark = SparkConfig(class_archive=str(archive), available_now_java_options=QUICK, stream_java_options=c2,
                        conf={"spark.driver.extraJavaOptions": "-Dx=1"})
    assert driver_java_options(spark, stream=True) == f"-Dx=1 {class_archive_options(archive)} {c2}"
    assert driver_java_options(spark, with_available_now_options=True) == \
        f"-Dx=1 {class_archive_options(archive)} {QUICK}"
    assert driver_java_options(spark) == f"-Dx=1 {class_archive_options(archive)}"  # a large backlog's: neither
    assert session_conf(spark, None, stream=True)["spark.driver.extraJavaOptions"].endswith(c2)
    assert driver_java_options(SparkConfig(stream_java_options=c2), stream=True) == c2


def test_the_shipped_local_config_leaves_c2s_thresholds_at_hotspots() -> None:
    """Raised tenfold until 2026-12-06: with the parallel collector, HotSpot's own gave B3 a lower p95 and a soak
    that holds (docs/performance.md)."""
    spark = parse_config(yaml.safe_load(LOCAL_CONF.read_text())).spark
    assert "Tier4" not in driver_java_options(spark, stream=True)
    assert "Tier4" not in driver_java_options(spark, with_available_now_options=True)


class _Built(Exception):
    """Raised by the stand-in session builder once it has seen what the job asked for."""


def test_the_job_asks_for_a_streams_options_only_when_it_starts_the_jvm_for_a_stream(
    local_config: JobConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """app/job.py `run` up to its session: what it hands `build_session` (no count of records: the config has no
    --available-now options), for a stream and an --available-now run in a process whose JVM is not up yet, and
    for a stream whose JVM is (spark-submit's driver): its options were chosen by scripts/submit.sh."""
    asked: list[dict[str, Any]] = []

    def build_session(*args: Any, **kwargs: Any) -> None:
        asked.append(kwargs)
        raise _Built

    config = dataclasses.replace(local_config, spark=dataclasses.replace(
        local_config.spark, available_now_java_options=None, available_now_java_options_max_records=None))
    monkeypatch.setattr(job, "build_session", build_session)
    for jvm_up, available_now in ((False, False), (False, True), (True, False)):
        monkeypatch.setattr(job, "jvm_started", lambda up=jvm_up: up)
        with pytest.raises(_Built):
            job.run(config, "conf.yaml", available_now=available_now)
    assert [a["stream"] for a in asked] == [True, False, False]
    assert [a["with_available_now_options"] for a in asked] == [False, False, False]


def test_two_collectors_are_a_config_error() -> None:
    raw = yaml.safe_load(LOCAL_CONF.read_text())
    raw["spark"]["available_now_java_options"] = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
    raw["spark"]["conf"]["spark.driver.extraJavaOptions"] = "-XX:+UseG1GC"
    with pytest.raises(ConfigError) as error:
        parse_config(raw)
    assert error.value.key == "spark.available_now_java_options"
    assert "Serial" in str(error.value) and "G1" in str(error.value)
    raw["spark"]["conf"]["spark.driver.extraJavaOptions"] = "-XX:+UseSerialGC -Dx=1"  # the same one: fine
    # a flag that tunes a collector is not one: a JVM takes it beside the serial collector
    raw["spark"]["stream_java_options"] = "-XX:Tier4InvocationThreshold=50000 -XX:+UseMaximumCompactionOnSystemGC"
    assert parse_config(raw).spark.available_now_java_options == "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
    raw["spark"]["stream_java_options"] = "-XX:+UseParallelGC"  # a stream's options likewise
    with pytest.raises(ConfigError) as error:
        parse_config(raw)
    assert error.value.key == "spark.stream_java_options"
    assert "Parallel" in str(error.value) and "Serial" in str(error.value)


def test_conf_local_gives_a_stream_the_parallel_collector(monkeypatch: pytest.MonkeyPatch) -> None:
    """conf/local.yaml's stream gets the parallel collector (docs/performance.md), which its driver's own options
    must then not contradict; so does an --available-now run, with the C1 compiler only."""
    for name in ENVIRONMENT_JAVA_OPTIONS:
        monkeypatch.delenv(name, raising=False)
    spark = parse_config(yaml.safe_load(LOCAL_CONF.read_text())).spark
    stream = driver_java_options(spark, stream=True)
    assert "-XX:+UseParallelGC" in stream and "UseG1GC" not in stream, stream
    available_now = driver_java_options(spark, with_available_now_options=True)
    assert "-XX:+UseParallelGC" in available_now and "Serial" not in available_now, available_now
    assert "-XX:TieredStopAtLevel=1" in available_now, available_now


def test_the_environments_collector_wins_over_the_configs(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The JVM reads JAVA_TOOL_OPTIONS (and JDK_JAVA_OPTIONS, _JAVA_OPTIONS) too, and refuses to start with two
    collectors: the config's is left out, with a WARNING naming both. The same collector, or none, changes nothing."""
    for name in ENVIRONMENT_JAVA_OPTIONS:
        monkeypatch.delenv(name, raising=False)
    spark = SparkConfig(stream_java_options="-XX:Tier4InvocationThreshold=50000 -XX:+UseParallelGC",
                        available_now_java_options="-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", "-Xss4m -XX:+UseSerialGC")
    with caplog.at_level(logging.WARNING, logger="app.spark"):
        assert driver_java_options(spark, stream=True) == "-XX:Tier4InvocationThreshold=50000"
    assert "spark.stream_java_options names the Parallel collector, the environment's JAVA_TOOL_OPTIONS the Serial " \
        "one" in caplog.text, caplog.text
    assert driver_java_options(spark, with_available_now_options=True) == "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", "-Xss4m")
    monkeypatch.setenv("JDK_JAVA_OPTIONS", "-XX:+UseG1GC")
    assert driver_java_options(spark, with_available_now_options=True) == "-XX:TieredStopAtLevel=1"
    monkeypatch.delenv("JDK_JAVA_OPTIONS")
    assert driver_java_options(spark, stream=True) == "-XX:Tier4InvocationThreshold=50000 -XX:+UseParallelGC"


def test_a_limit_of_records_needs_the_options_it_limits() -> None:
    raw = yaml.safe_load(LOCAL_CONF.read_text())
    raw["spark"].pop("available_now_java_options", None)
    raw["spark"]["available_now_java_options_max_records"] = 1000
    with pytest.raises(ConfigError) as error:
        parse_config(raw)
    assert error.value.key == "spark.available_now_java_options_max_records"
    assert "unset" in str(error.value)
    raw["spark"]["available_now_java_options"] = QUICK
    raw["spark"]["available_now_java_options_max_records"] = -1
    with pytest.raises(ConfigError) as error:
        parse_config(raw)
    assert error.value.key == "spark.available_now_java_options_max_records"
    raw["spark"]["available_now_java_options_max_records"] = 0
    assert parse_config(raw).spark.available_now_java_options_max_records == 0


@pytest.fixture(scope="module")
def counted_topics(stack: None) -> Iterator[KafkaConfig]:
    """Two topics of this module's prefix holding 5 records (over two partitions) and 2, and one whose name holds
    the pattern without matching it whole: 7 records for the returned config's pattern."""
    prefix = f"cnt{RUN_ID}"
    topics = {f"{prefix}.s.a": 2, f"{prefix}.s.b": 1, f"x{prefix}.s.a": 1}
    admin = AdminClient({"bootstrap.servers": KAFKA_BOOTSTRAP})
    for future in admin.create_topics([NewTopic(t, n, 1) for t, n in topics.items()]).values():
        future.result(30)
    producer = Producer({"bootstrap.servers": KAFKA_BOOTSTRAP})
    for topic, partition, count in ((f"{prefix}.s.a", 0, 3), (f"{prefix}.s.a", 1, 2), (f"{prefix}.s.b", 0, 2),
                                    (f"x{prefix}.s.a", 0, 4)):
        for i in range(count):
            producer.produce(topic, value=f"{i}".encode(), partition=partition)
    assert producer.flush(30) == 0
    yield KafkaConfig(bootstrap_servers=KAFKA_BOOTSTRAP, topic_pattern=prefix + r"\.[^.]+\.[^.]+")
    for future in admin.delete_topics(list(topics)).values():
        future.result(30)


@pytest.mark.stack
def test_the_topics_records_are_counted_over_every_partition(counted_topics: KafkaConfig) -> None:
    assert retained_records(counted_topics) == 7
    nothing = dataclasses.replace(counted_topics, topic_pattern=f"none{RUN_ID}" + r"\..*")
    assert retained_records(nothing) == 0


@pytest.mark.stack
def test_a_count_that_fails_says_why(counted_topics: KafkaConfig) -> None:
    jvm_only = dataclasses.replace(counted_topics, options={"sasl.jaas.config": "software.amazon.msk.auth.iam."
                                                            "IAMLoginModule required;"})
    with pytest.raises(UncountedError, match=r"kafka\.options not taken by librdkafka.*JAAS"):
        retained_records(jvm_only)
    nowhere = dataclasses.replace(counted_topics, bootstrap_servers="127.0.0.1:1")
    with pytest.raises(UncountedError, match="the broker did not answer"):
        retained_records(nowhere, timeout_s=1)


@pytest.mark.stack
def test_the_options_go_to_a_run_whose_topics_are_within_their_limit(
    counted_topics: KafkaConfig, local_config: JobConfig, caplog: pytest.LogCaptureFixture,
) -> None:
    def config(limit: int | None, kafka: KafkaConfig = counted_topics) -> JobConfig:
        spark = dataclasses.replace(local_config.spark, available_now_java_options=QUICK,
                                    available_now_java_options_max_records=limit)
        return dataclasses.replace(local_config, kafka=kafka, spark=spark)

    caplog.set_level(logging.INFO, logger="app.job")
    assert use_available_now_options(config(7), available_now=True)
    assert f"the topics hold 7 records, within spark.available_now_java_options_max_records (7): driver options " \
           f"{QUICK}" in caplog.text
    assert not use_available_now_options(config(6), available_now=True)
    assert "the topics hold 7 records, over spark.available_now_java_options_max_records (6): driver options the " \
           "JVM's defaults" in caplog.text
    assert use_available_now_options(config(None), available_now=True)  # no limit: no count
    assert not use_available_now_options(config(7), available_now=False)  # a stream never gets them
    no_options = dataclasses.replace(local_config, spark=dataclasses.replace(
        local_config.spark, available_now_java_options=None, available_now_java_options_max_records=None))
    assert not use_available_now_options(no_options, available_now=True)
    # A count that fails keeps the JVM's defaults, and says why.
    caplog.clear()
    jvm_only = dataclasses.replace(counted_topics, options={"sasl.jaas.config": "x required;"})
    assert not use_available_now_options(config(1_000_000, jvm_only), available_now=True)
    assert "spark.available_now_java_options not used: the topics' records not counted (kafka.options not taken" \
           in caplog.text


def test_a_python_without_confluent_kafka_does_not_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "confluent_kafka", None)  # `import confluent_kafka` raises ImportError
    with pytest.raises(UncountedError, match="no Kafka client in this Python"):
        retained_records(KafkaConfig(bootstrap_servers="127.0.0.1:1", topic_pattern="t"))


def test_a_started_jvm_is_seen(monkeypatch: pytest.MonkeyPatch) -> None:
    """Options for a new JVM are not counted for where one is up: a session built in this process (stopped or
    not), or spark-submit's driver, which starts first and hands its gateway's port to the Python it runs."""
    monkeypatch.setattr(SparkContext, "_gateway", None)
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    assert not jvm_started()
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "40000")
    assert jvm_started()
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT")
    monkeypatch.setattr(SparkContext, "_gateway", object())
    assert jvm_started()


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


def test_the_session_tells_hudis_jol_not_to_attach_its_agent(spark: SparkSession) -> None:
    """Hudi sizes a merge's records with the JOL it bundles; unless told, JOL's first use in a JVM tries to attach
    HotSpot's Serviceability Agent (2 s or more, refused without ptrace rights). The session tells it, and JOL
    still sizes objects."""
    assert jvm_class(spark, "java.lang.System").getProperty("jol.skipHotspotSAAttach") == "true"
    calculator = jvm_class(spark, "org.apache.hudi.common.util.ObjectSizeCalculator")
    assert calculator.getObjectSize(jvm_class(spark, "java.util.HashMap")()) > 0


def test_the_session_line_names_c2s_raised_threshold() -> None:
    def jvm(**flags: str) -> str:
        return describe_jvm(lambda name: {"Tier4InvocationThreshold": "5000", "UseG1GC": "true", **flags}.get(name, ""))

    assert jvm() == "no driver class archive, compilers C1 and C2, collector G1"
    assert jvm(Tier4InvocationThreshold="50000") == \
        "no driver class archive, compilers C1 and C2 (C2 threshold 50000 calls), collector G1"
    assert "compilers C1 only," in jvm(TieredStopAtLevel="1", Tier4InvocationThreshold="50000")  # no C2 to name
    assert "compilers C2 only," in jvm(TieredCompilation="false", Tier4InvocationThreshold="50000")  # no tiers
    assert "compilers C1 and C2," in jvm(Tier4InvocationThreshold="")  # a JVM without the flag


def test_submit_gives_a_stream_its_options_and_an_available_now_run_its_own(tmp_path: Path) -> None:
    """scripts/submit.sh's spark-submit line, for a stream and an --available-now run of conf/local.yaml (whose
    limit of records the stack's topics may pass: then neither gets options of its own). SPARK_HOME points pyspark's
    spark-submit at a spark-class that prints its arguments instead of starting Spark."""
    spark_class = tmp_path / "bin" / "spark-class"
    spark_class.parent.mkdir()
    spark_class.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    spark_class.chmod(0o755)
    # No collector from the environment (the suite's JVMs get the serial one), which would replace the config's.
    env = {**os.environ, "SPARK_HOME": str(tmp_path), "METASTORE_PASSWORD": "x", "JAVA_TOOL_OPTIONS": ""}

    def submitted(*args: str) -> list[str]:
        done = subprocess.run(["bash", str(ROOT / "scripts" / "submit.sh"), "--conf", str(LOCAL_CONF), *args],
                              env=env, capture_output=True, text=True, timeout=120, check=True)
        return done.stdout.splitlines()

    stream = submitted()
    assert "--driver-java-options" in stream, stream
    options = stream[stream.index("--driver-java-options") + 1]
    local = parse_config(yaml.safe_load(LOCAL_CONF.read_text())).spark
    stream_options = required(local.stream_java_options, "conf/local.yaml's stream options")
    assert options.endswith(stream_options), options
    available_now = submitted("--available-now")
    given = available_now[available_now.index("--driver-java-options") + 1] \
        if "--driver-java-options" in available_now else ""
    # Its own options when the topics hold few records (both name the parallel collector), never the stream's.
    quick = required(local.available_now_java_options, "conf/local.yaml's --available-now options")
    assert stream_options not in given.removesuffix(quick), available_now


def test_a_session_holds_the_quiet_loggers_to_error_whatever_the_spark_log_level(spark: SparkSession) -> None:
    """spark-avro's serializer warned 50 or so times a batch of what the decode answers by design (app/spark.py
    QUIET_LOGGERS); the job's `setLogLevel` (the root logger's) leaves them at ERROR, and others at the root's."""
    manager = jvm_class(spark, "org.apache.logging.log4j.LogManager")
    spark.sparkContext.setLogLevel("WARN")
    try:
        for name in QUIET_LOGGERS:
            assert manager.getLogger(name).getLevel().toString() == "ERROR", name
        assert manager.getLogger("org.apache.spark.sql.avro.AvroDeserializer").getLevel().toString() == "WARN"
    finally:
        spark.sparkContext.setLogLevel("ERROR")


def test_a_core_session_reads_hadoops_core_files_only_after_the_classes_that_add_others(
    spark: SparkSession, local_config: JobConfig, tmp_path: Path,
) -> None:
    """conf/local.yaml's `spark.hadoop_defaults: core` (the tests' session is built from it): Hadoop's list of
    default files holds core's two, and neither a Parquet write and read (MapReduce's Job) nor a new JobConf brings
    MapReduce's files back; the `spark.hadoop.*` settings stay."""
    assert local_config.spark.hadoop_defaults == "core"
    spark.range(5).write.parquet(str(tmp_path / "p"))
    assert spark.read.parquet(str(tmp_path / "p")).count() == 5
    lang_class = jvm_class(spark, "java.lang.Class")
    field = lang_class.forName("org.apache.hadoop.conf.Configuration").getDeclaredField("defaultResources")
    field.setAccessible(True)
    assert [str(name) for name in field.get(None).toArray()] == list(CORE_HADOOP_DEFAULTS)
    hadoop_conf = spark.sparkContext._jsc.hadoopConfiguration()
    job_conf = jvm_class(spark, "org.apache.hadoop.mapred.JobConf")()
    for conf in (hadoop_conf, job_conf, spark._jsparkSession.sessionState().newHadoopConf()):
        assert conf.get("mapreduce.job.maps") is None  # mapred-default.xml's
        assert conf.get("yarn.resourcemanager.address") is None  # yarn-default.xml's
        assert conf.get("fs.s3a.impl") == "org.apache.hadoop.fs.s3a.S3AFileSystem"  # core-default.xml's
    assert hadoop_conf.get("fs.s3a.endpoint") == local_config.spark.conf["spark.hadoop.fs.s3a.endpoint"]
    # mapred-default.xml's committer algorithm, not Hadoop's code's (2): Spark's file writes commit as before.
    assert hadoop_conf.get("mapreduce.fileoutputcommitter.algorithm.version") == "1"
    assert hadoop_conf.size() < 500  # 990 with every file


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


def test_generated_classes_stay_compiled_across_batches(spark: SparkSession) -> None:
    """Spark compiles a plan's generated code once and keeps the class in a cache of
    `spark.sql.codegen.cache.maxEntries` entries, split in four parts by hash, each evicting its least recently used.
    At Spark's 100, a B3 stream's 91 classes overflowed one part in some runs, and that part's classes were compiled
    again in every batch. The session keeps more: 150 classes compiled, then asked for again, are the same classes
    (compiled again, a class would be a new one)."""
    code_and_comment = jvm_class(spark, "org.apache.spark.sql.catalyst.expressions.codegen.CodeAndComment")
    generator = jvm_class(spark, "org.apache.spark.sql.catalyst.expressions.codegen.CodeGenerator")
    no_comments = jvm_class(spark, "scala.collection.immutable.HashMap")()
    codes = [code_and_comment(f'public Object generate(Object[] references) {{ return "{RUN_ID}".length() + {n}; }}',
                              no_comments) for n in range(150)]
    first = [generator.compile(code)._1() for code in codes]
    again = [generator.compile(code)._1() for code in codes]
    assert sum(1 for a, b in zip(first, again, strict=True) if not a.equals(b)) == 0
