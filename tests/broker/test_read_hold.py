"""A busy producer connection's reads are held apart (``flow.ReadPauser.after_sends``): the
messages that wait in the socket meanwhile are published all the same, in order, each receipt
after its sync. In-process broker (the standalone wiring), the official client and a raw wire
producer; the busy rate is lowered for the test (``flow.BUSY_READ_RATE``, read at each call) and
the messages go in bursts spaced over several of the rate's windows, so that the hold engages
however the machine's load groups them into reads; the hold is long (50 ms) so that it matters.
"""

from __future__ import annotations

import threading
import time

import pulsar
import pytest

from compactmq.broker import flow
from compactmq.protocol import entry_format, frames
from compactmq.protocol import pulsar_pb2 as pb
from harness.broker import InProcessBroker, make_client
from tests.protocol import client_commands as commands

from .test_broker_client import RawClient

MESSAGES = 3000
BURSTS = 10
#: longer than flow.BUSY_WINDOW_S: each burst after the first closes a window of the rate
BURST_GAP_S = 0.06


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

        per_burst = MESSAGES // BURSTS
        for i in range(MESSAGES):
            if i and i % per_burst == 0:
                time.sleep(BURST_GAP_S)
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


def test_reads_that_end_inside_a_frame_are_counted_and_held(broker):
    """Each burst is written cut inside a SEND, so no read is the fast path's whole run of SENDs:
    the first starts with a run and ends inside a frame, each later one starts with a frame's
    rest. Their SENDs count all the same, the reads are held, and every SEND is receipted."""
    topic = f"persistent://public/default/held-split-{time.monotonic_ns()}"
    wire = RawClient(broker.port)
    try:
        wire.send(commands.producer(topic, 1, 1, producer_name="split"))
        wire.expect(pb.BaseCommand.PRODUCER_SUCCESS)
        md = pb.MessageMetadata(producer_name="split", sequence_id=0, publish_time=1)
        stream = b""
        for seq in range(MESSAGES):
            md.sequence_id = seq
            stream += frames.encode_with_entry(
                commands.send(1, seq), entry_format.build_entry(md, b"s-%d" % seq)
            )
        chunk = len(stream) // BURSTS + 7  # not a multiple of the frame size: cuts inside frames
        for at in range(0, len(stream), chunk):
            wire.sock.sendall(stream[at : at + chunk])
            time.sleep(BURST_GAP_S)
        got = [wire.expect(pb.BaseCommand.SEND_RECEIPT).send_receipt.sequence_id for _ in range(MESSAGES)]
        assert got == list(range(MESSAGES))
        assert _holds(broker) > 0, "reads ending inside a frame were never counted as busy"
    finally:
        wire.close()
