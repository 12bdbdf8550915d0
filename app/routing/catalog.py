"""Source catalogs: which captured tables are partitions of a partitioned table (PostgreSQL).

Debezium captures a partitioned table and each of its partitions. With the default publication
(`publish_via_partition_root = false`) changes stream under the partitions' names and only the snapshot reads
the parent; with `publish.via.partition.root` changes carry the parent's name and the partitions' topics hold
their snapshot rows. Either way every one of these topics belongs in the parent's one Silver table
(app/routing/route.py). Which table is a partition of which comes from the catalog, not from names: `pg_partition_root`
gives each partition's top-most parent (partitions of partitions included), and a detached partition is no
partition any longer, so its later changes go to a table of its own.

The look-up is one small JDBC query from the driver, run once per batch for each source that has a `catalog`:
a partition created while the job runs is known from the next batch on.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from py4j.protocol import Py4JJavaError
from pyspark.sql import SparkSession
from pyspark.sql.utils import CapturedException

from app.config import JobConfig, SourceCatalogConfig
from app.errors import ConfigError, java_root_cause

SourceTable = tuple[str, str]  # (schema, table)
# Per source label: partition -> its partitioned root table.
PartitionRoots = Mapping[str, Mapping[SourceTable, SourceTable]]

PARTITION_ROOTS_SQL: Final = """
select n.nspname as part_schema, c.relname as part_table, rn.nspname as root_schema, r.relname as root_table
from pg_catalog.pg_class c
join pg_catalog.pg_namespace n on n.oid = c.relnamespace
join pg_catalog.pg_class r on r.oid = pg_catalog.pg_partition_root(c.oid)
join pg_catalog.pg_namespace rn on rn.oid = r.relnamespace
where c.relispartition
"""


def partition_roots(spark: SparkSession, catalog: SourceCatalogConfig) -> dict[SourceTable, SourceTable]:
    """Every partition in the source database, mapped to its partitioned root table.

    Raises:
        ConfigError: the catalog cannot be read (names the JDBC URL and the setting).
    """
    try:
        rows = (
            spark.read.format("jdbc")
            .option("url", catalog.jdbc_url)
            .option("driver", "org.postgresql.Driver")
            .option("user", catalog.user)
            .option("password", catalog.password)
            .option("query", PARTITION_ROOTS_SQL)
            .load()
            .collect()
        )
    except (Py4JJavaError, CapturedException) as e:
        raise ConfigError("catalog", f"cannot read partitions from {catalog.jdbc_url}: {java_root_cause(e)}") from e
    return {(r["part_schema"], r["part_table"]): (r["root_schema"], r["root_table"]) for r in rows}


def all_partition_roots(spark: SparkSession, config: JobConfig) -> dict[str, dict[SourceTable, SourceTable]]:
    """`partition_roots` of every source that has a catalog, by source label."""
    roots = {}
    for n, source in enumerate(config.source_list):
        if source.catalog is not None:
            try:
                roots[source.label] = partition_roots(spark, source.catalog)
            except ConfigError as e:
                key = "source.catalog" if config.source is not None else f"sources[{n}].catalog"
                raise ConfigError(key, f"source {source.label}: {e.message}") from e
    return roots
