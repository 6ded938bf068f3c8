"""Pulsar's broker limits on producers, consumers and unacknowledged messages.

Counts of clients (0 = no limit), checked when one attaches, refused with Pulsar's errors:

* ``maxProducersPerTopic``: ProducerBusy, "Topic reached max producers limit";
* ``maxConsumersPerTopic``: ConsumerBusy, "Topic reached max consumers limit";
* ``maxConsumersPerSubscription``: ConsumerBusy, "Subscription reached max consumers limit".

Unacknowledged messages, for Shared and Key_Shared subscriptions (Exclusive and Failover
redeliver by rewinding, so Pulsar does not count there either):

* ``maxUnackedMessagesPerConsumer`` (default 50,000): a consumer holding that many messages it
  has not acknowledged gets nothing more until its count falls to half the limit;
* ``maxUnackedMessagesPerSubscription`` (default 200,000): the same for the whole subscription,
  whose dispatcher stops until the count falls below half.

Messages are counted, not entries: a batch entry counts as the messages it holds, and it may
take a consumer past its limit (a batch is never split), as on Pulsar. Batch-index
acknowledgements give their messages back at once (Pulsar's count does the same), so a batch
partly acknowledged counts only the messages still unacknowledged. The counts live in
``PendingAcks``, the dispatcher's map of entries sent and not yet acknowledged, so every way an
entry leaves it (acknowledgement, redelivery, a consumer leaving, a rewind) gives its messages
back.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from ..config import int_setting
from ..errors import ConsumerBusy, ProducerBusy

UNLIMITED = 1 << 62


def check_producers(config: Mapping[str, Any], topic_name: str, attached: int) -> None:
    limit = int_setting(config, "maxProducersPerTopic")
    if limit > 0 and attached >= limit:
        raise ProducerBusy(f"Topic '{topic_name}' reached max producers limit")


def check_consumers(config: Mapping[str, Any], topic_consumers: int, subscription_consumers: int) -> None:
    per_topic = int_setting(config, "maxConsumersPerTopic")
    if per_topic > 0 and topic_consumers >= per_topic:
        raise ConsumerBusy("Topic reached max consumers limit")
    per_sub = int_setting(config, "maxConsumersPerSubscription")
    if per_sub > 0 and subscription_consumers >= per_sub:
        raise ConsumerBusy("Subscription reached max consumers limit")


def unacked_limits(config: Mapping[str, Any]) -> tuple[int, int]:
    """(per consumer, per subscription) from the broker settings; 0 means no limit. A key that is
    not set reads its declared default, Pulsar's 50,000 and 200,000 (not 0)."""
    return (
        int_setting(config, "maxUnackedMessagesPerConsumer"),
        int_setting(config, "maxUnackedMessagesPerSubscription"),
    )


def bit_count(ack_set: list[int]) -> int:
    """Set bits of an ack set (64-bit words, possibly signed as they come off the wire)."""
    return sum(bin(w & 0xFFFFFFFFFFFFFFFF).count("1") for w in ack_set)


_MISSING = object()


class PendingAcks(dict):
    """position -> consumer for entries sent and not yet acknowledged, counting messages.

    ``add`` records a sent entry; removing it in any way (``del``, ``pop``, ``clear``) gives its
    messages back. ``on_unblock`` is called when a consumer or the subscription may receive
    again (the dispatcher wakes up). With both limits 0 nothing is ever blocked. Consumers carry
    ``unacked_messages`` and ``blocked_on_unacked`` (``subscriptions.Consumer``).

    This runs twice per dispatched entry, so it is written for speed: ``counts`` only holds
    entries of more than one message (a batch); every other entry counts one.
    """

    def __init__(
        self, per_consumer: int = 0, per_subscription: int = 0, on_unblock: Callable[[], None] | None = None
    ) -> None:
        super().__init__()
        self.per_consumer = per_consumer
        self.per_subscription = per_subscription
        self.on_unblock = on_unblock
        self.counts: dict[Any, int] = {}  # position -> messages, for entries of more than one
        self.total = 0
        self.blocked = False  # the subscription's dispatcher is stopped

    def add(self, position: Any, consumer: Any, messages: int) -> None:
        if position in self:
            self._forget(position)
        dict.__setitem__(self, position, consumer)
        if messages > 1:
            self.counts[position] = messages
        else:
            messages = 1
        total = self.total = self.total + messages
        unacked = consumer.unacked_messages = consumer.unacked_messages + messages
        if self.per_consumer and unacked >= self.per_consumer:
            consumer.blocked_on_unacked = True
        if self.per_subscription and total >= self.per_subscription:
            self.blocked = True

    def room(self, consumer: Any = None) -> int:
        """Messages that may still be sent (to ``consumer``, and to the subscription)."""
        room = UNLIMITED
        if self.per_subscription > 0:
            room = max(0, self.per_subscription - self.total)
        if consumer is not None and self.per_consumer > 0:
            room = min(room, max(0, self.per_consumer - consumer.unacked_messages))
        return room

    def shrink(self, position: Any, remaining: int) -> None:
        """A batch entry was partly acknowledged (batch-index ack): ``remaining`` of its
        messages are still unacknowledged. The entry stays pending with at least one."""
        if position not in self:
            return
        current = self.counts.get(position, 1)
        n = current - max(1, remaining)
        if n <= 0:
            return
        self.counts[position] = current - n
        self.total -= n
        consumer = dict.__getitem__(self, position)
        self._give_back(consumer, n)

    def _forget(self, position: Any) -> Any:
        consumer = dict.pop(self, position)
        n = self.counts.pop(position, 1) if self.counts else 1
        self.total -= n
        if not dict.__len__(self):
            # a dict keeps the table its largest size needed; an emptied one gives it back
            # (a caught-up subscription would hold ~50 KiB per 1,000 entries it once had pending)
            dict.clear(self)
            self.counts.clear()
        self._give_back(consumer, n)
        return consumer

    def _give_back(self, consumer: Any, n: int) -> None:
        unacked = consumer.unacked_messages - n
        consumer.unacked_messages = unacked if unacked > 0 else 0
        woke = False
        if consumer.blocked_on_unacked and unacked <= self.per_consumer // 2:
            consumer.blocked_on_unacked = False
            woke = True
        if self.blocked and self.total < self.per_subscription // 2:
            self.blocked = False
            woke = True
        if woke and self.on_unblock is not None:
            self.on_unblock()

    def forget_many(self, positions: Any) -> None:
        """``pop(p, None)`` for each of ``positions``, giving messages back once per consumer
        (an ACK command of a thousand positions wakes the dispatcher at most once)."""
        given: dict[Any, int] = {}
        counts = self.counts
        pop = dict.pop
        missing = _MISSING
        removed = 0
        for position in positions:
            consumer = pop(self, position, missing)
            if consumer is missing:
                continue
            n = counts.pop(position, 1) if counts else 1
            removed += n
            given[consumer] = given.get(consumer, 0) + n
        if not given:
            return
        self.total -= removed
        if not dict.__len__(self):
            dict.clear(self)  # give the table back, as ``_forget`` does
            counts.clear()
        for consumer, n in given.items():
            self._give_back(consumer, n)

    def __setitem__(self, position: Any, consumer: Any) -> None:
        self.add(position, consumer, 1)

    def __delitem__(self, position: Any) -> None:
        if position not in self:
            raise KeyError(position)
        self._forget(position)

    def pop(self, position: Any, *default: Any) -> Any:
        if position in self:
            return self._forget(position)
        if default:
            return default[0]
        raise KeyError(position)

    def clear(self) -> None:
        for position in list(self):
            self._forget(position)
