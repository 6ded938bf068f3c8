"""Read-compacted consumers and readers over the wire, with the official pulsar-client.

One standalone broker per module (``broker`` from conftest); compaction runs in this process
against the broker's data directory (a read-only ``Storage`` beside the broker, as the
``compact-topic`` job does) on the session's one SparkSession. The broker learns of each new
compacted ledger from the metadata store.

Every behaviour of issue 5 is one test, most with batching on and off, plus the failure cases
Pulsar is known for (tail tombstone, batch with one tombstone, empty topic, all keys deleted,
compaction between two reads, reconnect after acks in the compacted range, reader at latest
inclusive).
"""

from __future__ import annotations

import os
import time

import pytest

pulsar = pytest.importorskip("pulsar")

from .conftest import make_client, wait_unacked  # noqa: E402
from .rest import wait_until  # noqa: E402
from .factories import compaction_factory, compactor  # noqa: E402,F401 - every test runs on each factory

pytestmark = pytest.mark.integration

#: the module's broker runs in this process (``harness.fixtures``): a restart is a new
#: ``BrokerServer`` on the same data directory, without a Python process start each time
BROKER_IN_PROCESS = True

Earliest = pulsar.InitialPosition.Earliest
BATCHING = pytest.mark.parametrize("batching", [False, True], ids=["nobatch", "batch"])

# --- helpers ------------------------------------------------------------------------------------


def compact(broker, topic: str):
    """One compaction of ``topic`` run here, committed through the broker's metadata store, by
    the compaction service factory the broker is configured with. As ``compact-topic`` does, it
    first has the running broker seal the topic's current ledger (a run reads sealed ledgers only)."""
    from compactmq.compaction import load_factory
    from compactmq.config import load_config
    from compactmq.storage import Storage
    from compactmq.storage.seal import NOT_SEALED, seal_before_compaction

    config = load_config(
        overrides={k: v for k, v in broker.overrides.items() if k == "compactionServiceFactoryClassName"}
    )
    assert seal_before_compaction(broker.data_dir, config, topic) != NOT_SEALED
    storage = Storage(broker.data_dir, config, read_only=True)
    try:
        service = load_factory(config, storage).new_service(topic)
        try:
            return service.compact()
        finally:
            service.close()
    finally:
        storage.close()


def compaction_state(broker, topic: str):
    """The topic's compaction state as the broker's metadata store has it (read beside it)."""
    from compactmq.compaction.state import CompactionStates
    from compactmq.storage.metadata_store import create_metadata_store
    from compactmq.storage.resources import CompactionStateResources

    store = create_metadata_store("", data_dir=broker.data_dir)
    try:
        return CompactionStates(CompactionStateResources(store)).get(topic)
    finally:
        store.close()


def produce(client, topic: str, items, batching: bool, max_batch: int = 1000) -> list:
    """Send ``items`` = [(key or None, value bytes)] in order; b"" is a tombstone. Returns ids."""
    producer = client.create_producer(
        topic,
        batching_enabled=batching,
        batching_max_publish_delay_ms=50,
        batching_max_messages=max_batch,
        block_if_queue_full=True,
    )
    ids: list = [None] * len(items)

    def done(i):
        def cb(res, mid):
            assert res == pulsar.Result.Ok, res
            ids[i] = mid

        return cb

    for i, (key, value) in enumerate(items):
        kw = {"partition_key": key} if key is not None else {}
        if batching:
            producer.send_async(value, done(i), **kw)
        else:
            ids[i] = producer.send(value, **kw)
    producer.flush()
    producer.close()
    return ids


def latest(items) -> dict:
    """Latest value per key: what a compacted view (plus tail) must leave a consumer with."""
    out: dict = {}
    for key, value in items:
        if key is None:
            continue
        if value == b"":
            out.pop(key, None)
        else:
            out[key] = value
    return out


def mid_tuple(mid) -> tuple:
    return (mid.ledger_id(), mid.entry_id(), mid.batch_index())


def read_available(reader, timeout_ms: int = 5000) -> list:
    """Read while has_message_available(): a lie (True, then nothing comes) fails the test."""
    out = []
    while reader.has_message_available():
        try:
            msg = reader.read_next(timeout_ms)
        except pulsar.Timeout:
            pytest.fail(f"has_message_available() was True but nothing came after {len(out)} messages")
        out.append(msg)
    return out


def as_records(msgs) -> list:
    return [(mid_tuple(m.message_id()), m.partition_key() or None, m.data()) for m in msgs]


def apply(state: dict, msgs) -> dict:
    for m in msgs:
        key = m.partition_key()
        if not key:
            continue
        if m.data() == b"":
            state.pop(key, None)
        else:
            state[key] = m.data()
    return state


def compacted_reader(client, topic, start=None, **kw):
    return client.create_reader(
        topic, start if start is not None else pulsar.MessageId.earliest, is_read_compacted=True, **kw
    )


def subscribe_compacted(client, topic: str, batching: bool):
    """Subscription ``s`` reading the compacted view from the earliest position, batch-index
    acknowledgements on with ``batching``."""
    return client.subscribe(
        topic, "s", initial_position=Earliest, is_read_compacted=True, batch_index_ack_enabled=batching
    )


def drain(consumer, timeout_ms=500, first_ms=10_000) -> list:
    """Receive until ``timeout_ms`` pass without a message; the first may take ``first_ms`` (a
    loaded machine can be slow to deliver it). Expecting nothing: pass ``first_ms`` too."""
    out = []
    while True:
        try:
            out.append(consumer.receive(first_ms if not out else timeout_ms))
        except pulsar.Timeout:
            return out


def assert_increasing(records) -> None:
    ids = [r[0] for r in records]
    assert ids == sorted(set(ids)), f"ids not strictly increasing (gap/duplicate/reorder): {ids}"


@pytest.fixture
def spark_ready(compactor):
    """What compaction in this process needs (the SparkSession for the Spark factory)."""
    return compactor


def kv(n_keys: int, rounds: int, prefix: str = "k") -> list:
    return [(f"{prefix}{i}", b"r%d-v%d" % (r, i)) for r in range(rounds) for i in range(n_keys)]


# --- subscribe ----------------------------------------------------------------------------------


@BATCHING
def test_read_compacted_accepted_for_exclusive_failover_and_readers(
    broker, client, topic, spark_ready, batching
):
    items = kv(3, 2)
    produce(client, topic, items, batching)
    compact(broker, topic)
    want = latest(items)
    for sub_type in (pulsar.ConsumerType.Exclusive, pulsar.ConsumerType.Failover):
        c = client.subscribe(
            topic, f"s-{sub_type}", consumer_type=sub_type, initial_position=Earliest, is_read_compacted=True
        )
        got = drain(c)
        assert {m.partition_key(): m.data() for m in got} == want
        assert len(got) == len(want)
        c.close()
    reader = compacted_reader(client, topic)
    assert apply({}, read_available(reader)) == want


def test_read_compacted_refused_for_shared_and_key_shared(broker, client, topic):
    # the official client refuses by itself, before any SUBSCRIBE goes out ...
    for sub_type in (pulsar.ConsumerType.Shared, pulsar.ConsumerType.KeyShared):
        with pytest.raises(pulsar.InvalidConfiguration):
            client.subscribe(topic, "s", consumer_type=sub_type, is_read_compacted=True)
    # ... and the broker refuses other clients with a clear error
    from tests.protocol import client_commands as commands
    from compactmq.protocol import pulsar_pb2 as pb

    from .test_broker_client import RawClient

    wire = RawClient(broker.port)
    try:
        for i, sub_type in enumerate((pb.CommandSubscribe.Shared, pb.CommandSubscribe.Key_Shared)):
            cmd = commands.subscribe(topic, "raw", i + 1, 100 + i, sub_type=sub_type, read_compacted=True)
            wire.send(cmd)
            reply = wire.recv()
            assert reply.type == pb.BaseCommand.ERROR, reply
            assert reply.error.error == pb.NotAllowedError
            assert "Exclusive and Failover" in reply.error.message
        # Exclusive with read_compacted is fine on the same connection
        wire.send(commands.subscribe(topic, "raw", 9, 109, read_compacted=True))
        assert wire.recv().type == pb.BaseCommand.SUCCESS
        # not on a non-persistent topic
        np_topic = topic.replace("persistent://", "non-persistent://")
        wire.send(commands.subscribe(np_topic, "raw", 10, 110, read_compacted=True))
        reply = wire.recv()
        assert reply.type == pb.BaseCommand.ERROR and reply.error.error == pb.NotAllowedError
    finally:
        wire.close()


# --- compacted ledger then topic ----------------------------------------------------------------


@BATCHING
def test_compacted_view_then_topic_without_gap_or_duplicate(broker, client, topic, spark_ready, batching):
    before = kv(20, 5)
    produce(client, topic, before, batching)
    result = compact(broker, topic)
    after = kv(5, 2, prefix="k1")  # keys k10..k14 again, and new ones
    produce(client, topic, after, batching)
    got = as_records(read_available(compacted_reader(client, topic)))
    assert_increasing(got)
    horizon = tuple(result.horizon)
    below = [r for r in got if r[0][:2] <= horizon]
    above = [r for r in got if r[0][:2] > horizon]
    # below the horizon: exactly the latest value per key as of the horizon, original ids
    assert {k: v for _, k, v in below} == latest(before) and len(below) == len(latest(before))
    # above it: every message published after the compaction, in order
    assert [(k, v) for _, k, v in above] == after
    # the compacted part keeps the original ids: each equals the id the producer got
    full = as_records(read_available(client.create_reader(topic, pulsar.MessageId.earliest)))
    by_id = {r[0]: r for r in full}
    for r in below:
        assert by_id[r[0]] == r


@BATCHING
def test_reader_from_an_id_inside_the_compacted_range(broker, client, topic, spark_ready, batching):
    items = kv(30, 3)
    produce(client, topic, items, batching)
    compact(broker, topic)
    view = as_records(read_available(compacted_reader(client, topic)))
    assert len(view) == 30
    pick = view[11]
    # the reader's start id is one the compacted ledger holds: binary search lands on it
    start = pulsar.MessageId(-1, pick[0][0], pick[0][1], pick[0][2])
    after = as_records(read_available(compacted_reader(client, topic, start)))
    assert after == view[12:]
    inclusive = as_records(
        read_available(compacted_reader(client, topic, start, start_message_id_inclusive=True))
    )
    assert inclusive == view[11:]


@BATCHING
def test_consumer_without_read_compacted_reads_the_full_backlog(broker, client, topic, spark_ready, batching):
    items = kv(4, 5) + [("k0", b"")]
    produce(client, topic, items, batching)
    compact(broker, topic)
    assert compaction_state(broker, topic).compacted_ledger_id is not None
    c = client.subscribe(topic, "plain", initial_position=Earliest)
    got = drain(c)
    assert [(m.partition_key(), m.data()) for m in got] == items
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    assert [(m.partition_key(), m.data()) for m in read_available(reader)] == items
    # and GET_LAST_MESSAGE_ID for it is the topic's own last id (the tombstone)
    assert mid_tuple(c.get_last_message_id())[:2] == mid_tuple(got[-1].message_id())[:2]


# --- GET_LAST_MESSAGE_ID / has_message_available -------------------------------------------------


@BATCHING
def test_tail_tombstone_after_compaction(broker, client, topic, spark_ready, batching):
    items = kv(3, 2) + [("k2", b""), ("k1", b"")]
    produce(client, topic, items, batching)
    compact(broker, topic)
    reader = compacted_reader(client, topic)
    got = read_available(reader)
    assert apply({}, got) == {"k0": b"r1-v0"} and len(got) == 1
    # the last id the broker reports is the last message this reader can receive
    last = reader.get_last_message_id() if hasattr(reader, "get_last_message_id") else None
    if last is not None:
        assert mid_tuple(last) == mid_tuple(got[-1].message_id())
    assert not reader.has_message_available()
    with pytest.raises(pulsar.Timeout):
        reader.read_next(300)


@BATCHING
def test_tail_keyless_messages_do_not_count(broker, client, topic, spark_ready, batching):
    items = kv(2, 2) + [(None, b"keyless-1"), (None, b"keyless-2")]
    produce(client, topic, items, batching)
    compact(broker, topic)
    c = client.subscribe(topic, "s", initial_position=Earliest, is_read_compacted=True)
    got = drain(c)
    assert {m.partition_key(): m.data() for m in got} == latest(items) and len(got) == 2
    last = c.get_last_message_id()
    assert mid_tuple(last) == mid_tuple(got[-1].message_id())
    reader = compacted_reader(client, topic)
    assert len(read_available(reader)) == 2


def test_batch_with_one_tombstone(broker, client, topic, spark_ready):
    # one batch: values for k0..k4 and a tombstone for k2 in the middle
    items = [("k0", b"a"), ("k1", b"b"), ("k2", b"c"), ("k3", b"d"), ("k2", b""), ("k4", b"e")]
    ids = produce(client, topic, items, batching=True)
    assert len({(m.ledger_id(), m.entry_id()) for m in ids}) == 1, "the test wants one batch"
    compact(broker, topic)
    reader = compacted_reader(client, topic)
    got = read_available(reader)
    # no empty placeholder reaches the application, survivors keep their batch indexes
    assert [(m.partition_key(), m.data(), m.message_id().batch_index()) for m in got] == [
        ("k0", b"a", 0),
        ("k1", b"b", 1),
        ("k3", b"d", 3),
        ("k4", b"e", 5),
    ]
    # a durable consumer acks all of them; reconnecting gets nothing back
    c = client.subscribe(topic, "s", initial_position=Earliest, is_read_compacted=True)
    got = drain(c)
    assert [m.data() for m in got] == [b"a", b"b", b"d", b"e"]
    c.acknowledge_cumulative(got[-1])
    c.close()
    c = client.subscribe(topic, "s", initial_position=Earliest, is_read_compacted=True)
    assert drain(c, 500, 500) == []


def test_batch_whose_tail_is_compacted_out(broker, client, topic, spark_ready):
    # the last message of the batch is deleted by the next one: last receivable index is 1
    items = [("k0", b"a"), ("k1", b"b"), ("k2", b"c"), ("k2", b"")]
    produce(client, topic, items, batching=True)
    compact(broker, topic)
    reader = compacted_reader(client, topic)
    got = read_available(reader)
    assert [(m.partition_key(), m.message_id().batch_index()) for m in got] == [("k0", 0), ("k1", 1)]
    c = client.subscribe(topic, "s", initial_position=Earliest, is_read_compacted=True)
    assert mid_tuple(c.get_last_message_id()) == mid_tuple(got[-1].message_id())


def test_empty_topic(broker, client, topic, spark_ready):
    client.create_producer(topic).close()  # the topic exists, with nothing in it
    result = compact(broker, topic)
    assert result.compacted_ledger_id is None
    reader = compacted_reader(client, topic)
    assert not reader.has_message_available()
    with pytest.raises(pulsar.Timeout):
        reader.read_next(300)
    # a message published afterwards arrives
    produce(client, topic, [("k", b"v")], batching=False)
    assert reader.read_next(5000).data() == b"v"


@BATCHING
def test_all_keys_deleted(broker, client, topic, spark_ready, batching):
    items = kv(5, 2) + [(f"k{i}", b"") for i in range(5)]
    produce(client, topic, items, batching)
    result = compact(broker, topic)
    assert result.messages_kept == 0
    reader = compacted_reader(client, topic)
    assert read_available(reader) == []
    with pytest.raises(pulsar.Timeout):
        reader.read_next(300)
    c = client.subscribe(topic, "s", initial_position=Earliest, is_read_compacted=True)
    assert drain(c, 300, 300) == []
    assert c.get_last_message_id().entry_id() == -1 or mid_tuple(c.get_last_message_id())[1] < 0
    # new data after the horizon is served from the topic
    produce(client, topic, [("k9", b"new")], batching)
    assert reader.read_next(5000).data() == b"new"


# --- seek ---------------------------------------------------------------------------------------


@BATCHING
def test_seek_by_id_below_the_horizon_lands_in_the_compacted_ledger(
    broker, client, topic, spark_ready, batching
):
    items = kv(10, 3)
    produce(client, topic, items, batching)
    compact(broker, topic)
    produce(client, topic, [("t0", b"tail")], batching)
    reader = compacted_reader(client, topic)
    view = as_records(read_available(reader))
    assert len(view) == 11
    target = view[4]
    reader.seek(pulsar.MessageId(-1, target[0][0], target[0][1], target[0][2]))
    # the broker disconnected the reader before answering the seek: wait for it to subscribe again
    wait_until(reader.is_connected, what="the reader to reconnect after its seek")
    again = as_records(read_available(reader))
    # the reader excludes the id it seeks to, as readers do; what follows is the compacted view
    assert again in (view[5:], view[4:])
    c = client.subscribe(topic, "s", initial_position=Earliest, is_read_compacted=True)
    drain(c)
    c.seek(pulsar.MessageId.earliest)
    assert as_records(drain(c)) == view  # drain waits for the first message after the seek


@BATCHING
def test_seek_by_time_below_the_horizon_lands_in_the_compacted_ledger(
    broker, client, topic, spark_ready, batching
):
    first = kv(10, 2)
    produce(client, topic, first, batching)
    time.sleep(0.05)
    t_mid = int(time.time() * 1000)
    time.sleep(0.05)
    second = kv(10, 1, prefix="x")
    produce(client, topic, second, batching)
    compact(broker, topic)
    c = client.subscribe(topic, "s", initial_position=Earliest, is_read_compacted=True)
    everything = as_records(drain(c))
    assert len(everything) == 20
    c.seek(t_mid)
    got = as_records(drain(c))
    # only the compacted entries published after t_mid: the "x" keys, from the compacted ledger
    assert [k for _, k, _ in got] == [k for k, _ in second]
    assert got == everything[10:]


@BATCHING
def test_reader_at_latest_inclusive_gets_the_last_compacted_message(
    broker, client, topic, spark_ready, batching
):
    items = kv(4, 2) + [("k1", b""), (None, b"keyless")]
    produce(client, topic, items, batching)
    compact(broker, topic)
    view = as_records(read_available(compacted_reader(client, topic)))
    reader = client.create_reader(
        topic, pulsar.MessageId.latest, is_read_compacted=True, start_message_id_inclusive=True
    )
    # the client resolves "latest, inclusive" in has_message_available(): GET_LAST_MESSAGE_ID,
    # then a SEEK to that id, which must be the last message of the compacted view
    assert reader.has_message_available()
    msg = reader.read_next(5000)
    assert as_records([msg]) == [view[-1]]
    assert not reader.has_message_available()


# --- a compaction lands while a consumer reads ---------------------------------------------------


@BATCHING
def test_compaction_between_two_reads_misses_no_delete(broker, client, topic, spark_ready, batching):
    keys = 200
    items = kv(keys, 2)
    produce(client, topic, items, batching)
    first = compact(broker, topic)
    reader = compacted_reader(client, topic, receiver_queue_size=5)
    seen = [reader.read_next(5000) for _ in range(60)]
    state = apply({}, seen)
    # deletes and updates of keys the reader already saw (and of some it has not), then a new view
    more = (
        [(f"k{i}", b"") for i in range(0, 60, 3)]
        + [(f"k{i}", b"new%d" % i) for i in range(1, 200, 7)]
        + [(f"k{i}", b"") for i in range(150, 160)]
    )
    produce(client, topic, more, batching)
    second = compact(broker, topic)
    assert second.compacted_ledger_id != first.compacted_ledger_id
    from compactmq.compaction.compacted_ledger import compacted_ledger_path

    # the compactor deleted the first view's file; the reader keeps reading it
    assert not os.path.exists(compacted_ledger_path(broker.data_dir, topic, first.compacted_ledger_id))
    rest = read_available(reader)
    records = as_records(seen + rest)
    assert_increasing(records)
    assert apply(state, rest) == latest(items + more)
    # a reader that starts now reads the new view only
    fresh = read_available(compacted_reader(client, topic))
    assert apply({}, fresh) == latest(items + more)
    assert len(fresh) == len(latest(items + more))


@BATCHING
def test_durable_consumer_across_a_new_compaction_misses_no_delete(
    broker, client, topic, spark_ready, batching
):
    items = kv(100, 2)
    produce(client, topic, items, batching)
    compact(broker, topic)
    c = client.subscribe(
        topic,
        "s",
        initial_position=Earliest,
        is_read_compacted=True,
        receiver_queue_size=5,
        batch_index_ack_enabled=batching,
    )
    seen = [c.receive(5000) for _ in range(40)]
    for m in seen:
        c.acknowledge(m)
    c.close()  # the subscription stays, with its pinned view
    more = [(f"k{i}", b"") for i in range(0, 40, 2)] + [("k99", b"")]
    produce(client, topic, more, batching)
    compact(broker, topic)
    c = subscribe_compacted(client, topic, batching)
    rest = drain(c)
    records = as_records(seen + rest)
    assert_increasing(records)
    assert apply(apply({}, seen), rest) == latest(items + more)


# --- acknowledgements ---------------------------------------------------------------------------


@BATCHING
def test_reconnect_after_acks_in_the_compacted_range(broker, client, topic, spark_ready, batching):
    items = kv(20, 3)
    produce(client, topic, items, batching)
    compact(broker, topic)
    c = subscribe_compacted(client, topic, batching)
    got = drain(c)
    assert len(got) == 20
    acked = got[::2]  # individual acks with gaps, all inside the compacted range
    for m in acked:
        c.acknowledge(m)
    c.close()
    c = subscribe_compacted(client, topic, batching)
    again = drain(c)
    assert as_records(again) == as_records(got[1::2])
    for m in again:
        c.acknowledge(m)
    c.close()
    c = subscribe_compacted(client, topic, batching)
    assert drain(c, 300, 300) == []


@BATCHING
def test_reconnect_after_cumulative_ack_in_the_compacted_range(broker, client, topic, spark_ready, batching):
    # (a cumulative ack in the middle of a batch reaches the broker only with batch-index acks)
    items = kv(20, 3)
    produce(client, topic, items, batching)
    compact(broker, topic)
    c = subscribe_compacted(client, topic, batching)
    got = drain(c)
    c.acknowledge_cumulative(got[9])
    c.close()
    c = subscribe_compacted(client, topic, batching)
    assert as_records(drain(c)) == as_records(got[10:])


# --- restart ------------------------------------------------------------------------------------


@BATCHING
def test_restart_keeps_the_view_and_horizon(broker, topic, spark_ready, batching):
    client = make_client(broker.url)
    items = kv(30, 3) + [("k3", b"")]
    # batches of 10: the cumulative ack below ends an entry (partial batch acks live in memory)
    produce(client, topic, items, batching, max_batch=10)
    result = compact(broker, topic)
    tail = [("k4", b"tail"), ("k5", b"")]
    produce(client, topic, tail, batching)
    view = as_records(read_available(compacted_reader(client, topic)))
    c = client.subscribe(topic, "s", initial_position=Earliest, is_read_compacted=True)
    got = drain(c)
    # acknowledge up to the end of an entry near the middle
    cut = next(
        i
        for i in range(len(got) // 2, len(got) - 1)
        if got[i].message_id().entry_id() != got[i + 1].message_id().entry_id()
    )
    c.acknowledge_cumulative(got[cut])
    c.close()
    client.close()

    broker.restart()
    state = compaction_state(broker, topic)
    assert state.compacted_ledger_id == result.compacted_ledger_id and state.horizon == result.horizon
    client = make_client(broker.url)
    try:
        assert as_records(read_available(compacted_reader(client, topic))) == view
        c = client.subscribe(topic, "s", initial_position=Earliest, is_read_compacted=True)
        assert as_records(drain(c)) == view[cut + 1 :]
        # a reader resuming from an id inside the compacted range
        mid = view[5][0]
        start = pulsar.MessageId(-1, mid[0], mid[1], mid[2])
        assert as_records(read_available(compacted_reader(client, topic, start))) == view[6:]
    finally:
        client.close()


def _assert_resumes_after_restart(broker, topic, seen, items) -> None:
    """Restart the broker; subscription ``s`` (read-compacted), which acknowledged ``seen``,
    resumes after them in order, and what it saw and reads now leaves the latest of ``items``."""
    broker.restart()
    client = make_client(broker.url)
    try:
        c = client.subscribe(topic, "s", initial_position=Earliest, is_read_compacted=True)
        rest = drain(c)
        assert_increasing(as_records(seen + rest))
        assert apply(apply({}, seen), rest) == latest(items)
    finally:
        client.close()


def test_durable_subscription_part_way_through_a_replaced_view_resumes_from_the_topic(
    broker, topic, spark_ready
):
    """After a restart the pinned view's file is gone if a newer compaction replaced it: the
    subscription resumes from the topic (every tombstone is still there), not the newer view."""
    client = make_client(broker.url)
    items = kv(50, 2)
    produce(client, topic, items, False)
    compact(broker, topic)
    c = client.subscribe(topic, "s", initial_position=Earliest, is_read_compacted=True, receiver_queue_size=3)
    seen = [c.receive(5000) for _ in range(20)]
    c.acknowledge_cumulative(seen[-1])
    c.close()
    more = [(f"k{i}", b"") for i in range(0, 20, 2)]
    produce(client, topic, more, False)
    compact(broker, topic)
    client.close()
    _assert_resumes_after_restart(broker, topic, seen, items + more)


def test_durable_subscription_that_started_on_the_topic_stays_on_it_after_a_restart(
    broker, topic, spark_ready
):
    """Subscribed before any compaction, it reads the topic itself; a compaction and a restart
    later it must not jump into the compacted view (which lacks the tombstones it needs)."""
    client = make_client(broker.url)
    items = kv(20, 2)
    produce(client, topic, items, False)
    c = client.subscribe(topic, "s", initial_position=Earliest, is_read_compacted=True, receiver_queue_size=3)
    seen = [c.receive(5000) for _ in range(25)]
    c.acknowledge_cumulative(seen[-1])
    c.close()
    more = [(f"k{i}", b"") for i in range(5)]
    produce(client, topic, more, False)
    compact(broker, topic)
    client.close()
    _assert_resumes_after_restart(broker, topic, seen, items + more)


def test_cumulative_ack_of_a_batch_whose_tail_is_compacted_out_acknowledges_it(
    broker, client, topic, spark_ready
):
    """Without batch-index acks the client acknowledges a batch only when every index of it is
    acknowledged; placeholders at the end of a compacted batch are never delivered, so the broker
    trims them before delivery and a cumulative ack on the last survivor completes the batch."""
    items = [("k0", b"a"), ("k1", b"b"), ("k2", b"c"), ("k3", b"d"), ("k2", b""), ("k3", b"")]
    produce(client, topic, items, batching=True)
    compact(broker, topic)
    c = client.subscribe(topic, "s", initial_position=Earliest, is_read_compacted=True)
    got = drain(c)
    assert [(m.data(), m.message_id().batch_index()) for m in got] == [(b"a", 0), (b"b", 1)]
    c.acknowledge_cumulative(got[-1])
    c.close()
    c = client.subscribe(topic, "s", initial_position=Earliest, is_read_compacted=True)
    assert drain(c, 500, 500) == []


@BATCHING
def test_failover_takeover_redelivers_from_the_compacted_view(broker, client, topic, spark_ready, batching):
    items = kv(30, 3)
    produce(client, topic, items, batching)
    compact(broker, topic)
    failover = pulsar.ConsumerType.Failover
    first = client.subscribe(
        topic,
        "s",
        consumer_type=failover,
        consumer_name="a",
        initial_position=Earliest,
        is_read_compacted=True,
        batch_index_ack_enabled=batching,
    )
    second = client.subscribe(
        topic,
        "s",
        consumer_type=failover,
        consumer_name="b",
        initial_position=Earliest,
        is_read_compacted=True,
        batch_index_ack_enabled=batching,
    )
    # one is inactive: once the first has drained, the other has had as long to deliver
    from_first = drain(first, 500, 3000)
    from_second = drain(second, 500, 500 if from_first else 3000)
    active, got_a = (first, from_first) if from_first else (second, from_second)
    assert len(got_a) == 30
    for m in got_a[:10]:
        active.acknowledge(m)
    wait_unacked(broker, topic, "s", 20)  # the broker has the (grouped, batch-index) acks
    first.close()
    second.close()
    again = client.subscribe(
        topic,
        "s",
        consumer_type=failover,
        consumer_name="c",
        initial_position=Earliest,
        is_read_compacted=True,
        batch_index_ack_enabled=batching,
    )
    rest = drain(again)
    # what was not acknowledged comes again from the compacted view, not from the raw topic
    assert as_records(rest) == as_records(got_a[10:])


def test_read_compacted_consumer_joining_an_existing_subscription(broker, client, topic, spark_ready):
    items = kv(10, 3) + [("k0", b"")]
    produce(client, topic, items, batching=False)
    compact(broker, topic)
    # created by a consumer that did not ask for compaction, nothing consumed: compacted view
    plain = client.subscribe(topic, "fresh", initial_position=Earliest)
    plain.close()
    c = client.subscribe(topic, "fresh", initial_position=Earliest, is_read_compacted=True)
    got = drain(c)
    assert apply({}, got) == latest(items) and len(got) == len(latest(items))
    c.close()
    # one that already consumed part of the raw topic keeps reading the raw topic
    plain = client.subscribe(topic, "used", initial_position=Earliest, receiver_queue_size=1)
    seen = [plain.receive(5000) for _ in range(5)]
    plain.acknowledge_cumulative(seen[-1])
    plain.close()
    c = client.subscribe(topic, "used", initial_position=Earliest, is_read_compacted=True)
    rest = drain(c)
    assert [(m.partition_key(), m.data()) for m in rest] == items[5:]


class HeldReads:
    """Holds the in-process broker's reads of ``topic``'s raw entries (its ``LedgerEntrySource``)
    until ``release()``: a read stays in flight while consumers come and go. ``entered`` is set
    when a read waits. The broker's loop awaits the gate in its thread pool, so it keeps serving."""

    def __init__(self, broker, topic: str) -> None:
        import asyncio
        import threading

        self.topic = broker.server.service.topics.loaded[topic]
        self.source = self.topic.source
        self.entered = threading.Event()
        self._gate = threading.Event()
        original = self.source.read

        async def held(start, max_entries):
            self.entered.set()
            await asyncio.get_running_loop().run_in_executor(None, self._gate.wait, 30)
            return await original(start, max_entries)

        self.source.read = held

    def release(self) -> None:
        self._gate.set()
        del self.source.read  # the class's method again

    def active_permits(self, subscription: str) -> int:
        dispatcher = self.topic.subscriptions[subscription].dispatcher
        active = getattr(dispatcher, "active", None)
        return active.permits.available if active is not None else 0


def test_read_compacted_consumer_joining_while_a_raw_read_is_in_flight(broker, client, topic, spark_ready):
    """The interleaving a loaded CI machine hit: the plain consumer's raw read of the whole topic
    is still in flight when it closes and a read-compacted consumer joins the subscription and
    grants permits. That read must be dropped, not delivered: the newcomer gets the compacted view."""
    items = kv(10, 3) + [("k0", b"")]
    produce(client, topic, items, batching=False)
    compact(broker, topic)
    held = HeldReads(broker, topic)
    try:
        plain = client.subscribe(topic, "fresh", initial_position=Earliest)
        assert held.entered.wait(10), "the plain consumer's read did not start"
        plain.close()
        c = client.subscribe(topic, "fresh", initial_position=Earliest, is_read_compacted=True)
        wait_until(lambda: held.active_permits("fresh") > 0, timeout=10, what="the newcomer's permits")
    finally:
        held.release()
    got = drain(c)
    assert apply({}, got) == latest(items) and len(got) == len(latest(items))
    c.close()
