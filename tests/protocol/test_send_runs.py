"""Runs of SENDs (``wire.split_sends``, ``frames.SendRun``): a run holds exactly the SENDs the
one-by-one path would have read, stops before anything that path must judge, and its receipts
are byte for byte the receipts written one by one. Every test runs on the pure-Python twin and,
when built, on the C extension."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compactmq.protocol import commands, wire
from compactmq.protocol import frames as F
from compactmq.protocol import entry_format as E
from compactmq.protocol import pulsar_pb2 as pb

from .helpers import real_client_frames

IMPLS = [wire.PYTHON] + ([wire.NATIVE] if wire.NATIVE is not None else [])
both = pytest.mark.parametrize("impl", IMPLS, ids=lambda i: i.name)
U64 = st.integers(min_value=0, max_value=(1 << 64) - 1)
MAX = F.DEFAULT_MAX_FRAME_SIZE


def send_frame(
    pid: int,
    seq: int,
    *,
    payload: bytes = b"x" * 10,
    publish_time: int = 7,
    num: int | None = None,
    highest: int | None = None,
    checksummed: bool = True,
) -> bytes:
    body = pb.CommandSend(producer_id=pid, sequence_id=seq)
    if num is not None:
        body.num_messages = num
    if highest is not None:
        body.highest_sequence_id = highest
    md = pb.MessageMetadata(producer_name="p", sequence_id=seq, publish_time=publish_time)
    entry = E.build_entry(md, payload)
    if not checksummed:
        entry = entry[6:]
    return F.encode_with_entry(pb.BaseCommand(type=pb.BaseCommand.SEND, send=body), entry)


def one_by_one(data: bytes) -> list:
    return F.FrameDecoder().feed(data)


@pytest.fixture(params=IMPLS, ids=lambda i: i.name)
def impl(request, monkeypatch):
    """The implementation under test, also as the one FrameDecoder uses."""
    monkeypatch.setattr(F, "_split_sends", request.param.split_sends)
    return request.param


def test_a_run_holds_what_the_frames_one_by_one_hold(impl):
    data = b"".join(
        send_frame(3, seq, payload=bytes([seq]) * seq, publish_time=100 + seq) for seq in range(1, 6)
    )
    end, pid, entries, times, receipts, messages, size, last = impl.split_sends(data, 0, len(data), MAX)
    frames = one_by_one(data)
    assert (end, pid, messages, last) == (len(data), 3, 5, 5)
    assert entries == [f.entry for f in frames] and all(type(e) is bytes for e in entries)
    assert times == [101, 102, 103, 104, 105]
    assert size == sum(len(e) for e in entries)
    assert wire.receipt_fields(receipts) == [(seq, None) for seq in range(1, 6)]
    (run,) = F.FrameDecoder(send_runs=True).feed(data)
    assert isinstance(run, F.SendRun) and len(run) == 5 and run.end == len(data)
    again = run.frames()
    assert [(f.send.producer_id, f.send.sequence_id, f.entry, f.command) for f in again] == [
        (f.send.producer_id, f.send.sequence_id, f.entry, f.command) for f in frames
    ]
    assert run.command == frames[0].command


def test_real_client_sends_make_runs(impl):
    raw = [f["raw"] for f in real_client_frames() if f["type"] == "SEND"]
    for one in raw:
        (run,) = F.FrameDecoder(send_runs=True).feed(one)
        assert isinstance(run, F.SendRun)
        (frame,) = one_by_one(one)
        assert run.entries == [frame.entry] and run.producer_id == frame.send.producer_id


def test_a_run_stops_before_what_the_general_path_must_read(impl):
    a, b = send_frame(1, 0), send_frame(1, 1)
    other_producer = send_frame(2, 2)
    no_checksum = send_frame(1, 3, checksummed=False)
    bad_crc = bytearray(send_frame(1, 4))
    bad_crc[-1] ^= 1
    flow = F.encode_command(
        pb.BaseCommand(type=pb.BaseCommand.FLOW, flow=pb.CommandFlow(consumer_id=1, messagePermits=5))
    )
    for stopper in (other_producer, no_checksum, bytes(bad_crc), flow, a[:-3]):
        data = a + b + stopper
        run = impl.split_sends(data, 0, len(data), MAX)
        assert run[0] == len(a + b) and len(run[2]) == 2
        assert impl.split_sends(data, len(a + b), len(data), MAX) is None or stopper is other_producer
    # a frame over the limit, or too small, is never part of a run: the decoder raises about it
    assert impl.split_sends(a, 0, len(a), len(a) - 5) is None
    assert impl.split_sends(b"\x00\x00\x00\x02\x00\x00", 0, 6, MAX) is None


def test_the_decoder_answers_a_mixed_stream_in_order(impl):
    flow = F.encode_command(
        pb.BaseCommand(type=pb.BaseCommand.FLOW, flow=pb.CommandFlow(consumer_id=1, messagePermits=5))
    )
    bad = bytearray(send_frame(1, 2))
    bad[-1] ^= 1
    parts = [
        send_frame(1, 0),
        send_frame(1, 1),
        bytes(bad),
        send_frame(1, 3),
        flow,
        send_frame(2, 4),
        send_frame(2, 5),
    ]
    data = b"".join(parts)
    expected = [(f.type, f.entry) for f in one_by_one(data)]
    for cut in (0, 1, 3, 9, 40, len(parts[0]) + 5, len(data) - 2):
        d = F.FrameDecoder(send_runs=True)
        out = (d.feed(data[:cut]) if cut else []) + d.feed(bytearray(data[cut:]))
        flat = []
        for item in out:
            flat += (
                [(f.type, f.entry) for f in item.frames()]
                if isinstance(item, F.SendRun)
                else [(item.type, item.entry)]
            )
        assert flat == expected
        assert d.buffered == 0
    kinds = [type(x).__name__ for x in F.FrameDecoder(send_runs=True).feed(data)]
    # the bad checksum is read alone (SEND_ERROR later), the FLOW too, each producer its own run
    assert kinds == ["SendRun", "SendFrame", "SendRun", "Frame", "SendRun"]


def test_feed_after_run_gives_what_feed_gives(impl):
    """The broker's connection reads the run a read starts with itself and hands it to
    ``feed_after_run``: the frames, the partial frame kept and the errors are ``feed``'s."""
    flow = F.encode_command(
        pb.BaseCommand(type=pb.BaseCommand.FLOW, flow=pb.CommandFlow(consumer_id=1, messagePermits=5))
    )
    too_big = struct.pack(">I", MAX + 1) + b"\x00" * 8
    run = send_frame(1, 0) + send_frame(1, 1)
    for rest in (flow, send_frame(2, 2), flow + send_frame(1, 3)[:7], send_frame(1, 3)[:30]):
        data = run + rest
        expected, d = F.FrameDecoder(send_runs=True), F.FrameDecoder(send_runs=True)
        want = expected.feed(data)
        got = d.feed_after_run(data, impl.split_sends(data, 0, len(data), MAX))
        assert [(type(x), x.type, x.entry if not isinstance(x, F.SendRun) else x.entries) for x in got] == [
            (type(x), x.type, x.entry if not isinstance(x, F.SendRun) else x.entries) for x in want
        ]
        assert d.buffered == expected.buffered
        tail = send_frame(1, 3)
        assert [f.type for f in d.feed(tail[d.buffered - len(tail) :] if d.buffered else tail)][-1:] == [
            pb.BaseCommand.SEND
        ]
    d = F.FrameDecoder(send_runs=True)
    with pytest.raises(F.ProtocolError, match="exceeds the limit"):
        d.feed_after_run(run + too_big, impl.split_sends(run + too_big, 0, len(run + too_big), MAX))
    assert not d.idle
    with pytest.raises(F.ProtocolError, match="exceeds the limit"):
        d.feed(run)  # failed for good, as feed leaves it


def test_framing_errors_are_raised_as_before(impl):
    too_big = struct.pack(">I", MAX + 1) + b"\x00" * 8
    for data in (send_frame(1, 0) + too_big, too_big):
        with pytest.raises(F.ProtocolError, match="exceeds the limit"):
            F.FrameDecoder(send_runs=True).feed(data)
    d = F.FrameDecoder(send_runs=True)
    assert d.feed(struct.pack(">I", MAX + 1)[:2]) == []
    with pytest.raises(F.ProtocolError, match="exceeds the limit"):
        d.feed(struct.pack(">I", MAX + 1)[2:])


def test_sequence_ids_of_batches_and_highest_ids(impl):
    data = send_frame(1, 10, num=5) + send_frame(1, 20, highest=25, num=6) + send_frame(1, 15, num=-3)
    run = impl.split_sends(data, 0, len(data), MAX)
    # last ids: 10 + 5 - 1 = 14, 25, 15 (num below 1 counts as 1); the largest answers
    assert run[7] == 25 and run[5] == 5 + 6 - 3
    assert wire.receipt_fields(run[4]) == [(10, None), (20, 25), (15, None)]
    # a last id past 64 bits is left to the general path (Python's ints)
    edge = send_frame(1, (1 << 64) - 1, num=2)
    assert impl.split_sends(edge, 0, len(edge), MAX) is None


@both
@settings(max_examples=200, deadline=None)
@given(
    pid=U64,
    partition=st.integers(min_value=-(1 << 31), max_value=(1 << 31) - 1),
    ledger=U64,
    first=st.integers(min_value=0, max_value=1 << 40),
    messages=st.lists(
        st.tuples(U64, st.one_of(st.none(), st.integers(min_value=1, max_value=(1 << 64) - 1))), max_size=30
    ),
)
def test_run_receipts_are_the_receipts_one_by_one(impl, pid, partition, ledger, first, messages):
    receipts = b"".join(struct.pack("<QQ", seq, highest or 0) for seq, highest in messages)
    expected = b"".join(
        F.encode_command(
            commands.send_receipt(
                pid, seq, ledger, first + i, partition=partition, highest_sequence_id=highest
            )
        )
        for i, (seq, highest) in enumerate(messages)
    )
    assert impl.send_receipt_frames(pid, partition, ledger, first, receipts) == expected


@settings(max_examples=150, deadline=None)
@given(
    frames=st.lists(
        st.tuples(
            st.sampled_from([1, 2]),
            U64,
            st.binary(max_size=30),
            st.integers(min_value=0, max_value=1 << 45),
            st.sampled_from(["ok", "ok", "ok", "no-crc", "bad-crc", "flow"]),
        ),
        min_size=1,
        max_size=12,
    ),
    start=st.integers(min_value=0, max_value=3),
)
def test_the_twins_agree(frames, start):
    if wire.NATIVE is None:
        pytest.skip("the C extension is not built")
    parts = []
    for pid, seq, payload, publish_time, kind in frames:
        if kind == "flow":
            parts.append(F.encode_command(commands.ping()))
            continue
        one = bytearray(
            send_frame(pid, seq, payload=payload, publish_time=publish_time, checksummed=kind != "no-crc")
        )
        if kind == "bad-crc":
            one[-1] ^= 1
        parts.append(bytes(one))
    data = b"".join(parts)
    pos = sum(len(p) for p in parts[: min(start, len(parts))])
    assert wire.NATIVE.split_sends(data, pos, len(data), MAX) == wire.PYTHON.split_sends(
        data, pos, len(data), MAX
    )
