"""A slice's decode plan built once and used again for each batch (app/batch/planner.py `SliceTemplates`, app/spark.py
`substitute`): the rows are those of the plan built for the batch, the plan is built once per key, and the batch
after the first costs a handful of calls into the JVM."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from chispa import assert_df_equality
from pyspark.errors import IllegalArgumentException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, IntegerType, StructField, StructType

from app.batch.plan import Slice
from app.batch.planner import Planner, SliceTemplates, slice_records
from app.batch.processor import kept_records
from app.cdc.columns import OFFSET_COL, PARTITION_COL
from app.config import JobConfig
from app.routing.route import TableRoute
from app.spark import placeholder_frame, substitute
from app.wire.framing import Framing, with_source_framings
from app.wire.registry import RegistryClient, SchemaRef

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "id4-contentId.json"


class Golden:
    """The golden PostgreSQL envelopes (tests/golden/id4-contentId.json): its topic, value schema and records."""

    def __init__(self) -> None:
        doc: dict[str, Any] = json.loads(GOLDEN.read_text(encoding="utf-8"))
        self.topic: str = doc["topic"]
        value_ref, self.schema_json = next((r, s) for r, s in doc["schemas"].items() if '"Envelope"' in s)
        id_type, schema_id = value_ref.split(":")
        self.ref = SchemaRef(id_type, int(schema_id))
        self.records = [
            (self.topic, r["partition"], r["offset"], None if r["key"] is None else bytes.fromhex(r["key"]),
             None if r["value"] is None else bytes.fromhex(r["value"]))
            for r in doc["records"]
        ]
        self.route = TableRoute(topic=self.topic, source_schema="public", source_table="items", database="db",
                                table="items", record_key=("region", "id"))

    def raw(self, spark: SparkSession, records: list[Any]) -> DataFrame:
        return spark.createDataFrame(records, "topic string, partition int, offset long, key binary, value binary")

    def frame(self, raw_df: DataFrame) -> DataFrame:
        return with_source_framings(raw_df, [(self.topic.split(".")[0], Framing("id4", "contentId"))])

    def framed(self, spark: SparkSession, records: list[Any]) -> DataFrame:
        return self.frame(self.raw(spark, records))


@pytest.fixture(scope="module")
def golden() -> Golden:
    return Golden()


@pytest.fixture
def planner(local_config: JobConfig) -> Planner:
    return Planner(local_config, RegistryClient.from_config(local_config.registry))


def _sorted(df: DataFrame) -> DataFrame:
    return df.orderBy(PARTITION_COL, OFFSET_COL)


def test_each_batch_gets_the_rows_of_the_plan_built_for_it_from_one_template(
    spark: SparkSession, golden: Golden, planner: Planner
) -> None:
    templates, built = SliceTemplates(), []

    def build(framed_df: DataFrame) -> Slice:
        built.append(framed_df)
        return planner.events_slice(slice_records(framed_df, golden.topic, golden.ref), golden.schema_json,
                                    golden.route, str(golden.ref))

    key = (golden.topic, golden.ref)
    for batch in (golden.records[:3], golden.records[3:], golden.records):  # three batches, one writer schema
        framed_df = golden.framed(spark, batch)
        from_template = templates.slice(key, framed_df, build).events_df
        direct = planner.events_slice(slice_records(framed_df, golden.topic, golden.ref), golden.schema_json,
                                      golden.route, str(golden.ref)).events_df
        assert from_template.count() > 0
        assert_df_equality(_sorted(from_template), _sorted(direct))
    assert len(built) == 1


def test_a_plan_is_kept_per_key_and_the_least_recently_used_dropped(spark: SparkSession) -> None:
    templates, built = SliceTemplates(kept=2), []
    df = spark.createDataFrame([(1, "a"), (2, "b")], "id int, s string")

    def build(framed_df: DataFrame) -> Slice:
        built.append(1)
        return Slice(framed_df.withColumn("n", F.col("id") * 10), ("id", "s"), ())

    for key in ("a", "b", "a", "c", "a", "b"):  # "b" was dropped when "c" came in
        assert sorted(r["n"] for r in templates.slice((key,), df, build).events_df.collect()) == [10, 20]
    assert len(built) == 4


def test_a_template_takes_only_frames_of_its_placeholders_columns(spark: SparkSession) -> None:
    df = spark.createDataFrame([(1, "a")], "id int, s string")
    placeholder = placeholder_frame(spark, df.schema)
    template = placeholder.filter(F.col("id") > 0).withColumn("t", F.upper("s"))

    assert substitute(template, placeholder, df).collect()[0].asDict() == {"id": 1, "s": "a", "t": "A"}
    for other in (df.withColumnRenamed("s", "x"), df.withColumn("s", F.lit(2)), df.select("id")):
        with pytest.raises(IllegalArgumentException, match="placeholder"):
            substitute(template, placeholder, other)
    with pytest.raises(IllegalArgumentException, match="not built on the placeholder"):
        substitute(df.filter(F.col("id") > 0), placeholder, df)
    with pytest.raises(IllegalArgumentException, match="reads its placeholder 2 times"):
        substitute(placeholder.unionByName(placeholder), placeholder, df)


def test_nothing_nullable_goes_where_the_placeholder_says_not_null(spark: SparkSession) -> None:
    def schema(contains_null: bool) -> StructType:
        return StructType([StructField("id", IntegerType(), False),
                           StructField("a", ArrayType(IntegerType(), contains_null), False)])

    strict = spark.createDataFrame([(1, [1])], schema(False))
    loose = spark.createDataFrame([(1, [None])], schema(True))
    placeholder = placeholder_frame(spark, strict.schema)
    template = placeholder.select("id", F.size("a").alias("n"))

    assert substitute(template, placeholder, strict).collect()[0].asDict() == {"id": 1, "n": 1}
    with pytest.raises(IllegalArgumentException, match="placeholder's"):
        substitute(template, placeholder, loose)


def test_a_later_batch_of_a_writer_schema_costs_a_handful_of_calls_into_the_jvm(
    spark: SparkSession, golden: Golden, planner: Planner, commands: list[str]
) -> None:
    templates = SliceTemplates()

    def build(framed_df: DataFrame) -> Slice:
        return planner.events_slice(slice_records(framed_df, golden.topic, golden.ref), golden.schema_json,
                                    golden.route, str(golden.ref))

    calls = []
    for batch in (golden.records[:3], golden.records[3:]):
        framed_df = golden.framed(spark, batch)
        framed_df.schema  # noqa: B018 (the batch's frame, as the planner's summary leaves it)
        before = len(commands)
        templates.slice((golden.topic, golden.ref), framed_df, build)
        calls.append(len(commands) - before)
    assert calls[0] > 200 and calls[1] < 10, calls


def test_a_slice_of_the_kept_records_reads_their_framing_from_the_cache(
    spark: SparkSession, golden: Golden, planner: Planner
) -> None:
    """The batch function frames the records before persisting them (app/batch/processor.py `kept_records`): a
    slice's plan above the cache splits no record's bytes again (no `conv` of the id's hex text); over records framed
    after the cache, it does."""
    templates = SliceTemplates()

    def build(framed_df: DataFrame) -> Slice:
        return planner.events_slice(slice_records(framed_df, golden.topic, golden.ref), golden.schema_json,
                                    golden.route, str(golden.ref))

    def above_the_cache(events_df: DataFrame) -> str:
        plan: str = events_df._jdf.queryExecution().executedPlan().toString()
        return plan.split("InMemoryRelation", maxsplit=1)[0]  # the cached plan is printed below its relation

    kept_df = kept_records(golden.framed(spark, golden.records))
    raw_kept_df = kept_records(golden.raw(spark, golden.records))
    try:
        framed_first = templates.slice((golden.topic, golden.ref), kept_df, build).events_df
        framed_after = build(golden.frame(raw_kept_df)).events_df
        assert "InMemoryTableScan" in above_the_cache(framed_first)
        assert "conv(" not in above_the_cache(framed_first)
        assert "conv(" in above_the_cache(framed_after)
        assert_df_equality(_sorted(framed_first), _sorted(framed_after))
    finally:
        kept_df.unpersist()
        raw_kept_df.unpersist()
