"""Source: the Kafka topics of one Debezium connector, as a streaming DataFrame of raw records."""
from __future__ import annotations

from typing import Final

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from app.config import KafkaConfig

# The columns of a Kafka source read with includeHeaders (spark-sql-kafka), as foreachBatch receives them.
KAFKA_SCHEMA: Final = StructType([
    StructField("key", BinaryType()),
    StructField("value", BinaryType()),
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("timestamp", TimestampType()),
    StructField("timestampType", IntegerType()),
    StructField("headers", ArrayType(StructType([
        StructField("key", StringType()), StructField("value", BinaryType()),
    ]))),
])


def subscribe_pattern(topic_pattern: str) -> str:
    """`kafka.topic_pattern` anchored to the whole topic name.

    Spark's `subscribePattern` looks for the regex anywhere in a topic name (Scala's `Regex.findFirstIn` in
    spark-sql-kafka's SubscribePatternStrategy), so `crm\\..*` alone would also subscribe `xcrm.a.b`, and the job
    would then stop on a topic of no source. Anchored, it means what the rest of the job reads it as
    (app/state/resume.py's `fullmatch`).
    """
    return f"^(?:{topic_pattern})$"


def read_kafka(spark: SparkSession, kafka: KafkaConfig, starting_offsets: str | None = None) -> DataFrame:
    """Subscribe to the topics whose whole name matches the pattern; rows keep key, value and header bytes as read.

    `starting_offsets` (Spark's JSON, app/state/resume.py) overrides `kafka.starting_offsets` for a start without a
    checkpoint over existing tables; a checkpoint always wins over both.
    """
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
        .option("subscribePattern", subscribe_pattern(kafka.topic_pattern))
        .option("startingOffsets", starting_offsets or kafka.starting_offsets)
        .option("includeHeaders", "true")
        .option("failOnDataLoss", str(kafka.fail_on_data_loss).lower())
    )
    if kafka.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(kafka.max_offsets_per_trigger))
    for key, value in kafka.options.items():
        reader = reader.option(f"kafka.{key}", value)
    return reader.load()
