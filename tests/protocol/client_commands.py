"""Client-to-broker command builders (what pulsar-client sends), for tests that speak the wire
protocol themselves. The broker never builds these, so they live with the tests; the broker's
own (broker-to-client) builders are re-exported, so a test needs one module for both.
"""

from __future__ import annotations

from typing import Iterable

from compactmq.protocol.commands import *  # noqa: F403 - the broker-to-client builders
from compactmq.protocol.commands import PROTOCOL_VERSION, BaseCommand, MessageId, T, _as_message_id
from compactmq.protocol import pulsar_pb2 as pb


def connect(
    client_version: str = "Pulsar-CPP-v4.2.0",
    protocol_version: int = PROTOCOL_VERSION,
    *,
    auth_method_name: str = "none",
    auth_data: bytes | None = None,
    feature_flags: pb.FeatureFlags | None = None,
) -> pb.BaseCommand:
    body = pb.CommandConnect(
        client_version=client_version, protocol_version=protocol_version, auth_method_name=auth_method_name
    )
    if auth_data is not None:
        body.auth_data = auth_data
    if feature_flags is not None:
        body.feature_flags.CopyFrom(feature_flags)
    return BaseCommand(type=T.CONNECT, connect=body)


def partitioned_metadata(topic: str, request_id: int) -> pb.BaseCommand:
    return BaseCommand(
        type=T.PARTITIONED_METADATA,
        partitionMetadata=pb.CommandPartitionedTopicMetadata(topic=topic, request_id=request_id),
    )


def lookup(topic: str, request_id: int, *, authoritative: bool = False) -> pb.BaseCommand:
    return BaseCommand(
        type=T.LOOKUP,
        lookupTopic=pb.CommandLookupTopic(topic=topic, request_id=request_id, authoritative=authoritative),
    )


def producer(
    topic: str,
    producer_id: int,
    request_id: int,
    *,
    producer_name: str | None = None,
    access_mode: int = pb.Shared,
    epoch: int = 0,
) -> pb.BaseCommand:
    body = pb.CommandProducer(
        topic=topic,
        producer_id=producer_id,
        request_id=request_id,
        epoch=epoch,
        user_provided_producer_name=producer_name is not None,
        producer_access_mode=access_mode,
    )
    if producer_name is not None:
        body.producer_name = producer_name
    return BaseCommand(type=T.PRODUCER, producer=body)


def send(producer_id: int, sequence_id: int, num_messages: int | None = None) -> pb.BaseCommand:
    """SEND; frame it with ``encode_with_entry(cmd, build_entry(metadata, payload))``."""
    body = pb.CommandSend(producer_id=producer_id, sequence_id=sequence_id)
    if num_messages is not None:
        body.num_messages = num_messages
    return BaseCommand(type=T.SEND, send=body)


def subscribe(
    topic: str,
    subscription: str,
    consumer_id: int,
    request_id: int,
    *,
    sub_type: int = pb.CommandSubscribe.Exclusive,
    initial_position: int = pb.CommandSubscribe.Latest,
    durable: bool = True,
    read_compacted: bool = False,
    start_message_id: pb.MessageIdData | MessageId | tuple | None = None,
    consumer_name: str = "",
) -> pb.BaseCommand:
    body = pb.CommandSubscribe(
        topic=topic,
        subscription=subscription,
        subType=sub_type,
        consumer_id=consumer_id,
        request_id=request_id,
        consumer_name=consumer_name,
        durable=durable,
        read_compacted=read_compacted,
        initialPosition=initial_position,
    )
    if start_message_id is not None:
        body.start_message_id.CopyFrom(_as_message_id(start_message_id))
    return BaseCommand(type=T.SUBSCRIBE, subscribe=body)


def flow(consumer_id: int, permits: int) -> pb.BaseCommand:
    return BaseCommand(type=T.FLOW, flow=pb.CommandFlow(consumer_id=consumer_id, messagePermits=permits))


def ack(
    consumer_id: int,
    message_ids: Iterable[pb.MessageIdData | MessageId | tuple],
    *,
    cumulative: bool = False,
    request_id: int | None = None,
) -> pb.BaseCommand:
    A = pb.CommandAck
    body = A(consumer_id=consumer_id, ack_type=A.Cumulative if cumulative else A.Individual)
    body.message_id.extend(_as_message_id(m) for m in message_ids)
    if request_id is not None:
        body.request_id = request_id
    return BaseCommand(type=T.ACK, ack=body)


def redeliver_unacknowledged(
    consumer_id: int, message_ids: Iterable[pb.MessageIdData | MessageId | tuple] = ()
) -> pb.BaseCommand:
    body = pb.CommandRedeliverUnacknowledgedMessages(consumer_id=consumer_id)
    body.message_ids.extend(_as_message_id(m) for m in message_ids)
    return BaseCommand(type=T.REDELIVER_UNACKNOWLEDGED_MESSAGES, redeliverUnacknowledgedMessages=body)


def seek(
    consumer_id: int,
    request_id: int,
    *,
    msg_id: pb.MessageIdData | MessageId | tuple | None = None,
    publish_time: int | None = None,
) -> pb.BaseCommand:
    body = pb.CommandSeek(consumer_id=consumer_id, request_id=request_id)
    if msg_id is not None:
        body.message_id.CopyFrom(_as_message_id(msg_id))
    if publish_time is not None:
        body.message_publish_time = publish_time
    return BaseCommand(type=T.SEEK, seek=body)


def get_last_message_id(consumer_id: int, request_id: int) -> pb.BaseCommand:
    return BaseCommand(
        type=T.GET_LAST_MESSAGE_ID,
        getLastMessageId=pb.CommandGetLastMessageId(consumer_id=consumer_id, request_id=request_id),
    )


def unsubscribe(consumer_id: int, request_id: int) -> pb.BaseCommand:
    return BaseCommand(
        type=T.UNSUBSCRIBE, unsubscribe=pb.CommandUnsubscribe(consumer_id=consumer_id, request_id=request_id)
    )


def auth_response(
    auth_method_name: str,
    auth_data: bytes,
    *,
    client_version: str = "Pulsar-CPP-v4.2.0",
    protocol_version: int = PROTOCOL_VERSION,
) -> pb.BaseCommand:
    """AUTH_RESPONSE: the client's answer to an AUTH_CHALLENGE (its current credentials)."""
    body = pb.CommandAuthResponse(
        client_version=client_version,
        protocol_version=protocol_version,
        response=pb.AuthData(auth_method_name=auth_method_name, auth_data=auth_data),
    )
    return BaseCommand(type=T.AUTH_RESPONSE, authResponse=body)
