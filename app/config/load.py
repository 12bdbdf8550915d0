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
from dataclasses import MISSING, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, Final, Literal

import yaml
from botocore.exceptions import BotoCoreError, ClientError

from app.config.model import AUTH_FIELDS, JobConfig, RegistryAuthConfig, SourceConfig, TableConfig
from app.config.partitions import PartitionSpec
from app.errors import ConfigError

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
    import boto3  # noqa: PLC0415 - here, not at the top: 0.08 s of every start, and most configs are local files

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
    spark = replace(config.spark, jars_dir=config.spark.jars_dir and _absolute(config.spark.jars_dir),
                    class_archive=config.spark.class_archive and _absolute(config.spark.class_archive))
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
    if origin in (dict, list):
        return _coerce_collection(origin, args, value, key)
    return _coerce_scalar(tp, value, key)


def _coerce_collection(origin: type, args: tuple[Any, ...], value: Any, key: str) -> Any:
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(key, f"expected a mapping, got {type(value).__name__}")
        return {str(k): _coerce(args[1], v, _join(key, str(k))) for k, v in value.items()}
    if not isinstance(value, list):
        raise ConfigError(key, f"expected a list, got {type(value).__name__}")
    return [_coerce(args[0], v, f"{key}[{i}]") for i, v in enumerate(value)]


def _coerce_scalar(tp: Any, value: Any, key: str) -> Any:
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is str and isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)  # YAML reads `a: 10` as int; string-valued maps (Spark conf) accept it
    if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
        raise ConfigError(key, f"expected {tp.__name__}, got {type(value).__name__} {value!r}")
    return value


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_INTERVAL = re.compile(r"\d+(\.\d+)? (millisecond|second|minute|hour)s?")


def _check_table_names(config: JobConfig) -> None:
    """The job's own tables: the dead letters' and Bronze's."""
    if not _IDENTIFIER.fullmatch(config.dead_letters.table):
        raise ConfigError("dead_letters.table", f"not a valid table name: {config.dead_letters.table!r}")
    if config.lake.bronze_table and not _IDENTIFIER.fullmatch(config.lake.bronze_table):
        raise ConfigError("lake.bronze_table", f"not a valid table name: {config.lake.bronze_table!r}")
    if config.lake.bronze_table == config.dead_letters.table:
        raise ConfigError("lake.bronze_table", f"{config.lake.bronze_table!r} is the dead-letter table's name too")


# The lake's counts: key, least value, what the least means.
_LAKE_MINIMUMS = (
    ("compaction_delta_commits", 1, ""),
    ("retain_commits", 1, ""),
    ("clean_every_commits", 1, ""),
    ("small_file_limit_mb", 0, " (0: inserts always go to new files)"),
    ("table_writers", 1, " (1: one table after another)"),
    ("single_partition_rows", 0, " (0: never)"),
    ("write_retries", 0, " (0: a transient write error fails the batch at once)"),
    ("simple_index_tasks", 0, " (0: Hudi's default, a task per base file; unset: the session's cores)"),
)


def _check_lake_counts(config: JobConfig) -> None:
    for name, least, meaning in _LAKE_MINIMUMS:
        value = getattr(config.lake, name)
        if value is not None and value < least:
            raise ConfigError(f"lake.{name}", f"must be >= {least}{meaning}")


def _check_semantics(config: JobConfig) -> None:
    _check_registry(config)
    _check_kafka(config)
    if config.metastore is not None and config.metastore.password_env not in os.environ:
        raise ConfigError(
            "metastore.password_env", f"environment variable {config.metastore.password_env} is not set"
        )
    if not _IDENTIFIER.fullmatch(config.lake.database):
        raise ConfigError("lake.database", f"not a valid database name: {config.lake.database!r}")
    _check_sources(config)
    _check_lake_counts(config)
    _check_table_names(config)
    if config.dead_letters.unknown_schema_grace_s < 0:
        raise ConfigError("dead_letters.unknown_schema_grace_s", "must be >= 0")
    _check_recovery(config)
    _check_collectors(config)
    limit = config.spark.available_now_java_options_max_records
    if limit is not None and limit < 0:
        raise ConfigError("spark.available_now_java_options_max_records", "must be >= 0")
    if limit is not None and not config.spark.available_now_java_options:
        raise ConfigError("spark.available_now_java_options_max_records",
                          "limits spark.available_now_java_options, which is unset")


# A garbage collector flag, named in a group; not `-XX:+UseMaximumCompactionOnSystemGC` and its like, which tune one.
COLLECTOR_FLAG = re.compile(r"-XX:\+Use(Serial|Parallel|G1|Z|Shenandoah|Epsilon)GC(?=\s|$)")


def collectors_named(options: str) -> set[str]:
    """The garbage collectors JVM options select ("Parallel", "G1", ...); a JVM given two does not start."""
    return set(COLLECTOR_FLAG.findall(options))


def _check_collectors(config: JobConfig) -> None:
    """An --available-now run's JVM options, and a stream's, add to the driver's own: two collectors stop the JVM at
    its start."""
    own = collectors_named(config.spark.conf.get("spark.driver.extraJavaOptions", ""))
    for key, options in (("spark.available_now_java_options", config.spark.available_now_java_options),
                         ("spark.stream_java_options", config.spark.stream_java_options)):
        added = collectors_named(options or "")
        if own and added and own != added:
            raise ConfigError(
                key,
                f"names the {', '.join(sorted(added))} collector, spark.driver.extraJavaOptions the "
                f"{', '.join(sorted(own))} one: a JVM given two does not start",
            )


def _check_recovery(config: JobConfig) -> None:
    recovery = config.recovery
    if recovery.backoff_s <= 0:
        raise ConfigError("recovery.backoff_s", "must be > 0")
    if recovery.max_backoff_s < recovery.backoff_s:
        raise ConfigError("recovery.max_backoff_s", f"must be >= recovery.backoff_s ({recovery.backoff_s})")
    if recovery.give_up_after_s < 0:
        raise ConfigError("recovery.give_up_after_s", "must be >= 0 (0: never give up)")
    if recovery.heartbeat_s <= 0:
        raise ConfigError("recovery.heartbeat_s", "must be > 0")
    if recovery.source_stalled_after_s < 0:
        raise ConfigError("recovery.source_stalled_after_s", "must be >= 0 (0: never)")


def _check_registry(config: JobConfig) -> None:
    if not config.registry.url.startswith(("http://", "https://")):
        raise ConfigError("registry.url", f"expected an http(s) URL, got {config.registry.url!r}")
    if config.registry.retries < 0:
        raise ConfigError("registry.retries", "must be >= 0")
    if config.registry.timeout_s <= 0:
        raise ConfigError("registry.timeout_s", "must be > 0")
    if config.registry.backoff_s < 0:
        raise ConfigError("registry.backoff_s", "must be >= 0")
    _check_auth(config.registry.auth)


def _check_kafka(config: JobConfig) -> None:
    try:
        re.compile(config.kafka.topic_pattern)
    except re.error as e:
        raise ConfigError("kafka.topic_pattern", f"not a valid regular expression: {e}") from e
    if config.kafka.max_offsets_per_trigger is not None and config.kafka.max_offsets_per_trigger < 1:
        raise ConfigError("kafka.max_offsets_per_trigger", "must be >= 1 (leave it out for no limit)")
    if config.kafka.fetch_max_wait_ms < 0:
        raise ConfigError("kafka.fetch_max_wait_ms", "must be >= 0")
    if "fetch.max.wait.ms" in config.kafka.options:
        raise ConfigError("kafka.options.fetch.max.wait.ms", "set kafka.fetch_max_wait_ms instead")
    if not _INTERVAL.fullmatch(config.trigger.processing_time):
        raise ConfigError(
            "trigger.processing_time",
            f"expected e.g. '30 seconds' or '2 minutes', got {config.trigger.processing_time!r}",
        )


def _check_sources(config: JobConfig) -> None:
    labels: dict[str, int] = {}
    prefixes: dict[str, int] = {}
    for n, source in enumerate(config.source_list):
        key = config.source_key(n)
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
        _check_catalog(source, key)
        if source.signal_topic is not None and (
            not source.signal_topic.strip() or re.fullmatch(config.kafka.topic_pattern, source.signal_topic)
        ):
            raise ConfigError(f"{key}.signal_topic", f"{source.signal_topic!r} is empty or matches kafka.topic_pattern "
                              "(the job would read the connector's signals as a table)")
        if source.heartbeat_table is not None:
            parts = source.heartbeat_table.split(".")
            if len(parts) != (3 if source.connector == "sqlserver" else 2) or not all(parts):
                form = "<database>.<schema>.<table>" if source.connector == "sqlserver" else "<schema>.<table>"
                raise ConfigError(f"{key}.heartbeat_table", f"expected {form!r}, got {source.heartbeat_table!r}")
            if source.heartbeat_table in source.tables:
                raise ConfigError(f"{key}.heartbeat_table", f"{source.heartbeat_table!r} has table settings under "
                                  f"{config.tables_key(n)}, but the heartbeat table feeds no Silver table")
        _check_tables(config, source, config.tables_key(n))
    _check_merges(config)


def _check_catalog(source: SourceConfig, key: str) -> None:
    if source.catalog is None:
        return
    if source.connector not in ("postgresql", "auto"):
        raise ConfigError(f"{key}.catalog", "partition look-ups are for PostgreSQL sources")
    if not source.catalog.jdbc_url.startswith("jdbc:postgresql://"):
        raise ConfigError(f"{key}.catalog.jdbc_url",
                          f"expected jdbc:postgresql://host:port/db, got {source.catalog.jdbc_url!r}")
    if source.catalog.password_env not in os.environ:
        raise ConfigError(f"{key}.catalog.password_env",
                          f"environment variable {source.catalog.password_env} is not set")


def _check_merges(config: JobConfig) -> None:
    """Source tables given one Silver name in one database merge into it (shards), if the merge keeps their rows
    apart: every one has a discriminator (one column for all, distinct constant values), or every one declares
    `unique_keys`. Otherwise the second name is refused, naming the setting to add."""
    named: dict[tuple[str, str], list[tuple[str, TableConfig]]] = {}
    for n, source in enumerate(config.source_list):
        for source_table, table in source.tables.items():
            if table.name is not None:
                key = f"{config.tables_key(n)}.{source_table}"
                named.setdefault((config.database_of(source), table.name), []).append((key, table))
    for (database, name), members in named.items():
        first_key, first = members[0]
        values = [m.discriminator.value for _, m in members if m.discriminator is not None]
        for key, table in members[1:]:
            where = f"{database}.{name} is the Silver table of {first_key} too"
            if not (first.unique_keys and table.unique_keys):
                _check_shard(where, (first_key, first), (key, table), values)


def _check_shard(where: str, first: tuple[str, TableConfig], other: tuple[str, TableConfig], values: list[Any]) -> None:
    """`other` may share the first's Silver table: both have a discriminator, in one column, with distinct values
    (`values`: those of every member)."""
    (first_key, first_table), (key, table) = first, other
    if first_table.discriminator is None or table.discriminator is None:
        missing = key if table.discriminator is None else first_key
        raise ConfigError(
            f"{missing}.discriminator",
            f"{where}: merging source tables needs a discriminator on each (e.g. discriminator: "
            f"{{column: source_db, value: <name>}}) or unique_keys: true on each; or give one its own name",
        )
    if table.discriminator.column != first_table.discriminator.column:
        raise ConfigError(f"{key}.discriminator.column",
                          f"{where}, whose discriminator column is {first_table.discriminator.column!r}")
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
        _check_table_merge_and_compaction(config, table, key)


def _check_table_merge_and_compaction(config: JobConfig, table: TableConfig, key: str) -> None:
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
