"""Source: the Kafka topics of one Debezium connector, as a streaming DataFrame of raw records."""
from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession

from app.config import KafkaConfig


def read_kafka(spark: SparkSession, kafka: KafkaConfig, starting_offsets: str | None = None) -> DataFrame:
    """Subscribe to the topic pattern; rows keep key, value and header bytes as read.

    `starting_offsets` (Spark's JSON, app/resume.py) overrides `kafka.starting_offsets` for a start without a
    checkpoint over existing tables; a checkpoint always wins over both.
    """
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
        .option("subscribePattern", kafka.topic_pattern)
        .option("startingOffsets", starting_offsets or kafka.starting_offsets)
        .option("includeHeaders", "true")
        .option("failOnDataLoss", str(kafka.fail_on_data_loss).lower())
    )
    if kafka.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(kafka.max_offsets_per_trigger))
    for key, value in kafka.options.items():
        reader = reader.option(f"kafka.{key}", value)
    return reader.load()
