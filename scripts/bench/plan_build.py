#!/usr/bin/env python3
"""How long the driver takes to build one topic's decode plan, this checkout against the code at `--baseline-ref`.

A batch's plan phase builds, per topic, the chain of DataFrame steps from the Kafka records to the table's typed
change events (app/batch/planner.py `Planner.events_slice`, after the framing columns of `with_source_framings`):
each step is analysed by Spark on the driver, over the whole plan below it, while no Spark job runs. This times
that chain alone, with no action, over the golden records of tests/golden/id4-contentId.json (a PostgreSQL
envelope), `--iterations` times after `--warm-up` untimed ones, in a process per run (a Spark session of its
own, local[1]). The sides alternate (A B B A A B ...); each side's figure is the median of its runs' medians.

The baseline is a git worktree at `--baseline-ref` (default HEAD: what the working tree changes), imported in its
process instead of this checkout's `app`; both must have the functions named above.

Needs no stack: the session's catalog is never touched.
Usage: .venv/bin/python scripts/bench/plan_build.py [--baseline-ref 01568f2] [--runs 3] [--iterations 40]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pyspark.sql import functions as F

# The checkout measured is first on the worker's PYTHONPATH: these are its modules (the result names its `app`).
import app
from app.batch.planner import Planner
from app.config import load_config
from app.routing.route import TableRoute
from app.spark import build_session
from app.wire.framing import Framing, with_source_framings
from app.wire.registry import RegistryClient

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden" / "id4-contentId.json"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--baseline-ref", default="HEAD", help="git ref of the baseline (default HEAD)")
    parser.add_argument("--runs", type=int, default=3, help="processes per side (default 3)")
    parser.add_argument("--iterations", type=int, default=40, help="timed plan builds per process (default 40)")
    parser.add_argument("--warm-up", type=int, default=15, help="untimed plan builds first (default 15)")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)  # one measuring process: the checkout
    args = parser.parse_args()
    if args.worker is not None:
        print(json.dumps(measure(args.worker, args.iterations, args.warm_up)))
        return 0
    return compare(args)


def compare(args: argparse.Namespace) -> int:
    worktree = Path(tempfile.mkdtemp(prefix="bench-plan-baseline-"))
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(worktree), args.baseline_ref],
                   check=True, capture_output=True)
    checkouts = {"head": ROOT, "baseline": worktree}
    medians: dict[str, list[float]] = {"head": [], "baseline": []}
    print(f"one topic's decode plan built {args.iterations} times a process: this checkout against "
          f"{args.baseline_ref}, {args.runs} processes each", flush=True)
    try:
        for run in range(args.runs):
            order = ["head", "baseline"] if run % 2 == 0 else ["baseline", "head"]
            for side in order:
                done = subprocess.run(
                    [sys.executable, __file__, "--worker", str(checkouts[side]), "--iterations", str(args.iterations),
                     "--warm-up", str(args.warm_up)],
                    capture_output=True, text=True, check=False, cwd=ROOT,
                    env={**os.environ, "PYTHONPATH": str(checkouts[side])},
                )
                if done.returncode != 0:
                    print(done.stdout[-2000:] + done.stderr[-4000:], file=sys.stderr)
                    return done.returncode
                result = json.loads(done.stdout.strip().splitlines()[-1])
                medians[side].append(result["median_ms"])
                if Path(result["app"]) != checkouts[side] / "app":
                    print(f"{side} imported {result['app']}, not its checkout's app", file=sys.stderr)
                    return 1
                print(f"  run {run + 1} {side:8s} median {result['median_ms']:.1f} ms, p10 {result['p10_ms']:.1f} ms, "
                      f"p90 {result['p90_ms']:.1f} ms", flush=True)
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(worktree)], check=False)
        shutil.rmtree(worktree, ignore_errors=True)
    head, baseline = statistics.median(medians["head"]), statistics.median(medians["baseline"])
    print(f"plan build: this checkout {head:.1f} ms, baseline {baseline:.1f} ms, "
          f"{baseline / head:.2f}x the baseline's speed")
    return 0


def measure(checkout: Path, iterations: int, warm_up: int) -> dict[str, Any]:
    """In this process: build the plan with the app imported (`checkout`'s), timed."""
    os.environ.setdefault("METASTORE_PASSWORD", "unused")  # conf/local.yaml names it; nothing connects
    config = load_config(checkout / "conf" / "local.yaml")
    conf = {**config.spark.conf, "spark.ui.enabled": "false"}
    # This checkout's jars for both sides (a worktree has no .deps), no class archive: start-up is not timed.
    spark_cfg = dataclasses.replace(config.spark, master="local[1]", conf=conf, jars_dir=str(ROOT / ".deps/spark"),
                                    class_archive=None)
    spark = build_session("bench-plan-build", spark_cfg, config.metastore)
    spark.sparkContext.setLogLevel("ERROR")
    doc = json.loads(GOLDEN.read_text(encoding="utf-8"))
    topic = doc["topic"]
    prefix = topic.split(".")[0]
    value_ref, schema_json = next((ref, text) for ref, text in doc["schemas"].items() if '"Envelope"' in text)
    id_type, schema_id = value_ref.split(":")
    raw = spark.createDataFrame(
        [(topic, r["partition"], r["offset"], None if r["key"] is None else bytes.fromhex(r["key"]),
          None if r["value"] is None else bytes.fromhex(r["value"])) for r in doc["records"]],
        "topic string, partition int, offset long, key binary, value binary",
    )
    planner = Planner(config, RegistryClient.from_config(config.registry))
    route = TableRoute(topic=topic, source_schema="public", source_table="items", database="bench",
                       table="items", record_key=("region", "id"))

    def build() -> None:
        framed = with_source_framings(raw, [(prefix, Framing("id4", id_type))])
        slice_df = framed.filter(F.col("topic") == topic).filter(
            (F.col("value_id_type") == id_type) & (F.col("value_schema_id") == int(schema_id)))
        planner.events_slice(slice_df, schema_json, route, value_ref)

    for _ in range(warm_up):
        build()
    times = []
    for _ in range(iterations):
        started = time.perf_counter()
        build()
        times.append((time.perf_counter() - started) * 1000)
    spark.stop()
    times.sort()
    return {"median_ms": statistics.median(times), "p10_ms": times[len(times) // 10],
            "p90_ms": times[len(times) * 9 // 10], "app": str(Path(app.__file__).parent)}


if __name__ == "__main__":
    sys.exit(main())
