"""Deletes that stay deleted: the delete ledger of a hard-delete table, and the verdict on each event.

A hard delete removes the row from the Silver table, and with it the position Hudi's ordering would compare a
later event against. An older upsert of that key arriving in a later batch (Debezium redelivery after a
connector restart, a rebuild from Bronze, a replay) would then bring the row back. So each hard-delete table
keeps a ledger beside it: a small Hudi table of (record key, position of its latest delete), never registered
in the catalog. Before a batch is written, its events are judged against the ledger:

    an upsert at or below the key's ledger position   -> blocked: not written (`blocked` in the log line)
    an upsert above it (a re-insert)                  -> written, and the key leaves the ledger
    a delete                                          -> written, and recorded (the ledger keeps the highest)

Retention: an entry lives until its key is re-inserted by a newer event; from then on the live row's own
position protects it through Hudi's ordering, as for any live row. Entries of keys that stay deleted are kept
for good: an older event can come back at any time (Bronze replays have no horizon), so there is no age after
which dropping one is safe. The ledger holds one small row per deleted key: key columns, position and source time.

The ledger is written before the Silver commit of the same batch: a batch that fails between the two has
recorded its deletes already, and its replay rewrites both. Checking and writing the ledger assumes one writer
per table (this job; a second job or a replay writing the same table at the same time could race it).

Soft-delete tables need no ledger: the deleted row stays, flagged, with its position (see app/cdc/unwrap.py).
"""
from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from app.cdc.columns import (
    BLOCKED_COL,
    DELETED_COL,
    LATEST_COL,
    LEDGER_POSITION_COL,
    POSITION_COL,
    REINSERT_COL,
    SOURCE_TS_COL,
)
from app.sink.hudi import table_exists


def read_ledger(spark: SparkSession, path: str, key_columns: Sequence[str]) -> DataFrame | None:
    """The ledger's (key, delete position) rows, or None before the table's first delete."""
    if not table_exists(spark, path):
        return None
    return (
        spark.read.format("hudi").load(path)
        .select(*key_columns, F.col(POSITION_COL).alias(LEDGER_POSITION_COL))
    )


def with_ledger_verdict(events_df: DataFrame, ledger_df: DataFrame | None, key_columns: Sequence[str]) -> DataFrame:
    """Add `_cdc_blocked` and `_cdc_reinsert` to each event (see the module docstring)."""
    if ledger_df is None:
        return events_df.withColumn(BLOCKED_COL, F.lit(False)).withColumn(REINSERT_COL, F.lit(False))
    joined = events_df.join(ledger_df, list(key_columns), "left")
    upsert: Column = ~F.col(DELETED_COL)
    ledgered = F.col(LEDGER_POSITION_COL).isNotNull()
    above = F.col(POSITION_COL) > F.col(LEDGER_POSITION_COL)
    return joined.select(
        *[F.col(c) for c in events_df.columns],
        (upsert & ledgered & ~above).alias(BLOCKED_COL),
        (upsert & ledgered & above).alias(REINSERT_COL),
    )


def ledger_changes(judged_df: DataFrame, key_columns: Sequence[str]) -> DataFrame:
    """The ledger upsert for a batch: each latest delete recorded, each re-inserted key removed.

    Takes the events with the latest flag and the verdict columns.
    """
    latest = F.col(LATEST_COL)
    return judged_df.filter(latest & (F.col(DELETED_COL) | F.col(REINSERT_COL))).select(
        *key_columns,
        F.col(POSITION_COL),
        F.col(SOURCE_TS_COL),
        # A re-insert deletes the ledger entry; Hudi applies it because its position is higher.
        F.col(REINSERT_COL).alias(DELETED_COL),
    )
