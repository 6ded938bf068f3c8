"""The broker's run path for SENDs (``ProducerCommands.on_send_run``, ``Topic.publish_run``):
the SENDs of one socket read, written together, answered in order with consecutive entry ids,
exactly as one by one; the SENDs a run cannot take (a bad checksum, deduplication on, an
unknown producer) answered as before. In process with real parts: a ``Storage`` with fsync on,
the broker's ``BrokerService``, a ``ServerConnection`` over a recording transport. Each test
runs with the C twin of the wire functions (when built) and with the pure-Python one."""

from __future__ import annotations

import asyncio

import pytest

from compactmq.broker import connection
from compactmq.broker.connection import ServerConnection
from compactmq.protocol import frames, wire
from compactmq.protocol import entry_format
from compactmq.protocol import pulsar_pb2 as pb
from tests.harness.service import close_service
from tests.harness.service import make_service as harness_service
from tests.protocol import client_commands as commands

T = pb.BaseCommand
IMPLS = [wire.PYTHON] + ([wire.NATIVE] if wire.NATIVE is not None else [])


class RecordingTransport:
    def __init__(self) -> None:
        self.out = bytearray()
        self.closed = False

    def get_extra_info(self, name):
        return ("127.0.0.1", 4321)

    def write(self, data) -> None:
        self.out += data

    def writelines(self, chunks) -> None:
        for chunk in chunks:
            self.out += chunk

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True


@pytest.fixture(params=IMPLS, ids=lambda i: i.name)
def impl(request, monkeypatch):
    monkeypatch.setattr(frames, "_split_sends", request.param.split_sends)
    monkeypatch.setattr(connection, "_split_sends", request.param.split_sends)
    monkeypatch.setattr(wire, "send_receipt_frames", request.param.send_receipt_frames)
    return request.param


def make_service(tmp_path, **overrides):
    return harness_service(tmp_path / "data", keepAliveIntervalSeconds=0, **overrides)


def send(pid: int, seq: int, payload: bytes, *, corrupt: bool = False) -> bytes:
    md = pb.MessageMetadata(producer_name="runner", sequence_id=seq, publish_time=1000 + seq)
    entry = bytearray(entry_format.build_entry(md, payload))
    if corrupt:
        entry[-1] ^= 1
    return frames.encode_with_entry(commands.send(pid, seq), bytes(entry))


async def connect(service, topic: str, producer_id: int = 1):
    conn = ServerConnection(service)
    transport = RecordingTransport()
    conn.connection_made(transport)
    conn.data_received(frames.encode_command(commands.connect()))
    conn.data_received(
        frames.encode_command(commands.producer(topic, producer_id, 1, producer_name="runner"))
    )
    await until(lambda: T.PRODUCER_SUCCESS in [c.type for c in answers(transport)], "the producer")
    transport.out.clear()
    return conn, transport


async def until(predicate, what: str, timeout: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


def answers(transport) -> list[pb.BaseCommand]:
    return [f.command for f in frames.FrameDecoder().feed(bytes(transport.out))]


def run(service, storage, scenario) -> None:
    try:
        asyncio.run(scenario())
    finally:
        close_service(service, storage)


def test_a_read_of_sends_is_written_and_answered_as_one_by_one(tmp_path, impl):
    service, storage = make_service(tmp_path)
    name = "persistent://public/default/runs"

    async def scenario() -> None:
        conn, transport = await connect(service, name)
        payloads = [b"m%d" % i * (i % 5 + 1) for i in range(60)]
        stream = b"".join(send(1, seq, p, corrupt=seq == 25) for seq, p in enumerate(payloads))
        # one read holding every SEND, then one split in the middle of a frame
        conn.data_received(stream[:1000])
        conn.data_received(stream[1000:])
        await until(lambda: len(answers(transport)) == 60, "60 answers")
        out = answers(transport)
        errors = [c.send_error for c in out if c.type == T.SEND_ERROR]
        receipts = [c.send_receipt for c in out if c.type == T.SEND_RECEIPT]
        assert [(e.sequence_id, e.error) for e in errors] == [(25, pb.ChecksumError)]
        assert [r.sequence_id for r in receipts] == [s for s in range(60) if s != 25]  # in order
        ids = [(r.message_id.ledgerId, r.message_id.entryId) for r in receipts]
        assert ids == [(ids[0][0], i) for i in range(59)]  # consecutive, one ledger
        topic = await service.topics.get_topic(name)
        assert topic.last_sequence_ids == {"runner": 59}
        stored = [await service.run_blocking(topic.ledger.read_entry, pos) for pos in ids]
        assert [entry_format.parse_entry(e)[1] for e in stored] == [
            p for s, p in enumerate(payloads) if s != 25
        ]
        producer = conn.handler.producers[1]
        assert producer.messages_in == 59 and conn.reads.pending == 0
        await service.topics.close_all()

    run(service, storage, scenario)


def test_with_deduplication_on_the_sends_go_one_by_one(tmp_path, impl):
    service, storage = make_service(tmp_path, brokerDeduplicationEnabled=True)
    name = "persistent://public/default/runs-dedup"

    async def scenario() -> None:
        conn, transport = await connect(service, name)
        conn.data_received(b"".join(send(1, seq, b"v%d" % seq) for seq in (0, 1, 2, 1, 3)))
        await until(lambda: len(answers(transport)) == 5, "5 answers")
        receipts = [c.send_receipt for c in answers(transport)]
        assert [r.sequence_id for r in receipts] == [0, 1, 2, 1, 3]
        ids = [(r.message_id.ledgerId, r.message_id.entryId) for r in receipts]
        # the copy of 1 is recognised: Pulsar's -1:-1 answer, nothing stored for it
        assert ids[3] == ((1 << 64) - 1, (1 << 64) - 1)
        assert [entry_id for _, entry_id in ids[:3] + ids[4:]] == [0, 1, 2, 3]
        await service.topics.close_all()

    run(service, storage, scenario)


def test_sends_of_an_unknown_producer_get_their_errors(tmp_path, impl):
    service, storage = make_service(tmp_path)

    async def scenario() -> None:
        conn, transport = await connect(service, "persistent://public/default/runs-unknown")
        conn.data_received(b"".join(send(9, seq, b"x") for seq in range(3)))
        await until(lambda: len(answers(transport)) == 3, "3 answers")
        errors = [c.send_error for c in answers(transport)]
        assert [(e.producer_id, e.sequence_id) for e in errors] == [(9, 0), (9, 1), (9, 2)]
        assert all(e.error == pb.NotAllowedError for e in errors)
        await service.topics.close_all()

    run(service, storage, scenario)


def test_a_run_on_a_non_persistent_topic(tmp_path, impl):
    service, storage = make_service(tmp_path)

    async def scenario() -> None:
        conn, transport = await connect(service, "non-persistent://public/default/runs-np")
        conn.data_received(b"".join(send(1, seq, b"x") for seq in range(4)))
        await until(lambda: len(answers(transport)) == 4, "4 answers")
        receipts = [c.send_receipt for c in answers(transport)]
        assert [r.sequence_id for r in receipts] == [0, 1, 2, 3]
        first = receipts[0].message_id.entryId
        assert [r.message_id.entryId for r in receipts] == [first + i for i in range(4)]

    run(service, storage, scenario)


def test_drain_returns_when_the_loop_answered_before_the_sync_ended(tmp_path):
    """``_write_queued`` answers what the ledger already made durable; the sync that did it
    ends after that. drain() (topic close) must still see the topic idle then."""
    service, storage = make_service(tmp_path)

    async def scenario() -> None:
        topic = await service.topics.get_topic("persistent://public/default/runs-drain")
        service.sync_threads.inline = False  # the sync below runs in a thread (held there)
        ledger = topic.ledger
        real = ledger.sync_written
        loop = asyncio.get_running_loop()
        durable = asyncio.Event()
        leave = asyncio.Event()

        def sync_written(on_durable):
            seq = real(on_durable)
            loop.call_soon_threadsafe(durable.set)
            asyncio.run_coroutine_threadsafe(leave.wait(), loop).result(20)
            return seq

        ledger.sync_written = sync_written
        answered = []
        topic.publish(b"a", 1, lambda pos, exc: answered.append(pos))
        await asyncio.wait_for(durable.wait(), 20)
        # the loop answers "a" itself (a marker runs _write_queued) while the sync is still on
        topic.publish_marker(lambda pos, exc: answered.append("marker"))
        await until(lambda: len(answered) == 2, "both answered")
        drained = asyncio.ensure_future(topic.drain())
        await asyncio.sleep(0.05)
        assert not drained.done() and topic.publishing  # the sync has not ended
        leave.set()
        await asyncio.wait_for(drained, 20)
        await service.topics.close_all()

    run(service, storage, scenario)


def test_a_read_of_sends_only_takes_the_direct_path_and_what_follows_a_run_is_read_after(
    tmp_path, impl, monkeypatch
):
    """A read that is nothing but a run (the common read at one SEND a read) goes straight to
    ``on_send_run``, without the decoder's frame list or the dispatch; a read where the run is
    followed by other commands or a partial frame has the rest decoded after the run, in order."""
    service, storage = make_service(tmp_path)
    name = "persistent://public/default/runs-direct"
    fed: list[frames.FrameDecoder] = []  # the decoders whose feed ran
    real_feed = frames.FrameDecoder.feed
    monkeypatch.setattr(
        frames.FrameDecoder, "feed", lambda self, data: fed.append(self) or real_feed(self, data)
    )
    ping = frames.encode_command(pb.BaseCommand(type=T.PING, ping=pb.CommandPing()))

    async def scenario() -> None:
        conn, transport = await connect(service, name)
        fed.clear()
        for seq in range(3):  # one SEND a read, each answered before the next
            conn.data_received(send(1, seq, b"a%d" % seq))
            await until(lambda: len(answers(transport)) == seq + 1, f"answer {seq}")
        assert conn.decoder not in fed  # never through the connection's decoder
        third = send(1, 5, b"c")
        # a run, a PING, a run, then half a SEND whose rest comes with the next read
        conn.data_received(send(1, 3, b"b") + ping + send(1, 4, b"b") + third[:9])
        conn.data_received(third[9:])
        await until(lambda: len(answers(transport)) == 7, "7 answers")
        out = answers(transport)
        kinds = [(c.type, c.send_receipt.sequence_id if c.type == T.SEND_RECEIPT else None) for c in out]
        assert kinds[3] == (T.PONG, None) or kinds[4] == (T.PONG, None)  # the PING answered at once
        receipts = [c.send_receipt for c in out if c.type == T.SEND_RECEIPT]
        assert [r.sequence_id for r in receipts] == [0, 1, 2, 3, 4, 5]
        assert [r.message_id.entryId for r in receipts] == list(range(6))
        topic = await service.topics.get_topic(name)
        assert topic.last_sequence_ids == {"runner": 5}
        stored = [
            await service.run_blocking(topic.ledger.read_entry, (r.message_id.ledgerId, r.message_id.entryId))
            for r in receipts
        ]
        assert [entry_format.parse_entry(e)[1] for e in stored] == [b"a0", b"a1", b"a2", b"b", b"b", b"c"]
        assert conn.reads.pending == 0
        await service.topics.close_all()

    run(service, storage, scenario)


def test_a_direct_read_whose_publish_fails_answers_each_send(tmp_path, impl, monkeypatch):
    """The direct path keeps the error boundary of the dispatch: what ``on_send_run`` raises
    is a SEND_ERROR for every SEND of the read, and the connection stays."""
    from compactmq.errors import NotAllowed

    service, storage = make_service(tmp_path)
    name = "persistent://public/default/runs-direct-error"

    async def scenario() -> None:
        conn, transport = await connect(service, name)
        topic = await service.topics.get_topic(name)

        def refuse(entries, times, callback):
            raise NotAllowed("refused for the test")

        monkeypatch.setattr(topic, "publish_run", refuse)
        conn.data_received(b"".join(send(1, seq, b"x") for seq in range(3)))
        await until(lambda: len(answers(transport)) == 3, "3 answers")
        out = answers(transport)
        assert [(c.type, c.send_error.sequence_id, c.send_error.error) for c in out] == [
            (T.SEND_ERROR, seq, pb.NotAllowedError) for seq in range(3)
        ]
        assert not transport.closed
        monkeypatch.undo()
        transport.out.clear()
        conn.data_received(send(1, 3, b"y"))
        await until(lambda: len(answers(transport)) == 1, "the next SEND answered")
        assert answers(transport)[0].type == T.SEND_RECEIPT
        await service.topics.close_all()

    run(service, storage, scenario)


def test_sends_before_connect_are_refused_and_a_read_of_sends_is_a_sign_of_life(tmp_path, impl):
    """The direct path holds only once CONNECT succeeded (else the state table refuses the
    SEND and the connection closes); on it, a read of SENDs answers a liveness check."""
    service, storage = make_service(tmp_path)
    name = "persistent://public/default/runs-direct-state"

    async def scenario() -> None:
        early = ServerConnection(service)
        early_transport = RecordingTransport()
        early.connection_made(early_transport)
        early.data_received(send(1, 0, b"x"))
        assert early_transport.closed
        assert [c.type for c in answers(early_transport)] == [T.ERROR]

        conn, transport = await connect(service, name)
        alive = asyncio.ensure_future(conn.is_alive(20))
        await asyncio.sleep(0)
        conn.last_seen = 0.0
        conn.data_received(send(1, 0, b"x"))
        assert await alive and conn.last_seen > 0
        await service.topics.close_all()

    run(service, storage, scenario)
