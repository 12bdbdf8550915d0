"""Record keys and routing: key fields from the Debezium Key schema (app/wire/decode.py), topic -> table
(app/routing/route.py)."""
from __future__ import annotations

import json
from typing import Any

import pytest

from app.config import JobConfig, parse_config
from app.errors import EnvelopeError
from app.routing.route import TableRoute, route_topic
from app.wire.decode import record_fields

NAMESPACE = "tickit.crm.users"
SINGLE_KEY = json.dumps({
    "type": "record",
    "name": "Key",
    "namespace": NAMESPACE,
    "fields": [{"name": "userid", "type": "int"}],
    "connect.name": f"{NAMESPACE}.Key",
})
# Declared order is the key order (not alphabetical): tenant_id after user_id on purpose.
COMPOSITE_KEY = json.dumps({
    "type": "record",
    "name": "Key",
    "namespace": NAMESPACE,
    "fields": [{"name": "user_id", "type": "int"}, {"name": "tenant_id", "type": "string"}],
    "connect.name": f"{NAMESPACE}.Key",
})
# Debezium's shape: `before` defines the Value record inline, `after` refers to it by name.
ENVELOPE = json.dumps({
    "type": "record",
    "name": "Envelope",
    "namespace": NAMESPACE,
    "fields": [
        {
            "name": "before",
            "type": ["null", {
                "type": "record",
                "name": "Value",
                "fields": [
                    {"name": "userid", "type": "int"},
                    {"name": "username", "type": ["null", "string"], "default": None},
                    {
                        "name": "created",
                        "type": ["null", {"type": "long", "connect.name": "io.debezium.time.MicroTimestamp"}],
                        "default": None,
                    },
                ],
                "connect.name": f"{NAMESPACE}.Value",
            }],
            "default": None,
        },
        {"name": "after", "type": ["null", f"{NAMESPACE}.Value"], "default": None},
        {"name": "op", "type": "string"},
    ],
    "connect.name": f"{NAMESPACE}.Envelope",
})


def _names(fields: list[dict[str, Any]]) -> list[str]:
    return [f["name"] for f in fields]


def test_single_field_key() -> None:
    assert record_fields(SINGLE_KEY) == [{"name": "userid", "type": "int"}]


def test_composite_key_keeps_the_declared_order() -> None:
    assert _names(record_fields(COMPOSITE_KEY)) == ["user_id", "tenant_id"]


def test_envelope_before_gives_the_value_fields_with_their_types() -> None:
    fields = record_fields(ENVELOPE, "before")

    assert _names(fields) == ["userid", "username", "created"]
    assert fields[2]["type"][1]["connect.name"] == "io.debezium.time.MicroTimestamp"


def test_envelope_after_refers_to_value_by_name() -> None:
    # The batch falls back from `before` to `after`; a by-name reference is not a record definition.
    with pytest.raises(ValueError, match="not a record schema"):
        record_fields(ENVELOPE, "after")


def test_missing_field_is_an_error() -> None:
    with pytest.raises(ValueError, match="has no field 'payload'"):
        record_fields(ENVELOPE, "payload")


def test_non_record_schema_is_an_error() -> None:
    with pytest.raises(ValueError, match="not a record schema"):
        record_fields(json.dumps({"type": "string"}))


def _config(tables: dict[str, Any] | None = None) -> JobConfig:
    raw: dict[str, Any] = {
        "kafka": {"bootstrap_servers": "127.0.0.1:9092", "topic_pattern": r"tickit\..*"},
        "registry": {"url": "http://127.0.0.1:8080"},
        "source": {"topic_prefix": "tickit"},
        "lake": {
            "database": "silver",
            "silver_path": "/tmp/lake/silver",
            "bronze_path": "/tmp/lake/bronze",
            "checkpoint_path": "/tmp/lake/checkpoints",
        },
    }
    if tables is not None:
        raw["tables"] = tables
    return parse_config(raw)


def test_topic_routes_to_schema_underscore_table_in_the_configured_database() -> None:
    route = route_topic("tickit.crm.users", _config())

    assert route == TableRoute(
        topic="tickit.crm.users",
        source_schema="crm",
        source_table="users",
        database="silver",
        table="crm_users",
        record_key=None,
        source="tickit",
    )
    assert route.qualified_name == "silver.crm_users"


def test_tables_override_sets_name_and_record_key() -> None:
    config = _config({"crm.users": {"name": "users", "record_key": ["tenant_id", "user_id"]}})

    route = route_topic("tickit.crm.users", config)
    other = route_topic("tickit.crm.events", config)

    assert (route.qualified_name, route.record_key) == ("silver.users", ("tenant_id", "user_id"))
    assert (other.qualified_name, other.record_key) == ("silver.crm_events", None)


def test_tables_override_of_record_key_only_keeps_the_default_name() -> None:
    route = route_topic("tickit.crm.users", _config({"crm.users": {"record_key": ["userid"]}}))

    assert (route.table, route.record_key) == ("crm_users", ("userid",))


@pytest.mark.parametrize("topic", ["tickit.users", "tickit.crm.users.v2", "tickit..users", "tickit.crm."])
def test_topic_outside_prefix_schema_table_is_rejected(topic: str) -> None:
    with pytest.raises(EnvelopeError, match=r"is not 'tickit\.<schema>\.<table>' \(source tickit\)") as excinfo:
        route_topic(topic, _config())

    assert repr(topic) in str(excinfo.value)


@pytest.mark.parametrize("topic", ["other.crm.users", "tickitx.crm.users"])
def test_topic_of_no_source_is_rejected(topic: str) -> None:
    with pytest.raises(EnvelopeError, match=r"starts with no source's topic prefix \('tickit\.'\)") as excinfo:
        route_topic(topic, _config())

    assert repr(topic) in str(excinfo.value)
