"""The standalone broker driven by the official pulsar-client: producing, consuming, readers,
subscription types, seek, schemas, errors."""

from __future__ import annotations

import socket
import struct
import time

import pytest

pulsar = pytest.importorskip("pulsar")

from harness.wait import wait_until  # noqa: E402

from .conftest import make_client, subscription_stats, wait_backlog, wait_unacked  # noqa: E402

pytestmark = pytest.mark.integration

Earliest = pulsar.InitialPosition.Earliest


def drain(consumer, timeout_ms=300, until=0, patience_s=15.0):
    """Receive until ``until`` messages came (waiting up to ``patience_s`` for them: the machine
    may be busy), then until nothing more comes for ``timeout_ms``."""
    out = []
    deadline = time.monotonic() + patience_s
    while True:
        left_ms = int((deadline - time.monotonic()) * 1000)
        wait = timeout_ms if len(out) >= until else max(timeout_ms, left_ms)
        try:
            out.append(consumer.receive(max(1, wait)))
        except pulsar.Timeout:
            if len(out) >= until or time.monotonic() >= deadline:
                return out


# --- producing and consuming --------------------------------------------------------------


@pytest.mark.parametrize(
    "batching, n",
    [
        pytest.param(False, 10_000, id="nobatch-10k"),
        # scale (a minute on two cores: 100k round trips of single messages); the 10k case above
        # crosses the same permit cycles and blocking queue, and 100k batched ones below run by default
        pytest.param(False, 100_000, id="nobatch-100k", marks=pytest.mark.slow),
        pytest.param(True, 100_000, id="batch-100k"),
    ],
)
def test_messages_in_order(client, topic, batching, n):
    consumer = client.subscribe(topic, "s", initial_position=Earliest, receiver_queue_size=2000)
    producer = client.create_producer(
        topic,
        batching_enabled=batching,
        max_pending_messages=5000,
        block_if_queue_full=True,
        batching_max_publish_delay_ms=5,
    )
    errors = []
    for i in range(n):
        producer.send_async(b"%d" % i, lambda res, mid: res == pulsar.Result.Ok or errors.append(res))
    producer.flush()
    assert errors == []
    last = None
    for i in range(n):
        msg = consumer.receive(10_000)
        assert msg.data() == b"%d" % i
        mid = msg.message_id()
        key = (mid.ledger_id(), mid.entry_id(), mid.batch_index())
        assert last is None or key > last
        last = key
        consumer.acknowledge(msg)
    assert drain(consumer, 200) == []


def test_send_receipts_carry_increasing_ids_and_properties_survive(client, topic):
    producer = client.create_producer(topic, batching_enabled=False)
    ids = [producer.send(b"x%d" % i, properties={"i": str(i)}, partition_key=f"k{i}") for i in range(5)]
    assert [(m.ledger_id(), m.entry_id()) for m in ids] == sorted((m.ledger_id(), m.entry_id()) for m in ids)
    assert len({m.entry_id() for m in ids}) == 5
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    for i in range(5):
        m = reader.read_next(5000)
        assert m.data() == b"x%d" % i and m.properties() == {"i": str(i)} and m.partition_key() == f"k{i}"
        assert m.message_id() == ids[i]


def test_ack_then_reconnect_delivers_nothing_acked(broker, topic):
    c1 = make_client(broker.url)
    producer = c1.create_producer(topic, batching_enabled=False)
    for i in range(10):
        producer.send(b"m%d" % i)
    consumer = c1.subscribe(topic, "s", initial_position=Earliest)
    got = [consumer.receive(5000) for _ in range(10)]
    for m in got[:6]:
        consumer.acknowledge(m)
    consumer.close()
    c1.close()
    c2 = make_client(broker.url)
    consumer = c2.subscribe(topic, "s", initial_position=Earliest)
    rest = drain(consumer, 1000, until=4)
    assert [m.data() for m in rest] == [b"m%d" % i for i in range(6, 10)]
    c2.close()


def test_cumulative_ack_and_redelivery_of_unacked(client, topic):
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(10):
        producer.send(b"m%d" % i)
    consumer = client.subscribe(topic, "s", initial_position=Earliest)
    msgs = [consumer.receive(5000) for _ in range(10)]
    consumer.acknowledge_cumulative(msgs[4])
    consumer.redeliver_unacknowledged_messages()
    again = drain(consumer, 1000, until=5)
    assert [m.data() for m in again] == [b"m%d" % i for i in range(5, 10)]
    assert all(m.redelivery_count() >= 1 for m in again)


def test_negative_ack_is_redelivered_with_a_count(client, topic):
    producer = client.create_producer(topic, batching_enabled=False)
    consumer = client.subscribe(
        topic,
        "s",
        consumer_type=pulsar.ConsumerType.Shared,
        initial_position=Earliest,
        negative_ack_redelivery_delay_ms=100,
    )
    for i in range(3):
        producer.send(b"n%d" % i)
    msgs = [consumer.receive(5000) for _ in range(3)]
    consumer.acknowledge(msgs[0])
    consumer.acknowledge(msgs[2])
    consumer.negative_acknowledge(msgs[1])
    m = consumer.receive(5000)
    assert m.data() == b"n1" and m.redelivery_count() == 1
    consumer.acknowledge(m)
    assert drain(consumer, 500) == []


def test_batch_index_ack(broker, client, topic):
    producer = client.create_producer(
        topic, batching_enabled=True, batching_max_messages=10, batching_max_publish_delay_ms=50
    )
    for i in range(10):
        producer.send_async(b"b%d" % i, None)
    producer.flush()
    consumer = client.subscribe(
        topic,
        "s",
        consumer_type=pulsar.ConsumerType.Shared,
        initial_position=Earliest,
        batch_index_ack_enabled=True,
    )
    msgs = [consumer.receive(5000) for _ in range(10)]
    assert len({(m.message_id().ledger_id(), m.message_id().entry_id()) for m in msgs}) == 1
    wait_unacked(broker, topic, "s", 10)
    for m in msgs[:4]:
        consumer.acknowledge(m)
    wait_unacked(broker, topic, "s", 6)  # the grouped batch-index acks reached the broker
    consumer.redeliver_unacknowledged_messages()
    again = drain(consumer, 1000, until=6)
    assert sorted(m.data() for m in again) == sorted(b"b%d" % i for i in range(4, 10))
    # redelivered with its ack set, the batch counts only the messages still unacknowledged
    assert subscription_stats(broker, topic, "s")["unackedMessages"] == 6


# --- readers, last message id, seek -----------------------------------------------------------


def test_has_message_available_on_empty_topic_and_after(client, topic):
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    assert reader.has_message_available() is False
    producer = client.create_producer(topic)
    producer.send(b"first")
    assert reader.has_message_available() is True
    assert reader.read_next(5000).data() == b"first"
    assert reader.has_message_available() is False
    latest = client.create_reader(topic, pulsar.MessageId.latest)
    assert latest.has_message_available() is False


def test_reader_start_message_id_inclusive_and_exclusive(client, topic):
    producer = client.create_producer(topic, batching_enabled=False)
    ids = [producer.send(b"r%d" % i) for i in range(5)]
    exclusive = client.create_reader(topic, ids[2])
    assert exclusive.read_next(5000).data() == b"r3"
    inclusive = client.create_reader(topic, ids[2], start_message_id_inclusive=True)
    assert inclusive.read_next(5000).data() == b"r2"
    latest = client.create_reader(topic, pulsar.MessageId.latest)
    producer.send(b"after")
    assert latest.read_next(5000).data() == b"after"


def test_reader_latest_inclusive_and_inside_a_batch(client, topic):
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(3):
        producer.send(b"%d" % i)
    latest_inclusive = client.create_reader(topic, pulsar.MessageId.latest, start_message_id_inclusive=True)
    assert latest_inclusive.has_message_available()
    assert latest_inclusive.read_next(5000).data() == b"2"
    batched = client.create_producer(topic + "-b", batching_enabled=True, batching_max_publish_delay_ms=50)
    ids = []
    for i in range(5):
        batched.send_async(b"b%d" % i, lambda res, mid: ids.append(mid))
    batched.flush()
    wait_until(lambda: len(ids) == 5, 5, "5 send receipts", interval=0.01)
    ids.sort(key=lambda m: (m.ledger_id(), m.entry_id(), m.batch_index()))
    assert (
        client.create_reader(topic + "-b", ids[2], start_message_id_inclusive=True).read_next(5000).data()
        == b"b2"
    )
    assert client.create_reader(topic + "-b", ids[2]).read_next(5000).data() == b"b3"


def test_seek_to_earliest_to_an_id_and_to_a_time(client, topic):
    producer = client.create_producer(topic, batching_enabled=False)
    ids = []
    for i in range(10):
        ids.append(producer.send(b"s%d" % i))
        if i == 4:
            time.sleep(0.05)
            middle_ts = int(time.time() * 1000)
            time.sleep(0.05)
    consumer = client.subscribe(topic, "s", initial_position=Earliest)
    for m in [consumer.receive(5000) for _ in range(10)]:
        consumer.acknowledge(m)

    consumer.seek(pulsar.MessageId.earliest)
    assert [m.data() for m in drain(consumer, 1000, until=10)] == [b"s%d" % i for i in range(10)]

    consumer.seek(ids[6])
    got = [m.data() for m in drain(consumer, 1000, until=3)]
    assert got[-3:] == [b"s7", b"s8", b"s9"] and got[0] in (b"s6", b"s7")

    consumer.seek(middle_ts)
    assert [m.data() for m in drain(consumer, 1000, until=5)] == [b"s%d" % i for i in range(5, 10)]


def test_reader_seek(client, topic):
    producer = client.create_producer(topic, batching_enabled=False)
    ids = [producer.send(b"q%d" % i) for i in range(6)]
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    for _ in range(6):
        reader.read_next(5000)
    reader.seek(ids[2])
    assert reader.read_next(5000).data() in (b"q2", b"q3")


def test_last_message_id_of_a_batch_names_its_last_message(client, topic):
    producer = client.create_producer(
        topic, batching_enabled=True, batching_max_messages=10, batching_max_publish_delay_ms=100
    )
    for i in range(10):
        producer.send_async(b"%d" % i, None)
    producer.flush()
    consumer = client.subscribe(topic, "s", initial_position=Earliest)
    last = consumer.get_last_message_id()
    assert last.batch_index() == 9
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    got = []
    while reader.has_message_available():
        got.append(reader.read_next(5000).data())
    assert got == [b"%d" % i for i in range(10)]  # has_message_available never stops inside it


def test_get_last_message_id(client, topic):
    producer = client.create_producer(topic, batching_enabled=False)
    last = [producer.send(b"l%d" % i) for i in range(3)][-1]
    consumer = client.subscribe(topic, "s", initial_position=Earliest)
    lid = consumer.get_last_message_id()
    assert (lid.ledger_id(), lid.entry_id()) == (last.ledger_id(), last.entry_id())


# --- subscription types -------------------------------------------------------------------


def test_second_exclusive_consumer_is_busy_and_connection_stays(client, topic):
    first = client.subscribe(topic, "excl", initial_position=Earliest)
    with pytest.raises(pulsar.ConsumerBusy):
        client.subscribe(topic, "excl")
    producer = client.create_producer(topic)
    producer.send(b"still-works")
    assert first.receive(5000).data() == b"still-works"


def test_shared_spreads_without_duplicates(client, topic):
    a = client.subscribe(topic, "sh", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=5)
    b = client.subscribe(topic, "sh", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=5)
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(40):
        producer.send_async(b"%d" % i, None)
    producer.flush()
    got_a, got_b = [], []
    deadline = time.time() + 10
    while len(got_a) + len(got_b) < 40 and time.time() < deadline:
        for c, acc in ((a, got_a), (b, got_b)):
            try:
                m = c.receive(50)
            except pulsar.Timeout:
                continue
            acc.append(m.data())
            c.acknowledge(m)
    assert len(got_a) + len(got_b) == 40
    assert got_a and got_b
    assert sorted(got_a + got_b) == sorted(b"%d" % i for i in range(40))


def test_failover_active_consumer_and_takeover(broker, client, topic):
    a = client.subscribe(topic, "fo", consumer_type=pulsar.ConsumerType.Failover, consumer_name="A")
    b = client.subscribe(topic, "fo", consumer_type=pulsar.ConsumerType.Failover, consumer_name="B")
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(10):
        producer.send(b"f%d" % i)
    got_a = drain(a, 500, until=10)
    assert [m.data() for m in got_a] == [b"f%d" % i for i in range(10)]
    assert drain(b, 200) == []
    for m in got_a[:5]:
        a.acknowledge(m)
    wait_backlog(broker, topic, "fo", 5)
    a.close()
    got_b = drain(b, 1500, until=5)
    assert [m.data() for m in got_b] == [b"f%d" % i for i in range(5, 10)]


def test_failover_sends_active_consumer_change(broker, topic):
    from tests.protocol import client_commands as commands
    from compactmq.protocol import pulsar_pb2 as pb

    wire = RawClient(broker.port)
    failover = pb.CommandSubscribe.Failover
    wire.send(commands.subscribe(topic, "fo", 1, 1, sub_type=failover, consumer_name="A"))
    wire.expect(pb.BaseCommand.SUCCESS)
    change = wire.expect(pb.BaseCommand.ACTIVE_CONSUMER_CHANGE).active_consumer_change
    assert (change.consumer_id, change.is_active) == (1, True)
    wire.send(commands.subscribe(topic, "fo", 2, 2, sub_type=failover, consumer_name="B"))
    wire.expect(pb.BaseCommand.SUCCESS)
    change = wire.expect(pb.BaseCommand.ACTIVE_CONSUMER_CHANGE).active_consumer_change
    assert (change.consumer_id, change.is_active) == (2, False)
    wire.send(commands.close_consumer(1, 3))
    changes = []
    while len(changes) < 1:
        cmd = wire.recv()
        if cmd.type == pb.BaseCommand.ACTIVE_CONSUMER_CHANGE:
            changes.append((cmd.active_consumer_change.consumer_id, cmd.active_consumer_change.is_active))
    assert changes == [(2, True)]
    wire.close()


def test_key_shared_never_splits_a_key(client, topic):
    a = client.subscribe(topic, "ks", consumer_type=pulsar.ConsumerType.KeyShared)
    b = client.subscribe(topic, "ks", consumer_type=pulsar.ConsumerType.KeyShared)
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(200):
        producer.send_async(b"%d" % i, None, partition_key=f"key-{i % 20}")
    producer.flush()
    seen = {}
    order = {}
    total = 0
    deadline = time.time() + 10
    while total < 200 and time.time() < deadline:
        for name, c in (("a", a), ("b", b)):
            try:
                m = c.receive(50)
            except pulsar.Timeout:
                continue
            total += 1
            seen.setdefault(m.partition_key(), set()).add(name)
            order.setdefault(m.partition_key(), []).append(int(m.data()))
            c.acknowledge(m)
    assert total == 200
    assert all(len(v) == 1 for v in seen.values())  # one consumer per key
    assert {n for v in seen.values() for n in v} == {"a", "b"}
    assert all(v == sorted(v) for v in order.values())  # in order per key


def test_key_shared_newcomer_waits_until_older_messages_are_acked(client, topic):
    a = client.subscribe(topic, "ksj", consumer_type=pulsar.ConsumerType.KeyShared, consumer_name="a")
    producer = client.create_producer(topic, batching_enabled=False)
    keys = [f"key-{i}" for i in range(30)]
    for i in range(60):
        producer.send_async(b"%d" % i, None, partition_key=keys[i % 30])
    producer.flush()
    first = [a.receive(5000) for _ in range(60)]  # all to a, nothing acknowledged yet
    b = client.subscribe(topic, "ksj", consumer_type=pulsar.ConsumerType.KeyShared, consumer_name="b")
    for i in range(60, 120):
        producer.send_async(b"%d" % i, None, partition_key=keys[i % 30])
    producer.flush()
    # keys that moved to b must not overtake a's unacknowledged messages of the same key
    assert drain(b, 500) == []
    later_a = drain(a, 300)
    for m in first + later_a:
        a.acknowledge(m)
    later_b: list = []
    deadline = time.time() + 15
    while len(first) + len(later_a) + len(later_b) < 120 and time.time() < deadline:
        later_b += drain(b, 200)
        later_a += drain(a, 200)
    assert later_b, "some keys should have moved to the newcomer"
    got = sorted(int(m.data()) for m in first + later_a + later_b)
    assert got == list(range(120))
    keys_b = {m.partition_key() for m in later_b}
    assert not keys_b & {m.partition_key() for m in later_a}


def test_pattern_and_multi_topic_subscriptions(client, topic):
    import re

    for suffix in ("a", "b"):
        client.create_producer(f"{topic}-pat-{suffix}").send(suffix.encode())
    pattern = client.subscribe(re.compile(re.escape(topic) + "-pat-.*"), "s", initial_position=Earliest)
    assert sorted(m.data() for m in drain(pattern, 300, until=2)) == [b"a", b"b"]
    multi = client.subscribe([f"{topic}-pat-a", f"{topic}-pat-b"], "s2", initial_position=Earliest)
    assert sorted(m.data() for m in drain(multi, 300, until=2)) == [b"a", b"b"]


def test_delayed_delivery_on_shared(client, topic):
    from datetime import timedelta

    consumer = client.subscribe(topic, "d", consumer_type=pulsar.ConsumerType.Shared)
    producer = client.create_producer(topic, batching_enabled=False)
    sent_at = time.time()
    producer.send(b"later", deliver_after=timedelta(milliseconds=800))
    producer.send(b"now")
    assert consumer.receive(5000).data() == b"now"
    m = consumer.receive(5000)
    assert m.data() == b"later" and time.time() - sent_at >= 0.7


def test_unsubscribe_forgets_the_subscription(client, topic):
    producer = client.create_producer(topic, batching_enabled=False)
    consumer = client.subscribe(topic, "gone", initial_position=Earliest)
    producer.send(b"u0")
    consumer.receive(5000)
    consumer.unsubscribe()
    producer.send(b"u1")
    again = client.subscribe(topic, "gone", initial_position=pulsar.InitialPosition.Latest)
    producer.send(b"u2")
    assert [m.data() for m in drain(again, 500, until=1)] == [b"u2"]


# --- producers ------------------------------------------------------------------------------


def test_exclusive_producer_access_mode(client, topic):
    first = client.create_producer(topic, access_mode=pulsar.ProducerAccessMode.Exclusive)
    with pytest.raises(pulsar.ProducerBusy):
        client.create_producer(topic)
    first.close()
    client.create_producer(topic).send(b"ok")


def test_wait_for_exclusive_producer_queues_until_the_topic_is_free(broker, client, topic):
    import threading

    from .rest import rest, wait_until

    first = client.create_producer(topic, access_mode=pulsar.ProducerAccessMode.Exclusive)
    created = []

    def wait_for_it():
        created.append(client.create_producer(topic, access_mode=pulsar.ProducerAccessMode.WaitForExclusive))

    waiter = threading.Thread(target=wait_for_it)
    waiter.start()
    stats_path = "/admin/v2/" + topic.replace("://", "/", 1) + "/stats"
    wait_until(
        lambda: rest(broker, "GET", stats_path)[1]["waitingPublishers"] == 1, what="a waiting producer"
    )
    assert created == []  # queued behind the exclusive producer
    with pytest.raises(pulsar.ProducerBusy):
        client.create_producer(topic)  # shared producers are refused while one waits
    first.close()
    waiter.join(10)
    assert len(created) == 1
    created[0].send(b"mine now")


def test_producer_name_generated_and_user_given(client, topic):
    generated = client.create_producer(topic)
    assert generated.producer_name()
    named = client.create_producer(topic, producer_name="my-producer")
    assert named.producer_name() == "my-producer"
    named.send(b"x", sequence_id=41)
    named.close()
    again = client.create_producer(topic, producer_name="my-producer")
    assert again.last_sequence_id() == 41


def test_schema_string_and_json(client, topic):
    from pulsar.schema import JsonSchema, Record, String, StringSchema

    producer = client.create_producer(topic, schema=StringSchema())
    consumer = client.subscribe(topic, "sc", schema=StringSchema(), initial_position=Earliest)
    producer.send("héllo")
    assert consumer.receive(5000).value() == "héllo"

    class Point(Record):
        name = String()

    jtopic = topic + "-json"
    jp = client.create_producer(jtopic, schema=JsonSchema(Point))
    jc = client.subscribe(jtopic, "sc", schema=JsonSchema(Point), initial_position=Earliest)
    jp.send(Point(name="p1"))
    assert jc.receive(5000).value().name == "p1"
    with pytest.raises(Exception):
        client.create_producer(jtopic, schema=StringSchema())


# --- raw wire -------------------------------------------------------------------------------


class RawClient:
    """A connected socket speaking frames directly, for what the official client hides."""

    def __init__(self, port: int) -> None:
        from compactmq.protocol import frames
        from tests.protocol import client_commands as commands

        self._frames = frames
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.decoder = frames.FrameDecoder()
        self.queue: list = []
        self.send(commands.connect("raw-test", 20))
        assert self.recv().type == 3  # CONNECTED

    def send(self, cmd, entry: bytes | None = None) -> None:
        f = self._frames
        self.sock.sendall(f.encode_with_entry(cmd, entry) if entry is not None else f.encode_command(cmd))

    def recv(self):
        while not self.queue:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("broker closed the connection")
            self.queue.extend(self.decoder.feed(data))
        return self.queue.pop(0).command

    def expect(self, command_type: int):
        while True:
            cmd = self.recv()
            if cmd.type == command_type:
                return cmd
            if cmd.type in (14, 8):  # ERROR, SEND_ERROR
                raise AssertionError(f"broker answered {cmd}")

    def close(self) -> None:
        self.sock.close()


def test_get_schema_and_get_or_create_schema_on_the_wire(broker, topic):
    from compactmq.protocol import pulsar_pb2 as pb

    wire = RawClient(broker.port)
    B = pb.BaseCommand

    def get_schema(request_id, version=None):
        body = pb.CommandGetSchema(request_id=request_id, topic=topic)
        if version is not None:
            body.schema_version = version
        wire.send(B(type=B.GET_SCHEMA, getSchema=body))
        return wire.recv().getSchemaResponse

    assert get_schema(1).error_code == pb.TopicNotFound  # no schema yet (bytes)
    string = pb.Schema(name="s", type=pb.Schema.String, schema_data=b"")
    wire.send(
        B(
            type=B.GET_OR_CREATE_SCHEMA,
            getOrCreateSchema=pb.CommandGetOrCreateSchema(request_id=2, topic=topic, schema=string),
        )
    )
    v0 = wire.recv().getOrCreateSchemaResponse
    assert not v0.HasField("error_code") and len(v0.schema_version) == 8
    got = get_schema(3)
    assert got.schema.type == pb.Schema.String and got.schema_version == v0.schema_version
    assert get_schema(4, b"\x00" * 7 + b"\x09").HasField("error_code")  # unknown version
    json_schema = pb.Schema(name="j", type=pb.Schema.Json, schema_data=b"{}")
    wire.send(
        B(
            type=B.GET_OR_CREATE_SCHEMA,
            getOrCreateSchema=pb.CommandGetOrCreateSchema(request_id=5, topic=topic, schema=json_schema),
        )
    )
    assert wire.recv().getOrCreateSchemaResponse.error_code == pb.IncompatibleSchema
    wire.close()


# --- robustness -----------------------------------------------------------------------------


def _frame(cmd_bytes: bytes) -> bytes:
    return struct.pack(">II", len(cmd_bytes) + 4, len(cmd_bytes)) + cmd_bytes


@pytest.mark.parametrize(
    "payload",
    [
        b"\x00\x00\x00\x05\x00\x00\x00\x01\xff",  # command size beyond the frame
        _frame(b"\xff\xff\xff"),  # undecodable protobuf
        struct.pack(">II", 200 * 1024 * 1024, 10) + b"x" * 10,  # frame over the limit
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",  # not Pulsar at all
    ],
    ids=["bad-sizes", "bad-protobuf", "too-big", "http"],
)
def test_bad_frames_close_the_connection_not_the_broker(broker, client, topic, payload):
    with socket.create_connection(("127.0.0.1", broker.port), timeout=5) as s:
        s.sendall(payload)
        s.settimeout(5)
        data = b""
        try:
            while True:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
        except (ConnectionResetError, socket.timeout):
            pass
    assert broker.alive()
    p = client.create_producer(topic)
    p.send(b"alive")


def test_close_while_subscribe_is_running_leaks_no_consumer(broker, topic):
    from compactmq.protocol import frames
    from tests.protocol import client_commands as commands
    from compactmq.protocol import pulsar_pb2 as pb

    wire = RawClient(broker.port)
    # the client timed out waiting and closes the consumer it asked for: both in one packet
    wire.sock.sendall(
        frames.encode_command(commands.subscribe(topic, "excl", 1, 1))
        + frames.encode_command(commands.close_consumer(1, 2))
    )
    assert wire.expect(pb.BaseCommand.SUCCESS).success.request_id == 2
    wire.send(commands.subscribe(topic, "excl", 3, 3))  # no ConsumerBusy: nothing leaked
    assert wire.expect(pb.BaseCommand.SUCCESS).success.request_id == 3
    wire.close()


def test_bad_checksum_gets_send_error_and_connection_stays(broker):
    from compactmq.protocol import entry_format
    from tests.protocol import client_commands as commands
    from compactmq.protocol import pulsar_pb2 as pb

    wire = RawClient(broker.port)
    wire.send(commands.producer(f"persistent://public/default/raw-{time.monotonic_ns()}", 1, 1))
    wire.expect(pb.BaseCommand.PRODUCER_SUCCESS)
    md = pb.MessageMetadata(producer_name="raw", sequence_id=0, publish_time=int(time.time() * 1000))
    entry = bytearray(entry_format.build_entry(md, b"payload"))
    entry[-1] ^= 0xFF  # corrupt the payload: the CRC no longer matches
    wire.send(commands.send(1, 0), bytes(entry))
    reply = wire.recv()
    assert reply.type == pb.BaseCommand.SEND_ERROR
    assert reply.send_error.error == pb.ChecksumError
    wire.send(commands.send(1, 1), entry_format.build_entry(md, b"fine"))
    assert wire.recv().type == pb.BaseCommand.SEND_RECEIPT
    wire.send(commands.send(99, 2), entry_format.build_entry(md, b"no producer"))
    assert wire.recv().type == pb.BaseCommand.SEND_ERROR
    wire.send(commands.flow(12345, 10))  # unknown consumer: ignored, connection stays
    wire.send(commands.ping())
    assert wire.recv().type == pb.BaseCommand.PONG
    wire.close()


def test_topic_not_found_when_auto_creation_is_off_in_a_config_file(tmp_path):
    from .conftest import BrokerProcess

    conf = tmp_path / "broker.conf"
    conf.write_text("# broker.conf syntax\nallowAutoTopicCreation=false\n")
    b = BrokerProcess(tmp_path / "data", extra_args=["--config", str(conf)])
    b.start()
    try:
        c = make_client(b.url)
        with pytest.raises(pulsar.TopicNotFound):
            c.create_producer("no-such-topic")
        c.close()
    finally:
        b.stop()
