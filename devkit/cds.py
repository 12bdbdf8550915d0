"""A class-data sharing archive for the Spark drivers (scripts/setup.sh cds): the tests' (scripts/test.sh) and the
job's on the local stack (conf/local.yaml's spark.class_archive, app/spark.py driver_java_options).

Every test job, script and pytest worker starts a Spark driver JVM that loads and verifies some 20,000 classes of
Spark, Hudi, Hadoop and the AWS SDK before its first batch. A dynamic CDS archive (JDK 17: `-XX:ArchiveClassesAtExit`
once, then `-XX:SharedArchiveFile`) maps them instead, verified already: a driver's start and first writes took about
a third less CPU here (`python -m devkit.cds --measure`). The suite starts a few hundred drivers on two cores.

The archive holds the classes one short run loaded: a session built as the job builds it (app/spark.py), Hudi
Copy-on-Write and Merge-on-Read upserts and reads on a local folder, Avro and Kafka source planning, and every class
devkit/cds_classes.txt names, loaded by name without running it: those a job's run on the stack loads beyond the
others (its Kafka reads, s3a and the AWS SDK, the metastore's client, streaming, caching, windows and aggregates),
recorded from the class-loading log of such a run (`--record`). Janino's classes are left out whatever the run:
their jar is signed. A JVM uses it
only when its class path starts with the one it was made with (every jar's size and time are checked too):
drivers of `--jars-dir` get it, any other JVM silently loads its classes as before (`-Xshare:auto`, CDS logging off
so that nothing reaches a process's output). It is made again when a jar, Python's pyspark, the JVM or the class
list changes.

    python -m devkit.cds [--jars-dir .deps/spark --out .deps/cds/spark.jsa]   # made when missing or stale
    python -m devkit.cds --options      # the options that use it, for JAVA_TOOL_OPTIONS (scripts/test.sh)
    python -m devkit.cds --measure 3    # the workload's driver CPU without and with it, alternating
    python -m devkit.cds --record LOG   # add the classes a driver loaded from jars to devkit/cds_classes.txt; LOG
                                        # from -Xlog:class+load=info:file=LOG (spark.available_now_java_options)
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyspark
from py4j.protocol import Py4JJavaError
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.avro.functions import from_avro, to_avro

from app.config.model import SparkConfig
from app.errors import required
from app.spark import CDS_QUIET, build_session, class_archive_options

ROOT = Path(__file__).resolve().parents[1]
CLASS_LIST = Path(__file__).with_name("cds_classes.txt")  # one package a line: its name, then its classes' names


def stamp_of(jars_dir: Path) -> str:
    """What the archive depends on: the driver's jars (names, sizes, times), pyspark's jars and the JVM."""
    digest = hashlib.sha256()
    jars = sorted(p.resolve() for p in jars_dir.glob("*.jar"))
    jars += sorted((Path(pyspark.__file__).parent / "jars").glob("*.jar"))
    for jar in jars:
        stat = jar.stat()
        digest.update(f"{jar}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    java = subprocess.run(["java", "-version"], check=False, capture_output=True, text=True, env={**os.environ,
                          "JAVA_TOOL_OPTIONS": ""}).stderr
    digest.update(java.encode())
    digest.update(CLASS_LIST.read_bytes())
    return digest.hexdigest()


def listed_classes(text: str) -> list[str]:
    """The class names of a class list (CLASS_LIST's format)."""
    return [f"{package}.{name}" for line in text.splitlines() if line.strip()
            for package, *names in [line.split()] for name in names]


def recorded_classes(log_text: str) -> set[str]:
    """The classes a `-Xlog:class+load` log shows loaded from a jar or the JDK's modules, not from an archive;
    classes generated at run time (lambdas, reflection accessors, Spark's generated code) are left out."""
    found = set()
    for line in log_text.splitlines():
        parts = line.split()
        if len(parts) < 4 or parts[-2] != "source:" or not parts[-1].startswith(("file:", "jar:", "jrt:")):
            continue
        name = parts[-3]
        if "$$Lambda" in name or "GeneratedClass" in name or name.startswith("jdk.internal.reflect.Generated"):
            continue
        found.add(name)
    return found


def record(log: Path) -> int:
    """Add the classes of a class-loading log to CLASS_LIST; returns how many were new."""
    known = set(listed_classes(CLASS_LIST.read_text()))
    new = recorded_classes(log.read_text(errors="replace")) - known
    packages: dict[str, list[str]] = {}
    for name in sorted(known | new):
        package, _, simple = name.rpartition(".")
        packages.setdefault(package, []).append(simple)
    CLASS_LIST.write_text("".join(f"{p} {' '.join(names)}\n" for p, names in sorted(packages.items())))
    return len(new)


def load_listed(spark: SparkSession) -> int:
    """Load CLASS_LIST's classes into the driver JVM by name, none initialized; returns how many were found (a
    jar of another version may lack some)."""
    jvm = required(spark.sparkContext._jvm, "the Spark JVM gateway")
    loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
    found = 0
    for name in listed_classes(CLASS_LIST.read_text()):
        try:
            jvm.java.lang.Class.forName(name, False, loader)
            found += 1
        except Py4JJavaError:
            pass
    return found


def workload(jars_dir: Path, java_options: str) -> float:
    """A short driver run whose loaded classes the archive keeps; the driver JVM's CPU seconds."""
    conf = {"spark.driver.extraJavaOptions": java_options, "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "2"}
    spark = build_session("cds", SparkConfig(master="local[2]", jars_dir=str(jars_dir), conf=conf), None)
    spark.sparkContext.setLogLevel("ERROR")
    folder = Path(tempfile.mkdtemp(prefix="cds-"))
    try:
        df = spark.range(100).select(
            F.col("id"), F.col("id").cast("string").alias("name"), (F.col("id") % 3).alias("part"),
            F.current_timestamp().alias("ts"), F.lit(1.5).cast("decimal(10,2)").alias("amount"))
        avro = df.select(to_avro(F.struct(*df.columns)).alias("value"))
        jvm = required(spark.sparkContext._jvm, "the Spark JVM gateway")
        schema = str(jvm.org.apache.spark.sql.avro.SchemaConverters.toAvroType(df._jdf.schema(), False, "r", ""))
        decoded = avro.select(from_avro("value", schema).alias("r")).select("r.*")
        decoded._jdf.queryExecution().executedPlan()  # planned, not run
        rows = df
        for kind in ("COPY_ON_WRITE", "MERGE_ON_READ"):
            path = str(folder / kind)
            options = {"hoodie.table.name": kind.lower(), "hoodie.datasource.write.recordkey.field": "id",
                       "hoodie.datasource.write.precombine.field": "ts", "hoodie.datasource.write.table.type": kind,
                       "hoodie.datasource.write.partitionpath.field": "part",
                       "hoodie.datasource.write.operation": "upsert"}
            for _ in range(2):
                rows.write.format("hudi").options(**options).mode("append").save(path)
            spark.read.format("hudi").load(path).groupBy("part").count().collect()
        df.write.parquet(str(folder / "parquet"))
        spark.read.parquet(str(folder / "parquet")).count()
        spark.readStream.format("kafka").option("kafka.bootstrap.servers", "127.0.0.1:1").option(
            "subscribePattern", "x").load().select(from_avro(F.col("value"), schema))
        jvm.java.lang.Class.forName("org.apache.hadoop.fs.s3a.S3AFileSystem")
        load_listed(spark)
        proc = required(spark.sparkContext._gateway, "the Spark JVM gateway").proc
        with open(f"/proc/{proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        cpu_s = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        spark.stop()
        proc.stdin.close()  # the gateway JVM ends on its stdin's end, writing the archive on its way out
        proc.wait(timeout=300)
        return cpu_s
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def fresh(jars_dir: Path, out: Path) -> bool:
    """Whether the archive is there and made for today's jars and JVM."""
    stamp_file = out.with_suffix(".stamp")
    return out.exists() and stamp_file.exists() and stamp_file.read_text() == stamp_of(jars_dir)


def make(jars_dir: Path, out: Path) -> bool:
    """Make the archive when missing or stale; whether it was made."""
    if fresh(jars_dir, out):
        return False
    stamp_file = out.with_suffix(".stamp")
    want = stamp_of(jars_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".partial")
    for stale in (partial, out, stamp_file):
        stale.unlink(missing_ok=True)
    started = time.monotonic()
    log = out.with_suffix(".log")
    with log.open("w") as sink:
        done = subprocess.run([sys.executable, "-m", "devkit.cds", "--jars-dir", str(jars_dir), "--dump",
                               str(partial)], check=False, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT)
    if done.returncode != 0 or not partial.exists() or partial.stat().st_size < 10_000_000:
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-20:])
        raise SystemExit(f"cds: no archive written at {partial} (exit {done.returncode}; {log}):\n{tail}")
    partial.rename(out)
    stamp_file.write_text(want)
    print(f"[setup] cds: {out} ({out.stat().st_size // 2**20} MiB) in {time.monotonic() - started:.0f} s")
    return True


def measure(jars_dir: Path, archive: Path, runs: int) -> None:
    """The workload's driver CPU with and without the archive, runs in alternating order."""
    figures: dict[str, list[float]] = {"without": [], "with": []}
    for _ in range(runs):
        for name, options in (("without", CDS_QUIET), ("with", class_archive_options(archive))):
            out = subprocess.run([sys.executable, "-m", "devkit.cds", "--jars-dir", str(jars_dir), "--run",
                                  options], check=True, cwd=ROOT, capture_output=True, text=True).stdout
            figures[name].append(float(out.strip().splitlines()[-1]))
    for name, values in figures.items():
        print(f"{name:8s} archive: driver CPU s {' '.join(f'{v:.1f}' for v in values)} "
              f"(median {sorted(values)[len(values) // 2]:.1f})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devkit.cds", description=__doc__.split("\n\n")[0])
    parser.add_argument("--jars-dir", type=Path, default=ROOT / ".deps" / "spark", help="the drivers' jars folder")
    parser.add_argument("--out", type=Path, default=ROOT / ".deps" / "cds" / "spark.jsa", help="the archive")
    parser.add_argument("--measure", type=int, metavar="RUNS", help="time the workload with and without it")
    parser.add_argument("--options", action="store_true",
                        help="print the JVM options that use the archive (nothing when it is missing or stale)")
    parser.add_argument("--record", type=Path, metavar="LOG",
                        help="add the classes a -Xlog:class+load log shows loaded from jars to devkit/cds_classes.txt")
    parser.add_argument("--dump", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--run", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.dump or args.run is not None:
        options = f"-XX:ArchiveClassesAtExit={args.dump} {CDS_QUIET}" if args.dump else args.run
        print(workload(args.jars_dir, options), flush=True)
        os._exit(0)  # pyspark's exit handlers would talk to the driver JVM that has ended
    elif args.record:
        print(f"cds: {record(args.record)} classes added to {CLASS_LIST}")
    elif args.options:
        print(class_archive_options(args.out) if fresh(args.jars_dir, args.out) else "")
    elif args.measure:
        make(args.jars_dir, args.out)
        measure(args.jars_dir, args.out, args.measure)
    elif not make(args.jars_dir, args.out):
        print(f"[setup] cds: {args.out} up to date")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
