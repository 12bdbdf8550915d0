"""Meta sync only when the catalog can be behind a table.

Hudi's meta sync (HiveSyncTool into the session's metastore, or Glue through it) runs after a commit when the write
asks for it, and costs a metastore round of reads and writes every time. The catalog changes only when a table is
new, its schema changed, or a partition appeared. So a table is synced:

- at its first write in this process, unless the catalog already holds it as the write leaves it: its catalog
  tables (`_ro` and `_rt` too for Merge-on-Read) registered at its folder with every column of the batch, of the
  same type. That look-up is a few metastore reads; a sync is a metastore round of reads and writes (2-5 s at a
  process's first writes). A new table, or one whose last sync failed or was cut short by a crash (in an earlier
  run or before a restart of the query), lacks its catalog table or the columns that sync was adding, and syncs;
- whenever the batch's columns differ from those of its last sync in this process (a column added upstream) and
  the catalog lacks them;
- at every write when it is partitioned (a batch may add a partition);
- when a replayed batch finds the table already committed and this process has not synced it yet: the commit
  may be one whose sync never ran (REFERENCE: a replay that skips a committed table must still sync).

Otherwise the write turns meta sync off. A catalog table dropped or altered by hand is mended at the next restart
or schema change (`lake.meta_sync: every_commit` syncs after every commit, as Hudi does by default).
"""
from __future__ import annotations

import json
import logging
import threading
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from app.sink.hudi import SYNC_OFF, HudiTarget, catalog_tables, sync_properties
from app.sink.lost import registered_location, same_folder
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
        columns = rows_df.schema.json()
        with self._lock:
            synced = self._columns.get(target.path)
        if synced == columns:
            return SYNC_OFF
        behind = catalog_behind(rows_df.sparkSession, target, rows_df.schema)
        if behind:
            log.info("%s: meta sync at this write (%s)", target.qualified_name, behind)
            return {}
        log.info("%s: the catalog holds the table with the batch's columns: no meta sync", target.qualified_name)
        with self._lock:
            self._columns[target.path] = columns
        return SYNC_OFF

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


def catalog_behind(spark: SparkSession, target: HudiTarget, schema: StructType) -> str | None:
    """Why a write of `schema` needs the table's meta sync: a catalog table missing, registered elsewhere, or
    lacking a column of the write or holding it with another type (nullability aside; names as Hive keeps them,
    lower case); None when the catalog already holds the table as the write leaves it. The columns are the ones
    Spark reads, those of the table's datasource properties, which meta sync writes last."""
    external = spark._jsparkSession.sharedState().externalCatalog()
    wanted = _types(schema)
    for name in catalog_tables(target):
        location = registered_location(spark, target.database, name)
        if location is None:
            return f"{target.database}.{name} not in the catalog"
        if not same_folder(spark, location, target.path):
            return f"{target.database}.{name} registered at {location}"
        held = _types(StructType.fromJson(json.loads(external.getTable(target.database, name).schema().json())))
        differ = sorted(column for column, kind in wanted.items() if held.get(column) != kind)
        if differ:
            return f"{target.database}.{name} lacks or types differently: {', '.join(differ)}"
    return None


def _types(schema: StructType) -> dict[str, str]:
    """Each column's type (`_bare`) by its name in lower case."""
    return {field.name.lower(): json.dumps(_bare(field.dataType.jsonValue()), sort_keys=True)
            for field in schema.fields}


def _bare(value: Any) -> Any:
    """A type's JSON without nullability or metadata; byte and short as integer (the table's Avro schema holds
    them as int, and so does the catalog)."""
    if value in ("byte", "short"):
        return "integer"
    if isinstance(value, dict):
        return {key: _bare(item) for key, item in value.items()
                if key not in ("nullable", "containsNull", "valueContainsNull", "metadata")}
    if isinstance(value, list):
        return [_bare(item) for item in value]
    return value


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
