"""Non-persistent topics (``non-persistent://``, Pulsar's PIP-2): messages in memory only.

A message published on a non-persistent topic is never written anywhere. It is handed at once
to the consumers connected at that moment, one per subscription (chosen by the subscription
type's usual rule, ``selectors``), and forgotten. A consumer that has no permits left (its
client's receiver queue is full) or whose socket is backed up does not get it: the message is
*dropped* for that subscription and counted (``msgDropRate`` in the topic stats, per topic,
subscription and consumer). A consumer that connects later sees only later messages;
acknowledgements, redelivery and seek have nothing to act on.

Message ids are ``(0, n)`` with ``n`` counting the topic's messages from 0 since it was loaded
(Pulsar also answers a ledger-less id); the producer's receipt carries the same id.

A non-persistent topic exists while something uses it: it is created on first use (when
``allowAutoTopicCreation`` permits), listed by the admin API and GET_TOPICS_OF_NAMESPACE while
it has producers or subscriptions, and dropped when the last one leaves. It has no ledger, so
compaction, deduplication and read-compacted subscriptions do not apply; compaction is refused
by the admin API ("only possible on persistent topics").

``NonPersistentTopic`` reuses ``Topic`` for producers (access modes, fencing, names) and
replaces what touches storage.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Callable

from ..errors import ConsumerBusy, NotAllowed, ServiceNotReady, StorageError, TopicNotFound
from ..naming import TopicName
from ..storage.position import Position
from .dispatchers import entry_info
from .selectors import FailoverSelector, HashRingSelector, RoundRobinSelector, StickyRangeSelector
from .subscriptions import EXCLUSIVE, FAILOVER, KEY_SHARED, SHARED, SUB_TYPE_NAMES, Consumer
from .topics import Topic

if TYPE_CHECKING:  # pragma: no cover
    from .topic_ownership import TopicManager

# Rates (msgDropRate) are averaged over this window, like the broker's stats interval.
RATE_WINDOW_SECONDS = 60.0


class RateMeter:
    """Events per second over the last ``window`` seconds, kept in one-second buckets."""

    def __init__(
        self, window: float = RATE_WINDOW_SECONDS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.window = window
        self.clock = clock
        self.total = 0
        self._buckets: deque[list] = deque()  # [second, count]

    def add(self, n: int) -> None:
        self.total += n
        now = int(self.clock())
        if self._buckets and self._buckets[-1][0] == now:
            self._buckets[-1][1] += n
        else:
            self._buckets.append([now, n])
        self._trim(now)

    def _trim(self, now: float) -> None:
        while self._buckets and self._buckets[0][0] <= now - self.window:
            self._buckets.popleft()

    @property
    def rate(self) -> float:
        self._trim(self.clock())
        return sum(c for _, c in self._buckets) / self.window


class _NoDeduplication:
    """Deduplication needs a stored history; a non-persistent topic has none."""

    enabled = False

    async def load(self) -> None:
        pass

    async def refresh(self) -> None:
        pass

    async def close(self) -> None:
        pass

    def check(self, producer_name: str, last_sequence_id: int) -> str:
        return "new"

    def is_persisted(self, producer_name: str, last_sequence_id: int) -> bool:
        return True

    def failed(self, producer_name: str) -> None:
        pass

    def entry_persisted(self, position: Position) -> None:
        pass


class _LastPosition:
    """The entry source a GET_LAST_MESSAGE_ID looks at: only the last id handed out."""

    def __init__(self, topic: "NonPersistentTopic") -> None:
        self.topic = topic

    def last_position(self) -> Position | None:
        return self.topic.last_position


class NonPersistentDispatcher:
    """Hands each message to one consumer of the subscription, or drops it."""

    def __init__(self, subscription: "NonPersistentSubscription", sub_type: int, sticky: bool) -> None:
        self.subscription = subscription
        self.sub_type = sub_type
        self.sticky = sticky
        self.consumers: list[Consumer] = []
        self.pending: dict = {}  # nothing waits for an acknowledgement
        self.active: Consumer | None = None
        self._failover = FailoverSelector(subscription.topic.partition_index)
        self._round_robin: RoundRobinSelector = RoundRobinSelector()
        self._keys: Any = StickyRangeSelector() if sticky else HashRingSelector()

    def add_consumer(self, consumer: Consumer) -> None:
        if self.sub_type == KEY_SHARED:
            self._keys.add(consumer)
        self.consumers.append(consumer)
        self._pick_active()

    def remove_consumer(self, consumer: Consumer) -> None:
        if consumer in self.consumers:
            self.consumers.remove(consumer)
            if self.sub_type == KEY_SHARED:
                self._keys.remove(consumer)
        self._pick_active()

    def _pick_active(self) -> None:
        if self.sub_type not in (EXCLUSIVE, FAILOVER):
            return
        new = self._failover.active(self.consumers)
        if new is not self.active:
            self.active = new
            if self.sub_type == FAILOVER:
                for c in self.consumers:
                    c.notify_active(c is new)

    def offer(self, position: Position, entry: bytes, messages: int, key: bytes) -> None:
        if self.sub_type in (EXCLUSIVE, FAILOVER):
            consumer = self.active
        elif self.sub_type == SHARED:
            consumer = self._round_robin.select(self.consumers, Consumer.can_take)
        else:
            consumer = self._keys.select(key)
        if consumer is None or not consumer.can_take():
            self.subscription.dropped(consumer, messages)
            return
        consumer.deliver(position, entry, messages, 0, None)
        self.subscription.sent.add(messages)

    def wake(self) -> None:
        pass  # nothing is ever waiting to be read

    def close(self) -> None:
        self.consumers.clear()


class NonPersistentSubscription:
    """A subscription of a non-persistent topic: its consumers and drop counts, nothing stored."""

    durable = False

    def __init__(self, topic: "NonPersistentTopic", name: str) -> None:
        self.topic = topic
        self.name = name
        self.sub_type: int | None = None
        self.dispatcher: NonPersistentDispatcher | None = None
        self.source = _LastPosition(topic)
        self.drops = RateMeter()
        self.sent = RateMeter()

    def __repr__(self) -> str:
        return f"NonPersistentSubscription({self.topic.name}, {self.name!r})"

    @property
    def consumers(self) -> list[Consumer]:
        return self.dispatcher.consumers if self.dispatcher else []

    def add_consumer(self, consumer: Consumer, sub_type: int, key_shared_sticky: bool = False) -> None:
        if self.consumers:
            if sub_type != self.sub_type:
                # consumers are attached, so the type is set
                current = SUB_TYPE_NAMES[self.sub_type] if self.sub_type is not None else "unset"
                raise ConsumerBusy(
                    f"subscription {self.name!r} is {current}, not {SUB_TYPE_NAMES.get(sub_type, sub_type)}"
                )
            if sub_type == EXCLUSIVE:
                raise ConsumerBusy(f"exclusive consumer is already connected to subscription {self.name!r}")
        else:
            self.dispatcher = NonPersistentDispatcher(self, sub_type, key_shared_sticky)
            self.sub_type = sub_type
        self.dispatcher.add_consumer(consumer)  # type: ignore[union-attr]

    def remove_consumer(self, consumer: Consumer) -> None:
        consumer.closed = True
        if self.dispatcher is not None:
            self.dispatcher.remove_consumer(consumer)
        if not self.consumers:
            self.topic.drop_subscription(self)

    def dropped(self, consumer: Consumer | None, messages: int) -> None:
        self.drops.add(messages)
        self.topic.drops.add(messages)
        if consumer is not None:
            meter = getattr(consumer, "drops", None)
            if meter is None:
                meter = consumer.drops = RateMeter()  # type: ignore[attr-defined]
            meter.add(messages)

    # what a persistent subscription does with these; here there is nothing to act on
    def ack_individual(self, acks) -> None:
        pass

    def ack_cumulative(self, position, ack_set=None) -> None:
        pass

    def redeliver(self, consumer, positions) -> None:
        pass

    def mark_delete_position(self) -> Position:
        last = self.topic.last_position
        return last if last is not None else Position(0, -1)

    async def seek(self, position) -> None:
        raise NotAllowed(f"seek is not possible on the non-persistent topic {self.topic.name}")

    async def flush(self) -> None:
        pass

    async def close(self) -> None:
        if self.dispatcher is not None:
            self.dispatcher.close()


class NonPersistentTopic(Topic):
    def __init__(self, service: Any, name: TopicName, manager: "NonPersistentTopics") -> None:
        super().__init__(service, name, ledger=None)
        self.manager = manager
        self.dedup = _NoDeduplication()  # type: ignore[assignment]
        self.source = _LastPosition(self)  # type: ignore[assignment]
        self.drops = RateMeter()
        self.received = RateMeter()  # messages published
        self.received_bytes = RateMeter()
        self._ids = itertools.count()
        self.idle = False  # forgotten because nothing used it (not closed by the broker)

    def __repr__(self) -> str:
        return f"NonPersistentTopic({self.name})"

    # the publish callbacks run inside ``publish``, whose caller flushes nothing: receipts are
    # written with a flush of their own (``ServerConnection.write``), see ``Topic``
    flushes_after_receipts = False

    def publish(self, entry: bytes, publish_time_ms: int, callback) -> None:
        if self.closed:
            callback(None, StorageError(f"topic {self.name} is closing"))
            return
        callback(self._offer(entry), None)

    def publish_run(self, entries: list[bytes], publish_times_ms: list[int], callback) -> None:
        """As ``Topic.publish_run``: the entries get consecutive ids, one callback."""
        if self.closed:
            callback(None, StorageError(f"topic {self.name} is closing"))
            return
        first = None
        for entry in entries:
            position = self._offer(entry)
            if first is None:
                first = position
        callback(first, None)

    def _offer(self, entry: bytes) -> Position:
        """Give ``entry`` the next id and to the subscriptions' dispatchers."""
        position = Position(0, next(self._ids))
        self.last_position = position
        messages, key, _ = entry_info(entry)
        self.received.add(messages)
        self.received_bytes.add(len(entry))
        for sub in list(self.subscriptions.values()):
            if sub.dispatcher is not None:
                sub.dispatcher.offer(position, entry, messages, key)
        return position

    def publish_marker(self, callback) -> None:
        callback(None, None)

    async def save_epoch(self) -> None:
        pass  # the epoch lives as long as the topic does

    async def last_batch_index(self, position: Position) -> int:
        return -1

    async def subscribe(
        self,
        name: str,
        durable: bool,
        initial_position: Any,
        make_consumer: Callable[[Any], Consumer],
        sub_type: int,
        key_shared_sticky: bool = False,
        read_compacted: bool = False,
    ) -> Consumer:
        self._revive()
        if self.closed:
            raise StorageError(f"topic {self.name} is closing")
        if read_compacted:
            raise NotAllowed(f"read compacted is only possible on persistent topics, not {self.name}")
        if not name:
            raise NotAllowed("subscription name is empty")
        sub = self.subscriptions.get(name)
        if sub is None:
            sub = NonPersistentSubscription(self, name)
            self.subscriptions[name] = sub  # type: ignore[assignment]
        consumer = make_consumer(sub)
        try:
            sub.add_consumer(consumer, sub_type, key_shared_sticky)
        except BaseException:
            if not sub.consumers:
                self.drop_subscription(sub)
            raise
        return consumer

    def drop_subscription(self, sub: Any) -> None:
        if self.subscriptions.get(sub.name) is sub:
            del self.subscriptions[sub.name]
        self._forget_if_idle()

    async def unsubscribe(self, sub: Any) -> None:
        await sub.close()
        self.drop_subscription(sub)

    def remove_producer(self, producer) -> None:
        super().remove_producer(producer)
        self._forget_if_idle()

    def _forget_if_idle(self) -> None:
        if not self.producers and not self.subscriptions and not self._exclusive_waiters and not self.closed:
            self.closed = self.idle = True
            self.manager.forget(self)

    def _revive(self) -> None:
        """A producer or consumer that looked the topic up just before it went idle arrives now:
        the topic is in use again (unless another object took the name meanwhile)."""
        if self.idle:
            self.manager.revive(self)
            self.closed = self.idle = False

    def add_producer(self, producer) -> None:
        self._revive()
        super().add_producer(producer)

    async def close(self, disconnect_clients: bool = True) -> None:
        self.closed, self.idle = True, False
        if disconnect_clients:
            for producer in list(self.producers.values()):
                producer.connection.close_producer_by_broker(producer)
            for sub in list(self.subscriptions.values()):
                for consumer in list(sub.consumers):
                    consumer.connection.close_consumer_by_broker(consumer)
        self.manager.forget(self)


class NonPersistentTopics:
    """The broker's non-persistent topics in use, by canonical name."""

    def __init__(self, manager: "TopicManager") -> None:
        self.manager = manager
        self.active: dict[str, NonPersistentTopic] = {}

    def get(self, tn: TopicName, create: bool) -> NonPersistentTopic:
        key = str(tn)
        topic = self.active.get(key)
        if topic is not None and not topic.closed:
            return topic
        service = self.manager.service
        if service.shutting_down:
            raise StorageError("broker is shutting down")
        if not (create and service.config["allowAutoTopicCreation"]):
            raise TopicNotFound(f"topic {tn} does not exist (allowAutoTopicCreation is off)")
        topic = NonPersistentTopic(service, tn, self)
        self.active[key] = topic
        return topic

    def revive(self, topic: NonPersistentTopic) -> None:
        current = self.active.get(topic.name)
        if current is not None and current is not topic:
            raise ServiceNotReady(f"topic {topic.name} was reloaded meanwhile; retry")  # clients retry this
        self.active[topic.name] = topic

    def forget(self, topic: NonPersistentTopic) -> None:
        if self.active.get(topic.name) is topic:
            del self.active[topic.name]

    def names(self, namespace: str) -> list[str]:
        return sorted(
            name
            for name, t in self.active.items()
            if not t.closed and t.topic_name.namespace_name == namespace
        )

    async def close_all(self) -> None:
        for topic in list(self.active.values()):
            await topic.close()


def topics_of_namespace(persistent: list[str], non_persistent: list[str], mode: int) -> list[str]:
    """GET_TOPICS_OF_NAMESPACE's answer for the client's RegexSubscriptionMode (PERSISTENT 0,
    NON_PERSISTENT 1, ALL 2)."""
    if mode == 0:
        return list(persistent)
    if mode == 1:
        return list(non_persistent)
    return list(persistent) + list(non_persistent)
