"""Schema-registry client for Apicurio Registry 3: the writer schema of a Kafka record, by id.

Debezium's Apicurio converter frames each record with the id of its writer schema; the decode step asks this
client for the Avro schema text behind that id. The client runs on the driver only.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from types import TracebackType

import requests

from app.config import RegistryConfig
from app.errors import ConfigError, RegistryError

log = logging.getLogger(__name__)

API_PATH = "/apis/registry/v3"
ID_TYPE_CONTENT = "contentId"
ID_TYPE_GLOBAL = "globalId"
# Apicurio serves the raw content of an id under /ids/<kind>s/<id>; the framing's id type picks the kind.
ID_PATHS = {ID_TYPE_CONTENT: "contentIds", ID_TYPE_GLOBAL: "globalIds"}
MAX_BACKOFF_S = 10.0
HTTP_OK = 200
HTTP_NOT_FOUND = 404
HTTP_TOO_MANY_REQUESTS = 429
HTTP_SERVER_ERROR = 500


class RegistryClient:
    """Fetches Avro schema text from Apicurio Registry by content id or global id.

    Cache: every schema fetched is kept in a per-process dict keyed by (id_type, id) and never expires, because
    an id names immutable content in the registry. Failures are not cached. A lock guards the dict; two threads
    missing the same id at once may both fetch it, which is harmless since both get the same text.

    Retries: connection errors, timeouts, HTTP 429 and 5xx are retried up to `retries` times, sleeping
    `backoff_s * 2**n` seconds before retry n (counting from 0), at most MAX_BACKOFF_S. Other 4xx fail at once.
    """

    def __init__(
        self,
        url: str,
        id_type: str = ID_TYPE_CONTENT,
        timeout_s: float = 10.0,
        retries: int = 4,
        backoff_s: float = 0.5,
        *,
        session: requests.Session | None = None,
    ) -> None:
        """Build a client; nothing is requested until the first get_schema.

        Args:
            url: server base such as http://127.0.0.1:8080; a trailing slash or /apis/registry/v3 is stripped.
            id_type: "contentId" or "globalId", whichever id the producer's framing carries.
            timeout_s: connect and read timeout of every request, in seconds.
            retries: retries after the first attempt; 0 means a single attempt.
            backoff_s: sleep before the first retry, doubled for each further retry.
            session: keyword-only; a requests session to reuse. When omitted the client creates and owns one.

        Raises:
            ConfigError: an argument is out of range; the key names the matching `registry.*` config key.
        """
        base = url.strip().rstrip("/")
        base = base.removesuffix(API_PATH).rstrip("/")
        if not base.startswith(("http://", "https://")):
            raise ConfigError("registry.url", f"expected an http(s) URL, got {url!r}")
        if id_type not in ID_PATHS:
            raise ConfigError("registry.id_type", f"must be one of {', '.join(ID_PATHS)}; got {id_type!r}")
        if timeout_s <= 0:
            raise ConfigError("registry.timeout_s", "must be > 0")
        if retries < 0:
            raise ConfigError("registry.retries", "must be >= 0")
        if backoff_s < 0:
            raise ConfigError("registry.backoff_s", "must be >= 0")
        self.base_url = base
        self.id_type = id_type
        self._timeout_s = timeout_s
        self._retries = retries
        self._backoff_s = backoff_s
        self._owns_session = session is None
        self._session = session if session is not None else requests.Session()
        self._cache: dict[tuple[str, int], str] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, cfg: RegistryConfig) -> RegistryClient:
        """Build a client from the `registry` section of the job config.

        Args:
            cfg: the validated registry config.

        Returns:
            A client with its own HTTP session.

        Raises:
            ConfigError: a value is out of range (see __init__).
        """
        return cls(
            url=cfg.url,
            id_type=cfg.id_type,
            timeout_s=cfg.timeout_s,
            retries=cfg.retries,
            backoff_s=cfg.backoff_s,
        )

    def schema_url(self, schema_id: int) -> str:
        """Return the URL that serves the raw schema text of an id.

        Args:
            schema_id: a content id or global id, as set by id_type.

        Returns:
            The absolute URL, e.g. http://127.0.0.1:8080/apis/registry/v3/ids/contentIds/7.
        """
        return f"{self.base_url}{API_PATH}/ids/{ID_PATHS[self.id_type]}/{schema_id}"

    def get_schema(self, schema_id: int) -> str:
        """Return the Avro schema text of an id, from the cache or else from the registry.

        Args:
            schema_id: a content id or global id, as set by id_type.

        Returns:
            The schema exactly as registered (JSON text).

        Raises:
            RegistryError: the id is unknown (HTTP 404), the registry answered another error, it could not be
                reached within the retries, or its answer is not JSON. The message names the id and the URL.
        """
        key = (self.id_type, schema_id)
        with self._lock:
            cached = self._cache.get(key)
        if cached is not None:
            return cached
        url = self.schema_url(schema_id)
        text = self._fetch(schema_id, url)
        try:
            json.loads(text)
        except ValueError as e:
            raise RegistryError(schema_id, url, f"content is not JSON, so not an Avro schema: {e}") from e
        with self._lock:
            return self._cache.setdefault(key, text)

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

    def _fetch(self, schema_id: int, url: str) -> str:
        attempts = self._retries + 1
        reason = ""
        status: int | None = None
        cause: BaseException | None = None
        for attempt in range(attempts):
            if attempt:
                delay = min(self._backoff_s * 2 ** (attempt - 1), MAX_BACKOFF_S)
                log.warning(
                    "schema id %s at %s: attempt %s of %s failed (%s); retrying in %.2f s",
                    schema_id,
                    url,
                    attempt,
                    attempts,
                    reason,
                    delay,
                )
                time.sleep(delay)
            status, cause = None, None
            try:
                response = self._session.get(url, timeout=self._timeout_s)
            except (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError) as e:
                # ConnectTimeout is both a ConnectionError and a Timeout; a cut-off body is a dropped connection.
                reason, cause = f"{type(e).__name__}: {e}", e
                continue
            except requests.RequestException as e:
                raise RegistryError(schema_id, url, f"request failed: {type(e).__name__}: {e}") from e
            status = response.status_code
            if status == HTTP_OK:
                return _decode(schema_id, url, response)
            if status == HTTP_NOT_FOUND:
                raise RegistryError(schema_id, url, "unknown schema id", status)
            if status != HTTP_TOO_MANY_REQUESTS and status < HTTP_SERVER_ERROR:
                raise RegistryError(schema_id, url, f"unexpected response: {_snippet(response)}", status)
            reason = f"HTTP {status}: {_snippet(response)}"
        raise RegistryError(schema_id, url, f"gave up after {attempts} attempts; last: {reason}", status) from cause


def _decode(schema_id: int, url: str, response: requests.Response) -> str:
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
