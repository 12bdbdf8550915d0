"""Pause points: named moments of a batch where the crash test stops the job, to kill it there.

The job runs with them as `python -m devkit.pauses --conf <file> [job arguments]` (app/main.py's command line, with
`PausingHooks` passed as the job's hooks, app/hooks.py); armed by the environment the crash test sets:

    CDC_PAUSE_AT     comma-separated point names
    CDC_PAUSE_DIR    folder for the pause files
    CDC_PAUSE_TABLE  (hudi_commit only) part of the table path to pause in; any table when unset. Hudi reads
                     a commit's new base files before it calls a validator, and a Merge-on-Read commit that
                     wrote log files only has none (Spark cannot infer their schema): point it at a
                     Copy-on-Write table. The validator is added to that table's writes only.

When the job reaches an armed point the first time, it writes `<CDC_PAUSE_DIR>/<point>.json` (the point, the
batch id and what the caller reports: the table, the tables committed so far) and sleeps until it is killed.

The points are app/hooks.py's POINTS (decode, bronze_written, dead_letters_written, dead_letters_settled,
quarantined, ledger_written, table_rewritten, snapshot_requested, between_tables, tables_committed) and

    hudi_commit       inside a Hudi commit: data files and markers written, the instant still inflight
                      (io.cdclake.testing.PausingPreCommitValidator in jvm/, a Hudi pre-commit validator)

The points inside a table's creation are file systems of jvm/ (io.cdclake.testing.CreationPauses), set through
the Spark config, armed by the same variables.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any, Final

from app.hooks import POINTS as BATCH_POINTS
from app.hooks import Hooks

log = logging.getLogger(__name__)

POINTS: Final = (*BATCH_POINTS, "hudi_commit")
HUDI_VALIDATOR: Final = "io.cdclake.testing.PausingPreCommitValidator"


class PausingHooks(Hooks):
    """Stops for good at an armed point reached for the first time (module docstring)."""

    def __init__(self, armed: frozenset[str], folder: Path | None, table: str = "") -> None:
        self.armed, self.folder, self.table = armed, folder, table
        self.reached: set[str] = set()

    @classmethod
    def from_env(cls) -> PausingHooks:
        armed = frozenset(p for p in os.environ.get("CDC_PAUSE_AT", "").split(",") if p)
        folder = os.environ.get("CDC_PAUSE_DIR")
        return cls(armed, Path(folder) if folder else None, os.environ.get("CDC_PAUSE_TABLE", ""))

    def at(self, point: str, **context: Any) -> None:
        if point not in self.armed or point in self.reached:
            return
        self.reached.add(point)
        if self.folder is None:
            raise RuntimeError("CDC_PAUSE_DIR is not set")
        tmp = self.folder / f"{point}.json.tmp"
        tmp.write_text(json.dumps({"point": point, **context}, default=str), encoding="utf-8")
        tmp.replace(self.folder / f"{point}.json")
        log.warning("paused at %s (%s): waiting to be killed", point, context)
        while True:
            time.sleep(60)

    def write_options(self, table_path: str) -> dict[str, str]:
        """The pre-commit validator that pauses inside the commits of the armed table."""
        if "hudi_commit" not in self.armed or self.table not in table_path:
            return {}
        return {"hoodie.precommit.validators": HUDI_VALIDATOR}


if __name__ == "__main__":
    from app.main import main

    sys.exit(main(hooks=PausingHooks.from_env()))
