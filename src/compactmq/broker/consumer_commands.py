"""The consumer side of a connection's commands: SUBSCRIBE to CLOSE_CONSUMER, SEEK, acks.

``ConsumerCommands`` is a part of ``handlers.CommandHandler`` (a mixin: the handler owns the
state declared below and dispatches the commands here). SUBSCRIBE creates or joins a
subscription at its initial position (``_initial_position``) and attaches a ``Consumer``
(read-compacted ones read through ``compacted_source``); FLOW, ACK and REDELIVER go to the
consumer's subscription; SEEK and GET_LAST_MESSAGE_ID answer from the ledger, or from the
compacted view for a read-compacted consumer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import ConsumerBusy, InvalidInput, NotAllowed, NotFound, ServerError
from ..naming import TopicName
from ..protocol import commands
from ..protocol import pulsar_pb2 as pb
from ..storage.position import EARLIEST, Position
from . import compacted_source, security
from .peer_liveness import evict_dead_peers
from .subscriptions import Consumer

if TYPE_CHECKING:  # pragma: no cover
    from .connection import ServerConnection


class ConsumerCommands:
    """The consumer commands of one connection (state set by ``CommandHandler``)."""

    conn: ServerConnection
    service: Any
    consumers: dict[int, Consumer]
    _creating_consumers: set[int]
    _cancelled_consumers: set[int]

    async def on_subscribe(self, cmd: pb.CommandSubscribe, frame) -> None:
        try:
            await self._create_consumer(cmd)
        finally:
            self._creating_consumers.discard(cmd.consumer_id)
            self._cancelled_consumers.discard(cmd.consumer_id)

    async def _create_consumer(self, cmd: pb.CommandSubscribe) -> None:
        await security.authorize(self.conn, "consume", cmd.topic, cmd.subscription)  # readers, TableView too
        existing = self.consumers.get(cmd.consumer_id)
        if existing is not None and not existing.closed:
            if (
                existing.subscription.topic.name == str(TopicName.parse(cmd.topic))
                and existing.subscription.name == cmd.subscription
            ):
                self.conn.send_command(commands.success(cmd.request_id))
                return
            raise InvalidInput(f"consumer id {cmd.consumer_id} is already used on this connection")
        if cmd.subType not in (0, 1, 2, 3):
            raise InvalidInput(f"unknown subscription type {cmd.subType}")
        if cmd.read_compacted and cmd.subType in (1, 3):
            raise NotAllowed("read compacted is only allowed on Exclusive and Failover subscriptions")
        create = cmd.force_topic_creation if cmd.HasField("force_topic_creation") else True
        topic = await self.service.topics.get_topic(cmd.topic, create=create)
        if cmd.HasField("schema"):
            await self.service.schemas.get_or_create(topic.name, cmd.schema, consumer=True)
        durable = cmd.durable if cmd.HasField("durable") else True
        initial = _initial_position(cmd, durable)
        sticky = cmd.HasField("keySharedMeta") and cmd.keySharedMeta.keySharedMode == pb.STICKY
        ranges = tuple((r.start, r.end) for r in cmd.keySharedMeta.hashRanges) if sticky else ()
        conn = self.conn
        existing_sub = topic.subscriptions.get(cmd.subscription)
        if existing_sub is not None and cmd.subType == 0:  # Exclusive: same reasoning as producers
            await evict_dead_peers(
                self.conn,
                (c.connection for c in list(existing_sub.consumers)),
                self.service.config["keepAliveIntervalSeconds"],
            )

        out_of_order = cmd.HasField("keySharedMeta") and cmd.keySharedMeta.allowOutOfOrderDelivery

        def make_consumer(sub) -> Consumer:
            if cmd.read_compacted:  # the subscription may exist from consumers that did not ask
                compacted_source.attach(sub)
            return Consumer(
                sub,
                conn,
                cmd.consumer_id,
                cmd.consumer_name or f"consumer-{cmd.consumer_id}",
                cmd.priority_level,
                ranges,
                bool(cmd.read_compacted),
                out_of_order,
            )

        consumer = await topic.subscribe(
            cmd.subscription,
            durable,
            initial,
            make_consumer,
            cmd.subType,
            sticky,
            read_compacted=bool(cmd.read_compacted),
        )
        if self.conn.closed or cmd.consumer_id in self._cancelled_consumers:
            consumer.subscription.remove_consumer(consumer)
            return
        self.consumers[cmd.consumer_id] = consumer
        self.conn.send_command(commands.success(cmd.request_id))
        if cmd.subType == 2:  # Failover: tell this consumer whether it is the active one
            dispatcher = consumer.subscription.dispatcher
            consumer.notify_active(getattr(dispatcher, "active", None) is consumer)

    def _consumer(self, consumer_id: int) -> Consumer:
        consumer = self.consumers.get(consumer_id)
        if consumer is None:
            raise _ConsumerNotFound(f"consumer {consumer_id} is not attached on this connection")
        return consumer

    def on_flow(self, cmd: pb.CommandFlow, frame) -> None:
        consumer = self.consumers.get(cmd.consumer_id)
        if consumer is not None:  # FLOW for a consumer closed meanwhile: nothing to do
            consumer.flow(cmd.messagePermits)

    def on_ack(self, cmd: pb.CommandAck, frame) -> None:
        consumer = self.consumers.get(cmd.consumer_id)
        if consumer is not None:
            sub = consumer.subscription
            batch_index = self.service.config.get(BATCH_INDEX_ACK_KEY, True)
            if cmd.ack_type == pb.CommandAck.Cumulative:
                if cmd.message_id:
                    mid = cmd.message_id[0]
                    position, ack_set = _position(mid), list(mid.ack_set) or None
                    if batch_index or not (ack_set and any(ack_set)):
                        sub.ack_cumulative(position, ack_set)
                    elif position.entry_id > 0:  # Pulsar: mark-delete up to the entry before the batch
                        sub.ack_cumulative(Position(position.ledger_id, position.entry_id - 1))
            else:
                acks = _individual_acks(cmd.message_id)
                if not batch_index:  # Pulsar keeps no partial batch acks then: the batch stays whole
                    acks = [(p, None) for p, ack_set in acks if not (ack_set and any(ack_set))]
                sub.ack_individual(acks)
        if cmd.HasField("request_id"):
            self.conn.send_command(commands.ack_response(cmd.consumer_id, cmd.request_id))

    def on_redeliver(self, cmd: pb.CommandRedeliverUnacknowledgedMessages, frame) -> None:
        consumer = self.consumers.get(cmd.consumer_id)
        if consumer is None:
            return
        ids = [_position(m) for m in cmd.message_ids] if cmd.message_ids else None
        consumer.subscription.redeliver(consumer, ids)

    def on_close_consumer(self, cmd: pb.CommandCloseConsumer, frame) -> None:
        consumer = self.consumers.pop(cmd.consumer_id, None)
        if consumer is not None:
            consumer.subscription.remove_consumer(consumer)
        elif cmd.consumer_id in self._creating_consumers:
            self._cancelled_consumers.add(cmd.consumer_id)
        self.conn.send_command(commands.success(cmd.request_id))

    def forget_consumer(self, consumer: Consumer) -> None:
        if self.consumers.get(consumer.consumer_id) is consumer:
            del self.consumers[consumer.consumer_id]
        consumer.subscription.remove_consumer(consumer)

    async def on_unsubscribe(self, cmd: pb.CommandUnsubscribe, frame) -> None:
        consumer = self._consumer(cmd.consumer_id)
        sub = consumer.subscription
        others = [c for c in sub.consumers if c is not consumer]
        if others:
            raise ConsumerBusy(f"subscription {sub.name!r} has {len(others)} other consumer(s) attached")
        self.consumers.pop(cmd.consumer_id, None)
        sub.remove_consumer(consumer)
        await sub.topic.unsubscribe(sub)
        self.conn.send_command(commands.success(cmd.request_id))

    async def on_seek(self, cmd: pb.CommandSeek, frame) -> None:
        consumer = self._consumer(cmd.consumer_id)
        sub = consumer.subscription
        topic = sub.topic
        if cmd.HasField("message_publish_time"):
            position = await self.service.run_blocking(
                topic.ledger.find_position_by_publish_time, cmd.message_publish_time
            )
            if position is None:  # every entry is older: the end of the topic
                last = topic.last_position
                position = Position(last[0], last[1] + 1) if last is not None else Position(0, 0)
        elif cmd.HasField("message_id"):
            mid = commands.message_id_tuple(cmd.message_id)
            if mid.ledger_id < 0 or mid.entry_id < 0:
                position = Position(-1, -1)  # earliest
            elif mid.ledger_id >= commands.INT64_MAX:
                last = topic.last_position
                position = Position(last[0], last[1] + 1) if last is not None else Position(0, 0)
            else:
                position = Position(mid.ledger_id, mid.entry_id)
        else:
            raise InvalidInput("SEEK needs a message id or a publish time")
        compacted_source.reset(sub)  # a read-compacted consumer starts over on the view in force
        await sub.seek(Position(*position))
        self.conn.send_command(commands.success(cmd.request_id))

    async def on_get_last_message_id(self, cmd: pb.CommandGetLastMessageId, frame) -> None:
        consumer = self._consumer(cmd.consumer_id)
        sub = consumer.subscription
        topic = sub.topic
        p = topic.partition_index
        source = sub.source
        if consumer.read_compacted and isinstance(source, compacted_source.CompactedEntrySource):
            # the last message this consumer can receive (batch index included): tombstones and
            # keyless messages compaction dropped at the tail must not count
            last = await source.last_message_id()
            if last is None:  # nothing to receive: entry id -1 makes has_message_available false
                last = (topic.last_message_id()[0], -1, -1)
            last_id = (last[0], last[1], p, last[2])
            md = sub.mark_delete_position()
            if last[1] >= 0 and md > (last[0], last[1]):
                # ids after the last receivable one are not in this consumer's view: a reader at
                # "latest, inclusive" compares its mark-delete with the last id (must be <=)
                md = Position(last[0], last[1])
        else:
            last_entry = source.last_position()
            if last_entry is None:
                last_entry = topic.last_message_id()
            # the id of the last *message*: inside a batch, its last index (Pulsar answers the
            # same; a client comparing (entry, -1) with a message it dequeued from that batch
            # would think the rest of the batch is not there and stop reading)
            batch_index = await topic.last_batch_index(Position(*last_entry))
            last_id = (last_entry[0], last_entry[1], p, batch_index)
            md = sub.mark_delete_position()
        self.conn.send_command(
            commands.get_last_message_id_response(
                cmd.request_id,
                last_id,
                consumer_mark_delete_position=(md[0], md[1], p),
            )
        )

    def on_consumer_stats(self, cmd: pb.CommandConsumerStats, frame) -> None:
        consumer = self._consumer(cmd.consumer_id)
        sub = consumer.subscription
        self.conn.send_command(
            commands.consumer_stats_response(
                cmd.request_id,
                consumerName=consumer.name,
                availablePermits=max(0, consumer.permits.available),
                unackedMessages=sum(1 for c in sub.dispatcher.pending.values() if c is consumer),
                address=self.conn.peer,
                type={0: "Exclusive", 1: "Shared", 2: "Failover", 3: "Key_Shared"}.get(sub.sub_type, ""),
            )
        )

    def wake_consumers(self) -> None:
        for consumer in list(self.consumers.values()):
            d = consumer.subscription.dispatcher
            if d is not None:
                d.wake()


class _ConsumerNotFound(NotFound):
    server_error = ServerError.ConsumerNotFound


#: broker.conf key: keep acknowledgements of single messages of a batch (PIP-54 ``ack_set``)
BATCH_INDEX_ACK_KEY = "acknowledgmentAtBatchIndexLevelEnabled"


def _position(mid: pb.MessageIdData) -> Position:
    return Position(commands.to_signed64(mid.ledgerId), commands.to_signed64(mid.entryId))


_INT64_MAX = 2**63 - 1
_new_tuple = tuple.__new__


def _individual_acks(message_ids) -> list[tuple[Position, list[int] | None]]:
    """(position, ack_set or None) of each id of an ACK command. The client groups up to
    thousands of individual acknowledgements in one command, so this loop is written for speed:
    a Position is built as the tuple it is (``Position(...)`` goes through a Python-level
    ``__new__``) unless an id has the sign bit set (-1: "none"), which ``_position`` reads."""
    out: list[tuple[Position, list[int] | None]] = []
    append = out.append
    for m in message_ids:
        ledger, entry = m.ledgerId, m.entryId
        if ledger <= _INT64_MAX and entry <= _INT64_MAX:
            position = _new_tuple(Position, (ledger, entry))
        else:
            position = _position(m)
        ack_set = m.ack_set
        append((position, list(ack_set) if ack_set else None))
    return out


def _initial_position(cmd: pb.CommandSubscribe, durable: bool) -> Any:
    """Where a new cursor starts: EARLIEST, "latest", or the position of its first entry.

    EARLIEST is (-1, -1) rather than storage's "earliest" (just before the first *retained*
    ledger): a read-compacted consumer at the start may be served compacted entries from
    ledgers retention already deleted, and those must not look acknowledged.

    A reader's start_message_id (L, E) delivers from entry E itself; the client drops it when
    the reader is not inclusive (Pulsar's brokers step back one entry the same way, because
    the id may point inside a batch). (-1, -1) is the earliest position, ids past the end
    (the client's "latest" is INT64_MAX) the latest.
    """
    if not durable and cmd.HasField("start_message_id"):
        m = commands.message_id_tuple(cmd.start_message_id)
        if m.ledger_id < 0 or m.entry_id < 0:
            return EARLIEST
        if m.ledger_id >= commands.INT64_MAX:
            return "latest"
        return Position(m.ledger_id, m.entry_id)
    if cmd.initialPosition == pb.CommandSubscribe.Earliest:
        return EARLIEST
    return "latest"
