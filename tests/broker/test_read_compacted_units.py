"""The pure parts of the read-compacted source: what a compacted entry looks like on delivery,
its delivery bitset, the last receivable batch index, and a view's reads up to its horizon."""

from __future__ import annotations

import pytest

from compactmq.broker.compacted_source import for_delivery, last_batch_index
from compactmq.compaction.compacted_ledger import CompactedLedgerReader, CompactedLedgerWriter
from compactmq.compaction.service import LedgerView
from compactmq.protocol import batch as batch_codec
from compactmq.protocol import frames
from compactmq.protocol import pulsar_pb2 as pb
from compactmq.protocol.commands import indexes_from_ack_set
from compactmq.storage.position import Position



def single(key: str, payload: bytes) -> bytes:
    md = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1, partition_key=key)
    return frames.build_entry(md, payload)


def batch(messages, codec=pb.NONE) -> bytes:
    """``messages``: (key, payload, event_time[, compacted_out])."""
    items = []
    for m in messages:
        meta = pb.SingleMessageMetadata(partition_key=m[0], payload_size=len(m[1]))
        if len(m) > 3 and m[3]:
            meta.compacted_out = True
        items.append(batch_codec.BatchItem(meta, m[1]))
    md = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1, compression=codec)
    return frames.build_entry(md, batch_codec.encode_batch_payload(md, items))


def items_of(entry: bytes):
    md, payload = frames.parse_entry(entry)  # the CRC must hold after a rewrite
    return md, batch_codec.decode_batch(md, payload)


def test_single_message_is_delivered_as_stored():
    entry = single("k", b"v")
    assert for_delivery(entry) == (entry, None)
    assert last_batch_index(entry) == -1


def test_batch_without_placeholders_needs_no_bitset():
    entry = batch([("a", b"1", 0), ("b", b"2", 0)])
    assert for_delivery(entry) == (entry, None)
    assert last_batch_index(entry) == 1


@pytest.mark.parametrize("codec", [pb.NONE, pb.LZ4, pb.ZSTD], ids=["none", "lz4", "zstd"])
def test_placeholders_in_the_middle_are_masked(codec):
    entry = batch([("a", b"1", 0), ("b", b"", 0, True), ("c", b"3", 0)], codec=codec)
    out, mask = for_delivery(entry)
    assert out == entry
    assert indexes_from_ack_set(mask) == {0, 2}
    assert last_batch_index(entry) == 2


@pytest.mark.parametrize("codec", [pb.NONE, pb.LZ4, pb.ZLIB], ids=["none", "lz4", "zlib"])
def test_placeholders_at_the_end_are_cut_off_and_survivors_keep_their_indexes(codec):
    entry = batch([("a", b"", 0, True), ("b", b"2", 0), ("c", b"", 0, True), ("d", b"", 0, True)], codec=codec)
    out, mask = for_delivery(entry)
    md, items = items_of(out)
    assert md.num_messages_in_batch == 2 and md.compression == codec
    assert [(i.meta.partition_key, i.payload, i.meta.compacted_out) for i in items] == [
        ("a", b"", True), ("b", b"2", False)]
    assert indexes_from_ack_set(mask) == {1}
    assert last_batch_index(entry) == 1


def test_trailing_placeholders_after_a_single_survivor():
    out, mask = for_delivery(batch([("a", b"1", 0), ("b", b"", 0, True)]))
    md, items = items_of(out)
    assert md.num_messages_in_batch == 1 and mask is None
    assert [i.payload for i in items] == [b"1"]


def test_view_reads_stop_at_the_horizon_and_find_by_binary_search(tmp_path):
    path = str(tmp_path / "1.compacted")
    w = CompactedLedgerWriter(path)
    for eid in (2, 5, 9, 14):
        w.append(7, eid, single(f"k{eid}", b"v%d" % eid))
    w.append(8, 0, single("late", b"x"))
    w.finish()
    view = LedgerView(1, Position(7, 20), CompactedLedgerReader(path))
    assert [p for p, _ in view.read(Position(-1, -1), 10)] == [(7, 2), (7, 5), (7, 9), (7, 14)]
    assert [p for p, _ in view.read(Position(7, 6), 10)] == [(7, 9), (7, 14)]
    assert view.read(Position(7, 15), 10) == []
    assert view.get(Position(7, 9)) is not None and view.get(Position(7, 8)) is None
