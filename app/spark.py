"""SparkSession construction: Hudi, Kafka and Avro jars, and the shared Hive metastore.

Local runs and tests take their jars from the folder scripts/fetch_jars.py fills (.deps/spark). On EMR,
`spark.jars_dir` is left unset and the cluster's own Hudi/Kafka jars are used.
"""
from __future__ import annotations

import logging
import os
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from py4j.java_gateway import JavaClass, JavaMember, JavaPackage
from py4j.protocol import Py4JError, Py4JJavaError
from pyspark import InheritableThread, SparkContext
from pyspark.sql import DataFrame, DataFrameWriter, SparkSession
from pyspark.sql.types import StructType

from app.config import COLLECTOR_FLAG, MetastoreConfig, SparkConfig, collectors_named
from app.errors import required

log = logging.getLogger(__name__)

# Spark's checkpoint manager for object stores (spark-hadoop-cloud): no rename, an aborted write leaves nothing.
ABORTABLE_CHECKPOINT_MANAGER = "org.apache.spark.internal.io.cloud.AbortableStreamBasedCheckpointFileManager"
OBJECT_STORE_SCHEMES = ("s3a://", "s3://")


def is_object_store(path: str) -> bool:
    """Whether a lake path is on S3 (s3a:// locally and on EMR with hadoop-aws, s3:// with EMRFS)."""
    return path.startswith(OBJECT_STORE_SCHEMES)


# Hudi's required session settings (Hudi quick start for Spark 3.5) for its datasource, which is all the job uses.
HUDI_CONF = {
    "spark.serializer": "org.apache.spark.serializer.KryoSerializer",
    "spark.kryo.registrator": "org.apache.spark.HoodieSparkKryoRegistrar",
}
# Hudi's SQL extension and catalog: its SQL syntax (MERGE INTO, CALL, `timestamp as of`, hudi_table_changes), for
# sessions that take SQL from a user (scripts/query.py). The job's session goes without: the extension's analyzer
# rule (HoodieAnalysis.AdaptIngestionTargetLogicalRelations) walks the whole plan at every analysis of every
# DataFrame step, and a batch's decode plans are deep: measured, more than half of the analyzer's time in a batch
# (docs/performance.md). Without the Hudi catalog, a Hudi table of the catalog resolves through its `hudi` provider
# to Hudi's datasource, as `spark.read.format("hudi")` does.
HUDI_SQL_CONF = {
    "spark.sql.extensions": "org.apache.spark.sql.hudi.HoodieSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.hudi.catalog.HoodieCatalog",
}

# Settings the lake's correctness depends on, not tuning (docs/type-mappings.md "Column types"):
LAKE_CONF = {
    # A PostgreSQL array holding a NULL element fails a Hudi write with the old Avro list structure (insert:
    # "Array contains a null element", merge: parquet's ArrayIndexOutOfBoundsException). Set before a table's
    # first write: a table written with the old structure keeps it in its files.
    "spark.hadoop.parquet.avro.write-old-list-structure": "false",
    # Dates before 1582-10-15 and timestamps before 1900 (and the 0001-01-01 that -infinity maps to) are
    # written in the proleptic Gregorian calendar; read them as written, not rebased from the Julian one.
    "spark.sql.parquet.datetimeRebaseModeInRead": "CORRECTED",
    "spark.sql.parquet.int96RebaseModeInRead": "CORRECTED",
    "spark.sql.parquet.datetimeRebaseModeInWrite": "CORRECTED",
    "spark.sql.parquet.int96RebaseModeInWrite": "CORRECTED",
    # Hudi's meta sync reaches the metastore with the session's Hadoop settings only through the table's
    # FileSystem: HoodieSparkSqlWriter.metaSync hands `fs.getConf` to HiveSyncTool, whose HiveConf is built from
    # that alone (write options cannot carry javax.jdo.* there). Hadoop caches one FileSystem per scheme, and under
    # spark-submit SparkSubmit makes the `file:` one while resolving --jars, before the job has read its config,
    # from a Configuration without the session's spark.hadoop.* settings: a table on a local path synced into an
    # empty embedded Derby metastore ("Hive metastore database is not initialized"). Uncached, a `file:`
    # FileSystem is made from the Configuration that asks for it (the session's). A lake on s3a is not affected:
    # its FileSystem is first made from the session's Configuration.
    "spark.hadoop.fs.file.impl.disable.cache": "true",
}


def jar_paths(jars_dir: str | Path) -> list[str]:
    """Absolute paths of every jar in jars_dir, sorted.

    Raises:
        FileNotFoundError: the folder has no jars (run scripts/setup.sh jars).
    """
    jars = sorted(str(p.resolve()) for p in Path(jars_dir).glob("*.jar"))
    if not jars:
        raise FileNotFoundError(f"no jars in {jars_dir}: run scripts/setup.sh jars")
    return jars


def metastore_conf(metastore: MetastoreConfig) -> dict[str, str]:
    """Spark's built-in Hive client backed by a JDBC database several processes can open at once.

    DataNucleus creates the metastore tables on first use. Foreign keys are left out on purpose: adding one
    lazily (ALTER TABLE ... ADD CONSTRAINT) waits for a lock held by the same client's open transaction on
    PostgreSQL and deadlocks the first CREATE TABLE.
    """
    return {
        "spark.sql.catalogImplementation": "hive",
        "spark.sql.warehouse.dir": str(Path(metastore.warehouse_path).resolve()),
        "spark.hadoop.javax.jdo.option.ConnectionURL": metastore.jdbc_url,
        "spark.hadoop.javax.jdo.option.ConnectionDriverName": _driver_for(metastore.jdbc_url),
        "spark.hadoop.javax.jdo.option.ConnectionUserName": metastore.user,
        "spark.hadoop.javax.jdo.option.ConnectionPassword": metastore.password,
        "spark.hadoop.datanucleus.schema.autoCreateTables": "true",
        "spark.hadoop.datanucleus.schema.autoCreateColumns": "true",
        "spark.hadoop.hive.metastore.schema.verification": "false",
    }


def _driver_for(jdbc_url: str) -> str:
    if jdbc_url.startswith("jdbc:postgresql:"):
        return "org.postgresql.Driver"
    if jdbc_url.startswith("jdbc:derby://"):
        return "org.apache.derby.jdbc.ClientDriver"
    return "org.apache.derby.jdbc.EmbeddedDriver"


# A batch's tables are written from threads of their own (app/batch/processor.py), each thread's Spark jobs in a
# scheduler pool of their own: FAIR shares the executors between the pools, where FIFO would let one table's
# jobs queue behind another's.
SCHEDULING_CONF = {"spark.scheduler.mode": "FAIR"}
# Spark keeps the classes it compiles for a plan's generated code in a cache keyed by the code and the class loader,
# 100 entries by default, split by hash into four parts that each evict their least recently used entry. A batch of
# a 3-table stream asks for 91 classes; in half the runs measured one part got more than its 25 and compiled its
# classes again in every batch (308 compilations against 91 in a 4-minute run; docs/performance.md). Static: it must
# be set before the session starts.
CODEGEN_CONF = {"spark.sql.codegen.cache.maxEntries": "1000"}
SAX_DRIVER = ("org.xml.sax.driver", "com.sun.org.apache.xerces.internal.parsers.SAXParser")  # the JDK's own
# Hudi sizes the records it merges with the JOL library it bundles, whose first use in a JVM tries to attach
# HotSpot's Serviceability Agent to it, starting helper JVMs with this one's class path: refused without ptrace
# rights, after 2 s or more and 2.4 CPU-s (once per JVM, at its first merge: the first update of a Copy-on-Write
# file, say). Told to skip it, JOL works the layout out by experiment in the JVM (the sizes measured were the same)
# and prints one warning line saying it skipped the agent.
JOL_NO_AGENT = ("jol.skipHotspotSAAttach", "true")


def session_conf(
    spark: SparkConfig, metastore: MetastoreConfig | None, *, hudi_sql: bool = False,
    with_available_now_options: bool = False, stream: bool = False,
) -> dict[str, str]:
    """Every Spark setting the job's session gets, in the order later entries override earlier ones; `hudi_sql`:
    with Hudi's SQL extension and catalog (`HUDI_SQL_CONF`); `with_available_now_options`, `stream`: the driver's
    options with `spark.available_now_java_options`, `spark.stream_java_options` (`driver_java_options`)."""
    conf: dict[str, str] = {
        **HUDI_CONF, **(HUDI_SQL_CONF if hudi_sql else {}), **LAKE_CONF, **SCHEDULING_CONF, **CODEGEN_CONF,
    }
    if spark.jars_dir:
        jars = jar_paths(spark.jars_dir)
        # On the driver's system classpath, set before the JVM starts (pyspark launches it with this conf): the
        # metastore's JDBC driver must be visible to DataNucleus. Under spark-submit use --jars and
        # --driver-class-path instead (scripts/submit.sh).
        conf["spark.driver.extraClassPath"] = ":".join(jars)
        conf["spark.executor.extraClassPath"] = ":".join(jars)
    if metastore is not None:
        conf.update(metastore_conf(metastore))
    conf.update(spark.conf)
    java_options = driver_java_options(spark, with_available_now_options=with_available_now_options, stream=stream)
    if java_options:
        conf["spark.driver.extraJavaOptions"] = java_options
    return conf


CDS_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"  # class-data sharing says nothing on the JVM's output


def class_archive_options(archive: str | Path) -> str:
    """The JVM options that use a class-data sharing archive, its logging off: a JVM whose class path differs from
    the archive's loads its classes as usual, and says nothing on its output."""
    return f"-XX:SharedArchiveFile={archive} {CDS_QUIET}"


def driver_java_options(
    spark: SparkConfig, *, with_available_now_options: bool = False, stream: bool = False
) -> str:
    """The driver JVM's options: `spark.conf`'s `spark.driver.extraJavaOptions`, then the class archive's when
    `spark.class_archive` exists, then with `with_available_now_options` `spark.available_now_java_options` (an
    `--available-now` run's, when its topics' records are within their limit: app/job.py
    `use_available_now_options`), or with `stream` (a run without `--available-now`) `spark.stream_java_options`.
    Set before the JVM starts: pyspark launches it with the session's conf; under spark-submit they go on its
    command line (scripts/submit.sh)."""
    options = [spark.conf.get("spark.driver.extraJavaOptions", "")]
    if spark.class_archive and Path(spark.class_archive).is_file():
        options.append(class_archive_options(spark.class_archive))
    if with_available_now_options and spark.available_now_java_options:
        options.append(_without_other_collector(spark.available_now_java_options, "spark.available_now_java_options"))
    if stream and spark.stream_java_options:
        options.append(_without_other_collector(spark.stream_java_options, "spark.stream_java_options"))
    return " ".join(o for o in options if o)


# The environment's JVM options, which every JVM started from this process also reads (the launcher's among them).
ENVIRONMENT_JAVA_OPTIONS = ("JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS", "_JAVA_OPTIONS")


def _without_other_collector(options: str, key: str) -> str:
    """`options` less its collector when the environment's JVM options name another: a JVM given two collectors does
    not start ("Multiple garbage collectors selected"), and the environment's is the more deliberate choice (the
    test suite's serial collector, say). Said in a WARNING; the session-up line names the collector the JVM got."""
    ours = collectors_named(options)
    theirs = {(name, c) for name in ENVIRONMENT_JAVA_OPTIONS for c in collectors_named(os.environ.get(name, ""))}
    if not ours or not theirs or {c for _, c in theirs} == ours:
        return options
    log.warning("%s names the %s collector, the environment's %s the %s one: the JVM gets the environment's", key,
                ", ".join(sorted(ours)), ", ".join(sorted({n for n, _ in theirs})),
                ", ".join(sorted({c for _, c in theirs})))
    return COLLECTOR_FLAG.sub("", options).strip()


def jvm_started() -> bool:
    """Whether this process's driver JVM is up already: a session built before, or spark-submit's driver, which
    starts before the Python it runs (its gateway's port in the environment). Options for a new JVM no longer
    reach it."""
    return SparkContext._gateway is not None or "PYSPARK_GATEWAY_PORT" in os.environ  # a stopped session's too


DEFAULT_TIER4_INVOCATIONS = "5000"  # HotSpot's -XX:Tier4InvocationThreshold: calls before C2 compiles a method


def jvm_summary(spark: SparkSession) -> str:
    """The driver JVM's class archive, compilers and collector, as its session-up line names them (whichever of
    the config, spark-submit's options and JAVA_TOOL_OPTIONS gave them)."""
    management = jvm_class(spark, "java.lang.management.ManagementFactory")
    diagnostic = management.getPlatformMXBean(
        jvm_class(spark, "java.lang.Class").forName("com.sun.management.HotSpotDiagnosticMXBean")
    )

    def flag(name: str) -> str:
        try:
            return str(diagnostic.getVMOption(name).getValue())
        except Py4JJavaError:  # a flag this JVM does not have (a collector it was built without)
            return ""

    return describe_jvm(flag)


def describe_jvm(flag: Callable[[str], str]) -> str:
    """`jvm_summary`'s words for a JVM whose `flag(name)` gives each HotSpot flag's value ("" for one it lacks)."""
    level = flag("TieredStopAtLevel")
    if flag("TieredCompilation") == "false":
        compilers = "C2 only"
    else:
        compilers = "C1 only" if level.isdigit() and int(level) < 4 else "C1 and C2"
        threshold = flag("Tier4InvocationThreshold")
        if compilers == "C1 and C2" and threshold not in ("", DEFAULT_TIER4_INVOCATIONS):  # spark.stream_java_options
            compilers += f" (C2 threshold {threshold} calls)"
    collectors = [name for name in ("Serial", "Parallel", "G1", "Z", "Shenandoah") if flag(f"Use{name}GC") == "true"]
    archive = flag("SharedArchiveFile")
    archive = f"driver class archive {archive}" if archive else "no driver class archive"
    return f"{archive}, compilers {compilers}, collector {collectors[0] if collectors else 'unknown'}"


@dataclass(frozen=True)
class JvmTimes:
    """Where the driver JVM's time went since it started. `jit_s` is the time its JIT compilers spent compiling,
    summed over their threads; `gc_s` the collectors' time, summed over collectors: elapsed times, not CPU (on 2
    cores a compiler thread busy for the whole run takes half the machine). `cpu_s`: the process's CPU time, where
    /proc has it (Linux), else None."""

    up_s: float
    cpu_s: float | None
    jit_s: float
    gc_s: float

    def __str__(self) -> str:
        cpu = f", CPU {self.cpu_s:.1f} s" if self.cpu_s is not None else ""
        return (f"up {self.up_s:.1f} s{cpu}; JIT compilers busy {self.jit_s:.1f} s, garbage collection "
                f"{self.gc_s:.1f} s")


def jvm_times(spark: SparkSession) -> JvmTimes:
    """The driver JVM's `JvmTimes` now, from java.lang.management (py4j cannot call the com.sun extensions' methods
    on their internal classes, hence /proc for the CPU). In local mode the executors are that JVM too."""
    management = jvm_class(spark, "java.lang.management.ManagementFactory")
    compilation = management.getCompilationMXBean()  # None in a JVM without a JIT compiler (-Xint)
    jit_ms = compilation.getTotalCompilationTime() if compilation is not None else 0
    # -1: a collector that does not keep the figure
    gc_ms = sum(max(bean.getCollectionTime(), 0) for bean in management.getGarbageCollectorMXBeans())
    return JvmTimes(up_s=management.getRuntimeMXBean().getUptime() / 1000, cpu_s=process_cpu_s(jvm_pid(spark)),
                    jit_s=jit_ms / 1000, gc_s=gc_ms / 1000)


def jvm_pid(spark: SparkSession) -> int:
    """The process id of the session's JVM (the driver's)."""
    return int(jvm_class(spark, "java.lang.ProcessHandle").current().pid())


def process_cpu_s(pid: int) -> float | None:
    """User and system CPU seconds of process `pid` from /proc (None where there is none, or it has gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (fields 14, 15)


def build_session(
    app_name: str, spark: SparkConfig, metastore: MetastoreConfig | None, *, hudi_sql: bool = False,
    with_available_now_options: bool = False, stream: bool = False,
) -> SparkSession:
    """Create (or reuse) the process's SparkSession with Hudi, Kafka, Avro and the metastore configured; `hudi_sql`:
    with Hudi's SQL extension and catalog too (a session taking a user's SQL); `with_available_now_options`,
    `stream`: the driver gets `spark.available_now_java_options`, `spark.stream_java_options` too
    (`driver_java_options`), when this starts the JVM."""
    builder = SparkSession.builder.appName(app_name)
    if spark.master:
        builder = builder.master(spark.master)
    conf = session_conf(spark, metastore, hudi_sql=hudi_sql, with_available_now_options=with_available_now_options,
                        stream=stream)
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    hadoop_conf = session.sparkContext._jsc.hadoopConfiguration()
    for key, value in metastore_store_keys(conf).items():
        hadoop_conf.set(key, value)
    gateway_view = required(session.sparkContext._jvm, "the Spark JVM gateway")
    for short_name, name in GATEWAY_CLASSES:
        setattr(gateway_view, short_name, jvm_class(session, name))
    for package in GATEWAY_PACKAGES:
        setattr(gateway_view, package, CachedPackage(package, gateway_view._gateway_client, gateway_view._id))
    # The AWS SDK makes a SAX parser for every S3 listing response; unnamed, finding one searches every jar on the
    # class path for a service entry each time. Named here, in the driver (where Hudi lists), unless set already;
    # likewise `JOL_NO_AGENT`, read at JOL's first use: in local mode the driver runs the merges too, while a
    # cluster's executors need it in spark.executor.extraJavaOptions (docs/running.md).
    system = jvm_class(session, "java.lang.System")
    for key, value in (SAX_DRIVER, JOL_NO_AGENT):
        if system.getProperty(key) is None:
            system.setProperty(key, value)
    quiet_loggers(session)
    if spark.hadoop_defaults == "core":
        core_hadoop_defaults(session)
    log.info("spark %s session up (master %s, %s)", session.version, session.sparkContext.master, jvm_summary(session))
    return session


# JVM loggers held to ERROR: each WARNING they log is one the job answers by design, many times a batch.
QUIET_LOGGERS = (
    # spark-avro's serializer, each time it is built (once per task and writer schema: 50 or so lines a batch on 3
    # tables, 18,180 in a 30-minute soak), warns that a nullable column meets a non-null Avro field: `from_avro` in
    # PERMISSIVE mode makes every field nullable, and app/wire/decode.py hands `to_avro` only values that decoded,
    # whose non-null fields hold values. A null there would still fail the batch with an exception, never silently.
    "org.apache.spark.sql.avro.AvroSerializer",
)


def quiet_loggers(spark: SparkSession) -> None:
    """`QUIET_LOGGERS` at ERROR in the driver's log4j (in local mode the executors' too; a cluster's executors log
    with their own configuration)."""
    configurator = jvm_class(spark, "org.apache.logging.log4j.core.config.Configurator")
    error = jvm_class(spark, "org.apache.logging.log4j.Level").ERROR
    for name in QUIET_LOGGERS:
        configurator.setLevel(name, error)


# Classes whose first use adds Hadoop's HDFS, MapReduce and YARN files to its default configuration files, each of
# them again for some: loaded first, they add nothing after core_hadoop_defaults has taken those files out.
HADOOP_DEFAULTS_ADDERS = (
    "org.apache.hadoop.mapred.JobConf", "org.apache.hadoop.mapreduce.Job", "org.apache.hadoop.mapred.JobClient",
    "org.apache.hadoop.mapreduce.Cluster", "org.apache.hadoop.yarn.conf.YarnConfiguration",
    "org.apache.hadoop.hdfs.HdfsConfiguration",
)
CORE_HADOOP_DEFAULTS = ("core-default.xml", "core-site.xml")
# Settings of the files taken out that keep their value as set ones: the output committer of Spark's file writes
# (Bronze, the delete ledger), whose algorithm is 1 in mapred-default.xml and 2 in Hadoop's code.
KEPT_HADOOP_DEFAULTS = r"^mapreduce\.fileoutputcommitter\."


def core_hadoop_defaults(spark: SparkSession) -> None:
    """Every Hadoop configuration of the driver reads core-default.xml and core-site.xml only (`spark.hadoop_defaults:
    core`): the classes that add the other files are loaded first (`HADOOP_DEFAULTS_ADDERS`, those on the class
    path), then the other files leave Hadoop's list (`Configuration.defaultResources`, a static field: py4j reflects
    on it) and the session's configuration is read again; what was set on it (the `spark.hadoop.*` settings) stays,
    and so do the output committer's settings (`KEPT_HADOOP_DEFAULTS`), set with the values the files gave them."""
    lang_class = jvm_class(spark, "java.lang.Class")
    loader = jvm_class(spark, "java.lang.Thread").currentThread().getContextClassLoader()
    for name in HADOOP_DEFAULTS_ADDERS:
        try:
            lang_class.forName(name, True, loader)
        except Py4JError:
            log.debug("hadoop defaults: %s is not on the class path", name)
    hadoop_conf = spark.sparkContext._jsc.hadoopConfiguration()
    kept = dict(hadoop_conf.getValByRegex(KEPT_HADOOP_DEFAULTS))
    field = lang_class.forName("org.apache.hadoop.conf.Configuration").getDeclaredField("defaultResources")
    field.setAccessible(True)
    resources = field.get(None)
    for name in [str(n) for n in resources.toArray()]:
        if name not in CORE_HADOOP_DEFAULTS:
            resources.remove(name)
    hadoop_conf.reloadConfiguration()
    for key, value in kept.items():
        if hadoop_conf.get(key) is None:
            hadoop_conf.set(key, value)
    log.info("hadoop configurations read %s only (spark.hadoop_defaults: core): %d entries",
             " and ".join(CORE_HADOOP_DEFAULTS), hadoop_conf.size())


def metastore_store_keys(conf: dict[str, str]) -> dict[str, str]:
    """The session's `spark.hadoop.*` settings of Hive's metastore store, under their own (prefixed) names.

    An embedded metastore keeps one connection factory (DataNucleus) per JVM and builds it afresh, pool and
    all, whenever a client's settings whose names hold "jdo" or "datanucleus" differ from the last client's
    (Hive's ObjectStore.setConf). Spark's Hive client copies every Spark setting into its HiveConf, these keys
    too, prefix and all; Hudi's meta sync builds its HiveConf from the Hadoop configuration, which holds them
    without the prefix only. Set there as well, both clients show the same settings and share one factory
    (before: two rebuilds a synced commit, about a fifth of a small commit's CPU here).
    """
    return {
        key: value for key, value in conf.items()
        if key.startswith("spark.hadoop.") and ("jdo" in key or "datanucleus" in key)
    }


# Classes pyspark looks up by short name on its gateway's view (`sc._jvm.functions`) for every column function and
# every list of columns: set on the view as Python attributes, they are found without a call to the JVM. Unset,
# each look-up is a call, and the JVM tries the short name as a class of its own first, then each package the
# gateway imports: every failed try is a search of every jar on the class path (266 here). One topic's decode plan
# made 266 look-ups of `functions` and 40 of `PythonUtils` (docs/performance.md "What the job does to be fast").
GATEWAY_CLASSES = (
    ("functions", "org.apache.spark.sql.functions"),
    ("PythonUtils", "org.apache.spark.api.python.PythonUtils"),
    ("Column", "org.apache.spark.sql.Column"),  # every higher-order function's lambda variable
)
# Packages pyspark walks from the view's root, a call into the JVM per name (`sc._jvm.org.apache.spark.sql.avro...`):
# set on the view as `CachedPackage`s, each name is asked for once.
GATEWAY_PACKAGES = ("org", "py4j")


class StaticMethods(JavaClass):
    """A JVM class whose static methods are each looked up once. py4j's JavaClass asks the JVM what a name is (a
    method, a field, an inner class) at every attribute access, before the call itself: a second round trip for
    every column function (`F.col`, `F.when`, ...) and every list of columns (`PythonUtils.toSeq`), in which the JVM
    copies the class's public methods to search them (some 700 for `functions`). A method's look-up holds no state
    (its name and class), so it is kept and used again, from any thread; fields and inner classes are asked for each
    time, as py4j does."""

    def __init__(self, fqn: str, gateway_client: Any) -> None:
        super().__init__(fqn, gateway_client)
        self._methods: dict[str, JavaMember] = {}

    def __getattr__(self, name: str) -> Any:
        methods = self.__dict__.get("_methods")
        found = None if methods is None else methods.get(name)
        if found is not None:
            return found
        member = super().__getattr__(name)
        if methods is not None and isinstance(member, JavaMember):
            methods[name] = member
        return member


class CachedPackage(JavaPackage):
    """A JVM package whose members (packages and classes) are each looked up once. py4j's `jvm.org.apache.spark...`
    asks the JVM about each name in turn, and the JVM tries each as a class before it answers "a package": for
    `org`, `org.apache`, `org.apache.spark` ... every try a search of every jar on the class path. pyspark names
    classes this way for every higher-order function's lambda (`F.transform`, `F.filter`: seven names deep), every
    `from_avro`, window and storage level: some 500 look-ups a batch on 7 tables, about 1% of a stream's driver CPU
    (docs/performance.md, 2026-12-07 evening). What a name is does not change in a running JVM; a class found is a
    `StaticMethods`, shared with `jvm_class`."""

    def __init__(self, fqn: str, gateway_client: Any, jvm_id: str) -> None:
        super().__init__(fqn, gateway_client, jvm_id)
        self._members: dict[str, Any] = {}

    def __getattr__(self, name: str) -> Any:
        members = self.__dict__.get("_members")
        found = None if members is None else members.get(name)
        if found is not None:
            return found
        member = super().__getattr__(name)
        if isinstance(member, JavaPackage):
            if name[:1].isupper():  # the JVM's answer for a class it cannot load (yet: a jar added later)
                return member
            member = CachedPackage(member._fqn, self._gateway_client, self._jvm_id)
        elif isinstance(member, JavaClass):
            member = _static_class(self._gateway_client, member._fqn)
        if members is not None:
            members[name] = member
        return member


def jvm_class(spark: SparkSession, name: str) -> Any:
    """The class `name` (fully qualified) in the session's JVM, to construct or to call static methods on (each
    method looked up once: `StaticMethods`).

    py4j's `jvm.org.apache...` resolves a name one package at a time, and each step searches the whole class
    path (every jar) once per imported package before it gives up; a class named in full costs no search.
    """
    return _static_class(required(spark.sparkContext._gateway, "the Spark JVM gateway")._gateway_client, name)


def _static_class(client: Any, name: str) -> StaticMethods:
    found = _classes.get((id(client), name))
    if found is None or found._gateway_client is not client:
        found = _classes[(id(client), name)] = StaticMethods(name, client)
    return found


_classes: dict[tuple[int, str], StaticMethods] = {}  # jvm_class's, by gateway and name


WRITES = "io.cdclake.sink.Writes"  # jvm/src/main/java/io/cdclake/sink/Writes.java


def with_options(writer: DataFrameWriter, options: Mapping[str, Any]) -> DataFrameWriter:
    """`writer.options(**options)` in one call into the JVM (`WRITES`) instead of two per option (pyspark sets each
    on its JVM writer, then releases the writer that call returned); values as pyspark gives them (booleans in lower
    case), except None: left out, where pyspark would set the option to null. Keys and values hold no NUL
    character (the separator)."""
    text = "".join(f"{key}\0{str(value).lower() if isinstance(value, bool) else value}\0"
                   for key, value in options.items() if value is not None)
    writer._jwrite = jvm_class(writer._spark, WRITES).options(writer._jwrite, text)
    return writer


def over_cache(df: DataFrame) -> DataFrame:
    """A persisted DataFrame as a plan of one node, its cache (`InMemoryRelation`): the frames built on it
    afterwards analyse that node, not the whole plan that filled the cache (Spark's analyser walks a frame's
    plan at every step, and a table's decode plan is deep). Same rows, same cache: a lost block is recomputed
    from the plan the cache keeps. `df` itself is what to unpersist. A frame not persisted is returned as it is,
    and so is every frame, after one warning, in a Spark whose internals this uses differ (its own cache manager
    and `Dataset.ofRows`): slower, the same rows."""
    spark = df.sparkSession
    if spark.version in _over_cache_unsupported:
        return df
    try:
        cached = spark._jsparkSession.sharedState().cacheManager().lookupCachedData(df._jdf)
        if not cached.isDefined():
            return df
        relation = cached.get().cachedRepresentation()
        jdf = jvm_class(spark, "org.apache.spark.sql.Dataset").ofRows(spark._jsparkSession, relation)
    except Py4JError as e:
        _over_cache_unsupported.add(spark.version)
        log.warning("the steps after a table's count build on its whole plan: this Spark (%s) has no %s",
                    spark.version, str(e).splitlines()[0])
        return df
    return DataFrame(jdf, spark)


_over_cache_unsupported: set[str] = set()  # Spark versions whose internals over_cache found other than it expects


PLAN_TEMPLATES = "io.cdclake.batch.PlanTemplates"  # jvm/src/main/java/io/cdclake/batch/PlanTemplates.java


def placeholder_frame(spark: SparkSession, schema: StructType) -> DataFrame:
    """An empty frame of `schema` to build a plan template on (`substitute`)."""
    jschema = spark._jsparkSession.parseDataType(schema.json())
    return DataFrame(jvm_class(spark, PLAN_TEMPLATES).placeholder(spark._jsparkSession, jschema), spark)


def substitute(template: DataFrame, placeholder: DataFrame, input_df: DataFrame) -> DataFrame:
    """`template`, a frame built on `placeholder` (`placeholder_frame`), over `input_df` instead: the same steps,
    analysed once, without building them again from Python (one call into the JVM instead of hundreds). The input's
    columns must be the placeholder's: names, types, and nullable only where the placeholder's are.

    Raises:
        IllegalArgumentException: (pyspark's) they are not, or the template is not built on the placeholder.
    """
    spark = input_df.sparkSession
    return DataFrame(
        jvm_class(spark, PLAN_TEMPLATES).substitute(template._jdf, placeholder._jdf, input_df._jdf), spark)


T = TypeVar("T")


def in_threads(calls: Sequence[Callable[[], T]], workers: int) -> list[T]:
    """Each call's result, in the calls' order, made `workers` at a time on threads of their own (`InheritableThread`:
    each thread's JVM side gets the caller's local properties), every call run and the first call's exception (by
    order) raised once all have ended; one after another when `workers` <= 1 or there is one call."""
    if workers <= 1 or len(calls) <= 1:
        return [call() for call in calls]
    results: list[Any] = [None] * len(calls)
    errors: dict[int, BaseException] = {}
    waiting = deque(range(len(calls)))
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                if not waiting:
                    return
                n = waiting.popleft()
            try:
                results[n] = calls[n]()
            except BaseException as e:  # raised by the caller's thread, below
                errors[n] = e

    threads = [InheritableThread(target=work) for _ in range(min(workers, len(calls)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[min(errors)]
    return results
