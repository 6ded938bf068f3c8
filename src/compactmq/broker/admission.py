"""What a binary-protocol peer may cost the broker before it has authenticated.

Anyone who can reach the port can open connections; until CONNECT succeeds nothing says who
they are. Three rules bound what such a peer can hold:

* **Connection counts** (Pulsar's ``brokerMaxConnections`` and ``brokerMaxConnectionsPerIp``,
  0 = unlimited, the default). A connection over either limit is answered at accept, before a
  byte is read, with ERROR NotAllowedError (request id -1) and closed, as Pulsar's broker does;
  it is never counted. Connections
  are counted from accept (after the TLS handshake on the TLS port) to close.
* **Small frames before CONNECT.** Until the handshake is complete the decoder accepts frames
  of at most ``PREAUTH_MAX_FRAME_SIZE`` bytes, so a stranger cannot make the broker buffer a
  ``maxMessageSize`` frame (5 MiB by default) per connection. The largest legitimate frames
  before CONNECT succeeds are CONNECT and AUTH_RESPONSE carrying credentials (a JWT, a basic
  user:password, SASL data): a few KiB even for tokens with many claims; 64 KiB leaves an
  order of magnitude of headroom. Once connected, the normal ``maxMessageSize`` limit applies.
* **A shared budget for partial frames before CONNECT** (``PREAUTH_BUFFER_BUDGET``): bytes
  of unfinished frames that connections not yet connected hold, summed over all of them. A
  connection whose bytes would take the sum past it is closed. Without it, 1,000 strangers
  each holding 60 KiB of a frame they never finish cost the broker ~60 MiB; with it, at most
  the budget. A real client's CONNECT arrives whole in one or two reads and holds nothing.
* **A handshake deadline.** A connection that has not completed CONNECT (authentication
  included) within ``keepAliveIntervalSeconds`` of being accepted is closed, whatever it sent
  meanwhile: Pulsar closes a connection whose handshake did not complete by its first
  keep-alive check. With keep-alive off (0) the deadline is ``DEFAULT_HANDSHAKE_SECONDS``, so
  turning keep-alive off never leaves strangers connected for ever. (After the handshake,
  keep-alive counts only complete frames as activity: a peer trickling a byte at a time is
  silent to it; see ``connection``.)
"""

from __future__ import annotations

import logging
from typing import Any, Mapping

log = logging.getLogger(__name__)

#: largest frame (``total_size``) accepted before CONNECT succeeds; see the module docstring
PREAUTH_MAX_FRAME_SIZE = 64 * 1024
#: bytes of unfinished frames all connections not yet connected may hold together
PREAUTH_BUFFER_BUDGET = 16 * 1024 * 1024
#: the handshake deadline when ``keepAliveIntervalSeconds`` is 0 (Pulsar's default interval)
DEFAULT_HANDSHAKE_SECONDS = 30


def handshake_deadline_seconds(config: Mapping[str, Any]) -> float:
    """Seconds a connection has, from accept, to complete CONNECT."""
    interval = int(config["keepAliveIntervalSeconds"])
    return float(interval if interval > 0 else DEFAULT_HANDSHAKE_SECONDS)


class ConnectionCounter:
    """Open binary-protocol connections, in total and per remote IP, against Pulsar's limits."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.max_total = max(0, int(config["brokerMaxConnections"]))
        self.max_per_ip = max(0, int(config["brokerMaxConnectionsPerIp"]))
        self.total = 0
        self.refused = 0  # connections closed at accept, since start
        self.preauth_buffered = 0  # bytes of partial frames held by connections before CONNECT
        self.preauth_budget = PREAUTH_BUFFER_BUDGET
        self._per_ip: dict[str, int] = {}

    def admit(self, ip: str) -> str | None:
        """Count a new connection from ``ip``: None, or why it is refused (nothing counted)."""
        if self.max_total and self.total >= self.max_total:
            return self._refuse(ip, "brokerMaxConnections", self.max_total, "")
        held = self._per_ip.get(ip, 0)
        if self.max_per_ip and held >= self.max_per_ip:
            return self._refuse(ip, "brokerMaxConnectionsPerIp", self.max_per_ip, f" on address {ip}")
        self.total += 1
        self._per_ip[ip] = held + 1
        return None

    def charge_preauth(self, delta: int) -> bool:
        """Add ``delta`` bytes (negative: give back) to what unconnected peers hold; False
        when the sum is now past the budget (the caller closes the connection it charged)."""
        self.preauth_buffered += delta
        return self.preauth_buffered <= self.preauth_budget

    def _refuse(self, ip: str, key: str, limit: int, where: str) -> str:
        self.refused += 1
        # debug, not warning: a flood of refused connections must not become a flood of log lines
        log.debug("refusing a connection from %s: %s (%d) reached", ip, key, limit)
        return f"Reached the maximum number of connections{where}"  # Pulsar's wording

    def release(self, ip: str) -> None:
        held = self._per_ip.get(ip, 0)
        if held <= 0:
            return
        self.total -= 1
        if held == 1:
            del self._per_ip[ip]
        else:
            self._per_ip[ip] = held - 1
