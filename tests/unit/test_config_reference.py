"""docs/configuration.md is generated from app/config/model.py (scripts/config_reference.py) and must match it."""
from __future__ import annotations

import pytest

from app.config.model import KafkaConfig
from scripts.config_reference import PAGE, meanings, render, rows


def test_the_config_reference_page_matches_the_config_classes() -> None:
    assert PAGE.read_text(encoding="utf-8") == render(), (
        "docs/configuration.md is stale: run .venv/bin/python scripts/config_reference.py")


def test_every_key_has_its_type_default_and_meaning() -> None:
    page = render()
    assert "| `source.snapshot_new_columns` | string | `all` | `all`, `with_default`, `none` | Which columns" in page
    assert "| `kafka.bootstrap_servers` | string | required |" in page
    assert "| `metastore.password_env` | string | `METASTORE_PASSWORD` |" in page


def test_a_field_without_a_comment_is_refused() -> None:
    source = "class KafkaConfig:\n    # the brokers\n    bootstrap_servers: str\n    topic_pattern: str\n"
    assert meanings(source) == {("KafkaConfig", "bootstrap_servers"): "the brokers"}
    with pytest.raises(ValueError, match=r"KafkaConfig\.topic_pattern has no comment"):
        list(rows(KafkaConfig, "kafka.", meanings(source)))
