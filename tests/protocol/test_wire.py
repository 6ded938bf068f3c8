"""The wire fast path reads and writes exactly what the protobuf classes read and write, and
hands every shape it does not accept back to them."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compactmq.errors import MalformedEntry
from compactmq.protocol import commands, wire
from compactmq.protocol import frames as F
from compactmq.protocol import entry_format as E
from compactmq.protocol import pulsar_pb2 as pb

from .helpers import real_client_frames

T = pb.BaseCommand
IMPLS = [wire.PYTHON] + ([wire.NATIVE] if wire.NATIVE is not None else [])
both = pytest.mark.parametrize("impl", IMPLS, ids=lambda i: i.name)
U64 = st.integers(min_value=0, max_value=(1 << 64) - 1)
I32 = st.integers(min_value=-(1 << 31), max_value=(1 << 31) - 1)
I64 = st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1)


def _send_bytes(**fields) -> bytes:
    cmd = pb.BaseCommand(type=T.SEND)
    for name, value in fields.items():
        setattr(cmd.send, name, value)
    return cmd.SerializeToString()


def _fields_of_pb(entry: bytes) -> dict:
    return {k: getattr(wire.fields_of(E.parse_metadata(entry)), k) for k in wire.MetadataFields.__slots__}


def _fields(md) -> dict:
    return {k: getattr(md, k) for k in wire.MetadataFields.__slots__}


# --- SEND ---------------------------------------------------------------------------------------


def test_real_client_sends_take_the_fast_path_with_the_protobuf_values():
    sends = [f for f in real_client_frames() if f["type"] == "SEND"]
    assert sends
    for f in sends:
        (frame,) = F.FrameDecoder().feed(f["raw"])
        assert isinstance(frame, F.SendFrame)
        (slow,) = F.FrameDecoder(verify_checksums=True).feed(f["raw"])  # the protobuf path
        assert isinstance(slow, F.Frame)
        body = slow.command.send
        assert (frame.send.producer_id, frame.send.sequence_id) == (body.producer_id, body.sequence_id)
        assert frame.send.num_messages == body.num_messages
        assert frame.send.highest_sequence_id == body.highest_sequence_id
        assert frame.entry == slow.entry and type(frame.entry) is bytes
        assert frame.command == slow.command and frame.body() == body
        assert F.encode_with_entry(frame.command, frame.entry) == f["raw"]


@both
@settings(max_examples=200, deadline=None)
@given(pid=U64, seq=U64, num=st.one_of(st.none(), I32), highest=st.one_of(st.none(), U64))
def test_decode_send_matches_protobuf(impl, pid, seq, num, highest):
    fields = {"producer_id": pid, "sequence_id": seq}
    if num is not None:
        fields["num_messages"] = num
    if highest is not None:
        fields["highest_sequence_id"] = highest
    data = _send_bytes(**fields)
    send = impl.decode_send(data, 0, len(data))
    body = F.decode_command(data).send
    assert send == (
        body.producer_id,
        body.sequence_id,
        body.num_messages,
        body.highest_sequence_id,
    )


@pytest.mark.parametrize(
    "fields",
    [
        {"txnid_least_bits": 1},
        {"txnid_most_bits": 1},
        {"is_chunk": True},
        {"marker": True},
    ],
)
def test_sends_of_other_shapes_go_to_protobuf(fields):
    data = _send_bytes(producer_id=1, sequence_id=2, **fields)
    for impl in IMPLS:
        assert impl.decode_send(data, 0, len(data)) is None
    entry = E.build_entry(pb.MessageMetadata(producer_name="p", sequence_id=2, publish_time=5), b"x")
    frame_bytes = struct.pack(">II", 4 + len(data) + len(entry), len(data)) + data + entry
    (frame,) = F.FrameDecoder().feed(frame_bytes)
    assert isinstance(frame, F.Frame) and frame.command.send.producer_id == 1


@pytest.mark.parametrize(
    "data",
    [
        b"\x08\x06\x32\x02\x08\x01",  # no sequence_id: protobuf reports the missing field
        b"\x08\x06\x32\x04\x08\x01\x10",  # truncated
        b"\x08\x06\x32\x04\x08\x01\x10\x02\x08\x07",  # another BaseCommand field after the send
        b"\x08\x06\x32\x0c\x08" + b"\xff" * 11,  # overlong varint
        b"\x08\x07\x3a\x00",  # not a SEND
    ],
)
@both
def test_decode_send_refuses_what_it_does_not_fully_read(impl, data):
    assert impl.decode_send(data, 0, len(data)) is None


def test_a_send_without_producer_id_is_still_a_protocol_error():
    data = b"\x08\x06\x32\x02\x10\x01"
    frame_bytes = struct.pack(">II", 4 + len(data) + 1, len(data)) + data + b"e"
    with pytest.raises(F.ProtocolError, match="lacks required fields"):
        F.FrameDecoder().feed(frame_bytes)


def test_frames_split_anywhere_decode_alike():
    raw = b"".join(f["raw"] for f in real_client_frames() if f["scenario"] == "nobatch")
    whole = F.FrameDecoder().feed(raw)
    for cut in (1, 7, 13, 64, len(raw) - 3):
        d = F.FrameDecoder()
        parts = d.feed(raw[:cut]) + d.feed(bytearray(raw[cut:]))
        assert [(p.type, p.entry, p.command) for p in parts] == [(w.type, w.entry, w.command) for w in whole]
        assert d.buffered == 0


# --- MessageMetadata ----------------------------------------------------------------------------


@both
def test_real_client_entries_scan_like_protobuf(impl):
    entries = [F.FrameDecoder().feed(f["raw"])[0].entry for f in real_client_frames() if f["type"] == "SEND"]
    for entry in entries:
        start, end = wire.metadata_bounds(entry)
        scanned = impl.scan_metadata(entry, start, end)
        assert scanned is not None  # properties, keys, event time, batches: all plain shapes
        assert _fields(wire.MetadataFields(*scanned)) == _fields_of_pb(entry)
        assert E.publish_time_of(entry) == E.parse_metadata(entry).publish_time


@both
@settings(max_examples=200, deadline=None)
@given(
    publish_time=U64,
    batch=st.one_of(st.none(), I32),
    key=st.one_of(st.none(), st.text(max_size=20)),
    b64=st.booleans(),
    ordering=st.one_of(st.none(), st.binary(max_size=10)),
    deliver_at=st.one_of(st.none(), I64),
    props=st.lists(st.tuples(st.text(max_size=5), st.text(max_size=5)), max_size=3),
)
def test_scan_metadata_matches_protobuf(impl, publish_time, batch, key, b64, ordering, deliver_at, props):
    md = pb.MessageMetadata(producer_name="p-1", sequence_id=9, publish_time=publish_time)
    if batch is not None:
        md.num_messages_in_batch = batch
    if key is not None:
        md.partition_key = key
    if b64:
        md.partition_key_b64_encoded = True
    if ordering is not None:
        md.ordering_key = ordering
    if deliver_at is not None:
        md.deliver_at_time = deliver_at
    for k, v in props:
        md.properties.add(key=k, value=v)
    entry = E.build_entry(md, b"payload")
    assert _fields(E.metadata_fields(entry)) == _fields_of_pb(entry)
    start, end = wire.metadata_bounds(entry)
    scanned = impl.scan_metadata(entry, start, end)
    assert scanned is not None and _fields(wire.MetadataFields(*scanned)) == _fields_of_pb(entry)


def _raw_entry(metadata_bytes: bytes) -> bytes:
    return struct.pack(">I", len(metadata_bytes)) + metadata_bytes + b"payload"


@both
def test_metadata_of_other_shapes_goes_to_protobuf(impl):
    md = pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=2)
    md.encryption_keys.add(key="k", value=b"v")
    entry = E.build_entry(md, b"x")
    start, end = wire.metadata_bounds(entry)
    assert impl.scan_metadata(entry, start, end) is None
    assert E.metadata_fields(entry).publish_time == 2  # read through protobuf instead
    # an unknown field, and publish_time with the wrong wire type: protobuf decides
    base = md.__class__(producer_name="p", sequence_id=1, publish_time=2).SerializeToString()
    for extra in (b"\xa8\x06\x01", b"\x1a\x01x", b"\x32\x02\xff\xfe"):  # last: key not UTF-8
        entry = _raw_entry(base + extra)
        assert impl.scan_metadata(entry, 4, len(entry) - 7) is None
        assert _fields(E.metadata_fields(entry)) == _fields_of_pb(entry)


@pytest.mark.parametrize(
    "metadata_bytes",
    [
        b"\x0a\x01p\x10\x01",  # publish_time missing
        b"\x0a\x01p\x10\x01\x18",  # truncated
        b"\x0a\x09p\x10\x01\x18\x02",  # a length past the end
        b"\x0a\x01p\x10\x01\x18\x02\x22\x03\x0a\x01k",  # a property without its value
    ],
)
def test_malformed_metadata_raises_as_before(metadata_bytes):
    entry = _raw_entry(metadata_bytes)
    for impl in IMPLS:
        assert impl.scan_metadata(entry, 4, len(entry) - 7) is None
    with pytest.raises(MalformedEntry):
        E.parse_metadata(entry)
    with pytest.raises(MalformedEntry):
        E.metadata_fields(entry)


# --- SEND_RECEIPT and MESSAGE -------------------------------------------------------------------


@both
@settings(max_examples=300, deadline=None)
@given(
    pid=U64,
    seq=U64,
    ledger=st.one_of(st.just(-1), U64),
    entry_id=st.one_of(st.just(-1), U64),
    partition=I32,
    highest=st.one_of(st.none(), U64),
)
def test_send_receipt_bytes_equal_protobuf(impl, pid, seq, ledger, entry_id, partition, highest):
    expected = F.encode_command(
        commands.send_receipt(pid, seq, ledger, entry_id, partition=partition, highest_sequence_id=highest)
    )
    assert impl.send_receipt_frame(pid, seq, ledger, entry_id, partition, highest) == expected


@both
@settings(max_examples=300, deadline=None)
@given(
    consumer=U64,
    ledger=U64,
    entry_id=U64,
    partition=I32,
    redelivery=st.integers(min_value=0, max_value=(1 << 32) - 1),
    ack_set=st.one_of(st.none(), st.lists(I64, max_size=40)),
    batch_index=st.one_of(st.none(), st.integers(min_value=-1, max_value=1 << 20)),
    entry=st.binary(min_size=1, max_size=40),
)
def test_message_frame_equals_protobuf(
    impl, consumer, ledger, entry_id, partition, redelivery, ack_set, batch_index, entry
):
    mid = (ledger, entry_id, partition) if batch_index is None else (ledger, entry_id, partition, batch_index)
    expected = F.encode_with_entry(
        commands.message(consumer, mid, redelivery_count=redelivery, ack_set=ack_set), entry
    )
    head = impl.message_frame_header(
        consumer, ledger, entry_id, partition, redelivery, ack_set, len(entry), batch_index
    )
    assert head + entry == expected


def test_varints():
    for value in (0, 1, 127, 128, 300, (1 << 63) - 1, (1 << 64) - 1):
        data = wire.encode_varint(value)
        assert wire.read_varint(data, 0, len(data)) == (value, len(data))
    assert wire.encode_varint(-1) == b"\xff" * 9 + b"\x01"
    with pytest.raises(ValueError):
        wire.read_varint(b"\x80", 0, 1)


def test_the_native_twin_is_used_when_built():
    import importlib.util
    import os

    built = importlib.util.find_spec("compactmq.protocol._wire") is not None
    if os.environ.get("COMPACTMQ_NATIVE") == "0" or not built:
        assert wire.IMPLEMENTATION is wire.PYTHON
    else:
        assert wire.IMPLEMENTATION is wire.NATIVE and wire.NATIVE.name == "native"


# --- whole entries --------------------------------------------------------------------------------


@both
def test_scan_entry_and_checked_publish_time(impl):
    md = pb.MessageMetadata(
        producer_name="p", sequence_id=1, publish_time=1_700_000_000_123, partition_key="k"
    )
    entry = E.build_entry(md, b"payload" * 20)
    assert wire.MetadataFields(*impl.scan_entry(entry)).partition_key == "k"
    assert impl.checked_publish_time(entry) == 1_700_000_000_123
    unchecksummed = entry[6:]
    assert wire.MetadataFields(*impl.scan_entry(unchecksummed)).publish_time == 1_700_000_000_123
    # no checksum, a wrong one, a broker-entry-metadata prefix, truncated sizes: the general path
    assert impl.checked_publish_time(unchecksummed) is None
    corrupt = entry[:-1] + bytes([entry[-1] ^ 1])
    assert impl.checked_publish_time(corrupt) is None
    assert impl.scan_entry(b"\x0e\x02" + entry) is None
    assert impl.scan_entry(entry[:12]) is None and impl.checked_publish_time(b"\x0e\x01") is None


def test_checksummed_with_publish_time_answers_as_the_two_steps():
    md = pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=42)
    entry = E.build_entry(md, b"x")
    assert E.checksummed_with_publish_time(entry) == (entry, 42)
    assert E.checksummed_with_publish_time(entry[6:]) == (entry, 42)  # checksum added
    with pytest.raises(E.ChecksumError):
        E.checksummed_with_publish_time(entry[:-1] + b"y")
    with pytest.raises(MalformedEntry):
        E.checksummed_with_publish_time(_raw_entry(b"\x0a\x01p\x10\x01"))  # no publish time


@settings(max_examples=100, deadline=None)
@given(data=st.binary(max_size=300))
def test_native_crc32c_is_the_castagnoli_crc(data):
    if wire.NATIVE is not None:
        assert wire.NATIVE.crc32c(data) == E.crc32c(data)
