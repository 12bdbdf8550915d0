"""A counting HTTP proxy on 127.0.0.1 for tests against the real stack.

It forwards GET requests to one upstream (such as Apicurio at http://127.0.0.1:8080), counts them and records
their paths, and can answer a chosen HTTP status instead of forwarding, for the next N requests or for all of
them. Tests use it to prove caching (request counts) and retries (injected 503s) without mocking the upstream.
"""
from __future__ import annotations

import json
import logging
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import cast

from tests.support.local_server import LocalServer

log = logging.getLogger(__name__)

FORWARD_TIMEOUT_S = 10.0


class CountingProxy(LocalServer):
    """Forward GETs to `upstream`, count them, and inject failures on demand.

    Use it as a context manager, or call start() and stop(). Counters and failure settings are guarded by a lock
    because ThreadingHTTPServer serves each request on its own thread.
    """

    thread_name = "counting-proxy"

    def __init__(self, upstream: str) -> None:
        """Create a proxy; it listens only once started.

        Args:
            upstream: base URL the request path is appended to, e.g. http://127.0.0.1:8080.
        """
        super().__init__()
        self.upstream = upstream.rstrip("/")
        self._lock = threading.Lock()
        self._paths: list[str] = []
        self._fail_remaining = 0
        self._fail_status = 503

    @property
    def url(self) -> str:
        """Base URL of the running proxy, e.g. http://127.0.0.1:40123."""
        if self._server is None:
            raise RuntimeError("proxy is not running")
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def request_count(self) -> int:
        """Requests received since start or the last reset(), injected failures included."""
        with self._lock:
            return len(self._paths)

    @property
    def paths(self) -> list[str]:
        """Paths of the requests received, in arrival order."""
        with self._lock:
            return list(self._paths)

    def fail_next(self, count: int, status: int = 503) -> None:
        """Answer `status` to the next `count` requests, then forward again."""
        with self._lock:
            self._fail_remaining = count
            self._fail_status = status

    def fail_always(self, status: int = 503) -> None:
        """Answer `status` to every request until reset()."""
        self.fail_next(-1, status)

    def reset(self) -> None:
        """Clear the counters and stop injecting failures."""
        with self._lock:
            self._paths.clear()
            self._fail_remaining = 0

    def _make_server(self) -> ThreadingHTTPServer:
        return _ProxyServer(("127.0.0.1", 0), _ProxyHandler, self)

    def _record(self, path: str) -> int | None:
        """Count a request; return the status to inject, or None to forward it."""
        with self._lock:
            self._paths.append(path)
            if self._fail_remaining == 0:
                return None
            if self._fail_remaining > 0:
                self._fail_remaining -= 1
            return self._fail_status


class _ProxyServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], proxy: CountingProxy) -> None:
        self.proxy = proxy
        super().__init__(address, handler)


class _ProxyHandler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        proxy = cast(_ProxyServer, self.server).proxy
        injected = proxy._record(self.path)
        if injected is not None:
            body = json.dumps({"status": injected, "title": "injected by CountingProxy"}).encode()
            self._reply(injected, "application/json", body)
            return
        try:
            with urllib.request.urlopen(proxy.upstream + self.path, timeout=FORWARD_TIMEOUT_S) as upstream:
                self._reply(upstream.status, upstream.headers.get("Content-Type"), upstream.read())
        except urllib.error.HTTPError as e:
            # urllib raises on 4xx/5xx; the error is the upstream response, pass it on unchanged.
            self._reply(e.code, e.headers.get("Content-Type"), e.read())
        except (urllib.error.URLError, TimeoutError) as e:
            self._reply(502, "text/plain", f"upstream unreachable: {e}".encode())

    def _reply(self, status: int, content_type: str | None, body: bytes) -> None:
        self.send_response(status)
        if content_type:
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        log.debug("proxy: " + format, *args)
