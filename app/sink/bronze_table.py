"""Bronze in the catalog: `<lake.database>.<lake.bronze_table>` (when set, e.g. `cdc_bronze`), a Parquet table over the
Bronze folders whose partitions, `(topic, partition, offsets)`, are Bronze's complete range folders
(app/sink/bronze.py). A partition is registered only once its folder's `_SUCCESS` marker is written, and a reader
(Spark SQL, Athena, Hive, Trino through the Hive metastore or Glue) reads only registered partitions: it sees
complete ranges only, each record once.

    SELECT topic, `partition`, `offset`, `timestamp`, key, value FROM tickit.cdc_bronze
    WHERE topic = 'tickit.crm.users' AND `offset` >= 1000

Registration, one `ALTER TABLE ... ADD IF NOT EXISTS PARTITION ...` statement for the ranges at hand:
- after each batch's Silver tables are committed: the ranges its Bronze write published; at a query's end, what is
  left;
- at start (`BronzeTable.repair`): the table is created when missing, and every complete range not registered is:
  what a kill between a marker and its registration left (also below registered ranges: a statement partly
  applied), or Bronze written before the table existed (the first start after an upgrade registers all of it).
  Each partition's folder is listed once, and only unregistered folders get their marker looked up.
File states: a folder without its marker is never registered (and may be removed by the next Bronze write); a
complete folder is never removed, so a registered partition always points at a whole range. A kill after the marker
and before the registration leaves a complete range unregistered until the next start: readers miss it for that
long, never see a part of it. A registration that fails (the metastore out of reach) logs a WARNING and is tried
again after the next batch; it never fails a batch.

Off by default (`lake.bronze_table` empty): each registration is a metastore statement on the batch's thread, and
each start lists the table's partitions. The table is external: dropping it leaves Bronze as it is, and the next
start creates and fills it again.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from py4j.protocol import Py4JError
from pyspark.sql import SparkSession
from pyspark.sql.utils import CapturedException

from app.config import JobConfig
from app.sink.bronze import BronzeRange, TopicPartition, bronze_partitions, list_ranges
from app.wire.source import KAFKA_SCHEMA

log = logging.getLogger(__name__)

PARTITION_COLUMNS = ("topic", "partition", "offsets")


def _quoted(name: str) -> str:
    return f"`{name}`"


class BronzeTable:
    """The catalog table over one job's Bronze (module docstring); `enabled` unless `lake.bronze_table` is empty."""

    def __init__(self, config: JobConfig) -> None:
        self.database = config.lake.database
        self.table = config.lake.bronze_table
        self.bronze_path = config.lake.bronze_path.rstrip("/")
        self.pending: list[BronzeRange] = []  # published, not registered yet

    @property
    def enabled(self) -> bool:
        return bool(self.table)

    @property
    def name(self) -> str:
        return f"{_quoted(self.database)}.{_quoted(self.table)}"

    def create(self, spark: SparkSession) -> None:
        """The table (and its database), when missing."""
        columns = ", ".join(f"{_quoted(f.name)} {f.dataType.simpleString()}" for f in KAFKA_SCHEMA.fields
                            if f.name not in PARTITION_COLUMNS)
        spark.sql(f"CREATE DATABASE IF NOT EXISTS {_quoted(self.database)}")
        spark.sql(
            f"CREATE TABLE IF NOT EXISTS {self.name} ({columns}, `topic` string, `partition` int, `offsets` string) "
            f"USING parquet PARTITIONED BY (`topic`, `partition`, `offsets`) LOCATION '{self.bronze_path}'"
        )

    def registered(self, spark: SparkSession) -> set[str]:
        """The names of the registered partitions (`topic=<t>/partition=<p>/offsets=<first>-<last>`)."""
        external = spark._jsparkSession.sharedState().externalCatalog()
        none = spark._jvm.scala.Option.empty()  # type: ignore[union-attr]
        names = external.listPartitionNames(self.database, self.table, none)
        return {str(names.apply(i)) for i in range(names.size())}

    def repair(self, spark: SparkSession) -> int:
        """At start: create the table when missing, register every complete range not registered yet (each
        partition's folder listed once; only unregistered folders get their marker looked up); the number
        registered."""
        if not self.enabled:
            return 0
        self.register_pending(spark)
        self.create(spark)
        registered = self.registered(spark)
        missing = []
        for topic, partitions in sorted(bronze_partitions(spark, self.bronze_path).items()):
            for partition in partitions:
                def held(first: int, last: int, topic: str = topic, partition: int = partition) -> bool:
                    return _name(topic, partition, first, last) in registered

                missing += [r for r in list_ranges(spark, self.bronze_path, topic, partition, skip=held)
                            if r.complete]
        self._register(spark, missing)
        if missing:
            log.info("bronze table %s.%s: %d complete ranges registered at start", self.database, self.table,
                     len(missing))
        return len(missing)

    def published(self, written: Mapping[TopicPartition, tuple[int, int]]) -> None:
        """The ranges a batch's Bronze write published, to register after its tables (`register_pending`)."""
        if self.enabled:
            self.pending += [BronzeRange(t, p, first, last) for (t, p), (first, last) in sorted(written.items())]

    def register_pending(self, spark: SparkSession) -> None:
        """Register the ranges published so far (after a batch, at a query's end); a failure is logged and left to
        the next call. On the batch's own thread: py4j calls from a thread of its own inside a foreachBatch callback
        broke the callback's connection."""
        ranges, self.pending = self.pending, []
        if not ranges:
            return
        try:
            self._register(spark, ranges)
        except (Py4JError, CapturedException) as e:
            self.pending = ranges + self.pending
            log.warning("bronze table %s.%s: %d ranges not registered yet (tried again after the next batch, and at "
                        "the next start): %s", self.database, self.table, len(ranges),
                        str(e).splitlines()[0] if str(e) else type(e).__name__)

    def _register(self, spark: SparkSession, ranges: Iterable[BronzeRange]) -> None:
        clauses = [
            f"PARTITION (`topic`='{r.topic}', `partition`={r.partition}, `offsets`='{r.first:020d}-{r.last:020d}') "
            f"LOCATION '{r.folder(self.bronze_path)}'"
            for r in ranges
        ]
        for start in range(0, len(clauses), 500):  # one statement per 500 ranges
            spark.sql(f"ALTER TABLE {self.name} ADD IF NOT EXISTS " + " ".join(clauses[start:start + 500]))


def _name(topic: str, partition: int, first: int, last: int) -> str:
    """A range's partition name as the catalog lists it."""
    return f"topic={topic}/partition={partition}/offsets={first:020d}-{last:020d}"
