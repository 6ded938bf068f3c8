"""A busy producer connection's reads are held apart (``flow.ReadPauser.after_sends``): the
messages that wait in the socket meanwhile are published all the same, in order, each receipt
after its sync. In-process broker (the standalone wiring) and the official client; the busy
rate is lowered for the test (``flow.BUSY_READ_RATE``, read at each call) so that the hold
engages on a loaded CI machine too, and the hold made long (50 ms) so that it always matters."""

from __future__ import annotations

import threading
import time

import pulsar
import pytest

from compactmq.broker import flow
from harness.broker import InProcessBroker, make_client

MESSAGES = 3000


@pytest.fixture
def broker(tmp_path, monkeypatch):
    monkeypatch.setattr(flow, "BUSY_READ_RATE", 200.0)
    b = InProcessBroker(tmp_path / "data", {"managedLedgerGroupCommitMaxDelayMicros": "50000"})
    b.start()
    yield b
    b.stop()


def _holds(broker) -> int:
    async def count():
        return sum(c.reads.holds for c in broker.server.service.state.connections if c.reads is not None)

    return broker.on_loop(count())


def test_held_reads_lose_nothing_and_keep_the_order(broker):
    topic = f"persistent://public/default/held-{time.monotonic_ns()}"
    client = make_client(broker.url)
    try:
        reader = client.create_reader(topic, start_message_id=pulsar.MessageId.earliest)
        producer = client.create_producer(
            topic, batching_enabled=False, max_pending_messages=MESSAGES, block_if_queue_full=True
        )
        ids: list = [None] * MESSAGES
        failed: list = []
        done = threading.Event()
        left = [MESSAGES]
        lock = threading.Lock()

        def receipt(i):
            def cb(result, msg_id):
                if result != pulsar.Result.Ok:
                    failed.append((i, result))
                ids[i] = msg_id
                with lock:
                    left[0] -= 1
                    if not left[0]:
                        done.set()

            return cb

        for i in range(MESSAGES):
            producer.send_async(b"m-%d" % i, receipt(i))
        assert done.wait(60), f"{left[0]} receipts missing"
        assert not failed
        assert _holds(broker) > 0, "the producer's reads were never held"
        # receipts in the order sent: positions strictly increase
        positions = [(m.ledger_id(), m.entry_id()) for m in ids]
        assert positions == sorted(positions) and len(set(positions)) == MESSAGES
        # a closed-loop send after the flood is answered (the hold ends, reading resumes)
        producer.send(b"last")
        got = [reader.read_next(10_000).data() for _ in range(MESSAGES + 1)]
        assert got == [b"m-%d" % i for i in range(MESSAGES)] + [b"last"]
    finally:
        client.close()
