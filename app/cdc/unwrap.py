"""Debezium envelope unwrap and in-batch ordering. Pure DataFrame -> DataFrame steps.

    decoded envelope --with_event_errors----> `_cdc_error` also for an op, image or key the job cannot apply
                     --filter_data_changes--> c/r/u/d only (and every event in error, for the dead letters)
                     --unwrap_envelope-----> row image + _cdc_* columns + _hoodie_is_deleted, the ordering
                                             string (app/cdc/position.py), and the columns whose value the event
                                             does not carry (_cdc_unavailable: TOAST placeholders, nulled)
                     --with_debezium_types-> faithful Spark types (app/cdc/debezium_types.py)
                     --with_soft_deletes---> soft-delete tables only: deletes become flagged rows that keep
                                             their values (every non-key column unavailable)
      (an event Debezium's unwrap SMT already flattened: unwrap_flattened gives the same columns)
      (the slices of one table are unioned here; app/cdc/unavailable.py may add the table's current rows)
                     --with_carried_values-> an unavailable column takes the key's previous value
                     --with_latest_flag----> the latest event per record key: the highest position, then offset
"""
from __future__ import annotations

import operator
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from functools import reduce
from typing import Final

from pyspark.sql import Column, DataFrame, Window, WindowSpec
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType, StringType, StructType

from app.cdc.columns import (
    DELETED_COL,
    ERROR_COL,
    LATEST_COL,
    OFFSET_COL,
    OP_COL,
    PARTITION_COL,
    POSITION_COL,
    SEGMENT_COL,
    SNAPSHOT_END_COL,
    SOFT_DELETED_AT_COL,
    SOFT_DELETED_COL,
    SOURCE_TS_COL,
    UNAVAILABLE_COL,
)
from app.cdc.position import connector_kind, position_column
from app.errors import EnvelopeError
from app.wire.decode import error_struct, no_error

OP_CREATE: Final = "c"
OP_READ: Final = "r"  # snapshot read
OP_UPDATE: Final = "u"
OP_DELETE: Final = "d"
OP_TRUNCATE: Final = "t"
OP_MESSAGE: Final = "m"
DATA_OPS = (OP_CREATE, OP_READ, OP_UPDATE, OP_DELETE)
# `source.snapshot` of a full snapshot's last read: of the whole snapshot, or of one of its tables (Debezium 2.2+).
SNAPSHOT_LAST: Final = ("last", "last_in_data_collection")
SKIPPED_OPS = (OP_TRUNCATE, OP_MESSAGE)

# The value Debezium's PostgreSQL connector sends for a TOASTed column an UPDATE left untouched
# (`unavailable.value.placeholder`, default below).
UNAVAILABLE_PLACEHOLDER: Final = "__debezium_unavailable_value"

PlaceholderTest = Callable[[Column], Column]


# Kinds of `_cdc_error` (app/cdc/columns.py) found here, besides the decode's (app/wire/decode.py).
UNKNOWN_OP: Final = "unknown_op"
NULL_IMAGE: Final = "null_image"
MISSING_KEY: Final = "missing_key"
KEY_FRAMING: Final = "key_framing"
KEY_SCHEMA: Final = "key_schema_mismatch"
EMPTY_KEY: Final = "empty_key"


@dataclass(frozen=True)
class KeyCheck:
    """What a record's Kafka key must be for its table. `required`: the table's record key comes from the
    Debezium key (no `record_key` in config), so a data change needs a framed key. `refused`: key schema ids (by
    framing id type and id) whose fields are not the table's record key, with the reason."""

    required: bool = False
    refused: Mapping[tuple[str, int], str] | None = None


NO_KEY_CHECK: Final = KeyCheck()


def filter_tombstones(df: DataFrame) -> DataFrame:
    """Drop Kafka tombstones (null value): Debezium emits one after each delete, for log compaction."""
    return df.filter(F.col("value").isNotNull())


def with_event_errors(df: DataFrame, envelope: bool, keys: KeyCheck = NO_KEY_CHECK) -> DataFrame:
    """Set `_cdc_error` (unless the decode set it) on a decoded event the job cannot apply: an op Debezium does not
    send, a create/read/update without `after` or a delete without `before` (envelopes), a data change whose Kafka
    key is missing or unframed where the table's key comes from it, a key of a refused key schema.

    Args:
        df: decoded rows: `envelope` (the envelope, or the flat record of the unwrap SMT), `key`, the key's framing
            columns (app/wire/framing.py), `_cdc_error`.
        envelope: whether `envelope` is a Debezium envelope (else a flattened event).
    """
    fields = set(struct_fields(df, "envelope"))
    if envelope:
        op = F.col("envelope.op")
    elif "__op" in fields:
        op = F.when(F.lower(F.col(f"envelope.{FLAT_DELETED}").cast("string")) == "true", F.lit(OP_DELETE)).otherwise(
            F.col("envelope.__op"))
    else:
        op = F.lit(OP_UPDATE)
    data = op.isin(*DATA_OPS)
    error = F.when(_error(df).isNotNull(), _error(df)).when(
        op.isNull() | ~op.isin(*DATA_OPS, *SKIPPED_OPS),
        error_struct(UNKNOWN_OP, F.format_string("op %s is none of Debezium's (c, r, u, d, t, m)",
                                                 F.coalesce(op, F.lit("null")))),
    )
    if envelope:
        error = error.when(
            op.isin(OP_CREATE, OP_READ, OP_UPDATE) & F.col("envelope.after").isNull(),
            error_struct(NULL_IMAGE, F.format_string("op %s without an after image", op)),
        ).when(
            (op == OP_DELETE) & F.col("envelope.before").isNull(),
            error_struct(NULL_IMAGE, F.lit("op d without a before image")),
        )
    if keys.required:
        error = error.when(
            data & F.col("key").isNull(),
            error_struct(MISSING_KEY, F.lit(
                "no Kafka key, and the table's record key comes from the Debezium key (a table without a primary "
                "key needs record_key in config)")),
        ).when(
            data & F.col("key_frame_error").isNotNull(),
            error_struct(KEY_FRAMING, F.concat(F.lit("key "), F.col("key_frame_error"))),
        )
    for (id_type, key_id), reason in sorted((keys.refused or {}).items()):
        error = error.when(
            data & (F.col("key_id_type") == id_type) & (F.col("key_schema_id") == key_id),
            error_struct(KEY_SCHEMA, F.lit(reason)),
        )
    return df.withColumn(ERROR_COL, error.otherwise(no_error()))


def with_key_errors(df: DataFrame, key_columns: Sequence[str]) -> DataFrame:
    """Set `_cdc_error` (unless set) on a data change whose record key is null or empty (an empty string or byte
    string) in every column: Hudi's key generators refuse such a key, and its write would fail for the whole table
    (a primary key of '' in PostgreSQL, or a configured `record_key` column holding null). Other events keep
    flowing; these go to the dead letters."""
    types = {f.name: f.dataType for f in df.schema.fields}
    missing = [
        F.col(c).isNull() | (F.length(c) == 0) if isinstance(types[c], StringType | BinaryType) else F.col(c).isNull()
        for c in key_columns
    ]
    empty = F.col(OP_COL).isin(*DATA_OPS) & reduce(operator.and_, missing)
    error = F.col(ERROR_COL) if ERROR_COL in df.columns else no_error()
    names = ", ".join(key_columns)
    return df.withColumn(ERROR_COL, F.when(error.isNull() & empty, error_struct(EMPTY_KEY, F.lit(
        f"the record key ({names}) is null or empty in every column: Hudi cannot store a row without a key"
    ))).otherwise(error))


def filter_data_changes(df: DataFrame, truncates: bool = False) -> DataFrame:
    """Keep create/read/update/delete events, and every event in error (for the dead letters); truncate and
    logical-message events carry no row. `truncates`: keep truncate events too (a table whose truncate policy is
    `clear`: app/cdc/derived.py); they unwrap to a row of nulls with op `t` and their position."""
    ops = (*DATA_OPS, OP_TRUNCATE) if truncates else DATA_OPS
    return df.filter(_error(df).isNotNull() | F.col("envelope.op").isin(*ops))


def struct_fields(df: DataFrame, *path: str) -> list[str]:
    """The field names of the struct column at `path` (`"envelope", "source"`), read off the frame's schema;
    empty where a step of the path is missing or not a struct. (`df.select("envelope.*").columns` would analyse
    a new plan over the whole batch for the same answer.)"""
    node: StructType = df.schema
    for name in path:
        child = node[name].dataType if name in node.fieldNames() else None
        if not isinstance(child, StructType):
            return []
        node = child
    return node.fieldNames()


def _error(df: DataFrame) -> Column:
    """The rows' `_cdc_error`; none when the frame has no such column (a frame not from decode_value)."""
    return F.col(ERROR_COL) if ERROR_COL in df.columns else no_error()


def _kept_error(df: DataFrame) -> list[Column]:
    return [F.col(ERROR_COL)] if ERROR_COL in df.columns else []


def unwrap_envelope(
    df: DataFrame,
    value_columns: Sequence[str],
    connector: str,
    placeholders: Mapping[str, PlaceholderTest] | None = None,
) -> DataFrame:
    """Flatten each change event into its row image plus ordering, delete and availability columns.

    Upserts take `after`; deletes take `before` (which, without REPLICA IDENTITY FULL, holds only the key
    columns: the rest become null in the delete row, which a hard delete drops anyway).

    Args:
        df: rows with `envelope` (decoded Debezium Envelope), `partition`, `offset`, `_cdc_error`
            (with_event_errors).
        value_columns: the Value record's field names, in writer-schema order.
        connector: which connector's source position to read (app/cdc/position.py `connector_kind`).
        placeholders: per column that can hold Debezium's unavailable-value placeholder, the test for it. A
            column holding the placeholder becomes null and is listed in `_cdc_unavailable`.
    Raises:
        EnvelopeError: the envelope lacks before/after/op/source.
    """
    envelope_fields = set(struct_fields(df, "envelope"))
    missing = {"before", "after", "op", "source"} - envelope_fields
    if missing:
        raise EnvelopeError(f"not a Debezium envelope: missing {sorted(missing)} in {sorted(envelope_fields)}")
    placeholders = {name: test for name, test in (placeholders or {}).items() if name in value_columns}
    is_delete = F.col("envelope.op") == OP_DELETE
    image = F.when(is_delete, F.col("envelope.before")).otherwise(F.col("envelope.after"))
    unavailable = {name: F.coalesce(test(image[name]), F.lit(False)) for name, test in placeholders.items()}
    columns = [
        F.when(unavailable[name], F.lit(None)).otherwise(image[name]).alias(name) if name in unavailable
        else image[name].alias(name)
        for name in value_columns
    ]
    source_fields = struct_fields(df, "envelope", "source")
    return df.select(
        *columns,
        F.col("envelope.op").alias(OP_COL),
        position_column(F.col("envelope.source"), connector, source_fields)
        .alias(POSITION_COL),
        F.col("envelope.source.ts_ms").alias(SOURCE_TS_COL),
        F.col("partition").alias(PARTITION_COL),
        F.col("offset").alias(OFFSET_COL),
        is_delete.alias(DELETED_COL),
        _names_where(unavailable).alias(UNAVAILABLE_COL),
        _snapshot_end(F.col("envelope.op"), F.col("envelope.source"), source_fields),
        *_kept_error(df),
    )


def _snapshot_end(op: Column, source: Column, source_fields: Collection[str]) -> Column:
    """A full snapshot's last read (SNAPSHOT_LAST); false where the source does not say."""
    if "snapshot" not in source_fields:
        return F.lit(False).alias(SNAPSHOT_END_COL)
    last = (op == OP_READ) & F.lower(source["snapshot"].cast("string")).isin(*SNAPSHOT_LAST)
    return F.coalesce(last, F.lit(False)).alias(SNAPSHOT_END_COL)


# Debezium's unwrap SMT (ExtractNewRecordState) turns an event into its row image; `add.fields` adds envelope and
# source fields under `add.fields.prefix` (this default), `.` becoming `_`: __op, __lsn, __source_ts_ms. The
# rewrite modes of `delete.tombstone.handling.mode` add __deleted ("true"/"false"), a delete keeping its before
# image and its added fields.
FLAT_PREFIX: Final = "__"
FLAT_DELETED: Final = "__deleted"
ENVELOPE_FIELDS: Final = frozenset({"before", "after", "op", "source"})
_POSITION_HINT: Final = (
    "add.fields must name the source position: lsn (PostgreSQL), file,pos,row (MySQL/MariaDB) or "
    "commit_lsn,change_lsn,event_serial_no (SQL Server), e.g. add.fields=op,lsn,source.ts_ms"
)


def is_envelope(field_names: Collection[str]) -> bool:
    """A Debezium envelope (before/after/op/source) rather than an event the unwrap SMT flattened."""
    return ENVELOPE_FIELDS <= set(field_names)


def flattened_layout(field_names: Sequence[str]) -> tuple[list[str], str]:
    """The row's columns and the connector kind of a flattened event's fields.

    Raises:
        EnvelopeError: the SMT's settings lose deletes or ordering; the message names the setting to change.
    """
    added = list(_added_fields(field_names))
    if FLAT_DELETED not in field_names:
        raise EnvelopeError(
            "an unwrap-SMT event without __deleted: its deletes are dropped or arrive as tombstones that carry no "
            "source position (delete.tombstone.handling.mode drop, tombstone or delete-to-tombstone), so they "
            "cannot be applied in order; set the SMT's delete.tombstone.handling.mode=rewrite (or "
            "rewrite-with-tombstone)"
        )
    try:
        kind = connector_kind(added)
    except EnvelopeError as e:
        raise EnvelopeError(f"an unwrap-SMT event without its source position (fields {sorted(added)}): "
                            f"{_POSITION_HINT}") from e
    return [n for n in field_names if not n.startswith(FLAT_PREFIX)], kind


def _added_fields(field_names: Collection[str]) -> dict[str, str]:
    """The SMT's added fields by their envelope or source name (`__lsn` and `__source_lsn` are both `lsn`)."""
    added: dict[str, str] = {}
    for name in sorted(n for n in field_names if n.startswith(FLAT_PREFIX)):
        added.setdefault(name.removeprefix(FLAT_PREFIX).removeprefix("source_"), name)
    return added


def unwrap_flattened(
    df: DataFrame,
    value_columns: Sequence[str],
    connector: str,
    placeholders: Mapping[str, PlaceholderTest] | None = None,
) -> DataFrame:
    """unwrap_envelope for events the unwrap SMT flattened (rewrite modes): the same columns, read off the
    added fields. A delete is `__deleted = "true"`; its op is `__op` when added, else `d`/`u`; its source time
    `__source_ts_ms` when added. Rows of other ops than c/r/u/d are dropped.

    Args:
        df: rows with `envelope` (the decoded flat record), `partition`, `offset`, `_cdc_error` (with_event_errors).
    """
    fields = set(struct_fields(df, "envelope"))
    flat = F.col("envelope")
    deleted = F.lower(flat[FLAT_DELETED].cast("string")) == "true"
    op = F.when(deleted, F.lit(OP_DELETE)).otherwise(
        flat["__op"] if "__op" in fields else F.lit(OP_UPDATE)
    )
    source = F.struct(*[flat[full].alias(short) for short, full in _added_fields(fields).items()])
    source_ts = flat["__source_ts_ms"] if "__source_ts_ms" in fields else F.lit(None).cast("long")
    placeholders = {name: test for name, test in (placeholders or {}).items() if name in value_columns}
    unavailable = {name: F.coalesce(test(flat[name]), F.lit(False)) for name, test in placeholders.items()}
    columns = [
        F.when(unavailable[name], F.lit(None)).otherwise(flat[name]).alias(name) if name in unavailable
        else flat[name].alias(name)
        for name in value_columns
    ]
    return df.filter(_error(df).isNotNull() | op.isin(*DATA_OPS)).select(
        *columns,
        op.alias(OP_COL),
        position_column(source, connector, _added_fields(fields)).alias(POSITION_COL),
        source_ts.alias(SOURCE_TS_COL),
        F.col("partition").alias(PARTITION_COL),
        F.col("offset").alias(OFFSET_COL),
        deleted.alias(DELETED_COL),
        _names_where(unavailable).alias(UNAVAILABLE_COL),
        _snapshot_end(op, source, _added_fields(fields)),
        *_kept_error(df),
    )


def _names_where(flags: Mapping[str, Column]) -> Column:
    """An array<string> of the names whose flag is true."""
    if not flags:
        return F.array().cast("array<string>")
    return F.filter(
        F.array(*[F.when(flag, F.lit(name)) for name, flag in flags.items()]), lambda x: x.isNotNull()
    )


def with_soft_deletes(df: DataFrame, key_columns: Sequence[str], value_columns: Sequence[str]) -> DataFrame:
    """Soft-delete tables: a delete keeps the row, flagged `_cdc_deleted` with its source time.

    A delete's before image may hold only the key (default replica identity), so every non-key column is
    listed unavailable: it keeps the key's previous value (app/cdc/unavailable.py), and falls back to the before
    image only when no previous version is known.
    """
    deleted = F.col(DELETED_COL)
    non_key = [c for c in value_columns if c not in key_columns]
    return df.select(
        *[F.col(c) for c in df.columns if c not in (DELETED_COL, UNAVAILABLE_COL)],
        F.lit(False).alias(DELETED_COL),
        F.when(deleted, F.array(*[F.lit(c) for c in non_key]).cast("array<string>"))
        .otherwise(F.col(UNAVAILABLE_COL)).alias(UNAVAILABLE_COL),
        deleted.alias(SOFT_DELETED_COL),
        F.when(deleted, F.timestamp_millis(F.col(SOURCE_TS_COL))).alias(SOFT_DELETED_AT_COL),
    )




def is_delete(columns: Sequence[str]) -> Column:
    """A delete event: a hard delete, or a soft-deleted row (when the frame has the soft-delete flag)."""
    delete = F.col(OP_COL) == OP_DELETE
    if SOFT_DELETED_COL in columns:
        delete = delete | F.coalesce(F.col(SOFT_DELETED_COL), F.lit(False))
    return delete


def _key_groups(key_columns: Sequence[str], columns: Sequence[str]) -> list[Column]:
    """A key's events, apart from its events in error (`_cdc_error`): those never order, give or take a value."""
    groups = [F.col(c) for c in key_columns]
    return [*groups, F.col(ERROR_COL).isNull()] if ERROR_COL in columns else groups


def _source_order(key_columns: Sequence[str], columns: Sequence[str]) -> WindowSpec:
    return Window.partitionBy(*_key_groups(key_columns, columns)).orderBy(F.col(POSITION_COL), F.col(OFFSET_COL))


def with_carried_values(df: DataFrame, key_columns: Sequence[str], columns: Sequence[str]) -> DataFrame:
    """Give each unavailable column the value of the key's previous version, in source order.

    The previous version is the latest earlier event of the key that carries the column (the batch's own
    events, and the table's current row when app/cdc/unavailable.py added it). An upsert after a delete (or after
    a soft-deleted current row) takes nothing from before it: the delete ended the key's history. A column
    still unavailable after this (no earlier version known) keeps its own value (null for a TOAST placeholder,
    the before image for a soft delete) and stays listed in `_cdc_unavailable`.

    Args:
        columns: the columns that can be unavailable; others pass unchanged.
    """
    if not columns:
        return df
    # A delete ends a key's history: the first upsert after it (a re-insert, or a primary-key change into the
    # key) starts a new segment and never takes a value from the delete or from before it. A delete after a
    # delete (a redelivered one, or a soft-deleted current row) stays in the segment and keeps its values.
    delete = is_delete(df.columns)
    order = _source_order(key_columns, df.columns)
    restart = ~delete & F.coalesce(F.lag(delete).over(order), F.lit(False))
    segmented = df.withColumn(
        SEGMENT_COL, F.sum(restart.cast("int")).over(order.rowsBetween(Window.unboundedPreceding, 0))
    )
    earlier = _source_order([*key_columns, SEGMENT_COL], df.columns).rowsBetween(Window.unboundedPreceding, -1)
    listed = {c: F.array_contains(F.col(UNAVAILABLE_COL), c) for c in columns}
    previous = {
        c: F.last(F.when(~listed[c], F.struct(F.col(c).alias("v"))), ignorenulls=True).over(earlier)
        for c in columns
    }
    carried = {c: listed[c] & previous[c].isNotNull() for c in columns}
    out = [
        F.when(carried[c], previous[c]["v"]).otherwise(F.col(c)).alias(c) if c in carried else F.col(c)
        for c in df.columns
        if c != UNAVAILABLE_COL
    ]
    still = _names_where({c: listed[c] & ~carried[c] for c in columns})
    return segmented.select(*out, still.alias(UNAVAILABLE_COL))


def with_latest_flag(df: DataFrame, key_columns: Sequence[str]) -> DataFrame:
    """Flag the latest event per record key: highest position, ties broken by the higher Kafka offset. An event in
    error (`_cdc_error`) is never the latest, nor does it hide the latest good one.

    Hudi's precombine orders on the position alone; the offset tie-break needs the window.
    """
    order = Window.partitionBy(*_key_groups(key_columns, df.columns)).orderBy(
        F.col(POSITION_COL).desc_nulls_last(), F.col(OFFSET_COL).desc()
    )
    latest = F.row_number().over(order) == 1
    if ERROR_COL in df.columns:
        latest = latest & F.col(ERROR_COL).isNull()
    return df.withColumn(LATEST_COL, latest)


def filter_latest(flagged_df: DataFrame) -> DataFrame:
    """Keep the events with_latest_flag flagged, without the flag."""
    return flagged_df.filter(F.col(LATEST_COL)).drop(LATEST_COL)


def dedupe_latest(df: DataFrame, key_columns: Sequence[str]) -> DataFrame:
    """Keep only the latest event per record key (see with_latest_flag)."""
    return df.transform(with_latest_flag, key_columns).transform(filter_latest)
