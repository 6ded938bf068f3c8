"""Inactive topics: deleted or unloaded, so that a broker's memory follows the topics in use.

A loaded topic is *active* while it has a producer, a consumer, a producer waiting for exclusive
access or a write in progress. ``Topic.last_active`` (monotonic seconds) is moved on every
attach and detach and whenever this sweep finds it active. Every
``brokerDeleteInactiveTopicsFrequencySeconds`` the sweep looks at each loaded persistent topic
that has been inactive for ``brokerDeleteInactiveTopicsMaxInactiveDurationSeconds`` (default:
the frequency) and, as Pulsar does with ``brokerDeleteInactiveTopicsEnabled=true``:

* ``brokerDeleteInactiveTopicsMode=delete_when_no_subscriptions`` (the default): deletes it when
  it has no subscription (durable cursors; ``__compaction`` counts, ``pulsar.dedup`` does not);
* ``delete_when_subscriptions_caught_up``: deletes it when every subscription has acknowledged
  everything (backlog 0).

Never deleted, whatever the mode: partitions of a partitioned topic (their metadata outlives
them), system topics (local name starting with ``__``), a topic being compacted.

A topic that is inactive but not deleted (deletion off, or it has subscriptions that keep it)
is *unloaded*: closed (acknowledgements flushed, the cache given back) and its managed ledger
closed (the current ledger sealed; the next use reopens it, as after a restart). This is
compactmq's own rule: Pulsar keeps idle topics loaded, but a Python broker that keeps ten
thousand idle topics in memory keeps their indexes, cursors and tail caches too. Retention of an
unloaded topic waits for its next load (Pulsar's retention too runs on loaded topics only).

Each sweep also drops the in-memory indexes of sealed ledgers that no read used since the
previous sweep (``ManagedLedger.release_idle_indexes``) in the topics it keeps loaded.

A sweep that unloaded or deleted topics then hands the memory they held back to the system
(``malloc_policy.trim``, in the pool): freed C heap stays resident otherwise, and a broker that
serves a stream of new topics would keep each round's high-water mark.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from ..errors import CompactMQError, InvalidConfiguration
from . import malloc_policy
from .background import stop_task
from .dedup import DEDUP_CURSOR

if TYPE_CHECKING:  # pragma: no cover
    from .server import BrokerService
    from .topics import Topic

log = logging.getLogger(__name__)

DELETE_WHEN_NO_SUBSCRIPTIONS = "delete_when_no_subscriptions"
DELETE_WHEN_SUBSCRIPTIONS_CAUGHT_UP = "delete_when_subscriptions_caught_up"
DELETE_MODES = (DELETE_WHEN_NO_SUBSCRIPTIONS, DELETE_WHEN_SUBSCRIPTIONS_CAUGHT_UP)


def is_active(topic: "Topic") -> bool:
    """Someone uses the topic now (producers, consumers, waiters, writes in flight)."""
    if topic.producers or topic.waiting_producers or topic.publishing:
        return True
    return any(sub.consumers for sub in topic.subscriptions.values())


def _deletable(ledger: Any, metadata: Any, mode: str) -> bool:
    """Runs in the pool. The durable cursors are the subscriptions (the dedup snapshot is not
    one); the metadata store's list counts too: a ``compact-topic`` job in another process holds
    the topic with a ``__compaction`` cursor this broker's ledger may not have read yet."""
    cursors = [c for c in ledger.cursors() if c.durable and c.name != DEDUP_CURSOR]
    stored = {rec.name for rec in metadata.load_cursors(ledger.topic)} - {DEDUP_CURSOR}
    if mode == DELETE_WHEN_SUBSCRIPTIONS_CAUGHT_UP:
        return stored <= {c.name for c in cursors} and all(c.backlog() == 0 for c in cursors)
    return not cursors and not stored


def _release_idle_indexes(ledgers: list, idle_s: float) -> None:
    """Runs in the pool: sealed ledgers' indexes no read used for ``idle_s`` leave memory (a
    loaded topic kept the index of every sealed ledger a reader had passed: a few pieces of it
    since ``storage.sealed_index``, 16 bytes an entry where an index is loaded whole)."""
    for ledger in ledgers:
        try:
            ledger.release_idle_indexes(idle_s)
        except CompactMQError as exc:
            log.debug("idle indexes of %s: %s", getattr(ledger, "topic", ledger), exc)


class InactiveTopicSweeper:
    """The periodic sweep (see the module notes); ``run_once`` is what the timer calls."""

    def __init__(self, service: "BrokerService", clock=time.monotonic) -> None:
        config = service.config
        self.service = service
        self.clock = clock
        self.delete_enabled = bool(config["brokerDeleteInactiveTopicsEnabled"])
        self.frequency = max(1, int(config["brokerDeleteInactiveTopicsFrequencySeconds"]))
        max_inactive = config["brokerDeleteInactiveTopicsMaxInactiveDurationSeconds"]
        self.max_inactive = (
            int(max_inactive) if max_inactive is not None and max_inactive > 0 else self.frequency
        )
        self.mode = str(config["brokerDeleteInactiveTopicsMode"])
        if self.mode not in DELETE_MODES:
            raise InvalidConfiguration(
                f"brokerDeleteInactiveTopicsMode={self.mode!r}: use one of {', '.join(DELETE_MODES)}"
            )
        self.deleted = 0
        self.unloaded = 0
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = self.service.state.spawn(self._loop())

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.frequency)
            await self.run_once()

    async def close(self) -> None:
        task, self._task = self._task, None
        await stop_task(task)

    async def run_once(self) -> None:
        """Delete or unload every topic inactive for long enough, then give the memory back."""
        gone = self.deleted + self.unloaded
        await self._sweep()
        ledgers = [
            t.ledger
            for t in self.service.topics.loaded.values()
            if not t.closed and hasattr(getattr(t, "ledger", None), "release_idle_indexes")
        ]
        if ledgers and not self.service.shutting_down:
            await self.service.run_blocking(_release_idle_indexes, ledgers, self.frequency)
        if self.deleted + self.unloaded != gone and not self.service.shutting_down:
            await self.service.run_blocking(malloc_policy.trim)

    async def _sweep(self) -> None:
        service = self.service
        now = self.clock()
        for name, topic in list(service.topics.loaded.items()):
            if service.shutting_down:
                return
            if topic.closed:
                continue
            if is_active(topic):
                topic.last_active = now
                continue
            if now - topic.last_active < self.max_inactive or self._compacting(name):
                continue
            try:
                if self._may_delete(topic) and await service.run_blocking(
                    _deletable, topic.ledger, service.storage.topic_metadata, self.mode
                ):
                    await self._delete(topic)
                else:
                    await self._unload(topic)
            except CompactMQError as exc:  # this topic stays loaded; the next sweep tries again
                log.warning("inactive topic %s: %s", name, exc)

    def _compacting(self, name: str) -> bool:
        return self.service.compaction_monitor.is_running(name)

    def _may_delete(self, topic: "Topic") -> bool:
        tn = topic.topic_name
        return self.delete_enabled and tn.partition_index < 0 and not tn.local_name.startswith("__")

    async def _unload(self, topic: "Topic") -> None:
        if is_active(topic):  # someone came while we looked
            return
        await self.service.topics.unload(topic.name, close_ledger=True)
        self.unloaded += 1
        log.info("unloaded inactive topic %s", topic.name)

    async def _delete(self, topic: "Topic") -> None:
        if is_active(topic):
            return
        await self.service.topics.delete_inactive(topic.name)
        self.deleted += 1
        log.info("deleted inactive topic %s (%s)", topic.name, self.mode)
