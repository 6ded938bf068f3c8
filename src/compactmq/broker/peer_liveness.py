"""Evicting a silent peer that holds what a newcomer claims.

A producer name, an exclusive producer or an exclusive subscription may be held by a client
whose socket died without the broker noticing yet (the client reconnected first). Before a
newcomer is refused, each connection holding the claim is sent a PING; one that does not answer
within ``LIVENESS_TIMEOUT_SECONDS`` (or the keep-alive interval, if shorter) is closed, so the
newcomer gets what it asked for. Pulsar checks liveness the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from .connection import ServerConnection

log = logging.getLogger(__name__)

# How long a connection holding a producer name or an exclusive subscription may take to answer
# a PING before a newcomer that claims the same is given it (Pulsar checks liveness the same way).
LIVENESS_TIMEOUT_SECONDS = 5.0


async def evict_dead_peers(
    own: ServerConnection, connections: Iterable[ServerConnection], keepalive_seconds: int
) -> None:
    """Close each of ``connections`` (other than ``own``) that does not answer a PING in time."""
    timeout = min(LIVENESS_TIMEOUT_SECONDS, max(1, keepalive_seconds))
    for conn in {c for c in connections if c is not own and not c.closed}:
        if not await conn.is_alive(timeout):
            log.info("evicting %s: no answer to a liveness PING within %ss", conn.peer, timeout)
            conn.abort()
