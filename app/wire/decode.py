"""Avro decode in the JVM: spark-avro `from_avro` against one writer schema at a time.

A batch can hold several writer schema ids for one topic (a column added mid-stream), so the caller decodes
each (topic, id) slice with that id's schema and unions the results after unwrapping.

A body that does not match its writer schema must not pass as data. Two ways it shows:
- `from_avro` in PERMISSIVE mode cannot read it. For a record schema it then returns a row whose fields are all
  null, even the ones the schema declares non-null, not a null: such a row is the failure marker (`decode`).
- `from_avro` reads it, but not to its end: Avro's decoder never checks that every byte was consumed, so a body
  of another schema, or one with bytes appended, can decode into plausible values. Binary Avro is canonical (one
  encoding per value, as every Avro writer emits it), so the decoded value encoded again with the same schema
  (`to_avro`) is exactly as long as the body it came from; any other length marks the body (`trailing_bytes`).
Either way the row's `_cdc_error` (app/cdc/columns.py) says so (the envelope of a body that does not decode is null)
and the caller sends it to the dead letters (or stops, in fail-fast mode). No extra Spark action is spent on the checks.
"""
from __future__ import annotations

import json
import operator
from functools import reduce
from typing import Any, Final

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.avro.functions import from_avro, to_avro

# Why a record's event cannot be applied (app/cdc/columns.py names it with the job's other columns).
ERROR_COL: Final = "_cdc_error"
_DECODED = "_cdc_decoded"  # the body decoded, before its check; dropped again by decode_value

# Kinds of error an event can carry in `_cdc_error`, and what each means (docs/when-things-go-wrong.md).
DECODE: str = "decode"
TRAILING_BYTES: str = "trailing_bytes"


def error_struct(kind: str | Column, message: Column) -> Column:
    """The `_cdc_error` value: struct<kind, message>."""
    kind_col = F.lit(kind) if isinstance(kind, str) else kind
    return F.struct(kind_col.alias("kind"), message.alias("message"))


ERROR_TYPE = "struct<kind:string,message:string>"


def no_error() -> Column:
    """The `_cdc_error` of a good event."""
    return F.lit(None).cast(ERROR_TYPE)


def decode_value(df: DataFrame, schema_json: str, ref: str = "") -> DataFrame:
    """Decode `value_payload` with the writer schema into a struct column `envelope`, and set `_cdc_error` where
    the body does not match it (module docstring); `ref` names the writer schema in that message.

    Rows must all carry the writer schema id the schema belongs to.
    """
    # Decoded in a projection of its own and checked in the next: the checks read one `from_avro` (Spark does
    # not inline a costly expression used twice) instead of a copy per condition. `envelope` is marked
    # nondeterministic (a branch on spark_partition_id() that never matches): Spark pushes no filter through a
    # projection holding such a column, so a filter on `envelope` (the op filter, unwrap's) reads the decoded
    # value instead of copying `from_avro` into its condition once per reference (five copies, each building
    # its Avro reader and a Hadoop configuration per task).
    df = df.withColumn(_DECODED, from_avro(F.col("value_payload"), schema_json, {"mode": "PERMISSIVE"}))
    decoded, payload = F.col(_DECODED), F.col("value_payload")
    failed = payload.isNotNull() & _decode_failed(decoded, schema_json)
    # CASE evaluates lazily: the failure marker (nulls in non-null fields) is never handed to to_avro.
    encoded_length = F.length(to_avro(decoded, schema_json))
    error = (
        F.when(failed, error_struct(DECODE, F.lit(f"the Avro body does not decode with writer schema {ref}")))
        .when(
            payload.isNotNull() & (encoded_length != F.length(payload)),
            error_struct(TRAILING_BYTES, F.format_string(
                f"writer schema {ref} reads %d of the body's %d bytes: the body is not of that schema",
                encoded_length, F.length(payload),
            )),
        )
    )
    barrier = F.spark_partition_id() < 0  # never true; nondeterministic (see above)
    envelope = F.when(barrier | failed, F.lit(None)).otherwise(decoded)
    kept = [df[name] for name in df.columns if name != _DECODED]  # one projection, not a select and a drop
    return df.select(*kept, envelope.alias("envelope"), error.alias(ERROR_COL))


def _decode_failed(decoded: Column, schema_json: str) -> Column:
    """True where PERMISSIVE `from_avro` could not read the body.

    For a record schema the failure marker is a row of nulls, not a null. A successful decode never yields
    null for a non-nullable field, so the record's required fields all being null marks a failure; a record
    with only nullable fields falls back to all of its fields being null.
    """
    schema = json.loads(schema_json)
    if not isinstance(schema, dict) or schema.get("type") != "record" or not schema.get("fields"):
        return decoded.isNull()
    names = [f["name"] for f in schema["fields"]]
    checked = [f["name"] for f in schema["fields"] if not _is_nullable(f["type"])] or names
    return decoded.isNull() | reduce(operator.and_, [decoded[name].isNull() for name in checked])


def _is_nullable(avro_type: Any) -> bool:
    if isinstance(avro_type, list):
        return any(_is_nullable(t) for t in avro_type)
    return avro_type == "null" or (isinstance(avro_type, dict) and avro_type.get("type") == "null")


def record_fields(schema_json: str, field_name: str | None = None) -> list[dict[str, Any]]:
    """Fields of a record schema, or of the record inside the union of one of its fields.

    Args:
        schema_json: Avro schema text.
        field_name: e.g. "after" for a Debezium envelope: the fields of its (nullable) Value record.
    Raises:
        ValueError: the schema (or the named field) is not a record.
    """
    schema = json.loads(schema_json)
    if field_name is not None:
        field = next((f for f in schema.get("fields", []) if f["name"] == field_name), None)
        if field is None:
            raise ValueError(f"schema {schema.get('name')} has no field {field_name!r}")
        branches = field["type"] if isinstance(field["type"], list) else [field["type"]]
        schema = next((b for b in branches if isinstance(b, dict) and b.get("type") == "record"), {})
    if schema.get("type") != "record":
        raise ValueError(f"not a record schema: {str(schema)[:200]}")
    return list(schema["fields"])
