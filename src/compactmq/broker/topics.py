"""Topics: the managed ledger of one topic, its producers, its subscriptions.

How a topic object is found: ``BrokerService.topics`` is the one ``TopicManager``;
``await topics.get_topic(name, create=...)`` returns the loaded ``Topic`` (opening the managed
ledger in the thread pool on first use, once even when many requests race), ``topics.loaded``
maps canonical names to the topics already open. Partitions are ordinary topics named
``<base>-partition-<i>``; the number of partitions of a base topic lives in the metadata store.

Publishing is group commit on two levels: every SEND that arrives while an append is running
waits in the topic's queue, and the next append takes the whole queue in one
``ManagedLedger.append_many`` call (one write, one fsync); appends of one topic never overlap,
so positions follow arrival order and SEND_RECEIPTs go out in order. The receipts of a durable
batch are written to the socket as soon as the batch is answered (``ServerState.flush_writes``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any, Callable

from ..errors import CompactMQError, InvalidTopicName, NotAllowed, StorageError, TopicNotFound
from ..naming import TopicName
from ..protocol.frames import parse_metadata
from ..storage.position import Position
from .cluster import check_topic_owned
from .dedup import Deduplication, entry_sequence
from .entry_cache import slowest_active_read
from .entry_source import EntrySource, LedgerEntrySource, TailCache
from .limits import check_consumers, check_producers
from .namespaces import check_namespace
from .producers import EXCLUSIVE_WITH_FENCING, Producer, ProducerFenced, check_access, check_epoch
from .subscriptions import Consumer, CursorView, Subscription

if TYPE_CHECKING:  # pragma: no cover
    from .server import BrokerService

log = logging.getLogger(__name__)

# One append_many call takes at most this much: bounds the latency of the entries behind it.
MAX_APPEND_BATCH_ENTRIES = 2000
MAX_APPEND_BATCH_BYTES = 8 * 1024 * 1024

# Entries read back when a topic loads, to recover producers' last sequence ids.
SEQUENCE_RECOVERY_ENTRIES = 1000

PublishCallback = Callable[[Position | None, BaseException | None], None]


class Topic:
    def __init__(
        self,
        service: "BrokerService",
        name: TopicName,
        ledger: Any,
        last_position: Position | None = None,
        newest_ledger_id: int = -1,
    ) -> None:
        self.service = service
        self.topic_name = name
        self.name = str(name)
        self.partition_index = name.partition_index
        self.ledger = ledger
        self.producers: dict[int, Producer] = {}
        self.subscriptions: dict[str, Subscription] = {}
        self.tail_cache = TailCache(service.tail_cache_bytes, getattr(service, "tail_cache_budget", None))
        # kept here so the loop never asks the ledger (whose lock an appending thread may hold)
        self.last_position: Position | None = last_position
        self.newest_ledger_id = newest_ledger_id
        self.source = LedgerEntrySource(self, service.run_blocking)
        self.last_sequence_ids: dict[str, int] = {}
        self.dedup = Deduplication(self)
        self._queue: list[tuple[bytes, int, PublishCallback]] = []
        self._append_task: asyncio.Task | None = None
        self._sub_lock = asyncio.Lock()
        self._last_batch_memo: tuple[Position, int] | None = None
        self._exclusive_waiters: list[tuple[Producer, asyncio.Future]] = []
        self.closed = False
        self._unload_requested = False  # _reload_if_fenced asked for an unload once
        self.closed_producers_in = [0, 0]  # messages, bytes published by producers since closed
        self.epoch = -1  # topic epoch (see producers): -1 until an exclusive producer takes the topic
        # monotonic seconds of the last attach/detach: the inactive-topic sweep (inactive_topics)
        self.last_active = time.monotonic()

    def __repr__(self) -> str:
        return f"Topic({self.name})"

    def spawn(self, coro) -> asyncio.Task:
        return self.service.state.spawn(coro)

    def run_blocking(self, fn, *args):
        return self.service.run_blocking(fn, *args)

    # --- publishing --------------------------------------------------------------------------

    def publish(self, entry: bytes, publish_time_ms: int, callback: PublishCallback) -> None:
        if self.closed:
            callback(None, StorageError(f"topic {self.name} is closing"))
            return
        self._queue.append((entry, publish_time_ms, callback))
        if self._append_task is None:
            self._append_task = self.spawn(self._append_loop())

    def publish_marker(self, callback: PublishCallback) -> None:
        """Call ``callback(None, None)`` once every SEND queued before it is persisted or
        failed: the answer to a duplicate of a message still being written keeps its place in
        the order of receipts (see ``dedup``)."""
        if self._append_task is None and not self._queue:
            callback(None, None)
            return
        self._queue.append((None, 0, callback))  # type: ignore[arg-type]
        if self._append_task is None:
            self._append_task = self.spawn(self._append_loop())

    async def _append_loop(self) -> None:
        try:
            while self._queue:
                batch = self._take_batch()
                entries = [e for e, _, _ in batch if e is not None]
                times = [t for e, t, _ in batch if e is not None]
                try:
                    positions = (
                        await self.run_blocking(self.ledger.append_many, entries, times) if entries else []
                    )
                except BaseException as exc:  # noqa: BLE001 - every waiter must hear about it
                    err = exc if isinstance(exc, CompactMQError) else StorageError(f"append failed: {exc}")
                    log.error("append to %s failed: %s", self.name, exc)
                    for _, _, cb in batch:
                        cb(None, err)
                    if isinstance(exc, asyncio.CancelledError):
                        raise
                    self._reload_if_fenced()
                    continue
                stored = iter(positions)  # storage returns Positions
                for entry, _, cb in batch:
                    if entry is None:  # a marker (publish_marker)
                        cb(None, None)
                        continue
                    pos = next(stored)
                    self.last_position = pos
                    cb(pos, None)
                self.service.state.flush_writes()  # receipts leave now, not after the next poll
                self._cache(positions, entries)
                for listener in self.service.topics.appended_listeners:
                    listener(self.name)
                for sub in list(self.subscriptions.values()):
                    if sub.dispatcher is not None:
                        sub.dispatcher.wake()
        finally:
            self._append_task = None

    def _reload_if_fenced(self) -> None:
        """A write or sync failed, so the managed ledger refuses appends until reopened (a lost
        ownership check in a cluster, a transient store error, a disk error): unload the topic,
        as Pulsar closes a topic whose ledger was fenced. Its clients reconnect and look it up
        again; the next load recovers the ledger (or, if the bundle moved, goes to its owner)."""
        if self.closed or self._unload_requested or not getattr(self.ledger, "fenced", False):
            return
        self._unload_requested = True
        log.warning("%s: its ledger refuses appends after a failed write; unloading it", self.name)
        self.spawn(self._unload_self())

    async def _unload_self(self) -> None:
        topics = self.service.topics
        if topics.loaded.get(self.name) is self:  # not a newer load of the same name
            try:
                await topics.unload(self.name, close_ledger=True)
            except Exception:  # noqa: BLE001 - the ledger is broken already; the next load recovers
                log.warning("unloading %s after a failed write failed", self.name, exc_info=True)

    def _cache(self, positions: list[Position], entries: list[bytes]) -> None:
        """Keep what was just appended for the subscriptions reading the tail; drop what every
        one of them has read (``entry_cache``). Nobody reading: nothing is kept."""
        cache = self.tail_cache
        slowest = slowest_active_read(self.subscriptions.values())
        if slowest is None:
            if len(cache):
                cache.clear()
            return
        cache.evict_before(slowest)
        if positions:
            cache.extend(zip(positions, entries))

    def _take_batch(self) -> list:
        n = 0
        size = 0
        for entry, _, _ in self._queue:
            if entry is None:
                n += 1
                continue
            if n and (n >= MAX_APPEND_BATCH_ENTRIES or size + len(entry) > MAX_APPEND_BATCH_BYTES):
                break
            n += 1
            size += len(entry)
        batch = self._queue[:n]
        del self._queue[:n]
        return batch

    async def drain(self) -> None:
        """Wait until every queued SEND is persisted (or failed)."""
        while self._append_task is not None:
            await asyncio.shield(self._append_task)

    # --- producers ---------------------------------------------------------------------------

    def add_producer(self, producer: Producer) -> None:
        """Attach a producer; ProducerBusy / ProducerFenced when its access mode forbids it now,
        MustWait for a WaitForExclusive producer that joins the queue (see
        ``wait_for_exclusive``). An exclusive producer is given the next topic epoch
        (``producer.topic_epoch``; the caller persists it with ``save_epoch``)."""
        if self.closed:
            raise StorageError(f"topic {self.name} is closing")
        check_producers(self.service.config, self.name, len(self.producers))
        fenced = check_access(
            list(self.producers.values()), producer.access_mode, producer.name, bool(self._exclusive_waiters)
        )
        if producer.exclusive:
            check_epoch(producer, self.epoch)
        if producer.access_mode == EXCLUSIVE_WITH_FENCING:
            waiters, self._exclusive_waiters = self._exclusive_waiters, []
            for waiting, fut in waiters:
                if not fut.done():
                    fut.set_exception(ProducerFenced("Fenced out"))
        for old in fenced:
            old.connection.close_producer_by_broker(old)
        self._take_epoch(producer)
        self.producers[producer.serial] = producer
        self.last_active = time.monotonic()

    def _take_epoch(self, producer: Producer) -> None:
        if producer.exclusive:
            # the epoch the client brings back when it reconnects, else the next one
            given = producer.topic_epoch
            self.epoch = given if given is not None and given >= self.epoch else self.epoch + 1
            producer.topic_epoch = self.epoch

    async def save_epoch(self) -> None:
        """Persist the topic epoch (in the topic's properties) before the producer hears of it."""
        await self.run_blocking(_save_epoch, self.service.storage.topic_metadata, self.name, self.epoch)

    @property
    def waiting_producers(self) -> int:
        """WaitForExclusive producers queued for the topic (``waitingPublishers`` in stats)."""
        return sum(1 for _, fut in list(self._exclusive_waiters) if not fut.done())

    async def wait_for_exclusive(self, producer: Producer) -> None:
        """Queue a WaitForExclusive producer; returns once it is attached as the only one."""
        fut = asyncio.get_running_loop().create_future()
        self._exclusive_waiters.append((producer, fut))
        try:
            await fut
        except BaseException:
            self._exclusive_waiters = [(p, f) for p, f in self._exclusive_waiters if f is not fut]
            raise

    def _grant_exclusive(self) -> None:
        while self._exclusive_waiters and not any(not p.closed for p in self.producers.values()):
            producer, fut = self._exclusive_waiters.pop(0)
            if fut.done() or producer.closed or producer.connection.closed:
                continue
            try:
                check_epoch(producer, self.epoch)
            except ProducerFenced as exc:
                fut.set_exception(exc)
                continue
            self._take_epoch(producer)
            self.producers[producer.serial] = producer
            fut.set_result(None)

    def remove_producer(self, producer: Producer) -> None:
        producer.closed = True
        self.last_active = time.monotonic()
        if self.producers.pop(producer.serial, None) is not None:
            # what a closed producer published still counts in the topic's totals (stats, /metrics)
            self.closed_producers_in[0] += producer.messages_in
            self.closed_producers_in[1] += producer.bytes_in
        if self._exclusive_waiters:
            for waiting, fut in self._exclusive_waiters:
                if waiting is producer and not fut.done():
                    fut.cancel()  # it gave up waiting (closed, or its connection went)
            self._exclusive_waiters = [(p, f) for p, f in self._exclusive_waiters if not f.done()]
            self._grant_exclusive()

    # --- subscriptions -----------------------------------------------------------------------

    def entry_source_for(self, read_compacted: bool) -> EntrySource:
        """Where a new subscription reads: the topic itself, or (read compacted) whatever
        ``BrokerService.compacted_source_factory`` builds: the compacted ledger up to the
        horizon, then this topic (issue 5 plugs in there)."""
        factory = self.service.compacted_source_factory
        if read_compacted and factory is not None:
            return factory(self)
        return self.source

    async def subscribe(
        self,
        name: str,
        durable: bool,
        initial_position: Any,
        make_consumer: Callable[[Subscription], Consumer],
        sub_type: int,
        key_shared_sticky: bool = False,
        read_compacted: bool = False,
    ) -> Consumer:
        """Find or create the subscription and attach a consumer to it."""
        if self.closed:
            raise StorageError(f"topic {self.name} is closing")
        async with self._sub_lock:
            sub = self.subscriptions.get(name)
            created = False
            if sub is None:
                if not name:
                    raise NotAllowed("subscription name is empty")
                cursor, view = await self.run_blocking(
                    _open_cursor, self.ledger, name, durable, initial_position
                )
                sub = Subscription(self, name, cursor, durable, self.entry_source_for(read_compacted), view)
                self.subscriptions[name] = sub
                created = True
            elif sub.durable != durable:
                raise NotAllowed(
                    f"subscription {name!r} is {'durable' if sub.durable else 'non-durable'}; "
                    "cannot attach a consumer of the other kind"
                )
            try:
                check_consumers(
                    self.service.config,
                    sum(len(s.consumers) for s in self.subscriptions.values()),
                    len(sub.consumers),
                )
                consumer = make_consumer(sub)
                sub.add_consumer(consumer, sub_type, key_shared_sticky)
                self.last_active = time.monotonic()
            except BaseException:
                if created and not durable:
                    self.drop_subscription(sub)
                raise
        sub.dispatcher.wake()
        return consumer

    def drop_subscription(self, sub: Subscription) -> None:
        """Forget a subscription whose last reader left (non-durable ones)."""
        if self.subscriptions.get(sub.name) is sub:
            del self.subscriptions[sub.name]
        if sub.dispatcher is not None:
            sub.dispatcher.close()
        if not sub.durable:
            self.spawn(self._delete_cursor(sub.name, quiet=True))

    async def unsubscribe(self, sub: Subscription) -> None:
        await sub.close()
        if self.subscriptions.get(sub.name) is sub:
            del self.subscriptions[sub.name]
        await self._delete_cursor(sub.name)

    async def _delete_cursor(self, name: str, quiet: bool = False) -> None:
        try:
            await self.run_blocking(self.ledger.delete_cursor, name)
        except Exception:
            if not quiet:
                raise

    # --- reads -------------------------------------------------------------------------------

    def last_message_id(self) -> Position:
        """Last entry's position; for an empty topic (current ledger, -1), as Pulsar answers."""
        if self.last_position is not None:
            return self.last_position
        return Position(self.newest_ledger_id, -1)

    async def last_batch_index(self, position: Position) -> int:
        """Index of the last message of the entry at ``position`` (-1: not a batch, or none)."""
        if position[1] < 0:
            return -1
        memo = self._last_batch_memo
        if memo is not None and memo[0] == position:
            return memo[1]
        entry = await self.source.read_one(position)
        index = -1
        if entry is not None:
            md = parse_metadata(entry)
            if md.HasField("num_messages_in_batch"):
                index = md.num_messages_in_batch - 1
        self._last_batch_memo = (position, index)
        return index

    # --- lifecycle ---------------------------------------------------------------------------

    async def close(self, disconnect_clients: bool = True) -> None:
        """Stop taking SENDs, tell clients to reconnect, persist what is queued, flush acks."""
        self.closed = True
        for _, fut in self._exclusive_waiters:
            if not fut.done():
                fut.set_exception(StorageError(f"topic {self.name} is closing"))
        self._exclusive_waiters.clear()
        if disconnect_clients:
            for producer in list(self.producers.values()):
                producer.connection.close_producer_by_broker(producer)
            for sub in list(self.subscriptions.values()):
                for consumer in list(sub.consumers):
                    consumer.connection.close_consumer_by_broker(consumer)
        await self.drain()
        await self.dedup.close()
        for sub in list(self.subscriptions.values()):
            try:
                await sub.close()
            except Exception:
                log.exception("closing %s failed", sub)
        self.tail_cache.clear()  # give its bytes back to the broker-wide budget


def _open_cursor(ledger: Any, name: str, durable: bool, initial_position: Any):
    # runs in the thread pool: the cursor and the first snapshot of it
    cursor = ledger.open_cursor(name, durable, initial_position)
    return cursor, CursorView.of(cursor, with_batch_acks=True)


EPOCH_PROPERTY = "topicEpoch"


def _load_epoch(metadata: Any, topic: str) -> int:
    try:
        return int(metadata.topic_properties(topic).get(EPOCH_PROPERTY, -1))
    except TopicNotFound:
        return -1


def _save_epoch(metadata: Any, topic: str, epoch: int) -> None:
    """Raise the stored epoch to ``epoch`` (never lower it): one compare-and-set on the topic."""

    def raise_epoch(props: dict[str, Any]) -> dict[str, Any]:
        if int(props.get(EPOCH_PROPERTY, -1)) < epoch:
            props[EPOCH_PROPERTY] = epoch
        return props

    metadata.update_topic_properties(topic, raise_epoch)


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
        from .nonpersistent import NonPersistentTopics  # it builds on Topic, defined above

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
        except TopicNotFound:
            raise TopicNotFound(f"topic {tn} does not exist (allowAutoTopicCreation is off)") from None
        last, newest = await self.service.run_blocking(_topic_facts, ledger)
        topic = Topic(self.service, tn, ledger, last, newest)
        topic.last_sequence_ids = await self.service.run_blocking(recover_sequence_ids, ledger)
        topic.epoch = await self.service.run_blocking(
            _load_epoch, self.service.storage.topic_metadata, str(tn)
        )
        await topic.dedup.load()
        try:  # a bundle given up while this topic loaded: its unload did not see it, so close here
            await check_topic_owned(self.service, tn)
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
            if monitor is not None and not monitor.is_running(key):
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
        if monitor is not None:
            monitor.stats.pop(name, None)
            monitor.forget(name)
        for listener in list(self.deleted_listeners):
            listener(name)

    async def close_all(self) -> None:
        topics = list(self.loaded.values())
        await asyncio.gather(*(t.close() for t in topics), return_exceptions=True)
        await self.non_persistent.close_all()
