"""Where to start reading when the checkpoint is missing but Silver tables exist.

Spark resumes from its checkpoint. Without one (deleted, a new checkpoint path, a lost bucket), it would start
from `kafka.starting_offsets`: `earliest` re-reads everything, `latest` skips what was not applied yet. Instead,
the job starts each Kafka partition right after the last offset its Silver table committed (the `_cdc.committed`
commit metadata, app/sink/commit.py), read from each table's timeline:

- a partition whose table committed offsets starts at the next offset;
- a partition no table committed (a topic of tombstones only, or a table not written yet) starts at the
  earliest offset Kafka still holds, and is named in the log; Bronze keeps each offset once whatever is re-read
  (app/sink/bronze.py), and Silver ignores what it applied already;
- Silver tables that exist but carry no offsets (written before offsets were recorded) make the job refuse to
  start. The message names the command that starts anyway, `app/main.py --conf <file> --from-starting-offsets`:
  it reads from `kafka.starting_offsets` into the existing tables, where an event older than a row's source
  position never overwrites it.
"""
from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from typing import Any

from pyspark.sql import SparkSession

from app.cdc.columns import LEDGER_FOLDER
from app.config import JobConfig
from app.errors import ResumeError
from app.sink.commit import Committed, last_committed
from app.sink.hudi import table_exists
from app.sink.lakefs import fs_and_path, read_text
from app.spark import jvm_class

log = logging.getLogger(__name__)

EARLIEST = -2  # Spark's startingOffsets JSON: -2 earliest, -1 latest


def checkpoint_has_offsets(spark: SparkSession, checkpoint_path: str) -> bool:
    """Whether Spark has a checkpoint to resume from (its `offsets/` log holds at least one batch)."""
    fs, path = fs_and_path(spark, checkpoint_path.rstrip("/") + "/offsets")
    return bool(fs.exists(path)) and any(s.getPath().getName().isdigit() for s in fs.listStatus(path))


def silver_tables(spark: SparkSession, config: JobConfig) -> list[str]:
    """Paths of the Silver tables of the job's databases (the delete ledgers left out). A folder without a completed
    commit is no table yet (a creation interrupted by a crash, app/sink/creation.py): it holds no offsets to resume
    from, and its next write creates it afresh."""
    tables = []
    for database in config.databases:
        fs, path = fs_and_path(spark, config.lake.table_path("", database))
        if not fs.exists(path):
            continue
        tables += [
            s.getPath().toString() for s in fs.listStatus(path)
            if s.isDirectory() and s.getPath().getName() != LEDGER_FOLDER
            and table_exists(spark, s.getPath().toString())
        ]
    return sorted(tables)


def committed_offsets(spark: SparkSession, tables: list[str]) -> tuple[dict[tuple[str, int], int], list[str]]:
    """The last committed offset per (topic, partition) over the tables, and the tables that record none."""
    last: dict[tuple[str, int], int] = {}
    without: list[str] = []
    for table in tables:
        committed: Committed | None = last_committed(spark, table)
        if committed is None:
            without.append(table)
            continue
        for tp, offset in committed.last.items():
            last[tp] = max(last.get(tp, -1), offset)
    return last, without


def starting_offsets_json(
    partitions: Mapping[str, list[int]], committed: Mapping[tuple[str, int], int]
) -> tuple[str, list[tuple[str, int]]]:
    """Spark's startingOffsets JSON for every partition of the subscribed topics, and the partitions that start
    at the earliest offset because no table committed any of theirs."""
    offsets: dict[str, dict[str, int]] = {}
    from_earliest = []
    for topic in sorted(partitions):
        for partition in sorted(partitions[topic]):
            last = committed.get((topic, partition))
            if last is None:
                from_earliest.append((topic, partition))
            offsets.setdefault(topic, {})[str(partition)] = EARLIEST if last is None else last + 1
    return json.dumps(offsets), from_earliest


def _kafka_admin(spark: SparkSession, config: JobConfig) -> Any:
    """Kafka's admin client in the driver's JVM, with the job's own Kafka options (MSK IAM or SASL settings
    apply); the caller closes it."""
    props = jvm_class(spark, "java.util.Properties")()
    props.setProperty("bootstrap.servers", config.kafka.bootstrap_servers)
    for key, value in config.kafka.options.items():
        props.setProperty(key, value)
    return jvm_class(spark, "org.apache.kafka.clients.admin.AdminClient").create(props)


def kafka_partitions(spark: SparkSession, config: JobConfig) -> dict[str, list[int]]:
    """The partitions of every topic the job subscribes to, from Kafka's admin API."""
    admin = _kafka_admin(spark, config)
    try:
        pattern = re.compile(config.kafka.topic_pattern)
        names = [str(n) for n in admin.listTopics().names().get() if pattern.fullmatch(str(n))]
        if not names:
            return {}
        described = admin.describeTopics(jvm_class(spark, "java.util.ArrayList")(names)).allTopicNames().get()
        return {
            name: sorted(int(p.partition()) for p in described.get(name).partitions()) for name in names
        }
    finally:
        admin.close()


def kafka_end_offsets(
    spark: SparkSession, config: JobConfig, partitions: list[tuple[str, int]]
) -> dict[tuple[str, int], int]:
    """Each partition's end offset now (the offset its next record will get), from Kafka's admin API."""
    if not partitions:
        return {}
    admin = _kafka_admin(spark, config)
    try:
        topic_partition = jvm_class(spark, "org.apache.kafka.common.TopicPartition")
        latest = jvm_class(spark, "org.apache.kafka.clients.admin.OffsetSpec").latest()
        asked = jvm_class(spark, "java.util.HashMap")()
        for topic, partition in partitions:
            asked.put(topic_partition(topic, partition), latest)
        answered = admin.listOffsets(asked).all().get()
        return {(str(tp.topic()), int(tp.partition())): int(answered.get(tp).offset()) for tp in answered.keySet()}
    finally:
        admin.close()


def checkpoint_applied(spark: SparkSession, checkpoint_path: str) -> dict[tuple[str, int], int] | None:
    """The Kafka offsets the job has applied, as its checkpoint records them: the end offsets (exclusive) of the
    newest batch in `commits/` (Spark writes a batch's commit file after the batch function returned, that is after
    every table's commit); None when the checkpoint has no committed batch.

    A batch's file in `offsets/` is `v1`, the batch's metadata, then each source's offsets as JSON; the job's one
    source is Kafka's, {"<topic>": {"<partition>": <end offset>}}.
    """
    root = checkpoint_path.rstrip("/")
    fs, path = fs_and_path(spark, f"{root}/commits")
    if not fs.exists(path):
        return None
    batches = [int(s.getPath().getName()) for s in fs.listStatus(path) if s.getPath().getName().isdigit()]
    if not batches:
        return None
    lines = read_text(spark, f"{root}/offsets/{max(batches)}").splitlines()
    applied: dict[tuple[str, int], int] = {}
    for line in lines[2:]:
        offsets = json.loads(line) if line.strip().startswith("{") else {}
        for topic, parts in offsets.items():
            if isinstance(parts, dict):
                applied.update({(topic, int(p)): int(o) for p, o in parts.items()})
    return applied


def resume_offsets(
    spark: SparkSession, config: JobConfig, conf_file: str = "<conf.yaml>", from_starting_offsets: bool = False
) -> str | None:
    """startingOffsets for a start without a checkpoint over existing tables, or None (Spark's checkpoint, a
    first start, or `from_starting_offsets`: `kafka.starting_offsets`).

    Raises:
        ResumeError: tables exist but record no offsets; the message names the command to run (`conf_file`).
    """
    if checkpoint_has_offsets(spark, config.lake.checkpoint_path):
        if from_starting_offsets:
            log.warning("--from-starting-offsets ignored: the checkpoint %s says where to resume",
                        config.lake.checkpoint_path)
        return None
    if from_starting_offsets:
        log.warning("no checkpoint at %s: reading from kafka.starting_offsets=%s as asked (--from-starting-offsets)",
                    config.lake.checkpoint_path, config.kafka.starting_offsets)
        return None
    tables = silver_tables(spark, config)
    if not tables:
        log.info("no checkpoint and no Silver tables: first start, from %s", config.kafka.starting_offsets)
        return None
    committed, without = committed_offsets(spark, tables)
    if without and not committed:
        raise ResumeError(
            f"the checkpoint {config.lake.checkpoint_path} is missing and the Silver tables {without} record no "
            f"Kafka offsets to resume from. Restore the checkpoint; or read from kafka.starting_offsets="
            f"{config.kafka.starting_offsets} into the existing tables (an event older than a row's source position "
            f"never overwrites it) with: spark-submit app/main.py --conf {conf_file} --from-starting-offsets"
        )
    offsets, from_earliest = starting_offsets_json(kafka_partitions(spark, config), committed)
    log.warning(
        "the checkpoint %s is missing: resuming from the offsets the %d Silver tables committed: %s",
        config.lake.checkpoint_path, len(tables), offsets,
    )
    if from_earliest:
        log.warning(
            "no table committed offsets of %s: those start at the earliest offset Kafka holds (Bronze and "
            "Silver keep each offset once)",
            ", ".join(f"{t}[{p}]" for t, p in from_earliest),
        )
    if without:
        log.warning("Silver tables without offsets in their commits (left as they are): %s", without)
    return offsets
