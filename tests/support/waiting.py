"""Waiting for the lake without reading it over and over.

The end-to-end tests wait for Silver to equal the source while a job applies changes. Reading a table whole is
a Spark job in the test's driver; done every second or two for minutes, those reads were a large part of the
suite's CPU. A table only changes through a commit, and a commit adds files to its timeline, so `LakeWatch` lists
the tables' timelines (one listing each) and says when one moved: the comparison runs then, and at least every
`recheck_s` whatever the timelines say (a comparison that failed for another reason, such as a read racing a
commit, is tried again).
"""
from __future__ import annotations

import time

from pyspark.sql import SparkSession

from app.sink.lakefs import fs_and_path

RECHECK_S = 15.0


class LakeWatch:
    """Whether any of some Silver tables changed since the last look (their timelines' files)."""

    def __init__(self, spark: SparkSession, *table_paths: str, recheck_s: float = RECHECK_S) -> None:
        self.spark = spark
        self.paths = table_paths
        self.recheck_s = recheck_s
        self._seen: tuple[tuple[int, str], ...] | None = None
        self._looked_at = 0.0

    def changed(self) -> bool:
        """True at the first call, when a timeline moved since the last True, or `recheck_s` after it."""
        try:
            seen = tuple(self._timeline(p) for p in self.paths)
        except Exception:  # the object store out of reach (an outage test): the comparison says what it can
            return True
        now = time.monotonic()
        if seen == self._seen and now - self._looked_at < self.recheck_s:
            return False
        self._seen, self._looked_at = seen, now
        return True

    def _timeline(self, table_path: str) -> tuple[int, str]:
        """The number of files in the table's timeline and the newest name: (0, "") for no table yet."""
        for folder in (f"{table_path.rstrip('/')}/.hoodie/timeline", f"{table_path.rstrip('/')}/.hoodie"):
            fs, path = fs_and_path(self.spark, folder)
            if fs.exists(path):
                names = [str(s.getPath().getName()) for s in fs.listStatus(path) if s.isFile()]
                return len(names), max(names, default="")
        return 0, ""

