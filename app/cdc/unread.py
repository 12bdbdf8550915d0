"""Rows a full snapshot did not read: deleted upstream while no change streamed. A pure DataFrame -> DataFrame step.

A full snapshot (an initial or blocking snapshot, or the snapshot a connector takes again after its offsets were
lost) reads every row a table has, all its reads at one position. When a connector snapshots again, the rows
deleted upstream since its last streamed change never stream as deletes: the new snapshot simply does not read
them. After a table's last read of a full snapshot (`_cdc_snapshot_end`, app/cdc/unwrap.py), a Silver row whose
position is below the snapshot's was therefore not read by it (a read would have given it the snapshot's
position, a later change a higher one): it is gone upstream. Each such row gets a delete event at the row's own
position, so that it goes through the batch's ordering, the delete ledger and the write like any delete:

- a read of the same key later in the batch (the snapshot's, at its higher position) wins over it;
- a read of the key still to come in a later batch (a topic of several partitions read unevenly) re-inserts it;
- an older event of the key arriving after it stays below the delete (the ledger's position, app/sink/ledger.py).

Its Kafka partition and offset are -1 (it has none; at an equal position the batch's real event wins), its
source time the snapshot's last read's. In a soft-delete table the row stays, flagged deleted.
"""
from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from app.cdc.columns import (
    DELETED_COL,
    ERROR_COL,
    OFFSET_COL,
    OP_COL,
    PARTITION_COL,
    POSITION_COL,
    SNAPSHOT_END_COL,
    SOFT_DELETED_AT_COL,
    SOFT_DELETED_COL,
    SOURCE_TS_COL,
    UNAVAILABLE_COL,
)
from app.cdc.unwrap import OP_DELETE


def with_unread_deletes(
    events_df: DataFrame, current_df: DataFrame, key_columns: Sequence[str], snapshot_position: str,
    snapshot_ts_ms: int | None,
) -> DataFrame:
    """Add a delete event for each row of `current_df` (the Silver table as it is) below `snapshot_position`.

    Args:
        events_df: the batch's unwrapped, typed events of one table.
        snapshot_position: the position of the full snapshot that ended in the batch.
    """
    unread = current_df.filter(F.col(POSITION_COL) < F.lit(snapshot_position))
    if SOFT_DELETED_COL in current_df.columns:  # deleted already (a soft-delete table keeps the row)
        unread = unread.filter(~F.coalesce(F.col(SOFT_DELETED_COL), F.lit(False)))
    available = set(current_df.columns)
    types = {f.name: f.dataType for f in events_df.schema.fields}
    fixed = {
        OP_COL: F.lit(OP_DELETE),
        POSITION_COL: F.col(POSITION_COL),
        SOURCE_TS_COL: F.lit(snapshot_ts_ms).cast(types.get(SOURCE_TS_COL, "long")),
        PARTITION_COL: F.lit(-1).cast(types[PARTITION_COL]),
        OFFSET_COL: F.lit(-1).cast(types[OFFSET_COL]),
        DELETED_COL: F.lit(True),
        UNAVAILABLE_COL: F.array().cast("array<string>"),
        SNAPSHOT_END_COL: F.lit(False),
    }
    if SOFT_DELETED_COL in events_df.columns:  # the row stays, flagged, its values its own
        fixed.update({DELETED_COL: F.lit(False), SOFT_DELETED_COL: F.lit(True),
                      SOFT_DELETED_AT_COL: F.timestamp_millis(F.lit(snapshot_ts_ms).cast("long"))})
    missing_keys = [c for c in key_columns if c not in available]
    if missing_keys:
        raise ValueError(f"the table lacks its record key columns {missing_keys}")
    columns = [
        fixed[name].alias(name) if name in fixed
        else F.lit(None).cast(types[name]).alias(name) if name == ERROR_COL or name not in available
        else F.col(name).cast(types[name]).alias(name)
        for name in events_df.columns
    ]
    return events_df.unionByName(unread.select(*columns))
