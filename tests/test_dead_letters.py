"""The dead-letter table (app/sink/deadletters.py) takes dead letters of every kind, in any order. Hudi holds a
column to the nullability of the table's first write: a table first written by an event in error (its source position
known) once refused every later record without one (undecodable bytes, a quarantined table's records), and that
failure stopped the job at every restart."""
from __future__ import annotations

import uuid
from datetime import datetime

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from app.batch.plan import dead_coordinates
from app.cdc.columns import ERROR_COL, OFFSET_COL, PARTITION_COL, POSITION_COL, TOPIC_COL
from app.config import JobConfig
from app.sink.deadletters import DeadLetters, dead_letter_rows
from app.wire.decode import error_struct
from tests.conftest import RUN_ID
from tests.support.cdc import job_config_for

pytestmark = pytest.mark.stack

TOPIC = "dl.s.orders"
SOURCE = ("topic string, partition int, offset long, timestamp timestamp, key binary, value binary, "
          "key_payload binary, key_id_type string, key_schema_id long, value_schema_id long, value_id_type string")


def _records(spark: SparkSession, offsets: list[int]) -> DataFrame:
    """Framed Kafka records as a batch holds them."""
    return spark.createDataFrame(
        [(TOPIC, 0, o, datetime(2026, 11, 29), b"k", b"\x00bad", None, None, None, 7, "contentId") for o in offsets],
        SOURCE,
    )


def test_a_record_without_a_position_after_an_event_in_error(
    spark: SparkSession, local_config: JobConfig, lake_root: str
) -> None:
    config = job_config_for(local_config, "dl", f"dead_letters_{RUN_ID}", f"{lake_root}/dl-{uuid.uuid4().hex[:8]}")
    letters = DeadLetters(config)
    records = _records(spark, [1, 2])
    # An event in error: decoded, so its position is known (and the column not nullable)
    in_error = records.filter("offset = 1").select(
        F.col("topic").alias(TOPIC_COL), F.col("partition").alias(PARTITION_COL), F.col("offset").alias(OFFSET_COL),
        error_struct("empty_key", F.lit("the record key is empty")).alias(ERROR_COL),
        F.lit("000000000123").alias(POSITION_COL),
    )
    letters.write(dead_letter_rows(in_error, records, "orders", {}, 1), 1, "query", "orders")
    # Then a record that never decoded: no position
    undecodable = dead_coordinates(records.filter("offset = 2"), error_struct("decode", F.lit("bad bytes")))
    letters.write(dead_letter_rows(undecodable, records, "orders", {}, 2), 2, "query", "orders")

    rows = spark.read.format("hudi").load(letters.target.path).orderBy("kafka_offset")
    assert [tuple(r) for r in rows.select("kafka_offset", "error_kind", "source_position").collect()] == [
        (1, "empty_key", "000000000123"), (2, "decode", ""),
    ]
