"""Source: the Kafka topics of one Debezium connector, as a streaming DataFrame of raw records."""
from __future__ import annotations

import re
import time
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
    checkpoint over existing tables; a checkpoint always wins over both. `kafka.fetch_max_wait_ms` bounds how long
    the broker holds an executor's fetch waiting for records (docs/performance.md).
    """
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
        .option("subscribePattern", subscribe_pattern(kafka.topic_pattern))
        .option("startingOffsets", starting_offsets or kafka.starting_offsets)
        .option("includeHeaders", "true")
        .option("failOnDataLoss", str(kafka.fail_on_data_loss).lower())
        .option("kafka.fetch.max.wait.ms", str(kafka.fetch_max_wait_ms))
    )
    if kafka.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(kafka.max_offsets_per_trigger))
    for key, value in kafka.options.items():
        reader = reader.option(f"kafka.{key}", value)
    return reader.load()


class UncountedError(Exception):
    """The topics' records could not be counted before the JVM started (why in the message)."""


def retained_records(kafka: KafkaConfig, timeout_s: float = 10.0) -> int:
    """Every record the topics of `kafka.topic_pattern` hold (each partition's high watermark less its low, so
    compacted-away and transaction-marker offsets count too), asked of the broker by a librdkafka client in this
    Python process: what the job can know of its backlog before the driver's JVM starts. An upper bound of an
    `--available-now` run's backlog (the records past the checkpoint are among them).

    Raises:
        UncountedError: confluent-kafka is not installed, `kafka.options` holds a setting librdkafka does not take
            (a JVM client's `sasl.jaas.config`, MSK IAM's), or the broker did not answer in `timeout_s`.
    """
    try:
        # Not a dependency of the job's package: only a run whose config asks for the count needs it
        from confluent_kafka import Consumer, KafkaException, TopicPartition  # noqa: PLC0415
    except ImportError as e:
        raise UncountedError(f"no Kafka client in this Python ({e}; pip install confluent-kafka)") from e
    try:  # librdkafka's own log lines off: a failure is this function's error, said once by its caller
        consumer = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": "cdc-lakehouse-count",
                             "enable.auto.commit": False, "log_level": 0, **kafka.options})
    except KafkaException as e:
        raise UncountedError(f"kafka.options not taken by librdkafka: {e}") from e
    deadline = time.monotonic() + timeout_s  # the whole count's, not each request's

    def left() -> float:
        return max(deadline - time.monotonic(), 0.001)

    try:
        pattern, total = re.compile(kafka.topic_pattern), 0
        for name, topic in consumer.list_topics(timeout=left()).topics.items():
            if not pattern.fullmatch(name):
                continue
            for partition in topic.partitions:
                marks = consumer.get_watermark_offsets(TopicPartition(name, partition), timeout=left(), cached=False)
                if marks is None:
                    raise UncountedError(f"{name}[{partition}]: no watermarks within {timeout_s:.0f} s")
                total += marks[1] - marks[0]
        return total
    except KafkaException as e:
        raise UncountedError(f"the broker did not answer: {e}") from e
    finally:
        consumer.close()
