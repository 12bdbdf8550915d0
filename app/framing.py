"""Wire framing: split each Kafka key/value into writer schema id and Avro body.

Confluent-compatible framing (Apicurio 3.x default, and 2.x with as-confluent): magic byte 0x00, a 4-byte
big-endian schema id, then the Avro binary body. A null value is a tombstone and carries no id.
Pure DataFrame -> DataFrame functions; nothing here talks to the registry.
"""
from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

MAGIC_BYTE = b"\x00"
HEADER_LEN = 5  # magic byte + 4-byte id


def _schema_id(data: Column) -> Column:
    # conv(hex(...)) reads the 4 id bytes as an unsigned big-endian number without a Python UDF.
    return F.conv(F.hex(F.substring(data, 2, 4)), 16, 10).cast("long")


def _is_framed(data: Column) -> Column:
    return (F.length(data) > HEADER_LEN) & (F.substring(data, 1, 1) == F.lit(MAGIC_BYTE))


def with_framing(df: DataFrame) -> DataFrame:
    """Add writer schema ids and Avro bodies for key and value.

    Adds `key_schema_id`, `value_schema_id` (long, null for null bytes or bad framing), `value_payload`
    (binary) and `value_framed` (false when a non-null value lacks the framing: a poison record).
    """
    value, key = F.col("value"), F.col("key")
    return (
        df.withColumn("value_framed", value.isNull() | _is_framed(value))
        .withColumn("value_schema_id", F.when(_is_framed(value), _schema_id(value)))
        .withColumn("value_payload", F.when(_is_framed(value), F.expr(f"substring(value, {HEADER_LEN + 1})")))
        .withColumn("key_schema_id", F.when(_is_framed(key), _schema_id(key)))
    )
