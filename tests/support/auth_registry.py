"""A second Apicurio Registry 3.0.9 with authentication on, against a local OIDC provider (tests/support/oidc.py).

The stack's registry (port 8080) is open; this one is started per test module on a free port of 127.0.0.1, with
in-memory storage (H2, the jar's default: ids start at 1 and die with the process), and serves:
- bearer tokens from the provider: Quarkus OIDC reads the provider's discovery document and JWKS at startup and
  verifies each token's RS256 signature, issuer (string-equal to discovery's `issuer`), expiry and audience;
- HTTP Basic: Apicurio exchanges the username and password as client id and secret for a token at
  `quarkus.oidc.token-path` (client_secret_post, posted to that URL plus "/") and verifies that token as above;
- ccompat in legacy-id mode: `/apis/ccompat/v7/schemas/ids/{id}` takes a globalId, so the same instance serves
  the legacy-id ccompat test.

Authorization is off (`apicurio.auth.role-based-authorization=false`, owner-only off): any valid token may read
and write. With RBAC on, Apicurio takes roles from the token (`apicurio.auth.role-source=token`): sr-readonly,
sr-developer, sr-admin, which Quarkus reads from the `groups` or `realm_access.roles` claim (OidcProvider roles).

Open without a token (`@Authorized(level=None)` or not an API): `/apis/registry/v3/system/info`,
`/apis/registry/v2/system/info`, `/apis/registry/v3/system/uiConfig`, `/apis/registry/v{2,3}/users/me`,
`/apis/registry/v{2,3}/downloads/...` and `/health/*`. Everything else answers 401 to an anonymous request.

Apicurio caches, per (username + password), the token of a Basic exchange until 10 s before its `exp`
(`apicurio.authn.basic-client-credentials.cache-expiration-offset`): with a provider TTL of 10 s or less every
Basic request is exchanged anew. A refused exchange (HTTP 401 from the token endpoint) is cached for
`apicurio.authn.basic-client-credentials.cache-expiration` minutes (5 here); other token endpoint errors are
retried four times, one second apart, per request.
"""
from __future__ import annotations

import logging
import os
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import requests

from tests.support.oidc import OidcProvider

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent.parent.parent
REGISTRY_DIR = ROOT / ".deps" / "registry"
CLIENT_ID = "registry-api"
READY_PATH = "/apis/registry/v3/system/info"
# A protected read: proves at startup that tokens are verified and anonymous requests refused.
PROTECTED_PATH = "/apis/registry/v3/search/artifacts?limit=1"
POLL_INTERVAL_S = 0.2
STOP_TIMEOUT_S = 20.0
LOG_TAIL_CHARS = 4000


def registry_jar() -> Path:
    """The Apicurio runner jar under .deps/registry (its lib/ folder must sit beside it)."""
    jars = sorted(REGISTRY_DIR.glob("apicurio-registry-app-*-runner.jar"))
    if not jars:
        raise FileNotFoundError(f"no apicurio-registry-app-*-runner.jar in {REGISTRY_DIR}")
    return jars[-1]


def free_port() -> int:
    """A TCP port of 127.0.0.1 that is free now (another process may take it before it is used)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def auth_properties(idp: OidcProvider, port: int) -> dict[str, str]:
    """The system properties of an auth-enabled registry on `port` trusting `idp` (names as in Apicurio 3.0.9).

    Args:
        idp: a started provider; its issuer, token URL and audience are written into the properties.
        port: the HTTP port of the registry, on 127.0.0.1.
    """
    return {
        "quarkus.http.host": "127.0.0.1",
        "quarkus.http.port": str(port),
        # Authentication (AppAuthenticationMechanism, AuthConfig).
        "quarkus.oidc.tenant-enabled": "true",
        "quarkus.oidc.auth-server-url": idp.issuer,
        "quarkus.oidc.client-id": CLIENT_ID,
        "quarkus.oidc.token.audience": idp.audience,
        # Basic client credentials: the exchange posts to this URL (not to discovery's token_endpoint).
        "apicurio.authn.basic-client-credentials.enabled": "true",
        "quarkus.oidc.token-path": idp.token_url,
        "apicurio.authn.basic-client-credentials.cache-expiration": "5",
        # Authorization relaxed: any authenticated client reads and writes.
        "apicurio.auth.role-based-authorization": "false",
        "apicurio.auth.owner-only-authorization": "false",
        # ccompat ids are globalIds (CCompatConfig).
        "apicurio.ccompat.legacy-id-mode.enabled": "true",
    }


@contextmanager
def auth_registry(
    idp: OidcProvider,
    port: int,
    log_path: Path,
    *,
    properties: Mapping[str, str] | None = None,
    heap: str = "384m",
    startup_timeout_s: float = 120.0,
) -> Iterator[str]:
    """Run an auth-enabled Apicurio on 127.0.0.1:`port` until the block ends; yield its base URL.

    Ready means: the public system info answers 200, an anonymous protected read answers 401 and the same read
    with a token signed by `idp` is authenticated, answering 200 (or 403 when RBAC is on and the token's roles
    do not allow reads). That token is minted directly, so `idp.token_requests` stays unchanged. At exit the
    process gets SIGTERM, then SIGKILL after STOP_TIMEOUT_S, and is waited for.

    Args:
        idp: the started OIDC provider the registry trusts; it must stay up while the registry runs.
        port: a free port of 127.0.0.1 (see free_port).
        log_path: file for the registry's stdout and stderr, truncated first.
        properties: keyword-only; system properties added to or overriding auth_properties().
        heap: keyword-only; the JVM's -Xmx.
        startup_timeout_s: keyword-only; how long to wait for readiness.

    Raises:
        RuntimeError: the port is taken, or the registry exited or was not ready in time (with its log's tail).
    """
    if not _port_free(port):
        raise RuntimeError(f"port {port} of 127.0.0.1 is already in use")
    props = {**auth_properties(idp, port), **(properties or {})}
    java = Path(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") else Path("java")
    cmd = [str(java), "-Xms64m", f"-Xmx{heap}", *(f"-D{k}={v}" for k, v in props.items()), "-jar", str(registry_jar())]
    base = f"http://127.0.0.1:{port}"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with log_path.open("wb") as out:
        process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        _wait_ready(process, base, idp, log_path, started + startup_timeout_s)
        log.info("auth registry %s (pid %d) ready in %.1f s", base, process.pid, time.monotonic() - started)
        yield base
    finally:
        process.terminate()
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_ready(
    process: subprocess.Popen[bytes], base: str, idp: OidcProvider, log_path: Path, deadline: float
) -> None:
    with requests.Session() as session:
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"registry exited with {process.returncode}:\n{_tail(log_path)}")
            try:
                if session.get(base + READY_PATH, timeout=2).status_code == requests.codes.ok:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"registry at {base} not ready in time:\n{_tail(log_path)}")
            time.sleep(POLL_INTERVAL_S)
        anonymous = session.get(base + PROTECTED_PATH, timeout=10).status_code
        bearer = {"Authorization": f"Bearer {idp.issue_token('readiness-probe')}"}
        authenticated = session.get(base + PROTECTED_PATH, headers=bearer, timeout=10).status_code
    if anonymous != requests.codes.unauthorized or authenticated not in (requests.codes.ok, requests.codes.forbidden):
        raise RuntimeError(
            f"registry at {base} is up but auth is not as configured: anonymous read HTTP {anonymous}, "
            f"with a token HTTP {authenticated} (expected 401, and 200 or 403):\n{_tail(log_path)}"
        )


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _tail(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-LOG_TAIL_CHARS:]
    except OSError as e:
        return f"(no log: {e})"
