"""Deletes the events imply but do not carry, one per key: pure DataFrame -> DataFrame steps. Each delete is an
event like the batch's own (op `d`, Kafka partition -1, the implying event's source time), so it goes through the
batch's ordering, the delete ledger and the write like any delete; in a soft-delete table the row stays, flagged,
its values the key's latest.

Rows a full snapshot did not read (`with_unread_deletes`, a table whose `unread_rows` is `delete`). A full snapshot
(an initial or blocking snapshot, or the snapshot a connector takes again after its offsets were lost) reads every
row a table has, all its reads at one position. When a connector snapshots again, the rows deleted upstream since
its last streamed change never stream as deletes: the new snapshot simply does not read them. After a table's last
read of a full snapshot (`_cdc_snapshot_end`, app/cdc/unwrap.py), a key whose latest version (in Silver or in the
batch) is below the snapshot's position, and which has no event of the batch at or above it, was not read by it (a
read would have given it the snapshot's position, a later change a higher one): it is gone upstream. Its delete
takes the key's own latest position, and the highest offset, so it wins over that version and nothing later:

- a read of the key still to come in a later batch (a topic of several partitions read unevenly) re-inserts it;
- an older event of the key arriving after it stays below the delete (the ledger's position, app/sink/ledger.py).

A key with an event in error in the batch is left alone: that event may be its read.

A truncate (`with_truncate_deletes`, a table whose `truncate` is `clear`): every row written before it is gone, in
source order with the table's other events. Each key with a Silver row or a batch event below the truncate's
position gets a delete at that position: events after the truncate win, those before lose, and the ledger keeps
older events of the key out (of one Kafka partition; docs/sources.md "Truncates").
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from pyspark.sql import Column, DataFrame
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
from app.cdc.unwrap import OP_DELETE, dedupe_latest

OLD_POSTGRES_WIDTH: Final = 17  # `XXXXXXXX/XXXXXXXX`, PostgreSQL's position before the commit LSN led it
LAST_OFFSET: Final = 2**63 - 1


def with_unread_deletes(
    events_df: DataFrame, current_df: DataFrame, key_columns: Sequence[str], snapshot_position: str,
    snapshot_ts_ms: int | None,
) -> DataFrame:
    """Add a delete event for each key the full snapshot at `snapshot_position` did not read: a row of `current_df`
    (the Silver table as it is) or an event of the batch below that position, whose key has no event of the batch
    at or above it, nor one in error (a read that could not be decoded is a read all the same)."""
    below = _comparable(F.col(POSITION_COL)) < F.lit(snapshot_position)
    good = F.col(ERROR_COL).isNull() if ERROR_COL in events_df.columns else F.lit(True)
    seen = events_df.filter(~below | ~good).select(*key_columns)
    rows = events_df.filter(below & good).unionByName(_as_events(events_df, _live(current_df)).filter(below))
    unread = dedupe_latest(rows.join(seen, list(key_columns), "left_anti").select(*events_df.columns), key_columns)
    # At the key's own latest position, winning a tie with the event that wrote it (the highest offset there is).
    deletes = _deletes(events_df, unread, key_columns, _comparable(F.col(POSITION_COL)), snapshot_ts_ms,
                       offset=LAST_OFFSET)
    return events_df.unionByName(deletes)


def with_truncate_deletes(
    events_df: DataFrame, current_df: DataFrame | None, key_columns: Sequence[str], truncate_position: str,
    truncate_ts_ms: int | None,
) -> DataFrame:
    """Add a delete event at `truncate_position` (the batch's latest truncate of the table) for each key with a
    row in `current_df` (the Silver table as it is; None before it exists) or an event of the batch below it (events
    in error aside); the delete carries the key's latest version before the truncate.

    Args:
        events_df: the batch's unwrapped, typed events of one table, its truncate events left out.
    """
    below = _comparable(F.col(POSITION_COL)) < F.lit(truncate_position)
    good = F.col(ERROR_COL).isNull() if ERROR_COL in events_df.columns else F.lit(True)
    keyed = F.lit(True)
    for column in key_columns:
        keyed = keyed & F.col(column).isNotNull()
    rows = events_df.filter(below & good & keyed)
    if current_df is not None:
        rows = rows.unionByName(_as_events(events_df, _live(current_df)).filter(below))
    latest = dedupe_latest(rows, key_columns)
    deletes = _deletes(events_df, latest, key_columns, F.lit(truncate_position), truncate_ts_ms)
    return events_df.unionByName(deletes)


def _comparable(position: Column) -> Column:
    """A position as the current format writes it: a PostgreSQL position of the older format (one LSN,
    `XXXXXXXX/XXXXXXXX`) as `<lsn>:<lsn>`, which is where its event sorts now (app/cdc/position.py)."""
    return F.when(F.length(position) == OLD_POSTGRES_WIDTH, F.concat(position, F.lit(":"), position)) \
        .otherwise(position)


def _live(current_df: DataFrame) -> DataFrame:
    """The Silver rows not deleted already (a soft-delete table keeps deleted rows, flagged)."""
    if SOFT_DELETED_COL in current_df.columns:
        return current_df.filter(~F.coalesce(F.col(SOFT_DELETED_COL), F.lit(False)))
    return current_df


def _as_events(events_df: DataFrame, rows_df: DataFrame) -> DataFrame:
    """`rows_df` (Silver rows) in the columns and types of `events_df`: a column it lacks is null."""
    available = set(rows_df.columns)
    types = {f.name: f.dataType for f in events_df.schema.fields}
    return rows_df.select(*[
        F.col(name).cast(types[name]).alias(name) if name in available and name != ERROR_COL
        else F.lit(None).cast(types[name]).alias(name)
        for name in events_df.columns
    ])


def _deletes(  # noqa: PLR0917 - the rows, where their deletes sort, and when
    events_df: DataFrame, rows_df: DataFrame, key_columns: Sequence[str], position: Column, ts_ms: int | None,
    offset: int = -1,
) -> DataFrame:
    """A delete event at `position` (evaluated on the row in `events_df`'s columns) for each row of `rows_df`."""
    missing = [c for c in key_columns if c not in rows_df.columns]
    if missing:
        raise ValueError(f"the rows lack the record key columns {missing}")
    types = {f.name: f.dataType for f in events_df.schema.fields}
    fixed = {
        OP_COL: F.lit(OP_DELETE),
        POSITION_COL: position,
        SOURCE_TS_COL: F.lit(ts_ms).cast(types.get(SOURCE_TS_COL, "long")),
        PARTITION_COL: F.lit(-1).cast(types[PARTITION_COL]),
        OFFSET_COL: F.lit(offset).cast(types[OFFSET_COL]),
        DELETED_COL: F.lit(True),
        UNAVAILABLE_COL: F.array().cast("array<string>"),
        SNAPSHOT_END_COL: F.lit(False),
    }
    if SOFT_DELETED_COL in events_df.columns:  # the row stays, flagged, its values its own
        fixed.update({DELETED_COL: F.lit(False), SOFT_DELETED_COL: F.lit(True),
                      SOFT_DELETED_AT_COL: F.timestamp_millis(F.lit(ts_ms).cast("long"))})
    return _as_events(events_df, rows_df).select(*[
        fixed[name].alias(name) if name in fixed else F.col(name) for name in events_df.columns
    ])
