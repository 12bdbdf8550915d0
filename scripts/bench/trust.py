#!/usr/bin/env python3
"""Verify and rebuild at size: scripts/verify.py on a table of `--rows` rows, and scripts/rebuild.py over its Bronze
records, each against a baseline measured in the same run on the same lake.

    .venv/bin/python scripts/bench/trust.py --rows 1000000 --out .bench/trust

1. A PostgreSQL table of `--rows` rows (id bigint key, tx bigint, v text, qty int) is snapshotted by a Debezium
   connector of its own (scripts/bench/source.py), and the job reads it with `--available-now` into a fresh lake
   (S3, the shipped config): the baseline for the rebuild, the same records written from Kafka.
2. verify compares the table with PostgreSQL (`--settle-s 0`): its own time, against the baseline of reading both
   sides once without comparing (the Silver table's and the source's row count, through the same Spark session
   kind: a fresh process each).
3. The table's folder is removed and scripts/rebuild.py rebuilds it from Bronze (`--force`: the job has ended): time,
   seconds per 100,000 records, against the job's own from Kafka; then verify again (it must be equal).
Each step is its own process, as a user runs it, so every figure includes a JVM start (about 25 s here). What the
run made (schema, connector and its topics, lake folder, catalog database) is removed at the end. Prints the figures
and writes results.json to `--out`. Needs the local stack (scripts/stack.sh up).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import yaml

from app.config import load_config
from scripts.bench.source import BenchSource

ROOT = Path(__file__).resolve().parents[2]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conf", default=str(ROOT / "conf" / "local.yaml"), help="the shipped config to start from")
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows in the table (default 1,000,000)")
    parser.add_argument("--out", default=str(ROOT / ".bench" / "trust"), help="where results.json goes")
    return parser.parse_args(argv)


def timed(command: list[str], env: dict[str, str] | None = None) -> tuple[float, subprocess.CompletedProcess[str]]:
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=ROOT,
                          env={**os.environ, **(env or {})})
    seconds = time.monotonic() - started
    if done.returncode not in (0, 1):
        print(done.stdout[-3000:], done.stderr[-5000:])
        raise RuntimeError(f"{' '.join(command[:3])} exited {done.returncode}")
    return seconds, done


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    base = load_config(args.conf)
    run = uuid.uuid4().hex[:6]
    database, root = f"trust_{run}", f"{base.lake.silver_path.rsplit('/', 1)[0]}/bench-trust-{run}"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    figures: dict[str, Any] = {"rows": args.rows}
    with BenchSource("v", 1, args.rows, base.registry.url, base.kafka.bootstrap_servers) as source:
        conf = out / "trust.yaml"
        raw = source.job_config(args.conf, root, database)
        conf.write_text(yaml.safe_dump(raw))
        table = f"{database}.{source.schema}_t0"
        login = [f"--source={source.prefix}=jdbc:postgresql://127.0.0.1:5432/source", "--user", "postgres",
                 "--password-env", "BENCH_PG_PASSWORD"]
        env = {"BENCH_PG_PASSWORD": source.password}
        try:
            records = source.wait_for_records(args.rows)
            figures["records"] = records
            print(f"{records} records on {source.topics[0]}")
            figures["job_s"], _ = timed([sys.executable, "app/main.py", "--conf", str(conf), "--available-now"])
            print(f"job from Kafka: {figures['job_s']:.1f} s")
            figures["verify_s"], done = timed([sys.executable, "scripts/verify.py", "--conf", str(conf), "--table",
                                               table, "--settle-s", "0", "--json", str(out / "verify.json"), *login],
                                              env)
            report = json.loads((out / "verify.json").read_text())["tables"][table]
            figures["verify_equal"], figures["verify_table_s"] = report["equal"], report["seconds"]
            print(done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-2000:])
            figures["count_s"], done = timed([sys.executable, "-c", COUNT, str(conf), table, str(source.schema)],
                                             env)
            print(f"verify {figures['verify_s']:.1f} s (its table {figures['verify_table_s']:.1f} s); baseline, "
                  f"both sides counted: {figures['count_s']:.1f} s ({done.stdout.strip()})")
            figures["rebuild_s"], done = timed([sys.executable, "scripts/rebuild.py", "--conf", str(conf), "--table",
                                                table, "--replace", "--force", "--json", str(out / "rebuild.json")])
            rebuilt = json.loads((out / "rebuild.json").read_text())
            figures["rebuild_records"], figures["rebuild_batches_s"] = rebuilt["records"], rebuilt["seconds"]
            figures["rebuild_per_100k_s"] = rebuilt["per_100k_s"]
            figures["job_per_100k_s"] = figures["job_s"] / records * 100_000
            print(f"rebuild {figures['rebuild_s']:.1f} s in all, its batches {rebuilt['seconds']:.1f} s: "
                  f"{rebuilt['per_100k_s']:.1f} s per 100,000 Bronze records; the job from Kafka "
                  f"{figures['job_per_100k_s']:.1f} s per 100,000 records (process start included)")
            figures["after_s"], done = timed([sys.executable, "scripts/verify.py", "--conf", str(conf), "--table",
                                              table, "--settle-s", "0", "--json", str(out / "after.json"), *login],
                                             env)
            figures["after_equal"] = json.loads((out / "after.json").read_text())["tables"][table]["equal"]
            print(f"verify after the rebuild: equal={figures['after_equal']} ({figures['after_s']:.1f} s)")
        finally:
            subprocess.run([sys.executable, "-c", CLEAN, str(conf), database, root], cwd=ROOT, check=False,
                           capture_output=True)
    (out / "results.json").write_text(json.dumps(figures, indent=2))
    print(json.dumps(figures, indent=2))
    return 0 if figures.get("verify_equal") and figures.get("after_equal") else 1


# The baseline of verify: both sides read once (a count each), in a process of its own like verify's.
COUNT = """
import os, sys
from app.config import load_config
from app.spark import build_session
conf, table, schema = sys.argv[1:]
config = load_config(conf)
spark = build_session("bench-count", config.spark, config.metastore)
silver = spark.read.format("hudi").load(config.lake.table_path(table.split(".", 1)[1])).count()
source = (spark.read.format("jdbc").option("url", "jdbc:postgresql://127.0.0.1:5432/source")
          .option("user", "postgres").option("password", os.environ["BENCH_PG_PASSWORD"])
          .option("dbtable", f"{schema}.t0").load().count())
print(f"silver {silver} rows, source {source} rows")
"""
CLEAN = """
import sys
from app.config import load_config
from app.sink.lakefs import delete_path
from app.spark import build_session
conf, database, root = sys.argv[1:]
config = load_config(conf)
spark = build_session("bench-clean", config.spark, config.metastore)
spark.sql(f"drop database if exists {database} cascade")
delete_path(spark, root)
"""


if __name__ == "__main__":
    sys.exit(main())
