"""Silver: Hudi upserts and deletes for one table, synced to the metastore by Hudi's meta sync."""
from __future__ import annotations

import logging
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession

from app.lakefs import list_files
from app.position import POSITION_COL
from app.unwrap import DELETED_COL

log = logging.getLogger(__name__)

COMMIT_META_PREFIX = "_cdc."  # hoodie.datasource.write.commitmeta.key.prefix: copied into commit metadata


@dataclass(frozen=True)
class HudiTarget:
    """Where and how one Silver table is written."""

    database: str
    table: str
    path: str
    record_key: tuple[str, ...]
    table_type: str = "COPY_ON_WRITE"
    delete_mode: str = "hard"

    @property
    def qualified_name(self) -> str:
        return f"{self.database}.{self.table}"

    @property
    def ledger(self) -> HudiTarget:
        """The hard-delete ledger of this table (app/deletes.py): beside it, never in the catalog."""
        parent, _, name = self.path.rstrip("/").rpartition("/")
        return HudiTarget(
            database=self.database,
            table=f"{name}_cdc_delete_ledger",
            path=f"{parent}/_cdc_delete_ledger/{name}",
            record_key=self.record_key,
        )


def write_options(target: HudiTarget, batch_id: int, query_id: str) -> dict[str, str]:
    """Hudi datasource options for an upsert batch carrying deletes as `_hoodie_is_deleted` rows."""
    return {
        "hoodie.table.name": target.table,
        "hoodie.datasource.write.table.name": target.table,
        "hoodie.datasource.write.table.type": target.table_type,
        "hoodie.datasource.write.operation": "upsert",
        "hoodie.datasource.write.recordkey.field": ",".join(target.record_key),
        # Non-partitioned tables in this release; this generator also handles composite keys.
        "hoodie.datasource.write.keygenerator.class": "org.apache.hudi.keygen.NonpartitionedKeyGenerator",
        "hoodie.datasource.write.partitionpath.field": "",
        # An older event never overwrites a newer one: the merge compares the source position (a string that
        # sorts in source order, app/position.py).
        "hoodie.datasource.write.precombine.field": POSITION_COL,
        "hoodie.write.record.merge.mode": "EVENT_TIME_ORDERING",
        "hoodie.datasource.write.payload.class": "org.apache.hudi.common.model.DefaultHoodieRecordPayload",
        # A batch written with an older writer schema than the table's fills the newer columns with null.
        "hoodie.write.set.null.for.missing.columns": "true",
        "hoodie.datasource.write.reconcile.schema": "false",
        # After each commit Hudi's HiveSyncTool brings the catalog up to date (a column added upstream, a new
        # table). hms mode without metastore URIs opens the metastore the session's Hive client names
        # (javax.jdo.option.ConnectionURL); on EMR the cluster's Hive client, pointed at Glue, is that metastore.
        **meta_sync_options(target),
        "hoodie.datasource.write.commitmeta.key.prefix": COMMIT_META_PREFIX,
        f"{COMMIT_META_PREFIX}batch_id": str(batch_id),
        f"{COMMIT_META_PREFIX}query_id": query_id,
    }


def meta_sync_options(target: HudiTarget) -> dict[str, str]:
    """Hudi meta sync of a non-partitioned table into the session's Hive metastore (or Glue through it)."""
    return {
        "hoodie.datasource.meta.sync.enable": "true",
        "hoodie.datasource.hive_sync.enable": "true",
        "hoodie.datasource.hive_sync.mode": "hms",
        "hoodie.datasource.hive_sync.database": target.database,
        "hoodie.datasource.hive_sync.table": target.table,
        "hoodie.datasource.hive_sync.auto_create_database": "true",
        "hoodie.datasource.hive_sync.partition_extractor_class": "org.apache.hudi.hive.NonPartitionedExtractor",
    }


# The delete ledger is a few rows per deleted key, read whole: no metadata table to keep beside it, and never
# in the catalog.
LEDGER_OPTIONS = {
    "hoodie.metadata.enable": "false",
    "hoodie.datasource.meta.sync.enable": "false",
    "hoodie.datasource.hive_sync.enable": "false",
}


def write_silver(
    rows_df: DataFrame, target: HudiTarget, batch_id: int, query_id: str, extra: dict[str, str] | None = None
) -> None:
    """Upsert the batch's latest row per key (deletes flagged in `_hoodie_is_deleted`) into the table."""
    if DELETED_COL not in rows_df.columns or POSITION_COL not in rows_df.columns:
        raise ValueError(f"{target.qualified_name}: rows lack {DELETED_COL}/{POSITION_COL}")
    options = {**write_options(target, batch_id, query_id), **(extra or {})}
    rows_df.write.format("hudi").options(**options).mode("append").save(target.path)


def table_exists(spark: SparkSession, path: str) -> bool:
    """Whether a Hudi table at path has a completed commit (local or any Hadoop file system, s3a included).

    A table whose first commit failed has a `.hoodie` folder but nothing to read yet. Hudi 1.x names a
    completed instant `<begin>_<end>.<action>` in `.hoodie/timeline/`.
    """
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    completed = jvm.org.apache.hadoop.fs.Path(
        path.rstrip("/") + "/.hoodie/timeline/*_*.{commit,deltacommit,replacecommit}"
    )
    fs = completed.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    found = fs.globStatus(completed)
    return found is not None and len(found) > 0


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
