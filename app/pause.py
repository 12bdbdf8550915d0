"""Pause points: named moments of a batch where the crash test stops the job, to kill it there.

Armed only by the environment, which the crash test sets for the job's process:

    CDC_PAUSE_AT     comma-separated point names
    CDC_PAUSE_DIR    folder for the pause files
    CDC_PAUSE_TABLE  (hudi_commit only) part of the table path to pause in; any table when unset. Hudi reads
                     a commit's new base files before it calls a validator, and a Merge-on-Read commit that
                     wrote log files only has none (Spark cannot infer their schema): point it at a
                     Copy-on-Write table. The validator is added to that table's writes only.

When the job reaches an armed point the first time, it writes `<CDC_PAUSE_DIR>/<point>.json` (the point, the
batch id and what the caller reports: the table, the tables committed so far) and sleeps until it is killed.
Unarmed, as in production, a point is one lookup in a frozen set.

    decode            the batch framed, its writer schemas fetched, nothing written yet
    bronze_written    Bronze written, no Silver table yet
    between_tables    one Silver table committed, another still to write
    tables_committed  every Silver table committed; Spark has not recorded the batch (it replays it)
    hudi_commit       inside a Hudi commit: data files and markers written, the instant still inflight
                      (io.cdclake.testing.PausingPreCommitValidator in jvm/, a Hudi pre-commit validator)
"""
from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Final

log = logging.getLogger(__name__)

POINTS: Final = ("decode", "bronze_written", "between_tables", "tables_committed", "hudi_commit")
HUDI_VALIDATOR: Final = "io.cdclake.testing.PausingPreCommitValidator"

_ARMED: Final = frozenset(p for p in os.environ.get("CDC_PAUSE_AT", "").split(",") if p)
_reached: set[str] = set()


def pause_point(point: str, **context: Any) -> None:
    """Stop here for good when the point is armed and reached for the first time (module docstring)."""
    if point not in _ARMED or point in _reached:
        return
    _reached.add(point)
    folder = Path(os.environ["CDC_PAUSE_DIR"])
    tmp = folder / f"{point}.json.tmp"
    tmp.write_text(json.dumps({"point": point, **context}, default=str), encoding="utf-8")
    tmp.replace(folder / f"{point}.json")
    log.warning("paused at %s (%s): waiting to be killed", point, context)
    while True:
        time.sleep(60)


def hudi_options(table_path: str) -> dict[str, str]:
    """Write options that arm the pause inside the commits of the table at `table_path`, when the environment
    asks for it."""
    if "hudi_commit" not in _ARMED or os.environ.get("CDC_PAUSE_TABLE", "") not in table_path:
        return {}
    return {"hoodie.precommit.validators": HUDI_VALIDATOR}
