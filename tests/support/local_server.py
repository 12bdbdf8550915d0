"""A test HTTP server on 127.0.0.1, served from a daemon thread: the start/stop/context-manager part shared by
the counting proxy and the OIDC provider."""
from __future__ import annotations

import threading
from http.server import ThreadingHTTPServer
from types import TracebackType
from typing import Self

POLL_INTERVAL_S = 0.02


class LocalServer:
    """Subclasses build their server in `_make_server`; `start` serves it on a daemon thread named `thread_name`."""

    thread_name = "local-server"

    def __init__(self) -> None:
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def _make_server(self) -> ThreadingHTTPServer:
        raise NotImplementedError

    def start(self) -> Self:
        """Listen on 127.0.0.1 and serve on a daemon thread."""
        self._server = self._make_server()
        # shutdown() waits for the serve loop's next poll; the default 0.5 s poll would slow every test's teardown.
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": POLL_INTERVAL_S},
            name=self.thread_name,
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and release the port."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None
        self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
