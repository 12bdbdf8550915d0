"""A Hudi table whose creation was interrupted (a crash, a SIGKILL, a lost node) is recognised before the next
write of that table and created afresh.

Hudi 1.0.2 creates a table inside its first write, in this order (read off HoodieTableMetaClient
`createTableLayoutOnStorage` and a traced run on S3; the local file system writes the same files):

    1. folders: <table>/, .hoodie/, .hoodie/.schema/, .hoodie/timeline/, .hoodie/timeline/history/, .hoodie/.temp/,
       .hoodie/.aux/, .hoodie/.aux/.bootstrap/.partitions/, .hoodie/.aux/.bootstrap/.fileids/
    2. .hoodie/hoodie.properties                     the table exists for Hudi from here on
    3. .hoodie/timeline/<t>.commit.requested         (deltacommit for Merge-on-Read)
    4. the metadata table's first initialisation (tables with `hoodie.metadata.enable`):
       .hoodie/metadata/ with its own folders and properties, the `files` partition, then `column_stats`, and
       for a partitioned table `record_index` and `partition_stats`, each its own instant
       (00000000000000000, ...01, ...) completed in .hoodie/metadata/.hoodie/timeline/; after each, the data
       table's hoodie.properties is rewritten through hoodie.properties.backup (create backup, delete
       properties, create properties, delete backup); .hoodie/.index_defs/index.json
    5. .hoodie/timeline/<t>.inflight, .hoodie_partition_metadata (per partition), markers in .hoodie/.temp/<t>/,
       the data files, the metadata table's instant <t>
    6. .hoodie/timeline/<t>_<completion>.commit     the first completed instant: the table is usable

A kill before step 2 leaves folders and no properties: every later write then fails with "Could not load
Hoodie properties", at every restart. A kill in steps 2 to 4, or in step 5 before a data file is written,
leaves a table Hudi may or may not recover (a pending instant, a half-initialised metadata table, only the
backup of the properties). None of these states holds anything committed, so the folder is removed and the
write creates the table afresh, with a WARNING naming what was found. A kill in step 5 after data files were
written, or any later crash, is left to Hudi's own recovery: the next write rolls the inflight instant back
(`hoodie.cleaner.policy.failed.writes=EAGER`, the default), and reads fall back to hoodie.properties.backup.
A folder holding any completed instant or any data file is never removed.
"""
from __future__ import annotations

import logging
import re
import threading
from typing import Any, Final

from pyspark.sql import SparkSession

from app.errors import SinkWriteError
from app.sink.lakefs import fs_and_path
from app.spark import jvm_class

log = logging.getLogger(__name__)

META_FOLDER: Final = ".hoodie"
PROPERTIES: Final = "hoodie.properties"
PROPERTIES_BACKUP: Final = "hoodie.properties.backup"
# Completed instants: `<begin>_<end>.<action>` in Hudi 1.x's timeline/ folder, `<begin>.<action>` directly in
# .hoodie/ for tables of the 0.x layout; archived instants in timeline/history/ (1.x) or archived/ (0.x).
_COMPLETED_V2: Final = re.compile(r"\d+_\d+\.[a-z]+")
_COMPLETED_V1: Final = re.compile(r"\d+\.(commit|deltacommit|replacecommit|clean|rollback|savepoint|restore)")
_HISTORY: Final = ("timeline/history/", "archived/")
# Files Hudi writes outside .hoodie/ before any data file: the partition marker.
_NOT_DATA: Final = (".hoodie_partition_metadata",)

_usable: set[str] = set()  # table paths seen with a completed instant by this process: not checked again
_usable_lock = threading.Lock()


def repair_interrupted_creation(spark: SparkSession, path: str, table: str) -> list[str] | None:
    """Remove the folder of a table whose creation was interrupted (module docstring), so that the write about
    to happen creates it afresh. Cheap once the table is usable: a table seen with a completed instant is not
    looked at again by this process.

    Returns:
        The files and folders found in the removed folder (relative to it), or None when nothing was removed.

    Raises:
        SinkWriteError: the folder holds data files but no table properties (nor their backup): not left by an
            interrupted creation, and not removed.
    """
    with _usable_lock:
        if path in _usable:
            return None
    fs, table_path = fs_and_path(spark, path)
    hadoop_path = jvm_class(spark, "org.apache.hadoop.fs.Path")
    meta = hadoop_path(table_path, META_FOLDER)
    if not fs.exists(meta):
        return None  # no table yet: Hudi creates it
    # A usable table is known from .hoodie/ and its timeline/ alone: two listings, not one of the whole table.
    if any(_is_completed_instant(f) for f in _shallow(fs, meta, hadoop_path(meta, "timeline"))):
        with _usable_lock:
            _usable.add(path)
        return None
    files = _files(fs, table_path)
    if any(_is_completed_instant(f) for f in files):
        with _usable_lock:
            _usable.add(path)
        return None
    data = [f for f in files if not f.startswith(f"{META_FOLDER}/") and f.rsplit("/", 1)[-1] not in _NOT_DATA]
    if data:
        properties = {f"{META_FOLDER}/{PROPERTIES}", f"{META_FOLDER}/{PROPERTIES_BACKUP}"}
        if not properties & set(files):
            raise SinkWriteError(
                f"{table}: {path} holds data files ({', '.join(data[:3])}{', ...' if len(data) > 3 else ''}) but no "
                f"{META_FOLDER}/{PROPERTIES}: it is not a table this job can write; move it away or restore its "
                f"properties"
            )
        return None  # an inflight first commit with data files: Hudi rolls it back on this write
    found = _entries(fs, meta) + files
    found = sorted(set(found))
    log.warning(
        "%s: the table's creation at %s was interrupted (no completed instant, no data file; found %s): "
        "removing the folder and creating the table afresh",
        table, path, ", ".join(found) if found else "an empty .hoodie/",
    )
    fs.delete(table_path, True)
    return found


def _is_completed_instant(relative: str) -> bool:
    if not relative.startswith(f"{META_FOLDER}/"):
        return False
    inside = relative[len(META_FOLDER) + 1:]
    if any(inside.startswith(h) for h in _HISTORY):
        return True
    if inside.startswith("timeline/") and inside.count("/") == 1:
        return bool(_COMPLETED_V2.fullmatch(inside.removeprefix("timeline/")))
    return "/" not in inside and bool(_COMPLETED_V1.fullmatch(inside))


def _shallow(fs: Any, meta: Any, timeline: Any) -> list[str]:
    """The files directly in .hoodie/ and .hoodie/timeline/ (relative to the table), where completed instants are."""
    found = [f"{META_FOLDER}/{s.getPath().getName()}" for s in fs.listStatus(meta) if s.isFile()]
    if fs.exists(timeline):
        found += [f"{META_FOLDER}/timeline/{s.getPath().getName()}" for s in fs.listStatus(timeline) if s.isFile()]
    return found


def _files(fs: Any, root: Any) -> list[str]:
    """Every file below root (relative paths), the metadata table's excepted: it is not the data table's."""
    base = fs.makeQualified(root).toString().rstrip("/") + "/"
    found = []
    listing = fs.listFiles(root, True)
    while listing.hasNext():
        name = listing.next().getPath().toString().removeprefix(base)
        if not name.startswith(f"{META_FOLDER}/metadata/"):
            found.append(name)
    return found


def _entries(fs: Any, meta: Any) -> list[str]:
    """The folders directly in .hoodie/ (an S3 folder marker has no file to list), as `.hoodie/<name>/`."""
    return [
        f"{META_FOLDER}/{status.getPath().getName()}/" for status in fs.listStatus(meta) if status.isDirectory()
    ]
