"""Field numbers and enum values of our pulsar.proto, checked against wire facts.

If one of these numbers were wrong, an official client would silently read another field, so
each fact the broker depends on is pinned here.
"""

import pytest

from compactmq.protocol import pulsar_pb2 as pb


def _number(message, field):
    return message.DESCRIPTOR.fields_by_name[field].number


BASE_COMMAND_TYPES = {
    "CONNECT": 2,
    "CONNECTED": 3,
    "SUBSCRIBE": 4,
    "PRODUCER": 5,
    "SEND": 6,
    "SEND_RECEIPT": 7,
    "SEND_ERROR": 8,
    "MESSAGE": 9,
    "ACK": 10,
    "FLOW": 11,
    "UNSUBSCRIBE": 12,
    "SUCCESS": 13,
    "ERROR": 14,
    "CLOSE_PRODUCER": 15,
    "CLOSE_CONSUMER": 16,
    "PRODUCER_SUCCESS": 17,
    "PING": 18,
    "PONG": 19,
    "REDELIVER_UNACKNOWLEDGED_MESSAGES": 20,
    "PARTITIONED_METADATA": 21,
    "PARTITIONED_METADATA_RESPONSE": 22,
    "LOOKUP": 23,
    "LOOKUP_RESPONSE": 24,
    "CONSUMER_STATS": 25,
    "CONSUMER_STATS_RESPONSE": 26,
    "REACHED_END_OF_TOPIC": 27,
    "SEEK": 28,
    "GET_LAST_MESSAGE_ID": 29,
    "GET_LAST_MESSAGE_ID_RESPONSE": 30,
    "ACTIVE_CONSUMER_CHANGE": 31,
    "GET_TOPICS_OF_NAMESPACE": 32,
    "GET_TOPICS_OF_NAMESPACE_RESPONSE": 33,
    "GET_SCHEMA": 34,
    "GET_SCHEMA_RESPONSE": 35,
    "AUTH_CHALLENGE": 36,
    "AUTH_RESPONSE": 37,
    "ACK_RESPONSE": 38,
    "GET_OR_CREATE_SCHEMA": 39,
    "GET_OR_CREATE_SCHEMA_RESPONSE": 40,
    "NEW_TXN": 50,
    "TC_CLIENT_CONNECT_REQUEST": 62,
    "TOPIC_MIGRATED": 68,
}


@pytest.mark.parametrize("name,value", sorted(BASE_COMMAND_TYPES.items()))
def test_base_command_type_values(name, value):
    assert pb.BaseCommand.Type.Value(name) == value


def test_every_type_has_a_same_numbered_field():
    # The envelope's invariant: the field holding command T has field number T.
    fields = {f.number for f in pb.BaseCommand.DESCRIPTOR.fields}
    for value in pb.BaseCommand.Type.values():
        assert value in fields


@pytest.mark.parametrize(
    "field,number",
    [
        ("partition_key", 6),
        ("compression", 8),
        ("uncompressed_size", 9),
        ("num_messages_in_batch", 11),
        ("event_time", 12),
        ("encryption_keys", 13),
        ("ordering_key", 18),
        ("marker_type", 20),
        ("null_value", 25),
        ("null_partition_key", 30),
    ],
)
def test_message_metadata_numbers(field, number):
    assert _number(pb.MessageMetadata, field) == number


def test_compacted_batch_indexes_is_field_31_repeated_int32_unpacked():
    # PIP-429 (Pulsar's PulsarApi.proto: `repeated int32 compacted_batch_indexes = 31;`, proto2,
    # so not packed): each index is its own varint under tag 31 << 3 | 0 = 248
    from google.protobuf.descriptor import FieldDescriptor

    f = pb.MessageMetadata.DESCRIPTOR.fields_by_name["compacted_batch_indexes"]
    assert (f.number, f.type) == (31, FieldDescriptor.TYPE_INT32) and f.is_repeated
    md = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=0, compacted_batch_indexes=[0, 2])
    assert md.SerializeToString().endswith(bytes([0xF8, 0x01, 0x00, 0xF8, 0x01, 0x02]))
    assert list(pb.MessageMetadata.FromString(md.SerializeToString()).compacted_batch_indexes) == [0, 2]


@pytest.mark.parametrize(
    "field,number",
    [
        ("partition_key", 2),
        ("payload_size", 3),
        ("compacted_out", 4),
        ("event_time", 5),
        ("ordering_key", 7),
        ("sequence_id", 8),
        ("null_value", 9),
        ("null_partition_key", 10),
    ],
)
def test_single_message_metadata_numbers(field, number):
    assert _number(pb.SingleMessageMetadata, field) == number


def test_message_id_numbers():
    assert [
        _number(pb.MessageIdData, f)
        for f in (
            "ledgerId",
            "entryId",
            "partition",
            "batch_index",
            "ack_set",
            "batch_size",
            "first_chunk_message_id",
        )
    ] == [1, 2, 3, 4, 5, 6, 7]
    assert pb.MessageIdData(ledgerId=1, entryId=2).partition == -1
    assert pb.MessageIdData(ledgerId=1, entryId=2).batch_index == -1


def test_enums():
    assert [pb.CompressionType.Value(n) for n in ("NONE", "LZ4", "ZLIB", "ZSTD", "SNAPPY")] == [0, 1, 2, 3, 4]
    assert [
        pb.CommandSubscribe.SubType.Value(n) for n in ("Exclusive", "Shared", "Failover", "Key_Shared")
    ] == [0, 1, 2, 3]
    assert pb.CommandSubscribe.InitialPosition.Value("Latest") == 0
    assert pb.CommandSubscribe.InitialPosition.Value("Earliest") == 1
    assert pb.CommandLookupTopicResponse.LookupType.Value("Connect") == 1
    assert pb.ServerError.Value("ChecksumError") == 9
    assert pb.ServerError.Value("ProducerFenced") == 25
    assert pb.ProtocolVersion.Value("v20") == 20


def test_server_error_matches_errors_module():
    from compactmq.errors import ServerError

    for member in ServerError:
        assert pb.ServerError.Value(member.name) == member.value


def test_connect_bytes_from_wire_facts():
    # CONNECT as pulsar-client 3.13 sends it (wire-captures.md, first example of CONNECT).
    cmd = pb.BaseCommand(
        type=pb.BaseCommand.CONNECT,
        connect=pb.CommandConnect(
            client_version="Pulsar-CPP-v4.2.0",
            protocol_version=20,
            auth_method_name="none",
            feature_flags=pb.FeatureFlags(supports_auth_refresh=True, supports_broker_entry_metadata=True),
        ),
    )
    expected = bytes.fromhex(
        "0802"  # type = CONNECT (field 1, varint 2)
        "1221"  # connect (field 2), 33 bytes
        "0a11"
        + b"Pulsar-CPP-v4.2.0".hex()  # client_version (field 1)
        + "2014"  # protocol_version (field 4) = 20
        "2a04"
        + b"none".hex()  # auth_method_name (field 5)
        + "5204"
        "0801"
        "1001"  # feature_flags (field 10): flags 1 and 2 true
    )
    assert cmd.SerializeToString() == expected
    assert pb.BaseCommand.FromString(expected) == cmd
