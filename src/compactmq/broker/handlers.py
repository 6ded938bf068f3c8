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

The commands of producers and of consumers live in ``producer_commands`` and
``consumer_commands`` (parts of ``CommandHandler``, which holds their state); this module keeps
the dispatch, the error boundary and the commands of the connection itself (CONNECT, PING,
lookups, schemas).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ..errors import CompactMQError, ServerError
from ..naming import TopicName
from ..protocol import commands, frames
from ..protocol import pulsar_pb2 as pb
from . import security
from .consumer_commands import ConsumerCommands
from .lookup import lookup_topic
from .nonpersistent import topics_of_namespace
from .producer_commands import ProducerCommands
from .producers import Producer
from .subscriptions import Consumer

if TYPE_CHECKING:  # pragma: no cover
    from .connection import ServerConnection

log = logging.getLogger(__name__)

T = pb.BaseCommand.Type


class CommandHandler(ProducerCommands, ConsumerCommands):
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

    def handle(self, frame: "frames.Frame | frames.SendFrame | frames.SendRun") -> None:
        if frame.__class__ is frames.SendRun:  # the hot path: plain SENDs of one producer
            buf, start, run = frame.buf, frame.start, frame.run  # type: ignore[union-attr]
            try:
                self.on_send_run(buf, start, run)
            except Exception as exc:  # noqa: BLE001 - error boundary of these commands
                self.answer_run_error(buf, start, run, exc)
            return
        if frame.__class__ is frames.SendFrame:  # a plain SEND read off the wire
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

    def answer_run_error(self, buf: bytes, start: int, run: tuple, exc: BaseException) -> None:
        """``on_send_run`` raised: each SEND of the run gets the error, as one by one."""
        for one in frames.SendRun(buf, start, run).frames():
            self._answer_error(one, one.send, exc)

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
