"""Values an event does not carry, taken from the key's previous version.

Two kinds of event leave columns out:
- an UPDATE that leaves a TOASTed PostgreSQL value untouched: Debezium sends a placeholder instead of the
  value (app/cdc/unwrap.py nulls it and lists the column in `_cdc_unavailable`);
- a delete in a soft-delete table: its before image may hold only the key.

`with_carried_values` (app/cdc/unwrap.py) fills such a column from the key's earlier events in the batch. When the
batch does not hold the previous version, it is the table's current row: `with_current_rows` adds it to the
batch's events as the earliest version of the key, with its own position, so the same window fills the
column in source order (a current row newer than an event is never used for it: such an event is stale, and
Hudi's ordering rejects it anyway). The current rows are read only for the keys that need them, and only in
a batch that has an unavailable column.

A column no version supplies stays as the event has it (null for a TOAST placeholder) and is reported:
that happens for a primary-key change of a row with a TOASTed value under default replica identity, whose
new key has no previous version.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from app.cdc.columns import DELETED_COL, OFFSET_COL, OP_COL, PARTITION_COL, SNAPSHOT_END_COL, UNAVAILABLE_COL
from app.cdc.unwrap import OP_DELETE

OP_CURRENT: Final = "current"  # marks the table's current rows among a batch's events; never written


def with_current_rows(events_df: DataFrame, current_df: DataFrame, key_columns: Sequence[str]) -> DataFrame:
    """Add the table's current row of each key that has an unavailable column, as an `op=current` event.

    Args:
        events_df: the batch's unwrapped, typed events of one table.
        current_df: the Silver table as read now (columns it lacks, added since, become null).
    """
    needed = events_df.filter(is_pending()).select(*key_columns).distinct()
    current = current_df.join(needed, list(key_columns), "left_semi")
    available = set(current.columns)
    types = {f.name: f.dataType for f in events_df.schema.fields}
    fixed = {
        OP_COL: F.lit(OP_CURRENT),
        PARTITION_COL: F.lit(-1).cast(types[PARTITION_COL]),
        OFFSET_COL: F.lit(-1).cast(types[OFFSET_COL]),
        DELETED_COL: F.lit(False),
        UNAVAILABLE_COL: F.array().cast("array<string>"),
        SNAPSHOT_END_COL: F.lit(False),
    }
    columns = [
        fixed[name].alias(name) if name in fixed
        else F.col(name).cast(types[name]).alias(name) if name in available
        else F.lit(None).cast(types[name]).alias(name)
        for name in events_df.columns
    ]
    return events_df.unionByName(current.select(*columns))


def filter_current_rows(df: DataFrame) -> DataFrame:
    """Drop the `op=current` rows with_current_rows added."""
    return df.filter(F.col(OP_COL) != OP_CURRENT)


def is_pending() -> Column:
    """An event that lists an unavailable column (before carrying: it needs the key's history)."""
    return F.size(F.col(UNAVAILABLE_COL)) > 0


def is_unresolved() -> Column:
    """An upsert still missing a column after carrying: a TOAST placeholder with no previous version known.

    (A delete missing columns is fine: a soft delete keeps its before image then.)
    """
    return is_pending() & (F.col(OP_COL) != OP_DELETE)
