#!/usr/bin/env python3
"""Rebuild Silver tables from Bronze, with the job's own batch code, when Kafka no longer holds their records.

Bronze (app/sink/bronze.py) keeps every Kafka record the job read, in range folders per topic and partition. This
script reads the complete ranges of the topics that feed the chosen tables, oldest first, in batches of about
`--batch-records` records (the next range of every partition taken in turn; a batch closes once it holds that
many, so it holds at most that plus one range), and hands each batch to the job's batch function
(app/batch/processor.py, in rebuild mode: Bronze is not written again). Every event is applied as in a live batch:
ordered by source position, deletes recorded in the delete ledger, undecodable records to the dead letters (which
drop records they hold already). A chosen table quarantined on the way stops the rebuild (exit 1).

Each commit records the Kafka offsets it applied, as the job's do. So once the rebuild has ended, the job goes on
from its checkpoint: what it reads again is at or below those offsets and is skipped; what it reads next follows
them. Bronze holds every record the checkpoint has passed (the job writes Bronze before it commits a batch), so
there is no gap and no double.

While it runs, a marker file `<silver>/<database>/_rebuilding/<table>` stands for each table; the job refuses a
table whose marker stands (app/sink/lost.py), so a rebuild cut short (a kill, a lost node) is never taken for a
whole table: run the same command again with `--resume`, which skips the batches already committed and goes on.

Stop the job first: it and this script would be two writers of the same tables. The script refuses to start while
the job's heartbeat (status.json) is younger than `--alive-s`.

    python scripts/rebuild.py --conf conf/local.yaml --table tickit.crm_users
    python scripts/rebuild.py --conf conf/local.yaml --all --replace
    python scripts/rebuild.py --conf conf/local.yaml --table tickit.crm_users --resume

A table that exists is rebuilt only with `--replace` (its folder is removed first; its delete ledger, facts about
the source, is kept) or `--resume`. A table that the job refuses as lost (the catalog holds it, its folder does not)
needs neither. The report says, per table, the topics and offsets read, rows now in the table, and warns where
Bronze of a partition does not start at offset 0 (the job started after Kafka had dropped records: the rows those
held come back only with a snapshot of the source table).

Exit status: 0 when every chosen table was rebuilt, 1 when a batch failed (run again with --resume after the fix),
2 when nothing was rebuilt (bad arguments, the job alive, a table existing or quarantined, no Bronze for it).
"""
from __future__ import annotations

import argparse
import itertools
import json
import logging
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pyspark.sql import SparkSession

from app.batch.processor import BatchProcessor
from app.config import JobConfig, load_config
from app.errors import ConfigError, EnvelopeError
from app.routing.catalog import all_partition_roots
from app.routing.route import TableRoute, route_topic, skip_reason
from app.sink.bronze import BronzeRange, bronze_partitions, list_ranges, read_folders
from app.sink.hudi import table_exists
from app.sink.lakefs import delete_path, fs_and_path, read_text, write_text
from app.sink.lost import rebuild_marker
from app.sink.quarantine import Quarantine
from app.spark import build_session
from app.state.status import status_path
from app.wire.registry import RegistryClient
from scripts.status import heartbeat_age

log = logging.getLogger("rebuild")


class RebuildRefused(Exception):
    """Nothing is rebuilt: the message says why."""


@dataclass
class TableRebuild:
    """One chosen table: its topics, the Bronze ranges read, and the outcome."""

    table: str
    path: str
    topics: list[str]
    ranges: int = 0
    records: int = 0  # Kafka records read from Bronze (offsets in complete ranges)
    first_offsets: dict[str, int] = field(default_factory=dict)  # "<topic>[<p>]" -> first offset Bronze holds
    gaps: dict[str, list[list[int]]] = field(default_factory=dict)  # offsets between ranges that Bronze lacks
    incomplete: int = 0  # range folders without their marker (a write cut short), not read
    rows: int | None = None  # rows in the table afterwards
    warnings: list[str] = field(default_factory=list)


@dataclass
class RebuildReport:
    tables: list[TableRebuild]
    batches: int = 0
    batches_skipped: int = 0  # already committed (a resumed rebuild)
    records: int = 0
    seconds: float = 0.0

    @property
    def per_100k_s(self) -> float | None:
        return self.seconds / self.records * 100_000 if self.records else None


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conf", required=True, help="the job's YAML config (conf/local.yaml, conf/prod.yaml)")
    parser.add_argument("--table", action="append", default=[], help="a Silver table, <database>.<table> "
                        "(repeatable)")
    parser.add_argument("--all", action="store_true", help="every table Bronze holds topics of")
    parser.add_argument("--replace", action="store_true", help="rebuild tables that exist: their folders are removed "
                        "first")
    parser.add_argument("--resume", action="store_true", help="go on with a rebuild cut short (batches committed "
                        "already are skipped)")
    parser.add_argument("--batch-records", type=int, default=None, metavar="N", help="records per batch (default: "
                        "kafka.max_offsets_per_trigger, else 200000)")
    parser.add_argument("--alive-s", type=float, default=None, metavar="S", help="a job heartbeat younger than "
                        "this means the job runs (default: 3 x recovery.heartbeat_s)")
    parser.add_argument("--force", action="store_true", help="rebuild even though the job's heartbeat is recent")
    parser.add_argument("--dry-run", action="store_true", help="say what would be read; write nothing")
    parser.add_argument("--json", metavar="FILE", help="also write the report as JSON")
    args = parser.parse_args(argv)
    if bool(args.table) == args.all:
        parser.error("name tables with --table, or --all")
    if args.replace and args.resume:
        parser.error("--replace starts over, --resume goes on: not both")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = load_config(args.conf)
    except ConfigError as e:
        print(f"rebuild: {e}", file=sys.stderr)
        return 2
    spark = build_session("cdc-rebuild", config.spark, config.metastore)
    spark.sparkContext.setLogLevel("WARN")
    try:
        chosen = plan_rebuild(spark, config, args)
        print(describe(chosen))
        if args.dry_run:
            print("dry run: nothing written")
            return 0
        check_job_stopped(spark, config, args.alive_s, args.force)
        prepare(spark, config, chosen, replace=args.replace, resume=args.resume)
    except RebuildRefused as e:
        print(f"rebuild: {e}", file=sys.stderr)
        return 2
    batch_records = args.batch_records or config.kafka.max_offsets_per_trigger or 200_000
    report = RebuildReport(chosen)
    try:
        run_batches(spark, config, report, batch_records, args.conf)
    except Exception as e:  # the batch's own log says where; the markers stay, so the job refuses these tables
        log.error("rebuild stopped: %s: %s", type(e).__name__, e)
        print(f"rebuild: a batch failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); the "
              f"tables stay refused by the job; after the fix run again with --resume", file=sys.stderr)
        return 1
    finish(spark, config, report)
    print(summary(report))
    if args.json:
        Path(args.json).write_text(json.dumps(to_json(report), indent=2, sort_keys=True))
    return 0


def plan_rebuild(spark: SparkSession, config: JobConfig, args: argparse.Namespace) -> list[TableRebuild]:
    """The chosen tables with the Bronze topics that feed them (routed as the job routes them).

    Raises:
        RebuildRefused: a named table is fed by no topic Bronze holds.
    """
    roots = all_partition_roots(spark, config)
    routes: dict[str, list[TableRoute]] = {}
    for topic in sorted(bronze_partitions(spark, config.lake.bronze_path)):
        if skip_reason(topic, config) is not None:
            continue
        try:
            route = route_topic(topic, config, roots)
        except EnvelopeError:  # a topic of no configured source (the pattern changed since): not ours to rebuild
            continue
        routes.setdefault(route.qualified_name, []).append(route)
    names = sorted(routes) if args.all else list(dict.fromkeys(args.table))
    unknown = [n for n in names if n not in routes]
    if unknown:
        raise RebuildRefused(f"Bronze ({config.lake.bronze_path}) holds no topic that feeds {', '.join(unknown)}; "
                             f"tables it can rebuild: {', '.join(sorted(routes)) or 'none'}")
    return [TableRebuild(name, config.lake.table_path(routes[name][0].table, routes[name][0].database),
                         sorted(r.topic for r in routes[name])) for name in names]


def describe(chosen: list[TableRebuild]) -> str:
    return "\n".join(f"{t.table}: from Bronze of {', '.join(t.topics)}" for t in chosen)


def check_job_stopped(spark: SparkSession, config: JobConfig, alive_s: float | None, force: bool) -> None:
    """Refuse while the job's heartbeat is recent: two writers of one table race each other.

    Raises:
        RebuildRefused: the heartbeat is younger than `alive_s`, and not `force`.
    """
    location = status_path(config)
    fs, path = fs_and_path(spark, location)
    if force or not fs.exists(path):
        return
    age = heartbeat_age(json.loads(read_text(spark, location)))
    limit = alive_s if alive_s is not None else 3 * config.recovery.heartbeat_s
    if age is not None and age < limit:
        raise RebuildRefused(f"the job looks alive: its heartbeat ({location}) is {age:.0f} s old (under {limit:.0f} "
                             "s); stop it first (or --force when it is stopped for sure)")


def prepare(
    spark: SparkSession, config: JobConfig, chosen: list[TableRebuild], *, replace: bool, resume: bool
) -> None:
    """Check each table may be rebuilt, stand its marker, and with `replace` remove its folder (marker first: a
    kill between the two leaves a table the job refuses, never one it takes for whole).

    Raises:
        RebuildRefused: a table exists (without --replace or --resume), or is quarantined.
    """
    quarantine = Quarantine(config)
    quarantine.load(spark)
    for t in chosen:
        database, table = t.table.split(".", 1)
        if t.table in quarantine.tables:
            raise RebuildRefused(f"{t.table} is quarantined: after the fix, remove {quarantine.path(database, table)} "
                                 "and run again")
        fs, marker = fs_and_path(spark, rebuild_marker(config.lake.silver_path, database, table))
        if table_exists(spark, t.path) and not (replace or resume):
            started = " (a rebuild of it was cut short: --resume)" if fs.exists(marker) else ""
            raise RebuildRefused(f"{t.table} exists at {t.path}{started}; --replace removes it and rebuilds it")
    for t in chosen:
        database, table = t.table.split(".", 1)
        location = rebuild_marker(config.lake.silver_path, database, table)
        fs, marker = fs_and_path(spark, location)
        state = json.loads(read_text(spark, location)) if resume and fs.exists(marker) else {
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "topics": t.topics,
            "replace": replace, "removed": False}
        write_text(spark, location, json.dumps(state))
        # A --replace cut short before its folder was removed removes it on --resume: never the old table kept.
        if state.get("replace") and not state.get("removed"):
            if delete_path(spark, t.path):
                log.info("%s: removed %s (--replace)", t.table, t.path)
            write_text(spark, location, json.dumps({**state, "removed": True}))


def batches_of(ranges: dict[tuple[str, int], list[BronzeRange]], batch_records: int) -> list[list[BronzeRange]]:
    """The ranges in batches: rounds take the next range of every partition in turn, and a batch closes once it
    holds `batch_records` records or more (so it holds at most that plus one range); within a partition ranges stay
    in offset order, one batch after another."""
    queues = {tp: list(rs) for tp, rs in sorted(ranges.items())}
    batches: list[list[BronzeRange]] = []
    current: list[BronzeRange] = []
    size = 0
    while any(queues.values()):
        for tp in sorted(queues):
            if queues[tp]:
                r = queues[tp].pop(0)
                current.append(r)
                size += r.last - r.first + 1
                if size >= batch_records:
                    batches.append(current)
                    current, size = [], 0
    if current:
        batches.append(current)
    return batches


def gaps_of(ranges: list[BronzeRange]) -> list[list[int]]:
    """Offsets between consecutive ranges that no range holds (Kafka leaves some: transaction markers, compaction)."""
    return [[a.last + 1, b.first - 1] for a, b in itertools.pairwise(ranges) if b.first > a.last + 1]


def run_batches(spark: SparkSession, config: JobConfig, report: RebuildReport, batch_records: int, conf: str) -> None:
    bronze = config.lake.bronze_path
    ranges: dict[tuple[str, int], list[BronzeRange]] = {}
    partitions = bronze_partitions(spark, bronze)
    for t in report.tables:
        for topic in t.topics:
            for partition in partitions.get(topic, []):
                found = list_ranges(spark, bronze, topic, partition)
                complete = [r for r in found if r.complete]
                t.incomplete += len(found) - len(complete)
                if not complete:
                    continue
                ranges[(topic, partition)] = complete
                name = f"{topic}[{partition}]"
                t.first_offsets[name] = complete[0].first
                if complete[0].first > 0:
                    t.warnings.append(
                        f"Bronze of {name} starts at offset {complete[0].first}: the records before it were never "
                        "read by the job (it started after Kafka had dropped them); rows only they held come back "
                        "with a snapshot of the source table")
                if gaps := gaps_of(complete):
                    t.gaps[name] = gaps
                t.ranges += len(complete)
                t.records += sum(r.last - r.first + 1 for r in complete)
    batches = batches_of(ranges, batch_records)
    processor = BatchProcessor(config, RegistryClient.from_config(config.registry), rebuild=True)
    processor.writer.conf_file = conf
    spark.sparkContext.setLocalProperty("sql.streaming.queryId", f"rebuild-{uuid.uuid4()}")
    started = time.monotonic()
    for n, batch in enumerate(batches):
        records = sum(r.last - r.first + 1 for r in batch)
        batch_df = read_folders(spark, bronze, [r.folder(bronze) for r in batch])
        processor.last_stats = {}
        processor.process(batch_df, n)
        quarantined = sorted(set(processor.quarantine.tables) & {t.table for t in report.tables})
        if quarantined:  # its records went to the dead letters: not a rebuilt table
            raise RuntimeError(f"quarantined during the rebuild: {', '.join(quarantined)} (the batch's log says why)")
        report.batches += 1
        report.records += records
        stats = processor.last_stats.values()
        if stats and all(s.replayed == s.rows_in for s in stats):
            report.batches_skipped += 1
        elapsed = time.monotonic() - started
        log.info("rebuild batch %d of %d: %d records (%d ranges) in %.1f s; %d records so far, %.0f records/s",
                 n + 1, len(batches), records, len(batch), elapsed - report.seconds, report.records,
                 report.records / elapsed if elapsed else 0)
        report.seconds = elapsed


def finish(spark: SparkSession, config: JobConfig, report: RebuildReport) -> None:
    """Count each table's rows, then take its marker down: from here on the job writes it."""
    for t in report.tables:
        database, table = t.table.split(".", 1)
        if table_exists(spark, t.path):
            t.rows = spark.read.format("hudi").load(t.path).count()
        else:
            t.warnings.append("no table was written: Bronze holds no event of it with a record key")
        delete_path(spark, rebuild_marker(config.lake.silver_path, database, table))


def summary(report: RebuildReport) -> str:
    lines = []
    for t in report.tables:
        lines.append(f"{t.table}: {t.records} records from {t.ranges} Bronze ranges of {', '.join(t.topics)} "
                     f"(first offsets {', '.join(f'{k}@{v}' for k, v in sorted(t.first_offsets.items())) or 'none'}); "
                     f"rows now {t.rows}")
        for name, gaps in sorted(t.gaps.items()):
            lines.append(f"  {name}: offsets no range holds (Kafka's own gaps, or lost Bronze folders): "
                         + ", ".join(f"{a}-{b}" for a, b in gaps[:10]) + (" ..." if len(gaps) > 10 else ""))
        if t.incomplete:
            lines.append(f"  {t.incomplete} incomplete range folders (a Bronze write cut short) not read")
        lines += [f"  WARNING: {w}" for w in t.warnings]
    per = report.per_100k_s
    lines.append(f"{report.records} records in {report.batches} batches ({report.batches_skipped} committed "
                 f"already) in {report.seconds:.1f} s" + (f", {per:.1f} s per 100,000 records" if per else ""))
    return "\n".join(lines)


def to_json(report: RebuildReport) -> dict[str, Any]:
    return {**asdict(report), "per_100k_s": report.per_100k_s}


if __name__ == "__main__":
    sys.exit(main())
