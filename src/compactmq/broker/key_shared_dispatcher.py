"""The Key_Shared dispatcher: one consumer per key, each key kept in order.

A ``KeySharedDispatcher`` is a ``dispatchers.Dispatcher`` (read position, replay set, pending map,
epochs: see that module) whose choice of consumer is a function of the message's key hash:
a hash ring (``AUTO_SPLIT``) or the consumers' declared ranges (``STICKY``), from ``selectors``.
Two rules keep a key in order:

* an entry whose consumer has no permit goes to the replay set, and so does every later entry
  with the same key hash until the older ones are sent (the base ``_deliver_new`` with
  ``keeps_key_order``);
* a consumer that joins while entries are pending or waiting receives only entries older than
  its join position until everything before that position is acknowledged (``joined_at``);
  otherwise a key moved to it could overtake its own unacknowledged past. A consumer that allows
  out-of-order delivery (``allow_out_of_order``) is exempt.

The key hash of each entry sent is kept (``hashes``) so a redelivered or reclaimed entry goes
back to the replay set under its hash.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..storage.position import Position
from .dispatchers import Dispatcher
from .selectors import HashRingSelector, StickyRangeSelector, key_hash

if TYPE_CHECKING:  # pragma: no cover
    from .subscriptions import Consumer


class KeySharedDispatcher(Dispatcher):
    delays_delivery = True
    counts_unacked = True
    keeps_key_order = True  # the base ``_deliver_new`` holds back later entries of a waiting key

    def __init__(self, subscription, source, read_position, sticky: bool = False):
        super().__init__(subscription, source, read_position)
        self.sticky = sticky
        self.selector: StickyRangeSelector | HashRingSelector = (
            StickyRangeSelector() if sticky else HashRingSelector()
        )
        # consumer -> position it joined at, while older entries are still unacknowledged
        self.joined_at: dict[Consumer, Position] = {}
        self.hashes: dict[Position, int] = {}  # key hash of each pending entry

    def add_consumer(self, consumer) -> None:
        self.selector.add(consumer)  # raises ConsumerAssignError before anything changes
        super().add_consumer(consumer)
        if (self.pending or self.replay) and not getattr(consumer, "allow_out_of_order", False):
            self.joined_at[consumer] = self.read_position

    def remove_consumer(self, consumer) -> None:
        self.selector.remove(consumer)
        self.joined_at.pop(consumer, None)
        super().remove_consumer(consumer)

    def _release_joined(self) -> None:
        if not self.joined_at:
            return
        oldest = min(list(self.pending) + list(self.replay), default=None)
        for consumer, at in list(self.joined_at.items()):
            if oldest is None or oldest >= at:
                del self.joined_at[consumer]
                self.wake()

    def _hash_of(self, key: bytes) -> int:
        return key_hash(key)

    def _choose(self, position, key):
        consumer = self.selector.select(key)
        if consumer is None or not self._can_take(consumer):
            return None
        at = self.joined_at.get(consumer)
        if at is not None and position >= at:
            return None
        return consumer

    def _send(self, consumer, position, entry, messages, h=0) -> None:
        self.hashes[position] = h
        super()._send(consumer, position, entry, messages)

    def acknowledged(self, positions) -> None:
        positions = list(positions)
        for p in positions:
            self.hashes.pop(p, None)
        if not self.hashes:
            self.hashes = {}  # an emptied dict gives its table back
        super().acknowledged(positions)
        self._release_joined()

    def acknowledged_up_to(self, position) -> None:
        for p in [p for p in self.hashes if p <= position]:
            del self.hashes[p]
        super().acknowledged_up_to(position)
        self._release_joined()

    def rewind(self, position) -> None:
        self.hashes.clear()
        super().rewind(position)

    def _reclaim(self, consumer, positions) -> None:
        for p in positions:
            if self.pending.get(p) is consumer:
                del self.pending[p]
                self.replay[p] = self.hashes.pop(p, 0)
                self.subscription.count_redelivery(p)
        self.wake()
