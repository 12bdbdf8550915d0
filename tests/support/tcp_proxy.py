"""A TCP proxy on 127.0.0.1 that can cut a service off: the outage tests put one in front of each service the job
reaches (broker, registry, object store, metastore), so one job sees an outage while the shared stack, and every
other test on it, runs on.

`down()` closes the listening socket and every connection through it: clients see their connections reset and new
ones refused, as when the service's host goes away. `up()` listens again on the same port.
"""
from __future__ import annotations

import logging
import socket
import threading
from types import TracebackType
from typing import Self

log = logging.getLogger(__name__)

CHUNK = 65536


class FaultProxy:
    """Forwards 127.0.0.1:`port` (0: a free one) to 127.0.0.1:`upstream_port`, until `down()`."""

    def __init__(self, upstream_port: int, port: int = 0) -> None:
        self.upstream_port = upstream_port
        self.port = port
        self._listener: socket.socket | None = None
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.connections = 0  # accepted since start

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def up(self) -> Self:
        """Listen (again) and forward every connection."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), name=f"fault-proxy-{self.port}", daemon=True).start()
        log.info("proxy %s -> %s up", self.port, self.upstream_port)
        return self

    def down(self) -> None:
        """Refuse new connections and reset those open."""
        with self._lock:
            listener, self._listener = self._listener, None
            open_sockets, self._sockets = list(self._sockets), set()
        if listener is not None:
            _close(listener)
        for s in open_sockets:
            _close(s)
        log.info("proxy %s -> %s down (%d connections cut)", self.port, self.upstream_port, len(open_sockets))

    @property
    def is_up(self) -> bool:
        return self._listener is not None

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed by down()
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=10)
                upstream.settimeout(None)
            except OSError:
                _close(client)
                continue
            with self._lock:
                if self._listener is not listener:  # went down meanwhile
                    _close(client)
                    _close(upstream)
                    return
                self._sockets |= {client, upstream}
                self.connections += 1
            for source, target in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, target), daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket) -> None:
        try:
            while data := source.recv(CHUNK):
                target.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._sockets -= {source, target}
            _close(source)
            _close(target)

    def __enter__(self) -> Self:
        return self.up()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.down()


def _close(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    s.close()
