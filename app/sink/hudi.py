"""Silver: Hudi upserts and deletes for one table, synced to the metastore by Hudi's meta sync."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType

from app.cdc.columns import DELETED_COL, KEY_LENGTHS_COL, LEDGER_FOLDER, POSITION_COL
from app.config import LakeConfig, PartitionSpec
from app.sink.creation import repair_interrupted_creation
from app.sink.lakefs import fs_and_path, list_files
from app.spark import jvm_class, with_options

log = logging.getLogger(__name__)

COMMIT_META_PREFIX = "_cdc."  # hoodie.datasource.write.commitmeta.key.prefix: copied into commit metadata
HISTORY_MERGE_FILES = 2  # hoodie.timeline.compaction.batch.size (table_service_options)


@dataclass(frozen=True)
class HudiTarget:
    """Where and how one Silver table is written."""

    database: str
    table: str
    path: str
    record_key: tuple[str, ...]
    table_type: str = "COPY_ON_WRITE"
    delete_mode: str = "hard"
    partition: PartitionSpec | None = None
    compaction_delta_commits: int = 3  # Merge-on-Read only
    retain_commits: int = 10
    clean_every_commits: int = 5
    metadata_table: bool = False  # partitioned tables always have one (their record-level index)
    key_lengths: bool = False  # Hudi's record key also holds KEY_LENGTHS_COL (key_lengths_needed)
    small_file_limit_bytes: int = 100 * 1024 * 1024  # hoodie.parquet.small.file.limit: files below it take inserts
    # lake.simple_index_tasks: a non-partitioned table's simple index in at most this many tasks (index_options);
    # None: the session's cores; 0: Hudi's default, a task per base file
    simple_index_tasks: int | None = None

    @property
    def key_fields(self) -> tuple[str, ...]:
        """The fields Hudi builds the record key's text from: the record key, and KEY_LENGTHS_COL if it has one."""
        return self.record_key + ((KEY_LENGTHS_COL,) if self.key_lengths else ())

    @property
    def qualified_name(self) -> str:
        return f"{self.database}.{self.table}"

    @property
    def ledger_path(self) -> str:
        """The folder of this table's hard-delete ledger (app/sink/ledger.py): beside it, never in the catalog."""
        parent, _, name = self.path.rstrip("/").rpartition("/")
        return f"{parent}/{LEDGER_FOLDER}/{name}"


def lake_target(
    lake: LakeConfig, table: str, record_key: tuple[str, ...], *, database: str | None = None, **settings: Any
) -> HudiTarget:
    """A table of the lake: its path in `lake`, the lake-wide settings (retention, the cleaner's frequency, small
    files, the metadata table, the simple index's tasks) from `lake`, and the table's own `settings` (HudiTarget's
    fields: type, delete mode, partition, compaction)."""
    return HudiTarget(
        database=database or lake.database,
        table=table,
        path=lake.table_path(table, database),
        record_key=record_key,
        retain_commits=lake.retain_commits,
        clean_every_commits=lake.clean_every_commits,
        small_file_limit_bytes=lake.small_file_bytes,
        metadata_table=lake.metadata_table == "all",
        simple_index_tasks=lake.simple_index_tasks,
        **settings,
    )


def write_options(target: HudiTarget, batch_id: int, query_id: str) -> dict[str, str]:
    """Hudi datasource options for an upsert batch carrying deletes as `_hoodie_is_deleted` rows."""
    return {
        "hoodie.table.name": target.table,
        "hoodie.datasource.write.table.name": target.table,
        "hoodie.datasource.write.table.type": target.table_type,
        "hoodie.datasource.write.operation": "upsert",
        "hoodie.datasource.write.recordkey.field": ",".join(target.key_fields),
        **layout_options(target),
        # An older event never overwrites a newer one: the merge compares the source position (a string that
        # sorts in source order, app/cdc/position.py).
        "hoodie.datasource.write.precombine.field": POSITION_COL,
        "hoodie.write.record.merge.mode": "EVENT_TIME_ORDERING",
        "hoodie.datasource.write.payload.class": "org.apache.hudi.common.model.DefaultHoodieRecordPayload",
        # A batch written with an older writer schema than the table's fills the newer columns with null.
        "hoodie.write.set.null.for.missing.columns": "true",
        "hoodie.datasource.write.reconcile.schema": "false",
        # A batch's inserts go into the table's base files smaller than this (Hudi's small-file handling), which a
        # Copy-on-Write commit then rewrites whole; a larger one is left to its updates.
        "hoodie.parquet.small.file.limit": str(target.small_file_limit_bytes),
        # No Hudi bloom filter of the record keys in each base file's footer: only a bloom index reads it, and no
        # table has one (layout_options). By default a filter sized for 60,000 keys (some 330 KB, whatever the rows)
        # is built and written with every base file, and parsed with its footer at every read.
        "hoodie.parquet.bloom.filter.enabled": "false",
        **table_service_options(target),
        # After each commit Hudi's HiveSyncTool brings the catalog up to date (a column added upstream, a new
        # table). hms mode without metastore URIs opens the metastore the session's Hive client names
        # (javax.jdo.option.ConnectionURL); on EMR the cluster's Hive client, pointed at Glue, is that metastore.
        **meta_sync_options(target),
        "hoodie.datasource.write.commitmeta.key.prefix": COMMIT_META_PREFIX,
        f"{COMMIT_META_PREFIX}batch_id": str(batch_id),
        f"{COMMIT_META_PREFIX}query_id": query_id,
    }


def layout_options(target: HudiTarget) -> dict[str, str]:
    """Key generator, partition path and index.

    A non-partitioned table needs no global index: every key lives in the one partition, and the default
    (simple) index finds it. Nor does it need the metadata table (`metadata_table` keeps one): Hudi lists its one
    folder instead, and a commit skips the metadata table's own commit, about 40% of a small commit's CPU. Turned
    off on a table that has one, Hudi deletes it at the next write.

    A partitioned table uses the record-level index (a key -> file-group map in the metadata table), which is
    global: a row's partition value can change (an update moving it to another day), an older redelivered event can
    still carry the old value, and a key-only delete image carries none. The index finds the row's current file
    group in every case; with `update.partition.path` a newer event that changes the value moves the row (delete in
    the old partition, insert in the new one), and an older one is merged into the current row by position, where it
    loses. Looking a key up costs the same however many partitions and files the table has, unlike GLOBAL_SIMPLE
    (joins the batch with every base file's keys) or GLOBAL_BLOOM (probes every partition's bloom filters).
    """
    spec = target.partition
    if spec is None:
        # This generator also handles composite keys.
        return {
            "hoodie.datasource.write.keygenerator.class": "org.apache.hudi.keygen.NonpartitionedKeyGenerator",
            "hoodie.datasource.write.partitionpath.field": "",
            "hoodie.metadata.enable": str(target.metadata_table).lower(),
        }
    # One key column: SimpleKeyGenerator (Hudi 0.14.1-1.0.x changed how ComplexKeyGenerator encodes one field).
    generator = "SimpleKeyGenerator" if len(target.key_fields) == 1 else "ComplexKeyGenerator"
    return {
        "hoodie.datasource.write.keygenerator.class": f"org.apache.hudi.keygen.{generator}",
        "hoodie.datasource.write.partitionpath.field": spec.field,
        "hoodie.datasource.write.hive_style_partitioning": "true",
        "hoodie.metadata.enable": "true",
        "hoodie.metadata.record.index.enable": "true",
        "hoodie.index.type": "RECORD_INDEX",
        "hoodie.record.index.update.partition.path": "true",
    }


def table_service_options(target: HudiTarget) -> dict[str, str]:
    """Compaction (Merge-on-Read), cleaning and archival, all inline: foreachBatch writes have no async table
    services. A long-running job must clean (or every file version stays on S3) and archive (or the timeline,
    listed by every write and read, grows without end)."""
    retain = target.retain_commits
    options = {
        "hoodie.clean.automatic": "true",
        "hoodie.clean.policy": "KEEP_LATEST_COMMITS",
        "hoodie.clean.commits.retained": str(retain),
        # Scheduled once this many commits have passed since the last clean, not after each one.
        "hoodie.clean.trigger.max.commits": str(target.clean_every_commits),
        # Archival keeps more instants than the cleaner retains (Hudi requires it).
        "hoodie.archive.automatic": "true",
        "hoodie.keep.min.commits": str(retain + 10),
        "hoodie.keep.max.commits": str(retain + 20),
        # Each archival adds a file to the timeline's history (Hudi's LSM timeline), and Hudi 1.0.2 reads every
        # history file of the last three days whenever it builds a file-system view: three times a commit, each file
        # a Parquet read that first parses Hadoop's default XML files. Hudi merges a layer's files once it holds
        # this many (10 by default, up to 9 a layer); at 2 a layer holds at most one, so a long-running stream reads
        # about log2(archivals) files, not a number that climbs back to nine after every merge (docs/performance.md).
        "hoodie.timeline.compaction.batch.size": str(HISTORY_MERGE_FILES),
    }
    if target.table_type == "MERGE_ON_READ":
        options.update({
            "hoodie.compact.inline": "true",
            "hoodie.compact.inline.trigger.strategy": "NUM_COMMITS",
            "hoodie.compact.inline.max.delta.commits": str(target.compaction_delta_commits),
        })
    return options


def meta_sync_options(target: HudiTarget) -> dict[str, str]:
    """Hudi meta sync into the session's Hive metastore (or Glue through it). A Merge-on-Read table appears as
    `<table>_ro` (read-optimized: compacted base files only), `<table>_rt` (snapshot: logs merged) and, with Hudi
    1.0's default `hoodie.meta.sync.sync_snapshot_with_table_name=true`, `<table>` (the snapshot again)."""
    spec = target.partition
    return {
        "hoodie.datasource.meta.sync.enable": "true",
        "hoodie.datasource.hive_sync.enable": "true",
        "hoodie.datasource.hive_sync.mode": "hms",
        "hoodie.datasource.hive_sync.database": target.database,
        "hoodie.datasource.hive_sync.table": target.table,
        "hoodie.datasource.hive_sync.auto_create_database": "true",
        "hoodie.datasource.hive_sync.partition_fields": "" if spec is None else spec.field,
        "hoodie.datasource.hive_sync.partition_extractor_class": (
            "org.apache.hudi.hive.NonPartitionedExtractor" if spec is None
            else "org.apache.hudi.hive.MultiPartKeysValueExtractor"
        ),
    }


RECONCILE_ROWS_PER_TASK = 25_000


def sized_options(target: HudiTarget, rows: int) -> dict[str, str]:
    """A partitioned table's record-level index reconciles the batch's keys with their current locations in
    `hoodie.global.index.reconcile.parallelism` tasks, 60 by default whatever the batch: one task per 25,000 rows
    written (2 to 60) costs a small commit about a quarter less CPU (docs/performance.md)."""
    if target.partition is None:
        return {}
    tasks = min(60, max(2, -(-rows // RECONCILE_ROWS_PER_TASK)))
    return {"hoodie.global.index.reconcile.parallelism": str(tasks)}


def index_options(target: HudiTarget, spark: SparkSession) -> dict[str, str]:
    """A non-partitioned table's simple index reads the keys of every base file, one task per file by default, and
    joins them with the batch's keys in as many tasks, each sizing its share of the table's keys as it goes. At most
    `target.simple_index_tasks` (lake.simple_index_tasks; unset: the session's cores, Spark's default parallelism;
    0: Hudi's default): a table of many small files otherwise starts a task per file, twice, at every commit
    (docs/performance.md). Every write of a table through the job gets it (`write_silver`, the dead letters')."""
    if target.partition is not None:
        return {}
    tasks = spark.sparkContext.defaultParallelism if target.simple_index_tasks is None else target.simple_index_tasks
    return {"hoodie.simple.index.parallelism": str(tasks)} if tasks > 0 else {}


# For an upsert whose input holds one row per record key: no de-duplication by Hudi first (it merges each row with
# the table's by `precombine.field` all the same). About a tenth of a small commit's time (docs/performance.md).
UNIQUE_ROWS = {"hoodie.combine.before.upsert": "false"}
# A new table's first commit (write_silver `first_rows`): Hudi's bulk insert writes the rows as they come, with no
# index look-up and no workload profile, each a Spark job of an upsert (docs/performance.md). Not its row writer:
# with it a rebuilt table's array columns differed from the source, and an empty text key was refused as none;
# through Hudi's records, keys and files are an upsert's.
BULK_INSERT = {"hoodie.datasource.write.operation": "bulk_insert", "hoodie.bulkinsert.sort.mode": "NONE",
               "hoodie.datasource.write.row.writer.enable": "false"}
SYNC_OFF = {"hoodie.datasource.meta.sync.enable": "false", "hoodie.datasource.hive_sync.enable": "false"}


def sync_properties(target: HudiTarget, spark_version: str, schema_length_threshold: str) -> dict[str, str]:
    """What Hudi's meta sync reads for the table, as a write hands it over (HoodieSparkSqlWriter.metaSync)."""
    return {
        **write_options(target, -1, "sync"),
        "hoodie.datasource.hive_sync.schema_string_length_thresh": schema_length_threshold,
        "hoodie.meta_sync.spark.version": spark_version,
        "hoodie.meta.sync.metadata_file_listing": str(
            target.partition is not None or target.metadata_table).lower(),
    }


def catalog_tables(target: HudiTarget) -> list[str]:
    """The catalog tables meta sync keeps for the table: itself; for Merge-on-Read also `_ro` and `_rt`."""
    if target.table_type == "MERGE_ON_READ":
        return [target.table, f"{target.table}_ro", f"{target.table}_rt"]
    return [target.table]


def write_silver(
    rows_df: DataFrame, target: HudiTarget, batch_id: int, query_id: str, extra: dict[str, str] | None = None, *,
    unique_rows: bool = False, first_rows: int = 0,
) -> bool:
    """Upsert the batch's latest row per key (deletes flagged in `_hoodie_is_deleted`) into the table; a table
    whose creation was interrupted is created afresh first (app/sink/creation.py). `unique_rows`: the caller
    guarantees one row per record key (the job's batches: app/cdc/unwrap.py `with_latest_flag`), so Hudi's own
    de-duplication of the input before the upsert (a shuffle of every row by key) is skipped (UNIQUE_ROWS); what
    rows sharing a key would then leave is undefined (both kept, or either one).

    `first_rows`: with `unique_rows`, how many of the rows are not deletes (0: unknown). When that is some and the
    table has no completed commit yet, the write is its first commit, made by Hudi's bulk insert (BULK_INSERT) of
    those rows: an empty table holds nothing to delete or merge with. A partitioned table is upserted all the same
    (its record-level index is kept by the upsert's commit). Returns whether the write was a bulk insert.

    Raises:
        SinkWriteError: the table's folder holds data but no table properties.
    """
    if DELETED_COL not in rows_df.columns or POSITION_COL not in rows_df.columns:
        raise ValueError(f"{target.qualified_name}: rows lack {DELETED_COL}/{POSITION_COL}")
    if target.key_lengths:
        rows_df = with_key_lengths(rows_df, target.record_key)
    spark = rows_df.sparkSession
    repair_interrupted_creation(spark, target.path, target.qualified_name)
    options = {**write_options(target, batch_id, query_id), **index_options(target, spark),
               **(UNIQUE_ROWS if unique_rows else {}), **(extra or {})}
    bulk = unique_rows and first_rows > 0 and target.partition is None and not table_exists(spark, target.path)
    if bulk:
        log.info("batch=%s table=%s: its first commit, a bulk insert of its rows (%d upserts, deletes dropped)",
                 batch_id, target.qualified_name, first_rows)
        rows_df, options = rows_df.filter(~F.col(DELETED_COL)), {**options, **BULK_INSERT}
    with_options(rows_df.write.format("hudi"), options).mode("append").save(target.path)
    return bulk


def key_lengths_needed(target: HudiTarget, events_df: DataFrame) -> bool:
    """Whether the table's Hudi record key holds KEY_LENGTHS_COL beside its key columns: as the table was created,
    else (a new table) when its record key has several columns, one of them text.

    Hudi's composite key text is `column:value` pairs joined by commas, the values unescaped (KeyGenUtils), so two
    keys whose text values hold those separators can have one text: on columns (a, b), ('x,b:y', 'z') and
    ('x', 'y,b:z') are both `a:x,b:y,b:z`, and the upsert would merge the two rows into one. With each text value's
    length as the key's last field, the text parses one way only. Other types' text (numbers, dates, hexadecimal
    bytes) holds no comma. An existing table keeps the key it was created with (Hudi refuses another). Left: a key
    of two or more array, map or record columns (Avro's text of them is not escaped either).
    """
    if len(target.record_key) < 2:
        return False
    layout = recorded_layout(events_df.sparkSession, target.path)
    if layout is not None and layout.record_key is not None:
        return layout.key_lengths
    types = {f.name: f.dataType for f in events_df.schema.fields}
    return any(isinstance(types.get(c), StringType) for c in target.record_key)


def with_key_lengths(rows_df: DataFrame, key_columns: tuple[str, ...]) -> DataFrame:
    """KEY_LENGTHS_COL: each key column's length in characters, dot-separated in key order; -1 for a null, and
    nothing in the place of a column that is not text (e.g. `3..-1`)."""
    types = {f.name: f.dataType for f in rows_df.schema.fields}
    lengths = [
        F.coalesce(F.length(F.col(c)).cast("string"), F.lit("-1")) if isinstance(types[c], StringType) else F.lit("")
        for c in key_columns
    ]
    return rows_df.withColumn(KEY_LENGTHS_COL, F.concat_ws(".", *lengths))


def table_exists(spark: SparkSession, path: str) -> bool:
    """Whether a Hudi table at path has a completed commit (local or any Hadoop file system, s3a included).

    A table whose first commit failed has a `.hoodie` folder but nothing to read yet. Hudi 1.x names a
    completed instant `<begin>_<end>.<action>` in `.hoodie/timeline/`.
    """
    completed = jvm_class(spark, "org.apache.hadoop.fs.Path")(
        path.rstrip("/") + "/.hoodie/timeline/*_*.{commit,deltacommit,replacecommit}"
    )
    fs = completed.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    found = fs.globStatus(completed)
    return found is not None and len(found) > 0


def meta_client(spark: SparkSession, path: str) -> Any:
    """A new Hudi meta client of the table at path (its timeline and schema), on the session's Hadoop settings.
    Each call builds its own: one may be used from a thread of its own."""
    conf = jvm_class(spark, "org.apache.hudi.storage.hadoop.HadoopStorageConfiguration")(
        spark.sparkContext._jsc.hadoopConfiguration()
    )
    builder = jvm_class(spark, "org.apache.hudi.common.table.HoodieTableMetaClient").builder()
    return builder.setConf(conf).setBasePath(path).build()


@dataclass(frozen=True)
class RecordedLayout:
    """What a Hudi table was created with (its hoodie.properties): fixed for the table's life."""

    record_key: tuple[str, ...] | None
    partition_field: str | None  # None: not partitioned
    table_type: str
    key_lengths: bool = False  # KEY_LENGTHS_COL among the record key fields (key_lengths_needed); not in record_key


_RECORDED: dict[str, RecordedLayout] = {}  # table path -> its layout; a table's layout never changes


def recorded_layout(spark: SparkSession, path: str) -> RecordedLayout | None:
    """The record key fields, partition field and table type a Hudi table was created with (`hoodie.table.*` in
    its hoodie.properties, else in the backup Hudi writes while it changes them, as Hudi reads them); None when
    there is no table there yet. Read once per table and process."""
    known = _RECORDED.get(path)
    if known is not None:
        return known
    fs, properties = fs_and_path(spark, f"{path.rstrip('/')}/.hoodie/hoodie.properties")
    if not fs.exists(properties):
        # Hudi changes a table's properties by writing a backup, deleting them and writing them anew: a crash in
        # between leaves the backup only (app/sink/creation.py).
        fs, properties = fs_and_path(spark, f"{path.rstrip('/')}/.hoodie/hoodie.properties.backup")
        if not fs.exists(properties):
            return None
    stream = fs.open(properties)
    try:
        props = jvm_class(spark, "java.util.Properties")()
        props.load(stream)
    finally:
        stream.close()

    def fields(name: str) -> tuple[str, ...] | None:
        value = props.getProperty(name)
        # Hudi 1.x may qualify a partition field with its key generator's type (`region:SIMPLE`).
        names = tuple(f.strip().split(":")[0] for f in str(value).split(",") if f.strip()) if value else ()
        return names or None

    partition = fields("hoodie.table.partition.fields")
    key_fields = fields("hoodie.table.recordkey.fields")
    key = tuple(f for f in key_fields if f != KEY_LENGTHS_COL) if key_fields else None
    layout = RecordedLayout(key or None, ",".join(partition) if partition else None,
                            str(props.getProperty("hoodie.table.type") or "COPY_ON_WRITE"),
                            key_lengths=key_fields is not None and KEY_LENGTHS_COL in key_fields)
    if layout.record_key is not None:  # else a table whose creation did not get that far: read it again later
        _RECORDED[path] = layout
    return layout


def recorded_record_key(spark: SparkSession, path: str) -> tuple[str, ...] | None:
    """The record key fields a Hudi table was created with; None when there is no table there yet."""
    layout = recorded_layout(spark, path)
    return None if layout is None else layout.record_key


COMMIT_ACTIONS = ("commit", "deltacommit", "replacecommit")


def completed_instants(
    spark: SparkSession, table_path: str, actions: tuple[str, ...] = COMMIT_ACTIONS
) -> list[str]:
    """Begin times of a table's completed instants, oldest first, on any Hadoop file system (Hudi 1.x
    `.hoodie/timeline/` layout: `<begin>_<end>.<action>` for completed instants; archived ones, below
    `history/`, are not listed). Compaction and clean instants are left out by default."""
    instants = []
    for name in list_files(spark, f"{table_path.rstrip('/')}/.hoodie/timeline"):
        stem, _, action = name.partition(".")
        if "/" not in name and "_" in stem and action in actions:
            instants.append(stem.split("_")[0])
    return sorted(instants)
