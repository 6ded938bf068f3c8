"""Dispatchers: move entries from an ``EntrySource`` to the consumers of one subscription.

One dispatcher per subscription. It keeps the subscription's *read position* (the next entry
to read from the source), a *replay set* (entries to send again: negatively acknowledged,
redelivery requested, or held back for a busy Key_Shared consumer) and the *pending* map
(entry -> the consumer it was sent to and not yet acknowledged).

Delayed delivery (``deliver_at_time``, PIP-26): Shared and Key_Shared dispatchers park an
entry that is not due yet in ``delayed`` and a timer moves it to the replay set when it is;
Exclusive and Failover deliver at once (Pulsar does the same).

A dispatch pass runs as one task at a time (``wake()`` starts it or marks it dirty): replay
first, then new entries from the source, as long as some consumer can take a message (permits
left, socket writable). When the source has nothing more, the pass ends; a FLOW or an ACK
wakes the dispatcher. After each append the topic calls ``appended()`` instead: when the pass
needs no wait (no replay, nothing read ahead, the new entries in the tail cache:
``EntrySource.read_now``) it runs at once, without a task (``_pass_now``), so the MESSAGEs leave
in the loop turn of the receipts; otherwise it is a ``wake()``.

``rewind()`` / ``seek()`` bump an *epoch*: a pass that awaited a read started before the bump
drops what it read, so a seek never leaks entries from the old position. So do a change of
source (``set_source``: a read-compacted consumer joins a subscription that read the topic) and
a change of the active Exclusive/Failover consumer: a read is chosen for the consumer it was
started for (a plain consumer reads the raw topic, a read-compacted one the compacted view, and
the read is sized by its permits), so what it returns must not go to the next one.

Delivery rules per subscription type (the pure choice of a consumer lives in ``selectors``):

- ``SingleActiveDispatcher`` (Exclusive, Failover): only the active consumer gets entries, in
  order. Redelivery cannot send single entries without breaking order, so it rewinds to the
  first unacknowledged entry (Pulsar does the same; the client drops its queue first). When the
  active Failover consumer changes, the old one gets ACTIVE_CONSUMER_CHANGE(false), the new one
  (true), and dispatch rewinds so the new one starts at the first unacknowledged entry.
- ``SharedDispatcher``: round robin; redelivered entries go to whoever has permits.
- ``KeySharedDispatcher`` (module ``key_shared_dispatcher``): one consumer per key, each key
  kept in order (the rules are in that module).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from typing import TYPE_CHECKING, Callable

from ..protocol.entry_format import metadata_fields
from ..storage.position import Position
from .entry_source import MAX_ENTRIES_PER_READ, EntrySource
from .limits import PendingAcks, bit_count, unacked_limits
from .selectors import FailoverSelector, RoundRobinSelector

if TYPE_CHECKING:  # pragma: no cover
    from .subscriptions import Consumer, Subscription

log = logging.getLogger(__name__)

# A replay set this large stops reading new entries: a consumer that takes nothing cannot make
# the broker hold the whole topic in memory.
MAX_REPLAY = 10_000


def _now_ms() -> int:
    return int(time.time() * 1000)


def next_position(position: Position) -> Position:
    """The smallest position after ``position`` (storage maps it to the next real entry)."""
    return Position(position[0], position[1] + 1)


# Pulsar's sticky key of a message with neither ordering key nor partition key (Key_Shared)
NONE_KEY = b"NONE_KEY"


def entry_messages(entry: bytes) -> int:
    """Messages in an entry (its batch size, 1 when it is not a batch), from its metadata."""
    md = metadata_fields(entry)
    return md.num_messages_in_batch if md.has_num_messages_in_batch else 1


def entry_info(entry: bytes) -> tuple[int, bytes, int]:
    """(messages in the entry, sticky key, deliver-at time in ms or 0) from its metadata.

    The sticky key is Pulsar's: the ordering key, else the partition key (base64-decoded when
    the producer marked it so), else ``NONE_KEY``.
    """
    md = metadata_fields(entry)  # read off the wire: no protobuf object per dispatched entry
    n = md.num_messages_in_batch if md.has_num_messages_in_batch else 1
    if md.ordering_key is not None:
        key = md.ordering_key
    elif md.partition_key is not None:
        key = md.partition_key.encode()
        if md.partition_key_b64_encoded:
            try:
                key = base64.b64decode(key)
            except ValueError:
                pass  # not base64 after all: route on the text, as given
    else:
        key = NONE_KEY
    return n, key, (md.deliver_at_time if md.has_deliver_at_time else 0)


class _ReadAhead:
    """Entries a dispatcher read from storage ahead of its permits (``entries``), or the read
    started for them (``task``, its result is the entries or None), from ``start`` on."""

    __slots__ = ("epoch", "source", "start", "entries", "task")

    def __init__(self, epoch: int, source: EntrySource, start: Position, entries, task) -> None:
        self.epoch = epoch
        self.source = source
        self.start = start
        self.entries = entries
        self.task = task


async def _read_quietly(source: EntrySource, start: Position, subscription) -> list | None:
    """A read started ahead; None when it fails (the pass that wants it reads again and meets
    the error itself, so nothing is lost or reported twice)."""
    try:
        return await source.read(start, MAX_ENTRIES_PER_READ)
    except Exception:
        log.debug("read-ahead of %s at %s failed", subscription, start, exc_info=True)
        return None


class Dispatcher:
    """Common machinery; subclasses decide who gets an entry."""

    def __init__(self, subscription: "Subscription", source: EntrySource, read_position: Position) -> None:
        self.subscription = subscription
        self.source = source
        self.read_position = read_position
        self.consumers: list[Consumer] = []
        # entry -> consumer, counting unacknowledged messages against the limits (see ``limits``)
        self.pending: PendingAcks = PendingAcks(*self._unacked_limits(subscription), on_unblock=self.wake)
        self.replay: dict[Position, int] = {}  # position -> key hash (Key_Shared) or 0
        self.epoch = 0
        self._task: asyncio.Task | None = None
        self._dirty = False
        self._passing_now = False  # _pass_now runs (a wake meanwhile only marks it dirty)
        self.closed = False
        # delayed delivery (Shared and Key_Shared only): position -> (deliver at ms, key hash)
        self.delayed: dict[Position, tuple[int, int]] = {}
        self._delay_timer: asyncio.TimerHandle | None = None
        # entries read from storage and not sent yet, or a storage read started ahead
        self._ahead: _ReadAhead | None = None

    counts_unacked = False  # Shared and Key_Shared stop at maxUnackedMessages*, as Pulsar's do
    keeps_key_order = False  # Key_Shared: entries of a key waiting for replay hold back later ones

    def _unacked_limits(self, subscription) -> tuple[int, int]:
        config = getattr(getattr(getattr(subscription, "topic", None), "service", None), "config", None)
        return unacked_limits(config) if self.counts_unacked and config is not None else (0, 0)

    # --- consumers ---------------------------------------------------------------------------

    def add_consumer(self, consumer: "Consumer") -> None:
        self.consumers.append(consumer)

    def remove_consumer(self, consumer: "Consumer") -> None:
        """The consumer left: what it had not acknowledged is delivered again."""
        if consumer in self.consumers:
            self.consumers.remove(consumer)
        if not self.consumers:
            self._ahead = None  # nobody to read for: give the entries back
        self._reclaim(consumer, [p for p, c in self.pending.items() if c is consumer])

    def _reclaim(self, consumer: "Consumer", positions) -> None:
        for p in positions:
            if self.pending.get(p) is consumer:
                del self.pending[p]
                self.replay[p] = 0
                self.subscription.count_redelivery(p)
        self.wake()

    # --- acknowledgements and redelivery -----------------------------------------------------

    def acknowledged(self, positions) -> None:
        # one ACK command carries many positions (the client groups them): forgotten in bulk
        self.pending.forget_many(positions)
        if self.replay:
            for p in positions:
                self.replay.pop(p, None)
        if self.delayed:
            for p in positions:
                self.delayed.pop(p, None)

    def acknowledged_up_to(self, position: Position) -> None:
        for p in [p for p in self.pending if p <= position]:
            del self.pending[p]
        for p in [p for p in self.replay if p <= position]:
            del self.replay[p]
        for p in [p for p in self.delayed if p <= position]:
            del self.delayed[p]
        if self.read_position <= position:
            self.read_position = next_position(position)

    def redeliver(self, consumer: "Consumer", positions: list[Position] | None) -> None:
        if positions is None:
            positions = [p for p, c in self.pending.items() if c is consumer]
        self._reclaim(consumer, positions)

    def set_source(self, source: EntrySource) -> None:
        """Read from ``source`` from now on; a read in flight from the old one is dropped (the
        read position stays, so the new source serves it)."""
        self.source = source
        self.epoch += 1
        self._ahead = None

    def rewind(self, position: Position) -> None:
        """Restart reading at ``position``; everything pending is forgotten (it is re-read)."""
        self.epoch += 1
        self.pending.clear()
        self.replay.clear()
        self.delayed.clear()  # re-read entries are delayed again if still not due
        self.read_position = position
        self._ahead = None
        self.wake()

    # --- the dispatch pass -------------------------------------------------------------------

    def wake(self) -> None:
        if self.closed:
            return
        self._dirty = True
        if self._task is None and not self._passing_now:
            self._task = self.subscription.spawn(self._run())

    def appended(self) -> None:
        """The topic appended entries (``Topic._release``): send them now, in this loop turn,
        when that needs no wait (``_pass_now``), else ``wake`` as for any other change."""
        if self.closed:
            return
        if self._task is None and not self._passing_now:
            try:
                if self._pass_now():
                    return
            except Exception:  # an error boundary, as in the task: the topic's release and
                # the other subscriptions go on, and the task's ordinary pass tries again
                log.exception("dispatcher of %s failed", self.subscription)
        self.wake()

    def _pass_now(self) -> bool:
        """``_run`` without a task, for the common case of a consumer keeping up: no replay,
        nothing read ahead, and the new entries in memory (``EntrySource.read_now``). A task
        costs a loop turn before its first step, and its MESSAGEs another before they are
        written; at one message a sync that was most of the dispatch's cost. Returns False,
        having sent what it could, when the rest needs a wait (the task goes on from there).
        A ``wake`` during the pass (from what a delivery sets off) makes it go round again."""
        self._passing_now = True
        try:
            while True:
                if self.replay or self._ahead is not None:
                    return False
                self._dirty = False
                if not self._any_consumer_ready():
                    return not self._dirty
                want = self._read_size()
                entries = self.source.read_now(self.read_position, want)
                if entries is None:
                    return False
                if not entries:
                    return not self._dirty
                before = self.read_position
                sent = self._deliver_new(entries[:want])
                if not self._dirty and (
                    (not sent and self.read_position == before)
                    # the cache had fewer than asked for and all went: nothing is left to read
                    or (len(entries) < want and self.read_position > entries[-1][0] and not self.replay)
                ):
                    return True
        finally:
            self._passing_now = False

    def close(self) -> None:
        self.closed = True
        self.epoch += 1
        self._ahead = None
        if self._delay_timer is not None:
            self._delay_timer.cancel()
            self._delay_timer = None

    # --- delayed delivery (PIP-26: deliver_at_time) ------------------------------------------

    delays_delivery = False  # Exclusive and Failover deliver at once, as Pulsar does
    #: the wall clock deliver_at_time is compared with (ms); a test replaces it on an instance and
    #: calls ``release_due()`` after moving it, instead of waiting for the timer
    now_ms: Callable[[], int] = staticmethod(_now_ms)

    def _delay(self, position: Position, deliver_at_ms: int, h: int) -> None:
        self.delayed[position] = (deliver_at_ms, h)
        self._arm_delay_timer()

    def _arm_delay_timer(self) -> None:
        if self._delay_timer is not None:
            self._delay_timer.cancel()
            self._delay_timer = None
        if not self.delayed or self.closed:
            return
        due = min(t for t, _ in self.delayed.values())
        delay_s = max(0.0, (due - self.now_ms()) / 1000.0)
        self._delay_timer = asyncio.get_running_loop().call_later(delay_s, self.release_due)

    def release_due(self) -> None:
        """Move the delayed entries whose time has come (by ``now_ms``) to the replay set."""
        self._delay_timer = None
        now = self.now_ms()
        for p, (t, h) in list(self.delayed.items()):
            if t <= now:
                del self.delayed[p]
                self.replay[p] = h
        self._arm_delay_timer()
        self.wake()

    async def _run(self) -> None:
        try:
            while not self.closed:
                self._dirty = False
                delivered = await self._pass()
                if not delivered and not self._dirty:
                    break
        except Exception:  # an error boundary per dispatcher: log, keep the broker up
            log.exception("dispatcher of %s failed", self.subscription)
        finally:
            self._task = None

    def _can_take(self, consumer: "Consumer") -> bool:
        return consumer.can_take() and not self.pending.blocked

    def _any_consumer_ready(self) -> bool:
        return not self.pending.blocked and any(c.can_take() for c in self.consumers)

    async def _pass(self) -> int:
        """One round: replay, then new entries. Returns how many entries were sent."""
        if not self._any_consumer_ready():
            return 0
        sent = 0
        if self.replay:
            sent += await self._replay_pass()
            if not self._any_consumer_ready():
                return sent
        if len(self.replay) >= MAX_REPLAY:
            return sent
        epoch = self.epoch
        want = self._read_size()
        entries = await self._read(want)
        if epoch != self.epoch or self.closed:
            return sent + 1  # state changed under us: go round again
        if not entries:
            return sent
        before = self.read_position
        sent += self._deliver_new(entries[:want])
        self._read_ahead(entries)
        # entries skipped (acknowledged, delayed, parked for a busy Key_Shared consumer) are
        # progress too: the next read starts after them, so keep going
        return sent + (1 if self.read_position != before else 0)

    # --- read-ahead (storage reads only) -------------------------------------------------------
    #
    # A read from storage (not the tail cache) hops to the thread pool; a consumer catching up
    # would otherwise wait for that hop after every FLOW. So what a pass read and could not
    # send (no permits left) is kept, and when it sent everything a read of the next entries is
    # started at once. Both belong to the epoch and source they were read for (a seek, rewind,
    # change of source or of active consumer drops them) and start at or before the read
    # position (entries before it are skipped, so nothing is sent twice and order holds). At
    # most one read's worth (``MAX_ENTRIES_PER_READ`` / ``MAX_BYTES_PER_READ``) is held per
    # dispatcher, and only while it has consumers.

    async def _read(self, want: int) -> list:
        start = self.read_position
        ahead, self._ahead = self._ahead, None
        if (
            ahead is not None
            and ahead.epoch == self.epoch
            and ahead.source is self.source
            and ahead.start <= start
        ):
            entries = ahead.entries
            if entries is None and ahead.task is not None:
                entries = await ahead.task
                if ahead.epoch != self.epoch or self.closed:
                    return []  # the caller sees the epoch change and goes round again
            if entries:
                entries = [e for e in entries if e[0] >= start] if entries[0][0] < start else entries
                if entries:
                    return entries
        return await self.source.read(start, want)

    def _read_ahead(self, entries: list) -> None:
        source = self.source
        if self.closed or not self.consumers or not source.reads_storage(entries[0][0]):
            return
        position = self.read_position
        if entries[-1][0] >= position:  # read and not sent: keep for the next pass
            left = [e for e in entries if e[0] >= position]
            self._ahead = _ReadAhead(self.epoch, source, position, left, None)
            return
        last = source.last_position()
        if last is not None and last >= position and source.reads_storage(position):
            task = self.subscription.spawn(_read_quietly(source, position, self.subscription))
            self._ahead = _ReadAhead(self.epoch, source, position, None, task)

    def _read_size(self) -> int:
        pending = self.pending
        permits = sum(
            min(max(0, c.permits.available), pending.room(c)) for c in self.consumers if c.can_take()
        )
        return max(1, min(permits, pending.room(), MAX_ENTRIES_PER_READ))

    async def _replay_pass(self) -> int:
        sent = 0
        epoch = self.epoch
        blocked_hashes: set[int] = set()
        for position in sorted(self.replay):
            h = self.replay.get(position)
            if h is None or h in blocked_hashes:
                continue
            if self.subscription.is_acknowledged(position):
                self.replay.pop(position, None)
                continue
            entry = await self.source.read_one(position)
            if epoch != self.epoch or self.closed:
                return sent + 1
            if position not in self.replay:
                continue
            if entry is None:  # trimmed by retention meanwhile
                del self.replay[position]
                continue
            n, key, _ = entry_info(entry)  # replayed entries are due: no delay check
            consumer = self._choose(position, key)
            if consumer is None:
                if not self._any_consumer_ready():
                    break
                blocked_hashes.add(h)
                continue
            del self.replay[position]
            self._send(consumer, position, entry, n, self._hash_of(key))
            sent += 1
        return sent

    def _deliver_new(self, entries) -> int:
        """Deliver freshly read entries (Shared, Key_Shared; Exclusive/Failover override it, as
        their order forbids skipping). An entry no consumer can take now goes to the replay set;
        with ``keeps_key_order`` (Key_Shared), so does every later entry of a key hash already
        waiting there, so a key never overtakes its own past."""
        sent = 0
        waiting = set(self.replay.values()) if self.keeps_key_order else None
        horizon = self.subscription.ack_horizon()
        for position, entry in entries:
            self.read_position = next_position(position)
            if position <= horizon and self.subscription.is_acknowledged(position):
                continue
            n, key, deliver_at = entry_info(entry)
            h = self._hash_of(key)
            if deliver_at and self.delays_delivery and deliver_at > self.now_ms():
                self._delay(position, deliver_at, h)
                continue
            consumer = None if waiting is not None and h in waiting else self._choose(position, key)
            if consumer is None:
                self.replay[position] = h
                if waiting is not None:
                    waiting.add(h)
                continue
            self._send(consumer, position, entry, n, h)
            sent += 1
        return sent

    def _hash_of(self, key: bytes) -> int:
        return 0

    def _choose(self, position: Position, key: bytes) -> "Consumer | None":
        raise NotImplementedError

    def _send(
        self, consumer: "Consumer", position: Position, entry: bytes, messages: int, h: int = 0
    ) -> None:
        ack_set = self.subscription.ack_set_of(position)
        # a partly acknowledged batch counts only its messages still unacknowledged
        self.pending.add(position, consumer, min(messages, bit_count(ack_set)) if ack_set else messages)
        consumer.deliver(position, entry, messages, self.subscription.redelivery_count(position), ack_set)


class SingleActiveDispatcher(Dispatcher):
    """Exclusive and Failover: one active consumer receives everything, in order."""

    def __init__(
        self, subscription, source, read_position, partition_index: int = -1, failover: bool = False
    ):
        super().__init__(subscription, source, read_position)
        self.selector: FailoverSelector = FailoverSelector(partition_index)
        self.failover = failover
        self.active: Consumer | None = None

    def add_consumer(self, consumer) -> None:
        super().add_consumer(consumer)
        self._pick_active(newcomer=consumer)

    def remove_consumer(self, consumer) -> None:
        if consumer in self.consumers:
            self.consumers.remove(consumer)
        if not self.consumers:
            self._ahead = None  # nobody to read for: give the entries back
        had_pending = any(c is consumer for c in self.pending.values())
        if consumer is self.active:
            self.active = None
            self._pick_active()
            if had_pending:
                self.rewind(self.subscription.first_unacked_position())
        self.wake()

    def _pick_active(self, newcomer=None) -> None:
        new = self.selector.active(self.consumers)
        old = self.active
        if new is old:
            if newcomer is not None and newcomer is not new and self.failover:
                newcomer.notify_active(False)
            return
        self.active = new
        # a read in flight was made for the old active consumer (its source: raw topic or
        # compacted view; its permits): drop it, the next pass reads again for the new one
        self.epoch += 1
        if self.failover:
            if old is not None:
                old.notify_active(False)
            for c in self.consumers:
                c.notify_active(c is new)
        if old is not None and any(c is old for c in self.pending.values()):
            # the old active consumer may still hold entries: the new one starts from the
            # first unacknowledged entry, as Pulsar's failover does
            self.rewind(self.subscription.first_unacked_position())

    def redeliver(self, consumer, positions) -> None:
        # Single entries cannot be redelivered without breaking order: rewind (Pulsar does too).
        for p, c in self.pending.items():
            if c is consumer:
                self.subscription.count_redelivery(p)
        self.rewind(self.subscription.first_unacked_position())

    def _any_consumer_ready(self) -> bool:
        return self.active is not None and self.active.can_take()

    def _read_size(self) -> int:
        return max(1, min(self.active.permits.available if self.active else 1, MAX_ENTRIES_PER_READ))

    def _choose(self, position, key):
        a = self.active
        return a if a is not None and a.can_take() else None

    def _deliver_new(self, entries) -> int:
        """The entries in order to the active consumer while it has permits, as one run: the
        frames are queued together (``Consumer.deliver_many``) and the read position moves once.
        Nothing here awaits, so the consumer's state cannot change during the loop except by
        what the loop itself does (permits spent, the unacknowledged limit reached)."""
        sub = self.subscription
        horizon = sub.ack_horizon()
        consumer = self.active
        if consumer is not None and not consumer.can_take():
            consumer = None
        permits = consumer.permits.available if consumer is not None else 0
        pending = self.pending
        ack_set_of = sub.ack_set_of
        redelivery_count = sub.redelivery_count
        items: list = []
        used = messages = nbytes = 0
        last = None
        for position, entry in entries:
            if position <= horizon and sub.is_acknowledged(position):
                last = position
                continue
            if consumer is None or used >= permits or consumer.blocked_on_unacked:
                break  # keep order: resume from this entry when permits come back
            last = position
            n = entry_messages(entry)  # Exclusive/Failover ignore delays, as in Pulsar
            ack_set = ack_set_of(position)
            # a partly acknowledged batch counts only its messages still unacknowledged
            pending.add(position, consumer, min(n, bit_count(ack_set)) if ack_set else n)
            items.append((position, redelivery_count(position), ack_set, entry))
            used += n if n > 1 else 1
            messages += n
            nbytes += len(entry)
        if last is not None:
            self.read_position = next_position(last)
        if items:
            consumer.deliver_many(items, used, messages, nbytes)  # type: ignore[union-attr]
        return len(items)


class SharedDispatcher(Dispatcher):
    delays_delivery = True
    counts_unacked = True

    def __init__(self, subscription, source, read_position):
        super().__init__(subscription, source, read_position)
        self.selector: RoundRobinSelector = RoundRobinSelector()

    def _choose(self, position, key):
        return self.selector.select(self.consumers, self._can_take)
