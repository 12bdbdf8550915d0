"""Route: a Kafka topic -> its source and Silver table.

A topic is `<topic_prefix>.<schema>.<table>` (PostgreSQL; MySQL/MariaDB name the database there), or
`<topic_prefix>.<database>.<schema>.<table>` for a source with `connector: sqlserver`. Its source is the one
whose prefix it starts with; its Silver table is `<schema>_<table>` (`<database>_<schema>_<table>`) in the
source's catalog database, or the configured `tables.<schema>.<table>.name`.

That rule maps `a_b.c` and `a.b_c` to one name. Two topics share a Silver table only when meant to:
- partitions of one partitioned table (found in the source's catalog, app/routing/catalog.py) route to the partitioned
  table's route: its name and overrides, all from one source server, whose keys are unique across partitions;
- source tables given one `name` with a discriminator each, or `unique_keys` each (shards; app/config/model.py
  checks the declarations).
Any other pair is refused, each refusal naming the `name` setting that separates them (`claim_tables`): at start
(`claim_routes`), two topics of a table no commit holds yet stop the job (its config must say which is which),
and where one of them holds the table's commits the others are refused; a topic that appears later and would
write a table another topic holds, or two that appear together for a new table, are refused (Bronze keeps their
records) while the other tables go on. A table whose commits hold another topic's offsets refuses a second topic
(`check_owner`), for tables whose holder is no subscribed topic any longer.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from app.config import DiscriminatorConfig, JobConfig, PartitionSpec, SourceConfig
from app.errors import ConfigError, EnvelopeError
from app.routing.catalog import PartitionRoots


@dataclass(frozen=True)
class TableRoute:
    topic: str
    source_schema: str
    source_table: str
    database: str
    table: str
    record_key: tuple[str, ...] | None
    delete_mode: str = "hard"
    truncate: str = "ignore"
    unread_rows: str = "keep"
    table_type: str = "COPY_ON_WRITE"
    partition: PartitionSpec | None = None
    compaction_delta_commits: int = 3
    source: str = ""  # the source's label
    connector: str = "auto"
    events: str = "auto"
    source_database: str | None = None  # SQL Server's database, the topic's first part
    # A partition routed to its partitioned table (source_schema/source_table): the partition's own name.
    source_partition: str | None = None
    discriminator: DiscriminatorConfig | None = None
    unique_keys: bool = False

    @property
    def source_identity(self) -> str:
        """What the Silver table holds, as recorded in its commits (app/sink/commit.py): the source table, a
        partition counting as its partitioned table; `merged` for declared shards."""
        return "merged" if self.merged else f"{self.source}:{self.source_key}"

    @property
    def merged(self) -> bool:
        """Declared a member of a many-to-one merge (shards)."""
        return self.discriminator is not None or self.unique_keys

    def may_share_table_with(self, other: TableRoute) -> bool:
        """Both topics belong in one Silver table: one partitioned table's topics, or declared shards."""
        same_table = self.source == other.source and self.source_key == other.source_key
        return same_table or (self.merged and other.merged)

    @property
    def qualified_name(self) -> str:
        return f"{self.database}.{self.table}"

    def written_key(self, key: tuple[str, ...]) -> tuple[str, ...]:
        """A record key as the table is written: a shard's discriminator column appended when not in it."""
        column = self.discriminator.column if self.discriminator is not None else None
        return key if column is None or column in key else (*key, column)

    @property
    def source_key(self) -> str:
        """The key of the table's overrides: `<schema>.<table>` (`<database>.<schema>.<table>`)."""
        parts = [self.source_database] if self.source_database else []
        return ".".join([*parts, self.source_schema, self.source_table])


def silver_name(*source_parts: str) -> str:
    """The Silver table of a source table unless its `name` setting says otherwise: the source's schema and table
    (SQL Server: database, schema and table) joined by `_`, e.g. crm.users -> crm_users."""
    return "_".join(source_parts)


def source_for(topic: str, config: JobConfig) -> SourceConfig:
    """The source a topic belongs to.

    Raises:
        EnvelopeError: no source's prefix matches the topic.
    """
    source = config.source_of(topic)
    if source is None:
        prefixes = ", ".join(f"'{s.topic_prefix}.'" for s in config.source_list)
        raise EnvelopeError(f"topic {topic!r} starts with no source's topic prefix ({prefixes})")
    return source


HEARTBEAT_PREFIX = "__debezium-heartbeat."  # Debezium's topic.heartbeat.prefix, by default


def delivering_source(topic: str, config: JobConfig) -> SourceConfig | None:
    """The source whose connector writes the topic: its table topics, and the topics beside them that
    `skip_reason` names (the schema change topic, `<prefix>`, and the heartbeat topic, `__debezium-heartbeat.<prefix>`,
    whose names do not start with `<prefix>.`)."""
    for source in config.source_list:
        if topic in (source.topic_prefix, f"{HEARTBEAT_PREFIX}{source.topic_prefix}"):
            return source
    return config.source_of(topic)


def skip_reason(topic: str, config: JobConfig) -> str | None:
    """Why a subscribed topic feeds no table, for the topics Debezium writes beside a source's table topics
    (a pattern such as `<prefix>\\..*` catches them); None for every other topic. Their records go to Bronze
    like every other record, and the job's log and status name them (app/state/status.py)."""
    for source in config.source_list:
        prefix = source.topic_prefix
        if topic == prefix:
            return f"the schema change topic of source {source.label} (DDL events, no table rows)"
        if topic == f"{prefix}.transaction":
            return f"the transaction metadata topic of source {source.label} (provide.transaction.metadata)"
        if topic == f"{HEARTBEAT_PREFIX}{prefix}":
            return f"the heartbeat topic of source {source.label} (heartbeat.interval.ms)"
        if source.heartbeat_table is not None and topic == f"{prefix}.{source.heartbeat_table}":
            return f"the heartbeat table of source {source.label} (heartbeat.action.query)"
    return None


def route_topic(topic: str, config: JobConfig, roots: PartitionRoots | None = None) -> TableRoute:
    """Where a topic's rows go. `roots` (app/routing/catalog.py) maps partitions to their partitioned table, per source.

    Raises:
        EnvelopeError: the topic does not follow `<topic_prefix>.<schema>.<table>` (or the SQL Server form) of
            a configured source.
    """
    source = source_for(topic, config)
    prefix = source.topic_prefix + "."
    parts = topic[len(prefix):].split(".")
    sqlserver = source.connector == "sqlserver"
    if not all(parts) or len(parts) != (3 if sqlserver else 2):
        form = "<database>.<schema>.<table>" if sqlserver else "<schema>.<table>"
        raise EnvelopeError(f"topic {topic!r} is not '{prefix}{form}' (source {source.label})")
    schema, table = parts[-2:]
    root = (roots or {}).get(source.label, {}).get((schema, table))
    partition = None
    if root is not None and not sqlserver:
        partition, (schema, table) = f"{schema}.{table}", root
        parts = [schema, table]
    override = source.table_config(*parts)
    return TableRoute(
        topic=topic,
        source_schema=schema,
        source_table=table,
        database=config.database_of(source),
        table=override.name or silver_name(*parts),
        record_key=tuple(override.record_key) if override.record_key else None,
        delete_mode=override.delete_mode or config.lake.delete_mode,
        truncate=override.truncate or config.lake.truncate,
        unread_rows=override.unread_rows or config.lake.unread_rows,
        table_type=override.table_type or config.lake.table_type,
        partition=override.partition,
        compaction_delta_commits=override.compaction_delta_commits or config.lake.compaction_delta_commits,
        source=source.label,
        connector=source.connector,
        events=source.events,
        source_database=parts[0] if len(parts) == 3 else None,
        source_partition=partition,
        discriminator=override.discriminator,
        unique_keys=override.unique_keys,
    )


def check_routes(config: JobConfig, topics: Iterable[str], roots: PartitionRoots | None = None) -> list[TableRoute]:
    """`claim_routes` where no table is held yet (a config checked before any run): any two topics that map to one
    Silver table and may not share it are refused.

    Raises:
        ConfigError: names the setting that separates them.
    """
    return claim_routes(config, topics, roots)[0]


def claim_routes(
    config: JobConfig, topics: Iterable[str], roots: PartitionRoots | None = None,
    holder: Callable[[list[TableRoute]], TableRoute | None] | None = None,
    claims: dict[str, TableRoute | None] | None = None,
) -> tuple[list[TableRoute], dict[str, str]]:
    """The routes of the topics the job subscribes to, and the topics refused because another holds their Silver
    table (topic -> why, naming the setting): two topics map to one table unless they may share it (module
    docstring). `claims`: the tables claimed so far in this process (`claim_tables`; a query started again after
    an outage), updated here. `holder(routes)`: of the routes contesting a table not claimed yet, the one whose
    offsets its commits hold, if any (read only for contested tables); that one keeps the table.

    Topics of no source, or of another form, are left to the batch (which names the record).

    Raises:
        ConfigError: two topics map to one Silver table that none of them holds; names the setting that separates
            them.
    """
    routes: list[TableRoute] = []
    for topic in sorted(topics):
        if skip_reason(topic, config) is not None:
            continue
        try:
            routes.append(route_topic(topic, config, roots))
        except EnvelopeError:
            continue
    claims = {} if claims is None else claims
    for table, members in _by_table(routes).items():
        clash = _clash(members)
        if clash is None or table in claims:
            continue
        held = holder(members) if holder is not None else None
        if held is None:
            raise ConfigError(*_collision(*clash, config))
        claims[table] = held
    refused = claim_tables(routes, claims, config)
    return [r for r in routes if r.topic not in refused], refused


def claim_tables(
    routes: Iterable[TableRoute], claims: dict[str, TableRoute | None], config: JobConfig
) -> dict[str, str]:
    """Each route claims its Silver table: a table's first claim (`claims`, by qualified name) keeps it, and a route
    that may not share it with that claim is refused. Routes of a table not claimed yet that may not share it among
    themselves are all refused, and so is every route to it from then on (its claim is None): nothing says which one
    the table is for, and one written later would miss the records refused now. Returns the refused topics, each
    with why (naming the setting that separates them); `claims` gains the tables claimed or contested here."""
    refused: dict[str, str] = {}
    for table, members in _by_table(routes).items():
        if table in claims and claims[table] is None:
            for route in members:
                key = config.table_setting_key(route.source, route.source_key, "name")
                refused[route.topic] = (f"topic {route.topic!r} maps to Silver table {table}, which topics mapping "
                                        f"to it together contest; none of them is written until they are told "
                                        f"apart ({key})")
            continue
        holder = claims.get(table)
        if holder is None:
            clash = _clash(members)
            if clash is not None:
                key, message = _collision(*clash, config)
                for route in members:
                    refused[route.topic] = f"{message}; none of them is written until they are told apart ({key})"
                claims[table] = None
                continue
            claims[table] = holder = members[0]
        for route in members:
            if route.topic != holder.topic and not holder.may_share_table_with(route):
                key, message = collision(holder, route, config)
                refused[route.topic] = f"{message}; {holder.topic} holds the table ({key})"
    return refused


def _by_table(routes: Iterable[TableRoute]) -> dict[str, list[TableRoute]]:
    """Routes per Silver table, in topic order."""
    grouped: dict[str, list[TableRoute]] = {}
    for route in sorted(routes, key=lambda r: r.topic):
        grouped.setdefault(route.qualified_name, []).append(route)
    return grouped


def _clash(members: list[TableRoute]) -> tuple[TableRoute, TableRoute] | None:
    """The first pair of routes to one table that may not share it, if any."""
    first = members[0]
    other = next((r for r in members[1:] if not first.may_share_table_with(r)), None)
    return None if other is None else (first, other)


def _collision(first: TableRoute, second: TableRoute, config: JobConfig) -> tuple[str, str]:
    """`collision`, naming the topic not declared a member of a merge."""
    return collision(second, first, config) if second.merged else collision(first, second, config)


def configured_topics(config: JobConfig) -> list[str]:
    """The topics the config's per-table settings name (`<topic_prefix>.<key>` per source): the ones whose routes
    can be checked before Kafka is read (`app/main.py --check-config`)."""
    return [f"{source.topic_prefix}.{key}" for source in config.source_list for key in source.tables]


def collision(first: TableRoute, second: TableRoute, config: JobConfig) -> tuple[str, str]:
    """The config key to set and the message, for two routes to one Silver table."""
    key = config.table_setting_key(second.source, second.source_key, "name")
    return key, (
        f"topics {first.topic!r} and {second.topic!r} both map to Silver table {second.qualified_name}; "
        f"give one its own table name, e.g. {key}: {second.table}_2"
    )


def check_owner(
    route: TableRoute, committed_topics: Iterable[str], config: JobConfig, committed_source: str | None = None
) -> None:
    """Refuse to write a topic into a Silver table that holds another source table's rows (names that collide
    across batches, or a topic renamed).

    `committed_source` is the source table the table's last commit recorded (`TableRoute.source_identity`): the
    partitions of one partitioned table all record it, so they pass, and offsets of a partition detached since
    do not matter. A table written before commits recorded it is judged by its topics: any other topic than
    this one refuses.

    Raises:
        EnvelopeError: names both topics (or source tables) and the setting that separates them.
    """
    topics = set(committed_topics)
    if committed_source is not None:
        if committed_source == route.source_identity:
            return
        others = sorted(topics - {route.topic}) or [committed_source]
        key, message = collision(replace(route, topic=others[0]), route, config)
        raise EnvelopeError(f"{message}; it holds the rows of {committed_source}, this topic is "
                            f"{route.source_identity} ({key})")
    others = sorted(t for t in topics if t != route.topic)
    if others:
        key, message = collision(replace(route, topic=others[0]), route, config)
        raise EnvelopeError(f"{message}; its commits hold the offsets of {', '.join(others)} ({key})")
