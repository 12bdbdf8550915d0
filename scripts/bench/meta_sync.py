#!/usr/bin/env python3
"""What Hudi's meta sync adds to each commit: the same small upsert commits, with sync on and with it off.

Two tables get the same sequence of commits (the first inserts `--rows` rows, each later one updates
`--update-fraction` of them and inserts a few), written with the job's own options (app/hudi.write_options).
One syncs to the metastore after each commit (HiveSyncTool, hms mode, the session's metastore), the baseline
does not. Writes alternate between the two tables so that warm-up and S3 noise fall on both. The first commit
of each table (creation, catalog registration) is reported apart. Prints per-commit times and the difference.

Needs the local stack (scripts/stack.sh up). The lake is conf/local.yaml's (S3 by default) unless --lake is
given. Usage: .venv/bin/python scripts/bench/meta_sync.py [--commits 8] [--rows 2000] [--partitions 0]
"""
from __future__ import annotations

import argparse
import dataclasses
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
from app.sink.hudi import HudiTarget, write_silver  # noqa: E402
from app.sink.lakefs import delete_path  # noqa: E402
from app.spark import build_session  # noqa: E402

SYNC_OFF = {"hoodie.datasource.meta.sync.enable": "false", "hoodie.datasource.hive_sync.enable": "false"}


def batch(spark: SparkSession, commit: int, rows: int, update_fraction: float, partitions: int) -> DataFrame:
    """Commit 0: ids 0..rows-1. Later commits: a slice of existing ids updated, and rows/20 new ids."""
    updated = int(rows * update_fraction)
    start = (commit * updated) % rows
    ids = list(range(start, start + updated)) if commit else list(range(rows))
    new = [rows + commit * 1000 + i for i in range(rows // 20)] if commit else []
    df = spark.createDataFrame([(i,) for i in ids + new], "id long")
    return df.select(
        "id",
        F.concat(F.lit(f"v{commit}-"), F.col("id").cast("string")).alias("payload"),
        (F.col("id") % max(partitions, 1)).cast("string").alias("bucket"),
        F.lit(f"{commit:016d}").alias("_cdc_position"),
        F.lit(False).alias("_hoodie_is_deleted"),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conf", default=str(ROOT / "conf/local.yaml"), help="job config (lake, metastore, spark)")
    parser.add_argument("--lake", help="lake root for the two tables (default: <silver_path>/_bench)")
    parser.add_argument("--commits", type=int, default=8, help="commits per table after the first (default 8)")
    parser.add_argument("--rows", type=int, default=2000, help="rows of the first commit (default 2000)")
    parser.add_argument("--update-fraction", type=float, default=0.1, help="share of rows each commit updates")
    parser.add_argument("--partitions", type=int, default=0, help="partition the tables by id %% N (0: none)")
    parser.add_argument("--table-type", default="COPY_ON_WRITE", choices=["COPY_ON_WRITE", "MERGE_ON_READ"])
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s")

    config = load_config(args.conf)
    spark = build_session("bench-meta-sync", config.spark, config.metastore)
    spark.sparkContext.setLogLevel("ERROR")
    run = uuid.uuid4().hex[:8]
    lake = args.lake or f"{config.lake.silver_path.rstrip('/')}/_bench/{run}"
    base = HudiTarget(
        database="bench_meta_sync",
        table="",
        path="",
        record_key=("id",),
        table_type=args.table_type,
        partition=PartitionSpec("bucket") if args.partitions else None,
    )
    targets = {
        name: dataclasses.replace(base, table=f"t_{run}_{name}", path=f"{lake}/t_{run}_{name}")
        for name in ("sync", "baseline")
    }
    times: dict[str, list[float]] = {name: [] for name in targets}
    first: dict[str, float] = {}
    try:
        for commit in range(args.commits + 1):
            df = batch(spark, commit, args.rows, args.update_fraction, args.partitions).cache()
            df.count()
            order = list(targets) if commit % 2 == 0 else list(reversed(targets))
            for name in order:
                started = time.monotonic()
                write_silver(df, targets[name], commit, run, None if name == "sync" else SYNC_OFF)
                elapsed = time.monotonic() - started
                if commit == 0:
                    first[name] = elapsed
                else:
                    times[name].append(elapsed)
                print(f"commit {commit:2d} {name:8s} {elapsed:6.2f} s", flush=True)
            df.unpersist()
    finally:
        for target in targets.values():
            delete_path(spark, target.path)
        spark.sql(f"drop database if exists {base.database} cascade")

    print(f"\n{args.table_type}, {args.rows} rows first, {args.commits} commits of "
          f"{int(args.rows * args.update_fraction)} updates + {args.rows // 20} inserts, "
          f"partitions={args.partitions or 'none'}, lake={lake.split('/_bench')[0]}")
    print(f"{'':10s} {'first':>8s} {'median':>8s} {'mean':>8s} {'min':>8s} {'max':>8s}")
    for name, values in times.items():
        print(f"{name:10s} {first[name]:8.2f} {statistics.median(values):8.2f} {statistics.mean(values):8.2f} "
              f"{min(values):8.2f} {max(values):8.2f}")
    delta = statistics.median(times["sync"]) - statistics.median(times["baseline"])
    share = delta / statistics.median(times["sync"]) * 100
    print(f"meta sync per commit (median difference): {delta:+.2f} s ({share:.0f}% of a synced commit)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
