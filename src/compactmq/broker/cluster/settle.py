"""Waiting out a handoff: a lookup or a topic load that meets a bundle in flux waits a little.

When a bundle changes owner (an unload, a broker killed or frozen past its session, a broker
restarted), there is a moment when no broker can serve it: the old owner is closing its topics,
the key is not yet gone, the new owner's session is not yet up. Refusing a client then with a
retriable ``ServiceNotReady`` looks harmless, but it is not: the official client's reconnect
backoff doubles after every failed attempt (100 ms, 200 ms, ... up to 60 s) and is reset only by
a success, so each retriable refusal during a handoff costs the client twice the wait of the one
before; a few in a row cost a send tens of seconds.

A lookup therefore does not refuse a bundle in flux at once (``settled_decision``): while the
bundle is being unloaded here it waits for the unload to end, and a retriable failure (the
bundle taken under a session that just ended, a store call failing -- as on a broker resumed
after a freeze past its session, until its new session is up) is tried again, up to
``SETTLE_SECONDS``; then it answers the real owner (Connect / Redirect). Only once that bound
passed is the client refused. A broker that has not joined its cluster yet (``joined_cluster``)
makes lookups and topic loads wait for the join the same way.

A broker whose metadata store connection is down cannot answer (every store call would wait up
to the store's operation timeout, 30 s, longer than the client waits for a lookup). Its lookups
do not call the store then: they wait for the connection to come back (a broker resumed after a
freeze reconnects within moments) for up to ``SETTLE_DISCONNECTED_SECONDS``, and are then
refused: the client looks up again, through the next broker of its service URL. A broker cut
off from the store for good thus costs a client one short wait, not its operation timeout. A
topic load there (a client sent by a broker that still read this one's ownership key, before
ZooKeeper expired the session) waits and is refused the same way (``store_reachable``).

The waits decide nothing themselves: every answer still comes from ``ClusterService.decide``
and the lookup rules in ``service``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from ...errors import CompactMQError, ServerError, ServiceNotReady
from ...naming import TopicName

if TYPE_CHECKING:  # pragma: no cover
    from ..server import BrokerService
    from .service import ClusterService, Decision

log = logging.getLogger(__name__)

#: seconds a lookup (or a topic load) waits for a bundle in flux -- being unloaded, taken under a
#: session that just ended, a store call failing, the broker not joined yet -- before it is
#: refused (module docstring); well under the client's 30 s operation timeout
SETTLE_SECONDS = 5.0
#: pause between two looks at a bundle in flux (doubling, up to the next, between two attempts
#: that failed: a store that is down is not asked a hundred times a second per lookup)
SETTLE_POLL_SECONDS = 0.05
SETTLE_MAX_PAUSE_SECONDS = 0.5
#: seconds a lookup waits for this broker's metadata store connection to come back (module
#: docstring); shorter than ``SETTLE_SECONDS``: a broker cut off from the store may stay so,
#: and the next broker the client asks can answer
SETTLE_DISCONNECTED_SECONDS = 2.0


async def settled_decision(
    cluster: "ClusterService",
    tn: TopicName,
    authoritative: bool,
    check: Callable[[], Awaitable[Any]] | None = None,
) -> "Decision":
    """``cluster.decide`` (after ``check``, e.g. the namespace's existence, in each attempt),
    waiting out a bundle in flux for up to ``SETTLE_SECONDS`` (module docstring): a retriable
    refusal only once that bound passed; any other error at once."""
    start = time.monotonic()
    deadline = start + SETTLE_SECONDS
    pause = SETTLE_POLL_SECONDS
    while True:
        try:
            if not cluster.store.connected:
                if time.monotonic() >= start + SETTLE_DISCONNECTED_SECONDS:
                    deadline = 0.0  # refused now, without waiting the store's operation timeout
                raise ServiceNotReady(f"broker {cluster.broker_id} has no metadata store connection")
            if check is not None:
                await check()
            bundle = await cluster.bundle_of_topic(tn)
            while cluster.leaving(bundle) and not cluster.closing and time.monotonic() < deadline:
                await asyncio.sleep(SETTLE_POLL_SECONDS)
            return await cluster.decide(tn, authoritative)
        except CompactMQError as exc:
            retriable = exc.server_error is ServerError.ServiceNotReady
            if not retriable or cluster.closing or time.monotonic() + pause >= deadline:
                raise
            log.debug("lookup of %s: %s; trying again", tn, exc)
        await asyncio.sleep(pause)
        pause = min(2 * pause, SETTLE_MAX_PAUSE_SECONDS)


async def joined_cluster(service: "BrokerService") -> "ClusterService | None":
    """This broker's cluster service once it has joined its cluster; None on one broker.

    The broker binds its ports before it joins (its id is the web URL it bound): a lookup or a
    topic load that arrives in between -- a restarted broker, a multi-host service URL -- waits
    for the join up to ``SETTLE_SECONDS`` instead of being refused at once (module docstring);
    ``ServiceNotReady`` (retriable) once that bound passed."""
    from . import cluster_enabled  # the package imports this module: no cycle at call time

    cluster = service.cluster
    if cluster is not None and cluster.joined:
        return cluster
    if cluster is None and not cluster_enabled(service.config):
        return None
    deadline = time.monotonic() + SETTLE_SECONDS
    while cluster is None or not cluster.joined:
        if service.shutting_down or time.monotonic() >= deadline:
            raise ServiceNotReady("this broker has not joined its cluster yet; look the topic up again")
        await asyncio.sleep(SETTLE_POLL_SECONDS)
        cluster = service.cluster
    return cluster


async def store_reachable(service: "BrokerService") -> None:
    """In a cluster: return once this broker's metadata store connection is up, waiting up to
    ``SETTLE_DISCONNECTED_SECONDS``; ``ServiceNotReady`` after (module docstring). No-op on one
    broker (the embedded stores are always up)."""
    store = service.storage.metadata_store
    if store.connected or service.cluster is None:
        return
    deadline = time.monotonic() + SETTLE_DISCONNECTED_SECONDS
    while not store.connected:
        if service.shutting_down or time.monotonic() >= deadline:
            raise ServiceNotReady("this broker has no metadata store connection; look the topic up again")
        await asyncio.sleep(SETTLE_POLL_SECONDS)
