"""Property: a key's latest value (``broker.latest_values``) equals what replaying the topic
compacted -- the compacted view, then every entry after its horizon -- leaves for that key, over
random histories of single messages, batches, tombstones, keyless messages, compactions and
lookups at random points (so the tail index is caught up and rebased as it would be in a broker).

In process, with real parts: a ``Storage`` in a temporary directory, the broker's ``Topic`` and
``BrokerService``, and the Arrow test compaction factory (``tests.broker.arrow_compaction``:
compaction is not the subject here, and it needs no Spark). The reference replay decodes every
message itself; it shares nothing with the indexes but the protocol codec.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compactmq.broker.latest_values import LatestValues
from compactmq.broker.server import BrokerService
from compactmq.broker.topics import Topic
from compactmq.compaction import load_factory
from compactmq.config import load_config
from compactmq.naming import TopicName
from compactmq.protocol import batch as batch_codec
from compactmq.protocol import entry_format
from compactmq.protocol import pulsar_pb2 as pb
from compactmq.storage import Storage
from compactmq.storage.position import Position

from harness.wait import wait_until

from .factories import ARROW_FACTORY

KEYS = ["a", "b", "c", "d", "e"]
_names = itertools.count()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    cfg = load_config(
        overrides={
            "managedLedgerSyncData": False,
            "managedLedgerMaxEntriesPerLedger": 7,  # histories cross ledgers
            "managedLedgerMinLedgerRolloverTimeMinutes": 0,
            "compactionServiceFactoryClassName": ARROW_FACTORY,
        }
    )
    storage = Storage(str(tmp_path_factory.mktemp("latest")), cfg)
    # its compaction monitor serves the topics' compaction services (not started: no checks)
    service = BrokerService(cfg, storage, "pulsar://127.0.0.1:1")
    yield cfg, storage, service
    service.executor.shutdown()
    storage.close()


def message(key, value: bytes, i: int) -> bytes:
    md = pb.MessageMetadata(producer_name="p", sequence_id=i, publish_time=1000 + i)
    if key is not None:
        md.partition_key = key
    md.properties.add(key="i", value=str(i))
    return entry_format.build_entry(md, value)


def batch(messages, i: int, codec: int) -> bytes:
    items = []
    for j, (key, value) in enumerate(messages):
        meta = pb.SingleMessageMetadata(payload_size=len(value), event_time=5000 + j)
        if key is not None:
            meta.partition_key = key
        items.append(batch_codec.BatchItem(meta, value))
    md = pb.MessageMetadata(producer_name="p", sequence_id=i, publish_time=1000 + i, compression=codec)
    md.num_messages_in_batch = len(items)
    return entry_format.build_entry(md, batch_codec.encode_batch_payload(md, items))


def replay(service, ml) -> dict:
    """key -> (value, ledger, entry, batch index) after reading compacted from the start."""
    state: dict = {}
    view = service.open_view()
    entries = []
    start = Position(-1, -1)
    if view is not None:
        entries += view.read(start, 1 << 30)
        start = Position(view.horizon[0], view.horizon[1] + 1)
    entries += ml.read_entries(start, 1 << 30)
    for pos, entry in entries:
        md, payload = entry_format.parse_entry(entry)
        items = batch_codec.decode_batch(md, payload)
        for index, (meta, data) in enumerate(items):
            if meta.compacted_out or not meta.HasField("partition_key"):
                continue
            if data == b"":
                state.pop(meta.partition_key, None)
            else:
                bi = index if batch_codec.is_batch(md) else -1
                state[meta.partition_key] = (data, pos[0], pos[1], bi)
    return state


key = st.sampled_from(KEYS + [None])
value = st.sampled_from([b"", b"v1", b"v22", b"v333"])
op = st.one_of(
    st.tuples(st.just("msg"), key, value),
    st.tuples(
        st.just("batch"),
        st.lists(st.tuples(key, value), min_size=1, max_size=5),
        st.sampled_from([pb.NONE, pb.LZ4, pb.ZSTD]),
    ),
    st.tuples(st.just("compact")),
    st.tuples(st.just("lookup")),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(history=st.lists(op, min_size=1, max_size=25))
def test_every_key_answers_what_a_replay_holds(world, history):
    cfg, storage, broker = world
    name = f"persistent://public/default/latest-prop-{next(_names)}"
    ml = storage.open_managed_ledger(name)
    topic = Topic(broker, TopicName.parse(name), ml)
    service = load_factory(cfg, storage).new_service(name)
    latest = LatestValues(1 << 20)  # one topic's tail fits: the indexed path

    def check():
        want = replay(service, ml)
        got = latest.lookup_blocking(topic, [k.encode() for k in KEYS] + [b"never"])
        for k, msg in zip(KEYS + ["never"], got):
            if k not in want:
                assert msg is None, (k, msg)
                continue
            assert msg is not None, (k, want[k])
            assert (msg.value, msg.ledger_id, msg.entry_id, msg.batch_index) == want[k], k

    for i, step in enumerate(history):
        if step[0] == "msg":
            ml.append(message(step[1], step[2], i))
        elif step[0] == "batch":
            ml.append(batch(step[1], i, step[2]))
        elif step[0] == "compact":
            ml.rollover()
            service.compact()
        else:
            check()
    check()


def test_an_overflowed_tail_is_scanned_and_says_so(world):
    cfg, storage, broker = world
    name = f"persistent://public/default/latest-overflow-{next(_names)}"
    ml = storage.open_managed_ledger(name)
    topic = Topic(broker, TopicName.parse(name), ml)
    for i in range(40):
        ml.append(message(f"k{i % 20}", f"v{i}".encode(), i))
    latest = LatestValues(10 * 300)  # room for 10 keys of the 20
    got = latest.lookup_blocking(topic, [b"k3", b"k19", b"nope"])
    assert [m.value if m else None for m in got] == [b"v23", b"v39", None]
    stats = latest.topic_stats(name)
    assert stats["overflowed"] is True and stats["keys"] == 0 and stats["tailScans"] == 1
    ml.append(message("k3", b"newer", 99))
    assert latest.lookup_blocking(topic, [b"k3"])[0].value == b"newer"  # a scan sees the newest
    assert latest.topic_stats(name)["tailScans"] == 2
    # a compaction moves the horizon: the (now empty) tail is indexed again
    ml.rollover()
    load_factory(cfg, storage).new_service(name).compact()
    assert latest.lookup_blocking(topic, [b"k3"])[0].value == b"newer"
    stats = latest.topic_stats(name)
    assert stats["overflowed"] is False and stats["tailScans"] == 2


def test_the_least_recently_asked_tail_is_evicted_first(world):
    cfg, storage, broker = world
    topics = []
    for t in range(2):
        name = f"persistent://public/default/latest-evict-{next(_names)}"
        ml = storage.open_managed_ledger(name)
        for i in range(10):
            ml.append(message(f"k{i}", b"v", i))
        topics.append(Topic(broker, TopicName.parse(name), ml))
    latest = LatestValues(15 * 300)  # one tail of 10 keys fits, not two
    assert latest.lookup_blocking(topics[0], [b"k1"])[0] is not None
    assert latest.lookup_blocking(topics[1], [b"k1"])[0] is not None
    assert latest.topic_stats(topics[0].name) is None  # evicted
    assert latest.topic_stats(topics[1].name)["keys"] == 10 and latest.evictions == 1


def test_a_new_view_is_indexed_in_the_background_while_the_previous_one_answers(world):
    cfg, storage, broker = world
    name = f"persistent://public/default/latest-switch-{next(_names)}"
    ml = storage.open_managed_ledger(name)
    topic = Topic(broker, TopicName.parse(name), ml)
    service = load_factory(cfg, storage).new_service(name)
    for i in range(30):
        ml.append(message(f"k{i % 10}", f"v{i}".encode(), i))
    ml.rollover()
    service.compact()
    latest = LatestValues(1 << 20)
    first = service.open_view()
    assert latest.lookup_blocking(topic, [b"k1"])[0].value == b"v21"  # the first lookup builds
    assert latest.topic_stats(name)["viewId"] == first.view_id
    ml.append(message("k1", b"", 40))  # a tombstone, then a newer view without k1
    ml.append(message("k2", b"v41", 41))
    ml.rollover()
    service.compact()
    second = service.open_view()
    assert second.view_id != first.view_id
    got = latest.lookup_blocking(topic, [b"k1", b"k2", b"k3"])
    assert [m and m.value for m in got] == [None, b"v41", b"v23"]
    assert latest.topic_stats(name)["viewId"] == first.view_id  # answered by the previous view + tail

    def switched():
        assert latest.lookup_blocking(topic, [b"k2"])[0].value == b"v41"
        return latest.topic_stats(name)["viewId"] == second.view_id

    assert wait_until(switched, 10, "lookups to move to the new view once its index is built")
    stats = latest.topic_stats(name)
    assert stats["viewId"] == second.view_id and stats["keys"] == 0  # the tail is past the new horizon


def test_view_key_indexes_of_other_topics_go_beyond_their_bound(world):
    cfg, storage, broker = world
    topics = []
    for t in range(2):
        name = f"persistent://public/default/latest-views-{next(_names)}"
        ml = storage.open_managed_ledger(name)
        for i in range(10):
            ml.append(message(f"k{i}", f"v{t}".encode(), i))
        ml.rollover()
        load_factory(cfg, storage).new_service(name).compact()
        topics.append(Topic(broker, TopicName.parse(name), ml))
    latest = LatestValues(1 << 20, max_view_bytes=1)  # room for no index but the asked one's
    assert latest.lookup_blocking(topics[0], [b"k1"])[0].value == b"v0"
    assert latest.topic_stats(topics[0].name)["keyIndexEvictions"] == 0
    assert latest.lookup_blocking(topics[1], [b"k1"])[0].value == b"v1"
    stats = latest.topic_stats(topics[1].name)
    assert (
        stats["keyIndexEvictions"] == 1
        and stats["keyIndexesSizeBytes"] == stats["compactedKeyIndex"]["sizeBytes"]
    )
    assert latest.lookup_blocking(topics[0], [b"k2"])[0].value == b"v0"  # rebuilt on demand
    assert latest.topic_stats(topics[0].name)["keyIndexEvictions"] == 2
