"""Message deduplication with the official client: namespace and topic policies over REST and
the CLI, duplicates acknowledged with -1:-1 and not stored (batches included), the last
sequence id in PRODUCER_SUCCESS, and the state surviving a restart and a SIGKILL."""

from __future__ import annotations

import signal
import time

import pytest

pulsar = pytest.importorskip("pulsar")

from .conftest import BrokerProcess, make_client  # noqa: E402
from .rest import cli, ok, rest  # noqa: E402

pytestmark = pytest.mark.integration
Earliest = pulsar.InitialPosition.Earliest


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = BrokerProcess(
        tmp_path_factory.mktemp("dedup") / "data", overrides={"brokerDeduplicationEntriesInterval": "100"}
    )
    b.start()
    yield b
    b.stop()


def received(client, topic, n_expected, sub="check"):
    consumer = client.subscribe(topic, sub, initial_position=Earliest)
    out = []
    deadline = time.monotonic() + 15
    while len(out) < n_expected and time.monotonic() < deadline:
        try:
            out.append(consumer.receive(1000).data())
        except pulsar.Timeout:
            pass
    while True:  # then nothing more may come
        try:
            out.append(consumer.receive(500).data())
        except pulsar.Timeout:
            break
    consumer.close()
    return out


def unique(name):
    return f"{name}-{time.monotonic_ns()}"


def test_namespace_policy_drops_duplicates_and_answers_minus_one(broker):
    ns = unique("dd")
    ok(rest(broker, "PUT", f"/admin/v2/namespaces/public/{ns}"))
    assert ok(rest(broker, "GET", f"/admin/v2/namespaces/public/{ns}/deduplication")) is None
    ok(rest(broker, "POST", f"/admin/v2/namespaces/public/{ns}/deduplication", True))
    assert ok(rest(broker, "GET", f"/admin/v2/namespaces/public/{ns}/deduplication")) is True
    topic = f"persistent://public/{ns}/t"
    client = make_client(broker.url)
    try:
        producer = client.create_producer(topic, producer_name="p1", batching_enabled=False)
        assert producer.last_sequence_id() == -1
        for i in range(5):
            mid = producer.send(b"m%d" % i, sequence_id=i)
            assert mid.ledger_id() >= 0
        dup = producer.send(b"again", sequence_id=3)
        assert (dup.ledger_id(), dup.entry_id()) == (-1, -1)
        producer.close()
        # a producer of the same name learns where it stopped
        producer = client.create_producer(topic, producer_name="p1", batching_enabled=False)
        assert producer.last_sequence_id() == 4
        producer.send(b"m5", sequence_id=5)
        producer.close()
        assert received(client, topic, 6) == [b"m0", b"m1", b"m2", b"m3", b"m4", b"m5"]
    finally:
        client.close()


def test_batches_are_deduplicated_by_highest_sequence_id(broker):
    # the official client numbers batches itself, so a batch is resent on the wire as a client
    # resends one after reconnecting: SEND with sequence_id, num_messages, highest_sequence_id
    from compactmq.protocol import batch
    from compactmq.protocol import entry_format
    from tests.protocol import client_commands as commands
    from compactmq.protocol import pulsar_pb2 as pb

    from .test_broker_client import RawClient

    ns = unique("ddb")
    ok(rest(broker, "PUT", f"/admin/v2/namespaces/public/{ns}"))
    ok(rest(broker, "POST", f"/admin/v2/namespaces/public/{ns}/deduplication", True))
    topic = f"persistent://public/{ns}/t"
    wire = RawClient(broker.port)
    wire.send(commands.producer(topic, 1, 1, producer_name="pb"))
    assert wire.expect(pb.BaseCommand.PRODUCER_SUCCESS).producer_success.last_sequence_id == -1

    def send_batch(first, n):
        items = [
            (pb.SingleMessageMetadata(payload_size=len(b"b%d" % i)), b"b%d" % i)
            for i in range(first, first + n)
        ]
        md = pb.MessageMetadata(
            producer_name="pb",
            sequence_id=first,
            publish_time=int(time.time() * 1000),
            num_messages_in_batch=n,
            highest_sequence_id=first + n - 1,
        )
        cmd = commands.send(1, first, n)
        cmd.send.highest_sequence_id = first + n - 1
        wire.send(cmd, entry_format.build_entry(md, batch.encode_batch(items)))
        receipt = wire.expect(pb.BaseCommand.SEND_RECEIPT).send_receipt
        assert receipt.sequence_id == first and receipt.highest_sequence_id == first + n - 1
        return commands.message_id_tuple(receipt.message_id)

    assert send_batch(0, 5).ledger_id >= 0
    again = send_batch(0, 5)  # the same batch again: acknowledged with -1:-1, not stored
    assert (again.ledger_id, again.entry_id) == (-1, -1)
    assert send_batch(3, 2).ledger_id == -1  # its highest id (4) is not above the last one
    assert send_batch(5, 5).ledger_id >= 0
    wire.close()
    client = make_client(broker.url)
    try:
        assert client.create_producer(topic, producer_name="pb").last_sequence_id() == 9
        assert received(client, topic, 10) == [b"b%d" % i for i in range(10)]
    finally:
        client.close()


def test_topic_policy_and_cli(broker):
    ns = unique("ddc")
    ok(rest(broker, "PUT", f"/admin/v2/namespaces/public/{ns}"))
    proc = cli(broker, "namespaces", "set-deduplication", f"public/{ns}", "--enable")
    assert proc.returncode == 0, proc.stderr
    assert cli(broker, "namespaces", "get-deduplication", f"public/{ns}").stdout.strip() == "true"
    topic = f"persistent://public/{ns}/t"
    client = make_client(broker.url)
    try:
        client.create_producer(topic).close()  # the topic exists
        # the topic policy overrides the namespace's: off here
        proc = cli(broker, "topics", "set-deduplication", topic, "--disable")
        assert proc.returncode == 0, proc.stderr
        assert ok(rest(broker, "GET", f"/admin/v2/persistent/public/{ns}/t/deduplicationEnabled")) is False
        assert (
            ok(rest(broker, "GET", f"/admin/v2/persistent/public/{ns}/t/deduplicationEnabled?applied=true"))
            is False
        )
        producer = client.create_producer(topic, producer_name="p", batching_enabled=False)
        producer.send(b"x", sequence_id=1)
        producer.send(b"x", sequence_id=1)  # stored twice: deduplication is off for the topic
        # removing the topic policy brings the namespace's back, on the loaded topic at once
        assert cli(broker, "topics", "remove-deduplication", topic).returncode == 0
        assert producer.send(b"x", sequence_id=1).ledger_id() == -1
        producer.close()
        assert received(client, topic, 2) == [b"x", b"x"]
        bad = rest(broker, "POST", f"/admin/v2/namespaces/public/{ns}/deduplication", "maybe")
        assert bad[0] == 400 and "boolean" in bad[1]["reason"]
        # the dedup cursor is no subscription
        stats = ok(rest(broker, "GET", f"/admin/v2/persistent/public/{ns}/t/stats"))
        assert "pulsar.dedup" not in stats["subscriptions"]
    finally:
        client.close()


@pytest.mark.parametrize("how", ["restart", "sigkill"])
def test_state_survives_restart_and_sigkill(tmp_path, how):
    # A writes 1500 entries, then B 1200: A's last entry is far beyond the 1000 newest entries
    # a topic reads back when it loads, so only the snapshot (+ replay of what follows) knows A.
    b = BrokerProcess(tmp_path / "data", overrides={"brokerDeduplicationEnabled": "true"})
    b.start()
    topic = "persistent://public/default/dd-crash"
    try:
        client = make_client(b.url)
        for name, n in (("A", 1500), ("B", 1200)):
            producer = client.create_producer(
                topic,
                producer_name=name,
                batching_enabled=False,
                max_pending_messages=3000,
                block_if_queue_full=True,
            )
            for i in range(n):
                producer.send_async(b"%s%d" % (name.encode(), i), None, sequence_id=i)
            producer.flush()
            producer.close()
        client.close()
        if how == "sigkill":
            b.stop(signal.SIGKILL)
        else:
            b.stop()
        b.start()
        client = make_client(b.url)
        a = client.create_producer(topic, producer_name="A", batching_enabled=False)
        bp = client.create_producer(topic, producer_name="B", batching_enabled=False)
        assert a.last_sequence_id() == 1499
        assert bp.last_sequence_id() == 1199
        assert a.send(b"A-dup", sequence_id=1400).ledger_id() == -1
        assert bp.send(b"B-dup", sequence_id=1199).ledger_id() == -1
        assert bp.send(b"B1200", sequence_id=1200).ledger_id() >= 0
        got = received(client, topic, 2701)
        assert len(got) == 2701 and got[-1] == b"B1200" and b"A-dup" not in got
        client.close()
    finally:
        b.stop()
