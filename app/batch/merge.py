"""Several topics feeding one Silver table (a partitioned table's partitions, declared shards): their plans
grouped per table and merged into one, refused when they disagree on a column's type (topics that may not share a
table never reach a batch's plans: app/routing/route.py `claim_tables`)."""
from __future__ import annotations

from collections.abc import Iterable

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, DecimalType, DoubleType, FloatType, IntegralType, StructType
from pyspark.sql.utils import AnalysisException

from app.batch.plan import TablePlan, TopicSummary
from app.cdc.columns import TOPIC_COL
from app.config import JobConfig
from app.errors import EnvelopeError
from app.routing.route import collision
from app.state.stats import TableBatchStats


def plans_per_table(topic_plans: list[TablePlan], config: JobConfig) -> list[TablePlan]:
    """One plan per Silver table. Topics share a table only when they may (app/routing/route.py): two other topics
    writing one table would interleave positions of different tables. The planner's `claim_tables` keeps such a
    pair out of the batch; this refuses one that got through all the same."""
    grouped: dict[str, list[TablePlan]] = {}
    for plan in topic_plans:
        group = grouped.setdefault(plan.route.qualified_name, [])
        if group and not group[0].route.may_share_table_with(plan.route):
            key, message = collision(group[0].route, plan.route, config)
            raise EnvelopeError(f"{message} ({key})")
        group.append(plan)
    return [group[0] if len(group) == 1 else merged_plan(group) for group in grouped.values()]


def check_merge_types(table: str, schemas: list[tuple[str, StructType]]) -> None:
    """Topics merged into one table must agree on each column's type, up to widening within one numeric family
    (integers, decimals, floating point), which a source's schema change brings (a partition's events written
    before an ALTER, another's after). Spark's union would also turn an int and a string into a string: refused.

    Raises:
        EnvelopeError: names the table, the column, both topics and both types.
    """
    seen: dict[str, tuple[str, DataType]] = {}
    for topic, schema in schemas:
        for f in schema.fields:
            if f.name not in seen:
                seen[f.name] = (topic, f.dataType)
                continue
            other_topic, other = seen[f.name]
            # simpleString leaves out nullability (an array's containsNull, a struct field's nullable)
            if other.simpleString() != f.dataType.simpleString() and not any(
                isinstance(other, family) and isinstance(f.dataType, family)
                for family in _WIDENING_FAMILIES
            ):
                raise EnvelopeError(
                    f"{table}: column {f.name} is {other.simpleString()} in {other_topic} but "
                    f"{f.dataType.simpleString()} in {topic}; the topics merged into one table must agree (give "
                    f"one its own table name, or align the source columns)"
                )


# Explicit classes: in PySpark DecimalType is a FractionalType too, and decimal + double must not widen.
_WIDENING_FAMILIES: tuple[tuple[type[DataType], ...], ...] = ((IntegralType,), (DecimalType,), (FloatType, DoubleType))


def merged_plan(plans: list[TablePlan]) -> TablePlan:
    """The plans of several topics feeding one table, as one: events unioned by column name (a column one
    topic lacks is null in its rows), each tagged with its topic; offsets, counts and schema ids added up.

    Raises:
        EnvelopeError: the topics' record keys differ, or a column has different types in two topics.
    """
    first = plans[0]
    keys = {p.record_key for p in plans if p.record_key is not None}
    if len(keys) > 1:
        raise EnvelopeError(
            f"{first.route.qualified_name}: topics {', '.join(p.route.topic for p in plans)} feed one table but "
            f"their record keys differ: {sorted(keys)}"
        )
    tagged = [(p.route.topic, p.events_df.withColumn(TOPIC_COL, F.lit(p.route.topic)))
              for p in plans if p.events_df is not None]
    check_merge_types(first.route.qualified_name, [(topic, df.schema) for topic, df in tagged])
    events_df = None
    if tagged:
        try:
            events_df = union(df for _, df in tagged)
        except AnalysisException as e:
            raise EnvelopeError(
                f"{first.route.qualified_name}: topics {', '.join(t for t, _ in tagged)} feed one table but "
                f"disagree on a column's type: {e}"
            ) from e
    summary = TopicSummary()
    stats = TableBatchStats(first.stats.table, topics=[p.route.topic for p in plans],
                            quarantined=first.stats.quarantined)
    for p in plans:
        summary.rows_in += p.summary.rows_in
        summary.tombstones += p.summary.tombstones
        summary.key_ids |= p.summary.key_ids
        summary.value_ids |= p.summary.value_ids
        summary.offsets.update(p.summary.offsets)
        stats.rows_in += p.stats.rows_in
        stats.skipped += p.stats.skipped
    stats.schema_ids = sorted(summary.value_ids)
    target = next((p.target for p in plans if p.target is not None), None)
    carry = tuple(sorted({c for p in plans for c in p.carry_columns}))
    dead = [p.dead_df for p in plans if p.dead_df is not None]
    return TablePlan(first.route, keys.pop() if keys else None, events_df, target, stats, summary, carry,
                     routes=tuple(p.route for p in plans), dead_df=union(dead) if dead else None,
                     source_df=first.source_df, key_schemas={k: v for p in plans for k, v in p.key_schemas.items()},
                     quarantine=next((p.quarantine for p in plans if p.quarantine is not None), None),
                     defaulted_columns=tuple(sorted({c for p in plans for c in p.defaulted_columns})),
                     source_columns=tuple(dict.fromkeys(c for p in plans for c in p.source_columns)))


def union(frames: Iterable[DataFrame]) -> DataFrame:
    frames = list(frames)
    result = frames[0]
    for frame in frames[1:]:
        # Writer schemas differ when a column was added between them: missing columns become null.
        result = result.unionByName(frame, allowMissingColumns=True)
    return result
