"""Ports for the test servers that bind theirs a while after they are picked.

Binding port 0 gives a port from the kernel's ephemeral range, the range it also hands out as
the local end of outgoing connections. A server that binds its port a second or more after it
was picked (a JVM starting, ``weed server`` bringing up eight listeners one after another) can
find it taken meanwhile by one of the thousands of connections a test run makes: SeaweedFS's
filer died in CI with "address already in use" that way. Ports below the ephemeral range are
never handed out to outgoing connections, so only another listener can take one; each port is
checked free by binding it, and all of a call's ports are held open together so none repeats.
Parallel runs pick at random, and a server that still loses the race is started again on new
ports (``start_retrying``; its start says so by raising ``PortTaken``).
"""

from __future__ import annotations

import random
import socket
from contextlib import ExitStack

#: the lowest port picked: above the well-known and most registered service ports
LOWEST = 10_000

#: how many times a server whose picked port was taken meanwhile is started, each on new ports
START_ATTEMPTS = 3


class PortTaken(RuntimeError):
    """A server could not bind a port picked for it: something took it meanwhile."""


def says_port_taken(text: str) -> bool:
    """Whether a server's error or log says a port it was to bind was taken."""
    return "address already in use" in text.lower()


def start_retrying(start_once, repick=None):
    """``start_once()``, again after ``repick()`` (new ports; None when ``start_once`` picks its
    own) each time it raises ``PortTaken``, up to ``START_ATTEMPTS`` starts in all."""
    for attempt in range(1, START_ATTEMPTS + 1):
        try:
            return start_once()
        except PortTaken:
            if attempt == START_ATTEMPTS:
                raise
            if repick is not None:
                repick()
    raise AssertionError("unreachable")


def ephemeral_low() -> int:
    """The lowest port the kernel hands out to outgoing connections (Linux's default 32768)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def listen_ports(n: int) -> list[int]:
    """``n`` distinct ports on 127.0.0.1 that nothing listens on, below the ephemeral range."""
    high = ephemeral_low() - 1
    if high - LOWEST < 100 * n:  # an unusual port range: the kernel's pick, as before
        return _kernel_ports(n)
    rng = random.Random()
    with ExitStack() as stack:
        ports: list[int] = []
        while len(ports) < n:
            port = rng.randint(LOWEST, high)
            if port in ports:
                continue
            s = stack.enter_context(socket.socket())
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            ports.append(port)
        return ports


def _kernel_ports(n: int) -> list[int]:
    with ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
