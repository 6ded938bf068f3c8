"""Which topics are open on this broker: loading them under ownership, closing them again.

``BrokerService.topics`` is the one ``TopicManager``. ``await topics.get_topic(name,
create=...)`` returns the loaded ``Topic`` (``topics``), opening it on first use -- once, even
when many requests race for it (later callers wait on the first one's future). ``loaded`` maps
canonical names to the topics open here. Partitions are ordinary topics named
``<base>-partition-<i>``; the number of partitions of a base topic lives in the metadata store.

Opening a topic (``_load``) checks, in order: the namespace exists (and whether auto creation
is allowed), this broker owns the topic's bundle (in a cluster), the partition index is in
range; then it opens the managed ledger in the thread pool, recovers the producers' last
sequence ids from the newest entries and the topic epoch, and checks ownership once more -- a
bundle given up while the topic loaded was not seen by that bundle's unload, so the topic is
closed again here and the load fails; so is one whose bundle was given up and taken again
meanwhile (its ledger was opened under the ownership that ended). A load that fails with a
``StorageError`` because the ownership ended or the metadata store was away meanwhile (a
storage layer may wrap a ``Fenced`` or ``StoreUnavailable``) is answered ``ServiceNotReady``,
which the client retries with a lookup, not PersistenceError, which fails a first create
(``cluster.load_failed_on_lost_ownership``); a disk error or a damaged ledger stays one.

Closing: ``unload`` closes a topic (its clients are told to reconnect), with ``close_ledger``
its managed ledger too (a load of the same name waits for that close, so it never gets the
ledger being closed). ``delete_inactive`` unloads and deletes a topic nobody uses
(``inactive_topics``). ``unload_after_failed_write`` is how a topic leaves after a write or
sync failed and its ledger refuses appends: it is unloaded once, and the next load recovers the
ledger (or finds that the bundle moved to another broker).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Callable

from ..errors import (
    CompactMQError,
    InvalidTopicName,
    NotAllowed,
    ServiceNotReady,
    StorageError,
    TopicNotFound,
)
from ..naming import TopicName
from ..storage.position import Position
from .cluster import (
    check_opened_under_current_ownership,
    check_topic_owned,
    load_failed_on_lost_ownership,
    store_reachable,
)
from .dedup import entry_sequence
from .namespaces import check_namespace
from .nonpersistent import NonPersistentTopics
from .topic_producers import EPOCH_PROPERTY
from .topics import Topic

if TYPE_CHECKING:  # pragma: no cover
    from .server import BrokerService

log = logging.getLogger(__name__)

# Entries read back when a topic loads, to recover producers' last sequence ids.
SEQUENCE_RECOVERY_ENTRIES = 1000


def load_epoch(metadata: Any, topic: str) -> int:
    try:
        return int(metadata.topic_properties(topic).get(EPOCH_PROPERTY, -1))
    except TopicNotFound:
        return -1


def _topic_facts(ledger: Any) -> tuple[Position | None, int]:
    """(last position, id of the newest ledger or -1): read in the pool when a topic loads."""
    last = ledger.last_position()
    ledgers = ledger.ledgers()
    return (Position(*last) if last is not None else None), (ledgers[-1].ledger_id if ledgers else -1)


def recover_sequence_ids(ledger: Any, window: int = SEQUENCE_RECOVERY_ENTRIES) -> dict[str, int]:
    """Last sequence id per producer name, from the newest entries of the topic.

    A producer that reconnects after a broker restart learns its ``last_sequence_id`` from
    this (runs in the thread pool when the topic loads). Only the last ``window`` entries of
    the current ledger are read, so the cost is bounded; an older producer starts from -1.
    """
    last = ledger.last_position()
    if last is None:
        return {}
    start = Position(last[0], max(0, last[1] - window + 1))
    out: dict[str, int] = {}
    for _, entry in ledger.read_entries(start, window):
        found = entry_sequence(entry)  # None for a damaged entry: it only costs its producer's number
        if found is not None and out.get(found[0], -1) < found[1]:
            out[found[0]] = found[1]
    return out


class TopicManager:
    """Every loaded topic of the broker, and the partitioned-topic metadata."""

    def __init__(self, service: "BrokerService") -> None:
        self.service = service
        self.loaded: dict[str, Topic] = {}
        self._loading: dict[str, asyncio.Future] = {}
        # topics whose managed ledger is closing (unload(close_ledger=True)): a load waits for it,
        # so it never gets the ledger that is being closed
        self._unloading: dict[str, asyncio.Future] = {}
        # called with the name of a topic the broker deleted by itself (inactive_topics): the
        # adapters above forget what they keep per topic (the admin's traffic counters)
        self.deleted_listeners: list[Callable[[str], None]] = []
        # called with a topic's name after each append to it, and with a topic or namespace name
        # when its policies changed (admin API): the compaction monitor's check looks only at
        # the topics that changed (compaction_watch)
        self.appended_listeners: list[Callable[[str], None]] = []
        self.policy_listeners: list[Callable[[str], None]] = []
        self.non_persistent = NonPersistentTopics(self)

    @property
    def config(self):
        return self.service.config

    @property
    def metadata(self):
        return self.service.storage.topic_metadata

    async def get_topic(self, name: str, create: bool = True) -> Topic:
        """The loaded topic ``name``; opened on first use.

        ``create``: whether the client's request may create it (auto topic creation); a
        partition of an existing partitioned topic is always created.
        """
        tn = TopicName.parse(name)
        if not tn.persistent:  # in memory only, never loaded from storage (see nonpersistent)
            return self.non_persistent.get(tn, create)
        key = str(tn)
        unloading = self._unloading.get(key)
        if unloading is not None:
            await asyncio.shield(unloading)
        topic = self.loaded.get(key)
        if topic is not None and not topic.closed:
            return topic
        fut = self._loading.get(key)
        if fut is None:
            fut = asyncio.get_running_loop().create_future()
            self._loading[key] = fut
            try:
                topic = await self._load(tn, create)
            except BaseException as exc:
                fut.set_exception(exc)
                fut.exception()  # consumed here; other waiters re-raise it
                raise
            else:
                self.loaded[key] = topic
                fut.set_result(topic)
                return topic
            finally:
                del self._loading[key]
        return await asyncio.shield(fut)

    async def _load(self, tn: TopicName, create: bool) -> Topic:
        if self.service.shutting_down:
            raise StorageError("broker is shutting down")
        storage = self.service.storage
        await store_reachable(self.service)  # in a cluster: no store call waits out a cut-off store
        auto = await check_namespace(self.service, tn)  # NamespaceNotFound: never create a tenant
        await check_topic_owned(self.service, tn)  # in a cluster: ServiceNotReady unless owned here
        allowed = create and auto.allowed
        base = tn.partitioned_base
        if tn.partition_index >= 0:
            partitions = await self.service.run_blocking(self.service.storage.partitions, str(base))
            if partitions is not None:
                if tn.partition_index >= partitions:
                    raise TopicNotFound(f"topic {tn}: {base} has only {partitions} partitions")
                allowed = True
        else:
            partitions = await self.service.run_blocking(self.service.storage.partitions, str(tn))
            if partitions is not None:
                raise NotAllowed(f"{tn} is a partitioned topic: use its partitions")
        try:
            ledger = await self.service.run_blocking(storage.open_managed_ledger, str(tn), allowed)
            last, newest = await self.service.run_blocking(_topic_facts, ledger)
            topic = Topic(self.service, tn, ledger, last, newest)
            topic.last_sequence_ids = await self.service.run_blocking(recover_sequence_ids, ledger)
            topic.epoch = await self.service.run_blocking(
                load_epoch, self.service.storage.topic_metadata, str(tn)
            )
            await topic.dedup.load()
        except TopicNotFound:
            raise TopicNotFound(f"topic {tn} does not exist (allowAutoTopicCreation is off)") from None
        except StorageError as exc:  # PersistenceError, unless the ownership or the store went
            if not load_failed_on_lost_ownership(self.service, tn, exc):
                raise
            raise ServiceNotReady(f"loading {tn} failed as its ownership or store went: {exc}") from exc
        try:  # a bundle given up while this topic loaded: its unload did not see it, so close here
            await check_topic_owned(self.service, tn)
            check_opened_under_current_ownership(self.service, tn)  # ...and taken again meanwhile
        except CompactMQError:
            await topic.close()
            try:
                await self.service.run_blocking(ledger.close)
            except CompactMQError as exc:
                log.warning("closing %s after its bundle left failed: %s", tn, exc)
            raise
        return topic

    async def partitions(self, name: str, auto_create: bool = True) -> int:
        """Number of partitions of ``name`` (0: not partitioned), for PARTITIONED_METADATA.

        With automatic creation of type ``partitioned`` (broker settings or the namespace's
        ``autoTopicCreation`` policy, see ``namespaces``), an unknown topic becomes a partitioned
        topic of ``defaultNumPartitions`` partitions here, as Pulsar does.
        """
        tn = TopicName.parse(name)
        auto = await check_namespace(self.service, tn)  # NamespaceNotFound, as Pulsar answers
        if tn.partition_index >= 0:
            return 0
        n = await self.service.run_blocking(self.service.storage.partitions, str(tn))
        if n is not None:
            return n
        if auto_create and auto.allowed and auto.partitioned and str(tn) not in self.loaded:
            exists = await self.service.run_blocking(self.metadata.topic_exists, str(tn))
            if not exists:
                return await self.create_partitioned_topic(str(tn), auto.partitions)
        return 0

    async def create_partitioned_topic(self, name: str, partitions: int) -> int:
        """Create a partitioned topic's metadata (the admin API calls this too)."""
        tn = TopicName.parse(name)
        if tn.partition_index >= 0:
            raise InvalidTopicName(f"{tn} is a partition name; a partitioned topic cannot be one")
        try:
            await self.service.run_blocking(
                self.service.storage.create_partitioned_topic, str(tn), partitions
            )
        except CompactMQError as exc:
            if type(exc).__name__ != "AlreadyExists":
                raise
        return await self.service.run_blocking(self.service.storage.partitions, str(tn))

    async def policies_changed(self, name: str) -> None:
        """A topic or namespace policy changed (admin API): loaded topics it covers re-read
        the policies they keep in memory (deduplication)."""
        for listener in self.policy_listeners:
            listener(name)
        for topic in list(self.loaded.values()):
            if topic.closed:
                continue
            base = str(topic.topic_name.partitioned_base)
            if name in (topic.name, base, topic.topic_name.namespace_name):
                try:
                    await topic.dedup.refresh()
                except Exception:  # noqa: BLE001 - the policy is stored; the next load applies it
                    log.exception("applying the policies of %s failed", topic.name)

    def unload_after_failed_write(self, topic: Topic) -> None:
        """A write or sync of ``topic`` failed, so its managed ledger refuses appends until
        reopened (a lost ownership check in a cluster, a transient store error, a disk error):
        unload the topic, as Pulsar closes a topic whose ledger was fenced. Its clients reconnect
        and look it up again; the next load recovers the ledger (or, if the bundle moved, goes
        to its owner). Asked once per topic object; nothing to do while the ledger still takes
        appends."""
        if topic.closed or topic.unload_requested or not getattr(topic.ledger, "fenced", False):
            return
        topic.unload_requested = True
        log.warning("%s: its ledger refuses appends after a failed write; unloading it", topic.name)
        topic.spawn(self._unload_fenced(topic))

    async def _unload_fenced(self, topic: Topic) -> None:
        if self.loaded.get(topic.name) is topic:  # not a newer load of the same name
            try:
                await self.unload(topic.name, close_ledger=True)
            except Exception:  # noqa: BLE001 - the ledger is broken already; the next load recovers
                log.warning("unloading %s after a failed write failed", topic.name, exc_info=True)

    async def unload(self, name: str, close_ledger: bool = False) -> None:
        """Close a loaded topic (clients are told to reconnect). ``close_ledger``: close its
        managed ledger too (sealing the current ledger), so nothing of it stays in memory."""
        key = str(TopicName.parse(name))
        topic = self.loaded.pop(key, None)
        if topic is None:
            return
        if not close_ledger or key in self._unloading:
            await topic.close()
            return
        done = self._unloading[key] = asyncio.get_running_loop().create_future()
        try:
            await topic.close()
            await self.service.run_blocking(topic.ledger.close)
            monitor = self.service.compaction_monitor
            if not monitor.is_running(key):
                monitor.forget(key)  # its compaction service, made again on demand
        finally:
            del self._unloading[key]
            done.set_result(None)

    async def delete_inactive(self, name: str) -> None:
        """Delete a topic nobody uses (``inactive_topics``): unload it, then its ledgers,
        cursors, schemas and metadata."""
        await self.unload(name)
        await self.service.run_blocking(self.service.storage.delete_managed_ledger, name)
        await self.service.run_blocking(self.service.schemas.topic_deleted, name)
        monitor = self.service.compaction_monitor
        monitor.stats.pop(name, None)
        monitor.forget(name)
        for listener in list(self.deleted_listeners):
            listener(name)

    async def close_all(self) -> None:
        topics = list(self.loaded.values())
        await asyncio.gather(*(t.close() for t in topics), return_exceptions=True)
        await self.non_persistent.close_all()
