"""A Silver table lost from the lake: the catalog holds it, its folder does not.

A table's folder deleted by hand, an emptied bucket or a mistaken lifecycle rule leave the catalog entry that meta
sync made after the table's first commit (app/sink/metasync.py). Hudi would create a new table in the empty folder
from the batch's events alone: the rows that changed before it, which Kafka may no longer hold, would be gone
without a word. So before a table's first write, when its timeline shows no completed commit, the catalog is asked:

    no catalog entry for the table                     a new table: created by the write, as always
    an entry whose location is another folder          not this table's: created as always
    the folder holds hoodie.properties (or its backup) a table (of another timeline layout, or being created)
    a Hudi entry at the table's folder                 lost: refused (`lost_reason`), until it is rebuilt

A refused table's records are not written (nor sent to the dead letters); Bronze keeps them like every other, so a
rebuild from Bronze (scripts/rebuild.py) brings the table back whole, and the job then goes on from its checkpoint.
Dropping the catalog entry instead (`DROP TABLE`) tells the job to start the table afresh from new events.

One catalog look-up per table whose timeline shows no commit: once per new table, and per batch for a lost one.
The table's own folder is looked at first (app/sink/hudi.py table_exists): the catalog is read only when that finds
no completed commit. A table whose creation was interrupted before its first commit has no catalog entry yet (meta
sync runs after the commit): it is created afresh as before (app/sink/creation.py).
"""
from __future__ import annotations

import logging
import re
import threading
from typing import Final

from py4j.protocol import Py4JError
from pyspark.sql import SparkSession

from app.sink.hudi import HudiTarget, table_exists
from app.sink.lakefs import fs_and_path

log = logging.getLogger(__name__)

DOC: Final = 'docs/when-things-go-wrong.md "A lost table"'
REBUILDING: Final = "_rebuilding"  # <silver>/<database>/_rebuilding/<table>: a rebuild under way or cut short
_SCHEME = re.compile(r"^s3[an]?://")


def registered_location(spark: SparkSession, database: str, table: str) -> str | None:
    """The location of a Hudi table the session's catalog holds as `database.table` (the external catalog's raw
    entry: no Hudi relation is resolved, so a missing folder does not fail the look-up); None when it holds none."""
    external = spark._jsparkSession.sharedState().externalCatalog()
    if not external.databaseExists(database) or not external.tableExists(database, table):
        return None
    entry = external.getTable(database, table)
    storage = entry.storage()
    formats = " ".join(str(o.get()) for o in (storage.inputFormat(), entry.provider()) if o.isDefined())
    if "hudi" not in formats.lower() and "hoodie" not in formats.lower():
        return None
    return str(entry.location().toString())


def same_folder(spark: SparkSession, a: str, b: str) -> bool:
    """Whether two locations name one folder: qualified by the file system, s3:// s3a:// s3n:// alike (Glue keeps
    what EMR's writer gave, s3://)."""
    def norm(uri: str) -> str:
        fs, path = fs_and_path(spark, uri)
        return _SCHEME.sub("s3://", str(fs.makeQualified(path).toString())).rstrip("/")

    try:
        return norm(a) == norm(b)
    except Py4JError:  # a location of a file system this session cannot open: not this table's folder
        return _SCHEME.sub("s3://", a).rstrip("/") == _SCHEME.sub("s3://", b).rstrip("/")


def rebuild_marker(silver_path: str, database: str, table: str) -> str:
    """The file a rebuild keeps while it runs (scripts/rebuild.py)."""
    return f"{silver_path.rstrip('/')}/{database}/{REBUILDING}/{table}"


def rebuilding_tables(spark: SparkSession, silver_path: str, databases: list[str]) -> set[str]:
    """The tables (qualified names) whose rebuild was started and has not ended: their marker files."""
    found = set()
    for database in databases:
        fs, folder = fs_and_path(spark, f"{silver_path.rstrip('/')}/{database}/{REBUILDING}")
        if fs.exists(folder):
            found |= {f"{database}.{s.getPath().getName()}" for s in fs.listStatus(folder) if s.isFile()}
    return found


class LostTables:
    """The lost-table check of a job's writer: each table refused is said once per run at error level."""

    def __init__(self) -> None:
        self.said: set[str] = set()
        self.lock = threading.Lock()
        self.rebuilding: set[str] = set()  # tables whose rebuild has not ended (`load`)
        self.loaded = False

    def load(self, spark: SparkSession, silver_path: str, databases: list[str]) -> set[str]:
        """Read the rebuild markers (at each start of the job's query; before a replay's first batch)."""
        self.rebuilding = rebuilding_tables(spark, silver_path, databases)
        self.loaded = True
        return self.rebuilding

    def reason(
        self, spark: SparkSession, target: HudiTarget, conf_hint: str = "<conf file>", committed: bool = True
    ) -> str | None:
        """Why the table's write is refused, when it is lost or its rebuild has not ended (module docstring); None
        when it may be written. `committed`: its timeline shows a commit with offsets (the catalog is not asked)."""
        if target.qualified_name in self.rebuilding:
            why = unfinished_reason(target, conf_hint)
        elif committed or table_exists(spark, target.path) or _has_properties(spark, target.path):
            return None
        else:
            location = registered_location(spark, target.database, target.table)
            if location is None or not same_folder(spark, location, target.path):
                return None
            why = lost_reason(target, location, conf_hint)
        with self.lock:
            first = target.qualified_name not in self.said
            self.said.add(target.qualified_name)
        if first:
            log.error("table=%s REFUSED: %s", target.qualified_name, why)
        return why


def _has_properties(spark: SparkSession, path: str) -> bool:
    """Whether the folder holds Hudi's table properties (or their backup): a table there, of whatever timeline
    layout, or one being created; not a lost one."""
    fs, meta = fs_and_path(spark, f"{path.rstrip('/')}/.hoodie")
    names = ("hoodie.properties", "hoodie.properties.backup")
    return bool(fs.exists(meta)) and any(status.getPath().getName() in names for status in fs.listStatus(meta))


def lost_reason(target: HudiTarget, location: str, conf_hint: str) -> str:
    return (
        f"Silver table {target.qualified_name} is in the catalog (at {location}) but its folder holds no table: it "
        f"was lost. Its records are not written, lest it be created again from new events alone; Bronze keeps "
        f"them. Stop the job and rebuild it from Bronze: python scripts/rebuild.py --conf {conf_hint} --table "
        f"{target.qualified_name} ({DOC}); or, to start it afresh from new events, drop it from the catalog"
    )


def unfinished_reason(target: HudiTarget, conf_hint: str) -> str:
    return (
        f"a rebuild of {target.qualified_name} from Bronze was started and has not ended (its marker "
        f"{REBUILDING}/{target.table} is there): the table may lack records. Its records are not written; Bronze "
        f"keeps them. Run it again to the end with the job stopped: python scripts/rebuild.py --conf {conf_hint} "
        f"--table {target.qualified_name} --resume ({DOC})"
    )
