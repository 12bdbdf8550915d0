"""Avro decode in the JVM: spark-avro `from_avro` against one writer schema at a time.

A batch can hold several writer schema ids for one topic (a column added mid-stream), so the caller decodes
each (topic, id) slice with that id's schema and unions the results after unwrapping.

An undecodable body must stop the batch with a message naming the record. `from_avro` in PERMISSIVE mode
returns null for a body it cannot read; `raise_error` then fails the task with the record's coordinates,
and `SchemaDecodeError.from_spark` turns that message back into a typed error on the driver. No extra
Spark action is spent on the check.
"""
from __future__ import annotations

import json
import re
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.avro.functions import from_avro

from app.errors import SchemaDecodeError

DECODE_ERROR_TAG = "CDC_DECODE_ERROR"
_DECODE_ERROR_RE = re.compile(
    DECODE_ERROR_TAG + r" topic=(?P<topic>\S+) partition=(?P<partition>\d+) offset=(?P<offset>\d+) "
    r"schema_id=(?P<schema_id>\d+)"
)


def decode_value(df: DataFrame, schema_json: str) -> DataFrame:
    """Decode `value_payload` with the writer schema into a struct column `envelope`.

    Rows must all carry the writer schema id the schema belongs to. Raises (when the plan runs) a Spark
    error tagged CDC_DECODE_ERROR naming topic, partition, offset and schema id for an undecodable body.
    """
    decoded = from_avro(F.col("value_payload"), schema_json, {"mode": "PERMISSIVE"})
    failure = F.raise_error(
        F.format_string(
            DECODE_ERROR_TAG + " topic=%s partition=%d offset=%d schema_id=%d",
            F.col("topic"), F.col("partition"), F.col("offset"), F.col("value_schema_id"),
        )
    )
    # raise_error is typed null; the CASE takes the struct type from the decoded branch.
    checked = F.when(decoded.isNull() & F.col("value_payload").isNotNull(), failure).otherwise(decoded)
    return df.withColumn("envelope", checked)


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
