"""Framing: every command kind round-trips, byte-exact fixtures, limits and framing errors."""

from __future__ import annotations

import struct

import pytest

from compactmq.errors import ChecksumError, MalformedEntry, ProtocolError, ServerError
from tests.protocol import client_commands as C
from compactmq.protocol import frames as F
from compactmq.protocol import entry_format as E
from compactmq.protocol import pulsar_pb2 as pb

from .helpers import ALL_TYPES, minimal_command, real_client_frames

T = pb.BaseCommand

ENTRY_TYPES = {T.SEND, T.MESSAGE}


def _metadata(**kw) -> pb.MessageMetadata:
    base = dict(producer_name="producer-0", sequence_id=3, publish_time=1_700_000_000_000)
    base.update(kw)
    return pb.MessageMetadata(**base)


def _frame_bytes(cmd_bytes: bytes, rest: bytes = b"") -> bytes:
    return struct.pack(">II", 4 + len(cmd_bytes) + len(rest), len(cmd_bytes)) + cmd_bytes + rest


# --- round trips ------------------------------------------------------------------------------


@pytest.mark.parametrize("command_type", ALL_TYPES, ids=lambda t: T.Type.Name(t))
def test_every_command_kind_round_trips(command_type):
    cmd = minimal_command(command_type)
    if command_type in ENTRY_TYPES:
        entry = E.build_entry(_metadata(), b"payload")
        data = F.encode_with_entry(cmd, entry)
    else:
        entry = None
        data = F.encode_command(cmd)
    frames = F.FrameDecoder().feed(data)
    assert len(frames) == 1
    assert frames[0].command == cmd
    assert frames[0].entry == entry
    assert frames[0].type == command_type
    assert frames[0].body() == next(v for f, v in cmd.ListFields() if f.name != "type")


def test_many_frames_in_one_feed_and_split_across_feeds():
    cmds = [C.ping(), C.pong(), C.flow(1, 1000), C.success(9)]
    entry = E.build_entry(_metadata(partition_key="k"), b"v")
    stream = b"".join(F.encode_command(c) for c in cmds) + F.encode_with_entry(C.send(0, 1), entry)
    dec = F.FrameDecoder()
    assert [f.command for f in dec.feed(stream)] == cmds + [C.send(0, 1)]
    assert dec.buffered == 0
    # same stream cut in the middle of the size field, the command and the entry
    dec = F.FrameDecoder()
    assert dec.feed(b"") == []  # an empty feed is harmless
    pieces = [stream[:2], stream[2:11], stream[11:-3], stream[-3:]]
    got = []
    for piece in pieces:
        got += dec.feed(piece)
    assert [f.command for f in got] == cmds + [C.send(0, 1)]
    assert got[-1].entry == entry


def test_take_unread_hands_over_a_partial_frame_and_empties_the_decoder():
    first, second = F.encode_command(C.ping()), F.encode_command(C.flow(1, 1000))
    for tail in (second[:3], second[:9]):  # cut in the size field, then in the command
        dec = F.FrameDecoder()
        assert [f.command for f in dec.feed(first + tail)] == [C.ping()]
        assert dec.take_unread() == tail
        assert dec.buffered == 0 and dec.take_unread() == b""
        # the decoder goes on as if new: a whole frame fed after it decodes alone
        assert [f.command for f in dec.feed(second)] == [C.flow(1, 1000)]
    # across feeds: the tail kept in the buffer is what is handed over, once
    dec = F.FrameDecoder()
    assert dec.feed(second[:2]) == [] and dec.feed(second[2:5]) == []
    assert dec.take_unread() == second[:5]
    dec = F.FrameDecoder()
    dec.feed(first)
    assert dec.take_unread() == b""  # nothing left over after whole frames


def test_decoder_fed_one_byte_at_a_time_matches_whole_feed():
    stream = b"".join(f["raw"] for f in real_client_frames())
    whole = F.FrameDecoder(verify_checksums=True).feed(stream)
    dec = F.FrameDecoder(verify_checksums=True)
    one_by_one = []
    for i in range(len(stream)):
        one_by_one += dec.feed(stream[i : i + 1])
    assert one_by_one == whole
    assert len(whole) == len(real_client_frames())
    assert dec.buffered == 0


# --- byte-exact fixtures built from wire facts ---------------------------------------------------


def test_connect_frame_bytes():
    # CONNECT as pulsar-client 3.13 sends it: version string, protocol 20, auth "none",
    # feature flags 1 (auth refresh) and 2 (broker entry metadata).
    cmd = C.connect(
        feature_flags=pb.FeatureFlags(supports_auth_refresh=True, supports_broker_entry_metadata=True)
    )
    body = (
        bytes.fromhex("0802")  # type: CONNECT
        + bytes.fromhex("1221")  # field 2, 33 bytes
        + bytes.fromhex("0a11")
        + b"Pulsar-CPP-v4.2.0"  # client_version
        + bytes.fromhex("2014")  # protocol_version 20
        + bytes.fromhex("2a04")
        + b"none"  # auth_method_name
        + bytes.fromhex("5204080110 01".replace(" ", ""))  # feature_flags {1: 1, 2: 1}
    )
    expected = struct.pack(">II", 4 + len(body), len(body)) + body
    assert F.encode_command(cmd) == expected
    real = next(f["raw"] for f in real_client_frames() if f["type"] == "CONNECT")
    assert real == expected


def test_ping_frame_bytes():
    # total 9, command 5: type 18 (0x12), field 18 length-delimited (tag 0x92 0x01), empty.
    assert F.encode_command(C.ping()) == bytes.fromhex("00000009000000050812920100")


def test_send_frame_layout():
    md = _metadata(partition_key="k")
    entry = E.build_entry(md, b"hello")
    data = F.encode_with_entry(C.send(1, 2), entry)
    cmd = C.send(1, 2).SerializeToString()
    md_bytes = md.SerializeToString()
    after_crc = struct.pack(">I", len(md_bytes)) + md_bytes + b"hello"
    assert entry == struct.pack(">HI", 0x0E01, E.crc32c(after_crc)) + after_crc
    assert data == struct.pack(">II", 4 + len(cmd) + len(entry), len(cmd)) + cmd + entry


def test_crc32c_is_castagnoli():
    # The standard check value of CRC-32C.
    assert E.crc32c(b"123456789") == 0xE3069283


def test_real_client_frames_decode():
    frames = real_client_frames()
    for f in frames:
        (frame,) = F.FrameDecoder(verify_checksums=True).feed(f["raw"])
        assert T.Type.Name(frame.type) == f["type"]
        # our encoder reproduces the client's bytes for commands without an entry
        if frame.entry is None:
            assert F.encode_command(frame.command) == f["raw"]
        else:
            assert F.encode_with_entry(frame.command, frame.entry) == f["raw"]


def test_real_client_nobatch_send():
    sends = [f for f in real_client_frames() if f["scenario"] == "nobatch" and f["type"] == "SEND"]
    for i, f in enumerate(sends):
        (frame,) = F.FrameDecoder().feed(f["raw"])
        assert frame.command.send.producer_id == 0 and frame.command.send.sequence_id == i
        assert E.is_checksummed(frame.entry)
        assert E.ensure_checksummed(frame.entry) is frame.entry
        md, payload = E.parse_entry(frame.entry)
        assert payload == f"m{i}".encode()
        assert md.partition_key == f"k{i}"
        assert md.event_time == 1000 + i
        assert [(p.key, p.value) for p in md.properties] == [("a", "b")]
        assert not md.HasField("num_messages_in_batch")


def test_real_client_subscribe_ack_and_signed_ids():
    frames = {
        f["type"]: F.FrameDecoder().feed(f["raw"])[0]
        for f in real_client_frames()
        if f["scenario"] == "reader"
    }
    sub = frames["SUBSCRIBE"].command.subscribe
    assert sub.subType == pb.CommandSubscribe.Exclusive
    assert sub.durable is False
    # A reader from MessageId.earliest asks for start (-1, -1), sent as unsigned 2**64 - 1, and
    # leaves initialPosition at Latest: the broker must go by start_message_id.
    assert sub.start_message_id.ledgerId == 2**64 - 1
    assert C.message_id_tuple(sub.start_message_id)[:2] == (-1, -1)
    assert sub.initialPosition == pb.CommandSubscribe.Latest
    ack = frames["ACK"].command.ack
    assert ack.ack_type == pb.CommandAck.Cumulative
    assert frames["FLOW"].command.flow.messagePermits == 1000


# --- framing errors ----------------------------------------------------------------------------


def test_over_limit_frame_is_refused_from_its_header():
    dec = F.FrameDecoder(max_frame_size=1024)
    with pytest.raises(ProtocolError) as info:
        dec.feed(struct.pack(">I", 1025))  # only the size: refused before any body arrives
    assert info.value.peer_fault
    assert "exceeds" in str(info.value)


def test_default_limit_follows_max_message_size():
    assert F.DEFAULT_MAX_FRAME_SIZE == 5 * 1024 * 1024 + F.FRAME_HEADROOM
    assert F.max_frame_size_for(1 << 20) == (1 << 20) + F.FRAME_HEADROOM
    big = E.build_entry(_metadata(), b"x" * (5 * 1024 * 1024))  # a maximal message fits
    assert len(F.FrameDecoder().feed(F.encode_with_entry(C.send(0, 0), big))) == 1


def test_errors_are_sticky():
    dec = F.FrameDecoder()
    with pytest.raises(ProtocolError) as first:
        dec.feed(struct.pack(">I", 2) + b"\x00\x00")
    with pytest.raises(ProtocolError) as again:
        dec.feed(F.encode_command(C.ping()))
    assert again.value is first.value


@pytest.mark.parametrize(
    "data,needle",
    [
        (struct.pack(">I", 0), "too small"),
        (struct.pack(">I", 3) + b"abc", "too small"),
        (struct.pack(">II", 6, 9) + b"xx", "exceeds its frame"),
        (_frame_bytes(b"\xff\xff\xff"), "undecodable"),
        (_frame_bytes(b""), "without a type"),
        (_frame_bytes(bytes.fromhex("0806")), "SEND without its command"),
        (_frame_bytes(bytes.fromhex("08063200")), "lacks required fields"),
        (
            _frame_bytes(
                T(type=T.SEND, send=pb.CommandSend(producer_id=1, sequence_id=1)).SerializeToString()
            ),
            "without an entry",
        ),
        (_frame_bytes(C.ping().SerializeToString(), b"junk"), "unexpected bytes"),
    ],
)
def test_framing_errors(data, needle):
    with pytest.raises(ProtocolError) as info:
        F.FrameDecoder().feed(data)
    assert needle in str(info.value)
    assert info.value.peer_fault


def test_unknown_command_type_is_reported_with_its_number():
    with pytest.raises(ProtocolError) as info:
        F.FrameDecoder().feed(_frame_bytes(bytes.fromhex("0863")))  # type 99
    assert info.value.command_type == 99
    assert "unknown command type 99" in str(info.value)
    assert info.value.server_error == ServerError.UnsupportedVersionError


def test_incomplete_command_error_carries_the_command():
    cmd = T(type=T.PRODUCER)
    cmd.producer.topic = "t"
    cmd.producer.request_id = 5  # producer_id missing
    with pytest.raises(ProtocolError) as info:
        F.FrameDecoder().feed(_frame_bytes(cmd.SerializePartialToString()))
    assert info.value.command.producer.request_id == 5
    assert info.value.command_type == T.PRODUCER


def test_ping_without_its_empty_command_is_accepted():
    (frame,) = F.FrameDecoder().feed(_frame_bytes(bytes.fromhex("0812")))
    assert frame.type == T.PING and frame.command.HasField("ping")


def test_bad_entry_checksum_when_decoder_verifies():
    entry = bytearray(E.build_entry(_metadata(), b"hello"))
    entry[-1] ^= 0xFF
    data = F.encode_with_entry(C.send(4, 8), bytes(entry))
    assert F.FrameDecoder().feed(data)[0].entry == bytes(entry)  # default: left to the broker
    with pytest.raises(ChecksumError) as info:
        F.FrameDecoder(verify_checksums=True).feed(data)
    assert info.value.server_error == ServerError.ChecksumError
    assert info.value.peer_fault
    assert info.value.command.send.sequence_id == 8


def test_encoding_an_incomplete_command_is_our_fault():
    with pytest.raises(ProtocolError) as info:
        F.encode_command(T(type=T.SUCCESS, success=pb.CommandSuccess()))
    assert not info.value.peer_fault


# --- entries -----------------------------------------------------------------------------------


def test_build_and_parse_entry():
    md = _metadata(partition_key="key", event_time=5)
    md.properties.add(key="a", value="b")
    entry = E.build_entry(md, b"\x00payload")
    got_md, payload = E.parse_entry(entry)
    assert got_md == md and payload == b"\x00payload"
    assert E.parse_metadata(entry) == md
    assert E.verify_checksum(entry) is True


def test_unchecksummed_entry_gets_magic_and_crc():
    md = _metadata()
    entry = E.build_entry(md, b"x")
    bare = entry[6:]
    assert not E.is_checksummed(bare)
    assert E.verify_checksum(bare) is False
    assert E.ensure_checksummed(bare) == entry
    assert E.parse_entry(bare) == (md, b"x")


def test_checksum_mismatch():
    entry = bytearray(E.build_entry(_metadata(), b"hello"))
    entry[-1] ^= 0x01  # a payload byte
    with pytest.raises(ChecksumError):
        E.ensure_checksummed(bytes(entry))
    with pytest.raises(ChecksumError):
        E.parse_entry(bytes(entry))
    E.parse_entry(bytes(entry), verify_checksum=False)  # the caller vouched for it


@pytest.mark.parametrize(
    "entry",
    [
        b"",
        b"\x0e\x01\x00",
        b"\x00\x00",
        struct.pack(">I", 100) + b"short",
        struct.pack(">I", 3) + b"\xff\xff\xff",
        struct.pack(">I", 0),  # metadata without its required fields
    ],
)
def test_malformed_entries(entry):
    with pytest.raises(MalformedEntry):
        E.parse_entry(E.ensure_checksummed(entry) if len(entry) >= 4 and entry[:2] != b"\x0e\x01" else entry)


def test_broker_entry_metadata_prefix_is_skipped():
    entry = E.build_entry(_metadata(), b"v")
    bem = pb.BrokerEntryMetadata(broker_timestamp=123, index=4).SerializeToString()
    prefixed = struct.pack(">HI", 0x0E02, len(bem)) + bem + entry
    got, rest = E.strip_broker_entry_metadata(prefixed)
    assert got.broker_timestamp == 123 and rest == entry
    assert E.parse_entry(prefixed)[1] == b"v"
    assert E.strip_broker_entry_metadata(entry) == (None, entry)
    with pytest.raises(MalformedEntry):
        E.strip_broker_entry_metadata(struct.pack(">HI", 0x0E02, 50) + b"x")
