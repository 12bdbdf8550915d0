"""Seams where tools outside the product look in on a batch: the crash tests' pause points (devkit/pauses.py) stop
the job at named moments and add Hudi write options. The shipped job passes the default `Hooks()`, whose calls do
nothing; no test code is imported or shipped with it.

The points a batch reaches, in order (`at`):

    decode            the batch framed and summarised (its topics, writer schema ids and offsets), nothing written
                      yet; its tables' units (each planning its table first) and Bronze come next, side by side
    bronze_written    Bronze written, no Silver table yet (the units wait for it before their first write)
    dead_letters_written  a table's dead letters written (app/sink/deadletters.py), its Silver commit not yet
    dead_letters_settled  a table's dead letters settled by the batch's snapshot reads marked, its Silver commit not
                      yet (app/batch/writer.py: settle)
    quarantined       a table's quarantine file written (app/sink/quarantine.py), its batch's records not yet in
                      the dead letters
    ledger_written    a hard-delete table's delete ledger written (app/sink/ledger.py), its Silver commit not yet
    table_rewritten   a table rewritten with the types of columns widened upstream (app/sink/widening.py), the
                      batch's upsert not yet
    snapshot_requested  an incremental snapshot of a table asked for on its connector's signal topic, for columns
                      added upstream (app/wire/signals.py), the batch's upsert not yet
    between_tables    one Silver table committed, another still to write
    tables_committed  every Silver table committed; Spark has not recorded the batch (it replays it)
"""
from __future__ import annotations

from typing import Any, Final

POINTS: Final = (
    "decode", "bronze_written", "dead_letters_written", "dead_letters_settled", "quarantined", "ledger_written",
    "table_rewritten", "snapshot_requested", "between_tables", "tables_committed",
)


class Hooks:
    """Does nothing: what the job runs with unless a tool passes its own (a subclass)."""

    def at(self, point: str, **context: Any) -> None:
        """The batch reached `point` (one of POINTS); `context` says which batch and tables."""

    def write_options(self, table_path: str) -> dict[str, str]:
        """Hudi write options added to the writes of the table at `table_path`."""
        return {}
