#!/usr/bin/env python3
"""What Hudi settings do to the cost of one small commit: the job's own write options (the baseline) against
variants of them, table by table, in the same run.

Every variant gets a table of its own, written with app/sink/hudi.write_silver (the job's options, meta sync
included) plus the variant's options on top; the baseline adds nothing. All tables get the same sequence of
commits (the first inserts `--rows` rows, each later one updates `--update-fraction` of them and inserts
`--rows`/20), and the order of the tables turns round on every commit, so warm-up and S3 noise fall on all of
them. Per commit it measures the wall time and the CPU the session's JVM spent (from
/proc/<pid>/stat, so Linux only); the first commit of each table (creation, catalog registration) is reported
apart, and the baseline's also carries the session's warm-up. Prints per-commit figures, then the medians of
the later commits and each variant's difference from the baseline. What meta sync adds to a commit:
`--variant no-sync` (the default variant).

Variants: a preset name below, or NAME='{"hoodie.option": "value", ...}'.
  no-sync           no meta sync after the commit
  reconcile-2       hoodie.global.index.reconcile.parallelism=2 (record-index tables: partitioned ones)
  no-timeline       no embedded timeline server
  direct-markers    direct marker files instead of timeline-server-based ones
  no-metadata       no metadata table (not for partitioned tables: their record-level index lives there)

Needs the local stack (scripts/stack.sh up). The lake is conf/local.yaml's (S3 by default) unless --lake is
given; the tables and their catalog database are dropped at the end.
Usage: .venv/bin/python scripts/bench/commit_options.py [--variant no-sync --variant reconcile-2] [--partitions 3]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import statistics
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from pyspark.sql import DataFrame, SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from app.config import PartitionSpec, load_config  # noqa: E402
from app.sink.hudi import HudiTarget, sized_options, write_silver  # noqa: E402
from app.sink.lakefs import delete_path  # noqa: E402
from app.spark import build_session, jvm_pid  # noqa: E402
from scripts.bench.run import cpu_s  # noqa: E402

SYNC_OFF = {"hoodie.datasource.meta.sync.enable": "false", "hoodie.datasource.hive_sync.enable": "false"}
PRESETS: dict[str, dict[str, str]] = {
    "no-sync": SYNC_OFF,
    "reconcile-2": {"hoodie.global.index.reconcile.parallelism": "2"},
    "no-timeline": {"hoodie.embed.timeline.server": "false"},
    "direct-markers": {"hoodie.write.markers.type": "DIRECT"},
    "no-metadata": {"hoodie.metadata.enable": "false"},
}
BASELINE = "baseline"


def batch(spark: SparkSession, commit: int, rows: int, update_fraction: float, partitions: int) -> DataFrame:
    """Commit 0: ids 0..rows-1. Later commits: a slice of existing ids updated, and rows/20 new ids."""
    updated = int(rows * update_fraction)
    start = (commit * updated) % rows
    ids = [(start + k) % rows for k in range(updated)] if commit else list(range(rows))  # distinct, below rows
    new = [rows + commit * 1000 + i for i in range(rows // 20)] if commit else []
    df = spark.createDataFrame([(i,) for i in ids + new], "id long")
    return df.select(
        "id",
        F.concat(F.lit(f"v{commit}-"), F.col("id").cast("string")).alias("payload"),
        (F.col("id") % max(partitions, 1)).cast("string").alias("bucket"),
        F.lit(f"{commit:016d}").alias("_cdc_position"),
        F.lit(False).alias("_hoodie_is_deleted"),
    )


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    """A preset name, or NAME=<JSON object of option strings>."""
    if text in PRESETS:
        return text, PRESETS[text]
    name, sep, raw = text.partition("=")
    if not sep or not name or name == BASELINE:
        raise argparse.ArgumentTypeError(f"{text!r}: a preset ({', '.join(PRESETS)}) or NAME='{{json options}}'")
    try:
        options = json.loads(raw)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"{name}: options are not JSON ({e})") from e
    if not isinstance(options, dict) or not all(isinstance(v, str) for v in options.values()):
        raise argparse.ArgumentTypeError(f"{name}: options must be a JSON object of strings")
    return name, options


def summary_line(name: str, first: tuple[float, float], later: list[tuple[float, float]],
                 base: list[tuple[float, float]] | None) -> str:
    wall = statistics.median(w for w, _ in later)
    cpu = statistics.median(c for _, c in later)
    line = f"{name:16s} {first[0]:9.2f} {first[1]:9.2f} {wall:10.2f} {cpu:10.2f}"
    if base is not None:
        base_wall = statistics.median(w for w, _ in base)
        base_cpu = statistics.median(c for _, c in base)
        line += f"   {wall - base_wall:+7.2f} s wall ({(wall / base_wall - 1) * 100:+4.0f}%)"
        line += f" {cpu - base_cpu:+7.2f} CPU-s ({(cpu / base_cpu - 1) * 100:+4.0f}%)"
    return line


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conf", default=str(ROOT / "conf/local.yaml"), help="job config (lake, metastore, spark)")
    parser.add_argument("--lake", help="lake root for the tables (default: <silver_path>/_bench)")
    parser.add_argument("--variant", action="append", type=parse_variant, default=[],
                        help="a preset or NAME='{json options}'; repeatable (default: no-sync)")
    parser.add_argument("--commits", type=int, default=8, help="commits per table after the first (default 8)")
    parser.add_argument("--rows", type=int, default=2000, help="rows of the first commit (default 2000)")
    parser.add_argument("--update-fraction", type=float, default=0.1, help="share of rows each commit updates")
    parser.add_argument("--partitions", type=int, default=0,
                        help="partition the tables by id %% N (0: none); partitioned tables use the record index")
    parser.add_argument("--table-type", default="COPY_ON_WRITE", choices=["COPY_ON_WRITE", "MERGE_ON_READ"])
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    if args.commits < 1:
        sys.exit("--commits: at least 1 commit after the first")
    if not 0 <= args.update_fraction <= 1:
        sys.exit("--update-fraction: between 0 and 1 (each row updated at most once a commit, as the job's batches)")
    variants = dict(args.variant or [parse_variant("no-sync")])
    if args.partitions and any(v.get("hoodie.metadata.enable") == "false" for v in variants.values()):
        sys.exit("a partitioned table's record-level index lives in the metadata table: no variant may turn it off")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s")

    config = load_config(args.conf)
    spark = build_session("bench-commit-options", config.spark, config.metastore)
    spark.sparkContext.setLogLevel("ERROR")
    run = uuid.uuid4().hex[:8]
    lake = args.lake or f"{config.lake.silver_path.rstrip('/')}/_bench/{run}"
    base = HudiTarget(database="bench_commit_options", table="", path="", record_key=("id",),
                      table_type=args.table_type, partition=PartitionSpec("bucket") if args.partitions else None,
                      simple_index_tasks=config.lake.simple_index_tasks)
    options = {BASELINE: {}, **variants}
    targets = {name: dataclasses.replace(base, table=f"t_{run}_{i}", path=f"{lake}/t_{run}_{i}")
               for i, name in enumerate(options)}
    print(f"{args.table_type}, {args.rows} rows first, {args.commits} commits of "
          f"{int(args.rows * args.update_fraction)} updates + {args.rows // 20} inserts, "
          f"partitions={args.partitions or 'none'}, lake={lake.split('/_bench')[0]}")
    for name, extra in options.items():
        print(f"  {name}: {json.dumps(extra) if extra else 'the job options as shipped (app/sink/hudi.py)'}")
    try:
        results = run_commits(spark, args, targets, options, run)
    finally:
        for target in targets.values():
            delete_path(spark, target.path)
        spark.sql(f"drop database if exists {base.database} cascade")

    print(f"\n{'':16s} {'first s':>9s} {'first cpu':>9s} {'median s':>10s} {'median cpu':>10s}   vs baseline")
    for name, values in results.items():
        print(summary_line(name, values[0], values[1:], None if name == BASELINE else results[BASELINE][1:]))
    return 0


def run_commits(
    spark: SparkSession, args: argparse.Namespace, targets: dict[str, HudiTarget], options: dict[str, dict[str, str]],
    run: str,
) -> dict[str, list[tuple[float, float]]]:
    """Each commit's rows once, then written into every table, the tables' order turning round each commit:
    (wall s, JVM CPU-s) per table and commit. Each write gets the options the job sizes to its batch
    (app/sink/hudi.py `sized_options`; `write_silver` adds the simple index's tasks, lake.simple_index_tasks),
    then the variant's."""
    pid = jvm_pid(spark)
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in targets}
    names = list(targets)
    for commit in range(args.commits + 1):
        df = batch(spark, commit, args.rows, args.update_fraction, args.partitions).cache()
        rows = df.count()
        shift = commit % len(names)
        for name in names[shift:] + names[:shift]:
            wall, cpu = time.monotonic(), cpu_s(pid)
            extra = {**sized_options(targets[name], rows), **options[name]}
            write_silver(df, targets[name], commit, run, extra, unique_rows=True)
            results[name].append((time.monotonic() - wall, cpu_s(pid) - cpu))
            print(f"commit {commit:2d} {name:16s} {results[name][-1][0]:6.2f} s {results[name][-1][1]:6.2f} CPU-s",
                  flush=True)
        df.unpersist()
    return results


if __name__ == "__main__":
    sys.exit(main())
