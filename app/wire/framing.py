"""Wire framing: split each Kafka key and value into its writer schema reference (id type, id) and Avro body.

Apicurio converters and serializers frame a record in one of three ways (REFERENCE §2); keys and values alike:
- `headers`: the id in a record header `apicurio.<key|value>.globalId` or `...contentId`, an 8-byte big-endian
  long; the body is raw Avro. The Apicurio 2.x converter's default. The header's name gives the id type.
- `id8`: magic byte 0x00, an 8-byte big-endian id, the Avro body. Apicurio 2.x with headers off.
- `id4`: magic byte 0x00, a 4-byte big-endian id, the Avro body. Apicurio 3.x default, 2.x `as-confluent`,
  Confluent serializers.
- `auto` (fallback): per record, `headers` when an id header is present, else `id8` when the four high bytes of
  an 8-byte id are zero (Apicurio's OptimisticFallbackIdHandler rule: a 4-byte id of 0 does not exist), else `id4`.

The bytes of `id8`/`id4` do not say whether the id is a globalId or a contentId: `Framing.id_type` says.

A raw Avro body often starts with 0x00 (a null `before`), so a header-framed record read as `id4` would decode
as garbage: a payload framing refuses records that carry an Apicurio id header, naming the setting to change.

Pure DataFrame -> DataFrame; nothing here talks to the registry.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from app.config import FramingMode, IdType

MAGIC_BYTE: Final = b"\x00"
HEADER_ID_BYTES: Final = 8
SIDES: Final = ("key", "value")
# Columns with_framing adds, per side: e.g. value_id_type, value_schema_id, value_payload, value_frame_error.
FRAMING_SUFFIXES: Final = ("id_type", "schema_id", "payload", "frame_error")


@dataclass(frozen=True)
class Framing:
    """How a source's converter frames keys and values (app/config/model.py `source.framing`, `source.id_type`)."""

    mode: FramingMode = "id4"
    id_type: IdType = "contentId"  # the id a payload framing carries; header framing names its own


def framing_columns(side: str) -> list[str]:
    return [f"{side}_{suffix}" for suffix in FRAMING_SUFFIXES]


def with_framing(df: DataFrame, framing: Framing = Framing()) -> DataFrame:
    """Add, for key and value: `<side>_id_type` ("contentId"/"globalId"), `<side>_schema_id` (long),
    `<side>_payload` (the Avro body) and `<side>_frame_error` (why the bytes could not be split; null if they
    could). All four are null for null bytes (a tombstone value, a record without key).

    `df` has the Kafka source's `key` and `value`, and `headers` when read with includeHeaders (without it,
    only payload framings apply).
    """
    has_headers = "headers" in df.columns
    columns: dict[str, Column] = {}
    for side in SIDES:
        parsed = _parse(side, framing, has_headers)
        columns.update({f"{side}_{suffix}": column for suffix, column in zip(FRAMING_SUFFIXES, parsed, strict=True)})
    return df.withColumns(columns)  # one projection: each withColumn would analyse the plan again


def with_source_framings(df: DataFrame, by_prefix: Sequence[tuple[str, Framing]]) -> DataFrame:
    """with_framing, where each topic takes the framing of the source whose prefix (`<prefix>.`) it starts with,
    the longest one. A topic of no source takes the first source's framing (its route is refused later)."""
    framings = list(dict.fromkeys(framing for _, framing in by_prefix))
    if len(framings) == 1:
        return with_framing(df, framings[0])
    has_headers = "headers" in df.columns
    longest_first = sorted(by_prefix, key=lambda pf: -len(pf[0]))
    columns: dict[str, Column] = {}
    for side in SIDES:
        parsed = {framing: _parse(side, framing, has_headers) for framing in framings}
        for i, suffix in enumerate(FRAMING_SUFFIXES):
            column = F.when(F.lit(False), F.lit(None))
            for prefix, framing in longest_first:
                column = column.when(F.col("topic").startswith(prefix + "."), parsed[framing][i])
            columns[f"{side}_{suffix}"] = column.otherwise(parsed[by_prefix[0][1]][i])
    return df.withColumns(columns)


@dataclass(frozen=True)
class _Parse:
    """One way of reading the bytes: when it applies, and what it yields."""

    applies: Column
    id_type: Column
    schema_id: Column
    payload: Column


def _parse(side: str, framing: Framing, has_headers: bool) -> tuple[Column, Column, Column, Column]:
    data = F.col(side)
    header = _header_parse(data, side, has_headers)
    # auto tells 8-byte ids by their four zero high bytes; an explicit id8 takes any id.
    id8 = _payload_parse(side, 8, framing.id_type, high_bytes_zero=framing.mode == "auto")
    id4 = _payload_parse(side, 4, framing.id_type)
    encoding = _header(f"apicurio.{side}.encoding", has_headers).cast("string")
    if framing.mode == "headers":
        choice = [header]
        missing = F.lit(f"no 8-byte apicurio.{side}.globalId or .contentId header (framing: headers)")
    elif framing.mode == "auto":
        # id8 before id4: an 8-byte id's first four bytes are zero, which as a 4-byte id (0) never exists.
        choice = [header, id8, id4]
        missing = F.lit("neither an apicurio id header nor the 0x00 + 4/8-byte id prefix (framing: auto)")
    else:
        choice = [id8 if framing.mode == "id8" else id4]
        width = 8 if framing.mode == "id8" else 4
        missing = F.lit(f"lacks the 0x00 + {width}-byte id prefix (framing: {framing.mode})")
    error = F.when(data.isNull(), F.lit(None))
    if framing.mode in ("id8", "id4"):
        error = error.when(
            header.applies,
            F.lit(f"carries an apicurio.{side}.* id header: the producer writes header framing; "
                  "set source.framing to headers (or auto)"),
        )
    error = error.when(
        header.applies & encoding.isNotNull() & (encoding != "BINARY"),
        F.format_string(
            f"apicurio.{side}.encoding is %s; only BINARY Avro is read (converter apicurio.registry.avro.encoding)",
            encoding,
        ),
    )
    applies = [p.applies for p in choice]
    for p in choice:
        error = error.when(p.applies & p.schema_id.isNull(), F.lit("schema id out of range (above 2^63 - 1)"))
    if framing.mode == "id4":
        # Registry ids start at 1; a zero is the high half of an 8-byte id.
        error = error.when(
            id4.applies & (id4.schema_id == 0),
            F.lit("schema id 0: an 8-byte id read as 4 bytes? set source.framing to id8 (or auto)"),
        )
    any_applies = applies[0]
    for a in applies[1:]:
        any_applies = any_applies | a
    error = error.when(~any_applies, missing)
    ok = data.isNotNull() & error.isNull()
    return (
        _first(ok, choice, "id_type"),
        _first(ok, choice, "schema_id"),
        _first(ok, choice, "payload"),
        error,
    )


def _first(ok: Column, choice: list[_Parse], attr: str) -> Column:
    result = F.when(~ok, F.lit(None))
    for p in choice:
        result = result.when(p.applies, getattr(p, attr))
    return result


def _header(name: str, has_headers: bool) -> Column:
    """The last value of a record header (Kafka's lastHeader), or null."""
    if not has_headers:
        return F.lit(None).cast("binary")
    matches = F.filter(F.col("headers"), lambda h: h["key"] == F.lit(name))
    return F.try_element_at(matches, F.lit(-1))["value"]


def _header_parse(data: Column, side: str, has_headers: bool) -> _Parse:
    content = _header(f"apicurio.{side}.contentId", has_headers)
    global_ = _header(f"apicurio.{side}.globalId", has_headers)
    content_ok = F.length(content) == HEADER_ID_BYTES
    global_ok = F.length(global_) == HEADER_ID_BYTES
    return _Parse(
        applies=data.isNotNull() & F.coalesce(content_ok | global_ok, F.lit(False)),
        id_type=F.when(content_ok, F.lit("contentId")).when(global_ok, F.lit("globalId")),
        schema_id=F.when(content_ok, _unsigned(content)).when(global_ok, _unsigned(global_)),
        payload=data,
    )


def _payload_parse(side: str, width: int, id_type: IdType, high_bytes_zero: bool = False) -> _Parse:
    data, prefix = F.col(side), 1 + width
    applies = (F.length(data) > prefix) & (F.substring(data, 1, 1) == F.lit(MAGIC_BYTE))
    if high_bytes_zero:
        applies = applies & (F.substring(data, 2, 4) == F.lit(b"\x00\x00\x00\x00"))
    return _Parse(
        applies=F.coalesce(applies, F.lit(False)),
        id_type=F.lit(id_type),
        schema_id=_unsigned(F.substring(data, 2, width)),
        # substring(binary, pos) without a length exists only in SQL.
        payload=F.expr(f"substring({side}, {prefix + 1})"),
    )


def _unsigned(id_bytes: Column) -> Column:
    """A big-endian unsigned id of up to 8 bytes as a long; null when it does not fit (top bit set)."""
    hex_text = F.hex(id_bytes)
    fits = (F.length(id_bytes) < HEADER_ID_BYTES) | (F.substring(hex_text, 1, 1) < F.lit("8"))
    # conv reads the hex digits as an unsigned number without a Python UDF.
    return F.when(fits, F.conv(hex_text, 16, 10).cast("long"))
