"""The connection adapter with a fake transport: handshake, publish backpressure, bad frames."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from compactmq.auth import AuthenticationService
from compactmq.broker.admission import ConnectionCounter
from compactmq.broker.connection import ServerConnection
from compactmq.broker.producers import Producer
from compactmq.broker.server import ServerState
from compactmq.config import load_config
from compactmq.protocol import frames
from compactmq.protocol import entry_format
from tests.protocol import client_commands as commands
from compactmq.protocol import pulsar_pb2 as pb
from compactmq.storage.position import Position


class FakeTransport:
    def __init__(self):
        self.out = bytearray()
        self.paused = False
        self.closed = False

    def get_extra_info(self, name):
        return ("127.0.0.1", 1234)

    def write(self, data):
        self.out += data

    def writelines(self, chunks):
        for c in chunks:
            self.out += c

    def pause_reading(self):
        self.paused = True

    def resume_reading(self):
        self.paused = False

    def is_closing(self):
        return self.closed

    def close(self):
        self.closed = True

    def abort(self):
        self.closed = True


class FakeTopic:
    name = "persistent://public/default/t"
    partition_index = -1
    flushes_after_receipts = False  # the test calls the publish callbacks itself, no flush after

    def __init__(self):
        self.waiting = []
        self.runs = []
        self.last_sequence_ids = {}
        self.dedup = SimpleNamespace(
            enabled=False, failed=lambda name: None, entry_persisted=lambda pos: None
        )

    def publish(self, entry, publish_time, callback):
        self.waiting.append(callback)

    def publish_run(self, entries, publish_times, callback):
        # a run's callback takes the position of its first entry (one per SEND read here)
        self.runs.append(len(entries))
        self.waiting.append(callback)

    def remove_producer(self, producer):
        pass


def make_connection(high_water=1000):
    cfg = load_config(
        overrides={"maxPendingPublishBytesPerConnection": high_water, "keepAliveIntervalSeconds": 0}
    )
    service = SimpleNamespace(
        config=cfg,
        state=ServerState(),
        connection_counter=ConnectionCounter(cfg),
        authentication=AuthenticationService(enabled=False),  # as a broker without authentication
    )
    conn = ServerConnection(service)
    transport = FakeTransport()
    conn.connection_made(transport)
    return conn, transport


def replies(transport):
    out = frames.FrameDecoder().feed(bytes(transport.out))
    transport.out.clear()
    return [f.command for f in out]


def test_publish_backpressure_pauses_and_resumes_the_socket():
    async def run():
        conn, transport = make_connection(high_water=1000)
        conn.data_received(frames.encode_command(commands.connect()))
        await asyncio.sleep(0)
        assert [c.type for c in replies(transport)] == [pb.BaseCommand.CONNECTED]
        topic = FakeTopic()
        conn.handler.producers[1] = Producer(topic, conn, 1, "p")
        md = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1)
        entry = entry_format.build_entry(md, b"x" * 600)
        conn.data_received(frames.encode_with_entry(commands.send(1, 0), entry))
        assert not transport.paused
        conn.data_received(frames.encode_with_entry(commands.send(1, 1), entry))
        assert transport.paused  # > 1000 bytes wait for storage: stop reading this socket
        topic.waiting.pop(0)(Position(5, 0), None)
        assert transport.paused  # ~620 bytes still pending: above half the mark
        topic.waiting.pop(0)(Position(5, 1), None)
        assert not transport.paused  # everything persisted: reading resumes
        await asyncio.sleep(0)
        receipts = replies(transport)
        assert [(r.send_receipt.sequence_id, r.send_receipt.message_id.entryId) for r in receipts] == [
            (0, 0),
            (1, 1),
        ]
        assert topic.last_sequence_ids == {"p": 1}

    asyncio.run(run())


def test_command_before_connect_is_a_protocol_error_that_closes():
    async def run():
        conn, transport = make_connection()
        conn.data_received(frames.encode_command(commands.partitioned_metadata("t", 1)))
        await asyncio.sleep(0)
        assert transport.closed
        out = frames.FrameDecoder().feed(bytes(transport.out))
        assert out and out[0].command.type == pb.BaseCommand.ERROR

    asyncio.run(run())


def test_garbage_closes_only_this_connection():
    async def run():
        conn, transport = make_connection()
        conn.data_received(b"\x00\x00\x00\x08\x00\x00\x00\x04\xde\xad\xbe\xef")
        await asyncio.sleep(0)
        assert transport.closed and conn.closed

    asyncio.run(run())


def test_flush_writes_sends_receipts_before_the_loop_turn_ends():
    """A topic that answered a durable batch calls ServerState.flush_writes: the receipts are
    on the socket at once (one writelines), not after the loop's next poll."""

    async def run():
        conn, transport = make_connection(high_water=100_000)
        conn.data_received(frames.encode_command(commands.connect()))
        await asyncio.sleep(0)
        replies(transport)
        topic = FakeTopic()
        conn.handler.producers[1] = Producer(topic, conn, 1, "p")
        md = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1)
        entry = entry_format.build_entry(md, b"x" * 10)
        for seq in range(3):
            conn.data_received(frames.encode_with_entry(commands.send(1, seq), entry))
        for i, cb in enumerate(topic.waiting):
            cb(Position(5, i), None)
        assert transport.out == b""  # queued for the end of the turn
        conn.service.state.flush_writes()
        assert [r.send_receipt.sequence_id for r in replies(transport)] == [0, 1, 2]
        assert conn.service.state.unflushed == []
        await asyncio.sleep(0)  # the scheduled flush then finds nothing more to write
        assert transport.out == b""
        conn.write(b"")  # a later write in a new turn is listed again
        assert conn.service.state.unflushed == [conn]

    asyncio.run(run())


def test_output_queued_while_the_caller_flushes_now_schedules_no_flush():
    """``ServerState.flushing_now`` (a topic sending what it appended, then ``flush_writes``):
    MESSAGEs queued meanwhile only list the connection; no flush callback is scheduled for the
    end of the turn (which cost the loop a turn per message), and ``flush_writes`` writes them."""

    async def run():
        conn, transport = make_connection(high_water=100_000)
        conn.data_received(frames.encode_command(commands.connect()))
        await asyncio.sleep(0)
        replies(transport)
        loop = asyncio.get_running_loop()
        scheduled = []
        real = loop.call_soon
        loop.call_soon = lambda cb, *a, **kw: (scheduled.append(cb), real(cb, *a, **kw))[1]
        state = conn.service.state
        entry = entry_format.build_entry(
            pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1), b"x"
        )
        state.flushing_now = True
        try:
            conn.send_messages(7, -1, [(Position(3, 0), 0, None, entry)])
            conn.send_messages(7, -1, [(Position(3, 1), 0, None, entry)])
        finally:
            state.flushing_now = False
        assert scheduled == []
        assert state.unflushed == [conn]  # listed once
        state.flush_writes()
        got = replies(transport)
        assert [(c.message.message_id.ledgerId, c.message.message_id.entryId) for c in got] == [
            (3, 0),
            (3, 1),
        ]
        conn.send_messages(7, -1, [(Position(3, 2), 0, None, entry)])  # outside: a flush as before
        assert len(scheduled) == 1
        del loop.call_soon
        await asyncio.sleep(0)
        assert [c.message.message_id.entryId for c in replies(transport)] == [2]

    asyncio.run(run())
