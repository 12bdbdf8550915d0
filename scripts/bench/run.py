#!/usr/bin/env python3
"""The speed benchmark: each scenario against its baseline, measured in the same run on the same storage.

Scenarios (`--scenario`, repeatable; default all but soak):
  ceiling   B1: the same Kafka records through the job's batch function (plan, Bronze, every Silver table written
            by Hudi) and through the same plan with the Silver write swapped for plain Parquet (the rows the upsert
            would receive: the latest event per key; the same Bronze write; as many writer threads as
            lake.table_writers); throughput of each and ours as a share of the ceiling. Per table: rows
            and the time of its unit (app/batch/writer.py).
  naive     B2: the naive baseline (scripts/bench/naive.py: one writeStream.format("hudi") query per table with
            the options of Hudi's streaming-write docs) against the job, each `--available-now` in a process of its
            own over the same backlog on 7 tables (`--naive-rows` rows each, then a third updated and a tenth
            deleted), a fresh lake each run; both must leave every table equal to PostgreSQL. Throughput of each
            and the ratio. (Hudi's HoodieStreamer cannot be obtained or built here: its bundles are not served by
            the reachable registries.)
  freshness B3: a steady PostgreSQL workload (`--rate` transactions a second for `--duration` seconds, inserts,
            updates, deletes, some transactions spanning two tables) on 3 and on 7 tables (`--tables`), the job
            running on its own with a 1-second trigger; per transaction the time from its commit to the completion
            of the Hudi commit holding it: p50, p95, max (scripts/bench/freshness.py). The measured seconds follow
            `--warm-up` seconds of the same workload (the consumer's JVM warming up), whose transactions are
            checked but not measured. Invalid below 95% of the rate; fails when a transaction is missing 60 s
            after the workload or a table differs from the source.
            B2's freshness side: the same workload read by the naive baseline on `--naive-tables` (7; 0: none).
  backlog   B4: the job `--available-now` over a backlog of 7 tables of `--backlog-rows` rows (50,000: about
            537,000 records), with the shipped config's memory settings: time, events/s, the driver JVM's peak
            used heap (jstat) and peak RSS, the Python driver's peak RSS.
  growth    B5: one upsert batch (`--batch` keys spread evenly over all keys) into a table of `--small` rows and
            into one of `--large` rows, per layout (Copy-on-Write and Merge-on-Read with the job's index for a
            non-partitioned table, Merge-on-Read partitioned with the record-level index); the tables are loaded
            with a bulk insert first. Ratio large / small per layout (`--layout` chooses them).
  widen     a column widened upstream (a decimal's size) in a table of `--widen-rows` rows, per layout: the rewrite
            with the new type (app/sink/widening.py, once per change) against the baseline, an upsert of `--batch`
            keys into the same table (every batch); ratio rewrite / upsert.
  job-runs  the demo's two job runs: `app/main.py --available-now` over the topics on a fresh lake, then a burst
            of `--burst` changes in the demo's databases (as scripts/demo.py makes it) and a second run over it;
            this checkout against the code at `--baseline-ref` (a git worktree, the same config keys it knows),
            each run its own process; wall time and the machine's busy CPU of each run and of the two.
  soak      B3's soak, only when asked by name (it takes `--soak-minutes`, 30): the freshness workload on 3 tables;
            the p95 of its last 10 minutes within 20% of its first 10, and each table service (clean, archival;
            compaction on Merge-on-Read) seen at least twice on every table.

Every compared figure is the median of `--runs` runs, the sides alternating (A B B A A B ...), after one warm-up
run of each side in the same session (job-runs and naive: processes of their own, no warm-up; freshness: one run
per table count and side; backlog: one run). Prints the effective Hudi options of each layout and of the naive
baseline, and the Spark settings, then the results; writes results.json, results.md and, with matplotlib
(`pip install -e '.[bench]'`), freshness.png and batches.png to `--out`. Needs the local stack (scripts/stack.sh
up) and, for ceiling and job-runs, records on the topics (scripts/demo.sh puts the demo's there); naive,
freshness, backlog and soak make PostgreSQL schemas and connectors of their own. The lake is conf/local.yaml's (S3
by default); what a run writes is removed at the end, the topics of its connectors too. Before and after each
scenario it times a fixed Python loop (best of 3): the machine's speed, which may change between runs and within one.

Usage: .venv/bin/python scripts/bench/run.py [--scenario ceiling --scenario growth] [--runs 3] [--smoke]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import pymysql
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from pyspark import InheritableThread  # noqa: E402
from pyspark.sql import DataFrame, SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402
from pyspark.sql.types import DecimalType  # noqa: E402

from app.batch.processor import BatchProcessor, BronzeGate, kept_records  # noqa: E402
from app.config import JobConfig, PartitionSpec, load_config  # noqa: E402
from app.errors import required  # noqa: E402
from app.sink.bronze import write_bronze  # noqa: E402
from app.sink.hudi import UNIQUE_ROWS, HudiTarget, index_options, write_options, write_silver  # noqa: E402
from app.sink.lakefs import delete_path  # noqa: E402
from app.sink.widening import rewrite as rewrite_table  # noqa: E402
from app.spark import build_session, jvm_pid, process_cpu_s, session_conf  # noqa: E402
from app.wire.registry import RegistryClient  # noqa: E402
from app.wire.source import subscribe_pattern  # noqa: E402
from scripts.bench.freshness import SETTLE_S, Workload, freshness  # noqa: E402
from scripts.bench.naive import options as naive_options  # noqa: E402
from scripts.bench.source import BenchSource  # noqa: E402

SCENARIOS = ("ceiling", "naive", "freshness", "backlog", "growth", "widen", "job-runs", "soak")
DEFAULT_SCENARIOS = SCENARIOS[:-1]  # the soak takes its own half hour: asked for by name
SMOKE = {"runs": 1, "small": 300, "large": 1500, "batch": 100, "rate": 10.0, "duration": 10.0, "warm_up": 5.0,
         "tables": [3], "naive_rows": 100, "backlog_rows": 300, "widen_rows": 300, "layouts": ["cow"],
         "backlog_tables": 2}
REFERENCE_LOOPS = 10_000_000  # reference_loop_s: 0.33-0.37 s on the reference machine's quick hours, 0.63-0.68 slow
SMOKE_SETTLE_S = 300.0  # the smoke asserts no times: its transactions may take longer to Silver on a busy machine
log = logging.getLogger("bench")


@dataclasses.dataclass(frozen=True)
class Figure:
    """One compared measurement: its name, the side measured, the median and every run's value."""

    scenario: str
    name: str
    side: str
    unit: str
    median: float
    values: tuple[float, ...]


def cpu_s(pid: int) -> float:
    """User + system CPU seconds process `pid` has spent (app/spark.py `process_cpu_s`: Linux /proc, which the
    bench needs)."""
    return required(process_cpu_s(pid), f"/proc/{pid}/stat, the CPU time of process {pid}")


def busy_cpu_s() -> float:
    """CPU seconds the whole machine has been busy (/proc/stat: all but idle and iowait)."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(values) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")


def reference_loop_s(loops: int = REFERENCE_LOOPS) -> float:
    """The machine's speed now: the best of three runs of a fixed single-threaded Python loop (`loops`
    multiplications). On this project's reference machine, the host's speed changes by up to 2x from one hour
    to the next; measured before and after each scenario, it tells a slower figure of the code from one of the
    machine (docs/performance.md "Reading the figures")."""
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        sum(i * i for i in range(loops))
        best = min(best, time.perf_counter() - started)
    return best


def alternate(sides: list[str], runs: int) -> list[str]:
    """Run order: A B, then B A, then A B ... so warm-up drift and noise fall on every side."""
    order: list[str] = []
    for n in range(runs):
        order += sides if n % 2 == 0 else sides[::-1]
    return order


def timed(sides: dict[str, Callable[[int], dict[str, float]]], runs: int, warm_up: bool = True
          ) -> dict[str, list[dict[str, float]]]:
    """Each side once to warm up (unless `warm_up` is false: `--smoke`, whose times nobody reads), then `runs`
    times in alternating order; each call returns its figures."""
    for name, side in sides.items() if warm_up else ():
        log.info("warm-up: %s", name)
        side(-1)
    results: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
    for n, name in enumerate(alternate(list(sides), runs)):
        figures = sides[name](n)
        results[name].append(figures)
        print(f"  run {n}: {name:10s} " + "  ".join(f"{k}={v:.2f}" for k, v in figures.items()), flush=True)
    return results


def medians(scenario: str, name: str, results: dict[str, list[dict[str, float]]], units: dict[str, str]
            ) -> list[Figure]:
    return [
        Figure(scenario, f"{name} {key}", side, unit, statistics.median(r[key] for r in runs),
               tuple(r[key] for r in runs))
        for side, runs in results.items() for key, unit in units.items()
    ]


# --- B1: the ceiling -------------------------------------------------------------------------------------------

def ceiling(spark: SparkSession, config: JobConfig, lake: str, runs: int, warm_up: bool = True
            ) -> tuple[list[Figure], dict[str, Any]]:
    """The job's batch function against the same plan written as plain Parquet, over every record of the topics."""
    raw_df = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", config.kafka.bootstrap_servers)
        .option("subscribePattern", subscribe_pattern(config.kafka.topic_pattern))
        .option("startingOffsets", "earliest").option("endingOffsets", "latest")
        .option("includeHeaders", "true")
        .load()
    )
    # Each side reads the records from Kafka once per run, as a micro-batch does (the job's batch function persists
    # its input and releases it at the end).
    records = raw_df.count()
    if not records:
        sys.exit(f"ceiling: no records on topics matching {config.kafka.topic_pattern!r} (run scripts/demo.sh first)")
    registry = RegistryClient.from_config(config.registry)
    pid = jvm_pid(spark)
    per_table: dict[str, list[tuple[int, float]]] = {}
    phases: dict[str, list[float]] = {}  # the job's batch: plan (plan_summary part of it), bronze, tables

    def lake_config(side: str, n: int) -> JobConfig:
        root = f"{lake}/ceiling/{side}{n + 1}"
        return dataclasses.replace(config, lake=dataclasses.replace(
            config.lake, database=f"bench_{side}{n + 1}_{lake.rsplit('/', 1)[-1]}", silver_path=f"{root}/silver",
            bronze_path=f"{root}/bronze", checkpoint_path=f"{root}/checkpoint",
        ))

    def job(n: int) -> dict[str, float]:
        run_config = lake_config("job", n)
        processor = BatchProcessor(run_config, registry)
        wall, cpu = time.monotonic(), cpu_s(pid)
        processor.process(raw_df, 0)
        figures = {"s": time.monotonic() - wall, "cpu_s": cpu_s(pid) - cpu}
        for table, stats in processor.last_stats.items() if n >= 0 else ():
            per_table.setdefault(table.split(".", 1)[1], []).append((stats.rows_in, stats.duration_s))
        for phase, seconds in processor.phases.items() if n >= 0 else ():
            phases.setdefault(phase, []).append(seconds)
        return {**figures, "events_per_s": records / figures["s"]}

    def parquet(n: int) -> dict[str, float]:
        run_config = lake_config("parquet", n)
        wall, cpu = time.monotonic(), cpu_s(pid)
        processor = BatchProcessor(run_config, registry)
        batch_df = kept_records(processor.planner.frame(raw_df))  # as the batch function does: one read, framed
        try:
            write_parquet_tables(processor, batch_df)
        finally:
            batch_df.unpersist()
        figures = {"s": time.monotonic() - wall, "cpu_s": cpu_s(pid) - cpu}
        return {**figures, "events_per_s": records / figures["s"]}

    print(f"\nB1 ceiling: {records} records on {config.kafka.topic_pattern!r}, lake.table_writers="
          f"{config.lake.table_writers}")
    try:
        results = timed({"job": job, "parquet": parquet}, runs, warm_up)
    finally:
        for n in range(-1, runs * 2):
            for side in ("job", "parquet"):
                spark.sql(f"drop database if exists {lake_config(side, n).lake.database} cascade")
    figures = medians("ceiling", "batch", results, {"s": "s", "cpu_s": "CPU-s", "events_per_s": "events/s"})
    share = 100 * statistics.median(r["events_per_s"] for r in results["job"]) / statistics.median(
        r["events_per_s"] for r in results["parquet"])
    figures.append(Figure("ceiling", "job throughput as a share of the ceiling", "job", "%", share, ()))
    tables = {t: {"rows_in": v[-1][0], "median_s": statistics.median(d for _, d in v)} for t, v in per_table.items()}
    return figures, {"records": records, "tables": tables,
                     "phases": {phase: statistics.median(v) for phase, v in phases.items()}}


def write_parquet_tables(processor: BatchProcessor, batch_df: DataFrame) -> None:
    """The batch as the batch function takes it (app/batch/processor.py): the summary, then each table planned and its
    rows written on as many writer threads as the job's (lake.table_writers), each taking the next table, with Bronze
    written beside them and complete before a table's write. A table's rows are those the job's upsert receives (the
    latest event per key, app/batch/writer.py), as plain Parquet where the job would put the Hudi table."""
    lake = processor.config.lake
    batch = processor.planner.summarize(batch_df)
    waiting = deque(processor.planner.table_topics(batch))
    bronze = BronzeGate(partial(write_bronze, batch_df, lake.bronze_path, batch.offsets))

    def write_tables() -> None:
        while True:
            try:
                table = waiting.popleft()
            except IndexError:
                return
            table_plan = processor.planner.plan_table(batch, table)
            if table_plan.events_df is None or table_plan.target is None:
                continue
            rows_df = processor.writer._rows(table_plan, table_plan.target, table_plan.judged_df())
            bronze.wait()
            # Committed by task renames straight into the folder (v2), not a second round of renames at job end.
            rows_df.write.option("mapreduce.fileoutputcommitter.algorithm.version", "2").parquet(
                table_plan.target.path)

    threads = [InheritableThread(target=write_tables) for _ in range(lake.table_writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    bronze.join()
    if bronze.error is not None:
        raise bronze.error


# --- processes: a consumer of a source's topics, its time and its memory -------------------------------------

class MemorySampler(threading.Thread):
    """Peaks of a process tree while it runs: the RSS of its JVM and of its Python driver (/proc), and the JVM's
    used heap (`jstat -gc <pid> 1000`, following the java process there is; none where jstat is missing)."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True, name="memory-sampler")
        self.pid = pid
        self.peaks = {"jvm_rss_mb": 0.0, "python_rss_mb": 0.0, "heap_mb": 0.0}
        self.stop = threading.Event()
        self.jstat: subprocess.Popen[str] | None = None
        self.jstat_pid, self.jstat_starts = 0, 0

    def run(self) -> None:
        while not self.stop.wait(0.5):
            jvm = next((p for p in descendants(self.pid) if process_name(p) == "java"), None)
            self.peak("python_rss_mb", rss_mb(self.pid))
            if jvm is None:
                continue
            self.peak("jvm_rss_mb", rss_mb(jvm))
            # The first java may be spark-submit's launcher (org.apache.spark.launcher.Main, gone in a second), and
            # jstat started before a JVM has published its counters exits at once: follow the java there is now.
            stale = self.jstat is None or self.jstat.poll() is not None or jvm != self.jstat_pid
            if stale and self.jstat_starts < 20 and shutil.which("jstat"):
                if self.jstat is not None:
                    self.jstat.terminate()
                self.jstat, self.jstat_pid = subprocess.Popen(
                    ["jstat", "-gc", str(jvm), "1000"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                ), jvm
                self.jstat_starts += 1
                threading.Thread(target=self.read_jstat, args=(self.jstat,), daemon=True).start()
        if self.jstat is not None:
            self.jstat.terminate()

    def read_jstat(self, jstat: subprocess.Popen[str]) -> None:
        header: list[str] = []
        for line in required(jstat.stdout, "jstat's output"):
            fields = line.split()
            if "EU" in fields:
                header = fields
            elif header and len(fields) == len(header):
                used = dict(zip(header, fields, strict=True))
                try:
                    self.peak("heap_mb", sum(float(used[k]) for k in ("S0U", "S1U", "EU", "OU")) / 1024)
                except (KeyError, ValueError):
                    continue

    def peak(self, key: str, value: float) -> None:
        self.peaks[key] = max(self.peaks[key], value)


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def process_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def run_consumer(command: list[str], *, sample_memory: bool = False) -> dict[str, float]:
    """Run one consumer process to its end: wall seconds, the machine's busy CPU seconds and, when asked, the
    memory peaks (MemorySampler). Exits the bench with the process's output when it fails."""
    log_file = Path(tempfile.mkstemp(suffix=".log", prefix="bench-consumer-")[1])
    wall, busy = time.monotonic(), busy_cpu_s()
    with log_file.open("wb") as out:
        process = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        sampler = MemorySampler(process.pid)
        if sample_memory:
            sampler.start()
        code = process.wait()
        sampler.stop.set()
    figures = {"s": time.monotonic() - wall, "busy_cpu_s": busy_cpu_s() - busy}
    output = log_file.read_text(errors="replace")
    if code:
        sys.exit(f"{' '.join(command[:3])} failed ({code}, its log {log_file}):\n" + output[-3000:])
    log_file.unlink()
    for line in output.splitlines():  # where the job's time went: its batches' phases
        if " done tables=" in line:
            print("    " + line.split(" INFO ", 1)[-1], flush=True)
    if sample_memory:
        sampler.join(5)
        figures.update(sampler.peaks)
    return figures


class Consumers:
    """The job (app/main.py) and the naive baseline (scripts/bench/naive.py), each `--available-now` over a
    source's topics on a fresh lake under `lake`; the Silver paths of each run, and the clean-up."""

    def __init__(self, spark: SparkSession, config_file: str, lake: str, source: BenchSource) -> None:
        self.spark, self.config_file, self.lake, self.source = spark, config_file, lake, source
        self.databases: list[str] = []
        self.conf_files: list[Path] = []

    def command(self, side: str, label: str) -> tuple[list[str], dict[str, str]]:
        database = f"bench_{label.replace('/', '_').replace('-', '_')}"
        command, paths, conf = self.source.consumer(side, self.config_file, f"{self.lake}/{label}", database,
                                                    available_now=True)
        self.conf_files.append(conf)
        if side == "job":
            self.databases.append(database)
        return command, paths

    def run(self, side: str, label: str, *, sample_memory: bool = False) -> dict[str, float]:
        """One run; exits the bench when a table then differs from PostgreSQL."""
        command, paths = self.command(side, label)
        figures = run_consumer(command, sample_memory=sample_memory)
        differ = self.source.differences(self.spark, paths)
        if differ:
            sys.exit(f"{side} run {label}: Silver differs from PostgreSQL: {'; '.join(differ)}")
        return figures

    def close(self) -> None:
        for database in self.databases:
            self.spark.sql(f"drop database if exists {database} cascade")
        for conf in self.conf_files:
            conf.unlink(missing_ok=True)


def backlog_source(config: JobConfig, label: str, tables: int, rows: int) -> BenchSource:
    """A source of `tables` tables of `rows` rows each whose topics hold a backlog: the snapshot, then a third of
    the rows updated and a tenth deleted (one transaction per statement). The caller enters it."""
    return BenchSource(label, tables, rows, config.registry.url, config.kafka.bootstrap_servers)


def fill_backlog(source: BenchSource) -> int:
    """The changes of backlog_source, and the wait until every record is on the topics; returns the records."""
    for table in source.table_names:
        source.execute(f"update {source.schema}.{table} set qty = qty + 1, tx = 1 where id % 3 = 0")
        source.execute(f"delete from {source.schema}.{table} where id % 10 = 1")
    rows = source.seed_rows
    per_table = rows + rows // 3 + 2 * ((rows - 1) // 10 + 1)  # each delete is followed by its tombstone
    return source.wait_for_records(source.tables * per_table)


# --- B2: the naive baseline ------------------------------------------------------------------------------------

def naive(spark: SparkSession, config_file: str, config: JobConfig, lake: str, args: argparse.Namespace
          ) -> tuple[list[Figure], dict[str, Any]]:
    """The job and the naive baseline (scripts/bench/naive.py), each `--available-now` in a process of its own over
    the same backlog on 7 tables, runs alternating, a fresh lake each; both must leave Silver equal to PostgreSQL.
    (The freshness side of B2 is in the freshness scenario: the naive baseline under the same workload.)"""
    with backlog_source(config, "n", args.backlog_tables, args.naive_rows) as source:
        records = fill_backlog(source)
        print(f"\nB2 naive baseline: {records} records over {args.backlog_tables} tables ({args.naive_rows} rows "
              "each, a third "
              "updated, a tenth deleted), each side --available-now in its own process")
        consumers = Consumers(spark, config_file, f"{lake}/naive", source)
        try:
            order = alternate(["job", "naive"], args.runs)
            results: dict[str, list[dict[str, float]]] = {"job": [], "naive": []}
            for n, side in enumerate(order):
                measured = consumers.run(side, f"{side}{n}")
                measured["events_per_s"] = records / measured["s"]
                results[side].append(measured)
                print(f"  run {n}: {side:10s} " + "  ".join(f"{k}={v:.2f}" for k, v in measured.items()), flush=True)
        finally:
            consumers.close()
    figures = medians("naive", "available-now run", results,
                      {"s": "s", "busy_cpu_s": "CPU-s", "events_per_s": "events/s"})
    ratio = statistics.median(r["events_per_s"] for r in results["job"]) / statistics.median(
        r["events_per_s"] for r in results["naive"])
    figures.append(Figure("naive", "job throughput over the naive baseline's", "job", "x", ratio, ()))
    return figures, {"records": records, "tables": args.backlog_tables, "options": naive_options("<table>")}


# --- B4: backlog -----------------------------------------------------------------------------------------------

def backlog(spark: SparkSession, config_file: str, config: JobConfig, lake: str, args: argparse.Namespace
            ) -> tuple[list[Figure], dict[str, Any]]:
    """The job `--available-now` over a backlog of at least 500,000 events on 7 tables, with the shipped config's
    memory settings: its time, throughput and memory peaks (one run: it is the figure itself)."""
    with backlog_source(config, "l", args.backlog_tables, args.backlog_rows) as source:
        records = fill_backlog(source)
        print(f"\nB4 backlog: {records} records over {args.backlog_tables} tables ({args.backlog_rows} rows each), "
              f"the job "
              f"--available-now, max_offsets_per_trigger={config.kafka.max_offsets_per_trigger}, "
              f"spark.driver.memory={config.spark.conf.get('spark.driver.memory', 'default')}")
        consumers = Consumers(spark, config_file, f"{lake}/backlog", source)
        try:
            result = consumers.run("job", "backlog", sample_memory=True)
        finally:
            consumers.close()
    result["events_per_s"] = records / result["s"]
    print("  " + "  ".join(f"{k}={v:.2f}" for k, v in result.items()), flush=True)
    units = {"s": "s", "busy_cpu_s": "CPU-s", "events_per_s": "events/s", "heap_mb": "MB", "jvm_rss_mb": "MB",
             "python_rss_mb": "MB"}
    figures = [Figure("backlog", f"{records:,} records, {key}", "job", unit, result[key], (result[key],))
               for key, unit in units.items() if key in result]
    return figures, {"records": records, **result}


# --- B3: freshness --------------------------------------------------------------------------------------------

def freshness_runs(spark: SparkSession, config_file: str, lake: str, args: argparse.Namespace
                   ) -> tuple[list[Figure], dict[str, Any]]:
    """One workload run per table count (scripts/bench/freshness.py) with the job reading, and for B2 the same
    workload with the naive baseline reading, on each of `--naive-tables`."""
    figures: list[Figure] = []
    runs: dict[str, Any] = {}
    sides = [("job", t) for t in args.tables] + [("naive", t) for t in args.naive_tables]
    for consumer, tables in sides:
        print(f"\nB3 freshness ({consumer}): {args.rate:g} transactions/s for {args.duration:g} s on {tables} tables, "
              f"after a warm-up of {args.warm_up:g} s", flush=True)
        workload = Workload(tables, args.rate, args.duration, settle_s=SMOKE_SETTLE_S if args.smoke else SETTLE_S,
                            warm_up=args.warm_up)
        result = freshness(spark, config_file, lake, workload, consumer)
        label = str(tables) if consumer == "job" else f"{tables} naive"
        runs[label] = result
        print("  " + "  ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}"
                               for k, v in result.items() if k not in ("series", "batches")), flush=True)
        for key in ("p50_s", "p95_s", "max_s"):
            figures.append(Figure("freshness", f"{tables} tables {key.removesuffix('_s')}",
                                  consumer if result["valid"] else f"{consumer}: INVALID (rate)", "s", result[key],
                                  ()))
        figures.append(Figure("freshness", f"{tables} tables achieved rate", f"{consumer} workload", "tx/s",
                              result["achieved_rate"], ()))
    for tables in set(args.tables) & set(args.naive_tables):
        ratio = runs[f"{tables} naive"]["p95_s"] / runs[str(tables)]["p95_s"]
        figures.append(Figure("freshness", f"{tables} tables: naive p95 over the job's", "job", "x", ratio, ()))
    return figures, runs


def soak(spark: SparkSession, config_file: str, lake: str, args: argparse.Namespace
         ) -> tuple[list[Figure], dict[str, Any]]:
    """B3's soak: the freshness workload for `--soak-minutes` on 3 tables; the p95 of its last 10 minutes against
    its first 10 (holds within 20%), and how often each table service ran on each table."""
    duration = args.soak_minutes * 60
    print(f"\nB3 soak: {args.rate:g} transactions/s for {duration:g} s on 3 tables, after a warm-up of "
          f"{args.warm_up:g} s", flush=True)
    result = freshness(spark, config_file, lake, Workload(3, args.rate, duration, warm_up=args.warm_up), "job")
    window = min(600.0, duration / 3)
    first = sorted(lag for t, lag in result["series"] if t < window)
    last = sorted(lag for t, lag in result["series"] if t >= duration - window)
    p95_first, p95_last = (lags[int(0.95 * (len(lags) - 1))] for lags in (first, last))
    services = result["services"]
    holds = p95_last <= 1.2 * p95_first and all(min(counts.values()) >= 2 for counts in services.values())
    print(f"  p95 first {window:g} s {p95_first:.2f}, last {window:g} s {p95_last:.2f}; table services "
          f"{services}: {'holds' if holds else 'DOES NOT HOLD'}", flush=True)
    figures = [
        Figure("soak", f"p95 of the first {window:g} s", "job", "s", p95_first, ()),
        Figure("soak", f"p95 of the last {window:g} s", "job", "s", p95_last, ()),
        Figure("soak", "last / first p95", "holds" if holds else "DOES NOT HOLD", "x", p95_last / p95_first, ()),
    ]
    return figures, {**result, "p95_first_s": p95_first, "p95_last_s": p95_last, "holds": holds}


# --- B5: growth ------------------------------------------------------------------------------------------------

LAYOUTS: dict[str, tuple[str, PartitionSpec | None]] = {
    "cow": ("COPY_ON_WRITE", None),
    "mor": ("MERGE_ON_READ", None),
    "mor-partitioned": ("MERGE_ON_READ", PartitionSpec("part")),
}


def rows(ids: DataFrame, version: int, amount_type: str | None = None) -> DataFrame:
    """Rows of `ids` as upsert `version` writes them; with an `amount` decimal column when `amount_type` says."""
    amount = [] if amount_type is None else [(F.col("id") % 10_000 / 100).cast(amount_type).alias("amount")]
    return ids.select(
        "id",
        F.concat(F.lit(f"v{version}-"), F.col("id").cast("string")).alias("payload"),
        (F.col("id") % 4).cast("string").alias("part"),
        *amount,
        F.lit(f"{version:016d}").alias("_cdc_position"),
        F.lit(False).alias("_hoodie_is_deleted"),
    )


def growth(spark: SparkSession, config: JobConfig, lake: str, args: argparse.Namespace
           ) -> tuple[list[Figure], dict[str, Any]]:
    """Per layout: a table of `small` rows and one of `large`, bulk-loaded, then the same-sized upserts into each,
    keys spread evenly over the whole table, alternating between the two tables."""
    figures: list[Figure] = []
    options: dict[str, Any] = {}
    print(f"\nB5 growth: upserts of {args.batch} keys into {args.small:,} and {args.large:,} rows")
    for layout, (table_type, partition) in ((k, LAYOUTS[k]) for k in args.layout):
        targets = {
            size: HudiTarget(database="bench_growth", table=f"{layout.replace('-', '_')}_{size}",
                             path=f"{lake}/growth/{layout}-{size}", record_key=("id",), table_type=table_type,
                             partition=partition, simple_index_tasks=config.lake.simple_index_tasks)
            for size in (args.small, args.large)
        }
        options[layout] = {**write_options(targets[args.small], 0, "bench"),
                           **index_options(targets[args.small], spark), **UNIQUE_ROWS}
        print(f" {layout}:")
        results = timed({str(size): Upserts(spark, target, args.batch) for size, target in targets.items()}, args.runs,
                        not args.smoke)
        figures += medians("growth", f"{layout} upsert", results, {"s": "s", "cpu_s": "CPU-s"})
        ratio = statistics.median(r["s"] for r in results[str(args.large)]) / statistics.median(
            r["s"] for r in results[str(args.small)])
        figures.append(Figure("growth", f"{layout} large / small", "ratio", "x", ratio, ()))
        for target in targets.values():
            delete_path(spark, target.path)
    spark.sql("drop database if exists bench_growth cascade")
    return figures, {"options": options}


class Upserts:
    """A table bulk-loaded with ids 0..size-1; each call upserts `batch` ids spread evenly over them (with
    `amount` of type `amount_type` when set: the widen scenario changes it between calls)."""

    def __init__(self, spark: SparkSession, target: HudiTarget, batch: int, amount_type: str | None = None) -> None:
        self.spark, self.target, self.batch = spark, target, batch
        self.size = int(target.table.rsplit("_", 1)[1])
        self.version = 0
        self.pid = jvm_pid(spark)
        self.amount_type = amount_type
        load = rows(spark.range(self.size), 0, amount_type)
        write_silver(load, target, 0, "bench", {"hoodie.datasource.write.operation": "bulk_insert"})

    def __call__(self, n: int) -> dict[str, float]:
        self.version += 1
        ids = self.spark.range(0, self.size, max(self.size // self.batch, 1)).limit(self.batch)
        batch = rows(ids, self.version, self.amount_type).cache()
        batch.count()
        wall, cpu = time.monotonic(), cpu_s(self.pid)
        write_silver(batch, self.target, self.version, "bench", unique_rows=True)
        figures = {"s": time.monotonic() - wall, "cpu_s": cpu_s(self.pid) - cpu}
        batch.unpersist()
        return figures


# --- widen: a table rewritten for a column widened upstream ------------------------------------------------------

def widen(spark: SparkSession, lake: str, args: argparse.Namespace) -> tuple[list[Figure], dict[str, Any]]:
    """Per layout: a table of `widen_rows` rows with `amount decimal(6,2)`; the rewrite widening it one digit more
    each time (app/sink/widening.py: rewrite) against an upsert of `batch` keys, alternating."""
    figures: list[Figure] = []
    print(f"\nwiden: the rewrite of {args.widen_rows:,} rows for a widened decimal against an upsert of "
          f"{args.batch} keys")
    for layout, (table_type, partition) in ((k, LAYOUTS[k]) for k in args.layout):
        target = HudiTarget(database="bench_widen", table=f"{layout.replace('-', '_')}_{args.widen_rows}",
                            path=f"{lake}/widen/{layout}", record_key=("id",), table_type=table_type,
                            partition=partition)
        upserts = Upserts(spark, target, args.batch, "decimal(6,2)")
        precision = 6

        def rewrite_once(n: int, upserts: Upserts = upserts, target: HudiTarget = target) -> dict[str, float]:
            nonlocal precision
            precision += 1
            wall, cpu = time.monotonic(), cpu_s(upserts.pid)
            rewrite_table(spark, target, {"amount": DecimalType(precision, 2)}, n, "bench")
            upserts.amount_type = f"decimal({precision},2)"
            return {"s": time.monotonic() - wall, "cpu_s": cpu_s(upserts.pid) - cpu}

        print(f" {layout}:")
        results = timed({"rewrite": rewrite_once, "upsert": upserts}, args.runs, not args.smoke)
        figures += medians("widen", f"{layout}", results, {"s": "s", "cpu_s": "CPU-s"})
        ratio = statistics.median(r["s"] for r in results["rewrite"]) / statistics.median(
            r["s"] for r in results["upsert"])
        figures.append(Figure("widen", f"{layout} rewrite / upsert", "ratio", "x", ratio, ()))
        delete_path(spark, target.path)
    spark.sql("drop database if exists bench_widen cascade")
    return figures, {"rows": args.widen_rows}


# --- job runs: this code against a baseline ref ----------------------------------------------------------------

def job_runs(spark: SparkSession, config_file: str, lake: str, args: argparse.Namespace
             ) -> tuple[list[Figure], dict[str, Any]]:
    """The demo's two job runs, here and at `--baseline-ref`: `app/main.py --available-now` over the topics on a
    fresh lake and catalog database, then (unless `--burst 0`) a burst of `--burst` changes in the demo's source
    databases (scripts/tickit.py, as scripts/demo.py makes it) and each side's second run over it, on its lake.
    Rounds alternate the sides' order; each round's lakes and databases are its own (dropped at the end)."""
    checkouts = {"head": ROOT}
    worktree = Path(tempfile.mkdtemp(prefix="bench-baseline-"))
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(worktree), args.baseline_ref],
                   check=True, capture_output=True)
    checkouts["baseline"] = worktree
    raw_conf = yaml.safe_load(Path(config_file).read_text())

    print(f"\njob runs: this checkout against {args.baseline_ref}, topics {raw_conf['kafka']['topic_pattern']!r}"
          + (f", then a burst of {args.burst} changes" if args.burst else ""))
    runs: dict[str, dict[str, list[dict[str, float]]]] = {
        kind: {"head": [], "baseline": []} for kind in (("snapshot", "burst") if args.burst else ("snapshot",))}
    confs: list[Path] = []
    try:
        for round_ in range(args.runs):
            order = ["head", "baseline"] if round_ % 2 == 0 else ["baseline", "head"]
            sides = {name: job_conf(checkouts[name], raw_conf, lake, f"{name}{round_ + 1}") for name in order}
            confs += sides.values()
            for kind in runs:
                if kind == "burst":
                    print(f"  burst: {demo_burst(config_file, args.burst)} changes", flush=True)
                for name in order:
                    runs[kind][name].append(job_run(name, checkouts[name], sides[name]))
                    print(f"  round {round_ + 1} {kind:8s} {name:10s} "
                          + "  ".join(f"{k}={v:.2f}" for k, v in runs[kind][name][-1].items()), flush=True)
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(worktree)], check=False)
        shutil.rmtree(worktree, ignore_errors=True)
        for conf in confs:
            conf.unlink(missing_ok=True)
        for round_ in range(args.runs):
            for name in checkouts:
                spark.sql(f"drop database if exists bench_runs_{name}{round_ + 1} cascade")
    return job_run_figures(runs), {"baseline_ref": args.baseline_ref, "burst": args.burst}


def job_conf(checkout: Path, raw_conf: dict[str, Any], lake: str, name: str) -> Path:
    """The checkout's own conf/local.yaml (the keys its code knows), pointed at the run's lake, catalog database
    (`bench_runs_<name>`) and the bench config's topics."""
    raw = yaml.safe_load((checkout / "conf/local.yaml").read_text())
    root = f"{lake}/job-runs/{name}"
    raw["kafka"]["topic_pattern"] = raw_conf["kafka"]["topic_pattern"]
    raw["lake"].update({"database": f"bench_runs_{name}", "silver_path": f"{root}/silver",
                        "bronze_path": f"{root}/bronze", "checkpoint_path": f"{root}/checkpoint"})
    raw["spark"]["jars_dir"] = str(ROOT / ".deps/spark")
    if "class_archive" in raw["spark"]:  # this checkout's (a worktree has no .deps: its JVM would start without one)
        raw["spark"]["class_archive"] = str(ROOT / raw["spark"]["class_archive"])
    conf = Path(tempfile.mkstemp(suffix=".yaml")[1])
    conf.write_text(yaml.safe_dump(raw))
    return conf


def job_run(name: str, checkout: Path, conf: Path) -> dict[str, float]:
    """One `app/main.py --available-now` of the checkout, a process of its own: wall and busy CPU seconds."""
    wall, busy = time.monotonic(), busy_cpu_s()
    done = subprocess.run(
        [sys.executable, "app/main.py", "--conf", str(conf), "--available-now"], cwd=checkout,
        env={**os.environ, "PYTHONPATH": str(checkout)}, capture_output=True, text=True, check=False,
    )
    if done.returncode:
        sys.exit(f"job run ({name}) failed ({done.returncode}):\n{done.stderr[-3000:]}")
    figures = {"s": time.monotonic() - wall, "busy_cpu_s": busy_cpu_s() - busy}
    # The driver JVM's JIT time, from the job's last line (app/job.py log_jvm_times; older code has none).
    jit = re.search(r"driver JVM up [\d.]+ s(?:, CPU [\d.]+ s)?; JIT compilers busy ([\d.]+) s", done.stderr)
    if jit:
        figures["jit_s"] = float(jit.group(1))
    return figures


def job_run_figures(runs: dict[str, dict[str, list[dict[str, float]]]]) -> list[Figure]:
    """Medians of each kind of run (snapshot, burst) and side, the speed-ups, and those of the two runs together."""
    figures: list[Figure] = []
    for kind, results in runs.items():
        label = "available-now run" if kind == "snapshot" else "burst run"
        figures += medians("job-runs", label, results, {"s": "s", "busy_cpu_s": "CPU-s"})
        for side, side_runs in results.items():  # the JIT's time, where every run of the side logged it
            if side_runs and all("jit_s" in r for r in side_runs):
                figures += medians("job-runs", label, {side: side_runs}, {"jit_s": "s"})
        speedup = statistics.median(r["s"] for r in results["baseline"]) / statistics.median(
            r["s"] for r in results["head"])
        figures.append(Figure("job-runs", f"{label}: speed-up over the baseline", "head", "x", speedup, ()))
    if len(runs) == 2:  # the two runs together, per round
        both = {name: [a["s"] + b["s"] for a, b in zip(runs["snapshot"][name], runs["burst"][name], strict=True)]
                for name in ("head", "baseline")}
        for name, values in both.items():
            figures.append(Figure("job-runs", "both runs s", name, "s", statistics.median(values), tuple(values)))
        figures.append(Figure("job-runs", "both runs: speed-up over the baseline", "head", "x",
                              statistics.median(both["baseline"]) / statistics.median(both["head"]), ()))
    return figures


def demo_burst(config_file: str, changes: int) -> int:
    """A burst of about `changes` row changes in the demo's source databases (scripts/demo.py's step 5), waited
    for in Kafka; the number of rows changed."""
    from scripts import demo, tickit  # noqa: PLC0415 - the demo's sources, only for this scenario

    config = load_config(config_file)
    password = os.environ.get("PGPASSWORD", "postgres")
    with (psycopg.connect(demo.DSN.format(password=password), autocommit=True) as conn,
          pymysql.connect(**demo.MARIADB, autocommit=True) as maria):
        placement = tickit.Placement.reference(conn, maria)
        before = demo.topic_counts(config)
        done = tickit.burst(placement, seed=int(time.time()), n=changes)
    demo.wait_for_topics(config, {t: before[t] + n for t, n in tickit.burst_records(done).items()})
    return sum(sum(c.values()) for c in done.values())


# --- report ----------------------------------------------------------------------------------------------------

def markdown(figures: list[Figure], details: dict[str, Any]) -> str:
    lines = ["| scenario | figure | side | median | runs |", "|---|---|---|---:|---|"]
    for f in figures:
        runs = ", ".join(f"{v:.2f}" for v in f.values)
        lines.append(f"| {f.scenario} | {f.name} | {f.side} | {f.median:,.2f} {f.unit} | {runs} |")
    phases = details.get("ceiling", {}).get("phases", {})
    if phases:
        lines += ["", "| the job's batch (ceiling) | median s |", "|---|---:|"]
        lines += [f"| {phase} | {seconds:.2f} |" for phase, seconds in phases.items()]
    machine = details.get("machine", {})
    if machine:
        lines += ["", "| the machine's speed: a fixed Python loop, best of 3 (s) | before | after |", "|---|---:|---:|"]
        lines += [f"| {name} | {m['reference_loop_before_s']:.2f} | {m['reference_loop_after_s']:.2f} |"
                  for name, m in machine.items()]
    tables = details.get("ceiling", {}).get("tables", {})
    if tables:
        lines += ["", "| table (ceiling, job side) | rows in | median s of its unit |", "|---|---:|---:|"]
        lines += [f"| {t} | {v['rows_in']} | {v['median_s']:.2f} |" for t, v in sorted(tables.items())]
    return "\n".join(lines) + "\n"


def plots(details: dict[str, Any], out: Path) -> list[str]:
    """freshness.png (each transaction's freshness over the workload) and batches.png (the job's batch durations
    against their sizes, from the freshness runs' job logs); none without matplotlib (`pip install .[bench]`)."""
    try:
        import matplotlib  # noqa: PLC0415 - optional: the bench extra
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        print("no plots: matplotlib is not installed (pip install -e '.[bench]')")
        return []
    runs = details.get("freshness", {})
    if not runs:
        return []
    figure, axes = plt.subplots(figsize=(9, 4))
    for tables, run in runs.items():
        axes.plot([t for t, _ in run["series"]], [lag for _, lag in run["series"]], ".", markersize=2,
                  label=f"{tables} tables, p95 {run['p95_s']:.1f} s")
    axes.set(xlabel="seconds into the workload", ylabel="freshness (s)", title="PostgreSQL commit to Hudi commit")
    axes.legend()
    figure.savefig(out / "freshness.png", dpi=110, bbox_inches="tight")
    figure, axes = plt.subplots(figsize=(9, 4))
    for tables, run in runs.items():
        batches = run.get("batches", [])
        axes.plot([n for n, _ in batches], [s for _, s in batches], "o", markersize=3,
                  label=f"{tables} tables")
    axes.set(xlabel="events in the batch", ylabel="batch duration (s)", title="The job's batches")
    axes.legend()
    figure.savefig(out / "batches.png", dpi=110, bbox_inches="tight")
    plt.close("all")
    return ["freshness.png", "batches.png"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conf", default=str(ROOT / "conf/local.yaml"), help="job config (default conf/local.yaml)")
    parser.add_argument("--scenario", action="append", choices=SCENARIOS, help="repeatable (default: all)")
    parser.add_argument("--runs", type=int, default=3, help="measured runs per side (default 3)")
    parser.add_argument("--small", type=int, default=10_000, help="growth: rows of the small table (10,000)")
    parser.add_argument("--large", type=int, default=1_000_000, help="growth: rows of the large table (1,000,000)")
    parser.add_argument("--batch", type=int, default=10_000, help="growth, widen: keys per upsert (10,000)")
    parser.add_argument("--widen-rows", type=int, default=200_000,
                        help="widen: rows of the table rewritten (200,000)")
    parser.add_argument("--layout", action="append", choices=list(LAYOUTS),
                        help="growth, widen: table layouts; repeatable (default: all; --smoke: cow)")
    parser.add_argument("--rate", type=float, default=100.0, help="freshness: transactions a second (100)")
    parser.add_argument("--duration", type=float, default=120.0, help="freshness: seconds of workload (120)")
    parser.add_argument("--warm-up", type=float, default=120.0,
                        help=f"freshness, soak: seconds of the same workload before the measured ones (120; --smoke: "
                             f"{SMOKE['warm_up']:g})")
    parser.add_argument("--tables", type=int, action="append", help="freshness: tables; repeatable (3 and 7)")
    parser.add_argument("--naive-tables", type=int, action="append",
                        help="freshness: the naive baseline's runs' tables; repeatable (7; 0: no naive freshness run)")
    parser.add_argument("--naive-rows", type=int, default=5000,
                        help="naive: rows of each of its --backlog-tables source tables (5,000: about 54,000 records)")
    parser.add_argument("--backlog-tables", type=int, default=7,
                        help="naive, backlog: source tables of the backlog (7; --smoke: 2)")
    parser.add_argument("--backlog-rows", type=int, default=50_000,
                        help="backlog: rows of each of its --backlog-tables tables (50,000: about 537,000 records)")
    parser.add_argument("--soak-minutes", type=float, default=30.0, help="soak: minutes of workload (30)")
    parser.add_argument("--baseline-ref", default="HEAD~1", help="job-runs: the git ref to compare with")
    parser.add_argument("--burst", type=int, default=200,
                        help="job-runs: changes in the burst before the second runs (200, as the demo; 0: no burst)")
    parser.add_argument("--out", default=str(ROOT / ".bench"), help="folder for results.json and results.md")
    parser.add_argument("--smoke", action="store_true",
                        help=f"tiny sizes, one run, no warm-up, no job-runs unless asked (CI: it must not rot): "
                             f"{SMOKE}")
    args = parser.parse_args(argv)
    if args.smoke:
        args.runs, args.small, args.large, args.batch = (SMOKE[k] for k in ("runs", "small", "large", "batch"))
        args.rate, args.duration, args.tables = SMOKE["rate"], SMOKE["duration"], SMOKE["tables"]
        args.warm_up = SMOKE["warm_up"]  # the warm-up path runs, briefly
        args.naive_tables, args.naive_rows, args.backlog_rows = SMOKE["tables"], SMOKE["naive_rows"], SMOKE[
            "backlog_rows"]
        args.widen_rows = SMOKE["widen_rows"]
        args.layout = args.layout or SMOKE["layouts"]
        args.backlog_tables = SMOKE["backlog_tables"]
        args.scenario = args.scenario or ["ceiling", "naive", "freshness", "backlog", "growth", "widen"]
    args.scenario = args.scenario or list(DEFAULT_SCENARIOS)
    args.tables = args.tables or [3, 7]
    args.layout = args.layout or list(LAYOUTS)
    args.naive_tables = [t for t in args.naive_tables or [7] if t]
    if args.runs < 1 or args.batch < 1 or args.small < args.batch or args.large < args.small:
        parser.error("--runs >= 1, and --batch <= --small <= --large")
    return args


def stop_on_sigterm() -> None:
    """A SIGTERM (a CI timeout, `kill`) ends the bench as Ctrl-C does, through its `finally` blocks and context
    managers: the job it started is stopped, and its connector, replication slot, publication and schema removed
    (scripts/bench/source.py), instead of being left behind."""

    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stop_on_sigterm()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    config = load_config(args.conf)
    lake = f"{config.lake.silver_path.rstrip('/')}/_bench/{uuid.uuid4().hex[:8]}"
    figures: list[Figure] = []
    details: dict[str, Any] = {"scenarios": args.scenario, "runs": args.runs,
                               "spark_conf": {k: v for k, v in session_conf(config.spark, None).items()
                                              if not k.endswith("extraClassPath")}}
    details["machine"] = {}
    loops = REFERENCE_LOOPS // 10 if args.smoke else REFERENCE_LOOPS
    started = time.monotonic()
    if args.scenario:
        spark = build_session("bench", config.spark, config.metastore)
        spark.sparkContext.setLogLevel("ERROR")
        print("Spark settings:\n" + "\n".join(f"  {k}={v}" for k, v in sorted(details["spark_conf"].items())))
        scenarios: dict[str, Callable[[], tuple[list[Figure], dict[str, Any]]]] = {
            "ceiling": lambda: ceiling(spark, config, lake, args.runs, not args.smoke),
            "naive": lambda: naive(spark, args.conf, config, lake, args),
            "freshness": lambda: freshness_runs(spark, args.conf, lake, args),
            "backlog": lambda: backlog(spark, args.conf, config, lake, args),
            "soak": lambda: soak(spark, args.conf, lake, args),
            "growth": lambda: growth(spark, config, lake, args),
            "widen": lambda: widen(spark, lake, args),
            "job-runs": lambda: job_runs(spark, args.conf, lake, args),
        }
        try:
            for name, scenario in scenarios.items():
                if name not in args.scenario:
                    continue
                before = reference_loop_s(loops)
                found, details[name] = scenario()
                details["machine"][name] = {"reference_loop_before_s": before, "reference_loop_after_s":
                                            reference_loop_s(loops)}
                figures += found
                if name == "naive":
                    print("Hudi options of the naive baseline (each table):\n"
                          + "\n".join(f"  {k}={v}" for k, v in details["naive"]["options"].items()))
                if name == "growth":
                    for layout, options in details["growth"]["options"].items():
                        print(f"Hudi options, {layout}:\n"
                              + "\n".join(f"  {k}={v}" for k, v in sorted(options.items())))
        finally:
            delete_path(spark, lake)
    details["total_s"] = time.monotonic() - started
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(
        {"figures": [dataclasses.asdict(f) for f in figures], "details": details}, indent=2, default=str))
    plotted = plots(details, out)
    table = markdown(figures, details) + "".join(f"\n![{name}]({name})\n" for name in plotted)
    (out / "results.md").write_text(table)
    print("\n" + table + f"\n{len(figures)} figures in {details['total_s']:.0f} s; written to {out}/results.json and "
          "results.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
