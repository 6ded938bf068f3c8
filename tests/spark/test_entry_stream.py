"""``entry_stream``: MESSAGE frames received in bulk over a real socket pair, cut at every byte
boundary the kernel likes, with frames larger than the receive buffer, control frames between
entries, and permits counted per message as the broker counts them (no Spark, no broker)."""

from __future__ import annotations

import random
import socket
import threading

import pytest

from compactmq.protocol import commands
from compactmq.protocol import pulsar_pb2 as pb
from compactmq.protocol.frames import encode_command, encode_with_entry
from compactmq.protocol.entry_format import build_entry
from compactmq.spark import entry_stream
from compactmq.spark.entry_stream import EntryStream, messages_in


def entry(i: int, batch: int, size: int) -> bytes:
    md = pb.MessageMetadata(producer_name="p", sequence_id=i, publish_time=1000 + i)
    if batch:
        md.num_messages_in_batch = batch
    return build_entry(md, bytes([i % 251]) * size)


def stream_of(entries, extra_every: int = 0) -> bytes:
    """MESSAGE frames of ``entries`` (ids (7, i)), a PING after every ``extra_every``-th."""
    out = []
    for i, e in enumerate(entries):
        out.append(encode_with_entry(commands.message(1, (7, i)), e))
        if extra_every and i % extra_every == 0:
            out.append(encode_command(commands.ping()))
    return b"".join(out)


class Dribble:
    """The read side of a socket pair whose write side sends ``data`` in random pieces."""

    def __init__(self, data: bytes, seed: int):
        self.a, self.b = socket.socketpair()
        self.a.settimeout(10)
        # small kernel buffers: the reader sees partial frames, as from a real network
        self.a.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.b.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        rnd = random.Random(seed)

        def send():
            pos = 0
            while pos < len(data):
                n = rnd.choice([1, 7, 100, 4096, 65536, 1 << 20])
                try:
                    self.b.sendall(data[pos : pos + n])
                except OSError:
                    return  # the reader stopped early and closed
                pos += n

        self.thread = threading.Thread(target=send, daemon=True)
        self.thread.start()

    def close(self):
        self.a.close()
        self.b.close()
        self.thread.join(10)


@pytest.mark.parametrize("seed", range(4))
def test_chunks_hold_every_entry_byte_for_byte(seed, monkeypatch):
    monkeypatch.setattr(entry_stream, "RECV_BYTES", 3000)  # frames larger than the buffer too
    rnd = random.Random(seed)
    entries = [entry(i, rnd.choice([0, 0, 3, 50]), rnd.choice([0, 10, 500, 9000])) for i in range(120)]
    pair = Dribble(stream_of(entries, extra_every=9), seed)
    flows, controls = [], []

    def control(cmd):
        controls.append(cmd.type)
        return cmd.type == pb.BaseCommand.PING

    try:
        s = EntryStream(pair.a, b"", control, lambda cmd: AssertionError(cmd), flows.append)
        end = (7, 100)  # entries 100.. are not read
        got = []
        for c in s.chunks(end, permits=40, chunk_entries=16, chunk_bytes=20000):
            assert len(c) <= 16
            for k in range(len(c)):
                got.append(
                    (
                        (int(c.ledger_ids[k]), int(c.entry_ids[k])),
                        c.data[c.offsets[k] : c.offsets[k] + c.lengths[k]].tobytes(),
                    )
                )
    finally:
        pair.close()
    assert got == [((7, i), entries[i]) for i in range(100)]
    assert set(controls) == {pb.BaseCommand.PING}
    # the window is topped up as the broker counts permits: per message, a batch as its size
    used = sum(messages_in(e, 0, len(e)) for e in entries[:100])
    assert flows[0] == 40 and sum(flows) >= used and len(flows) > 1


def test_a_frame_that_is_no_reply_fails_the_read():
    data = stream_of([entry(0, 0, 5)]) + encode_command(commands.close_consumer(1, 0))
    data += stream_of([entry(1, 0, 5)])
    pair = Dribble(data, 0)

    class Closed(Exception):
        pass

    try:
        s = EntryStream(pair.a, b"", lambda cmd: False, lambda cmd: Closed(cmd.type), lambda n: None)
        with pytest.raises(Closed):
            list(s.chunks((9, 0), permits=10, chunk_entries=1, chunk_bytes=1 << 20))
    finally:
        pair.close()


def test_messages_in_counts_as_the_broker():
    assert messages_in(entry(1, 0, 3), 0, len(entry(1, 0, 3))) == 1
    e = entry(2, 25, 3)
    buf = b"xyz" + e
    assert messages_in(buf, 3, 3 + len(e)) == 25
    assert messages_in(b"\x00\x00", 0, 2) == 1  # not an entry: parse_entries will say so
