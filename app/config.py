"""Typed, frozen, validated job config from one YAML file per environment.

Every section is a frozen dataclass. `load_config` walks the YAML against the dataclass fields: unknown keys,
missing required keys and wrong types raise `ConfigError` naming the dotted key, before Spark starts.
Secrets never live in YAML: a field ending in `_env` names the environment variable that holds the secret.
"""
from __future__ import annotations

import os
import re
import types
import typing
from dataclasses import MISSING, dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, Final, Literal

import boto3
import yaml
from botocore.exceptions import BotoCoreError, ClientError

from app.errors import ConfigError
from app.partitioning import PartitionSpec

# How the source's converter frames ids (app/framing.py): ids in Apicurio headers, 0x00 + 8-byte id, 0x00 + 4-byte
# id (Confluent compatible), or detected per record.
FramingMode = Literal["headers", "id8", "id4", "auto"]
IdType = Literal["contentId", "globalId"]
# hard: a delete removes the row (its position kept in the table's delete ledger); soft: the row stays, flagged.
DeleteMode = Literal["hard", "soft"]
# Copy-on-Write rewrites a file per update (fast reads); Merge-on-Read appends log files, compacted inline.
TableType = Literal["COPY_ON_WRITE", "MERGE_ON_READ"]
# Which Debezium connector feeds a source; mariadb and mysql share the binlog position.
ConnectorName = Literal["auto", "postgresql", "mysql", "mariadb", "sqlserver"]


@dataclass(frozen=True)
class KafkaConfig:
    bootstrap_servers: str
    topic_pattern: str
    starting_offsets: Literal["earliest", "latest"] = "earliest"
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    # Extra Kafka client options passed as kafka.<key> (security settings, timeouts).
    options: dict[str, str] = field(default_factory=dict)


AUTH_FIELDS: Final = {
    "none": (),
    "basic": ("username", "password_env"),
    "oidc": ("client_id", "client_secret_env", "token_url"),
}


@dataclass(frozen=True)
class RegistryAuthConfig:
    """How the registry client authenticates. Secrets are named by environment variable, never written here.

    basic: HTTP Basic with `username` and the password in `$<password_env>` (Apicurio exchanges them at its OIDC
    token endpoint). oidc: OAuth2 client credentials at `token_url` with `client_id` and the secret in
    `$<client_secret_env>`; the bearer token is renewed `refresh_margin_s` before it expires.
    """

    type: Literal["none", "basic", "oidc"] = "none"
    username: str | None = None
    password_env: str | None = None
    client_id: str | None = None
    client_secret_env: str | None = None
    token_url: str | None = None
    scope: str | None = None
    refresh_margin_s: float = 30.0

    def secret(self) -> str:
        """The password (basic) or client secret (oidc), read from the environment; empty for none."""
        env = self.password_env if self.type == "basic" else self.client_secret_env
        return os.environ.get(env, "") if env else ""


@dataclass(frozen=True)
class RegistryConfig:
    url: str
    # v3 and v2: Apicurio's own APIs; ccompat: its Confluent-compatible API (/apis/ccompat/v7), where an id is a
    # contentId unless the registry runs in legacy-id mode (then a globalId).
    api: Literal["v3", "v2", "ccompat"] = "v3"
    auth: RegistryAuthConfig = field(default_factory=RegistryAuthConfig)
    timeout_s: float = 10.0
    retries: int = 4
    backoff_s: float = 0.5


@dataclass(frozen=True)
class DiscriminatorConfig:
    """What keeps apart the rows of several source tables merged into one Silver table (README "Partitioned and
    sharded sources"). With `value`, the job adds `column` holding that constant to every row of this source
    table; without, `column` is one of the table's own columns (a tenant id). Either way it joins the record key.
    """

    column: str
    value: str | None = None


@dataclass(frozen=True)
class TableConfig:
    """Per-table overrides, keyed by '<schema>.<table>' of the source ('<database>.<schema>.<table>' for SQL
    Server, whose topics name all three)."""

    name: str | None = None
    # Several source tables given one `name` merge into one Silver table (shards); each then needs a
    # discriminator, or all declare their keys unique across the merged tables.
    discriminator: DiscriminatorConfig | None = None
    unique_keys: bool = False
    record_key: list[str] | None = None
    delete_mode: DeleteMode | None = None  # unset: lake.delete_mode
    table_type: TableType | None = None  # unset: lake.table_type
    # `column`, `day(column)`, `month(column)` or `year(column)` (app/partitioning.py); unset: not partitioned.
    partition_by: str | None = None
    compaction_delta_commits: int | None = None  # Merge-on-Read; unset: lake.compaction_delta_commits

    @property
    def partition(self) -> PartitionSpec | None:
        return None if self.partition_by is None else PartitionSpec.parse(self.partition_by)


@dataclass(frozen=True)
class SourceCatalogConfig:
    """A read-only login to the source database's catalog (the connector's own login will do)."""

    jdbc_url: str
    user: str
    password_env: str

    @property
    def password(self) -> str:
        return os.environ.get(self.password_env, "")


@dataclass(frozen=True)
class SourceConfig:
    """One Debezium connector's topics: `<topic_prefix>.<schema>.<table>` (SQL Server:
    `<topic_prefix>.<database>.<schema>.<table>`)."""

    topic_prefix: str
    # Names the source in errors and logs; unset: the topic prefix.
    name: str | None = None
    # The connector whose events these are; `auto` reads it off each writer schema's `source` record. When set,
    # an event of another connector is refused (its ordering would be read from the wrong fields).
    connector: ConnectorName = "auto"
    # Debezium envelopes, or events Debezium's unwrap SMT flattened (README "Unwrap-SMT events"); `auto` tells
    # them apart per writer schema. When set, the other kind is refused.
    events: Literal["auto", "envelope", "flattened"] = "auto"
    framing: FramingMode = "id4"
    id_type: IdType = "contentId"  # the id a 0x00-prefixed framing carries; header framing names its own
    # The catalog database of this source's Silver tables; unset: lake.database.
    database: str | None = None
    tables: dict[str, TableConfig] = field(default_factory=dict)
    # PostgreSQL: where the job reads which captured tables are partitions of a partitioned table (pg_inherits,
    # through pg_partition_root), so that every partition's topic lands in the partitioned table's one Silver
    # table. Unset: each topic is a table of its own.
    catalog: SourceCatalogConfig | None = None

    @property
    def label(self) -> str:
        return self.name or self.topic_prefix

    def table_config(self, *parts: str) -> TableConfig:
        return self.tables.get(".".join(parts), TableConfig())


@dataclass(frozen=True)
class LakeConfig:
    database: str
    silver_path: str
    bronze_path: str
    checkpoint_path: str
    table_type: TableType = "COPY_ON_WRITE"
    delete_mode: DeleteMode = "hard"
    # Merge-on-Read tables compact their log files inline once this many delta commits have piled up.
    compaction_delta_commits: int = 3
    # The cleaner keeps the files of this many latest commits (time travel and incremental reads reach back
    # that far); the timeline archives beyond retain_commits + 10.
    retain_commits: int = 10

    def table_path(self, table: str, database: str | None = None) -> str:
        """Where a Silver table lives: <silver_path>/<database>/<table> (lake.database unless given)."""
        return f"{self.silver_path.rstrip('/')}/{database or self.database}/{table}"


@dataclass(frozen=True)
class MetastoreConfig:
    jdbc_url: str
    user: str
    password_env: str = "METASTORE_PASSWORD"
    warehouse_path: str = "spark-warehouse"

    @property
    def password(self) -> str:
        return os.environ.get(self.password_env, "")


@dataclass(frozen=True)
class SparkConfig:
    master: str | None = None
    jars_dir: str | None = None
    conf: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class TriggerConfig:
    processing_time: str = "30 seconds"


@dataclass(frozen=True)
class JobConfig:
    """The job. Its sources are either one `source` (with the top-level `tables`) or a list `sources`, each with
    its own `tables`; `source_list` holds them all either way."""

    kafka: KafkaConfig
    registry: RegistryConfig
    lake: LakeConfig
    source: SourceConfig | None = None
    sources: list[SourceConfig] = field(default_factory=list)
    metastore: MetastoreConfig | None = None
    spark: SparkConfig = field(default_factory=SparkConfig)
    trigger: TriggerConfig = field(default_factory=TriggerConfig)
    tables: dict[str, TableConfig] = field(default_factory=dict)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    @property
    def source_list(self) -> list[SourceConfig]:
        """Every source: the single `source` with the top-level `tables`, or `sources`."""
        if self.source is None:
            return self.sources
        return [replace(self.source, tables=self.source.tables or self.tables)]

    def source_of(self, topic: str) -> SourceConfig | None:
        """The source whose prefix the topic starts with (the longest, should one prefix extend another)."""
        matches = [s for s in self.source_list if topic.startswith(s.topic_prefix + ".")]
        return max(matches, key=lambda s: len(s.topic_prefix)) if matches else None

    def database_of(self, source: SourceConfig) -> str:
        return source.database or self.lake.database

    @property
    def databases(self) -> list[str]:
        """Every catalog database the job writes Silver tables to."""
        return sorted({self.database_of(s) for s in self.source_list})


# A config on S3: EMR steps keep it beside the package (scripts/emr/). s3a:// is the same object to boto3.
S3_SCHEMES: Final = ("s3://", "s3a://")


def load_config(location: str | Path) -> JobConfig:
    """Read and validate a YAML config file: a local path, or an s3:// or s3a:// URI.

    Raises:
        ConfigError: the file is missing or unreadable, or a key is unknown, missing or of the wrong type.
    """
    location = str(location)
    try:
        raw = yaml.safe_load(read_config_text(location))
    except yaml.YAMLError as e:
        raise ConfigError("<file>", f"{location} is not valid YAML: {e}") from e
    return parse_config(raw)


def read_config_text(location: str) -> str:
    """The text of a config file, local or on S3 (read with boto3 before Spark starts).

    boto3 finds credentials its usual way (environment, profile, the EMR instance role) and honours
    AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL for an S3-compatible server. Errors name the URI, never a credential.

    Raises:
        ConfigError: the file or object cannot be read, or is not UTF-8.
    """
    if not location.startswith(S3_SCHEMES):
        try:
            return Path(location).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError("<file>", f"cannot read {location}: {e}") from e
    bucket, _, key = location.split("://", 1)[1].partition("/")
    if not bucket or not key:
        raise ConfigError("<file>", f"expected s3://<bucket>/<key>, got {location!r}")
    try:
        body = boto3.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read()
        return str(body.decode("utf-8"))
    except (BotoCoreError, ClientError, UnicodeDecodeError) as e:
        raise ConfigError("<file>", f"cannot read {location}: {e}") from e


def parse_config(raw: Any) -> JobConfig:
    """Validate an already-parsed mapping into a JobConfig (see load_config)."""
    config = _with_sources(_build(JobConfig, raw, ""))
    _check_semantics(config)
    return _with_absolute_paths(config)


def _with_sources(config: JobConfig) -> JobConfig:
    """Refuses a config with both or neither of `source` and `sources`, or tables set twice."""
    if (config.source is None) == (not config.sources):
        raise ConfigError("sources", "set either `source` (one connector) or `sources` (a list), not both or neither")
    if config.source is None and config.tables:
        raise ConfigError("tables", "with `sources`, per-table settings go under sources[<n>].tables")
    if config.source is not None and config.source.tables and config.tables:
        raise ConfigError("source.tables", "set per-table settings in `tables` or in `source.tables`, not both")
    return config


def _absolute(path: str) -> str:
    # Hadoop reads a relative path as a relative URI and fails; local paths are resolved against the working
    # directory (the scripts run from the repository root). URIs (s3://, s3a://, file://) stay as they are.
    return path if "://" in path else str(Path(path).resolve())


def _with_absolute_paths(config: JobConfig) -> JobConfig:
    lake = replace(
        config.lake,
        silver_path=_absolute(config.lake.silver_path),
        bronze_path=_absolute(config.lake.bronze_path),
        checkpoint_path=_absolute(config.lake.checkpoint_path),
    )
    metastore = config.metastore and replace(
        config.metastore, warehouse_path=_absolute(config.metastore.warehouse_path)
    )
    spark = replace(config.spark, jars_dir=config.spark.jars_dir and _absolute(config.spark.jars_dir))
    return replace(config, lake=lake, metastore=metastore, spark=spark)


def _build(cls: type, raw: Any, prefix: str) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(prefix or "<root>", f"expected a mapping, got {type(raw).__name__}")
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(raw) - set(known), key=str)
    if unknown:
        raise ConfigError(_join(prefix, str(unknown[0])), f"unknown key; known keys: {', '.join(sorted(known))}")
    values = {}
    for name, f in known.items():
        key = _join(prefix, name)
        if name not in raw:
            if f.default is MISSING and f.default_factory is MISSING:
                raise ConfigError(key, "missing required value")
            continue
        values[name] = _coerce(hints[name], raw[name], key)
    return cls(**values)


def _coerce(tp: Any, value: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(inner[0], value, key)
    if value is None:
        raise ConfigError(key, "must not be null")
    if origin is Literal:
        if value not in args:
            raise ConfigError(key, f"must be one of {', '.join(map(str, args))}; got {value!r}")
        return value
    if is_dataclass(tp):
        return _build(typing.cast(type, tp), value, key)
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(key, f"expected a mapping, got {type(value).__name__}")
        return {str(k): _coerce(args[1], v, _join(key, str(k))) for k, v in value.items()}
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(key, f"expected a list, got {type(value).__name__}")
        return [_coerce(args[0], v, f"{key}[{i}]") for i, v in enumerate(value)]
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is str and isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)  # YAML reads `a: 10` as int; string-valued maps (Spark conf) accept it
    if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
        raise ConfigError(key, f"expected {tp.__name__}, got {type(value).__name__} {value!r}")
    return value


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_INTERVAL = re.compile(r"\d+(\.\d+)? (millisecond|second|minute|hour)s?")


def _check_semantics(config: JobConfig) -> None:
    try:
        re.compile(config.kafka.topic_pattern)
    except re.error as e:
        raise ConfigError("kafka.topic_pattern", f"not a valid regular expression: {e}") from e
    if not config.registry.url.startswith(("http://", "https://")):
        raise ConfigError("registry.url", f"expected an http(s) URL, got {config.registry.url!r}")
    if config.registry.retries < 0:
        raise ConfigError("registry.retries", "must be >= 0")
    if config.registry.timeout_s <= 0:
        raise ConfigError("registry.timeout_s", "must be > 0")
    if config.registry.backoff_s < 0:
        raise ConfigError("registry.backoff_s", "must be >= 0")
    _check_auth(config.registry.auth)
    if config.kafka.max_offsets_per_trigger is not None and config.kafka.max_offsets_per_trigger < 1:
        raise ConfigError("kafka.max_offsets_per_trigger", "must be >= 1 (leave it out for no limit)")
    if not _INTERVAL.fullmatch(config.trigger.processing_time):
        raise ConfigError(
            "trigger.processing_time",
            f"expected e.g. '30 seconds' or '2 minutes', got {config.trigger.processing_time!r}",
        )
    if config.metastore is not None and config.metastore.password_env not in os.environ:
        raise ConfigError(
            "metastore.password_env", f"environment variable {config.metastore.password_env} is not set"
        )
    if not _IDENTIFIER.fullmatch(config.lake.database):
        raise ConfigError("lake.database", f"not a valid database name: {config.lake.database!r}")
    _check_sources(config)
    if config.lake.compaction_delta_commits < 1:
        raise ConfigError("lake.compaction_delta_commits", "must be >= 1")
    if config.lake.retain_commits < 1:
        raise ConfigError("lake.retain_commits", "must be >= 1")


def _source_key(config: JobConfig, n: int) -> str:
    return "source" if config.source is not None else f"sources[{n}]"


def _tables_key(config: JobConfig, n: int) -> str:
    return "tables" if config.source is not None and not config.source.tables else f"{_source_key(config, n)}.tables"


def _check_sources(config: JobConfig) -> None:
    labels: dict[str, int] = {}
    prefixes: dict[str, int] = {}
    for n, source in enumerate(config.source_list):
        key = _source_key(config, n)
        if source.label in labels:
            raise ConfigError(f"{key}.name", f"{source.label!r} names sources[{labels[source.label]}] too")
        labels[source.label] = n
        if not source.topic_prefix or source.topic_prefix.endswith("."):
            raise ConfigError(f"{key}.topic_prefix", f"not a topic prefix: {source.topic_prefix!r}")
        if source.topic_prefix in prefixes:
            other = prefixes[source.topic_prefix]
            raise ConfigError(f"{key}.topic_prefix", f"{source.topic_prefix!r} is the prefix of sources[{other}] too")
        prefixes[source.topic_prefix] = n
        if source.database is not None and not _IDENTIFIER.fullmatch(source.database):
            raise ConfigError(f"{key}.database", f"not a valid database name: {source.database!r}")
        if source.catalog is not None:
            if source.connector not in ("postgresql", "auto"):
                raise ConfigError(f"{key}.catalog", "partition look-ups are for PostgreSQL sources")
            if not source.catalog.jdbc_url.startswith("jdbc:postgresql://"):
                raise ConfigError(f"{key}.catalog.jdbc_url",
                                  f"expected jdbc:postgresql://host:port/db, got {source.catalog.jdbc_url!r}")
            if source.catalog.password_env not in os.environ:
                raise ConfigError(f"{key}.catalog.password_env",
                                  f"environment variable {source.catalog.password_env} is not set")
        _check_tables(config, source, _tables_key(config, n))
    _check_merges(config)


def _check_merges(config: JobConfig) -> None:
    """Source tables given one Silver name in one database merge into it (shards), if the merge keeps their rows
    apart: every one has a discriminator (one column for all, distinct constant values), or every one declares
    `unique_keys`. Otherwise the second name is refused, naming the setting to add."""
    named: dict[tuple[str, str], list[tuple[str, TableConfig]]] = {}
    for n, source in enumerate(config.source_list):
        for source_table, table in source.tables.items():
            if table.name is not None:
                key = f"{_tables_key(config, n)}.{source_table}"
                named.setdefault((config.database_of(source), table.name), []).append((key, table))
    for (database, name), members in named.items():
        if len(members) == 1:
            continue
        first_key, first = members[0]
        for key, table in members[1:]:
            where = f"{database}.{name} is the Silver table of {first_key} too"
            if first.unique_keys and table.unique_keys:
                continue
            if first.discriminator is None or table.discriminator is None:
                missing = key if table.discriminator is None else first_key
                raise ConfigError(
                    f"{missing}.discriminator",
                    f"{where}: merging source tables needs a discriminator on each (e.g. discriminator: "
                    f"{{column: source_db, value: <name>}}) or unique_keys: true on each; or give one its own name",
                )
            if table.discriminator.column != first.discriminator.column:
                raise ConfigError(f"{key}.discriminator.column",
                                  f"{where}, whose discriminator column is {first.discriminator.column!r}")
            values = [m.discriminator.value for _, m in members if m.discriminator is not None]
            if table.discriminator.value is not None and values.count(table.discriminator.value) > 1:
                raise ConfigError(f"{key}.discriminator.value",
                                  f"{where}, with the same discriminator value {table.discriminator.value!r}")


def _check_tables(config: JobConfig, source: SourceConfig, prefix: str) -> None:
    for source_table, table in source.tables.items():
        if source_table.count(".") not in (1, 2):
            raise ConfigError(
                f"{prefix}.{source_table}",
                "keys are '<schema>.<table>' of the source database ('<database>.<schema>.<table>' for SQL Server)",
            )
        key = f"{prefix}.{source_table}"
        if table.name is not None and not _IDENTIFIER.fullmatch(table.name):
            raise ConfigError(f"{key}.name", f"not a valid table name: {table.name!r}")
        if table.record_key is not None and not table.record_key:
            raise ConfigError(f"{key}.record_key", "must list at least one column")
        if table.partition_by is not None:
            try:
                PartitionSpec.parse(table.partition_by)
            except ValueError as e:
                raise ConfigError(f"{key}.partition_by", str(e)) from e
        if table.discriminator is not None:
            if not _IDENTIFIER.fullmatch(table.discriminator.column):
                raise ConfigError(f"{key}.discriminator.column",
                                  f"not a valid column name: {table.discriminator.column!r}")
            if table.name is None:
                raise ConfigError(f"{key}.discriminator", "applies to merged tables: set the shared `name` too")
        if table.compaction_delta_commits is not None:
            if (table.table_type or config.lake.table_type) != "MERGE_ON_READ":
                raise ConfigError(
                    f"{key}.compaction_delta_commits",
                    "applies to MERGE_ON_READ tables only; set table_type: MERGE_ON_READ or remove it",
                )
            if table.compaction_delta_commits < 1:
                raise ConfigError(f"{key}.compaction_delta_commits", "must be >= 1")


def _check_auth(auth: RegistryAuthConfig) -> None:
    needed = AUTH_FIELDS[auth.type]
    for name in ("username", "password_env", "client_id", "client_secret_env", "token_url", "scope"):
        value = getattr(auth, name)
        allowed = needed + (("scope",) if auth.type == "oidc" else ())
        if value is not None and name not in allowed:
            raise ConfigError(f"registry.auth.{name}", f"does not apply to auth type {auth.type}")
        if value is None and name in needed:
            raise ConfigError(f"registry.auth.{name}", f"required for auth type {auth.type}")
    env = auth.password_env or auth.client_secret_env
    if env is not None and env not in os.environ:
        raise ConfigError(f"registry.auth.{'password_env' if auth.password_env else 'client_secret_env'}",
                          f"environment variable {env} is not set")
    if auth.token_url is not None and not auth.token_url.startswith(("http://", "https://")):
        raise ConfigError("registry.auth.token_url", f"expected an http(s) URL, got {auth.token_url!r}")
    if auth.refresh_margin_s < 0:
        raise ConfigError("registry.auth.refresh_margin_s", "must be >= 0")


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name
