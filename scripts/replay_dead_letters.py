#!/usr/bin/env python3
"""Feed chosen dead letters through the job's batch code again, after a fix; report per record; mark them replayed.

The dead letters (docs/when-things-go-wrong.md "Dead letters") hold each record's bytes as Kafka held them. This
script reads the chosen ones, turns them back into a batch of Kafka records and hands it to the job's own batch
function (app/batch/processor.py, in replay mode: Bronze holds the records already, and the tables take events
below the offsets they committed). The source position orders every event as in a live batch: a replayed change
older than the table's row never overwrites it (Hudi's ordering on `_cdc_position`), and a key deleted later stays
deleted (the delete ledger). A TOASTed value a replayed update left out is filled from the table's row; when the
table has none, the report names the keys to re-snapshot.

Each record's outcome, printed and written to its dead-letter row (`replay_status`, `replay_detail`,
`replayed_at`):
    applied      the table now holds this change (or, for a delete, no row of the key)
    incomplete   the table holds this change, but columns it left out (TOAST placeholders) had no value to take
                 from the table: the report names the key to re-snapshot (the job settles it when the snapshot
                 read arrives)
    superseded   the table holds a newer change of the key, or a later replayed record of it, or the key was
                 deleted later
    failed       the record still cannot be decoded or applied (its error is reported)
Records replayed before (unless they failed) or settled by a re-snapshot are left out unless --again. status.json's
diverged keys are then the keys of the dead letters neither applied, superseded nor resnapshotted.

Stop the job first: it and this script would be two writers of the same Hudi tables. A quarantined table
(docs/when-things-go-wrong.md "Quarantine") is replayed only once its quarantine file is removed.

    python scripts/replay_dead_letters.py --conf conf/local.yaml --table tickit.crm_users
    python scripts/replay_dead_letters.py --conf conf/local.yaml --kind quarantined --dry-run
    python scripts/replay_dead_letters.py --conf conf/local.yaml --topic tickit.crm.users --from-offset 100

Exit status: 0 when every chosen record was applied or superseded, 1 when some failed again or are incomplete, 2
when nothing can be replayed (bad arguments, a quarantined table, no dead-letter table).
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pyspark.sql import functions as F

from app.batch.processor import BatchProcessor
from app.cdc.columns import OFFSET_COL, PARTITION_COL, POSITION_COL
from app.config import load_config
from app.errors import ConfigError
from app.sink.deadletters import (
    APPLIED,
    FAILED,
    INCOMPLETE,
    SUPERSEDED,
    DeadLetters,
    dead_letter_target,
    is_unsettled,
)
from app.sink.hudi import table_exists
from app.sink.lakefs import fs_and_path, read_text, write_text
from app.sink.ledger import ledger_key
from app.sink.quarantine import Quarantine
from app.spark import build_session
from app.state.status import MAX_DIVERGED_KEYS, status_path
from app.wire.registry import RegistryClient
from app.wire.source import KAFKA_SCHEMA

log = logging.getLogger("replay_dead_letters")

@dataclass(frozen=True)
class Selection:
    tables: tuple[str, ...] = ()
    kinds: tuple[str, ...] = ()
    topic: str | None = None
    partition: int | None = None
    from_offset: int | None = None
    to_offset: int | None = None
    again: bool = False


@dataclass(frozen=True)
class Outcome:
    dead_letter_id: str
    table: str
    kind: str
    status: str
    detail: str


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conf", required=True, help="the job's YAML config (conf/local.yaml, conf/prod.yaml)")
    parser.add_argument("--table", action="append", default=[], help="a Silver table, <database>.<table> "
                        "(repeatable; default: every table)")
    parser.add_argument("--kind", action="append", default=[], help="an error kind such as decode, framing, "
                        "unknown_schema_id, quarantined (repeatable; default: every kind)")
    parser.add_argument("--topic", help="only records of this topic")
    parser.add_argument("--partition", type=int, help="only records of this Kafka partition (with --topic)")
    parser.add_argument("--from-offset", type=int, help="only records at or above this offset (with --topic)")
    parser.add_argument("--to-offset", type=int, help="only records at or below this offset (with --topic)")
    parser.add_argument("--again", action="store_true", help="also records replayed before")
    parser.add_argument("--dry-run", action="store_true", help="list the chosen records; write nothing")
    args = parser.parse_args(argv)
    if (args.partition is not None or args.from_offset is not None or args.to_offset is not None) and not args.topic:
        parser.error("--partition, --from-offset and --to-offset need --topic")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    try:
        config = load_config(args.conf)
    except ConfigError as e:
        print(f"replay_dead_letters: {e}", file=sys.stderr)
        return 2
    selection = Selection(tuple(args.table), tuple(args.kind), args.topic, args.partition, args.from_offset,
                          args.to_offset, args.again)
    spark = build_session("cdc-replay-dead-letters", config.spark, config.metastore)
    spark.sparkContext.setLogLevel("WARN")
    try:
        if args.dry_run:
            print(dry_run(spark, config, selection))
            return 0
        outcomes = replay(spark, config, selection)
    except ReplayRefused as e:
        print(f"replay_dead_letters: {e}", file=sys.stderr)
        return 2
    print(report(outcomes))
    return 1 if any(o.status in (FAILED, INCOMPLETE) for o in outcomes) else 0


class ReplayRefused(Exception):
    """Nothing can be replayed: the message says why."""


def chosen(spark: Any, config: Any, selection: Selection) -> Any:
    """The chosen dead-letter rows (a DataFrame)."""

    target = dead_letter_target(config)
    if not table_exists(spark, target.path):
        raise ReplayRefused(f"no dead-letter table at {target.path}")
    rows = spark.read.format("hudi").load(target.path)
    condition = F.lit(True)
    if selection.tables:
        condition &= F.col("source_table").isin(*selection.tables)
    if selection.kinds:
        condition &= F.col("error_kind").isin(*selection.kinds)
    if selection.topic:
        condition &= F.col("topic") == selection.topic
    if selection.partition is not None:
        condition &= F.col("kafka_partition") == selection.partition
    if selection.from_offset is not None:
        condition &= F.col("kafka_offset") >= selection.from_offset
    if selection.to_offset is not None:
        condition &= F.col("kafka_offset") <= selection.to_offset
    if not selection.again and "replay_status" in rows.columns:  # an incomplete one waits for its re-snapshot
        condition &= F.col("replay_status").isNull() | (F.col("replay_status") == FAILED)
    return rows.filter(condition)


def replay(spark: Any, config: Any, selection: Selection) -> list[Outcome]:
    """Replay the chosen dead letters; their outcomes.

    Raises:
        ReplayRefused: no dead-letter table, or a chosen table is still quarantined.
    """
    rows_df = chosen(spark, config, selection).persist()
    letters = _letters(rows_df)
    if not letters:
        print("no dead letters chosen")
        return []
    quarantine = Quarantine(config)
    quarantine.load(spark)
    still = sorted({r["source_table"] for r in letters.values()} & set(quarantine.tables))
    if still:
        files = ", ".join(quarantine.path(*t.split(".", 1)) for t in still)
        raise ReplayRefused(f"still quarantined: {', '.join(still)}; after the fix, remove {files} and run again")
    # The Kafka source's columns, as a micro-batch has them.
    batch_df = rows_df.select(
        F.col("key"), F.col("value"), F.col("topic"), F.col("kafka_partition").alias("partition"),
        F.col("kafka_offset").alias("offset"), F.col("kafka_timestamp").alias("timestamp"),
        F.lit(0).alias("timestampType"), F.col("headers"),
    )
    batch_df = batch_df.select(*[F.col(f.name).cast(f.dataType).alias(f.name) for f in KAFKA_SCHEMA.fields])
    processor = BatchProcessor(config, RegistryClient.from_config(config.registry), replay=True)
    # A batch id of its own (the time), so that the ledger folders and commit metadata of a replay stand apart.
    batch_id = int(time.time())
    spark.sparkContext.setLocalProperty("sql.streaming.queryId", f"replay-{uuid.uuid4()}")
    log.info("replaying %d dead letters as batch %s", len(letters), batch_id)
    processor.process(batch_df, batch_id)
    outcomes = _outcomes(spark, letters, processor.writer.replayed)
    _mark(spark, config, rows_df, outcomes, batch_id)
    rows_df.unpersist()
    settle_status(spark, config)
    return outcomes


def _letters(rows_df: Any) -> dict[str, dict[str, Any]]:
    return {r["dead_letter_id"]: r.asDict() for r in rows_df.select(
        "dead_letter_id", "source_table", "error_kind", "topic", "kafka_partition", "kafka_offset").collect()}


def dry_run(spark: Any, config: Any, selection: Selection) -> str:
    """The chosen records, one line each; nothing replayed."""
    letters = sorted(_letters(chosen(spark, config, selection)).values(), key=_order)
    lines = [f"{x['topic']}[{x['kafka_partition']}]@{x['kafka_offset']}  {x['source_table']}  {x['error_kind']}"
             for x in letters]
    return "\n".join([*lines, f"{len(letters)} dead letters chosen (dry run: nothing replayed)"])


def _order(letter: dict[str, Any]) -> tuple[str, int, int]:
    return letter["topic"], letter["kafka_partition"], letter["kafka_offset"]


def _outcomes(spark: Any, letters: dict[str, dict[str, Any]], replayed: list[Any]) -> list[Outcome]:
    """Each record's outcome from its event's verdict and the table's row of its key after the replay."""

    rows_now: dict[tuple[str, str], dict[str, Any]] = {}
    by_target: dict[str, tuple[Any, set[str]]] = {}
    for event in replayed:
        target, keys = by_target.setdefault(event.target.path, (event.target, set()))
        if event.fields["key"] is not None:
            keys.add(event.fields["key"])
    for path, (target, keys) in by_target.items():
        current = (spark.read.format("hudi").load(path)
                   .select(ledger_key(target.record_key).alias("key"), POSITION_COL, PARTITION_COL, OFFSET_COL)
                   .filter(F.col("key").isin(*sorted(keys))).collect())
        rows_now.update({(path, r["key"]): r.asDict() for r in current})
    verdicts = {f"{e.fields['topic']}/{e.fields['partition']}/{e.fields['offset']}": e for e in replayed}
    outcomes = []
    for dead_letter_id, letter in sorted(letters.items(), key=lambda item: _order(item[1])):
        event = verdicts.get(dead_letter_id)
        status, detail = _verdict(event, rows_now)
        outcomes.append(Outcome(dead_letter_id, letter["source_table"], letter["error_kind"], status, detail))
    return outcomes


def _verdict(event: Any, rows_now: dict[tuple[str, str], dict[str, Any]]) -> tuple[str, str]:
    if event is None:
        return FAILED, "still not a change the job can apply (it went to the dead letters again: see its row)"
    f = event.fields
    if f["error_kind"] is not None:
        return FAILED, f"{f['error_kind']}: {f['error_message']}"
    if not f["latest"]:
        return SUPERSEDED, "a later replayed record of the key"
    if f["blocked"]:
        return SUPERSEDED, "the key was deleted later (delete ledger)"
    row = rows_now.get((event.target.path, f["key"]))
    if row is None:
        return (APPLIED, "the key's row is deleted") if f["delete"] else (SUPERSEDED, "the key was deleted later")
    if (row["_kafka_partition"], row["_kafka_offset"]) == (f["partition"], f["offset"]):
        if f["unavailable"]:
            return INCOMPLETE, (f"columns {', '.join(f['unavailable'])} were not in the event and the table had no "
                             f"value for them: re-snapshot key {f['key']} of {event.target.qualified_name} "
                             "(a Debezium incremental snapshot of that key)")
        return APPLIED, ""
    if row["_cdc_position"] >= f["position"]:
        return SUPERSEDED, f"the table holds a newer change of the key (position {row['_cdc_position']})"
    return FAILED, f"the table's row is older ({row['_cdc_position']}) and was not replaced"


def _mark(spark: Any, config: Any, rows_df: Any, outcomes: list[Outcome], batch_id: int) -> None:
    """Write each outcome to its dead-letter row."""
    marks = spark.createDataFrame([(o.dead_letter_id, o.status, o.detail) for o in outcomes],
                                  "dead_letter_id string, replay_status string, replay_detail string")
    DeadLetters(config).mark(rows_df, marks, batch_id, "replay")


def settle_status(spark: Any, config: Any) -> None:
    """Bring status.json's diverged keys in line with the dead letters: a key stays diverged while one of its dead
    letters is neither applied, superseded nor resnapshotted. (The job rewrites the file after each batch from what
    it holds, which is why it must be stopped during a replay.)"""
    location = status_path(config)
    fs, path = fs_and_path(spark, location)
    if not fs.exists(path):
        return
    status = json.loads(read_text(spark, location))
    pending = (
        spark.read.format("hudi").load(dead_letter_target(config).path)
        .filter(is_unsettled())
        .groupBy("source_table").agg(F.sort_array(F.collect_set("record_key")).alias("keys")).collect()
    )
    keys = {r["source_table"]: list(r["keys"]) for r in pending}
    for table, entry in status.get("dead_letters", {}).items():
        entry["diverged_keys"] = keys.get(table, [])[:MAX_DIVERGED_KEYS]
        entry["diverged_keys_truncated"] = len(keys.get(table, [])) > MAX_DIVERGED_KEYS
    write_text(spark, location, json.dumps(status, indent=2, sort_keys=True))


def report(outcomes: list[Outcome]) -> str:
    lines = [f"{o.dead_letter_id}  {o.table}  {o.kind}  -> {o.status}" + (f": {o.detail}" if o.detail else "")
             for o in outcomes]
    totals = Counter(o.status for o in outcomes)
    lines.append(f"{len(outcomes)} replayed: " + ", ".join(f"{n} {s}" for s, n in sorted(totals.items())))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
