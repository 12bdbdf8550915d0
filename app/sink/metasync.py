"""Meta sync only when the catalog can be behind a table.

Hudi's meta sync (HiveSyncTool into the session's metastore, or Glue through it) runs after a commit when the write
asks for it, and costs a metastore round of reads and writes every time. The catalog changes only when a table is
new, its schema changed, or a partition appeared. So a table is synced:

- at its first write in this process (a new table; or one whose last sync failed or was cut short by a crash, in
  an earlier run or before a restart of the query);
- whenever the batch's columns differ from those of its last sync in this process (a column added upstream);
- at every write when it is partitioned (a batch may add a partition);
- when a replayed batch finds the table already committed and this process has not synced it yet: the commit
  may be one whose sync never ran (REFERENCE: a replay that skips a committed table must still sync).

Otherwise the write turns meta sync off. A catalog table dropped by hand comes back at the next restart or schema
change (`lake.meta_sync: every_commit` syncs after every commit, as Hudi does by default).
"""
from __future__ import annotations

import logging
import threading

from pyspark.sql import DataFrame, SparkSession

from app.sink.hudi import SYNC_OFF, HudiTarget, catalog_tables, sync_properties
from app.spark import jvm_class

log = logging.getLogger(__name__)

SYNC_TOOL = "org.apache.hudi.hive.HiveSyncTool"


class MetaSync:
    """Which tables this process has synced, and with which batch columns; shared by the writer threads."""

    def __init__(self, every_commit: bool = False) -> None:
        self.every_commit = every_commit
        self._columns: dict[str, str] = {}  # table path -> the batch schema (JSON) of its last sync
        self._lock = threading.Lock()

    def write_options(self, target: HudiTarget, rows_df: DataFrame) -> dict[str, str]:
        """Options for the table's next write: none (its meta sync runs) or SYNC_OFF."""
        if self.every_commit or target.partition is not None:
            return {}
        with self._lock:
            synced = self._columns.get(target.path)
        return SYNC_OFF if synced == rows_df.schema.json() else {}

    def written(self, target: HudiTarget, rows_df: DataFrame, options: dict[str, str]) -> None:
        """The write with `options` committed (and synced, unless they turned sync off)."""
        if options.get("hoodie.datasource.meta.sync.enable") != "false":
            with self._lock:
                self._columns[target.path] = rows_df.schema.json()

    def ensure(self, spark: SparkSession, target: HudiTarget) -> None:
        """A committed table the batch skips: synced now unless this process did already."""
        with self._lock:
            if target.path in self._columns:
                return
        log.info("%s: batch already committed, syncing the catalog (not yet synced by this run)",
                 target.qualified_name)
        sync_table(spark, target)
        with self._lock:
            self._columns.setdefault(target.path, "")  # synced, with columns this process has not written


def sync_table(spark: SparkSession, target: HudiTarget) -> None:
    """Run Hudi's meta sync for the table as its writes do, without a write (HoodieSparkSqlWriter.metaSync), and
    refresh Spark's cached view of its catalog tables.

    Raises:
        Py4JJavaError: the sync failed (metastore unreachable, ...).
    """
    props = jvm_class(spark, "org.apache.hudi.common.config.TypedProperties")()
    for key, value in sync_properties(target, spark.version, spark.conf.get(
            "spark.sql.sources.schemaStringLengthThreshold", "4000") or "4000").items():
        props.setProperty(key, value)
    path = jvm_class(spark, "org.apache.hadoop.fs.Path")(target.path)
    fs = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    jvm_class(spark, "org.apache.hudi.sync.common.util.SyncUtilHelpers").runHoodieMetaSync(
        SYNC_TOOL, props, fs.getConf(), fs, target.path, "PARQUET"
    )
    for name in catalog_tables(target):
        qualified = f"{target.database}.{name}"
        if spark.catalog.tableExists(qualified):
            spark.catalog.refreshTable(qualified)
