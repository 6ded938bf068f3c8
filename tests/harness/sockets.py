"""Raw sockets a test (or a bench) opened to a broker, and which of them the broker closed.

``closed_by_peer(socks, since, limit)`` watches the sockets with one selector until every one
has been closed by the other end (a read answers nothing, or the connection was reset) or
``limit`` seconds have passed since ``since`` (a ``time.monotonic()``); what arrives meanwhile
is read and dropped. It answers when each closed socket was closed (seconds after ``since``)
and the ones still open; it closes none itself.

``CuttableProxy(target)`` forwards TCP connections from a port of its own to ``target``;
``cut()`` breaks every connection through it and refuses new ones until ``restore()`` -- a
network partition between one client (a broker, a store) and its server, the server still up
for everyone else.
"""

from __future__ import annotations

import select
import selectors
import socket
import threading
import time


def closed_by_peer(socks: list[socket.socket], since: float, limit: float) -> tuple[list[float], set]:
    selector = selectors.DefaultSelector()
    for s in socks:
        s.setblocking(False)
        selector.register(s, selectors.EVENT_READ)
    still_open = set(socks)
    closed_after: list[float] = []
    while still_open and time.monotonic() - since < limit:
        for key, _ in selector.select(timeout=0.2):
            sock = key.fileobj
            try:
                data = sock.recv(65536)  # type: ignore[union-attr]
            except (ConnectionResetError, BlockingIOError):
                data = b""
            if not data:
                selector.unregister(sock)
                still_open.discard(sock)
                closed_after.append(time.monotonic() - since)
    selector.close()
    return closed_after, still_open


class CuttableProxy:
    """A TCP proxy to ``target`` (host, port) on a port of its own; ``cut()`` closes every
    connection through it and refuses new ones (closed at once) until ``restore()``."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.cut_off = False
        self.pairs: list[tuple[socket.socket, socket.socket]] = []
        self.lock = threading.Lock()
        self.stopping = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stopping:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.cut_off:
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self.lock:
                self.pairs.append((client, upstream))
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        peers = {a: b, b: a}
        try:
            while not self.cut_off:
                ready, _, _ = select.select([a, b], [], [], 0.2)
                for sock in ready:
                    data = sock.recv(65536)
                    if not data:
                        return
                    peers[sock].sendall(data)
        except OSError:
            pass
        finally:
            for sock in (a, b):
                sock.close()

    def cut(self) -> None:
        self.cut_off = True
        with self.lock:
            pairs, self.pairs = self.pairs, []
        for pair in pairs:
            for sock in pair:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def restore(self) -> None:
        self.cut_off = False

    def close(self) -> None:
        self.stopping = True
        self.cut()
        self.listener.close()
