"""RegistryClient against the real Apicurio Registry of the local stack.

Nothing stands in for the registry: schemas are registered through its v3 REST API, and a counting proxy
(tests/support/http_proxy.py) sits in front of it where a test must count requests or inject 503s.
"""
from __future__ import annotations

import json
import logging
import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import requests

from app.config import RegistryConfig
from app.errors import ConfigError, RegistryError
from app.wire.registry import RegistryClient
from tests.support.http_proxy import CountingProxy

pytestmark = pytest.mark.stack

REGISTRY_URL = "http://127.0.0.1:8080"
ARTIFACTS_URL = f"{REGISTRY_URL}/apis/registry/v3/groups/default/artifacts"
UNKNOWN_ID = 987654321
FAST_BACKOFF_S = 0.01


@dataclass(frozen=True)
class RegisteredSchema:
    artifact_id: str
    text: str
    content_id: int
    global_id: int


def _register(content: str) -> dict[str, Any]:
    """Create an AVRO artifact in the default group; return the `version` metadata of the response."""
    body = {
        "artifactId": f"test-registry-{uuid.uuid4().hex}",
        "artifactType": "AVRO",
        "firstVersion": {"content": {"content": content, "contentType": "application/json"}},
    }
    response = requests.post(ARTIFACTS_URL, json=body, timeout=10)
    response.raise_for_status()
    # Apicurio 3 answers {"artifact": {...}, "version": {"artifactId", "version", "globalId", "contentId", ...}}.
    version: dict[str, Any] = response.json()["version"]
    return version


def _avro_schema() -> str:
    # A unique record name makes the content new, so the registry assigns a fresh content id; the non-ASCII doc
    # checks the UTF-8 round trip (Apicurio serves content ids as application/octet-stream, without a charset).
    return json.dumps(
        {
            "type": "record",
            "name": f"Probe{uuid.uuid4().hex}",
            "namespace": "test.registry",
            "doc": "Größe in €",
            "fields": [{"name": "id", "type": "long"}, {"name": "label", "type": ["null", "string"]}],
        },
        ensure_ascii=False,
    )


@pytest.fixture(scope="module")
def registered() -> RegisteredSchema:
    text = _avro_schema()
    version = _register(text)
    return RegisteredSchema(version["artifactId"], text, int(version["contentId"]), int(version["globalId"]))


@pytest.fixture(params=["v3", "v2", "ccompat"])
def api(request: pytest.FixtureRequest) -> str:
    """Every test taking `api` runs against each API the client speaks (ids here are contentIds, which all
    three serve; ccompat globalIds need legacy-id mode: tests/test_registry_auth.py)."""
    return str(request.param)


@pytest.fixture
def proxy() -> Iterator[CountingProxy]:
    with CountingProxy(REGISTRY_URL) as running:
        yield running


def _closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_get_schema_returns_registered_text(registered: RegisteredSchema, api: str) -> None:
    with RegistryClient(REGISTRY_URL, api) as client:
        assert client.get_schema(registered.content_id) == registered.text


def test_cache_serves_repeated_lookups_with_one_request(
    registered: RegisteredSchema, proxy: CountingProxy, api: str
) -> None:
    direct = requests.get(f"{REGISTRY_URL}/apis/registry/v3/ids/contentIds/{registered.content_id}", timeout=10)
    direct.raise_for_status()

    with RegistryClient(proxy.url, api) as client:
        texts = [client.get_schema(registered.content_id) for _ in range(3)]

    assert proxy.request_count == 1
    assert proxy.paths == [client.schema_url(registered.content_id).removeprefix(proxy.url)]
    assert texts == [direct.content.decode("utf-8")] * 3


def test_retries_503_then_succeeds(
    registered: RegisteredSchema, proxy: CountingProxy, caplog: pytest.LogCaptureFixture, api: str
) -> None:
    proxy.fail_next(2, status=503)

    with (
        caplog.at_level(logging.WARNING, logger="app.wire.registry"),
        RegistryClient(proxy.url, api, retries=4, backoff_s=FAST_BACKOFF_S) as client,
    ):
        text = client.get_schema(registered.content_id)

    assert text == registered.text
    assert proxy.request_count == 3
    warnings = [r for r in caplog.records if r.name == "app.wire.registry" and r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert all(str(registered.content_id) in r.getMessage() for r in warnings)


def test_retries_exhausted_names_id_url_and_status(
    registered: RegisteredSchema, proxy: CountingProxy, api: str
) -> None:
    proxy.fail_always(status=503)
    retries = 2

    with RegistryClient(proxy.url, api, retries=retries, backoff_s=FAST_BACKOFF_S) as client:
        url = client.schema_url(registered.content_id)
        with pytest.raises(RegistryError) as excinfo:
            client.get_schema(registered.content_id)

    message = str(excinfo.value)
    assert str(registered.content_id) in message
    assert url in message
    assert "503" in message
    assert excinfo.value.http_status == 503
    assert proxy.request_count == retries + 1


def test_unknown_id_fails_at_once_with_404(proxy: CountingProxy, api: str) -> None:
    with RegistryClient(proxy.url, api, retries=3, backoff_s=FAST_BACKOFF_S) as client:
        url = client.schema_url(UNKNOWN_ID)
        with pytest.raises(RegistryError, match="unknown schema id") as excinfo:
            client.get_schema(UNKNOWN_ID)

    assert str(UNKNOWN_ID) in str(excinfo.value)
    assert url in str(excinfo.value)
    assert excinfo.value.http_status == 404
    assert excinfo.value.schema_id == UNKNOWN_ID
    assert proxy.request_count == 1


@pytest.mark.parametrize("api", ["v3", "v2"])
def test_global_id_lookup(registered: RegisteredSchema, proxy: CountingProxy, api: str) -> None:
    # Registering the same content again creates a new version (new global id) that shares the content id,
    # so the global id differs from the content id and only the globalIds endpoint maps it to this schema.
    version = _register(registered.text)
    global_id = int(version["globalId"])
    assert int(version["contentId"]) == registered.content_id
    assert global_id != registered.content_id

    with RegistryClient(proxy.url, api) as client:
        assert client.get_schema(global_id, "globalId") == registered.text
        # The cache keys by id type: the same number as a contentId is another schema.
        assert client.get_schema(registered.content_id, "contentId") == registered.text

    assert proxy.paths == [
        f"/apis/registry/{api}/ids/globalIds/{global_id}",
        f"/apis/registry/{api}/ids/contentIds/{registered.content_id}",
    ]


def test_connection_refused_fails_after_retries(caplog: pytest.LogCaptureFixture) -> None:
    url = f"http://127.0.0.1:{_closed_port()}"

    with (
        caplog.at_level(logging.WARNING, logger="app.wire.registry"),
        RegistryClient(url, timeout_s=2, retries=2, backoff_s=FAST_BACKOFF_S) as client,
    ):
        with pytest.raises(RegistryError, match="gave up after 3 attempts") as excinfo:
            client.get_schema(1)

    assert client.schema_url(1) in str(excinfo.value)
    assert excinfo.value.http_status is None
    assert isinstance(excinfo.value.__cause__, requests.ConnectionError)
    assert len([r for r in caplog.records if r.name == "app.wire.registry"]) == 2


def test_content_that_is_not_json_is_rejected(api: str) -> None:
    # Apicurio has no validity rule by default, so it stores AVRO content that is not even JSON.
    content_id = int(_register(f"not json {uuid.uuid4().hex}")["contentId"])

    # ccompat refuses such content itself (HTTP 400, "Failed to discover artifact type"); the others serve it.
    expected = "HTTP 400.*artifact type" if api == "ccompat" else "not JSON"
    with RegistryClient(REGISTRY_URL, api) as client, pytest.raises(RegistryError, match=expected) as excinfo:
        client.get_schema(content_id)

    assert client.schema_url(content_id) in str(excinfo.value)


@pytest.mark.parametrize("path", ["/apis/registry/v3/", "/apis/registry/v2", "/apis/ccompat/v7"])
def test_url_with_api_path_is_accepted(registered: RegisteredSchema, path: str) -> None:
    with RegistryClient(f"{REGISTRY_URL}{path}") as client:
        assert client.base_url == REGISTRY_URL
        assert client.get_schema(registered.content_id) == registered.text


def test_from_config(registered: RegisteredSchema) -> None:
    cfg = RegistryConfig(url=f"{REGISTRY_URL}/", api="v2", timeout_s=5.0, retries=1, backoff_s=0.1)

    with RegistryClient.from_config(cfg) as client:
        assert client.schema_url(registered.global_id, "globalId") == (
            f"{REGISTRY_URL}/apis/registry/v2/ids/globalIds/{registered.global_id}"
        )
        assert client.get_schema(registered.global_id, "globalId") == registered.text
        assert client.auth is None


def test_no_credentials_against_an_open_registry_send_no_authorization(
    registered: RegisteredSchema, proxy: CountingProxy
) -> None:
    with RegistryClient(proxy.url) as client:
        client.get_schema(registered.content_id)

    assert proxy.request_count == 1


def test_latest_schema_is_the_newest_version_of_the_artifact(api: str) -> None:
    first = _avro_schema()
    artifact = _register(first)["artifactId"]
    with RegistryClient(REGISTRY_URL, api) as client:
        assert client.latest_schema(artifact) == first
        newer = _avro_schema()
        response = requests.post(
            f"{ARTIFACTS_URL}/{artifact}/versions",
            json={"content": {"content": newer, "contentType": "application/json"}},
            timeout=10,
        )
        response.raise_for_status()
        assert client.latest_schema(artifact) == newer  # not cached: a topic's schema moves on


def test_latest_schema_of_an_unknown_artifact_is_none_at_once(proxy: CountingProxy, api: str) -> None:
    with RegistryClient(proxy.url, api, retries=3, backoff_s=FAST_BACKOFF_S) as client:
        assert client.latest_schema(f"no-such-topic-{uuid.uuid4().hex}-value") is None
    assert proxy.request_count == 1


def test_the_start_up_check_passes_on_each_api(api: str) -> None:
    with RegistryClient(REGISTRY_URL, api) as client:
        assert client.check().startswith(f"{REGISTRY_URL}/apis/")


def test_the_start_up_check_tells_a_wrong_answer_from_an_outage(proxy: CountingProxy) -> None:
    proxy.fail_always(status=404)
    with RegistryClient(proxy.url, retries=0) as client, pytest.raises(ConfigError) as wrong:
        client.check()
    assert wrong.value.key == "registry.url" and "answered 404" in str(wrong.value)
    proxy.fail_always(status=503)
    with RegistryClient(proxy.url, retries=1, backoff_s=0.01) as client, pytest.raises(RegistryError) as out:
        client.check()
    assert out.value.unreachable  # an outage: the job waits (app/recovery.py)
    with RegistryClient(f"http://127.0.0.1:{_closed_port()}", retries=0) as client, pytest.raises(RegistryError) as out:
        client.check()
    assert out.value.unreachable
