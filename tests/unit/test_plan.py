"""A table's judged events (app/batch/plan.py `TablePlan.judged_df`): a small share of a batch in one partition;
the steps after the count build on their cache (app/spark.py `over_cache`)."""
from __future__ import annotations

import pytest
from py4j.protocol import Py4JError
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

import app.spark
from app.batch.plan import TablePlan, TopicSummary
from app.cdc.columns import LATEST_COL, OFFSET_COL, OP_COL, POSITION_COL
from app.routing.route import TableRoute
from app.spark import over_cache
from app.state.stats import TableBatchStats

SCHEMA = StructType([
    StructField("id", IntegerType()), StructField("v", StringType()), StructField(OP_COL, StringType()),
    StructField(POSITION_COL, StringType()), StructField(OFFSET_COL, LongType()),
])
ROWS = [(1, "a", "c", "01", 0), (2, "b", "c", "02", 1), (1, "a2", "u", "03", 2), (3, "c", "c", "04", 3),
        (2, "b2", "u", "05", 4), (1, None, "d", "06", 5)]


def _plan(spark: SparkSession, rows_in: int, derived_rows: bool = False) -> TablePlan:
    route = TableRoute("p.s.t", "s", "t", "db", "s_t", ("id",))
    events_df = spark.createDataFrame(spark.sparkContext.parallelize(ROWS, 3), SCHEMA)  # 3 partitions, no shuffle
    return TablePlan(route, ("id",), events_df, None, TableBatchStats("db.s_t"), TopicSummary(rows_in=rows_in),
                     derived_rows=derived_rows)


def _exchanges(df: DataFrame) -> int:
    return str(df._jdf.queryExecution().executedPlan().toString()).count("Exchange")


def _latest(df: DataFrame) -> set[tuple[int, str | None]]:
    return {(r["id"], r["v"]) for r in df.filter(LATEST_COL).collect()}


def test_a_small_share_is_judged_in_one_partition_without_a_shuffle(spark: SparkSession) -> None:
    small = _plan(spark, rows_in=6).judged_df(None, single_partition_rows=6)
    large = _plan(spark, rows_in=7).judged_df(None, single_partition_rows=6)
    derived = _plan(spark, rows_in=6, derived_rows=True).judged_df(None, single_partition_rows=6)

    assert small.rdd.getNumPartitions() == 1 and _exchanges(small) == 0
    assert _exchanges(large) > 0 and _exchanges(derived) > 0  # the window's shuffle by key
    assert _latest(small) == _latest(large) == _latest(derived) == {(1, None), (2, "b2"), (3, "c")}


def _below_filter(df: DataFrame) -> tuple[str, int]:
    """The kind of the analysed plan's node under a filter on `df`, and its number of children."""
    node = df.filter(LATEST_COL)._jdf.queryExecution().analyzed().children().apply(0)
    return node.getClass().getSimpleName(), node.children().size()


def test_the_steps_after_the_count_build_on_the_cache_as_one_node(spark: SparkSession) -> None:
    judged = _plan(spark, rows_in=6).judged_df(None, single_partition_rows=6).persist()
    try:
        judged.count()
        view = over_cache(judged)
        assert _below_filter(view) == ("InMemoryRelation", 0)  # the cache, not the plan that filled it
        assert _below_filter(judged)[0] != "InMemoryRelation"
        assert view.rdd.getNumPartitions() == 1 and _exchanges(view.filter(LATEST_COL)) == 0
        assert _latest(view) == _latest(judged) == {(1, None), (2, "b2"), (3, "c")}
    finally:
        judged.unpersist()
    cache = spark._jsparkSession.sharedState().cacheManager()
    assert not cache.lookupCachedData(judged._jdf).isDefined()  # unpersisting the frame frees the cache
    assert _latest(view) == {(1, None), (2, "b2"), (3, "c")}  # a lost cache is computed again
    plain = _plan(spark, rows_in=6).judged_df(None, single_partition_rows=6)
    assert over_cache(plain) is plain


def test_a_spark_without_the_internals_over_cache_uses_gets_the_frame_as_it_is(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def missing(*_: object) -> None:
        raise Py4JError("Method ofRows([class org.apache.spark.sql.SparkSession]) does not exist")

    monkeypatch.setattr(app.spark, "jvm_class", missing)
    monkeypatch.setattr(app.spark, "_over_cache_unsupported", set())
    judged = _plan(spark, rows_in=6).judged_df(None, single_partition_rows=6).persist()
    try:
        assert over_cache(judged) is judged and over_cache(judged) is judged
        assert [r.message for r in caplog.records if "whole plan" in r.message] == [
            f"the steps after a table's count build on its whole plan: this Spark ({spark.version}) has no Method "
            "ofRows([class org.apache.spark.sql.SparkSession]) does not exist"]  # once
    finally:
        judged.unpersist()
