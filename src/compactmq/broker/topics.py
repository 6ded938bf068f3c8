"""Topics: the managed ledger of one topic, its producers, its subscriptions.

How a topic object is found and closed is ``topic_ownership`` (``TopicManager``):
``await service.topics.get_topic(name, create=...)`` returns the loaded ``Topic``.

Publishing is a pipelined group commit. The SENDs of one read from the socket are queued and
written together, in arrival order, as soon as the current callback ends
(``ManagedLedger.try_write_many``: on the loop itself when the write cannot block -- a local
ledger file, its lock free, no rollover due, a batch of at most
``appender.INLINE_WRITE_MAX_BYTES`` -- else in a pool thread, the rest of the queue waiting for
it). Writing never waits for a sync: one pool thread per topic syncs (``sync_written``) while
the loop goes on writing, each sync covering every record written before it started, and tells
the loop after each sync how far the ledger is durable. A lone small write on a quiet broker
is synced on the loop itself instead (``_sync``, ``SyncThreads.claim_inline``): the same
fdatasync without the two thread hops, which at a modest rate were much of a receipt's time. Only then are the receipts of the
batches it covered written -- in order, as the positions follow arrival order -- and sent at
once (``ServerState.flush_writes``). A batch whose write failed is answered with its error in
its place in that order; a failed sync fails every batch it did not make durable (the ledger is
fenced and the topic reloaded), and the receipts of batches already durable stand.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import time
from typing import TYPE_CHECKING, Any, Callable

from ..errors import CompactMQError, NotAllowed, StorageError
from ..naming import TopicName
from ..protocol.entry_format import parse_metadata
from ..storage.position import Position
from .dedup import Deduplication
from .entry_cache import slowest_active_read
from .entry_source import EntrySource, LedgerEntrySource, TailCache
from .limits import check_consumers
from .producers import Producer
from .subscriptions import Consumer, CursorView, Subscription
from .topic_producers import TopicProducers

if TYPE_CHECKING:  # pragma: no cover
    from .server import BrokerService

log = logging.getLogger(__name__)

# One append_many call takes at most this much: bounds the latency of the entries behind it.
MAX_APPEND_BATCH_ENTRIES = 2000
MAX_APPEND_BATCH_BYTES = 8 * 1024 * 1024

# At most this many records written and not yet durable are synced on the loop itself
# (``Topic._sync``); more go to a sync thread, and the loop goes on reading while it syncs.
INLINE_SYNC_MAX_RECORDS = 2

_new_tuple = tuple.__new__

PublishCallback = Callable[[Position | None, BaseException | None], None]


class Topic(TopicProducers):
    # publish callbacks with a position run in ``_release``, which writes out what they queued
    # (``ServerState.flush_writes``) before it returns: receipts use ``write_released``
    flushes_after_receipts = True

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
        # publishing (see the module docstring): SENDs not yet written; written batches
        # waiting for their sync, as (seq, batch, entries, ledger id, first entry id) --
        # entries None for a batch whose write failed (the error in place of the ledger id)
        self._queue: list[tuple[bytes, int, PublishCallback]] = []
        self._unsynced: collections.deque[tuple[int, list, list[bytes], int, int]] = collections.deque()
        self._written_seq = 0  # the ledger's seq of the last record this topic wrote
        self._write_scheduled = False
        self._writing = False  # a pool thread writes a batch (the queue waits for it)
        self._syncing = False  # a pool thread runs ManagedLedger.sync_written
        self._idle_waiters: list[asyncio.Future] = []
        # the loop, once publishing starts (``_bind_loop``): asyncio.get_running_loop makes a
        # getpid system call each time, and the publish path wanted it up to 3 times a message
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sub_lock = asyncio.Lock()
        self._last_batch_memo: tuple[Position, int] | None = None
        self._exclusive_waiters: list[tuple[Producer, asyncio.Future]] = []
        self.closed = False
        self.unload_requested = False  # unload_after_failed_write asked for an unload once
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
        if not self._write_scheduled:
            self._schedule_write()

    def publish_run(
        self, entries: list[bytes], publish_times_ms: list[int], callback: PublishCallback
    ) -> None:
        """``publish`` for consecutive entries of one producer, with one callback for all of
        them: ``callback(position of the first, None)`` once all are persisted -- they are
        written together, so the others follow it one entry id apart -- or ``callback(None,
        error)``. A run is never split between two writes."""
        if self.closed:
            callback(None, StorageError(f"topic {self.name} is closing"))
            return
        self._queue.append((entries, publish_times_ms, callback))  # type: ignore[arg-type]
        if not self._write_scheduled:
            self._schedule_write()

    def publish_marker(self, callback: PublishCallback) -> None:
        """Call ``callback(None, None)`` once every SEND queued before it is persisted or
        failed: the answer to a duplicate of a message still being written keeps its place in
        the order of receipts (see ``dedup``)."""
        if not self.publishing:
            callback(None, None)
            return
        self._queue.append((None, 0, callback))  # type: ignore[arg-type]
        if not self._write_scheduled:
            self._schedule_write()

    @property
    def publishing(self) -> bool:
        """SENDs are queued, being written, or written and waiting for their sync."""
        return bool(self._queue or self._unsynced or self._writing or self._syncing)

    def _schedule_write(self) -> None:
        # after the current callback: the other SENDs of this read join the same write
        self._write_scheduled = True
        (self._loop or self._bind_loop()).call_soon(self._write_queued)

    def _bind_loop(self) -> asyncio.AbstractEventLoop:
        self._loop = asyncio.get_running_loop()
        return self._loop

    def _write_queued(self) -> None:
        """Write what is queued (on the loop when the ledger can take it at once, else in
        the pool, the rest of the queue waiting for that write), and start the sync."""
        self._write_scheduled = False
        while self._queue and not self._writing:
            queue = self._queue
            if len(queue) == 1 and queue[0][0].__class__ is list:  # one read's run: all of it
                self._queue = []
                batch, (entries, times, _) = queue, queue[0]  # (_take_batch's first case, inlined)
            else:
                batch, entries, times = self._take_batch()
            if not entries:  # markers only: answered after what was written before them
                self._unsynced.append((self._written_seq, batch, entries, 0, 0))
                continue
            try:
                written = self.ledger.try_write_many(entries, times)
            except BaseException as exc:  # noqa: BLE001 - every waiter must hear about it
                self._write_failed(batch, exc)
                continue
            if written is None:  # it could block: a pool thread writes, the queue waits for it
                self._writing = True
                fut = self.run_blocking(self.ledger.write_many, entries, times)
                fut.add_done_callback(functools.partial(self._written_in_pool, batch, entries))
                break
            self._written(batch, entries, *written)
        unsynced = self._unsynced
        if unsynced and unsynced[0][0] <= self.ledger.durable_seq:
            self._release(self.ledger.durable_seq)

    def _written_in_pool(self, batch: list, entries: list[bytes], fut: asyncio.Future) -> None:
        self._writing = False
        exc = fut.exception() if not fut.cancelled() else asyncio.CancelledError()
        if exc is not None:
            self._write_failed(batch, exc)
        else:
            self._written(batch, entries, *fut.result())
        self._write_queued()

    def _written(self, batch: list, entries: list[bytes], ledger_id: int, first: int, seq: int) -> None:
        """A batch is written: its receipts wait for the sync that covers ``seq``."""
        self._unsynced.append((seq, batch, entries, ledger_id, first))
        self._written_seq = seq
        if not self._syncing:
            durable = self.ledger.durable_seq
            if durable < seq:
                self._sync(seq - durable)

    def _sync(self, records: int) -> None:
        """Make what is written durable: on the loop itself when it is a few records and
        nothing else wants the loop (``try_sync_written``, ``SyncThreads.claim_inline``: no
        thread hop, the receipts leave at once), else in a sync thread (``_start_sync``)."""
        threads = self.service.sync_threads
        if records <= INLINE_SYNC_MAX_RECORDS and threads.claim_inline(self._loop or self._bind_loop()):
            self._syncing = True
            began = time.monotonic()
            try:
                durable = self.ledger.try_sync_written()
            except BaseException as exc:  # noqa: BLE001 - every waiter must hear about it
                self._sync_done(None, exc)
                return
            threads.inline_took(time.monotonic() - began)
            if durable is not None:
                self._sync_done(durable, None)
                return
            self._syncing = False
        self._start_sync()

    def _start_sync(self) -> None:
        """One pool thread syncs until nothing written is left unsynced (``_sync_in_pool``):
        while it syncs, the loop goes on writing, and the next sync covers those writes (the
        pipelined commit)."""
        self._syncing = True
        self.service.sync_threads.submit(self._sync_in_pool, self._loop or self._bind_loop())

    def _sync_in_pool(self, loop: asyncio.AbstractEventLoop) -> None:
        """In a sync thread (``sync_threads``): ``ManagedLedger.sync_written``, the loop told after each sync,
        ONE thread hop each -- a sync that left records behind through ``on_durable``
        (``_release``), the last one with the syncer's end (``_sync_done``, which releases
        too). Not through an asyncio future: its result reaches the loop a loop iteration
        later, and each hop is a wake-up of the loop, which at one or two SENDs a sync is
        much of the broker's CPU per message."""
        try:
            durable = self.ledger.sync_written(functools.partial(loop.call_soon_threadsafe, self._release))
        except BaseException as exc:  # noqa: BLE001 - the loop must hear about it
            result: tuple = (None, exc)
        else:
            result = (durable, None)
        try:
            loop.call_soon_threadsafe(self._sync_done, *result)
        except RuntimeError:  # the loop is closed: nobody is left to answer
            pass

    def _sync_done(self, durable: int | None, exc: BaseException | None) -> None:
        self._syncing = False
        if exc is None:
            self._release(durable)  # type: ignore[arg-type]
            if self._unsynced and self._unsynced[-1][0] > self.ledger.durable_seq:
                self._start_sync()  # written after the syncer's last look
            else:
                # the loop may have answered everything already (``_write_queued`` releases up
                # to the durable seq it reads): then only this sync kept the topic publishing
                if self._idle_waiters:
                    self._maybe_idle()
            return
        # the sync failed: what it did not make durable fails, in order (the ledger is fenced)
        self._release(self.ledger.durable_seq)
        err = exc if isinstance(exc, CompactMQError) else StorageError(f"append failed: {exc}")
        log.error("sync of %s failed: %s", self.name, exc)
        unsynced, self._unsynced = self._unsynced, collections.deque()
        for _, batch, entries, failed, _ in unsynced:
            for _, _, cb in batch:
                cb(None, err if entries is not None else failed)
        self.service.state.flush_writes()
        self._reload_if_fenced()
        self._maybe_idle()

    def _write_failed(self, batch: list, exc: BaseException) -> None:
        """A write failed: its batch fails in its place in the order of answers (after the
        batches written before it); a fenced ledger gets the topic reloaded."""
        err = exc if isinstance(exc, CompactMQError) else StorageError(f"append failed: {exc}")
        log.error("append to %s failed: %s", self.name, exc)
        self._unsynced.append((self._written_seq, batch, None, err, 0))  # type: ignore[arg-type]
        self._release(self.ledger.durable_seq)
        self._reload_if_fenced()

    def _release(self, durable: int) -> None:
        """Answer, in order, every written batch up to the durable seq ``durable``; then the
        receipts leave at once, the tail cache takes the entries, readers wake."""
        unsynced = self._unsynced
        if not unsynced or unsynced[0][0] > durable:
            return
        # the positions of each entry only for the tail cache, which keeps entries only while
        # a subscription reads (_cache); else the last one is all that is needed
        caching = bool(self.subscriptions)
        positions: list[Position] = []
        cached: list[bytes] = []
        last: tuple[int, int] | None = None
        while unsynced and unsynced[0][0] <= durable:
            _, batch, entries, ledger_id, first = unsynced.popleft()
            if entries is None:  # a batch whose write failed (_write_failed): ledger_id is the error
                for _, _, cb in batch:
                    cb(None, ledger_id)
                continue
            entry_id = first
            for entry, _, cb in batch:
                if entry is None:  # a marker (publish_marker)
                    cb(None, None)
                    continue
                if entry.__class__ is list:  # a run (publish_run): one callback
                    n = len(entry)
                    if caching:
                        positions += [
                            _new_tuple(Position, (ledger_id, i)) for i in range(entry_id, entry_id + n)
                        ]
                    cb(_new_tuple(Position, (ledger_id, entry_id)), None)
                    entry_id += n
                    continue
                pos = _new_tuple(Position, (ledger_id, entry_id))
                entry_id += 1
                if caching:
                    positions.append(pos)
                cb(pos, None)
            if entry_id > first:  # entries were written (a batch of markers has none)
                last = (ledger_id, entry_id - 1)
                if caching:
                    cached += entries
        if last is not None:
            self.last_position = _new_tuple(Position, last)
        self.service.state.flush_writes()  # receipts leave now, not after the next poll
        if caching or self.tail_cache.size:  # (an empty cache with nobody reading: nothing to do)
            self._cache(positions, cached)
        if last is not None:
            for listener in self.service.topics.appended_listeners:
                listener(self.name)
            self._dispatch_appended()
        if self._idle_waiters:
            self._maybe_idle()

    def _dispatch_appended(self) -> None:
        """Readers get what was just appended: each dispatcher sends from the tail cache in
        this loop turn when it can (``Dispatcher.appended``), and those MESSAGEs are written
        now, right after the receipts, instead of a loop turn or two later."""
        state = self.service.state
        state.flushing_now = True
        try:
            for sub in list(self.subscriptions.values()):
                if sub.dispatcher is not None:
                    sub.dispatcher.appended()
        finally:
            state.flushing_now = False
            state.flush_writes()

    def _maybe_idle(self) -> None:
        if self._idle_waiters and not self.publishing:
            waiters, self._idle_waiters = self._idle_waiters, []
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)

    def _reload_if_fenced(self) -> None:
        """A write or sync failed: if the ledger now refuses appends, the topic manager unloads
        this topic (``topic_ownership``)."""
        self.service.topics.unload_after_failed_write(self)

    def _cache(self, positions: list[Position], entries: list[bytes]) -> None:
        """Keep what was just appended for the subscriptions reading the tail; drop what every
        one of them has read (``entry_cache``). Nobody reading: nothing is kept."""
        cache = self.tail_cache
        subscriptions = self.subscriptions
        slowest = slowest_active_read(subscriptions.values()) if subscriptions else None
        if slowest is None:
            if len(cache):
                cache.clear()
            return
        cache.evict_before(slowest)
        if positions:
            cache.extend_columns(positions, entries)

    def _take_batch(self) -> tuple[list, list[bytes], list[int]]:
        """The next batch to write from the queue, with its entries and their publish times in
        order (markers have none; a run gives all of its own)."""
        queue = self._queue
        if len(queue) == 1:  # one read's SENDs (a modest rate): no counting
            self._queue = []
            entry, t, _ = queue[0]
            if entry is None:
                return queue, [], []
            return (queue, entry, t) if entry.__class__ is list else (queue, [entry], [t])
        n = 0  # items taken
        count = 0  # entries and markers taken
        size = 0
        for entry, _, _ in self._queue:
            if entry is None:
                n += 1
                count += 1
                continue
            if entry.__class__ is list:  # a run: taken whole (publish_run)
                k, nbytes = len(entry), sum(map(len, entry))
            else:
                k, nbytes = 1, len(entry)
            if n and (count >= MAX_APPEND_BATCH_ENTRIES or size + nbytes > MAX_APPEND_BATCH_BYTES):
                break
            n += 1
            count += k
            size += nbytes
        batch = self._queue[:n]
        del self._queue[:n]
        entries, times = _entries_of(batch)
        return batch, entries, times

    async def drain(self) -> None:
        """Wait until every queued SEND is persisted (or failed)."""
        while self.publishing:
            fut = asyncio.get_running_loop().create_future()
            self._idle_waiters.append(fut)
            await fut

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


def _entries_of(batch: list) -> tuple[list[bytes], list[int]]:
    """The entries of a batch of several items taken from the queue (``Topic._take_batch``)
    and their publish times, in order."""
    entries: list[bytes] = []
    times: list[int] = []
    for entry, t, _ in batch:
        if entry is None:
            continue
        if entry.__class__ is list:
            entries += entry
            times += t
        else:
            entries.append(entry)
            times.append(t)
    return entries, times


def _open_cursor(ledger: Any, name: str, durable: bool, initial_position: Any):
    # runs in the thread pool: the cursor and the first snapshot of it
    cursor = ledger.open_cursor(name, durable, initial_position)
    return cursor, CursorView.of(cursor, with_batch_acks=True)
