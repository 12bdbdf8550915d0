"""RegistryClient against a real Apicurio 3.0.9 with authentication on: HTTP Basic and OIDC client credentials.

The module starts a local OIDC provider (tests/support/oidc.py: discovery, JWKS, RS256 tokens) and a second
Apicurio trusting it (tests/support/auth_registry.py), in ccompat legacy-id mode, so ccompat serves globalIds.
Nothing stands in for the registry or the token endpoint.
"""
from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from app.config import RegistryAuthConfig, RegistryConfig
from app.errors import RegistryAuthError, RegistryError
from app.wire.auth import ClientCredentials
from app.wire.registry import RegistryClient
from tests.support.auth_registry import auth_registry, free_port
from tests.support.oidc import OidcProvider

pytestmark = pytest.mark.stack

CLIENT_ID = "cdc-job"
SECRET = f"s3cret-{uuid.uuid4().hex}"
SECRET_ENV = "TEST_REGISTRY_SECRET"
# A client only one test uses: Apicurio caches each Basic exchange, so its first use must reach the provider.
OTHER_CLIENT_ID, OTHER_SECRET = "cdc-other", f"other-{uuid.uuid4().hex}"
TTL_S = 300.0


@dataclass(frozen=True)
class AuthRegistry:
    url: str
    idp: OidcProvider
    text: str
    content_id: int
    global_id: int  # a second version of the same content: its globalId differs from the contentId


@pytest.fixture(scope="module")
def registry(test_dir: Path) -> Iterator[AuthRegistry]:
    with (
        OidcProvider({CLIENT_ID: SECRET, OTHER_CLIENT_ID: OTHER_SECRET}, token_ttl_s=TTL_S) as idp,
        auth_registry(idp, free_port(), test_dir / "auth-registry.log") as url,
    ):
        text = json.dumps({"type": "record", "name": "Probe", "namespace": "test.auth",
                           "fields": [{"name": "id", "type": "long"}]})
        token = idp.issue_token(CLIENT_ID)
        versions = [_register(url, token, f"probe-{n}", text) for n in ("a", "b")]
        content_id, global_id = int(versions[1]["contentId"]), int(versions[1]["globalId"])
        assert content_id == int(versions[0]["contentId"]) and global_id != content_id
        yield AuthRegistry(url, idp, text, content_id, global_id)


def _register(url: str, token: str, artifact_id: str, text: str) -> dict:
    body = {"artifactId": artifact_id, "artifactType": "AVRO",
            "firstVersion": {"content": {"content": text, "contentType": "application/json"}}}
    response = requests.post(f"{url}/apis/registry/v3/groups/default/artifacts", json=body, timeout=10,
                             headers={"Authorization": f"Bearer {token}"})
    response.raise_for_status()
    return dict(response.json()["version"])


def _config(registry: AuthRegistry, auth_type: str, api: str = "v3") -> RegistryConfig:
    if auth_type == "basic":
        auth = RegistryAuthConfig(type="basic", username=CLIENT_ID, password_env=SECRET_ENV)
    else:
        auth = RegistryAuthConfig(
            type="oidc", client_id=CLIENT_ID, client_secret_env=SECRET_ENV, token_url=registry.idp.token_url
        )
    return RegistryConfig(url=registry.url, api=api, auth=auth, retries=0)  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def secret_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SECRET_ENV, SECRET)


LOOKUPS = [("v3", "contentId"), ("v3", "globalId"), ("v2", "contentId"), ("v2", "globalId"), ("ccompat", "globalId")]


@pytest.mark.parametrize("auth_type", ["basic", "oidc"])
@pytest.mark.parametrize(("api", "id_type"), LOOKUPS)
def test_every_api_and_id_type_with_each_auth(registry: AuthRegistry, auth_type: str, api: str, id_type: str) -> None:
    schema_id = registry.content_id if id_type == "contentId" else registry.global_id

    with RegistryClient.from_config(_config(registry, auth_type, api)) as client:
        assert client.get_schema(schema_id, id_type) == registry.text


def test_ccompat_legacy_id_mode_takes_global_ids(registry: AuthRegistry) -> None:
    # In legacy-id mode ccompat's id is the globalId: the contentId names the first version, a different id.
    with RegistryClient.from_config(_config(registry, "oidc", "ccompat")) as client:
        url = client.schema_url(registry.global_id, "globalId")
        assert url == f"{registry.url}/apis/ccompat/v7/schemas/ids/{registry.global_id}"
        assert client.get_schema(registry.global_id, "globalId") == registry.text


def test_basic_credentials_are_exchanged_by_the_registry_and_oidc_ones_by_the_client(
    registry: AuthRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry.idp.reset()
    with RegistryClient.from_config(_config(registry, "oidc")) as client:
        client.get_schema(registry.content_id)
    monkeypatch.setenv("TEST_OTHER_SECRET", OTHER_SECRET)
    basic = RegistryConfig(url=registry.url, auth=RegistryAuthConfig(
        type="basic", username=OTHER_CLIENT_ID, password_env="TEST_OTHER_SECRET"
    ))
    with RegistryClient.from_config(basic) as client:
        client.get_schema(registry.content_id)

    # Our client authenticates at the token endpoint with HTTP Basic; Apicurio posts the Basic pair as a form.
    assert [(r.client_id, r.auth_method, r.granted) for r in registry.idp.token_log] == [
        (CLIENT_ID, "client_secret_basic", True), (OTHER_CLIENT_ID, "client_secret_post", True)
    ]


def test_anonymous_request_is_refused_naming_the_setting(registry: AuthRegistry) -> None:
    with RegistryClient(registry.url, retries=0) as client, pytest.raises(RegistryError) as excinfo:
        client.get_schema(registry.content_id)

    assert excinfo.value.http_status == 401
    assert "no credentials configured (registry.auth)" in str(excinfo.value)
    assert client.schema_url(registry.content_id) in str(excinfo.value)


def test_wrong_basic_password_is_refused(registry: AuthRegistry, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SECRET_ENV, "wrong-password")

    with RegistryClient.from_config(_config(registry, "basic")) as client, pytest.raises(RegistryError) as excinfo:
        client.get_schema(registry.content_id)

    assert excinfo.value.http_status == 401
    assert "credentials refused" in str(excinfo.value)
    assert "wrong-password" not in str(excinfo.value)


def test_wrong_client_secret_names_the_token_endpoint_not_the_secret(
    registry: AuthRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SECRET_ENV, "wrong-secret")

    with RegistryClient.from_config(_config(registry, "oidc")) as client, pytest.raises(RegistryAuthError) as excinfo:
        client.get_schema(registry.content_id)

    message = str(excinfo.value)
    assert registry.idp.token_url in message and repr(CLIENT_ID) in message and "HTTP 401 invalid_client" in message
    assert "wrong-secret" not in message


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_token_is_renewed_before_it_expires(registry: AuthRegistry) -> None:
    clock = FakeClock()
    auth = ClientCredentials(registry.idp.token_url, CLIENT_ID, SECRET, refresh_margin_s=30, clock=clock)
    registry.idp.reset()

    def fetch(api: str) -> None:  # a new client each time: its cache is empty, so every lookup is a request
        with RegistryClient(registry.url, api, auth=auth) as client:
            assert client.get_schema(registry.content_id) == registry.text

    fetch("v3")
    clock.now += TTL_S - 31  # 31 s before expiry: the token is still used
    fetch("v2")
    assert registry.idp.token_requests.get(CLIENT_ID) == 1
    clock.now += 2  # 29 s before expiry: inside the margin, renewed
    fetch("v3")

    assert registry.idp.token_requests.get(CLIENT_ID) == 2
    assert auth.tokens_fetched == 2


def test_a_token_the_registry_rejects_is_renewed_once(registry: AuthRegistry) -> None:
    # The client thinks its token is valid (a frozen clock), the registry says it is not: signed by an unknown
    # key. The client renews once and succeeds.
    clock = FakeClock()
    auth = ClientCredentials(registry.idp.token_url, CLIENT_ID, SECRET, clock=clock)
    auth.token()
    auth._token = "not-a-valid-jwt"  # what a revoked or foreign token looks like to the registry
    registry.idp.reset()

    with RegistryClient(registry.url, auth=auth, retries=0) as client:
        assert client.get_schema(registry.global_id, "globalId") == registry.text

    assert registry.idp.token_requests.get(CLIENT_ID) == 1


def test_secrets_and_tokens_are_never_logged(
    registry: AuthRegistry, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokens = []
    with caplog.at_level(logging.DEBUG):
        for auth_type in ("oidc", "basic"):
            config = _config(registry, auth_type)
            with RegistryClient.from_config(config) as client:
                client.get_schema(registry.content_id)
                logging.getLogger("test").info("config %r client auth %r", config, client.auth)
                if isinstance(client.auth, ClientCredentials):
                    tokens.append(client.auth.token())
        monkeypatch.setenv(SECRET_ENV, "bad-" + SECRET)
        with RegistryClient.from_config(_config(registry, "oidc")) as client, pytest.raises(RegistryAuthError):
            client.get_schema(registry.content_id)

    assert "app.wire.auth" in {r.name for r in caplog.records}  # the client did log, at INFO and below
    assert tokens and all(t not in caplog.text for t in tokens)
    assert SECRET not in caplog.text
