"""app/config/model.py: one small test per invalid-config case, each asserting ConfigError and the dotted key."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from app.config import JobConfig, RegistryConfig, TableConfig, load_config, parse_config
from app.errors import ConfigError
from app.routing.route import route_topic


def _minimal() -> dict[str, Any]:
    """A fresh, valid mapping with only the required keys; tests mutate their own copy."""
    return {
        "kafka": {"bootstrap_servers": "127.0.0.1:9092", "topic_pattern": r"cdc\.public\..*"},
        "registry": {"url": "http://127.0.0.1:8080"},
        "source": {"topic_prefix": "cdc"},
        "lake": {
            "database": "silver",
            "silver_path": "/tmp/lake/silver",
            "bronze_path": "/tmp/lake/bronze",
            "checkpoint_path": "/tmp/lake/checkpoints",
        },
    }


def _config_error(raw: Any) -> ConfigError:
    with pytest.raises(ConfigError) as excinfo:
        parse_config(raw)
    return excinfo.value


def _assert_names_key(error: ConfigError, key: str, fragment: str) -> None:
    assert error.key == key
    assert f"config key '{key}'" in str(error)
    assert fragment in str(error)


def test_minimal_mapping_loads_into_frozen_config() -> None:
    config = parse_config(_minimal())

    assert isinstance(config, JobConfig)
    assert config.registry == RegistryConfig(url="http://127.0.0.1:8080")
    assert config.lake.database == "silver"
    assert config.metastore is None
    assert config.tables == {}
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.log_level = "DEBUG"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.registry.retries = 0  # type: ignore[misc]


def test_unknown_top_level_key() -> None:
    raw = _minimal() | {"lakehouse": {}}

    _assert_names_key(_config_error(raw), "lakehouse", "unknown key")


def test_unknown_nested_key() -> None:
    raw = _minimal()
    raw["kafka"]["bootstrapservers"] = raw["kafka"].pop("bootstrap_servers")

    _assert_names_key(_config_error(raw), "kafka.bootstrapservers", "unknown key")


def test_unknown_keys_of_mixed_types() -> None:
    # YAML turns `1:` into an int key; with a str key beside it, sorting the unknown keys must not fail.
    raw = _minimal() | {1: "x", "extra": "y"}

    _assert_names_key(_config_error(raw), "1", "unknown key")


def test_missing_required_key() -> None:
    raw = _minimal()
    del raw["lake"]["database"]

    _assert_names_key(_config_error(raw), "lake.database", "missing required value")


def test_missing_required_section() -> None:
    raw = _minimal()
    del raw["registry"]

    _assert_names_key(_config_error(raw), "registry", "missing required value")


def test_wrong_type_string_for_int() -> None:
    raw = _minimal()
    raw["registry"]["retries"] = "many"

    _assert_names_key(_config_error(raw), "registry.retries", "expected int, got str")


def test_wrong_type_bool_for_float() -> None:
    raw = _minimal()
    raw["registry"]["timeout_s"] = True

    _assert_names_key(_config_error(raw), "registry.timeout_s", "expected float, got bool")


def test_wrong_type_bool_for_int() -> None:
    raw = _minimal()
    raw["registry"]["retries"] = False

    _assert_names_key(_config_error(raw), "registry.retries", "expected int, got bool")


def test_bad_literal() -> None:
    raw = _minimal()
    raw["source"]["framing"] = "confluent"

    _assert_names_key(_config_error(raw), "source.framing", "must be one of headers, id8, id4, auto")


def test_hadoop_defaults_is_all_or_core() -> None:
    assert parse_config(_minimal()).spark.hadoop_defaults == "all"
    raw = _minimal()
    raw.setdefault("spark", {})["hadoop_defaults"] = "hdfs"

    _assert_names_key(_config_error(raw), "spark.hadoop_defaults", "must be one of all, core")


def test_null_for_required_value() -> None:
    raw = _minimal()
    raw["kafka"]["topic_pattern"] = None

    _assert_names_key(_config_error(raw), "kafka.topic_pattern", "must not be null")


def test_section_that_is_not_a_mapping() -> None:
    raw = _minimal()
    raw["lake"] = "silver"

    _assert_names_key(_config_error(raw), "lake", "expected a mapping, got str")


def test_root_that_is_not_a_mapping() -> None:
    _assert_names_key(_config_error(["kafka"]), "<root>", "expected a mapping, got list")


def test_bad_regex_in_topic_pattern() -> None:
    raw = _minimal()
    raw["kafka"]["topic_pattern"] = "cdc.public.(orders"

    _assert_names_key(_config_error(raw), "kafka.topic_pattern", "not a valid regular expression")


def test_the_fetch_wait_is_a_duration_set_in_one_place() -> None:
    assert parse_config(_minimal()).kafka.fetch_max_wait_ms == 10
    raw = _minimal()
    raw["kafka"]["fetch_max_wait_ms"] = -1
    _assert_names_key(_config_error(raw), "kafka.fetch_max_wait_ms", "must be >= 0")
    raw = _minimal()
    raw["kafka"]["options"] = {"fetch.max.wait.ms": "500"}
    _assert_names_key(_config_error(raw), "kafka.options.fetch.max.wait.ms", "set kafka.fetch_max_wait_ms instead")


def test_negative_retries() -> None:
    raw = _minimal()
    raw["registry"]["retries"] = -1

    _assert_names_key(_config_error(raw), "registry.retries", "must be >= 0")


@pytest.mark.parametrize("key", ["retain_commits", "clean_every_commits"])
def test_table_services_need_a_commit_at_least(key: str) -> None:
    raw = _minimal()
    raw["lake"][key] = 0

    _assert_names_key(_config_error(raw), f"lake.{key}", "must be >= 1")


def test_the_small_file_limit_is_a_size() -> None:
    raw = _minimal()
    raw["lake"]["small_file_limit_mb"] = -1

    _assert_names_key(_config_error(raw), "lake.small_file_limit_mb", "must be >= 0")
    raw["lake"]["small_file_limit_mb"] = 0.25
    assert parse_config(raw).lake.small_file_bytes == 262144


def test_the_simple_index_tasks_default_to_the_sessions_cores() -> None:
    raw = _minimal()
    assert parse_config(raw).lake.simple_index_tasks is None  # the writer asks the session for its cores
    raw["lake"]["simple_index_tasks"] = -1

    _assert_names_key(_config_error(raw), "lake.simple_index_tasks", "must be >= 0")
    raw["lake"]["simple_index_tasks"] = 0
    assert parse_config(raw).lake.simple_index_tasks == 0


def test_invalid_database_name() -> None:
    raw = _minimal()
    raw["lake"]["database"] = "silver-db"

    _assert_names_key(_config_error(raw), "lake.database", "not a valid database name")


def test_tables_key_without_dot() -> None:
    raw = _minimal() | {"tables": {"orders": {"name": "orders_silver"}}}

    _assert_names_key(_config_error(raw), "tables.orders", "'<schema>.<table>'")


def test_tables_empty_record_key() -> None:
    raw = _minimal() | {"tables": {"public.orders": {"record_key": []}}}

    _assert_names_key(_config_error(raw), "tables.public.orders.record_key", "at least one column")


def test_load_config_reads_yaml_file(tmp_path: Path) -> None:
    path = tmp_path / "local.yaml"
    path.write_text(
        """\
kafka:
  bootstrap_servers: 127.0.0.1:9092
  topic_pattern: 'cdc\\.public\\..*'
  starting_offsets: latest
registry:
  url: http://127.0.0.1:8080
  api: ccompat
  timeout_s: 5
  retries: 2
source:
  topic_prefix: cdc
  framing: headers
  id_type: globalId
lake:
  database: silver
  silver_path: /tmp/lake/silver
  bronze_path: /tmp/lake/bronze
  checkpoint_path: /tmp/lake/checkpoints
spark:
  conf:
    spark.sql.shuffle.partitions: 4
tables:
  public.orders:
    record_key: [order_id]
""",
        encoding="utf-8",
    )

    config = load_config(path)

    assert config.kafka.topic_pattern == r"cdc\.public\..*"
    assert config.kafka.starting_offsets == "latest"
    assert config.registry == RegistryConfig(url="http://127.0.0.1:8080", api="ccompat", timeout_s=5.0, retries=2)
    (source,) = config.source_list
    assert (source.framing, source.id_type) == ("headers", "globalId")
    assert isinstance(config.registry.timeout_s, float)
    assert config.spark.conf == {"spark.sql.shuffle.partitions": "4"}
    assert source.table_config("public", "orders") == TableConfig(record_key=["order_id"])
    assert source.table_config("public", "customers") == TableConfig()


def test_load_config_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.yaml"

    with pytest.raises(ConfigError) as excinfo:
        load_config(path)

    _assert_names_key(excinfo.value, "<file>", f"cannot read {path}")


def test_load_config_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as excinfo:
        load_config(tmp_path)

    _assert_names_key(excinfo.value, "<file>", "cannot read")


def test_load_config_file_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes("lake:\n  database: Größe\n".encode("latin-1"))

    with pytest.raises(ConfigError) as excinfo:
        load_config(path)

    _assert_names_key(excinfo.value, "<file>", "cannot read")


def test_load_config_invalid_yaml(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("kafka:\n  bootstrap_servers: [127.0.0.1:9092\n", encoding="utf-8")

    with pytest.raises(ConfigError) as excinfo:
        load_config(path)

    _assert_names_key(excinfo.value, "<file>", "is not valid YAML")


def test_load_config_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("", encoding="utf-8")

    with pytest.raises(ConfigError) as excinfo:
        load_config(path)

    _assert_names_key(excinfo.value, "<root>", "expected a mapping, got NoneType")


def test_delete_mode_defaults_to_hard_and_a_table_may_switch_to_soft() -> None:
    raw = _minimal()
    raw["tables"] = {"public.orders": {"delete_mode": "soft"}}
    config = parse_config(raw)

    assert config.lake.delete_mode == "hard"
    assert route_topic("cdc.public.orders", config).delete_mode == "soft"
    assert route_topic("cdc.public.customers", config).delete_mode == "hard"


@pytest.mark.parametrize(
    ("where", "key"), [("lake", "lake.delete_mode"), ("table", "tables.public.orders.delete_mode")]
)
def test_delete_mode_must_be_hard_or_soft(where: str, key: str) -> None:
    raw = _minimal()
    if where == "lake":
        raw["lake"]["delete_mode"] = "purge"
    else:
        raw["tables"] = {"public.orders": {"delete_mode": "purge"}}

    _assert_names_key(_config_error(raw), key, "must be one of hard, soft")


def test_truncate_defaults_to_ignore_and_a_table_may_clear() -> None:
    raw = _minimal()
    raw["tables"] = {"public.orders": {"truncate": "clear"}}
    config = parse_config(raw)

    assert config.lake.truncate == "ignore"
    assert route_topic("cdc.public.orders", config).truncate == "clear"
    assert route_topic("cdc.public.customers", config).truncate == "ignore"


def test_unread_rows_are_kept_unless_a_table_deletes_them() -> None:
    raw = _minimal()
    raw["tables"] = {"public.orders": {"unread_rows": "delete"}}
    config = parse_config(raw)

    assert config.lake.unread_rows == "keep"
    assert route_topic("cdc.public.orders", config).unread_rows == "delete"
    assert route_topic("cdc.public.customers", config).unread_rows == "keep"
    raw["tables"] = {"public.orders": {"unread_rows": "purge"}}
    _assert_names_key(_config_error(raw), "tables.public.orders.unread_rows", "must be one of keep, delete")


@pytest.mark.parametrize(("where", "key"), [("lake", "lake.truncate"), ("table", "tables.public.orders.truncate")])
def test_truncate_must_be_ignore_or_clear(where: str, key: str) -> None:
    raw = _minimal()
    if where == "lake":
        raw["lake"]["truncate"] = "drop"
    else:
        raw["tables"] = {"public.orders": {"truncate": "drop"}}

    _assert_names_key(_config_error(raw), key, "must be one of ignore, clear")


def test_registry_auth_oidc_reads_the_secret_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REGISTRY_CLIENT_SECRET", "s3cret")
    raw = _minimal()
    raw["registry"]["auth"] = {
        "type": "oidc", "client_id": "cdc-job", "client_secret_env": "REGISTRY_CLIENT_SECRET",
        "token_url": "https://idp.example/token", "scope": "registry", "refresh_margin_s": 20,
    }

    config = parse_config(raw)

    assert config.registry.auth.secret() == "s3cret"
    assert "s3cret" not in repr(config)


@pytest.mark.parametrize(
    ("auth", "key", "message"),
    [
        ({"type": "basic", "username": "u"}, "registry.auth.password_env", "required for auth type basic"),
        ({"type": "basic", "username": "u", "password_env": "NOT_SET_ANYWHERE_42"}, "registry.auth.password_env",
         "environment variable NOT_SET_ANYWHERE_42 is not set"),
        ({"type": "oidc", "client_id": "c", "client_secret_env": "HOME"}, "registry.auth.token_url",
         "required for auth type oidc"),
        ({"type": "oidc", "client_id": "c", "client_secret_env": "HOME", "token_url": "idp/token"},
         "registry.auth.token_url", "expected an http(s) URL"),
        ({"type": "none", "username": "u"}, "registry.auth.username", "does not apply to auth type none"),
        ({"type": "basic", "username": "u", "password_env": "HOME", "scope": "x"}, "registry.auth.scope",
         "does not apply to auth type basic"),
        ({"type": "basic", "username": "u", "password": "inline"}, "registry.auth.password", "unknown key"),
        ({"type": "kerberos"}, "registry.auth.type", "must be one of none, basic, oidc"),
    ],
)
def test_registry_auth_is_validated(auth: dict, key: str, message: str) -> None:
    raw = _minimal()
    raw["registry"]["auth"] = auth

    _assert_names_key(_config_error(raw), key, message)


def test_registry_id_type_moved_to_the_source_is_an_unknown_key() -> None:
    raw = _minimal()
    raw["registry"]["id_type"] = "globalId"

    _assert_names_key(_config_error(raw), "registry.id_type", "unknown key")


def test_table_layout_per_table_with_lake_defaults() -> None:
    raw = _minimal()
    raw["lake"]["compaction_delta_commits"] = 4
    raw["tables"] = {
        "public.orders": {"table_type": "MERGE_ON_READ", "partition_by": "day(placed_at)"},
        "public.events": {"table_type": "MERGE_ON_READ", "compaction_delta_commits": 2, "partition_by": "region"},
    }
    config = parse_config(raw)

    orders = route_topic("cdc.public.orders", config)
    assert (orders.table_type, str(orders.partition), orders.compaction_delta_commits) == (
        "MERGE_ON_READ", "day(placed_at)", 4
    )
    events = route_topic("cdc.public.events", config)
    assert (events.partition and events.partition.field, events.compaction_delta_commits) == ("region", 2)
    other = route_topic("cdc.public.customers", config)
    assert (other.table_type, other.partition) == ("COPY_ON_WRITE", None)


@pytest.mark.parametrize(
    ("table", "key", "message"),
    [
        ({"table_type": "MERGE_ON_WRITE"}, "tables.public.orders.table_type", "must be one of COPY_ON_WRITE"),
        ({"partition_by": "hour(placed_at)"}, "tables.public.orders.partition_by", "day(column)"),
        ({"compaction_delta_commits": 3}, "tables.public.orders.compaction_delta_commits", "MERGE_ON_READ tables only"),
        (
            {"table_type": "MERGE_ON_READ", "compaction_delta_commits": 0},
            "tables.public.orders.compaction_delta_commits", "must be >= 1",
        ),
    ],
)
def test_table_layout_is_validated(table: dict[str, Any], key: str, message: str) -> None:
    raw = _minimal()
    raw["tables"] = {"public.orders": table}
    _assert_names_key(_config_error(raw), key, message)


def test_a_signal_topic_the_job_would_read_as_a_table_is_refused() -> None:
    raw = _minimal()
    raw["source"]["signal_topic"] = "cdc.public.signals"  # matches kafka.topic_pattern

    _assert_names_key(_config_error(raw), "source.signal_topic", "matches kafka.topic_pattern")
    raw["source"]["signal_topic"] = "cdc-signals"
    assert parse_config(raw).source_list[0].signal_topic == "cdc-signals"


def test_which_new_columns_ask_for_a_snapshot_is_one_of_three_and_all_by_default() -> None:
    raw = _minimal()
    assert parse_config(raw).source_list[0].snapshot_new_columns == "all"
    raw["source"]["snapshot_new_columns"] = "with_default"
    assert parse_config(raw).source_list[0].snapshot_new_columns == "with_default"
    raw["source"]["snapshot_new_columns"] = "sometimes"

    _assert_names_key(_config_error(raw), "source.snapshot_new_columns", "sometimes")
