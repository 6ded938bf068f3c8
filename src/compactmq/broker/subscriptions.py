"""Subscriptions and their consumers.

A ``Subscription`` is a named cursor on a topic plus the consumers attached to it and one
dispatcher (chosen by the subscription type when the first consumer arrives; it can change
type only while no consumer is attached, as in Pulsar). Durable subscriptions keep their
cursor in the metadata store; non-durable ones (readers) live only while a consumer is
attached.

Acknowledgements are applied to the broker's view at once (so nothing acknowledged is sent
again) and written to the cursor in the thread pool, coalesced: while one write runs, the next
ones pile up and go together. ``close()`` waits for the last write, so a clean shutdown loses
no acknowledgement. The event loop never calls the cursor (its lock may be held by a thread
writing SQLite): it reads a ``CursorView``, a snapshot taken in the pool after each write,
plus the acknowledgements not yet written.

Batch-index acknowledgements (``ack_set``: a bitset whose set bits are the messages of a batch
*not yet* acknowledged) are kept here per entry, and in a cursor property so a restart keeps
them; an entry whose set becomes empty is acknowledged as a whole. A redelivered batch carries
its remaining set so the client skips the acknowledged messages.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import logging
import time
from typing import TYPE_CHECKING, Any

from ..errors import ConsumerBusy
from ..storage.position import Position
from .dispatchers import Dispatcher, SharedDispatcher, SingleActiveDispatcher, next_position
from .entry_source import EntrySource
from .key_shared_dispatcher import KeySharedDispatcher
from .flow import PermitWindow
from .limits import bit_count

if TYPE_CHECKING:  # pragma: no cover
    from .topics import Topic

log = logging.getLogger(__name__)

EXCLUSIVE, SHARED, FAILOVER, KEY_SHARED = 0, 1, 2, 3
SUB_TYPE_NAMES = {EXCLUSIVE: "Exclusive", SHARED: "Shared", FAILOVER: "Failover", KEY_SHARED: "Key_Shared"}

_serials = itertools.count()


# Cursor property holding the batch-index acknowledgements: {"ledger:entry": [ack_set words]}.
BATCH_ACKS_PROPERTY = "batchIndexAcks"


class CursorView:
    """A snapshot of a cursor (mark-delete position, individually acknowledged ranges and the
    stored batch-index acknowledgements), taken in the thread pool, read on the event loop."""

    __slots__ = ("mark_delete", "starts", "ends", "batch_acks")

    def __init__(self, mark_delete: Position, ranges=(), batch_acks=None) -> None:
        self.mark_delete = Position(*mark_delete)
        self.starts = [Position(*a) for a, _ in ranges]
        self.ends = [Position(*b) for _, b in ranges]
        self.batch_acks: dict[Position, list[int]] = dict(batch_acks or {})

    @classmethod
    def of(cls, cursor: Any, with_batch_acks: bool = False) -> "CursorView":
        """Blocking: call in the thread pool."""
        batch = None
        if with_batch_acks:
            stored = (getattr(cursor, "properties", None) or {}).get(BATCH_ACKS_PROPERTY) or {}
            batch = {Position.parse(k): list(v) for k, v in stored.items()}
        return cls(cursor.mark_delete_position, cursor.individually_acked_ranges(), batch)

    def is_acknowledged(self, position: Position) -> bool:
        if position <= self.mark_delete:
            return True
        i = bisect.bisect_right(self.starts, position) - 1
        return i >= 0 and position <= self.ends[i]

    @property
    def horizon(self) -> Position:
        return self.ends[-1] if self.ends and self.ends[-1] > self.mark_delete else self.mark_delete


class Consumer:
    """One consumer of a subscription, on one client connection."""

    def __init__(
        self,
        subscription: "Subscription",
        connection: Any,
        consumer_id: int,
        name: str,
        priority_level: int = 0,
        hash_ranges: tuple[tuple[int, int], ...] = (),
        read_compacted: bool = False,
        allow_out_of_order: bool = False,
    ) -> None:
        self.subscription = subscription
        # Key_Shared: the consumer accepts keys out of order, so it need not wait when joining
        self.allow_out_of_order = allow_out_of_order
        self.connection = connection
        self.consumer_id = consumer_id
        self.name = name
        self.priority_level = priority_level
        self.hash_ranges = hash_ranges
        self.read_compacted = read_compacted
        self.serial = next(_serials)
        self.permits = PermitWindow()
        self.closed = False
        self.messages_out = 0
        self.bytes_out = 0  # entry bytes sent (``pulsar_out_bytes_total``, ``bytesOutCounter``)
        # messages sent and not acknowledged, and whether that reached the limit (``limits``)
        self.unacked_messages = 0
        self.blocked_on_unacked = False

    def __repr__(self) -> str:
        return f"Consumer({self.name!r}, id={self.consumer_id}, sub={self.subscription.name!r})"

    def can_take(self) -> bool:
        return (
            self.permits.available > 0
            and not self.closed
            and self.connection.writable
            and not self.blocked_on_unacked
        )

    def flow(self, permits: int) -> None:
        self.permits.grant(permits)
        self.subscription.dispatcher.wake()

    def deliver(
        self,
        position: Position,
        entry: bytes,
        messages: int,
        redelivery_count: int,
        ack_set: list[int] | None,
    ) -> None:
        self.permits.consume(messages)
        self.messages_out += messages
        self.bytes_out += len(entry)
        self.connection.send_message(
            self.consumer_id,
            position,
            self.subscription.topic.partition_index,
            redelivery_count,
            ack_set,
            entry,
        )

    def deliver_many(self, items: list, permits: int, messages: int, nbytes: int) -> None:
        """``deliver`` for a run of entries ((position, redelivery count, ack_set, entry)) that
        cost ``permits`` permits (as ``PermitWindow.consume`` counts them) and hold ``messages``
        messages and ``nbytes`` bytes: one call and one queued write for a permit window."""
        self.permits.available -= permits
        self.messages_out += messages
        self.bytes_out += nbytes
        self.connection.send_messages(self.consumer_id, self.subscription.topic.partition_index, items)

    def notify_active(self, is_active: bool) -> None:
        if not self.closed:
            self.connection.send_active_consumer_change(self.consumer_id, is_active)


class Subscription:
    def __init__(
        self,
        topic: "Topic",
        name: str,
        cursor: Any,
        durable: bool,
        source: EntrySource | None = None,
        view: CursorView | None = None,
    ) -> None:
        self.topic = topic
        self.name = name
        self.cursor = cursor
        # what the loop knows of the cursor; refreshed from the pool after every write
        self.view = view if view is not None else CursorView.of(cursor, with_batch_acks=True)
        self.durable = durable
        self.source = source or topic.source
        self.sub_type: int | None = None
        self.dispatcher: Dispatcher | None = None
        self.redeliveries: dict[Position, int] = {}
        # partly acknowledged batches: position -> ack_set (set bits: messages not yet acked)
        self.batch_remaining: dict[Position, list[int]] = dict(self.view.batch_acks)
        # the ones clients acknowledged (kept in the cursor, so a restart keeps them too)
        self._batch_acked: set[Position] = set(self.view.batch_acks)
        self._batch_dirty = False
        # acknowledgements not yet written to the cursor
        self._acked: set[Position] = set()
        self._acked_up_to: Position | None = None
        self._flush_task: asyncio.Task | None = None
        self._keep_on_empty = False  # a seek disconnects consumers; a reader comes back

    def __repr__(self) -> str:
        return f"Subscription({self.topic.name}, {self.name!r})"

    @property
    def consumers(self) -> list[Consumer]:
        return self.dispatcher.consumers if self.dispatcher else []

    def spawn(self, coro) -> asyncio.Task:
        return self.topic.spawn(coro)

    # --- consumers ---------------------------------------------------------------------------

    def add_consumer(self, consumer: Consumer, sub_type: int, key_shared_sticky: bool = False) -> None:
        if self.dispatcher is not None and self.dispatcher.consumers:
            if sub_type != self.sub_type:
                # consumers are attached, so the type is set
                current = SUB_TYPE_NAMES[self.sub_type] if self.sub_type is not None else "unset"
                raise ConsumerBusy(
                    f"subscription {self.name!r} is {current}, not {SUB_TYPE_NAMES.get(sub_type, sub_type)}"
                )
            if sub_type == EXCLUSIVE:
                raise ConsumerBusy(f"exclusive consumer is already connected to subscription {self.name!r}")
        if (
            self.dispatcher is None
            or self.sub_type != sub_type
            or (
                sub_type == KEY_SHARED
                and not self.dispatcher.consumers
                and getattr(self.dispatcher, "sticky", None) != key_shared_sticky
            )
        ):
            start = self.dispatcher.read_position if self.dispatcher else self.first_unacked_position()
            if self.dispatcher is not None:
                self.dispatcher.close()
            self.dispatcher = self._make_dispatcher(sub_type, start, key_shared_sticky)
            self.sub_type = sub_type
        self.dispatcher.add_consumer(consumer)
        self._keep_on_empty = False

    def _make_dispatcher(self, sub_type: int, start: Position, sticky: bool) -> Dispatcher:
        if sub_type == SHARED:
            return SharedDispatcher(self, self.source, start)
        if sub_type == KEY_SHARED:
            return KeySharedDispatcher(self, self.source, start, sticky=sticky)
        return SingleActiveDispatcher(
            self, self.source, start, self.topic.partition_index, failover=(sub_type == FAILOVER)
        )

    def remove_consumer(self, consumer: Consumer) -> None:
        consumer.closed = True
        self.topic.last_active = time.monotonic()  # the inactive-topic clock starts now
        if self.dispatcher is not None:
            self.dispatcher.remove_consumer(consumer)
        if not self.consumers and not self.durable and not self._keep_on_empty:
            self.topic.drop_subscription(self)

    # --- acknowledgements --------------------------------------------------------------------

    def is_acknowledged(self, position: Position) -> bool:
        if position in self._acked:
            return True
        if self._acked_up_to is not None and position <= self._acked_up_to:
            return True
        return self.view.is_acknowledged(position)

    def ack_horizon(self) -> Position:
        """The highest position that may be acknowledged: entries after it need no check."""
        horizon = self.view.horizon
        if self._acked:
            horizon = max(horizon, max(self._acked))
        if self._acked_up_to is not None and self._acked_up_to > horizon:
            horizon = self._acked_up_to
        return horizon

    def mark_delete_position(self) -> Position:
        md = self.view.mark_delete
        if self._acked_up_to is not None and self._acked_up_to > md:
            return self._acked_up_to
        return md

    def first_unacked_position(self) -> Position:
        return next_position(self.mark_delete_position())

    def ack_individual(self, acks: list[tuple[Position, list[int] | None]]) -> None:
        if not self.batch_remaining and not self._batch_acked:
            # the common case: no batch partly acknowledged, and none of these ids is a batch
            # index ack, so every position is acknowledged whole (the loop below would agree)
            whole = [position for position, ack_set in acks if not ack_set]
            if len(whole) == len(acks):
                if whole:
                    self._ack_whole(whole)
                return
        whole = []
        for position, ack_set in acks:
            if ack_set:
                remaining = self.batch_remaining.get(position)
                merged = (
                    list(ack_set)
                    if remaining is None
                    else [a & b for a, b in itertools.zip_longest(remaining, ack_set, fillvalue=0)]
                )
                if any(merged):
                    self.batch_remaining[position] = merged
                    self._batch_acked.add(position)
                    self._batch_dirty = True
                    if self.dispatcher is not None:
                        self.dispatcher.pending.shrink(position, bit_count(merged))
                    continue
            self.batch_remaining.pop(position, None)
            if position in self._batch_acked:
                self._batch_acked.discard(position)
                self._batch_dirty = True
            whole.append(position)
        if not whole:
            if self._batch_dirty:
                self._schedule_flush()
            return
        self._ack_whole(whole)

    def _ack_whole(self, whole: list[Position]) -> None:
        self._acked.update(whole)
        if self.redeliveries:
            for p in whole:
                self.redeliveries.pop(p, None)
        if self.dispatcher is not None:
            self.dispatcher.acknowledged(whole)
        self._schedule_flush()

    def ack_cumulative(self, position: Position, ack_set: list[int] | None = None) -> None:
        if ack_set and any(ack_set):
            # the batch at `position` is acknowledged up to a batch index: the entries
            # before it completely, this one partly
            self.batch_remaining[position] = list(ack_set)
            self._batch_acked.add(position)
            self._batch_dirty = True
            if position[1] == 0:
                self._schedule_flush()
                return
            position = Position(position[0], position[1] - 1)
        if self._acked_up_to is not None and position <= self._acked_up_to:
            return
        self._acked_up_to = position
        for p in [p for p in self.redeliveries if p <= position]:
            del self.redeliveries[p]
        for p in [p for p in self.batch_remaining if p <= position]:
            del self.batch_remaining[p]
            if p in self._batch_acked:
                self._batch_acked.discard(p)
                self._batch_dirty = True
        if self.dispatcher is not None:
            self.dispatcher.acknowledged_up_to(position)
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        if self._flush_task is None:
            self._flush_task = self.spawn(self._flush())

    async def _flush(self) -> None:
        try:
            while self._acked or self._acked_up_to is not None or self._batch_dirty:
                individual = sorted(self._acked)
                up_to = self._acked_up_to
                batch = None
                if self._batch_dirty:
                    self._batch_dirty = False
                    batch = {
                        str(p): self.batch_remaining[p]
                        for p in self._batch_acked
                        if p in self.batch_remaining
                    }
                try:
                    self.view = await self.topic.run_blocking(self._write_acks, individual, up_to, batch)
                except Exception:
                    log.exception("writing acknowledgements of %s failed; will retry", self)
                    if batch is not None:
                        self._batch_dirty = True
                    await asyncio.sleep(1.0)
                    continue
                self._acked.difference_update(individual)
                if not self._acked:
                    self._acked = set()  # a set keeps the table of its largest size: give it back
                if self._acked_up_to == up_to:
                    self._acked_up_to = None
        finally:
            self._flush_task = None

    def _write_acks(
        self, individual: list[Position], up_to: Position | None, batch: dict[str, list[int]] | None = None
    ) -> CursorView:
        # runs in the thread pool
        if up_to is not None:
            self.cursor.ack_cumulative(up_to)
        if individual:
            self.cursor.ack_individual(individual)
        if batch is not None:
            self.cursor.set_property(BATCH_ACKS_PROPERTY, batch)
        return CursorView.of(self.cursor)

    def _reset_cursor(self, position: Position) -> CursorView:
        # runs in the thread pool
        self.cursor.reset(position)
        return CursorView.of(self.cursor)

    async def flush(self) -> None:
        """Wait until every acknowledgement so far is written to the cursor."""
        while self._flush_task is not None:
            await asyncio.shield(self._flush_task)

    # --- redelivery bookkeeping (used by dispatchers) ------------------------------------

    def redelivery_count(self, position: Position) -> int:
        return self.redeliveries.get(position, 0)

    def count_redelivery(self, position: Position) -> None:
        self.redeliveries[position] = self.redeliveries.get(position, 0) + 1

    def ack_set_of(self, position: Position) -> list[int] | None:
        return self.batch_remaining.get(position)

    def redeliver(self, consumer: Consumer, positions: list[Position] | None) -> None:
        if self.dispatcher is not None:
            self.dispatcher.redeliver(consumer, positions)

    # --- seek --------------------------------------------------------------------------------

    async def seek(self, position: Position) -> None:
        """Reset the subscription so that ``position`` is the next entry delivered.

        Pulsar's order: the attached consumers are disconnected first (CLOSE_CONSUMER; the
        client clears its queue and subscribes again), then the cursor moves.
        """
        self._keep_on_empty = True
        for consumer in list(self.consumers):
            consumer.connection.close_consumer_by_broker(consumer)
        await self.flush()
        self._acked.clear()
        self._acked_up_to = None
        self.redeliveries.clear()
        self.batch_remaining.clear()
        if self._batch_acked:
            self._batch_acked.clear()
            self._batch_dirty = True
        self.view = await self.topic.run_blocking(self._reset_cursor, position)
        if self._batch_dirty:
            self._schedule_flush()  # forget the stored batch-index acks too
        if self.dispatcher is not None:
            self.dispatcher.rewind(position)

    async def close(self) -> None:
        await self.flush()
        if self.dispatcher is not None:
            self.dispatcher.close()
