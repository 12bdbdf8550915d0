"""How a Silver table is partitioned: by a column's value, or by the day, month or year of a date or timestamp.

Configured per table as `tables."<schema>.<table>".partition_by`:

    partition_by: region             ->  region=eu/                (the column itself)
    partition_by: day(placed_at)     ->  placed_at_day=2024-03-01/ (a derived string column, yyyy-MM-dd)
    partition_by: month(placed_at)   ->  placed_at_month=2024-03/
    partition_by: year(placed_at)    ->  placed_at_year=2024/

Paths are hive-style (`name=value`), so Athena, Hive and Spark read the partition column from them. A derived
column is computed from the row's own value, in UTC whatever the session's time zone: Silver holds timestamps as
UTC instants. A row whose column is NULL goes to Hive's `__HIVE_DEFAULT_PARTITION__`.

Partitioned tables use Hudi's record-level index, which is global: an update that moves a row to another
partition, or a key-only delete image (no partition value), finds the row wherever it is (app/sink/hudi.py).
"""
from __future__ import annotations

from typing import Final

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import DateType, TimestampNTZType, TimestampType

from app.config.partitions import PartitionSpec
from app.errors import EnvelopeError

_FORMATS: Final = {"day": "yyyy-MM-dd", "month": "yyyy-MM", "year": "yyyy"}
_MICROS_PER_DAY: Final = 86_400_000_000

def with_partition_field(df: DataFrame, spec: PartitionSpec | None) -> DataFrame:
    """Add the derived partition column of `spec` (last), or check that a value-partitioned column exists.

    Raises:
        EnvelopeError: the column is missing, a derived column would overwrite a source column, or a day, month
            or year is asked of a column that is neither a date nor a timestamp.
    """
    if spec is None:
        return df
    types = {f.name: f.dataType for f in df.schema.fields}
    if spec.column not in types:
        raise EnvelopeError(f"partition_by {spec}: the table has no column {spec.column!r}")
    if spec.granularity == "value":
        return df
    if spec.field in types:
        raise EnvelopeError(
            f"partition_by {spec}: the derived column {spec.field!r} would replace a source column of that name"
        )
    source_type = types[spec.column]
    if isinstance(source_type, DateType):
        day = F.col(spec.column)
    elif isinstance(source_type, TimestampNTZType):  # a wall-clock time: its own day, no zone involved
        day = F.col(spec.column).cast("date")
    elif isinstance(source_type, TimestampType):
        day = _utc_day(F.col(spec.column))
    else:
        raise EnvelopeError(
            f"partition_by {spec}: {spec.column!r} is {source_type.simpleString()}, not a date or timestamp"
        )
    return df.withColumn(spec.field, F.date_format(day, _FORMATS[spec.granularity]))


def _utc_day(ts: Column) -> Column:
    """The UTC calendar day of a timestamp, independent of the session time zone: whole days since the epoch
    from the instant's microseconds (floor, so instants before 1970 fall on the right day)."""
    days = F.floor(F.unix_micros(ts) / F.lit(_MICROS_PER_DAY)).cast("int")
    return F.date_add(F.lit("1970-01-01").cast("date"), days)
