"""B3 of scripts/bench/run.py: how long after its PostgreSQL commit a transaction is in Silver, under a steady load.

A schema of `tables` tables gets its own Debezium connector (scripts/bench/source.py) and its own job process
(`app/main.py`, the given config with a 1-second trigger, the lake under the bench's folder; or, for B2, the naive
baseline of scripts/bench/naive.py with a 1-second trigger). Once the job has created every table, a workload
thread runs `rate` transactions a second for `warm_up` + `duration` seconds: each inserts a new row into one table,
or into two (a transaction spanning tables), and most also update or delete an earlier row. The first `warm_up`
seconds are the consumer's warm-up (a new JVM's compilers are busy for its first minutes): their transactions must
reach Silver like the others, but the figures (freshness, the achieved rate, and the commits, batches and table
services counted) are of the `duration` after them.
A transaction's commit time is the moment its COMMIT returns to the workload (the same clock as the job's; at
most a round trip after PostgreSQL's commit). A watcher lists every table's timeline every `POLL_S` seconds, so the
completion time of each Hudi commit (in its completed instant's file name) is known even after archival moves it;
an inserted row's `_hoodie_commit_time` is the begin time of the commit that first held it (a row the workload
never touches again keeps it). Freshness of a transaction = the latest completion among the commits holding its
rows - its commit.

The run is invalid below 95% of the asked rate, and fails when a transaction is not in Silver 60 s after the
workload ends, or when a table then differs from PostgreSQL. That check reads every table with Spark; it waits for
the consumer's commits to stop first, so that it does not share the cores with the batches that hold the last
transactions.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import random
import re
import statistics
import subprocess
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
from pyspark.sql import SparkSession

from app.config import load_config
from app.sink.lakefs import delete_path, list_files
from scripts.bench.source import BenchSource

log = logging.getLogger("bench.freshness")
ROOT = Path(__file__).resolve().parents[2]
SEED_ROWS = 2000
SETTLE_S = 60.0
# How often the watcher lists the timelines. A completed instant's file name holds its completion time, so a longer
# interval loses no precision; archival keeps at least the newest 10 commits of a table (`hoodie.keep.min.commits`),
# so none goes unseen. Fewer listings leave more of the machine to the job the bench measures.
POLL_S = 2.0
QUIET_POLLS = 2  # polls with no new commit before the check at the end reads the tables (`_quiet`)
HISTORY_EVERY = 5  # polls between listings of the timeline's history (archival's manifests)


@dataclasses.dataclass
class Transaction:
    committed: float  # epoch seconds, as the workload saw its COMMIT return
    rows: list[tuple[int, int]]  # (table number, inserted id)
    measured: bool = True  # false in the warm-up


class TimelineWatcher(threading.Thread):
    """Lists each table's timeline every `POLL_S` seconds: {table path: {begin instant: completion epoch seconds}}
    of its writes, and the table services seen, each with its epoch seconds: completed cleans (their completion)
    and compactions, and the files archival wrote to the timeline's history (its LSM layout: a new manifest at each
    archival; when first listed), listed every `HISTORY_EVERY` polls."""

    def __init__(self, spark: SparkSession, paths: list[str], zone: ZoneInfo) -> None:
        super().__init__(daemon=True, name="timeline-watcher")
        self.spark, self.paths, self.zone = spark, paths, zone
        self.completed: dict[str, dict[str, float]] = {p: {} for p in paths}
        self.kinds: dict[str, dict[str, str]] = {p: {} for p in paths}  # begin instant: commit | deltacommit
        # {table path: {service: {instant or manifest: epoch seconds}}}
        self.services: dict[str, dict[str, dict[str, float]]] = {p: {"clean": {}, "archival": {}} for p in paths}
        self.stop = threading.Event()

    def run(self) -> None:
        polls = 0
        while not self.stop.is_set():
            self.poll(history=polls % HISTORY_EVERY == 0)
            polls += 1
            self.stop.wait(POLL_S)

    def poll(self, history: bool = False) -> None:
        for path in self.paths:
            for name in list_files(self.spark, f"{path}/.hoodie/timeline"):
                match = re.fullmatch(r"(\d{17})_(\d{17})\.(commit|deltacommit|clean)", name)
                if match and match[3] == "clean":
                    self.services[path]["clean"].setdefault(match[1], self.epoch(match[2]))
                elif match:
                    self.completed[path].setdefault(match[1], self.epoch(match[2]))
                    self.kinds[path][match[1]] = match[3]
            if history:
                now, archival = time.time(), self.services[path]["archival"]
                for name in list_files(self.spark, f"{path}/.hoodie/timeline/history"):
                    if name.startswith("manifest_"):
                        archival.setdefault(name, now)

    def service_counts(self, since: float = 0.0) -> dict[str, dict[str, int]]:
        """Per table (its folder's name): how often each table service ran from epoch second `since` on; compaction
        for Merge-on-Read tables only (there a completed `commit` is a compaction, the writes being delta commits)."""
        counts = {}
        for path, services in self.services.items():
            found = {service: sum(1 for at in seen.values() if at >= since) for service, seen in services.items()}
            if "deltacommit" in self.kinds[path].values():
                found["compaction"] = sum(1 for instant, kind in self.kinds[path].items()
                                          if kind == "commit" and self.completed[path][instant] >= since)
            counts[path.rsplit("/", 1)[-1]] = found
        return counts

    def epoch(self, instant: str) -> float:
        return datetime.strptime(instant, "%Y%m%d%H%M%S%f").replace(tzinfo=self.zone).timestamp()


@dataclasses.dataclass(frozen=True)
class Workload:
    tables: int
    rate: float  # transactions a second
    duration: float  # seconds measured
    # How long after the workload every transaction may take to reach Silver before the run fails (B3's rule: 60 s;
    # the CI's smoke, which asserts no times, waits longer on a machine its other tests keep busy).
    settle_s: float = SETTLE_S
    warm_up: float = 0.0  # seconds of the same workload before the measured ones


CONSUMERS = ("job", "naive")


def freshness(spark: SparkSession, config_file: str, lake: str, workload: Workload, consumer: str = "job"
              ) -> dict[str, Any]:
    """One B3 run (module docstring): its figures and whether it is valid. `consumer`: the job (app/main.py) or
    the naive baseline (scripts/bench/naive.py, B2) reads the topics."""
    config = load_config(config_file)
    with BenchSource("f", workload.tables, SEED_ROWS, config.registry.url, config.kafka.bootstrap_servers) as source:
        return FreshnessRun(spark, config_file, lake, workload, source, consumer=consumer).run()


class FreshnessRun:
    def __init__(self, spark: SparkSession, config_file: str, lake: str, workload: Workload, source: BenchSource,
                 *, consumer: str) -> None:
        self.spark, self.workload, self.source, self.consumer = spark, workload, source, consumer
        self.schema = source.schema
        self.zone = os.environ.get("TZ") or "UTC"
        self.root, self.database = f"{lake}/freshness/{source.prefix}{consumer}", f"bench_fresh_{source.prefix}"
        self.command, paths, self.conf = source.consumer(consumer, config_file, self.root, self.database,
                                                         available_now=False)
        self.paths = list(paths.values())
        self.watcher = TimelineWatcher(spark, self.paths, ZoneInfo(self.zone))
        self.job: subprocess.Popen[bytes] | None = None
        self.log_file = Path(tempfile.mkstemp(suffix=".log", prefix=f"bench-fresh-{consumer}-")[1])

    def run(self) -> dict[str, Any]:
        try:
            self.job = subprocess.Popen(self.command, cwd=ROOT, env={**os.environ, "TZ": self.zone},
                                        stdout=self.log_file.open("wb"), stderr=subprocess.STDOUT)
            self.watcher.start()
            self._wait(lambda: all(self.watcher.completed[p] for p in self.paths), 300,
                       f"the {self.consumer}'s first commit of every table")
            transactions, elapsed = self._workload()
            return {"consumer": self.consumer, **self._measure(transactions, elapsed)}
        finally:
            self.watcher.stop.set()
            if self.job is not None:
                self.job.terminate()
                try:
                    self.job.wait(30)
                except subprocess.TimeoutExpired:
                    self.job.kill()
            self.conf.unlink(missing_ok=True)
            self.spark.sql(f"drop database if exists {self.database} cascade")
            delete_path(self.spark, self.root)

    def _workload(self) -> tuple[list[Transaction], float]:
        """`rate` transactions a second for `warm_up` + `duration` seconds, each committed on schedule (late ones at
        once); the seconds elapsed over the measured ones."""
        rng = random.Random(7)
        transactions: list[Transaction] = []
        deleted: set[tuple[int, int]] = set()
        tables, rate, schema = self.workload.tables, self.workload.rate, self.schema
        warm_up = int(rate * self.workload.warm_up)
        with psycopg.connect(self.source.dsn) as conn:
            started = measured_from = time.monotonic()
            for k in range(warm_up + int(rate * self.workload.duration)):
                if k == warm_up:
                    log.info("warm-up over: %d transactions; measuring", warm_up)
                    measured_from = started + k / rate
                delay = started + k / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                chosen = rng.sample(range(tables), 2 if tables > 1 and rng.random() < 0.2 else 1)
                rows = []
                for n in chosen:
                    new_id = 10_000_000 + k * 10 + n
                    conn.execute(f"insert into {schema}.t{n} values (%s, %s, %s, %s)", (new_id, k, f"tx {k}", k))
                    rows.append((n, new_id))
                    roll, seed = rng.random(), (n, rng.randint(1, SEED_ROWS))
                    if roll < 0.5 and seed not in deleted:
                        conn.execute(f"update {schema}.t{n} set qty = qty + 1, tx = %s where id = %s", (k, seed[1]))
                    elif roll < 0.55 and seed not in deleted:
                        conn.execute(f"delete from {schema}.t{n} where id = %s", (seed[1],))
                        deleted.add(seed)
                conn.commit()
                transactions.append(Transaction(time.time(), rows, measured=k >= warm_up))
            elapsed = time.monotonic() - measured_from
        return transactions, elapsed

    def _measure(self, transactions: list[Transaction], elapsed: float) -> dict[str, Any]:
        tables, paths, spark, watcher = self.workload.tables, self.paths, self.spark, self.watcher
        expected = {n: {row_id for t in transactions for m, row_id in t.rows if m == n} for n in range(tables)}
        held: dict[int, dict[int, str]] = {}

        def all_held() -> bool:
            for n, path in enumerate(paths):
                df = spark.read.format("hudi").load(path).filter("id >= 10000000")
                held[n] = {r["id"]: r["_hoodie_commit_time"] for r in df.select("id", "_hoodie_commit_time").collect()}
            return all(expected[n] <= set(held[n]) for n in range(tables))

        settle_end = time.monotonic() + self.workload.settle_s
        self._quiet(transactions[-1].committed, settle_end)
        self._wait(all_held, max(settle_end - time.monotonic(), 0.0), "every transaction in Silver", poll_s=3.0)
        watcher.poll()
        lags = []  # in commit order, of the measured transactions
        measured = [t for t in transactions if t.measured]
        for t in measured:
            ends = [watcher.completed[paths[n]].get(held[n][row_id]) for n, row_id in t.rows]
            if any(end is None for end in ends):
                raise RuntimeError(f"a commit of {t.rows} is not on the timelines watched")
            lags.append(max(e for e in ends if e is not None) - t.committed)
        # The whole table equals PostgreSQL, updates and deletes included.
        differ = self.source.differences(spark, dict(zip(self.source.table_names, paths, strict=True)))
        if differ:
            raise RuntimeError(f"the {self.consumer}'s Silver differs from PostgreSQL: {'; '.join(differ)}")
        achieved = len(measured) / elapsed
        ordered = sorted(lags)
        # Commits, batches and table services of the measured seconds only, as the figures (not the warm-up's)
        since, last = measured[0].committed, transactions[-1].committed
        during = [sum(1 for end in watcher.completed[p].values() if since <= end <= last + SETTLE_S) for p in paths]
        return {
            "tables": tables, "rate": self.workload.rate, "achieved_rate": achieved,
            "duration_s": self.workload.duration, "warm_up_s": self.workload.warm_up,
            "valid": achieved >= 0.95 * self.workload.rate,
            "transactions": len(measured), "warm_up_transactions": len(transactions) - len(measured),
            "p50_s": statistics.median(ordered),
            "p95_s": ordered[int(0.95 * (len(ordered) - 1))], "max_s": ordered[-1],
            "commits_per_table": statistics.median(during),
            "series": [(round(t.committed - measured[0].committed, 3), round(lag, 3))
                       for t, lag in zip(measured, lags, strict=True)],
            "batches": self._batches(since),
            "services": watcher.service_counts(since),
        }

    def _batches(self, since: float = 0.0) -> list[tuple[int, float]]:
        """(events, seconds) of each batch the job logged done from epoch second `since` on: its tables' rows_in
        and its duration. A log line's time is the job's local time (app/main.py's format)."""
        rows: dict[str, int] = {}
        batches = []
        zone = ZoneInfo(self.zone)
        for line in self.log_file.read_text(errors="replace").splitlines():
            if table := re.search(r"batch=(\d+) table=\S+ rows_in=(\d+)", line):
                rows[table[1]] = rows.get(table[1], 0) + int(table[2])
            elif done := re.search(r"batch=(\d+) done tables=\d+ duration_s=([\d.]+)", line):
                stamp = re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}", line)
                at = (datetime.strptime(stamp[0], "%Y-%m-%d %H:%M:%S,%f").replace(tzinfo=zone).timestamp()
                      if stamp else since)  # a line without its time is kept
                if at >= since:
                    batches.append((rows.get(done[1], 0), float(done[2])))
        return batches

    def _quiet(self, last_committed: float, deadline: float) -> None:
        """Until the consumer has stopped committing: a commit completed after the workload's last transaction, then
        none for `QUIET_POLLS` of the watcher's polls (or `deadline`, monotonic). The check that follows reads every
        table with Spark in this process; run while the consumer's last batches still commit, it would share the
        machine's two cores with them and lengthen them: the last seconds' transactions, measured like the others,
        would wait for the bench, not for the consumer."""
        seen, quiet = -1, 0
        while time.monotonic() < deadline and quiet < QUIET_POLLS:
            # Copies taken at once (the watcher's thread adds to them).
            ends = [end for completed in list(self.watcher.completed.values()) for end in list(completed.values())]
            if len(ends) == seen and ends and max(ends) >= last_committed:
                quiet += 1
            else:
                seen, quiet = len(ends), 0
            if self.job is not None and self.job.poll() is not None:
                return  # the check that follows reports it
            time.sleep(POLL_S)

    def _wait(self, done: Any, timeout_s: float, what: str, poll_s: float = 0.5) -> None:
        deadline = time.monotonic() + timeout_s
        while not done():
            if self.job is not None and self.job.poll() is not None:
                raise RuntimeError(f"the job ended ({self.job.returncode}) waiting for {what}:\n"
                                   + self.log_file.read_text(errors="replace")[-3000:])
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not after {timeout_s:.0f} s (job log {self.log_file})")
            time.sleep(poll_s)
