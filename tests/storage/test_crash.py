"""Crash safety: a writer process killed with SIGKILL mid-append, many times.

Every entry whose append returned (the child reports it in an ack file only after ``append``
or ``append_many`` returns, or -- the pipelined writer -- once ``sync_written`` reported a sync
that covered it) must read back intact after recovery, in order; the only other entries
allowed are the few that were being appended when the kill landed (for the pipelined writer:
written, no sync finished over them yet), and those must be complete and correct too -- never
a torn, altered, duplicated or invented entry.
"""

import json
import os
import random
import select
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from compactmq.config import load_config
from compactmq.naming import TopicName
from compactmq.storage import Position, Storage
from compactmq.storage import ledger_file as lf

from . import crash_writer as cw
from .crash_writer import BATCH, MAX_PER_THREAD, OVERRIDES, PIPELINED, TOPIC, payload
import children  # tests/ is on sys.path

ROUNDS = 32


class ForkServer:
    """Starts ``crash_writer.serve`` in a fresh interpreter and talks to it line by line."""

    def __init__(self):
        pkg_root = Path(cw.__file__).parents[len(cw.__name__.split(".")) - 1]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(pkg_root), *sys.path]))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", f"from {cw.__name__} import serve; serve()"],
            **children.keep(stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env),
        )
        self._buf = b""
        self._lines: list[str] = []
        self.running: int | None = None  # the writer started last, until its exit is seen

    def start(self, function: str, *args) -> int:
        self.proc.stdin.write(f"{function} {json.dumps(args)}\n".encode())
        self.proc.stdin.flush()
        pid = int(self.expect("pid").split()[1])
        self.running = pid
        return pid

    def expect(self, word: str, timeout: float = 30.0) -> str:
        """The next line starting with ``word``. Lines may come in either order: a child
        can say ``ready`` before the server has written its ``pid``."""
        deadline = time.monotonic() + timeout
        while True:
            for i, text in enumerate(self._lines):
                if text.split()[0] == word:
                    return self._lines.pop(i)
                if text.split()[0] == "failed":
                    raise AssertionError("the writer failed (its traceback is in the captured stderr)")
            fd = self.proc.stdout.fileno()
            if not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
                raise AssertionError(f"fork server: no {word!r} within {timeout} s (got {self._lines})")
            chunk = os.read(fd, 4096)
            if not chunk:
                raise AssertionError("fork server died")
            self._buf += chunk
            *lines, self._buf = self._buf.split(b"\n")
            self._lines.extend(line.decode() for line in lines)

    def run_to_end(self, function: str, *args) -> None:
        self.start(function, *args)
        self.wait_exit()

    def wait_exit(self) -> None:
        self.expect("exit")
        self.running = None

    def close(self) -> None:
        if self.running is not None:  # a test failed mid-round: do not leave a writer behind
            try:
                os.kill(self.running, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:  # a test failed with a writer still running
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()


@pytest.fixture
def fork_server():
    server = ForkServer()
    yield server
    server.close()


def _read_acks(path: str) -> list[tuple[int, int, int]]:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return []
    n = len(data) // cw.ACK.size  # a record cut by the kill is ignored
    return [cw.ACK.unpack_from(data, k * cw.ACK.size) for k in range(n)]


def _verify(
    data_dir: str, acked: dict[tuple[int, int], int], start: Position = Position(0, 0), first_round: int = 0
) -> dict[int, Position]:
    """Open (recovering) and check every entry from ``start`` (the first entry of round
    ``first_round``; earlier rounds sit in closed ledgers that nothing rewrites). Returns the
    first position of each round seen."""
    with Storage(data_dir, load_config(overrides=OVERRIDES)) as st:
        ml = st.open_managed_ledger(TOPIC)
        seen: dict[tuple[int, int], int] = {}
        firsts: dict[int, Position] = {}
        last_round = first_round
        pos = start
        while True:
            batch = ml.read_entries(pos, 2000)
            if not batch:
                break
            for p, data in batch:
                r, t, i = struct.unpack_from(">HHI", data)
                assert data == payload(r, t, i), f"entry {p} altered"
                assert r >= last_round, f"entry {p} of round {r} after round {last_round}"
                last_round = r
                firsts.setdefault(r, p)
                assert i == seen.get((r, t), 0), (
                    f"entry {p}: ({r},{t}) expected #{seen.get((r, t), 0)}, got #{i}"
                )
                seen[(r, t)] = i + 1
            pos = ml.next_position(batch[-1][0])
        for key, n in acked.items():
            if key[0] < first_round:
                continue
            got = seen.get(key, 0)
            assert got >= n, f"acknowledged entries lost for (round, thread) {key}: {got} < {n}"
            assert got <= n + _unacked_allowed(key[1]), f"{key}: {got} entries, only {n} acknowledged"
        for key, got in seen.items():
            assert key in acked or got <= _unacked_allowed(key[1]), f"{key}: {got} entries, none acknowledged"
        return firsts


def _unacked_allowed(thread: int) -> int:
    """Entries of a thread that may be on disk unacknowledged: the call in flight; for the
    pipelined writer, everything written that no finished sync covered yet."""
    return {0: BATCH, PIPELINED: MAX_PER_THREAD}.get(thread, 1)


@pytest.mark.timeout(120)
def test_sigkill_mid_append_loses_no_acknowledged_entry(tmp_path, fork_server):
    data_dir = str(tmp_path / "data")
    rng = random.Random(20261121)
    acked: dict[tuple[int, int], int] = {}
    rounds_with_acks = 0
    firsts: dict[int, Position] = {}
    t0 = time.monotonic()
    for r in range(ROUNDS):
        ack_path = str(tmp_path / f"acks-{r}")
        pid = fork_server.start("run", data_dir, r, ack_path)
        fork_server.expect("ready")
        time.sleep(rng.uniform(0.005, 0.1))
        os.kill(pid, signal.SIGKILL)
        fork_server.wait_exit()
        acks = _read_acks(ack_path)
        for rr, t, n in acks:
            acked[(rr, t)] = max(acked.get((rr, t), 0), n)
        rounds_with_acks += bool(acks)
        # recover and check what this round and the last one that wrote anything wrote
        # (older ledgers are closed and never rewritten)
        earlier = [k for k in firsts if k < r]
        start_round = max(earlier) if earlier else 0
        firsts.update(_verify(data_dir, acked, firsts.get(start_round, Position(0, 0)), start_round))
        if time.monotonic() - t0 > 25:  # keep the suite fast on a slow machine
            break
    _verify(data_dir, acked)  # and everything, once more, at the end
    assert r + 1 >= 10, "too few rounds ran"
    assert rounds_with_acks >= (r + 1) // 3, "the writer rarely got going before the kill"
    assert any(t == PIPELINED for _, t in acked), "no sync ever acknowledged the pipelined writer"
    shutil.rmtree(data_dir)  # a few hundred MB; pytest keeps old tmp dirs around


def _open_ledger_file(data_dir: str) -> str:
    with Storage(data_dir, load_config(), read_only=True) as st:
        ml = st.open_managed_ledger(TOPIC, create=False)
        return ml.ledger_path(ml.ledgers()[-1].ledger_id)


def _records_end(path: str) -> int:
    """Where the records of a ledger left open end. The writer keeps zeros written ahead of
    them (``LocalLedgerWriter``), so a crash leaves a zero-filled tail: the file is longer."""
    with open(path, "rb") as f:
        buf = f.read()
    scan = lf.scan_records(buf, verify_crc=True)
    assert scan.torn and len(buf) > scan.valid_end and not any(buf[scan.valid_end :])
    return scan.valid_end


@pytest.mark.parametrize("cut", [1, 5, 23, 24, 30, -1])
def test_torn_tail_is_cut_back_to_last_good_entry(tmp_path, cut, fork_server):
    data_dir = str(tmp_path / "data")
    fork_server.run_to_end("write_and_exit", data_dir, 5)
    path = _open_ledger_file(data_dir)
    size = _records_end(path)  # the crash left the writer's zeros ahead after the records
    last_len = len(b"entry-4" * 5) + lf.RECORD_HEADER_SIZE
    with open(path, "r+b") as f:
        if cut == -1:  # zeros after the last record, as the writer leaves them: cut to the records
            pass
        else:  # the last record cut short
            f.truncate(size - last_len + cut)
    with Storage(data_dir, load_config()) as st:
        ml = st.open_managed_ledger(TOPIC)
        got = [d for _, d in ml.read_entries(Position(0, 0), 100)]
    want = [b"entry-%d" % i * (i + 1) for i in range(5 if cut == -1 else 4)]
    assert got == want
    assert os.path.getsize(path) == (size if cut == -1 else size - last_len)


def test_flipped_bit_in_last_record_is_treated_as_torn(tmp_path, fork_server):
    data_dir = str(tmp_path / "data")
    fork_server.run_to_end("write_and_exit", data_dir, 3)
    path = _open_ledger_file(data_dir)
    end = _records_end(path)
    with open(path, "r+b") as f:
        f.seek(end - 2)
        b = f.read(1)
        f.seek(end - 2)
        f.write(bytes([b[0] ^ 0x10]))
    with Storage(data_dir, load_config()) as st:
        ml = st.open_managed_ledger(TOPIC)
        assert [d for _, d in ml.read_entries(Position(0, 0), 100)] == [b"entry-0", b"entry-1" * 2]


def test_recovered_ledger_is_closed_and_appends_continue_in_a_new_one(tmp_path, fork_server):
    data_dir = str(tmp_path / "data")
    fork_server.run_to_end("write_and_exit", data_dir, 3)
    with Storage(data_dir, load_config()) as st:
        ml = st.open_managed_ledger(TOPIC)
        infos = ml.ledgers()
        assert [(i.entry_count, i.state) for i in infos] == [(3, "CLOSED"), (0, "OPEN")]
        p = ml.append(b"after")
        assert p == Position(infos[1].ledger_id, 0)
        assert os.path.exists(lf.index_path_for(ml.ledger_path(infos[0].ledger_id)))


def test_read_only_open_reads_past_nothing_and_repairs_nothing(tmp_path, fork_server):
    """A compaction job opening the data dir beside a (here: dead) writer sees the complete
    entries of the open ledger and leaves the half-written one alone."""
    data_dir = str(tmp_path / "data")
    fork_server.run_to_end("write_and_exit", data_dir, 3)
    path = _open_ledger_file(data_dir)
    with open(path, "r+b") as f:
        f.seek(_records_end(path))
        f.write(lf.encode_record(3, 0, b"half written")[:-4])
    size = os.path.getsize(path)
    with Storage(data_dir, load_config(), read_only=True) as st:
        ml = st.open_managed_ledger(TOPIC, create=False)
        assert [d for _, d in ml.read_entries(Position(0, 0), 10)] == [
            b"entry-%d" % i * (i + 1) for i in range(3)
        ]
        assert ml.ledgers()[-1].state == "OPEN"
    assert os.path.getsize(path) == size


def test_crash_between_ledger_row_and_its_file(tmp_path):
    """Rollover records the next ledger OPEN, then creates its file: a crash in between
    leaves a row without a file, which recovery drops (nothing was ever appended there)."""
    data_dir = str(tmp_path / "data")
    with Storage(data_dir, load_config()) as st:
        ml = st.open_managed_ledger(TOPIC)
        p = ml.append(b"kept")
    with Storage(data_dir, load_config()) as st:
        ghost = st.topic_metadata.add_ledger(TOPIC, 0)  # as if the process died right after
        st.close()
    with Storage(data_dir, load_config()) as st:
        ml = st.open_managed_ledger(TOPIC)
        assert ghost not in [i.ledger_id for i in ml.ledgers()]
        assert [d for _, d in ml.read_entries(Position(0, 0), 10)] == [b"kept"]
        assert ml.append(b"next") > p


def test_crash_after_sealing_before_the_metadata_says_closed(tmp_path):
    """A ledger fsynced and indexed but still OPEN in the metadata store is recovered like
    any open ledger: same entries, recorded CLOSED."""
    data_dir = str(tmp_path / "data")
    with Storage(data_dir, load_config()) as st:
        ml = st.open_managed_ledger(TOPIC)
        ps = [ml.append(b"%d" % i) for i in range(4)]
    with Storage(data_dir, load_config()) as st:
        res, tn = st.resources.managed_ledgers, TopicName.parse(TOPIC)
        info, version = res.get(tn)  # roll the CLOSED back to OPEN, keep the .idx
        for led in info["ledgerInfo"]:
            if led["ledgerId"] == ps[0].ledger_id:
                led.update(state="OPEN", entries=0)
        res.put(tn, info, version)
    with Storage(data_dir, load_config()) as st:
        ml = st.open_managed_ledger(TOPIC)
        info = [i for i in ml.ledgers() if i.ledger_id == ps[0].ledger_id][0]
        assert (info.state, info.entry_count) == ("CLOSED", 4)
        assert [d for _, d in ml.read_entries(ps[0], 10)] == [b"0", b"1", b"2", b"3"]
