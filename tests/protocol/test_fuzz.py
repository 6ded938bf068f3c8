"""Hostile bytes: the codec answers with our errors only, and always returns.

Anything but ProtocolError (MalformedEntry included) or ChecksumError escaping from here would
crash a connection handler or a compaction run instead of being answered.
"""

from __future__ import annotations

import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compactmq.errors import ChecksumError, ProtocolError
from compactmq.protocol import batch as B
from tests.protocol import client_commands as C
from compactmq.protocol import compression as Z
from compactmq.protocol import frames as F
from compactmq.protocol import entry_format as E
from compactmq.protocol import pulsar_pb2 as pb

from .helpers import ALL_TYPES, minimal_command, real_client_frames

OURS = (ProtocolError, ChecksumError)
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

REAL_STREAM = b"".join(f["raw"] for f in real_client_frames())


def _valid_stream() -> bytes:
    md = pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=2, partition_key="k")
    parts = [
        F.encode_command(minimal_command(t))
        for t in ALL_TYPES
        if t not in (pb.BaseCommand.SEND, pb.BaseCommand.MESSAGE)
    ]
    parts.append(F.encode_with_entry(C.send(0, 1), E.build_entry(md, b"v")))
    return b"".join(parts)


VALID_STREAM = _valid_stream()


def _feed_chunks(decoder: F.FrameDecoder, data: bytes, cuts: list[int]) -> list[F.Frame]:
    frames = []
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    for a, b in zip(points, points[1:]):
        frames += decoder.feed(data[a:b])
    return frames


@FUZZ
@given(st.binary(max_size=2048), st.lists(st.integers(min_value=0), max_size=8), st.booleans())
def test_random_bytes(data, cuts, verify):
    dec = F.FrameDecoder(max_frame_size=4096, verify_checksums=verify)
    try:
        _feed_chunks(dec, data, cuts)
    except OURS:
        pass


@FUZZ
@given(st.binary(min_size=1, max_size=600), st.booleans())
def test_random_frames_with_plausible_sizes(body, verify):
    # Sizes right, content random: exercises the protobuf and entry checks, not just the sizes.
    cmd_size = body[0] % (len(body)) if len(body) > 1 else 0
    data = struct.pack(">II", 4 + len(body) - 1, cmd_size) + body[1:]
    try:
        F.FrameDecoder(verify_checksums=verify).feed(data)
    except OURS:
        pass


@FUZZ
@given(
    st.sampled_from([VALID_STREAM, REAL_STREAM]),
    st.integers(min_value=0),
    st.lists(st.integers(min_value=0), max_size=6),
)
def test_truncations_of_valid_streams_never_fail(stream, cut, cuts):
    # A cut stream is just an incomplete one: a prefix of the frames, the rest waits.
    prefix = stream[: cut % (len(stream) + 1)]
    dec = F.FrameDecoder(verify_checksums=True)
    frames = _feed_chunks(dec, prefix, cuts)
    whole = F.FrameDecoder(verify_checksums=True).feed(stream)
    assert frames == whole[: len(frames)]
    assert dec.buffered == len(prefix) - sum(len(_reencode(f)) for f in frames)


def _reencode(frame: F.Frame) -> bytes:
    if frame.entry is None:
        return F.encode_command(frame.command)
    return F.encode_with_entry(frame.command, frame.entry)


@FUZZ
@given(
    st.sampled_from([VALID_STREAM, REAL_STREAM]),
    st.lists(st.tuples(st.integers(min_value=0), st.integers(1, 255)), min_size=1, max_size=4),
    st.booleans(),
)
def test_corrupted_valid_streams(stream, flips, verify):
    data = bytearray(stream)
    for pos, mask in flips:
        data[pos % len(data)] ^= mask
    try:
        F.FrameDecoder(verify_checksums=verify).feed(bytes(data))
    except OURS:
        pass


@FUZZ
@given(st.binary(max_size=512), st.booleans())
def test_random_entries(data, verify):
    for candidate in (data, b"\x0e\x01" + data, b"\x0e\x02" + data):
        try:
            md, payload = E.parse_entry(candidate, verify_checksum=verify)
        except OURS:
            continue
        try:
            B.decode_batch(md, payload, max_uncompressed_size=1 << 16)
        except OURS:
            pass
    try:
        E.ensure_checksummed(data)
    except OURS:
        pass


@FUZZ
@given(
    st.sampled_from(list(Z.CODECS) + [7]),
    st.binary(max_size=512),
    st.integers(min_value=-5, max_value=1 << 20),
)
def test_random_compressed_payloads(codec, data, size):
    try:
        out = Z.decompress(codec, data, size, max_size=1 << 16)
    except OURS:
        return
    assert codec == Z.NONE or len(out) == size


@FUZZ
@given(st.binary(max_size=512), st.integers(min_value=-2, max_value=50))
def test_random_batch_records(data, count):
    try:
        B.decode_records(data, count)
    except OURS:
        pass


@FUZZ
@given(
    st.lists(st.tuples(st.text(max_size=8), st.binary(max_size=64), st.booleans()), max_size=10),
    st.sampled_from(Z.CODECS),
)
def test_batch_round_trip(records, codec):
    items = [
        B.BatchItem(pb.SingleMessageMetadata(partition_key=k, compacted_out=gone), b"" if gone else v)
        for k, v, gone in records
    ]
    md = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=0, compression=codec)
    payload = B.encode_batch_payload(md, items)
    got_md, got_payload = E.parse_entry(E.build_entry(md, payload))
    decoded = B.decode_batch(got_md, got_payload)
    assert [(d.meta.partition_key, d.meta.compacted_out, d.payload) for d in decoded] == [
        (i.meta.partition_key, i.meta.compacted_out, i.payload) for i in items
    ]
