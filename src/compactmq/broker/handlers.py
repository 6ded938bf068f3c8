"""What the broker does with each client command of one connection.

``CommandHandler.handle(frame)`` looks the command type up in ``_HANDLERS``. Quick commands
(SEND, FLOW, ACK, PING, ...) run inline, in arrival order. Commands that wait for storage or
for a topic to load (PRODUCER, SUBSCRIBE, LOOKUP, SEEK, ...) run as tasks registered with the
server state, so one slow topic never stalls the other producers and consumers sharing the
connection (the official client multiplexes them all on one socket).

Every command has its own error boundary: a ``CompactMQError`` becomes the wire answer that
command expects (ERROR with its ServerError code, SEND_ERROR, a *_RESPONSE with an error
field); anything else is logged and answered UnknownError. The connection stays up; only
framing errors close it (see ``connection``).
"""

from __future__ import annotations

import itertools
import logging
import time
from typing import TYPE_CHECKING, Any

from ..errors import (
    CompactMQError,
    ConsumerBusy,
    InvalidInput,
    NotAllowed,
    NotFound,
    ServerError,
)
from ..naming import TopicName
from ..protocol import commands, frames, wire
from ..protocol import pulsar_pb2 as pb
from ..storage.position import EARLIEST, Position
from . import compacted_source, security
from .lookup import lookup_topic
from .nonpersistent import topics_of_namespace
from .producers import MustWait, Producer
from .subscriptions import Consumer

if TYPE_CHECKING:  # pragma: no cover
    from .connection import ServerConnection

log = logging.getLogger(__name__)

T = pb.BaseCommand.Type

_producer_names = itertools.count()

# How long a connection holding a producer name or an exclusive subscription may take to answer
# a PING before a newcomer that claims the same is given it (Pulsar checks liveness the same way).
LIVENESS_TIMEOUT_SECONDS = 5.0


class CommandHandler:
    def __init__(self, connection: "ServerConnection") -> None:
        self.conn = connection
        self.service = connection.service
        self.producers: dict[int, Producer] = {}
        self.consumers: dict[int, Consumer] = {}
        self.protocol_version = 0
        # ids whose PRODUCER / SUBSCRIBE is still running: a CLOSE for one of them (the client
        # gave up waiting) cancels it when it completes instead of leaking a producer/consumer
        self._creating_producers: set[int] = set()
        self._creating_consumers: set[int] = set()
        self._cancelled_producers: set[int] = set()
        self._cancelled_consumers: set[int] = set()
        self.client_version = ""

    # --- dispatch and error boundary ---------------------------------------------------------

    def handle(self, frame: "frames.Frame | frames.SendFrame") -> None:
        if frame.__class__ is frames.SendFrame:  # the hot path: a plain SEND read off the wire
            try:
                self.on_send(frame.send, frame)  # type: ignore[union-attr]
            except Exception as exc:  # noqa: BLE001 - error boundary of one command
                self._answer_error(frame, frame.send, exc)  # type: ignore[union-attr]
            return
        command = frame.command
        ctype = command.type
        entry = _HANDLERS.get(ctype)
        if entry is None:
            self._unsupported(frame)
            return
        method, is_async, field = entry
        body = getattr(command, field)  # the command inside the envelope (frame.body(), inlined)
        if is_async:
            # marked before the task starts, so a CLOSE right behind it finds the creation
            if ctype == T.SUBSCRIBE:
                self._creating_consumers.add(body.consumer_id)
            elif ctype == T.PRODUCER:
                self._creating_producers.add(body.producer_id)
            self.service.state.spawn(self._guarded(method, body, frame))
            return
        try:
            method(self, body, frame)
        except Exception as exc:  # noqa: BLE001 - error boundary of one command
            self._answer_error(frame, body, exc)

    async def _guarded(self, method, body, frame) -> None:
        try:
            await method(self, body, frame)
        except Exception as exc:  # noqa: BLE001 - error boundary of one command
            self._answer_error(frame, body, exc)

    def _answer_error(self, frame, body, exc: BaseException) -> None:
        if isinstance(exc, CompactMQError):
            code, text = exc.server_error, str(exc) or type(exc).__name__
            log.info("%s from %s failed: %s", frame.type_name, self.conn.peer, text)
        else:
            code, text = ServerError.UnknownError, f"internal error: {type(exc).__name__}: {exc}"
            log.exception("%s from %s failed", frame.type_name, self.conn.peer)
        t = frame.type
        if t == T.SEND:
            self.conn.send_command(commands.send_error(body.producer_id, body.sequence_id, code, text))
        elif t == T.LOOKUP:
            self.conn.send_command(commands.lookup_error(body.request_id, code, text))
        elif t == T.PARTITIONED_METADATA:
            self.conn.send_command(commands.partitioned_metadata_error(body.request_id, code, text))
        elif t == T.GET_SCHEMA:
            self.conn.send_command(
                commands.get_schema_response(body.request_id, server_error=code, message=text)
            )
        elif t == T.GET_OR_CREATE_SCHEMA:
            self.conn.send_command(
                commands.get_or_create_schema_response(body.request_id, server_error=code, message=text)
            )
        elif t == T.ACK:
            if body.HasField("request_id"):
                self.conn.send_command(commands.ack_response(body.consumer_id, body.request_id, code, text))
        elif t == T.CONSUMER_STATS:
            self.conn.send_command(commands.consumer_stats_error(body.request_id, code, text))
        elif hasattr(body, "request_id"):
            self.conn.send_command(commands.error(body.request_id, code, text))
        # FLOW, REDELIVER, PING...: no answer exists on the wire; logged above

    def _unsupported(self, frame) -> None:
        body = frame.body()
        text = f"{frame.type_name} is not supported by compactmq"
        if frame.type == T.TC_CLIENT_CONNECT_REQUEST:
            self.conn.send_command(
                commands.tc_client_connect_response(body.request_id, ServerError.NotAllowedError, text)
            )
        elif hasattr(body, "request_id"):
            self.conn.send_command(commands.error(body.request_id, ServerError.NotAllowedError, text))
        else:
            log.info("ignoring %s from %s", frame.type_name, self.conn.peer)

    # --- connection --------------------------------------------------------------------------

    def on_connect(self, cmd: pb.CommandConnect, frame) -> None:
        self.client_version = cmd.client_version
        self.protocol_version = commands.negotiated_version(cmd.protocol_version)
        security.connect(self.conn, cmd, self._connected)

    def _connected(self, principal) -> None:
        self.conn.principal = principal
        self.conn.state.send(T.CONNECTED)
        self.conn.handshake_done()  # full-size frames from now on, no handshake deadline
        flags = None
        if self.conn.principal is not security.UNAUTHENTICATED:
            flags = pb.FeatureFlags(supports_auth_refresh=True)  # the broker can AUTH_CHALLENGE
        self.conn.send_command(
            commands.connected(
                self.protocol_version,
                max_message_size=self.service.config["maxMessageSize"],
                feature_flags=flags,
            )
        )

    def on_auth_response(self, cmd: pb.CommandAuthResponse, frame) -> None:
        security.on_auth_response(self.conn, cmd)

    def on_ping(self, cmd, frame) -> None:
        self.conn.send_command(commands.pong())

    def on_pong(self, cmd, frame) -> None:
        pass  # last_seen was updated when the bytes arrived

    async def on_partitioned_metadata(self, cmd: pb.CommandPartitionedTopicMetadata, frame) -> None:
        await security.authorize(self.conn, "lookup", cmd.topic)
        auto = cmd.metadata_auto_creation_enabled if cmd.HasField("metadata_auto_creation_enabled") else True
        n = await self.service.topics.partitions(cmd.topic, auto_create=auto)
        self.conn.send_command(commands.partitioned_metadata_response(cmd.request_id, n))

    async def on_lookup(self, cmd: pb.CommandLookupTopic, frame) -> None:
        # InvalidTopicName, no permission, namespace not found, unknown listener -> a Failed lookup
        TopicName.parse(cmd.topic)
        await security.authorize(self.conn, "lookup", cmd.topic)
        # both URLs: a client picks brokerServiceUrlTls when its own service URL is pulsar+ssl://
        answer = await lookup_topic(
            self.service, cmd.topic, cmd.advertised_listener_name or None, cmd.authoritative
        )
        self.conn.send_command(
            commands.lookup_response(
                cmd.request_id,
                answer.broker_url,
                broker_service_url_tls=answer.broker_url_tls or None,
                authoritative=answer.authoritative,
                redirect=answer.redirect,
            )
        )

    async def on_get_topics_of_namespace(self, cmd: pb.CommandGetTopicsOfNamespace, frame) -> None:
        await security.authorize_namespace(self.conn, cmd.namespace)
        persistent = await self.service.run_blocking(
            self.service.storage.topic_metadata.topics, cmd.namespace
        )
        # the client's RegexSubscriptionMode: persistent only (default), non-persistent only, all
        topics = topics_of_namespace(
            persistent, self.service.topics.non_persistent.names(cmd.namespace), cmd.mode
        )
        self.conn.send_command(commands.get_topics_of_namespace_response(cmd.request_id, topics))

    # --- producers ---------------------------------------------------------------------------

    async def on_producer(self, cmd: pb.CommandProducer, frame) -> None:
        try:
            await self._create_producer(cmd)
        finally:
            self._creating_producers.discard(cmd.producer_id)
            self._cancelled_producers.discard(cmd.producer_id)

    async def _create_producer(self, cmd: pb.CommandProducer) -> None:
        await security.authorize(self.conn, "produce", cmd.topic)
        existing = self.producers.get(cmd.producer_id)
        if existing is not None and not existing.closed:
            if existing.topic.name == str(TopicName.parse(cmd.topic)):
                # the client retried a request that already succeeded: same answer again
                self.conn.send_command(
                    commands.producer_success(
                        cmd.request_id,
                        existing.name,
                        last_sequence_id=existing.topic.last_sequence_ids.get(existing.name, -1),
                        schema_version=existing.schema_version,
                    )
                )
                return
            raise InvalidInput(f"producer id {cmd.producer_id} is already used on this connection")
        topic = await self.service.topics.get_topic(cmd.topic, create=True)
        await topic.dedup.refresh()  # a policy set since the topic loaded applies from now on
        schema_version = await self.service.schemas.get_or_create(
            topic.name, cmd.schema if cmd.HasField("schema") else None
        )
        if cmd.HasField("producer_name") and cmd.producer_name:
            name = cmd.producer_name
        else:
            name = f"{self.service.cluster_name}-{self.service.instance_id}-{next(_producer_names)}"
        producer = Producer(topic, self.conn, cmd.producer_id, name, cmd.producer_access_mode, schema_version)
        if cmd.HasField("topic_epoch"):  # a reconnecting exclusive producer: the epoch it was given
            producer.topic_epoch = cmd.topic_epoch
        # a producer of that name (or an exclusive one) on another connection may be a client
        # that reconnected before the broker noticed its old socket died: check, evict if dead
        await self._evict_dead_peers(
            p.connection
            for p in list(topic.producers.values())
            if p.name == name or p.exclusive or producer.exclusive
        )
        if self.conn.closed or cmd.producer_id in self._cancelled_producers:
            return
        try:
            topic.add_producer(producer)
        except MustWait:
            # WaitForExclusive: "queued" now, a ready PRODUCER_SUCCESS when the topic is free
            self.producers[cmd.producer_id] = producer
            self.conn.send_command(
                commands.producer_success(
                    cmd.request_id, name, schema_version=schema_version, producer_ready=False
                )
            )
            try:
                await topic.wait_for_exclusive(producer)
            except BaseException:
                if self.producers.get(cmd.producer_id) is producer:
                    del self.producers[cmd.producer_id]
                raise
            if producer.closed or self.conn.closed:
                topic.remove_producer(producer)
                return
        self.producers[cmd.producer_id] = producer
        if producer.exclusive:
            await topic.save_epoch()
        self.conn.send_command(
            commands.producer_success(
                cmd.request_id,
                name,
                last_sequence_id=topic.last_sequence_ids.get(name, -1),
                schema_version=schema_version,
                topic_epoch=producer.topic_epoch if producer.exclusive else None,
            )
        )

    def on_send(self, cmd: "pb.CommandSend | wire.SendCommand", frame) -> None:
        producer = self.producers.get(cmd.producer_id)
        if producer is None or producer.closed:
            raise NotAllowed(f"producer {cmd.producer_id} is not attached on this connection")
        # ChecksumError, MalformedEntry (undecodable metadata) -> SEND_ERROR, stay up
        entry, publish_time = frames.checksummed_with_publish_time(frame.entry)
        publish_time = publish_time or int(time.time() * 1000)
        num = cmd.num_messages  # default 1
        sequence_id = cmd.sequence_id
        highest = cmd.highest_sequence_id or None  # 0 = not sent
        last_seq = highest if highest is not None else sequence_id + max(num, 1) - 1
        topic = producer.topic
        dedup = topic.dedup
        if dedup.enabled and dedup.check(producer.name, last_seq) != "new":
            self._answer_duplicate(producer, sequence_id, highest, last_seq)
            return
        size = len(entry)
        self.conn.reads.add(size)
        producer.messages_in += num
        producer.bytes_in += size
        topic.publish(
            entry, publish_time, _PendingReceipt(self.conn, producer, sequence_id, highest, last_seq, size)
        )

    def _answer_duplicate(
        self, producer: Producer, sequence_id: int, highest: int | None, last_seq: int
    ) -> None:
        """A message deduplication recognised: a receipt with -1:-1 (Pulsar's answer) once
        every earlier SEND of the topic is answered; a SEND_ERROR if the original failed."""
        conn, topic = self.conn, producer.topic

        def answer(position, exc) -> None:
            if topic.dedup.is_persisted(producer.name, last_seq):
                conn.send_command(
                    commands.send_receipt(
                        producer.producer_id,
                        sequence_id,
                        -1,
                        -1,
                        partition=topic.partition_index,
                        highest_sequence_id=highest,
                    )
                )
            else:
                conn.send_command(
                    commands.send_error(
                        producer.producer_id,
                        sequence_id,
                        ServerError.PersistenceError,
                        "the message this one duplicates was not persisted; send it again",
                    )
                )

        topic.publish_marker(answer)

    def on_close_producer(self, cmd: pb.CommandCloseProducer, frame) -> None:
        producer = self.producers.pop(cmd.producer_id, None)
        if producer is not None:
            producer.topic.remove_producer(producer)
        elif cmd.producer_id in self._creating_producers:
            self._cancelled_producers.add(cmd.producer_id)
        self.conn.send_command(commands.success(cmd.request_id))

    def forget_producer(self, producer: Producer) -> None:
        if self.producers.get(producer.producer_id) is producer:
            del self.producers[producer.producer_id]
        producer.topic.remove_producer(producer)

    # --- consumers ---------------------------------------------------------------------------

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
            await self._evict_dead_peers(c.connection for c in list(existing_sub.consumers))

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

    async def _evict_dead_peers(self, connections) -> None:
        timeout = min(LIVENESS_TIMEOUT_SECONDS, max(1, self.service.config["keepAliveIntervalSeconds"]))
        for conn in {c for c in connections if c is not self.conn and not c.closed}:
            if not await conn.is_alive(timeout):
                log.info("evicting %s: no answer to a liveness PING within %ss", conn.peer, timeout)
                conn.abort()

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
                acks = [(_position(m), list(m.ack_set) or None) for m in cmd.message_id]
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
            last = source.last_position()
            if last is None:
                last = topic.last_message_id()
            # the id of the last *message*: inside a batch, its last index (Pulsar answers the
            # same; a client comparing (entry, -1) with a message it dequeued from that batch
            # would think the rest of the batch is not there and stop reading)
            last_id = (last[0], last[1], p, await topic.last_batch_index(Position(*last)))
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

    # --- schemas -----------------------------------------------------------------------------

    async def on_get_schema(self, cmd: pb.CommandGetSchema, frame) -> None:
        await security.authorize(self.conn, "lookup", cmd.topic)
        version = cmd.schema_version if cmd.HasField("schema_version") else None
        found = await self.service.schemas.get(str(TopicName.parse(cmd.topic)), version)
        if found is None:
            self.conn.send_command(
                commands.get_schema_response(
                    cmd.request_id, server_error=ServerError.TopicNotFound, message="schema not found"
                )
            )
            return
        schema, schema_version = found
        self.conn.send_command(commands.get_schema_response(cmd.request_id, schema, schema_version))

    async def on_get_or_create_schema(self, cmd: pb.CommandGetOrCreateSchema, frame) -> None:
        await security.authorize(self.conn, "produce", cmd.topic)
        topic = await self.service.topics.get_topic(cmd.topic, create=True)
        version = await self.service.schemas.get_or_create(topic.name, cmd.schema)
        self.conn.send_command(commands.get_or_create_schema_response(cmd.request_id, version))

    # --- end of the connection ---------------------------------------------------------------

    def connection_closed(self) -> None:
        for producer in list(self.producers.values()):
            producer.topic.remove_producer(producer)
        self.producers.clear()
        for consumer in list(self.consumers.values()):
            try:
                consumer.subscription.remove_consumer(consumer)
            except Exception:  # pragma: no cover - keep cleaning up the others
                log.exception("removing %s failed", consumer)
        self.consumers.clear()


class _ConsumerNotFound(NotFound):
    server_error = ServerError.ConsumerNotFound


#: broker.conf key: keep acknowledgements of single messages of a batch (PIP-54 ``ack_set``)
BATCH_INDEX_ACK_KEY = "acknowledgmentAtBatchIndexLevelEnabled"


class _PendingReceipt:
    """The answer to one SEND, called by the topic once its entry is persisted or failed.

    One small object per message instead of a closure (whose function object and a cell per
    captured variable cost more to build and to collect); the receipt itself is encoded on the
    wire directly and queued with the other frames of this loop turn, written in one go.
    """

    __slots__ = ("conn", "producer", "sequence_id", "highest", "last_seq", "size")

    def __init__(
        self,
        conn: "ServerConnection",
        producer: Producer,
        sequence_id: int,
        highest,
        last_seq: int,
        size: int,
    ) -> None:
        self.conn = conn
        self.producer = producer
        self.sequence_id = sequence_id
        self.highest = highest
        self.last_seq = last_seq
        self.size = size

    def __call__(self, position: Position | None, exc: BaseException | None) -> None:
        conn, producer = self.conn, self.producer
        conn.reads.release(self.size)
        topic = producer.topic
        if exc is not None:
            topic.dedup.failed(producer.name)
            code = exc.server_error if isinstance(exc, CompactMQError) else ServerError.PersistenceError
            conn.send_command(commands.send_error(producer.producer_id, self.sequence_id, code, str(exc)))
            return
        seqs = topic.last_sequence_ids
        if seqs.get(producer.name, -1) < self.last_seq:
            seqs[producer.name] = self.last_seq
        topic.dedup.entry_persisted(position)
        conn.write(
            wire.send_receipt_frame(
                producer.producer_id,
                self.sequence_id,
                position[0],  # type: ignore[index]
                position[1],  # type: ignore[index]
                topic.partition_index,
                self.highest,
            )
        )


def _position(mid: pb.MessageIdData) -> Position:
    return Position(commands.to_signed64(mid.ledgerId), commands.to_signed64(mid.entryId))


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


_HANDLER_TABLE: dict[int, tuple[Any, bool]] = {
    T.CONNECT: (CommandHandler.on_connect, False),
    T.PING: (CommandHandler.on_ping, False),
    T.AUTH_RESPONSE: (CommandHandler.on_auth_response, False),
    T.PONG: (CommandHandler.on_pong, False),
    T.PARTITIONED_METADATA: (CommandHandler.on_partitioned_metadata, True),
    T.LOOKUP: (CommandHandler.on_lookup, True),
    T.GET_TOPICS_OF_NAMESPACE: (CommandHandler.on_get_topics_of_namespace, True),
    T.PRODUCER: (CommandHandler.on_producer, True),
    T.SEND: (CommandHandler.on_send, False),
    T.CLOSE_PRODUCER: (CommandHandler.on_close_producer, False),
    T.SUBSCRIBE: (CommandHandler.on_subscribe, True),
    T.FLOW: (CommandHandler.on_flow, False),
    T.ACK: (CommandHandler.on_ack, False),
    T.REDELIVER_UNACKNOWLEDGED_MESSAGES: (CommandHandler.on_redeliver, False),
    T.CLOSE_CONSUMER: (CommandHandler.on_close_consumer, False),
    T.UNSUBSCRIBE: (CommandHandler.on_unsubscribe, True),
    T.SEEK: (CommandHandler.on_seek, True),
    T.GET_LAST_MESSAGE_ID: (CommandHandler.on_get_last_message_id, True),
    T.CONSUMER_STATS: (CommandHandler.on_consumer_stats, False),
    T.GET_SCHEMA: (CommandHandler.on_get_schema, True),
    T.GET_OR_CREATE_SCHEMA: (CommandHandler.on_get_or_create_schema, True),
}

# type -> (method, runs as a task, name of the command field in BaseCommand)
_HANDLERS: dict[int, tuple[Any, bool, str]] = {
    t: (method, is_async, pb.BaseCommand.DESCRIPTOR.fields_by_number[t].name)
    for t, (method, is_async) in _HANDLER_TABLE.items()
}
