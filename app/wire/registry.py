"""Schema-registry client for Apicurio Registry: the writer schema of a Kafka record, by id.

Debezium's Apicurio converter frames each record with the id of its writer schema (app/wire/framing.py); the decode
step asks this client for the Avro schema text behind that id. Three APIs serve it:
- v3 and v2: `GET /apis/registry/<v3|v2>/ids/<contentIds|globalIds>/<id>`, the raw schema text;
- ccompat: `GET /apis/ccompat/v7/schemas/ids/<id>`, JSON `{"schema": <text>}`. The id is a contentId unless the
  registry runs in legacy-id mode (`apicurio.ccompat.legacy-id-mode.enabled=true`), where it is a globalId:
  the client cannot tell, so a globalId lookup on ccompat relies on that mode (docs/sources.md "Registry").
A topic's latest value schema, by artifact name (`<topic>-value` in group `default`, the converters' topic-id
strategy), serves the checks made at start (app/batch/planner.py `check_merges_at_start`):
- v3: `GET /apis/registry/v3/groups/<group>/artifacts/<name>/versions/branch=latest/content`;
- v2: `GET /apis/registry/v2/groups/<group>/artifacts/<name>`;
- ccompat: `GET /apis/ccompat/v7/subjects/<name>/versions/latest`, JSON `{"schema": <text>, ...}`.
Authentication: none, HTTP Basic, or OIDC client credentials (app/wire/auth.py). The client runs on the driver only.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from types import TracebackType
from typing import NamedTuple
from urllib.parse import quote

import requests
from requests.auth import AuthBase

from app.config import RegistryConfig
from app.errors import ConfigError, RegistryError, required
from app.wire.auth import ClientCredentials, auth_from_config

log = logging.getLogger(__name__)

API_PATHS = {"v3": "/apis/registry/v3", "v2": "/apis/registry/v2", "ccompat": "/apis/ccompat/v7"}
ID_TYPE_CONTENT = "contentId"
ID_TYPE_GLOBAL = "globalId"
# Apicurio's own APIs serve the raw content of an id under /ids/<kind>s/<id>; the framing's id type picks the kind.
ID_PATHS = {ID_TYPE_CONTENT: "contentIds", ID_TYPE_GLOBAL: "globalIds"}
DEFAULT_GROUP = "default"
MAX_BACKOFF_S = 10.0
HTTP_OK = 200
HTTP_UNAUTHORIZED = 401
HTTP_FORBIDDEN = 403
HTTP_NOT_FOUND = 404
HTTP_TOO_MANY_REQUESTS = 429
HTTP_SERVER_ERROR = 500


class SchemaRef(NamedTuple):
    """A writer schema as a record names it: the id type its framing carries and the id."""

    id_type: str
    id: int

    def __str__(self) -> str:
        return f"{self.id_type}:{self.id}"


class RegistryClient:
    """Fetches Avro schema text from Apicurio Registry by content id or global id.

    Cache: every schema fetched is kept in a per-process dict keyed by (id type, id) and never expires, because
    an id names immutable content in the registry. Failures are not cached. A lock guards the dict; two threads
    missing the same id at once may both fetch it, which is harmless since both get the same text.

    Retries: connection errors, timeouts, HTTP 429 and 5xx are retried up to `retries` times, sleeping
    `backoff_s * 2**n` seconds before retry n (counting from 0), at most MAX_BACKOFF_S. An HTTP 401 with OIDC
    auth renews the token and retries once; other 4xx fail at once.
    """

    def __init__(
        self,
        url: str,
        api: str = "v3",
        timeout_s: float = 10.0,
        retries: int = 4,
        backoff_s: float = 0.5,
        *,
        auth: AuthBase | None = None,
        session: requests.Session | None = None,
    ) -> None:
        """Build a client; nothing is requested until the first get_schema.

        Args:
            url: server base such as http://127.0.0.1:8080; a trailing slash or an API path is stripped.
            api: "v3", "v2" or "ccompat".
            timeout_s: connect and read timeout of every request, in seconds.
            retries: retries after the first attempt; 0 means a single attempt.
            backoff_s: sleep before the first retry, doubled for each further retry.
            auth: keyword-only; a requests auth object (app/wire/auth.py), or None for an open registry.
            session: keyword-only; a requests session to reuse. When omitted the client creates and owns one.

        Raises:
            ConfigError: an argument is out of range; the key names the matching `registry.*` config key.
        """
        base = url.strip().rstrip("/")
        for path in API_PATHS.values():
            base = base.removesuffix(path).rstrip("/")
        if not base.startswith(("http://", "https://")):
            raise ConfigError("registry.url", f"expected an http(s) URL, got {url!r}")
        if api not in API_PATHS:
            raise ConfigError("registry.api", f"must be one of {', '.join(API_PATHS)}; got {api!r}")
        if timeout_s <= 0:
            raise ConfigError("registry.timeout_s", "must be > 0")
        if retries < 0:
            raise ConfigError("registry.retries", "must be >= 0")
        if backoff_s < 0:
            raise ConfigError("registry.backoff_s", "must be >= 0")
        self.base_url = base
        self.api = api
        self.auth = auth
        self._timeout_s = timeout_s
        self._retries = retries
        self._backoff_s = backoff_s
        self._owns_session = session is None
        self._session = session if session is not None else requests.Session()
        self._cache: dict[tuple[str, int], str] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, cfg: RegistryConfig) -> RegistryClient:
        """Build a client from the `registry` section of the job config (secrets read from the environment).

        Raises:
            ConfigError: a value is out of range (see __init__).
        """
        return cls(
            url=cfg.url,
            api=cfg.api,
            timeout_s=cfg.timeout_s,
            retries=cfg.retries,
            backoff_s=cfg.backoff_s,
            auth=auth_from_config(cfg.auth, cfg.timeout_s),
        )

    def schema_url(self, schema_id: int, id_type: str = ID_TYPE_CONTENT) -> str:
        """Return the URL that serves the schema of an id.

        Args:
            schema_id: a content id or global id, as `id_type` says.
            id_type: "contentId" or "globalId". On ccompat the URL is the same for both (see the module doc).

        Returns:
            The absolute URL, e.g. http://127.0.0.1:8080/apis/registry/v3/ids/contentIds/7.
        """
        if id_type not in ID_PATHS:
            raise ValueError(f"id_type must be one of {', '.join(ID_PATHS)}; got {id_type!r}")
        if self.api == "ccompat":
            return f"{self.base_url}{API_PATHS['ccompat']}/schemas/ids/{schema_id}"
        return f"{self.base_url}{API_PATHS[self.api]}/ids/{ID_PATHS[id_type]}/{schema_id}"

    def latest_url(self, artifact_id: str, group: str = DEFAULT_GROUP) -> str:
        """Return the URL that serves the latest version of an artifact (a subject, on ccompat)."""
        name = quote(artifact_id, safe="")
        if self.api == "ccompat":
            return f"{self.base_url}{API_PATHS['ccompat']}/subjects/{name}/versions/latest"
        artifact = f"{self.base_url}{API_PATHS[self.api]}/groups/{quote(group, safe='')}/artifacts/{name}"
        return f"{artifact}/versions/branch=latest/content" if self.api == "v3" else artifact

    def latest_schema(self, artifact_id: str, group: str = DEFAULT_GROUP) -> str | None:
        """Return the schema text of an artifact's latest version, such as `<topic>-value`; None when the
        registry has no such artifact. Not cached: a later version may be registered at any time.

        Raises:
            RegistryError: as get_schema, naming the artifact.
        """
        url = self.latest_url(artifact_id, group)
        text = self._fetch(artifact_id, url, missing_ok=True)
        if text is None:
            return None
        return self._schema_text(artifact_id, url, text)

    def check(self) -> str:
        """Ask the registry's API for something every registry has (v3/v2: `/system/info`; ccompat: the schema
        types), before the job reads data. Returns the URL asked.

        Raises:
            ConfigError: `registry.url` answers, but not as the API `registry.api` names (404, another 4xx, not
                JSON), or `registry.auth`'s credentials are missing or refused (401/403).
            RegistryError: the registry is out of reach (connection errors, timeouts, 429, 5xx through the
                retries): `unreachable`, an outage to wait out.
        """
        path = "/schemas/types" if self.api == "ccompat" else "/system/info"
        url = f"{self.base_url}{API_PATHS[self.api]}{path}"
        try:
            text = self._fetch("<system>", url, missing_ok=True)
        except RegistryError as e:
            if e.unreachable:
                raise
            key = "registry.auth" if e.http_status in (HTTP_UNAUTHORIZED, HTTP_FORBIDDEN) else "registry.url"
            raise ConfigError(key, f"the registry at {self.base_url} refused the start-up check: {e}") from e
        if text is None:
            raise ConfigError("registry.url", f"{url} answered 404: no Apicurio Registry {self.api} API at "
                                              f"{self.base_url} (the registry's base URL? registry.api right?)")
        try:
            json.loads(text)
        except ValueError as e:
            raise ConfigError("registry.url", f"{url} answered, but not with JSON: not an Apicurio Registry {self.api} "
                                              f"API ({text[:100]!r})") from e
        return url

    def get_schema(self, schema_id: int, id_type: str = ID_TYPE_CONTENT) -> str:
        """Return the Avro schema text of an id, from the cache or else from the registry.

        Args:
            schema_id: a content id or global id, as `id_type` says.
            id_type: "contentId" or "globalId", as the record's framing says.

        Returns:
            The schema exactly as registered (JSON text).

        Raises:
            RegistryError: the id is unknown (HTTP 404), the registry refused the credentials (401/403) or
                answered another error, it could not be reached within the retries, or its answer is not JSON.
                The message names the id and the URL.
            RegistryAuthError: the OIDC token endpoint refused or failed.
        """
        key = (id_type, schema_id)
        with self._lock:
            cached = self._cache.get(key)
        if cached is not None:
            return cached
        url = self.schema_url(schema_id, id_type)
        text = required(self._fetch(schema_id, url), f"the schema text of {url} (a 404 raises)")
        text = self._schema_text(schema_id, url, text)
        with self._lock:
            return self._cache.setdefault(key, text)

    def _schema_text(self, schema_id: int | str, url: str, text: str) -> str:
        try:
            if self.api == "ccompat":
                text = _ccompat_schema(json.loads(text))
            json.loads(text)
        except (ValueError, KeyError, TypeError) as e:
            raise RegistryError(schema_id, url, f"content is not JSON, so not an Avro schema: {e}") from e
        return text

    def close(self) -> None:
        """Close the HTTP session if the client created it; a session passed in is left to its owner."""
        if self._owns_session:
            self._session.close()

    def __enter__(self) -> RegistryClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _fetch(self, schema_id: int | str, url: str, *, missing_ok: bool = False) -> str | None:
        attempts = self._retries + 1
        reason = ""
        status: int | None = None
        cause: BaseException | None = None
        renewed = False
        attempt = 0
        while attempt < attempts:
            if attempt:
                delay = min(self._backoff_s * 2 ** (attempt - 1), MAX_BACKOFF_S)
                log.warning(
                    "schema %s at %s: attempt %s of %s failed (%s); retrying in %.2f s",
                    schema_id, url, attempt, attempts, reason, delay,
                )
                time.sleep(delay)
            status, cause = None, None
            attempt += 1
            try:
                response = self._session.get(url, timeout=self._timeout_s, auth=self.auth)
            except (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError) as e:
                # ConnectTimeout is both a ConnectionError and a Timeout; a cut-off body is a dropped connection.
                reason, cause = f"{type(e).__name__}: {e}", e
                continue
            except requests.RequestException as e:
                raise RegistryError(schema_id, url, f"request failed: {type(e).__name__}: {e}") from e
            status = response.status_code
            if status == HTTP_UNAUTHORIZED and isinstance(self.auth, ClientCredentials) and not renewed:
                # A token revoked or expired early: renew it once, without spending a retry.
                self.auth.invalidate()
                renewed, attempt = True, attempt - 1
                continue
            done, text = self._answer(schema_id, url, response, missing_ok)
            if done:
                return text
            reason = f"HTTP {status}: {_snippet(response)}"
        raise RegistryError(schema_id, url, f"gave up after {attempts} attempts; last: {reason}", status,
                            unreachable=True) from cause

    def _answer(
        self, schema_id: int | str, url: str, response: requests.Response, missing_ok: bool
    ) -> tuple[bool, str | None]:
        """What a response means: (True, the schema) or (True, None) for a missing one when `missing_ok`;
        (False, None) when it is worth another attempt (429, 5xx).

        Raises:
            RegistryError: the schema id is unknown, the credentials are missing or refused, or any other answer.
        """
        status = response.status_code
        if status == HTTP_OK:
            return True, _decode(schema_id, url, response)
        if status == HTTP_NOT_FOUND:
            if missing_ok:
                return True, None
            raise RegistryError(schema_id, url, "unknown schema id", status)
        if status in (HTTP_UNAUTHORIZED, HTTP_FORBIDDEN):
            how = "no credentials configured (registry.auth)" if self.auth is None else "credentials refused"
            raise RegistryError(schema_id, url, f"{how}: {_snippet(response)}", status)
        if status != HTTP_TOO_MANY_REQUESTS and status < HTTP_SERVER_ERROR:
            raise RegistryError(schema_id, url, f"unexpected response: {_snippet(response)}", status)
        return False, None


def _ccompat_schema(body: object) -> str:
    # ccompat answers {"schema": "<text>"} (plus "schemaType" for non-Avro types and "references").
    if not isinstance(body, dict):
        raise TypeError(f"expected a JSON object with a schema field, got {type(body).__name__}")
    schema_type = body.get("schemaType", "AVRO")
    if schema_type != "AVRO":
        raise ValueError(f"schemaType is {schema_type}, not AVRO")
    return str(body["schema"])


def _decode(schema_id: int | str, url: str, response: requests.Response) -> str:
    # Apicurio serves /ids/contentIds/<id> as application/octet-stream with no charset, so requests would guess
    # the encoding; JSON (and so an Avro schema) is UTF-8.
    try:
        return response.content.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RegistryError(schema_id, url, f"content is not UTF-8 text: {e}") from e


def _snippet(response: requests.Response, limit: int = 200) -> str:
    text = response.text.strip().replace("\n", " ")
    if not text:
        return "<empty body>"
    return text if len(text) <= limit else text[:limit] + "..."
