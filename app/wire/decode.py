"""Avro decode in the JVM: spark-avro `from_avro` against one writer schema at a time.

A batch can hold several writer schema ids for one topic (a column added mid-stream), so the caller decodes
each (topic, id) slice with that id's schema and unions the results after unwrapping.

An undecodable body must stop the batch with a message naming the record. `from_avro` in PERMISSIVE mode
does not return null for a record schema: it returns a row whose fields are all null, even the ones the
schema declares non-null. Such a row is the failure marker; `raise_error` then fails the task with the
record's coordinates, and `decode_error_from` turns that message back into a typed error on the driver. No
extra Spark action is spent on the check.
"""
from __future__ import annotations

import json
import operator
import re
from functools import reduce
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.avro.functions import from_avro

from app.errors import SchemaDecodeError

DECODE_ERROR_TAG = "CDC_DECODE_ERROR"
_DECODED = "_cdc_decoded"  # the body decoded, before its check; dropped again by decode_value
_DECODE_ERROR_RE = re.compile(
    DECODE_ERROR_TAG + r" topic=(?P<topic>\S+) partition=(?P<partition>\d+) offset=(?P<offset>\d+) "
    r"schema_id=(?P<schema_id>\d+)"
)


def decode_value(df: DataFrame, schema_json: str) -> DataFrame:
    """Decode `value_payload` with the writer schema into a struct column `envelope`.

    Rows must all carry the writer schema id the schema belongs to. Raises (when the plan runs) a Spark
    error tagged CDC_DECODE_ERROR naming topic, partition, offset and schema id for an undecodable body.
    """
    # Decoded in a projection of its own and checked in the next: the check reads one `from_avro` (Spark does
    # not inline a costly expression used twice) instead of a copy per condition. The checked column is marked
    # nondeterministic (a branch on spark_partition_id() that never matches): Spark pushes no filter through a
    # projection holding such a column, so a filter on `envelope` (the op filter, unwrap's) reads the decoded
    # value instead of copying `from_avro` into its condition once per reference (five copies, each building
    # its Avro reader and a Hadoop configuration per task).
    df = df.withColumn(_DECODED, from_avro(F.col("value_payload"), schema_json, {"mode": "PERMISSIVE"}))
    decoded = F.col(_DECODED)
    failure = F.raise_error(
        F.format_string(
            DECODE_ERROR_TAG + " topic=%s partition=%d offset=%d schema_id=%d",
            F.col("topic"), F.col("partition"), F.col("offset"), F.col("value_schema_id"),
        )
    )
    # raise_error is typed null; the CASE takes the struct type from the decoded branch.
    checked = F.when(_decode_failed(decoded, schema_json) & F.col("value_payload").isNotNull(), failure)
    barrier = F.spark_partition_id() < 0  # never true; nondeterministic (see above)
    return df.withColumn("envelope", checked.when(barrier, F.lit(None)).otherwise(decoded)).drop(_DECODED)


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


def decode_error_from(exc: BaseException) -> SchemaDecodeError | None:
    """The SchemaDecodeError carried by a Spark failure of `decode_value`, or None for other failures."""
    match = _DECODE_ERROR_RE.search(str(exc))
    if match is None:
        return None
    return SchemaDecodeError(
        match["topic"], int(match["partition"]), int(match["offset"]), int(match["schema_id"]),
        "the Avro body does not match its writer schema",
    )


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
