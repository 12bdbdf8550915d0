"""Bronze rows keep the Kafka columns as read and partition by the UTC date of the Kafka timestamp."""
from __future__ import annotations

from datetime import UTC, date, datetime

from chispa import assert_df_equality
from pyspark.sql import SparkSession
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DateType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from app.bronze import bronze_rows

HEADER = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
KAFKA_SCHEMA = StructType([
    StructField("key", BinaryType()),
    StructField("value", BinaryType()),
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("timestamp", TimestampType()),
    StructField("timestampType", IntegerType()),
    StructField("headers", ArrayType(HEADER)),
])


def test_bronze_rows_partition_by_utc_date_whatever_the_session_zone(spark: SparkSession) -> None:
    # 03:30 UTC on 2 January is still 1 January in Los Angeles (the test session's zone) and in TZ.
    ts = datetime(2024, 1, 2, 3, 30, tzinfo=UTC)
    headers = [("h", b"\x01\x02")]
    kafka_df = spark.createDataFrame(
        [(b"\x00k", b"\x00v", "p.s.t", 0, 7, ts, 0, headers), (None, None, "p.s.t", 0, 8, ts, 0, None)],
        KAFKA_SCHEMA,
    )
    assert spark.conf.get("spark.sql.session.timeZone") != "UTC"
    expected = spark.createDataFrame(
        [("p.s.t", 0, 7, ts, 0, b"\x00k", b"\x00v", headers, date(2024, 1, 2)),
         ("p.s.t", 0, 8, ts, 0, None, None, None, date(2024, 1, 2))],
        StructType([
            StructField("topic", StringType()), StructField("partition", IntegerType()),
            StructField("offset", LongType()), StructField("timestamp", TimestampType()),
            StructField("timestampType", IntegerType()), StructField("key", BinaryType()),
            StructField("value", BinaryType()), StructField("headers", ArrayType(HEADER)),
            StructField("date", DateType()),
        ]),
    )
    assert_df_equality(bronze_rows(kafka_df), expected, ignore_nullable=True)
