"""Raw sockets a test (or a bench) opened to a broker, and which of them the broker closed.

``closed_by_peer(socks, since, limit)`` watches the sockets with one selector until every one
has been closed by the other end (a read answers nothing, or the connection was reset) or
``limit`` seconds have passed since ``since`` (a ``time.monotonic()``); what arrives meanwhile
is read and dropped. It answers when each closed socket was closed (seconds after ``since``)
and the ones still open; it closes none itself.
"""

from __future__ import annotations

import selectors
import socket
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
