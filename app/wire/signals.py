"""Signals to a Debezium connector through its Kafka signal channel: an incremental snapshot of one table.

The connector reads them when `signal.enabled.channels` holds `kafka` and `signal.kafka.topic` names the topic
(`sources[].signal_topic` here); a message's key is the connector's `topic.prefix`, its value the signal as JSON
(Debezium's "Sending signals to a Debezium connector": `execute-snapshot`, type `INCREMENTAL`). PostgreSQL's and
MariaDB's incremental snapshots also write watermarks to the source's signal table (`signal.data.collection`),
so the connector needs that table too.

The message is written through Spark's Kafka sink with the job's own `kafka.*` options, so it reaches MSK with
the same authentication as the job's reads.
"""
from __future__ import annotations

import json
import logging

from pyspark.sql import SparkSession

from app.config import KafkaConfig

log = logging.getLogger(__name__)


def snapshot_signal(data_collection: str) -> str:
    """The value of an `execute-snapshot` signal for one data collection (`schema.table`, `database.table`)."""
    return json.dumps({"type": "execute-snapshot",
                       "data": {"data-collections": [data_collection], "type": "INCREMENTAL"}})


def request_snapshot(
    spark: SparkSession, kafka: KafkaConfig, signal_topic: str, topic_prefix: str, data_collection: str
) -> None:
    """Ask the connector whose `topic.prefix` is `topic_prefix` for an incremental snapshot of `data_collection`.

    Raises:
        pyspark's CapturedException / Py4JJavaError: the message could not be written.
    """
    rows = spark.createDataFrame([(topic_prefix, snapshot_signal(data_collection))], "key string, value string")
    writer = (rows.write.format("kafka").option("kafka.bootstrap.servers", kafka.bootstrap_servers)
              .option("topic", signal_topic))
    for key, value in kafka.options.items():
        writer = writer.option(f"kafka.{key}", value)
    writer.save()
    log.info("asked the connector %s for an incremental snapshot of %s (signal topic %s)", topic_prefix,
             data_collection, signal_topic)
