"""Command builders: complete commands, the right types, signed message ids."""

from __future__ import annotations

import pytest

from compactmq.errors import ConsumerBusy, ServerError
from tests.protocol import client_commands as C
from compactmq.protocol import frames as F
from compactmq.protocol import entry_format as E
from compactmq.protocol import pulsar_pb2 as pb

T = pb.BaseCommand

BUILT = {
    "connected": (C.connected(20, max_message_size=5 << 20), T.CONNECTED),
    "success": (C.success(1), T.SUCCESS),
    "error": (C.error(1, ServerError.TopicNotFound, "no such topic"), T.ERROR),
    "send_receipt": (C.send_receipt(0, 4, 97, 3), T.SEND_RECEIPT),
    "send_error": (C.send_error(0, 4, ServerError.ChecksumError, "bad crc"), T.SEND_ERROR),
    "producer_success": (C.producer_success(0, "producer-0"), T.PRODUCER_SUCCESS),
    "message": (C.message(0, (98, 0)), T.MESSAGE),
    "lookup_response": (C.lookup_response(2, "pulsar://127.0.0.1:6650"), T.LOOKUP_RESPONSE),
    "lookup_error": (C.lookup_error(2, ServerError.ServiceNotReady, "x"), T.LOOKUP_RESPONSE),
    "partitioned": (C.partitioned_metadata_response(1, 0), T.PARTITIONED_METADATA_RESPONSE),
    "partitioned_error": (
        C.partitioned_metadata_error(1, ServerError.TopicNotFound, "x"),
        T.PARTITIONED_METADATA_RESPONSE,
    ),
    "last_id": (C.get_last_message_id_response(3, (114, 5)), T.GET_LAST_MESSAGE_ID_RESPONSE),
    "active": (C.active_consumer_change(0, True), T.ACTIVE_CONSUMER_CHANGE),
    "end": (C.reached_end_of_topic(0), T.REACHED_END_OF_TOPIC),
    "ping": (C.ping(), T.PING),
    "pong": (C.pong(), T.PONG),
    "close_producer": (C.close_producer(0, 1), T.CLOSE_PRODUCER),
    "close_consumer": (C.close_consumer(0, 1), T.CLOSE_CONSUMER),
    "ack_response": (C.ack_response(0, 5), T.ACK_RESPONSE),
    "stats": (C.consumer_stats_response(1, msgBacklog=3, availablePermits=10), T.CONSUMER_STATS_RESPONSE),
    "stats_error": (C.consumer_stats_error(1, ServerError.ConsumerNotFound, "x"), T.CONSUMER_STATS_RESPONSE),
    "topics": (
        C.get_topics_of_namespace_response(1, ["persistent://a/b/c"]),
        T.GET_TOPICS_OF_NAMESPACE_RESPONSE,
    ),
    "schema": (
        C.get_schema_response(1, pb.Schema(name="s", schema_data=b"", type=pb.Schema.String), b"\x00"),
        T.GET_SCHEMA_RESPONSE,
    ),
    "schema_error": (
        C.get_schema_response(1, server_error=ServerError.TopicNotFound, message="none"),
        T.GET_SCHEMA_RESPONSE,
    ),
    "schema_create": (C.get_or_create_schema_response(1, b"\x00" * 8), T.GET_OR_CREATE_SCHEMA_RESPONSE),
    "tc_refused": (
        C.tc_client_connect_response(1, ServerError.NotAllowedError, "no txn"),
        T.TC_CLIENT_CONNECT_RESPONSE,
    ),
    "connect": (C.connect(), T.CONNECT),
    "partitioned_request": (C.partitioned_metadata("t", 1), T.PARTITIONED_METADATA),
    "lookup": (C.lookup("t", 2), T.LOOKUP),
    "producer": (C.producer("t", 0, 0), T.PRODUCER),
    "send": (C.send(0, 0, num_messages=10), T.SEND),
    "subscribe": (C.subscribe("t", "s", 0, 2, start_message_id=(-1, -1)), T.SUBSCRIBE),
    "flow": (C.flow(0, 1000), T.FLOW),
    "ack": (C.ack(0, [(98, -1)], cumulative=True), T.ACK),
    "redeliver": (C.redeliver_unacknowledged(0, [(1, 2)]), T.REDELIVER_UNACKNOWLEDGED_MESSAGES),
    "seek": (C.seek(0, 3, publish_time=1234), T.SEEK),
    "last_id_request": (C.get_last_message_id(0, 3), T.GET_LAST_MESSAGE_ID),
    "unsubscribe": (C.unsubscribe(0, 3), T.UNSUBSCRIBE),
}


@pytest.mark.parametrize("name", sorted(BUILT))
def test_builders_make_complete_commands_that_frame(name):
    cmd, ctype = BUILT[name]
    assert cmd.type == ctype
    assert cmd.IsInitialized()
    if ctype in (T.SEND, T.MESSAGE):
        md = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=0)
        data = F.encode_with_entry(cmd, E.build_entry(md, b"x"))
    else:
        data = F.encode_command(cmd)
    (frame,) = F.FrameDecoder().feed(data)
    assert frame.command == cmd


def test_wire_captured_shapes():
    # Fields as observed from a Pulsar-compatible broker in wire-captures.md.
    ps = C.producer_success(0, "producer-0").producer_success
    assert (ps.last_sequence_id, ps.schema_version, ps.producer_ready) == (-1, b"", True)
    assert ps.HasField("schema_version")
    lr = C.lookup_response(2, "pulsar://127.0.0.1:59017").lookupTopicResponse
    assert lr.response == pb.CommandLookupTopicResponse.Connect
    assert lr.HasField("authoritative") and lr.HasField("proxy_through_service_url")
    pm = C.partitioned_metadata_response(1, 0).partitionMetadataResponse
    assert pm.HasField("partitions") and pm.partitions == 0 and pm.response == pm.Success
    receipt = C.send_receipt(0, 0, 97, 0).send_receipt
    assert (receipt.message_id.ledgerId, receipt.message_id.entryId, receipt.message_id.partition) == (
        97,
        0,
        -1,
    )
    assert not receipt.message_id.HasField("batch_index")
    assert C.connected(20).connected.server_version == C.SERVER_VERSION


def test_negative_ids_travel_as_unsigned():
    mid = C.message_id(5, -1)
    assert mid.entryId == 2**64 - 1
    assert C.message_id_tuple(mid) == C.MessageId(5, -1, -1, -1)
    resp = C.get_last_message_id_response(3, (5, -1)).getLastMessageIdResponse
    assert C.message_id_tuple(resp.last_message_id).entry_id == -1
    assert C.to_signed64(C.to_unsigned64(-(2**63))) == -(2**63)
    assert C.to_signed64(2**63 - 1) == 2**63 - 1


def test_message_ids_with_batch_details():
    mid = C.message_id(1, 2, 3, 4, batch_size=10, ack_set=[5])
    assert (mid.batch_index, mid.batch_size, list(mid.ack_set)) == (4, 10, [5])
    assert C.message_id_tuple(mid) == (1, 2, 3, 4)
    assert C.message(0, mid, redelivery_count=2, ack_set=[-1]).message.redelivery_count == 2


def test_error_from_exception():
    cmd = C.error_from(7, ConsumerBusy("Exclusive consumer is already connected"))
    assert cmd.error.error == ServerError.ConsumerBusy
    assert cmd.error.request_id == 7
    assert "already connected" in cmd.error.message


def test_negotiated_version():
    assert C.negotiated_version(20) == 20
    assert C.negotiated_version(25) == C.PROTOCOL_VERSION
    assert C.negotiated_version(6) == 6


# A batch-index ACK as pulsar-client 3.13.0 sent it (batch_index_ack_enabled, 4-message batch
# at (7, 0), acknowledging index 1 only), captured from the wire.
REAL_BATCH_INDEX_ACK = bytes.fromhex("0000001400000010080a520c080110001a0608071000280d")


def test_real_batch_index_ack_clears_the_acked_bit():
    (frame,) = F.FrameDecoder().feed(REAL_BATCH_INDEX_ACK)
    ack = frame.command.ack
    assert ack.ack_type == pb.CommandAck.Individual
    (mid,) = ack.message_id
    assert (mid.ledgerId, mid.entryId, list(mid.ack_set)) == (7, 0, [0b1101])
    assert not mid.HasField("batch_index")
    assert C.indexes_from_ack_set(mid.ack_set) == {0, 2, 3}  # still unacked
    assert C.ack_set_from_indexes([0, 2, 3], 4) == [0b1101]
    # The client leaves partition out; proto2 repeated int64 travels unpacked (tag 0x28).
    mid = pb.MessageIdData(ledgerId=7, entryId=0, ack_set=C.ack_set_from_indexes([0, 2, 3], 4))
    assert F.encode_command(C.ack(1, [mid])) == REAL_BATCH_INDEX_ACK


@pytest.mark.parametrize(
    "indexes,size", [([], 1), ([0], 1), ([63], 64), ([64], 65), (list(range(130)), 130), ([5, 100, 127], 128)]
)
def test_ack_set_round_trip(indexes, size):
    words = C.ack_set_from_indexes(indexes, size)
    assert len(words) == (size + 63) // 64
    assert all(-(2**63) <= w < 2**63 for w in words)
    assert C.indexes_from_ack_set(words) == set(indexes)
    pb.CommandMessage(consumer_id=0, message_id=C.message_id(1, 1), ack_set=words)  # fits int64


def test_ack_set_rejects_indexes_outside_the_batch():
    with pytest.raises(ValueError):
        C.ack_set_from_indexes([4], 4)


def test_auth_challenge_and_response_round_trip():
    challenge = C.auth_challenge("token", 20)
    decoded = F.FrameDecoder().feed(F.encode_command(challenge))[0].command
    assert decoded.type == pb.BaseCommand.AUTH_CHALLENGE
    assert decoded.authChallenge.challenge.auth_method_name == "token"
    assert decoded.authChallenge.challenge.auth_data == b"refresh"
    assert decoded.authChallenge.protocol_version == 20

    response = C.auth_response("token", b"jwt-bytes")
    decoded = F.FrameDecoder().feed(F.encode_command(response))[0].command
    assert decoded.type == pb.BaseCommand.AUTH_RESPONSE
    assert (decoded.authResponse.response.auth_method_name, decoded.authResponse.response.auth_data) == (
        "token",
        b"jwt-bytes",
    )
