"""Batch payloads: decode what the real client sent, encode/decode for every codec,
compacted-out placeholders, single messages seen as one-item batches, malformed batches."""

from __future__ import annotations

import struct

import pytest

from compactmq.errors import MalformedEntry
from compactmq.protocol import batch as B
from compactmq.protocol import compression as Z
from compactmq.protocol import frames as F
from compactmq.protocol import entry_format as E
from compactmq.protocol import pulsar_pb2 as pb

from .helpers import real_client_frames

CODEC_OF_SCENARIO = {"NONE": Z.NONE, "LZ4": Z.LZ4, "ZLib": Z.ZLIB, "ZSTD": Z.ZSTD, "SNAPPY": Z.SNAPPY}


def _items(n=3, key="key"):
    return [
        B.BatchItem(
            pb.SingleMessageMetadata(partition_key=f"{key}{i}", sequence_id=i, event_time=10 + i),
            f"value-{i}".encode() * (i + 1),
        )
        for i in range(n)
    ]


def _md(codec=Z.NONE):
    return pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1, compression=codec)


@pytest.mark.parametrize("name", sorted(CODEC_OF_SCENARIO))
def test_real_client_batches(name):
    (f,) = [f for f in real_client_frames() if f["scenario"] == f"batch-{name}" and f["type"] == "SEND"]
    (frame,) = F.FrameDecoder(verify_checksums=True).feed(f["raw"])
    assert frame.command.send.num_messages == 3
    md, payload = E.parse_entry(frame.entry)
    assert B.is_batch(md) and md.num_messages_in_batch == 3
    assert md.compression == CODEC_OF_SCENARIO[name]
    # The client puts the first message's key on the batch's MessageMetadata as well.
    assert md.partition_key == "key0"
    items = B.decode_batch(md, payload)
    assert [i.meta.partition_key for i in items] == ["key0", "key1", "key2"]
    assert [i.payload for i in items] == [(f"value-{name}-{i}" * 20).encode() for i in range(3)]
    assert [i.meta.sequence_id for i in items] == [0, 1, 2]
    # Re-encoding the records gives back the client's uncompressed bytes exactly.
    raw = Z.decompress(md.compression, payload, md.uncompressed_size)
    assert B.encode_batch(items) == raw
    if md.compression in (Z.LZ4, Z.ZLIB, Z.ZSTD):  # same library defaults as the client
        again = pb.MessageMetadata()
        again.CopyFrom(md)
        assert B.encode_batch_payload(again, items) == payload
        assert again == md


@pytest.mark.parametrize("codec", Z.CODECS, ids=Z.codec_name)
def test_encode_decode_every_codec(codec):
    md = _md(codec)
    items = _items()
    payload = B.encode_batch_payload(md, items)
    assert md.num_messages_in_batch == 3
    assert md.HasField("uncompressed_size") == (codec != Z.NONE)
    entry = E.build_entry(md, payload)
    got_md, got_payload = E.parse_entry(entry)
    decoded = B.decode_batch(got_md, got_payload)
    assert [(i.meta.partition_key, i.payload) for i in decoded] == [
        (i.meta.partition_key, i.payload) for i in items
    ]
    assert all(d.meta.payload_size == len(d.payload) for d in decoded)


def test_record_layout_is_size_metadata_payload():
    meta = pb.SingleMessageMetadata(partition_key="k", payload_size=2)
    md_bytes = meta.SerializeToString()
    assert B.encode_batch([(meta, b"ab")]) == struct.pack(">I", len(md_bytes)) + md_bytes + b"ab"


def test_encode_sets_payload_size_without_touching_the_callers_metadata():
    meta = pb.SingleMessageMetadata(partition_key="k", payload_size=99)
    (item,) = B.decode_records(B.encode_batch([(meta, b"abc")]), 1)
    assert item.meta.payload_size == 3 and meta.payload_size == 99


def test_compacted_out_keeps_batch_indexes():
    items = _items(4)
    kept = [items[0], B.compacted_out(items[1].meta), items[2], B.compacted_out(items[3].meta)]
    md = _md(Z.LZ4)
    decoded = B.decode_batch(md, B.encode_batch_payload(md, kept))
    assert len(decoded) == 4
    assert [d.meta.compacted_out for d in decoded] == [False, True, False, True]
    assert decoded[1].payload == b"" and decoded[1].meta.partition_key == "key1"
    assert decoded[2].payload == items[2].payload
    assert not items[1].meta.compacted_out  # the original is untouched


def test_single_message_is_a_one_item_batch():
    md = _md()
    md.partition_key = "k"
    md.event_time = 77
    md.null_value = True
    md.properties.add(key="a", value="b")
    assert not B.is_batch(md)
    (item,) = B.decode_batch(md, b"")
    assert item.payload == b""
    assert item.meta.partition_key == "k" and item.meta.event_time == 77 and item.meta.null_value
    assert item.meta.payload_size == 0 and [(p.key, p.value) for p in item.meta.properties] == [("a", "b")]
    assert not item.meta.HasField("ordering_key")


def test_compressed_single_message():
    md = _md(Z.ZSTD)
    md.uncompressed_size = 5
    (item,) = B.decode_batch(md, Z.compress(Z.ZSTD, b"hello"))
    assert item.payload == b"hello"


def _raw(items):
    return B.encode_batch(items)


@pytest.mark.parametrize(
    "data,count",
    [
        (b"", 1),  # nothing where a record should be
        (b"\x00\x00", 1),  # truncated size
        (struct.pack(">I", 50) + b"x", 1),  # metadata larger than the batch
        (struct.pack(">I", 2) + b"\xff\xff", 1),  # undecodable metadata
        (struct.pack(">I", 0), 1),  # metadata without payload_size
        (_raw(_items(2)), 3),  # fewer records than announced
        (_raw(_items(2)) + b"x", 2),  # bytes after the last record
        (_raw(_items(2))[:-1], 2),  # payload cut short
        (_raw(_items(1)), -1),
    ],
)
def test_malformed_batches(data, count):
    with pytest.raises(MalformedEntry):
        B.decode_records(data, count)


def test_negative_payload_size():
    meta = pb.SingleMessageMetadata(payload_size=-5)
    md_bytes = meta.SerializeToString()
    with pytest.raises(MalformedEntry):
        B.decode_records(struct.pack(">I", len(md_bytes)) + md_bytes, 1)


def test_batch_with_corrupt_compression():
    md = _md(Z.LZ4)
    md.num_messages_in_batch = 1
    md.uncompressed_size = 100
    with pytest.raises(MalformedEntry):
        B.decode_batch(md, b"\xff\xff\xff")


def test_delivery_ack_set_hides_compacted_out_records():
    items = _items(4)
    assert B.delivery_ack_set(items) is None
    items[1] = B.compacted_out(items[1].meta)
    # Observed with pulsar-client 3.13: MESSAGE ack_set [0b1101] delivers indexes 0, 2, 3 only.
    assert B.delivery_ack_set(items) == [0b1101]
    assert B.delivery_ack_set([B.compacted_out(i.meta) for i in _items(2)]) == [0]
    big = _items(70)
    big[69] = B.compacted_out(big[69].meta)
    words = B.delivery_ack_set(big)
    assert len(words) == 2 and words[0] == -1 and words[1] == (1 << 5) - 1
