"""Broker lifecycle with the official client: restarts (clean and killed), ordered shutdown,
keep-alive, partitioned topics, backpressure, configuration errors."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import pytest

pulsar = pytest.importorskip("pulsar")

from harness.wait import wait_until  # noqa: E402

from .conftest import ROOT, BrokerProcess, make_client, wait_backlog, wait_unacked  # noqa: E402
from .test_broker_client import RawClient, drain  # noqa: E402

pytestmark = pytest.mark.integration

Earliest = pulsar.InitialPosition.Earliest


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = BrokerProcess(
        tmp_path_factory.mktemp("lifecycle") / "data",
        {
            "allowAutoTopicCreationType": "partitioned",
            "defaultNumPartitions": "3",
            "keepAliveIntervalSeconds": "1",
            # small on purpose: producers hit the high-water mark and get their socket paused
            "maxPendingPublishBytesPerConnection": "65536",
            # announced in CONNECTED: larger messages must be chunked by the client
            "maxMessageSize": "262144",
        },
    )
    b.start()
    yield b
    b.stop()


def test_restart_loses_no_acknowledged_message(broker, topic):
    c = make_client(broker.url)
    producer = c.create_producer(topic + "-partition-0", batching_enabled=False)  # not partitioned
    sent = [producer.send(b"r%d" % i) for i in range(200)]
    consumer = c.subscribe(topic + "-partition-0", "s", initial_position=Earliest)
    for _ in range(50):
        consumer.acknowledge(consumer.receive(5000))
    consumer.close()
    c.close()
    broker.restart()
    c = make_client(broker.url)
    consumer = c.subscribe(topic + "-partition-0", "s", initial_position=Earliest)
    rest = drain(consumer, 1000, until=150)
    assert [m.data() for m in rest] == [b"r%d" % i for i in range(50, 200)]
    last = rest[-1].message_id()
    assert (last.ledger_id(), last.entry_id()) == (sent[-1].ledger_id(), sent[-1].entry_id())
    c.close()


def test_killed_broker_keeps_every_receipted_message(broker, topic):
    name = topic + "-partition-0"
    c = make_client(broker.url)
    producer = c.create_producer(
        name, batching_enabled=True, batching_max_publish_delay_ms=1, block_if_queue_full=True
    )
    receipted = []
    for i in range(2000):
        producer.send_async(b"k%d" % i, lambda res, mid, i=i: res == pulsar.Result.Ok and receipted.append(i))
    producer.flush()
    # callbacks run on the client's listener thread
    wait_until(lambda: len(receipted) == 2000, 10, "2000 send receipts", interval=0.01)
    c.close()
    assert len(receipted) == 2000
    broker.stop(signal.SIGKILL)
    broker.start()
    c = make_client(broker.url)
    reader = c.create_reader(name, pulsar.MessageId.earliest)
    got = []
    while reader.has_message_available():
        got.append(reader.read_next(5000).data())
    assert got == [b"k%d" % i for i in range(2000)]
    c.close()


def test_shutdown_closes_consumers_and_clients_reconnect(broker, topic):
    name = topic + "-partition-0"
    c = make_client(broker.url)
    consumer = c.subscribe(name, "s", initial_position=Earliest)
    producer = c.create_producer(name, batching_enabled=False)
    producer.send(b"before")
    m = consumer.receive(5000)
    consumer.acknowledge(m)
    wait_backlog(broker, name, "s", 0)  # the client groups acks for 100 ms before sending them
    broker.restart()
    producer.send(b"after")  # the client reconnects its producer by itself
    assert consumer.receive(15000).data() == b"after"  # and its consumer
    c.close()


def test_partitioned_topic(broker, topic):
    c = make_client(broker.url)
    assert len(c.get_topic_partitions(topic)) == 3
    consumer = c.subscribe(topic, "s", initial_position=Earliest)
    producer = c.create_producer(topic, batching_enabled=False)
    partitions = set()
    for i in range(30):
        mid = producer.send(b"p%d" % i, partition_key=f"key{i}")
        partitions.add(mid.partition())
    assert partitions == {0, 1, 2}
    got = sorted(m.data() for m in drain(consumer, 1000, until=30))
    assert got == sorted(b"p%d" % i for i in range(30))
    # each partition is its own topic
    reader = c.create_reader(topic + "-partition-1", pulsar.MessageId.earliest)
    assert reader.has_message_available()
    c.close()


def test_producer_faster_than_storage_is_paused_not_buffered(broker, topic):
    name = topic + "-partition-0"
    c = make_client(broker.url)
    producer = c.create_producer(
        name, batching_enabled=False, max_pending_messages=2000, block_if_queue_full=True
    )
    payload = b"x" * 8192
    errors = []
    for i in range(3000):  # 24 MiB against a 64 KiB high-water mark
        producer.send_async(payload, lambda res, mid: res == pulsar.Result.Ok or errors.append(res))
    producer.flush()
    assert errors == []
    reader = c.create_reader(name, pulsar.MessageId.earliest, receiver_queue_size=100)
    n = 0
    while reader.has_message_available():
        reader.read_next(5000)
        n += 1
    assert n == 3000
    c.close()


def test_keepalive_pings_and_drops_a_silent_peer(broker):
    from compactmq.protocol import pulsar_pb2 as pb

    wire = RawClient(broker.port)
    assert wire.expect(pb.BaseCommand.PING) is not None  # keepAliveIntervalSeconds=1
    wire.sock.settimeout(6)
    start = time.monotonic()
    with pytest.raises((ConnectionError, ConnectionResetError)):
        while True:
            wire.recv()  # never answer PONG
    assert time.monotonic() - start < 6
    wire.close()
    assert broker.alive()


def test_consumer_that_flows_nothing_gets_nothing(broker, topic):
    from tests.protocol import client_commands as commands
    from compactmq.protocol import pulsar_pb2 as pb

    name = topic + "-partition-0"
    c = make_client(broker.url)
    producer = c.create_producer(name, batching_enabled=False)
    for i in range(10):
        producer.send(b"f%d" % i)
    wire = RawClient(broker.port)
    wire.send(commands.subscribe(name, "raw", 7, 1, initial_position=pb.CommandSubscribe.Earliest))
    wire.expect(pb.BaseCommand.SUCCESS)
    wire.send(commands.flow(7, 3))
    got = [wire.expect(pb.BaseCommand.MESSAGE) for _ in range(3)]
    assert [(m.message.message_id.entryId) for m in got] == [0, 1, 2]
    wire.sock.settimeout(0.5)
    with pytest.raises(socket.timeout):
        while True:
            cmd = wire.recv()
            assert cmd.type != pb.BaseCommand.MESSAGE
    wire.close()
    c.close()


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--config-override", "brokerServicePort=abc"], "expected an integer"),
        (
            ["--config-override", "keepAliveIntervalSeconds=5", "allowAutoTopicCreation=maybe"],
            "expected true or false",
        ),
        (["--config", "/no/such/broker.conf"], "cannot read config file"),
    ],
)
def test_bad_config_is_a_one_line_error(tmp_path, args, needle):
    proc = subprocess.run(
        [sys.executable, "-m", "compactmq.cli.main", "standalone", "--data-dir", str(tmp_path), *args],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
    )
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0]


def test_last_sequence_id_survives_a_restart(broker, topic):
    name = topic + "-partition-0"
    c = make_client(broker.url)
    p = c.create_producer(name, producer_name="durable-seq", batching_enabled=False)
    for i in range(5):
        p.send(b"s", sequence_id=100 + i)
    c.close()
    broker.restart()
    c = make_client(broker.url)
    p = c.create_producer(name, producer_name="durable-seq")
    assert p.last_sequence_id() == 104
    c.close()


def test_housekeeping_rolls_ledgers_and_applies_retention(tmp_path):
    b = BrokerProcess(
        tmp_path / "data",
        {
            "retentionCheckIntervalInSeconds": "1",
            "managedLedgerMaxEntriesPerLedger": "10",
            "defaultRetentionTimeInMinutes": "0",
            "defaultRetentionSizeInMB": "0",
        },
    )
    b.start()
    try:
        c = make_client(b.url)
        consumer = c.subscribe("retained", "s", initial_position=Earliest)
        producer = c.create_producer("retained", batching_enabled=False)
        ids = [producer.send(b"%d" % i) for i in range(35)]
        assert len({m.ledger_id() for m in ids}) >= 3  # rolled every 10 entries
        for _ in range(35):
            consumer.acknowledge(consumer.receive(5000))

        def first_ledger() -> int:
            reader = c.create_reader("retained", pulsar.MessageId.earliest)
            first = reader.read_next(5000).message_id()
            reader.close()
            return first.ledger_id()

        # acknowledged ledgers were deleted
        wait_until(lambda: first_ledger() != ids[0].ledger_id(), 10, "the first ledger to be deleted", 0.5)
        c.close()
    finally:
        b.stop()


def test_a_dead_connection_does_not_keep_a_producer_name_or_an_exclusive_subscription(broker, topic):
    from tests.protocol import client_commands as commands
    from compactmq.protocol import pulsar_pb2 as pb

    name = topic + "-partition-0"
    wire = RawClient(broker.port)  # answers nothing from now on: a client whose host vanished
    wire.send(commands.producer(name, 1, 1, producer_name="sticky-name"))
    wire.expect(pb.BaseCommand.PRODUCER_SUCCESS)
    wire.send(commands.subscribe(name, "excl", 2, 2))
    wire.expect(pb.BaseCommand.SUCCESS)
    c = make_client(broker.url)
    start = time.monotonic()
    p = c.create_producer(name, producer_name="sticky-name")  # the broker pings, gets nothing, evicts
    consumer = c.subscribe(name, "excl")
    assert time.monotonic() - start < 8
    p.send(b"mine now")
    assert consumer.receive(5000).data() == b"mine now"
    c.close()
    wire.close()


def test_a_live_connection_keeps_its_producer_name(broker, topic):
    name = topic + "-partition-0"
    c1 = make_client(broker.url)
    c1.create_producer(name, producer_name="taken")
    c2 = make_client(broker.url)
    with pytest.raises(pulsar.ProducerBusy):
        c2.create_producer(name, producer_name="taken")
    c2.close()
    c1.close()


@pytest.mark.parametrize("which", ["--broker-port", "--web-port"])
def test_a_taken_port_is_a_one_line_error(tmp_path, which):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        other = "--web-port" if which == "--broker-port" else "--broker-port"
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "compactmq.cli.main",
                "standalone",
                "--data-dir",
                str(tmp_path),
                which,
                str(port),
                other,
                "0",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
        )
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot listen" in lines[0], proc.stderr


def test_individual_acks_out_of_order_survive_a_restart(broker, topic):
    name = topic + "-partition-0"
    c = make_client(broker.url)
    producer = c.create_producer(name, batching_enabled=False)
    for i in range(20):
        producer.send(b"%d" % i)
    consumer = c.subscribe(name, "holes", consumer_type=pulsar.ConsumerType.Shared, initial_position=Earliest)
    for m in drain(consumer, 300, until=20):
        if int(m.data()) % 2 == 0:
            consumer.acknowledge(m)
    wait_backlog(broker, name, "holes", 10)  # the grouped acks reached the broker
    c.close()
    broker.restart()
    c = make_client(broker.url)
    consumer = c.subscribe(name, "holes", consumer_type=pulsar.ConsumerType.Shared, initial_position=Earliest)
    assert sorted(int(m.data()) for m in drain(consumer, 500, until=10)) == list(range(1, 20, 2))
    c.close()


def test_batch_index_acks_survive_a_restart(broker, topic):
    name = topic + "-partition-0"
    c = make_client(broker.url)
    producer = c.create_producer(
        name, batching_enabled=True, batching_max_messages=10, batching_max_publish_delay_ms=100
    )
    for i in range(10):
        producer.send_async(b"b%d" % i, None)
    producer.flush()
    consumer = c.subscribe(
        name,
        "bia",
        consumer_type=pulsar.ConsumerType.Shared,
        initial_position=Earliest,
        batch_index_ack_enabled=True,
    )
    for m in drain(consumer, 300, until=10):
        if int(m.data()[1:]) < 6:
            consumer.acknowledge(m)
    wait_unacked(broker, name, "bia", 4)  # the batch-index acks reached the broker
    c.close()
    broker.restart()
    c = make_client(broker.url)
    consumer = c.subscribe(
        name,
        "bia",
        consumer_type=pulsar.ConsumerType.Shared,
        initial_position=Earliest,
        batch_index_ack_enabled=True,
    )
    assert sorted(m.data() for m in drain(consumer, 500, until=4)) == [b"b6", b"b7", b"b8", b"b9"]
    c.close()


def test_chunked_messages_over_max_message_size(broker, topic):
    name = topic + "-partition-0"
    c = make_client(broker.url)
    consumer = c.subscribe(name, "s", initial_position=Earliest)
    big = bytes(range(256)) * 3000  # 768000 bytes: three to four chunks of 256 KiB
    producer = c.create_producer(name, batching_enabled=False, chunking_enabled=True)
    producer.send(big)
    got = consumer.receive(10000)
    assert got.data() == big
    with pytest.raises(pulsar.MessageTooBig):
        c.create_producer(name, batching_enabled=False).send(big)
    c.close()
