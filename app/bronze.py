"""Bronze: the raw copy of every Kafka record, as Parquet, written before the Silver write of its batch.

Layout: <bronze>/topic=<topic>/date=<UTC date of the Kafka timestamp>/part-*.parquet, one row per
(topic, partition, offset) with the key, value and header bytes exactly as read.
"""
from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

BRONZE_COLUMNS = ("topic", "partition", "offset", "timestamp", "timestampType", "key", "value", "headers")


def bronze_rows(kafka_df: DataFrame) -> DataFrame:
    """The Bronze projection of a Kafka source frame: raw columns plus the UTC date partition."""
    # Days since the epoch of the instant: the UTC date, whatever the session's or the JVM's time zone.
    utc_date = F.expr("date_add(DATE'1970-01-01', CAST(floor(unix_micros(timestamp) / 86400000000) AS INT))")
    return kafka_df.select(*BRONZE_COLUMNS, utc_date.alias("date"))


def write_bronze(kafka_df: DataFrame, bronze_path: str) -> None:
    """Append the batch's records under bronze_path, partitioned by topic and UTC date."""
    (
        bronze_rows(kafka_df)
        .write.mode("append")
        .partitionBy("topic", "date")
        .parquet(bronze_path)
    )
