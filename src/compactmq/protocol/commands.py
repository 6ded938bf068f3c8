"""Builders for the BaseCommands compactmq sends, and a few a client sends (for tests).

Each builder returns a complete :class:`BaseCommand`; frame it with
:func:`compactmq.protocol.frames.encode_command` (or ``encode_with_entry`` for MESSAGE).

Message ids: ``ledgerId`` and ``entryId`` are unsigned 64-bit on the wire, yet Pulsar uses -1
in them ("no entry": the last message id of an empty topic, a reader starting at the latest
position, a cumulative ack before the first entry). On the wire -1 is the two's complement
0xFFFF_FFFF_FFFF_FFFF. :func:`message_id` accepts signed values and :func:`message_id_tuple`
gives them back signed, so the rest of compactmq never sees 18446744073709551615.
"""

from __future__ import annotations

from typing import Iterable, NamedTuple

from compactmq.config import VERSION
from compactmq.errors import CompactMQError
from compactmq.protocol import pulsar_pb2 as pb

BaseCommand = pb.BaseCommand
T = pb.BaseCommand  # its class attributes are the Type values (faster than the enum wrapper)

SERVER_VERSION = f"compactmq-{VERSION}"
PROTOCOL_VERSION = 20
"""Highest protocol version compactmq speaks (the version pulsar-client 3.13 announces)."""

_U64 = 1 << 64
_MASK64 = _U64 - 1
#: the largest signed 64-bit id: what clients send for "latest"
INT64_MAX = (1 << 63) - 1


def to_unsigned64(value: int) -> int:
    return value & _MASK64


def to_signed64(value: int) -> int:
    """The signed reading of a uint64 wire field (ids travel unsigned; -1 means "none")."""
    return value - _U64 if value > INT64_MAX else value


class MessageId(NamedTuple):
    """A message id with signed components, as compactmq handles it."""

    ledger_id: int
    entry_id: int
    partition: int = -1
    batch_index: int = -1


def message_id(
    ledger_id: int,
    entry_id: int,
    partition: int = -1,
    batch_index: int | None = None,
    *,
    batch_size: int | None = None,
    ack_set: Iterable[int] | None = None,
) -> pb.MessageIdData:
    """MessageIdData from signed values (-1 allowed for ledger and entry)."""
    mid = pb.MessageIdData(
        ledgerId=to_unsigned64(ledger_id), entryId=to_unsigned64(entry_id), partition=partition
    )
    if batch_index is not None and batch_index >= 0:
        mid.batch_index = batch_index
    if batch_size is not None:
        mid.batch_size = batch_size
    if ack_set:
        mid.ack_set.extend(ack_set)
    return mid


def message_id_tuple(mid: pb.MessageIdData) -> MessageId:
    """Signed (ledger_id, entry_id, partition, batch_index) of a MessageIdData."""
    return MessageId(to_signed64(mid.ledgerId), to_signed64(mid.entryId), mid.partition, mid.batch_index)


def ack_set_from_indexes(indexes: Iterable[int], batch_size: int) -> list[int]:
    """A batch bitset as the wire carries it: 64-bit words (signed), bit ``i`` of word ``i // 64``
    for batch index ``i``, one word per started 64 indexes (at least one, never trimmed).

    Pulsar's convention: a set bit means "still to deliver / still unacked", a clear bit means
    "acknowledged / skip". Facts observed with pulsar-client 3.13:

    * ACK with ``message_id.ack_set`` acknowledges the batch indexes whose bits are *clear*
      (acking index 1 of a 4-message batch sends ``ack_set = [0b1101]``).
    * MESSAGE with ``ack_set`` makes the client skip the records whose bits are clear; with no
      ``ack_set`` it delivers every record, ``compacted_out`` ones included (as empty messages),
      and ``[0]`` skips the whole batch.
    """
    words = [0] * max(1, (batch_size + 63) // 64)
    for i in indexes:
        if not 0 <= i < batch_size:
            raise ValueError(f"batch index {i} outside a batch of {batch_size}")
        words[i >> 6] |= 1 << (i & 63)
    return [to_signed64(w) for w in words]


def indexes_from_ack_set(words: Iterable[int]) -> set[int]:
    """Batch indexes whose bits are set in a wire bitset (see :func:`ack_set_from_indexes`)."""
    out = set()
    for n, word in enumerate(words):
        word = to_unsigned64(word)
        while word:
            low = word & -word
            out.add(n * 64 + low.bit_length() - 1)
            word ^= low
    return out


def negotiated_version(client_version: int, server_version: int = PROTOCOL_VERSION) -> int:
    """Client and broker both speak the lower of the versions they announce."""
    return min(client_version, server_version)


# ---------------------------------------------------------------------------------------------
# Broker to client
# ---------------------------------------------------------------------------------------------


def connected(
    protocol_version: int,
    *,
    server_version: str = SERVER_VERSION,
    max_message_size: int | None = None,
    feature_flags: pb.FeatureFlags | None = None,
) -> pb.BaseCommand:
    """CONNECTED. ``protocol_version``: the negotiated version (see :func:`negotiated_version`)."""
    body = pb.CommandConnected(server_version=server_version, protocol_version=protocol_version)
    if max_message_size is not None:
        body.max_message_size = max_message_size
    if feature_flags is not None:
        body.feature_flags.CopyFrom(feature_flags)
    return BaseCommand(type=T.CONNECTED, connected=body)


def success(request_id: int, schema: pb.Schema | None = None) -> pb.BaseCommand:
    body = pb.CommandSuccess(request_id=request_id)
    if schema is not None:
        body.schema.CopyFrom(schema)
    return BaseCommand(type=T.SUCCESS, success=body)


def error(request_id: int, server_error: int, message: str) -> pb.BaseCommand:
    return BaseCommand(
        type=T.ERROR, error=pb.CommandError(request_id=request_id, error=int(server_error), message=message)
    )


def error_from(request_id: int, exc: CompactMQError) -> pb.BaseCommand:
    """ERROR for one of our exceptions: its wire code and its message."""
    return error(request_id, exc.server_error, str(exc) or type(exc).__name__)


def send_receipt(
    producer_id: int,
    sequence_id: int,
    ledger_id: int,
    entry_id: int,
    *,
    partition: int = -1,
    highest_sequence_id: int | None = None,
) -> pb.BaseCommand:
    # Filled in place rather than through constructors: one SEND_RECEIPT per message, and
    # nested constructors copy each sub-message (about 4x slower).
    cmd = BaseCommand(type=T.SEND_RECEIPT)
    body = cmd.send_receipt
    body.producer_id = producer_id
    body.sequence_id = sequence_id
    mid = body.message_id
    mid.ledgerId = ledger_id & _MASK64
    mid.entryId = entry_id & _MASK64
    mid.partition = partition
    if highest_sequence_id is not None:
        body.highest_sequence_id = highest_sequence_id
    return cmd


def send_error(producer_id: int, sequence_id: int, server_error: int, message: str) -> pb.BaseCommand:
    return BaseCommand(
        type=T.SEND_ERROR,
        send_error=pb.CommandSendError(
            producer_id=producer_id, sequence_id=sequence_id, error=int(server_error), message=message
        ),
    )


def producer_success(
    request_id: int,
    producer_name: str,
    *,
    last_sequence_id: int = -1,
    schema_version: bytes = b"",
    topic_epoch: int | None = None,
    producer_ready: bool = True,
) -> pb.BaseCommand:
    body = pb.CommandProducerSuccess(
        request_id=request_id,
        producer_name=producer_name,
        last_sequence_id=last_sequence_id,
        schema_version=schema_version,
        producer_ready=producer_ready,
    )
    if topic_epoch is not None:
        body.topic_epoch = topic_epoch
    return BaseCommand(type=T.PRODUCER_SUCCESS, producer_success=body)


def message(
    consumer_id: int,
    msg_id: pb.MessageIdData | MessageId | tuple,
    *,
    redelivery_count: int = 0,
    ack_set: Iterable[int] | None = None,
    consumer_epoch: int | None = None,
) -> pb.BaseCommand:
    """MESSAGE; frame it with ``encode_with_entry(cmd, stored_entry_bytes)``.

    ``ack_set``: for a batch, the records to deliver (see :func:`ack_set_from_indexes` and
    :func:`compactmq.protocol.batch.delivery_ack_set`).
    """
    cmd = BaseCommand(type=T.MESSAGE)  # filled in place: this is the dispatch hot path
    body = cmd.message
    body.consumer_id = consumer_id
    _fill_message_id(body.message_id, msg_id)
    body.redelivery_count = redelivery_count
    if ack_set:
        body.ack_set.extend(ack_set)
    if consumer_epoch is not None:
        body.consumer_epoch = consumer_epoch
    return cmd


def lookup_response(
    request_id: int,
    broker_service_url: str,
    *,
    broker_service_url_tls: str | None = None,
    authoritative: bool = False,
    redirect: bool = False,
    proxy_through_service_url: bool = False,
) -> pb.BaseCommand:
    """LOOKUP_RESPONSE telling the client to connect to (or be redirected to) a broker."""
    L = pb.CommandLookupTopicResponse
    body = L(
        request_id=request_id,
        brokerServiceUrl=broker_service_url,
        response=L.Redirect if redirect else L.Connect,
        authoritative=authoritative,
        proxy_through_service_url=proxy_through_service_url,
    )
    if broker_service_url_tls:
        body.brokerServiceUrlTls = broker_service_url_tls
    return BaseCommand(type=T.LOOKUP_RESPONSE, lookupTopicResponse=body)


def lookup_error(request_id: int, server_error: int, message: str) -> pb.BaseCommand:
    L = pb.CommandLookupTopicResponse
    body = L(request_id=request_id, response=L.Failed, error=int(server_error), message=message)
    return BaseCommand(type=T.LOOKUP_RESPONSE, lookupTopicResponse=body)


def partitioned_metadata_response(request_id: int, partitions: int) -> pb.BaseCommand:
    """``partitions`` = 0 for a non-partitioned topic."""
    P = pb.CommandPartitionedTopicMetadataResponse
    body = P(request_id=request_id, partitions=partitions, response=P.Success)
    return BaseCommand(type=T.PARTITIONED_METADATA_RESPONSE, partitionMetadataResponse=body)


def partitioned_metadata_error(request_id: int, server_error: int, message: str) -> pb.BaseCommand:
    P = pb.CommandPartitionedTopicMetadataResponse
    body = P(request_id=request_id, response=P.Failed, error=int(server_error), message=message)
    return BaseCommand(type=T.PARTITIONED_METADATA_RESPONSE, partitionMetadataResponse=body)


def get_last_message_id_response(
    request_id: int,
    last_message_id: pb.MessageIdData | MessageId | tuple,
    *,
    consumer_mark_delete_position: pb.MessageIdData | MessageId | tuple | None = None,
) -> pb.BaseCommand:
    """GET_LAST_MESSAGE_ID_RESPONSE. An empty topic answers ``(ledger, -1)``, not an error."""
    body = pb.CommandGetLastMessageIdResponse(
        request_id=request_id, last_message_id=_as_message_id(last_message_id)
    )
    if consumer_mark_delete_position is not None:
        body.consumer_mark_delete_position.CopyFrom(_as_message_id(consumer_mark_delete_position))
    return BaseCommand(type=T.GET_LAST_MESSAGE_ID_RESPONSE, getLastMessageIdResponse=body)


def active_consumer_change(consumer_id: int, is_active: bool) -> pb.BaseCommand:
    return BaseCommand(
        type=T.ACTIVE_CONSUMER_CHANGE,
        active_consumer_change=pb.CommandActiveConsumerChange(consumer_id=consumer_id, is_active=is_active),
    )


def reached_end_of_topic(consumer_id: int) -> pb.BaseCommand:
    return BaseCommand(
        type=T.REACHED_END_OF_TOPIC, reachedEndOfTopic=pb.CommandReachedEndOfTopic(consumer_id=consumer_id)
    )


def ping() -> pb.BaseCommand:
    return BaseCommand(type=T.PING, ping=pb.CommandPing())


def pong() -> pb.BaseCommand:
    return BaseCommand(type=T.PONG, pong=pb.CommandPong())


def close_producer(producer_id: int, request_id: int) -> pb.BaseCommand:
    """CLOSE_PRODUCER: from the broker it tells the client to reconnect its producer."""
    return BaseCommand(
        type=T.CLOSE_PRODUCER,
        close_producer=pb.CommandCloseProducer(producer_id=producer_id, request_id=request_id),
    )


def close_consumer(consumer_id: int, request_id: int) -> pb.BaseCommand:
    """CLOSE_CONSUMER: from the broker it tells the client to reconnect its consumer."""
    return BaseCommand(
        type=T.CLOSE_CONSUMER,
        close_consumer=pb.CommandCloseConsumer(consumer_id=consumer_id, request_id=request_id),
    )


def ack_response(
    consumer_id: int, request_id: int, server_error: int | None = None, message: str | None = None
) -> pb.BaseCommand:
    body = pb.CommandAckResponse(consumer_id=consumer_id, request_id=request_id)
    if server_error is not None:
        body.error = int(server_error)
    if message is not None:
        body.message = message
    return BaseCommand(type=T.ACK_RESPONSE, ackResponse=body)


def consumer_stats_response(request_id: int, **stats) -> pb.BaseCommand:
    """CONSUMER_STATS_RESPONSE; ``stats`` are CommandConsumerStatsResponse fields
    (msgRateOut, availablePermits, msgBacklog, ...)."""
    body = pb.CommandConsumerStatsResponse(request_id=request_id, **stats)
    return BaseCommand(type=T.CONSUMER_STATS_RESPONSE, consumerStatsResponse=body)


def consumer_stats_error(request_id: int, server_error: int, message: str) -> pb.BaseCommand:
    body = pb.CommandConsumerStatsResponse(
        request_id=request_id, error_code=int(server_error), error_message=message
    )
    return BaseCommand(type=T.CONSUMER_STATS_RESPONSE, consumerStatsResponse=body)


def get_topics_of_namespace_response(
    request_id: int, topics: Iterable[str], *, filtered: bool = False, topics_hash: str | None = None
) -> pb.BaseCommand:
    body = pb.CommandGetTopicsOfNamespaceResponse(
        request_id=request_id, topics=list(topics), filtered=filtered
    )
    if topics_hash is not None:
        body.topics_hash = topics_hash
    return BaseCommand(type=T.GET_TOPICS_OF_NAMESPACE_RESPONSE, getTopicsOfNamespaceResponse=body)


def get_schema_response(
    request_id: int,
    schema: pb.Schema | None = None,
    schema_version: bytes | None = None,
    *,
    server_error: int | None = None,
    message: str | None = None,
) -> pb.BaseCommand:
    """GET_SCHEMA_RESPONSE with a schema, or with an error (e.g. TopicNotFound: no schema)."""
    body = pb.CommandGetSchemaResponse(request_id=request_id)
    if schema is not None:
        body.schema.CopyFrom(schema)
    if schema_version is not None:
        body.schema_version = schema_version
    if server_error is not None:
        body.error_code = int(server_error)
        body.error_message = message or ""
    return BaseCommand(type=T.GET_SCHEMA_RESPONSE, getSchemaResponse=body)


def get_or_create_schema_response(
    request_id: int,
    schema_version: bytes | None = None,
    *,
    server_error: int | None = None,
    message: str | None = None,
) -> pb.BaseCommand:
    body = pb.CommandGetOrCreateSchemaResponse(request_id=request_id)
    if schema_version is not None:
        body.schema_version = schema_version
    if server_error is not None:
        body.error_code = int(server_error)
        body.error_message = message or ""
    return BaseCommand(type=T.GET_OR_CREATE_SCHEMA_RESPONSE, getOrCreateSchemaResponse=body)


# The challenge data Pulsar's brokers send to ask a connected client for fresh credentials.
AUTH_REFRESH_DATA = b"refresh"


def auth_challenge(
    auth_method_name: str,
    protocol_version: int,
    data: bytes = AUTH_REFRESH_DATA,
    *,
    server_version: str = SERVER_VERSION,
) -> pb.BaseCommand:
    """AUTH_CHALLENGE: the broker asks for credentials again (refresh of an expiring token)."""
    body = pb.CommandAuthChallenge(
        server_version=server_version,
        protocol_version=protocol_version,
        challenge=pb.AuthData(auth_method_name=auth_method_name, auth_data=data),
    )
    return BaseCommand(type=T.AUTH_CHALLENGE, authChallenge=body)


def tc_client_connect_response(request_id: int, server_error: int | None = None, message: str | None = None):
    """Refusal (or acceptance) of a transaction-coordinator connect; compactmq refuses."""
    body = pb.CommandTcClientConnectResponse(request_id=request_id)
    if server_error is not None:
        body.error = int(server_error)
        body.message = message or ""
    return BaseCommand(type=T.TC_CLIENT_CONNECT_RESPONSE, tcClientConnectResponse=body)


def _as_message_id(value: pb.MessageIdData | MessageId | tuple) -> pb.MessageIdData:
    if isinstance(value, pb.MessageIdData):
        return value
    return message_id(*value)


def _fill_message_id(target: pb.MessageIdData, value: pb.MessageIdData | MessageId | tuple) -> None:
    if isinstance(value, pb.MessageIdData):
        target.CopyFrom(value)
        return
    target.ledgerId = value[0] & _MASK64
    target.entryId = value[1] & _MASK64
    target.partition = value[2] if len(value) > 2 else -1
    if len(value) > 3 and value[3] is not None and value[3] >= 0:
        target.batch_index = value[3]
