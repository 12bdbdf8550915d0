"""Registry authentication as `requests` auth objects: HTTP Basic, and OIDC client-credentials bearer tokens.

Secrets come from the environment (app/config.RegistryAuthConfig names the variable). Neither a secret nor a
token is ever logged, put in an exception message, or shown by repr().
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import requests
from requests.auth import AuthBase, HTTPBasicAuth

from app.config import RegistryAuthConfig
from app.errors import RegistryAuthError, required

log = logging.getLogger(__name__)

DEFAULT_TOKEN_TTL_S = 60.0  # when the token response has no expires_in


class ClientCredentials(AuthBase):
    """OAuth2 client-credentials grant: fetches a bearer token, caches it, renews it before it expires.

    Renewal: a token is reused until `refresh_margin_s` before its `expires_in` runs out, measured from when it
    was requested; the first request after that fetches a new one. `invalidate` (after an HTTP 401) forces the
    next request to fetch a new token. The client authenticates at the token endpoint with HTTP Basic
    (client_secret_basic, RFC 6749 §2.3.1). Thread-safe: one lock guards the token.
    """

    def __init__(
        self,
        token_url: str,
        client_id: str,
        client_secret: str,
        *,
        scope: str | None = None,
        refresh_margin_s: float = 30.0,
        timeout_s: float = 10.0,
        session: requests.Session | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.token_url = token_url
        self.client_id = client_id
        self._secret = client_secret
        self._scope = scope
        self._margin_s = refresh_margin_s
        self._timeout_s = timeout_s
        self._session = session or requests.Session()
        self._clock = clock
        self._lock = threading.Lock()
        self._token: str | None = None
        self._renew_at = 0.0
        self.tokens_fetched = 0

    def __repr__(self) -> str:
        return f"ClientCredentials(token_url={self.token_url!r}, client_id={self.client_id!r})"

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        request.headers["Authorization"] = f"Bearer {self.token()}"
        return request

    def token(self) -> str:
        """The current access token, fetched first when there is none or it is due for renewal.

        Raises:
            RegistryAuthError: the token endpoint refused the credentials, failed, or answered without a token.
        """
        with self._lock:
            if self._token is None or self._clock() >= self._renew_at:
                self._fetch()
            return required(self._token, "the fetched OIDC token")

    def invalidate(self) -> None:
        with self._lock:
            self._token = None

    def _fetch(self) -> None:
        data = {"grant_type": "client_credentials"}
        if self._scope:
            data["scope"] = self._scope
        requested_at = self._clock()
        try:
            response = self._session.post(
                self.token_url, data=data, auth=(self.client_id, self._secret), timeout=self._timeout_s
            )
        except requests.RequestException as e:
            raise RegistryAuthError(self.token_url, f"token request failed: {type(e).__name__}: {e}") from e
        if response.status_code != requests.codes.ok:
            raise RegistryAuthError(
                self.token_url,
                f"token endpoint refused client {self.client_id!r}: HTTP {response.status_code} "
                f"{_oauth_error(response)}",
            )
        try:
            body = response.json()
            token = str(body["access_token"])
            ttl = float(body.get("expires_in") or DEFAULT_TOKEN_TTL_S)
        except (ValueError, KeyError, TypeError) as e:
            raise RegistryAuthError(self.token_url, f"token response without access_token/expires_in: {e}") from e
        self._token = token
        self._renew_at = requested_at + max(ttl - self._margin_s, 0.0)
        self.tokens_fetched += 1
        log.info("registry auth: new token for client %s from %s, valid %.0f s", self.client_id, self.token_url, ttl)


def _oauth_error(response: requests.Response) -> str:
    # RFC 6749 §5.2 error codes only: a response body could echo request fields.
    try:
        body = response.json()
    except ValueError:
        return ""
    return str(body.get("error", "")) if isinstance(body, dict) else ""


def auth_from_config(cfg: RegistryAuthConfig, timeout_s: float = 10.0) -> AuthBase | None:
    """The auth object for a `registry.auth` section, or None for type none."""
    if cfg.type == "basic":
        return HTTPBasicAuth(required(cfg.username, "registry.auth.username"), cfg.secret())
    if cfg.type == "oidc":
        return ClientCredentials(
            required(cfg.token_url, "registry.auth.token_url"), required(cfg.client_id, "registry.auth.client_id"),
            cfg.secret(),
            scope=cfg.scope, refresh_margin_s=cfg.refresh_margin_s, timeout_s=timeout_s,
        )
    return None
