"""The writer processes of the SIGKILL crash tests, and the fork server that starts them.

Writers are forked from a fresh single-threaded Python (``serve``): forking pytest itself is
unsafe once other tests have started threads (Spark's py4j, event loops), and a fork from a
process that already imported the storage starts in milliseconds.

It appends from several threads (one with ``append_many``) and reports every acknowledgement
by appending a fixed-size record to an ack file AFTER the call returned, so the parent knows a
lower bound of what was acknowledged when the kill landed. One more thread uses the broker's
pipelined commit (``write_many``, never waiting) while another syncs it (``sync_written``) and
acknowledges, as the broker's receipts do, only entries a finished sync covered.
"""

import hashlib
import os
import struct
import threading
import time

from compactmq.config import load_config
from compactmq.storage import Storage, tail_index

# small spill chunks, so that kills also land while the open ledger's index spills to its file
tail_index.CHUNK = 16

TOPIC = "persistent://public/default/crash"
THREADS = 3  # thread 0 uses append_many, the others append
PIPELINED = THREADS  # the thread id of the pipelined writer (write_many + sync_written)
BATCH = 8
MAX_PER_THREAD = 150  # per round, so the data (and the test) stays small
OVERRIDES = {
    "managedLedgerMaxEntriesPerLedger": 97,
    "managedLedgerMinLedgerRolloverTimeMinutes": 0,  # roll by entry count at once (conftest.py)
    "managedLedgerGroupCommitMaxDelayMicros": 200,
}
ACK = struct.Struct(">HHI")  # round, thread, entries of that thread acknowledged so far


def payload(round_no: int, thread: int, i: int) -> bytes:
    key = struct.pack(">HHI", round_no, thread, i)
    digest = hashlib.blake2b(key).digest()
    # mostly small; one in eight up to 1 MiB, so that kills land inside long writes and tear them
    n = (digest[0] + 1) * 4096 if digest[1] < 32 else digest[0] * 4
    return key + (digest * (n // 64 + 1))[:n]


def run(data_dir: str, round_no: int, ack_path: str) -> None:
    try:
        ack_fd = os.open(ack_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        st = Storage(data_dir, load_config(overrides=OVERRIDES))
        ml = st.open_managed_ledger(TOPIC)

        def worker(t: int) -> None:
            i = 0
            while i < MAX_PER_THREAD:
                if t == 0:
                    ml.append_many([payload(round_no, t, i + k) for k in range(BATCH)])
                    i += BATCH
                else:
                    ml.append(payload(round_no, t, i))
                    i += 1
                os.write(ack_fd, ACK.pack(round_no, t, i))  # acknowledged: the first i entries

        os.write(1, b"ready\n")  # recovered and open: the parent starts its kill timer
        threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
        threads += _pipelined(ml, round_no, ack_fd)
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        time.sleep(60)  # wait for the kill
    except BaseException:
        import traceback

        traceback.print_exc()  # shows up in the test's captured stderr
        os.write(1, b"failed\n")
    finally:
        os._exit(0)


def _pipelined(ml, round_no: int, ack_fd: int) -> list[threading.Thread]:
    """A writer that never waits for a sync (``write_many``) and a syncer that acknowledges
    what each sync covered (``sync_written`` and its ``on_durable``), as the broker does."""
    written: list[tuple[int, int]] = []  # (seq, entries of this thread written up to it)
    lock = threading.Lock()
    done = threading.Event()

    def ack(durable: int) -> None:
        with lock:
            upto = [n for seq, n in written if seq <= durable]
            del written[: len(upto)]
        if upto:
            os.write(ack_fd, ACK.pack(round_no, PIPELINED, upto[-1]))

    def writer() -> None:
        i = 0
        while i < MAX_PER_THREAD:
            n = 1 + i % 3
            _, _, seq = ml.write_many([payload(round_no, PIPELINED, i + k) for k in range(n)])
            i += n
            with lock:
                written.append((seq, i))
        done.set()

    def syncer() -> None:
        while True:
            finished = done.is_set()
            ack(ml.sync_written(ack))
            if finished:
                return
            time.sleep(0.0005)

    return [threading.Thread(target=writer), threading.Thread(target=syncer)]


def write_and_exit(data_dir: str, n: int) -> None:
    """Append ``n`` entries, then die without closing anything (a crash between appends)."""
    try:
        st = Storage(data_dir, load_config())
        ml = st.open_managed_ledger(TOPIC)
        for i in range(n):
            ml.append(b"entry-%d" % i * (i + 1))
    finally:
        os._exit(0)


FUNCTIONS = {"run": run, "write_and_exit": write_and_exit}


def serve() -> None:
    """Read ``<function> <json args>`` lines on stdin; for each, fork a child that runs it and
    answer ``pid <n>``, then ``exit <n> <status>`` once the child is gone (killed or exited).
    The child shares stdout, so ``run`` can say ``ready`` in between."""
    import json
    import sys

    for line in sys.stdin:
        name, _, args = line.strip().partition(" ")
        pid = os.fork()
        if pid == 0:
            try:
                FUNCTIONS[name](*json.loads(args))
            finally:
                os._exit(1)
        os.write(1, f"pid {pid}\n".encode())
        _, status = os.waitpid(pid, 0)
        os.write(1, f"exit {pid} {status}\n".encode())
