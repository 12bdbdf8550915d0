"""Per-table settings checked against the lake at start: a setting that names no table, and one that would change
what an existing Silver table was created with.

A Hudi table's record key, partitioning and type are fixed when it is created (its hoodie.properties); a config
that says otherwise for an existing table would fail at its first write, or worse, write rows under another key.
So the start refuses it, naming the setting and the rebuild. A per-table setting whose `<schema>.<table>` matches no
subscribed topic is allowed (the table may be created upstream later) but said: a WARNING and status.json's
`unmatched_settings`, since a misspelt name would otherwise go unnoticed.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable

from pyspark.sql import SparkSession

from app.config import JobConfig
from app.errors import ConfigError
from app.routing.route import TableRoute
from app.sink.hudi import recorded_layout, table_exists

log = logging.getLogger(__name__)

REBUILD = ("a table's record key, partitioning and type are fixed when it is created: set it back, or rebuild "
           "the table (docs/when-things-go-wrong.md, At a glance: \"a table to rebuild\")")


def unmatched_settings(config: JobConfig, routes: Iterable[TableRoute]) -> dict[str, str]:
    """The per-table settings (their dotted keys) whose table no subscribed topic feeds yet -> the topic expected."""
    matched = {(r.source, r.source_key) for r in routes}
    unmatched = {}
    for source in config.source_list:
        for table in source.tables:
            if (source.label, table) not in matched:
                key = config.table_setting_key(source.label, table, "")[:-1]
                unmatched[key] = f"{source.topic_prefix}.{table}"
    return unmatched


def log_unmatched(unmatched: dict[str, str]) -> None:
    for key, topic in sorted(unmatched.items()):
        log.warning("config %s names no table yet: no subscribed topic is %s (a table created upstream later takes "
                    "these settings; a misspelt name never does)", key, topic)


def check_layouts(spark: SparkSession, config: JobConfig, routes: Iterable[TableRoute]) -> None:
    """Refuse settings that change an existing Silver table's record key, partitioning or type.

    Raises:
        ConfigError: names the setting, the table, what it was created with and the rebuild.
    """
    seen = set()
    for route in routes:
        if route.qualified_name in seen:
            continue
        seen.add(route.qualified_name)
        path = config.lake.table_path(route.table, route.database)
        recorded = recorded_layout(spark, path)
        # A table whose creation was interrupted (no completed commit) is created afresh by its next write
        # (app/sink/creation.py), under the settings of that write.
        if recorded is None or recorded.record_key is None or not table_exists(spark, path):
            continue
        source = next(s for s in config.source_list if s.label == route.source)
        override = source.table_config(route.source_key)
        table = f"{route.qualified_name} (topic {route.topic})"
        key = None if route.record_key is None else route.written_key(route.record_key)
        if key is not None and key != recorded.record_key:
            raise ConfigError(config.table_setting_key(route.source, route.source_key, "record_key"),
                              f"{table} was created with record key {list(recorded.record_key)}, the config says "
                              f"{list(key)}; {REBUILD}")
        partition = route.partition.field if route.partition is not None else None
        if partition != recorded.partition_field:
            raise ConfigError(config.table_setting_key(route.source, route.source_key, "partition_by"),
                              f"{table} was created {_partitioned(recorded.partition_field)}, the config says "
                              f"{_partitioned(partition)}; {REBUILD}")
        if route.table_type != recorded.table_type:
            said = "" if override.table_type is not None else " (lake.table_type; the table has no setting of its own)"
            raise ConfigError(config.table_setting_key(route.source, route.source_key, "table_type"),
                              f"{table} was created {recorded.table_type}, the config says {route.table_type}{said}; "
                              f"{REBUILD}")


def _partitioned(field: str | None) -> str:
    return "not partitioned" if field is None else f"partitioned by {field}"
