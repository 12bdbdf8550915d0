"""Route: Kafka topic `<prefix>.<schema>.<table>` -> Silver table `<schema>_<table>` (or a configured name)."""
from __future__ import annotations

from dataclasses import dataclass

from app.config import JobConfig
from app.errors import EnvelopeError
from app.partitioning import PartitionSpec


@dataclass(frozen=True)
class TableRoute:
    topic: str
    source_schema: str
    source_table: str
    database: str
    table: str
    record_key: tuple[str, ...] | None
    delete_mode: str = "hard"
    table_type: str = "COPY_ON_WRITE"
    partition: PartitionSpec | None = None
    compaction_delta_commits: int = 3

    @property
    def qualified_name(self) -> str:
        return f"{self.database}.{self.table}"


def route_topic(topic: str, config: JobConfig) -> TableRoute:
    """Where a topic's rows go.

    Raises:
        EnvelopeError: the topic does not follow `<topic_prefix>.<schema>.<table>`.
    """
    prefix = config.source.topic_prefix + "."
    parts = topic[len(prefix):].split(".") if topic.startswith(prefix) else []
    if len(parts) != 2 or not all(parts):
        raise EnvelopeError(f"topic {topic!r} is not '{prefix}<schema>.<table>'")
    schema, table = parts
    override = config.table_config(schema, table)
    return TableRoute(
        topic=topic,
        source_schema=schema,
        source_table=table,
        database=config.lake.database,
        table=override.name or f"{schema}_{table}",
        record_key=tuple(override.record_key) if override.record_key else None,
        delete_mode=override.delete_mode or config.lake.delete_mode,
        table_type=override.table_type or config.lake.table_type,
        partition=override.partition,
        compaction_delta_commits=override.compaction_delta_commits or config.lake.compaction_delta_commits,
    )
