"""The pure parts of the read-compacted source: what a compacted entry looks like on delivery,
its delivery bitset, the last receivable batch index, and a view's reads up to its horizon."""

from __future__ import annotations

import pytest

from compactmq.broker import compacted_source
from compactmq.broker.compacted_source import for_delivery, last_batch_index, within_budget
from compactmq.compaction.compacted_ledger import CompactedLedgerReader
from compactmq.compaction.compacted_writer import CompactedLedgerWriter
from compactmq.compaction.service import LedgerView
from compactmq.protocol import batch as batch_codec
from compactmq.protocol import entry_format
from compactmq.protocol import pulsar_pb2 as pb
from compactmq.protocol.commands import indexes_from_ack_set
from compactmq.storage.position import Position


def single(key: str, payload: bytes) -> bytes:
    md = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1, partition_key=key)
    return entry_format.build_entry(md, payload)


def batch(messages, codec=pb.NONE) -> bytes:
    """``messages``: (key, payload, event_time[, compacted_out])."""
    items = []
    for m in messages:
        meta = pb.SingleMessageMetadata(partition_key=m[0], payload_size=len(m[1]))
        if len(m) > 3 and m[3]:
            meta.compacted_out = True
        items.append(batch_codec.BatchItem(meta, m[1]))
    md = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1, compression=codec)
    return entry_format.build_entry(md, batch_codec.encode_batch_payload(md, items))


def items_of(entry: bytes):
    md, payload = entry_format.parse_entry(entry)  # the CRC must hold after a rewrite
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
    entry = batch(
        [("a", b"", 0, True), ("b", b"2", 0), ("c", b"", 0, True), ("d", b"", 0, True)], codec=codec
    )
    out, mask = for_delivery(entry)
    md, items = items_of(out)
    assert md.num_messages_in_batch == 2 and md.compression == codec
    assert [(i.meta.partition_key, i.payload, i.meta.compacted_out) for i in items] == [
        ("a", b"", True),
        ("b", b"2", False),
    ]
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


def test_a_read_holds_about_the_messages_the_consumers_can_take(tmp_path, monkeypatch):
    # the dispatcher asks for as many entries as its consumers have permits (messages): a read of
    # batches stops once they hold that many messages, not after that many entries (each entry
    # read is decoded for delivery; a read of 500 batches to send one was quadratic)
    monkeypatch.setattr(compacted_source, "READ_CHUNK", 3)  # reads cross chunks
    path = str(tmp_path / "1.compacted")
    w = CompactedLedgerWriter(path)
    for eid in range(10):
        w.append(7, eid, batch([(f"k{eid}-{i}", b"v", 0) for i in range(4)]))  # 4 messages each
    w.append(7, 10, single("s", b"v"))
    w.finish()
    view = LedgerView(1, Position(7, 10), CompactedLedgerReader(path))
    ids = lambda got: [p[1] for p, _ in got]  # noqa: E731
    assert ids(within_budget(view, Position(7, 0), 1)) == [0]  # at least one entry
    assert ids(within_budget(view, Position(7, 0), 4)) == [0]
    assert ids(within_budget(view, Position(7, 0), 5)) == [0, 1]
    assert ids(within_budget(view, Position(7, 2), 17)) == [2, 3, 4, 5, 6]  # 3 chunks
    assert ids(within_budget(view, Position(7, 8), 1000)) == [8, 9, 10]  # the view ends
    assert within_budget(view, Position(7, 11), 1000) == []
    w2 = str(tmp_path / "2.compacted")
    w = CompactedLedgerWriter(w2)
    for eid in range(7):
        w.append(9, eid, single(f"k{eid}", b"v"))
    w.finish()
    plain = LedgerView(2, Position(9, 6), CompactedLedgerReader(w2))
    assert ids(within_budget(plain, Position(9, 0), 5)) == [0, 1, 2, 3, 4]  # one message each


# --- the settings cache and reader pins follow the broker's clock ------------------------------


class _Filter:
    def __init__(self, mode):
        self.mode = mode


class _Service:
    """A compaction service that answers only what TopicViews asks for the retention mode."""

    def __init__(self):
        self.mode = "retention-bounded"
        self.asked = 0

    def retention_filter(self):
        self.asked += 1
        return _Filter(self.mode)


class _Broker:
    def __init__(self, clock, service):
        self.clock = clock
        self.compaction_monitor = self
        self._service = service

    def service_of(self, topic):
        return self._service


class _Ledger:
    def first_position(self):
        return Position(1, 0)


class _Topic:
    name = "persistent://public/default/clocked"

    def __init__(self, broker):
        self.service = broker
        self.ledger = _Ledger()


def test_retention_mode_is_cached_for_the_ttl_of_the_brokers_clock():
    from compactmq.broker.compacted_source import SETTINGS_TTL_SECONDS, TopicViews

    now = [1000.0]
    service = _Service()
    views = TopicViews(_Topic(_Broker(lambda: now[0], service)))
    assert views.retention_blocking().mode == "retention-bounded"
    service.mode = "keep-until-tombstone"
    now[0] += SETTINGS_TTL_SECONDS  # at the TTL: still cached
    assert views.retention_blocking().mode == "retention-bounded" and service.asked == 1
    now[0] += 0.001
    assert views.retention_blocking().mode == "keep-until-tombstone" and service.asked == 2
    assert views.keep_mode


def test_a_readers_pin_is_remembered_for_pin_memory_seconds_of_the_brokers_clock():
    from compactmq.broker.compacted_source import PIN_MEMORY_SECONDS, TopicViews

    now = [50.0]
    views = TopicViews(_Topic(_Broker(lambda: now[0], _Service())))
    views.remember("r1", "pin-1")
    views.remember("r2", "pin-2")
    now[0] += PIN_MEMORY_SECONDS - 0.001
    assert views.recall("r1") == "pin-1"
    assert views.recall("r1") is None  # recalled once
    now[0] += 0.001
    assert views.recall("r2") is None  # forgotten
