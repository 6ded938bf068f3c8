"""The read-compacted ``EntrySource``: a topic's compacted view as one consumer sees it.

A compacted view is the compacted ledger (surviving entries, original ids, ids <= horizon)
followed by the live topic after the horizon. ``CompactedEntrySource`` serves it to the
dispatcher of one subscription:

* below or at the horizon, entries come from the compacted ledger: a binary search finds the
  first id >= the read position; then reading continues from the live topic right after the
  horizon, so there is no gap and no duplicate (ids only grow);
* a batch with ``compacted_out`` placeholders is delivered with an ``ack_set`` that clears their
  bits (the official client hands them to the application as empty messages otherwise): the
  source records that bitset as the entry's "not yet acknowledged" set in the subscription, so
  the dispatcher sends it, partial acknowledgements are ANDed into it, and the placeholders
  count as acknowledged when the consumer acknowledges the survivors. Placeholders at the end
  of a batch are cut off before delivery (see ``for_delivery``).

Which view a consumer reads
---------------------------
A consumer *pins* the view in force when it first reads at or below that view's horizon, and
keeps it until it has read past that horizon; from then on it reads the live topic only, even
when newer compactions land. Reads at or below the horizon (a rewind for redelivery after a
reconnect) keep coming from the pinned view until the subscription has acknowledged up to the
horizon; then the view is released. That is what makes "a view switch never loses a delete" hold: a
newer view no longer holds the tombstones of keys the consumer already saw, the live topic
after the old horizon still does. A consumer that first reads above every horizon (or before
any compaction) reads the live topic from then on. A SEEK starts over: the next read pins the
view in force then.

Keeping an old view readable: views come from the topic's ``TopicCompactionService`` (the
configured factory's; the broker never opens compacted data itself). ``open_view()`` returns a
handle that keeps its view readable until it is dropped, even after the compactor (in this
process or a ``compact-topic`` process) committed a newer view and deleted the old one's
storage. So a consumer that pinned a view keeps reading it until it passes its horizon, and the
data goes when the last source that holds the handle lets go.

Durable subscriptions store the id and horizon of their pinned view (or that they read the
topic itself) in a cursor property. After a broker restart the old file may be gone: a
subscription that was part-way through a view that is no longer the one in force resumes from
the live topic (which still holds every tombstone), not from the newer view; one that read the
topic itself keeps doing so. Readers are not durable; a reader that reconnects with the same
subscription name within ``PIN_MEMORY_SECONDS`` gets its pinned view back.

The broker learns of new compactions from the metadata store (the compactor may be another
process): the compaction state is read whenever a consumer has no pinned view yet.

Retention (``topicCompactionRetentionMode``): every read goes through the compaction layer's
``RetentionFilter``: in ``retention-bounded`` mode compacted entries below the topic's first
retained entry are not served; in ``keep-until-tombstone`` mode a consumer at the start of the
topic reads the compacted view from its first entry. The topic's mode is cached for
``SETTINGS_TTL_SECONDS`` (by the broker's clock); the first retained entry is read live.
"""

from __future__ import annotations

import logging
import weakref
from typing import TYPE_CHECKING, Callable, Optional

from ..compaction import RETENTION_BOUNDED, CommittedView, RetentionFilter, TopicCompactionService
from ..errors import StorageError
from ..protocol import batch as batch_codec
from ..protocol import entry_format
from ..protocol import pulsar_pb2 as pb
from ..storage.position import Position
from .entry_source import Entry, EntrySource

if TYPE_CHECKING:  # pragma: no cover
    from .subscriptions import Subscription
    from .topics import Topic

log = logging.getLogger(__name__)

#: cursor property holding [ledger id, horizon ledger, horizon entry] of the pinned view, or
#: ``LIVE_PIN`` for a subscription that reads the topic itself
PIN_PROPERTY = "compactmq.compactedView"
LIVE_PIN = "live"
#: how long a dropped (non-durable) subscription's pinned view is remembered for a reconnect
PIN_MEMORY_SECONDS = 300.0
#: how long the retention mode of a topic is cached
SETTINGS_TTL_SECONDS = 2.0
#: entries of a compacted view read at a time while filling a read (see ``within_budget``)
READ_CHUNK = 16


def last_message(view: CommittedView) -> Optional[tuple[int, int, int]]:
    """(ledger, entry, batch index) of the last message a consumer receives from ``view``."""
    last = view.last()
    if last is None:
        return None
    pos, entry = last
    return (pos[0], pos[1], last_batch_index(entry))


def delivery_mask(entry: bytes) -> Optional[list[int]]:
    """The ack_set that hides the ``compacted_out`` records of a batch entry (None: no such record)."""
    metadata, payload = entry_format.parse_entry(entry, verify_checksum=False)
    if not batch_codec.is_batch(metadata):
        return None
    items = batch_codec.decode_batch(metadata, payload)
    return batch_codec.delivery_ack_set(items)


def for_delivery(entry: bytes) -> tuple[bytes, Optional[list[int]]]:
    """A compacted entry as it goes to a consumer, and its delivery bitset (None: none needed).

    Placeholders at the *end* of a batch are cut off (the survivors keep their indexes): the
    official client acknowledges a batch only once every index of it is acknowledged, and it
    never delivers a placeholder, so a cumulative ack on the last survivor could otherwise
    never complete the batch (the consumer would get it again after a reconnect).
    Placeholders before a survivor stay, hidden by the bitset.
    """
    metadata, payload = entry_format.parse_entry(entry, verify_checksum=False)
    if not batch_codec.is_batch(metadata) or metadata.encryption_keys:
        return entry, None
    items = batch_codec.decode_batch(metadata, payload)
    keep = len(items)
    while keep > 1 and items[keep - 1].meta.compacted_out:
        keep -= 1
    if keep < len(items):
        items = items[:keep]
        trimmed = pb.MessageMetadata()
        trimmed.CopyFrom(metadata)
        entry = entry_format.build_entry(trimmed, batch_codec.encode_batch_payload(trimmed, items))
    return entry, batch_codec.delivery_ack_set(items)


def prepare_for_delivery(entries: list[Entry]) -> tuple[list[Entry], dict]:
    """``for_delivery`` over entries: (entries to send, position -> delivery bitset)."""
    out: list[Entry] = []
    masks = {}
    for position, entry in entries:
        try:
            entry, mask = for_delivery(entry)
        except Exception:  # a damaged entry is the client's to report, not ours
            log.exception("cannot read the batch at %s", position)
            mask = None
        out.append((position, entry))
        if mask is not None:
            masks[position] = mask
    return out, masks


def last_batch_index(entry: bytes) -> int:
    """Batch index of the last message of ``entry`` that a consumer receives (-1: not a batch)."""
    metadata, payload = entry_format.parse_entry(entry, verify_checksum=False)
    if not batch_codec.is_batch(metadata):
        return -1
    items = batch_codec.decode_batch(metadata, payload)
    for i in range(len(items) - 1, -1, -1):
        if not items[i].meta.compacted_out:
            return i
    return -1


def message_count(entry: bytes) -> int:
    """Messages an entry holds (batch records, placeholders included: what the dispatcher
    charges against a consumer's permits for it)."""
    try:
        md = entry_format.parse_metadata(entry)
    except Exception:  # a damaged entry is the client's to report (see prepare_for_delivery)
        return 1
    return batch_codec.message_count(md)


def within_budget(view: CommittedView, begin: Position, n: int) -> list[Entry]:
    """Entries of ``view`` from ``begin`` until they hold ``n`` messages (at least one entry,
    at most ``n`` entries), read ``READ_CHUNK`` entries at a time.

    The dispatcher asks for as many *entries* as its consumers have *permits* (messages), and
    keeps only what they can take: with batches of a thousand messages and a receiver queue of
    a thousand, it sends one entry of a read of 500. Every entry read here is decoded for
    delivery (``prepare_for_delivery``), so reading and decoding 500 to send one made a read of
    a big compacted view quadratic (a Spark task through the broker read 300 k messages at
    1.3 k/s). Counting messages keeps the work per read to what can be delivered.
    """
    out: list[Entry] = []
    messages = 0
    while len(out) < n:
        chunk = view.read(begin, min(READ_CHUNK, n - len(out)))
        for position, entry in chunk:
            out.append((position, entry))
            messages += message_count(entry)
            if messages >= n:
                return out
        if not chunk:
            return out  # the view ends (at its horizon) before the budget
        last = chunk[-1][0]
        begin = Position(last[0], last[1] + 1)
    return out


class TopicViews:
    """The compacted view in force for one topic, asked of the topic's compaction service
    (shared by the topic's read-compacted subscriptions), plus pins remembered for reconnecting
    readers. ``clock`` (monotonic seconds) is the broker's, so tests can move time."""

    def __init__(self, topic: "Topic") -> None:
        self.topic = topic
        self.clock: Callable[[], float] = topic.service.clock
        self._service: Optional[TopicCompactionService] = None
        self._mode: Optional[str] = None
        self._mode_at = 0.0
        self._pins: dict[str, tuple[float, object]] = {}

    @property
    def service(self) -> TopicCompactionService:
        """The topic's ``TopicCompactionService`` (from the compaction monitor's factory)."""
        if self._service is None:
            self._service = self.topic.service.compaction_monitor.service_of(self.topic.name)
        return self._service

    # --- the view in force (blocking: run in the thread pool) ------------------------------

    def current_blocking(self) -> Optional[CommittedView]:
        return self.service.open_view()

    def open_blocking(self, view_id: int, horizon: Position) -> Optional[CommittedView]:
        """A specific view (a durable subscription's pin after a restart), None when gone."""
        try:
            return self.service.open_view(view_id, horizon)
        except StorageError:
            return None

    def retention_blocking(self) -> RetentionFilter:
        """The topic's retention filter: its mode (cached), the first retained entry (live)."""
        now = self.clock()
        if self._mode is None or now - self._mode_at > SETTINGS_TTL_SECONDS:
            try:
                self._mode = self.service.retention_filter().mode
            except Exception:  # a bad policy must not stop reads: default mode
                log.exception("reading compaction settings of %s failed", self.topic.name)
                self._mode = RETENTION_BOUNDED
            self._mode_at = now
        return RetentionFilter(self._mode, self.topic.ledger.first_position())

    @property
    def keep_mode(self) -> bool:
        """keep-until-tombstone (as last read; settings are read in the thread pool)."""
        return self._mode is not None and self._mode != RETENTION_BOUNDED

    def pin_candidate_blocking(self, start: Position) -> Optional[CommittedView]:
        """The view in force if a consumer reading from ``start`` should pin it."""
        view = self.current_blocking()
        if view is not None and (start <= view.horizon or self.retention_blocking().at_beginning(start)):
            return view
        return None

    def read_blocking(
        self, view: CommittedView, start: Position, n: int, progress: bool = False
    ) -> list[Entry]:
        """Entries of ``view`` >= ``start`` that retention lets a consumer see, as many as hold
        about ``n`` messages (see ``within_budget``). ``progress``: ``start`` continues what this
        consumer read from the view (not a start or a rewind)."""
        begin = self.retention_blocking().start(start, progress)
        if begin is None or begin > view.horizon:
            return []
        return within_budget(view, begin, n)

    def read_with_masks_blocking(
        self, view: CommittedView, start: Position, n: int, progress: bool = False
    ) -> tuple[list[Entry], dict]:
        """``read_blocking`` plus the delivery bitset of each batch with placeholders (decoding
        batches is CPU work: it stays off the event loop)."""
        return prepare_for_delivery(self.read_blocking(view, start, n, progress))

    def last_message_blocking(self, view: CommittedView) -> Optional[tuple[int, int, int]]:
        last = last_message(view)
        if last is None or not self.retention_blocking().visible((last[0], last[1])):
            return None
        return last

    # --- pins of subscriptions that went away ----------------------------------------------

    def remember(self, name: str, pin) -> None:
        now = self.clock()
        self._pins = {k: v for k, v in self._pins.items() if now - v[0] < PIN_MEMORY_SECONDS}
        self._pins[name] = (now, pin)

    def recall(self, name: str):
        item = self._pins.pop(name, None)
        if item is None or self.clock() - item[0] >= PIN_MEMORY_SECONDS:
            return None
        return item[1]


_views: "weakref.WeakKeyDictionary[Topic, TopicViews]" = weakref.WeakKeyDictionary()


def views_of(topic: "Topic") -> TopicViews:
    views = _views.get(topic)
    if views is None:
        views = _views[topic] = TopicViews(topic)
    return views


class CompactedEntrySource(EntrySource):
    """The compacted view for one subscription (see the module notes)."""

    def __init__(
        self,
        topic: "Topic",
        live: EntrySource | None = None,
        subscription: "Subscription | None" = None,
        late: bool = False,
    ) -> None:
        self.topic = topic
        self.live = live if live is not None else topic.source
        self.views = views_of(topic)
        self._run: Callable = topic.run_blocking
        self._subscription = subscription
        self.view: Optional[CommittedView] = None  # the pinned view
        self.on_live = False  # pins no new view: it passed its view, or started on the topic
        self.floor: Optional[Position] = None  # reads of the topic start here (a released view)
        self.floor_last: Optional[tuple] = None  # last message of the released view
        self._returned: Optional[tuple[Position, Position]] = None  # span of the last view read
        self._restored = False
        self._late = late  # the subscription read the topic itself before this source

    @property
    def subscription(self) -> "Subscription":
        """The subscription reading through this source (the topic builds the source before
        the subscription, so it is found on first use)."""
        sub = self._subscription
        if sub is None:
            for candidate in list(self.topic.subscriptions.values()):
                if candidate.source is self:
                    self._subscription = sub = candidate
                    break
            else:
                raise StorageError(f"{self.topic.name}: compacted source used by no subscription")
        return sub

    def __repr__(self) -> str:
        return f"CompactedEntrySource({self.subscription!r}, view={self.view}, live={self.on_live})"

    # --- who wants the compacted view ------------------------------------------------------

    def wanted(self) -> bool:
        dispatcher = self.subscription.dispatcher
        if dispatcher is None:
            return True
        active = getattr(dispatcher, "active", None)
        if active is not None:
            return bool(active.read_compacted)
        consumers = dispatcher.consumers
        return not consumers or any(c.read_compacted for c in consumers)

    # --- choosing the view -----------------------------------------------------------------

    async def _restore(self) -> None:
        """First use: a pin kept by a durable cursor or by a reader that reconnects."""
        self._restored = True
        pin = self.views.recall(self.subscription.name)
        if pin is not None:
            self.view, self.on_live, self.floor, self.floor_last = pin
            return
        if not self.subscription.durable:
            if self._late:
                await self._check_progress()
            return
        stored = self.subscription.cursor.properties.get(PIN_PROPERTY)
        if not stored:
            if self._late:
                await self._check_progress()
            return
        if stored == LIVE_PIN:
            self.on_live = True
            return
        try:
            view_id, h_ledger, h_entry = (int(x) for x in stored)
        except (TypeError, ValueError):
            return
        horizon = Position(h_ledger, h_entry)
        start = self.subscription.first_unacked_position()
        if start > horizon:
            # it had read its whole view
            self.on_live, self.floor = True, Position(horizon[0], horizon[1] + 1)
            return
        view = await self._run(self.views.open_blocking, view_id, horizon)
        if view is not None:
            self.view = view
        else:
            # part-way through a view whose file is gone: the live topic still has every
            # tombstone after this position, a newer view would not
            log.info("%s: compacted view %s is gone; resuming from the topic", self.subscription, view_id)
            self.on_live = True

    async def _check_progress(self) -> None:
        """A subscription that has already consumed part of the raw topic keeps reading the topic:
        a compacted view would lack the tombstones of keys it has seen."""
        first = await self._run(self.topic.ledger.first_position)
        if first is not None and self.subscription.mark_delete_position() >= first:
            self._went_live()

    async def _view_for(self, start: Position) -> Optional[CommittedView]:
        if not self._restored:
            await self._restore()
        if self.view is not None or self.on_live:
            return self.view
        view = await self._run(self.views.pin_candidate_blocking, start)
        if view is not None:
            self.view = view
            if self.subscription.durable:
                self.topic.spawn(self._store_pin(view))
            else:
                self._remember()
        return self.view

    async def _store_pin(self, view: Optional[CommittedView]) -> None:
        value = LIVE_PIN if view is None else [view.view_id, view.horizon[0], view.horizon[1]]
        try:
            await self._run(self.subscription.cursor.set_property, PIN_PROPERTY, value)
        except Exception:  # best effort: only matters across a restart
            log.exception("storing the compacted view of %s failed", self.subscription)

    def reset(self) -> None:
        """A SEEK: the next read pins the view in force then."""
        self.view = None
        self.on_live = False
        self.floor = self.floor_last = None
        self._returned = None
        self._restored = True

    def _went_live(self) -> None:
        if not self.on_live:
            self.on_live = True
            if self.subscription.durable and self.view is None:
                # it reads the topic itself: after a restart it must not switch to a view
                self.topic.spawn(self._store_pin(None))
            self._remember()

    def _release(self, view: CommittedView) -> None:
        """Everything of ``view`` is acknowledged: no rewind can need it again."""
        self.view = None
        self.on_live = True
        self.floor = Position(view.horizon[0], view.horizon[1] + 1)
        self.floor_last = last_message(view)
        self._remember()

    def _remember(self) -> None:
        """Readers are not durable: remember the pin for one that reconnects (same name)."""
        if not self.subscription.durable:
            self.views.remember(
                self.subscription.name, (self.view, self.on_live, self.floor, self.floor_last)
            )

    # --- EntrySource -----------------------------------------------------------------------

    async def read(self, start: Position, max_entries: int) -> list[Entry]:
        if not self.wanted():
            return await self.live.read(start, max_entries)
        view = await self._view_for(start)
        if view is not None and self.on_live and self.subscription.mark_delete_position() >= view.horizon:
            # read past and acknowledged (a cursor cannot sit below retention, so "acknowledged"
            # alone would release a view a keep-until-tombstone reader has not read yet)
            self._release(view)
            view = None
        if view is not None:
            # the pinned view serves every read at or below its horizon (a rewind included)
            if start <= view.horizon or self.views.keep_mode:
                span = self._returned
                progress = span is not None and span[0] <= start <= span[1]
                entries, masks = await self._run(
                    self.views.read_with_masks_blocking, view, start, max_entries, progress
                )
                if entries:
                    last = entries[-1][0]
                    self._returned = (entries[0][0], Position(last[0], last[1] + 1))
                    self._mark_placeholders(masks)
                    return entries
            # past the view: the topic after its horizon, and no newer view, for good
            self._went_live()
            start = max(start, Position(view.horizon[0], view.horizon[1] + 1))
        elif self.floor is not None:
            start = max(start, self.floor)
        entries = await self.live.read(start, max_entries)
        if entries and view is None:
            self._went_live()
        return entries

    async def read_one(self, position: Position) -> bytes | None:
        view = self.view
        if view is not None and position <= view.horizon and self.wanted():
            entry = await self._run(view.get, position)
            if entry is not None:
                prepared, masks = prepare_for_delivery([(position, entry)])
                entry = prepared[0][1]
                self._mark_placeholders(masks)
            return entry
        return await self.live.read_one(position)

    def last_position(self) -> Position | None:
        """Synchronous best effort (the live topic's); see ``last_message_id`` for the answer
        GET_LAST_MESSAGE_ID gives a read-compacted consumer."""
        return self.live.last_position()

    async def last_message_id(self) -> Optional[tuple[int, int, int]]:
        """(ledger, entry, batch index) of the last message this consumer can receive; None
        when it can receive none (the caller answers ``entry_id = -1`` then)."""
        if not self._restored:
            await self._restore()
        view = self.view
        if view is None and not self.on_live:
            view = await self._run(self.views.current_blocking)
        topic_last = self.topic.last_position
        if view is None and self.floor is not None and (topic_last is None or topic_last < self.floor):
            return self.floor_last  # nothing after the released view yet
        if view is None or (topic_last is not None and topic_last > view.horizon):
            if topic_last is None:
                return None
            entry = await self.live.read_one(topic_last)
            index = last_batch_index(entry) if entry is not None else -1
            return (topic_last[0], topic_last[1], index)
        return await self._run(self.views.last_message_blocking, view)

    # --- batches with placeholders ---------------------------------------------------------

    def _mark_placeholders(self, masks: dict) -> None:
        """Record the delivery bitset of compacted batches as their not-yet-acknowledged set."""
        remaining = self.subscription.batch_remaining
        for position, mask in masks.items():
            current = remaining.get(position)
            if current is None:
                remaining[position] = mask
            else:
                remaining[position] = [a & b for a, b in zip(current, mask)]


def attach(subscription: "Subscription") -> CompactedEntrySource:
    """Make an existing ``subscription`` read compacted (a read-compacted consumer joins one that
    was created without it; idempotent). Its dispatcher follows. If it has already consumed part
    of the topic it keeps reading the topic (see ``_check_progress``)."""
    source = subscription.source
    if isinstance(source, CompactedEntrySource):
        return source
    source = CompactedEntrySource(subscription.topic, subscription=subscription, late=True)
    subscription.source = source
    if subscription.dispatcher is not None:
        # drops a raw read still in flight for a plain consumer that has left: it must not
        # reach the read-compacted consumer
        subscription.dispatcher.set_source(source)
    return source


def factory(topic: "Topic") -> CompactedEntrySource:
    """``BrokerService.compacted_source_factory``: the source of a new read-compacted
    subscription of ``topic``."""
    return CompactedEntrySource(topic)


def reset(subscription: "Subscription") -> None:
    """A SEEK on ``subscription``: forget its pinned view."""
    source = subscription.source
    if isinstance(source, CompactedEntrySource):
        source.reset()
