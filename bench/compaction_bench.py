"""Compaction benchmark: N 100-byte messages, K keys, 1 % tombstones, batched and non-batched.

For each layout it measures, on a data directory built once and cached under --work-dir:

* a full compaction (the topic's first) through ``SparkCompactionService.compact()`` -- JVM start
  excluded (the session is started and measured separately); the first run in a fresh session is
  reported as "cold", the following ones as "warm" (median of --repeat);
* an incremental run after 1 % new messages (median of --repeat successive increments): each
  extends the view's chain of segments (``compaction.chain``; ``view_chain`` gives its runs and
  segments afterwards), writing the new survivors and the old batches that lost a message only;
* peak memory: this driver process, the JVM, and the Python workers (sampled from /proc);
* baselines on the same data: a plain single-process Python two-pass dict dedup (protobuf
  parsing, then a second pass writing survivors), and the time to read the input bytes once.

Each layout's result also gives ``incremental_over_full`` (the incremental median over the full
median, from the same invocation: the machine is shared, so compare ratios, not seconds across
runs), the incremental run's rate over its new messages, and the load average around every run.

``--history-sizes 1000000,2500000,5000000,10000000``: for each history size (same key count,
capped at the size), one warm full run and one incremental run after 1 % new messages, reported
under ``history`` and drawn as run time against history size (``--plot``, a PNG; needs the
``bench`` extra's matplotlib). An incremental run that costs what is new stays flat while the
full run grows.

Results go to bench/results/compaction.json (or --out). ``--quick``: 1 M messages, 100 k keys.

``--large``: 100 M messages over 50 M keys, non-batched, with default memory settings: a warm-up
run on 1 M messages, then one full and one incremental run, each with its time, CPU seconds and
peak memory per process (driver, JVM, Python workers), to bench/results/compaction_large.json.
Preparing its data takes a while (built once, cached; progress every 1 M messages).

    .venv/bin/python bench/compaction_bench.py [--quick] [--messages N] [--keys K] [--layouts a,b]
        [--history-sizes N1,N2,...] [--plot PNG] [--large]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import struct
import subprocess
import sys
import threading
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))

TOPIC = "persistent://public/default/bench"
PAYLOAD = 100
BATCH = 100  # messages per batch in the batched layout
PER_LEDGER = 50_000


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --- data -------------------------------------------------------------------------------------


def _varint(v: int) -> bytes:
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def make_messages(n: int, keys: int, tombstone_rate: float, seed: int):
    """(key ids, tombstone flags) for n messages: keys uniform over `keys`, 1 % tombstones."""
    rng = np.random.default_rng(seed)
    key_ids = rng.integers(0, keys, n)
    tomb = rng.random(n) < tombstone_rate
    return key_ids, tomb


def build_entries(key_ids, tomb, batched: bool, seed: int, seq0: int = 0, fast: bool = True) -> list[bytes]:
    """Stored entries (magic, crc32c, metadata, payload) built by hand for speed; the protobuf
    layout is checked against pulsar_pb2 in a self-test at start. Non-batched entries are built
    column by column with numpy (``build_nonbatched``; ``fast=False``: one at a time, the
    reference the self-test compares it with)."""
    import crc32c

    rng = random.Random(seed)
    payload = bytes(rng.randrange(256) for _ in range(PAYLOAD))
    out = []
    now = 1_700_000_000_000
    if not batched and fast:
        return build_nonbatched(key_ids, tomb, payload, now, seq0)
    if not batched:
        for i, (k, t) in enumerate(zip(key_ids.tolist(), tomb.tolist())):
            key = b"key-%07d" % k
            md = (
                b"\x0a\x05bench\x10"
                + _varint(seq0 + i)
                + b"\x18"
                + _varint(now)
                + b"\x32"
                + bytes([len(key)])
                + key
            )
            body = struct.pack(">I", len(md)) + md + (b"" if t else payload)
            out.append(struct.pack(">HI", 0x0E01, crc32c.crc32c(body)) + body)
        return out
    n = len(key_ids)
    kl, tl = key_ids.tolist(), tomb.tolist()
    for b0 in range(0, n, BATCH):
        parts = []
        for k, t in zip(kl[b0 : b0 + BATCH], tl[b0 : b0 + BATCH]):
            key = b"key-%07d" % k
            p = b"" if t else payload
            smm = b"\x12" + bytes([len(key)]) + key + b"\x18" + _varint(len(p))
            parts.append(struct.pack(">I", len(smm)) + smm + p)
        count = len(parts)
        md = b"\x0a\x05bench\x10" + _varint(seq0 + b0) + b"\x18" + _varint(now) + b"\x58" + _varint(count)
        body = struct.pack(">I", len(md)) + md + b"".join(parts)
        out.append(struct.pack(">HI", 0x0E01, crc32c.crc32c(body)) + body)
    return out


def _varint_lengths(values: np.ndarray) -> np.ndarray:
    n = np.ones(len(values), np.int64)
    for b in range(1, 10):
        n += values >= (1 << (7 * b))
    return n


def build_nonbatched(key_ids, tomb, payload: bytes, now: int, seq0: int) -> list[bytes]:
    """The entries ``build_entries`` makes one at a time, the same bytes, built for many at once:
    entries of one shape (sequence-id varint length, key length, tombstone or not) are rows of
    one byte matrix filled column by column; only the checksum and the cut into ``bytes`` are
    per entry. What makes preparing 100 M messages (``--large``) take minutes, not an hour."""
    import crc32c

    key_ids = np.asarray(key_ids, np.int64)
    tomb = np.asarray(tomb, bool)
    n = len(key_ids)
    seqs = seq0 + np.arange(n, dtype=np.int64)
    vlen = _varint_lengths(seqs)
    digits = np.maximum(7, _digits(key_ids))
    now_v = _varint(now)
    out: list = [None] * n
    shape = vlen * 1000 + digits * 10 + tomb
    for code in np.unique(shape).tolist():
        idx = np.flatnonzero(shape == code)
        vl, nd, t = code // 1000, (code // 10) % 100, code % 10
        kl = 4 + nd
        md_len = 7 + 1 + vl + 1 + len(now_v) + 2 + kl
        width = 10 + md_len + (0 if t else PAYLOAD)
        a = np.empty((len(idx), width), np.uint8)
        a[:, 0:2] = (0x0E, 0x01)
        a[:, 6:10] = np.frombuffer(struct.pack(">I", md_len), np.uint8)
        a[:, 10:17] = np.frombuffer(b"\x0a\x05bench", np.uint8)
        a[:, 17] = 0x10
        s = seqs[idx]
        for b in range(vl):
            a[:, 18 + b] = ((s >> (7 * b)) & 0x7F) | (0x80 if b < vl - 1 else 0)
        at = 18 + vl
        a[:, at] = 0x18
        a[:, at + 1 : at + 1 + len(now_v)] = np.frombuffer(now_v, np.uint8)
        at += 1 + len(now_v)
        a[:, at], a[:, at + 1] = 0x32, kl
        a[:, at + 2 : at + 6] = np.frombuffer(b"key-", np.uint8)
        k = key_ids[idx]
        for d in range(nd):
            a[:, at + 6 + d] = 48 + (k // 10 ** (nd - 1 - d)) % 10
        if not t:
            a[:, at + 2 + kl :] = np.frombuffer(payload, np.uint8)
        flat = memoryview(a.reshape(-1))
        crcs = [crc32c.crc32c(flat[o + 6 : o + width]) for o in range(0, len(idx) * width, width)]
        a[:, 2:6] = np.array(crcs, ">u4").view(np.uint8).reshape(-1, 4)
        raw = a.tobytes()
        for i, o in zip(idx.tolist(), range(0, len(raw), width)):
            out[i] = raw[o : o + width]
    return out


def _digits(values: np.ndarray) -> np.ndarray:
    n = np.ones(len(values), np.int64)
    for d in range(1, 19):
        n += values >= 10**d
    return n


def self_test() -> None:
    from compactmq.protocol.entry_format import parse_entry
    from compactmq.protocol.batch import decode_batch

    # the column-wise builder makes the same bytes as the one-at-a-time one (all shapes)
    k = np.array([3, 4, 9_999_999, 10_000_000, 49_999_999, 0, 123])
    t = np.array([False, True, False, True, False, False, True])
    for seq0 in (0, 120, 16_380, 10**9 + 100):
        assert build_entries(k, t, False, 5, seq0) == build_entries(k, t, False, 5, seq0, fast=False)
    k, t = np.array([3, 4]), np.array([False, True])
    md, payload = parse_entry(build_entries(k, t, False, 1)[1])
    assert md.partition_key == "key-0000004" and payload == b""
    md, payload = parse_entry(build_entries(k, t, True, 1)[0])
    items = decode_batch(md, payload)
    assert md.num_messages_in_batch == 2 and [i.meta.partition_key for i in items] == [
        "key-0000003",
        "key-0000004",
    ]


def prepare(work_dir: str, layout: str, n: int, keys: int, seed: int, in_child: bool = False) -> str:
    """Data directory with N messages of `layout`; built once, cached (with a metadata snapshot
    from before any compaction, restored before each full run)."""
    from compactmq.config import load_config
    from compactmq.storage import Storage

    d = os.path.join(work_dir, f"{layout}-{n}-{keys}")
    if os.path.exists(os.path.join(d, "READY")):
        return d
    if not in_child:
        # build in a child process, so this process's peak memory is the compaction driver's only
        subprocess.run(
            [
                sys.executable,
                os.path.abspath(__file__),
                "--prepare-only",
                layout,
                "--messages",
                str(n),
                "--keys",
                str(keys),
                "--work-dir",
                work_dir,
            ],
            check=True,
        )
        return d
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    cfg = load_config(
        overrides={
            "managedLedgerMaxEntriesPerLedger": PER_LEDGER,
            "managedLedgerMinLedgerRolloverTimeMinutes": 0,  # ledgers of PER_LEDGER entries at once
            "managedLedgerSyncData": False,
        }
    )
    storage = Storage(os.path.join(d, "data"), cfg)
    ml = storage.open_managed_ledger(TOPIC)
    key_ids, tomb = make_messages(n, keys, 0.01, seed)
    chunk = PER_LEDGER if layout == "nonbatched" else PER_LEDGER * BATCH
    t0 = time.time()
    for c in range(0, n, chunk):
        entries = build_entries(key_ids[c : c + chunk], tomb[c : c + chunk], layout == "batched", seed, c)
        for e0 in range(0, len(entries), PER_LEDGER):
            ml.append_many(entries[e0 : e0 + PER_LEDGER])
        done = min(c + chunk, n)
        if done == n or done // 1_000_000 != (done - chunk) // 1_000_000:  # about every 1 M
            rate = done / max(1e-9, time.time() - t0)
            log(f"prepare {layout}: {done}/{n} messages ({time.time() - t0:.0f}s, {rate:,.0f} msg/s)")
    storage.close()
    snapshot_metadata(d)
    with open(os.path.join(d, "ledgers.txt"), "w") as f:
        f.write("\n".join(ledger_files(os.path.join(d, "data"))))
    open(os.path.join(d, "READY"), "w").close()
    return d


def snapshot_metadata(d: str) -> None:
    import sqlite3

    db = os.path.join(d, "data", "metadata.db")
    con = sqlite3.connect(db)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    shutil.copyfile(db, os.path.join(d, "metadata.snapshot"))


def restore_metadata(d: str) -> None:
    db = os.path.join(d, "data", "metadata.db")
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(db + suffix):
            os.unlink(db + suffix)
    shutil.copyfile(os.path.join(d, "metadata.snapshot"), db)
    shutil.rmtree(os.path.join(d, "data", "compacted"), ignore_errors=True)
    # ledgers appended by incremental runs are unknown to the snapshot: remove them
    with open(os.path.join(d, "ledgers.txt")) as f:
        keep = set(f.read().split("\n"))
    for p in ledger_files(os.path.join(d, "data")):
        if p not in keep:
            for q in (p, p[:-4] + ".idx"):
                if os.path.exists(q):
                    os.unlink(q)


# --- memory -----------------------------------------------------------------------------------


class MemorySampler:
    """Peak RSS of the driver, the JVM and the JVM's descendants (Python workers), from /proc."""

    def __init__(self, jvm_pid: int | None, period: float = 0.1):
        self.jvm_pid = jvm_pid
        self.period = period
        self.peak = {
            "driver_mb": 0.0,
            "jvm_mb": 0.0,
            "python_workers_mb": 0.0,
            "total_mb": 0.0,
            "driver_anon_mb": 0.0,
            "jvm_anon_mb": 0.0,
            "python_workers_anon_mb": 0.0,
            "total_anon_mb": 0.0,
        }
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _rss(pid: int) -> float:
        try:
            with open(f"/proc/{pid}/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
        except (OSError, IndexError, ValueError):
            return 0.0

    @staticmethod
    def _anon(pid: int) -> float:
        """Anonymous resident memory: RSS without file pages (ledger files are memory-mapped, and
        their page-cache pages count in RSS although they are shared and reclaimable)."""
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("RssAnon:"):
                        return int(line.split()[1]) / 1024
        except (OSError, ValueError, IndexError):
            pass
        return 0.0

    @staticmethod
    def _children() -> dict[int, list[int]]:
        kids: dict[int, list[int]] = {}
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    with open(f"/proc/{name}/stat") as f:
                        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                    kids.setdefault(ppid, []).append(int(name))
                except (OSError, IndexError, ValueError):
                    pass
        return kids

    def sample(self) -> None:
        me = os.getpid()
        driver, driver_a = self._rss(me), self._anon(me)
        jvm = workers = jvm_a = workers_a = 0.0
        if self.jvm_pid:
            jvm, jvm_a = self._rss(self.jvm_pid), self._anon(self.jvm_pid)
            kids = self._children()
            stack = list(kids.get(self.jvm_pid, []))
            while stack:
                p = stack.pop()
                workers += self._rss(p)
                workers_a += self._anon(p)
                stack.extend(kids.get(p, []))
        for k, v in (
            ("driver_mb", driver),
            ("jvm_mb", jvm),
            ("python_workers_mb", workers),
            ("total_mb", driver + jvm + workers),
            ("driver_anon_mb", driver_a),
            ("jvm_anon_mb", jvm_a),
            ("python_workers_anon_mb", workers_a),
            ("total_anon_mb", driver_a + jvm_a + workers_a),
        ):
            self.peak[k] = max(self.peak[k], round(v, 1))

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self.sample()

    def cpu_seconds(self) -> dict:
        """CPU time (user + system) so far of the driver, the JVM and its descendants: with other
        work on the machine, CPU seconds are steadier than wall time."""
        tck = os.sysconf("SC_CLK_TCK")

        def cpu(pid: int, reaped: bool = False) -> float:
            """``reaped``: with the CPU time of its children that exited (the pyspark daemon
            forks a worker per task and reaps it: without it a run's workers could count
            negative, their time gone from the tree between two samples)."""
            try:
                with open(f"/proc/{pid}/stat") as f:
                    parts = f.read().rsplit(")", 1)[1].split()
                fields = (11, 12, 13, 14) if reaped else (11, 12)
                return sum(int(parts[i]) for i in fields) / tck
            except (OSError, IndexError, ValueError):
                return 0.0

        t = os.times()
        out = {"driver": t.user + t.system, "jvm": 0.0, "python_workers": 0.0}
        if self.jvm_pid:
            out["jvm"] = cpu(self.jvm_pid)
            kids = self._children()
            stack = list(kids.get(self.jvm_pid, []))
            while stack:
                p = stack.pop()
                out["python_workers"] += cpu(p, reaped=True)
                stack.extend(kids.get(p, []))
        return out

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.sample()


# --- baselines --------------------------------------------------------------------------------


def ledger_files(data_dir: str) -> list[str]:
    out = []
    for root, _, files in os.walk(os.path.join(data_dir, "ledgers")):
        out.extend(os.path.join(root, f) for f in files if f.endswith(".log"))
    return sorted(out)


def read_once(data_dir: str) -> dict:
    t0 = time.perf_counter()
    total = 0
    for p in ledger_files(data_dir):
        with open(p, "rb") as f:
            while True:
                b = f.read(1 << 24)
                if not b:
                    break
                total += len(b)
    return {"seconds": round(time.perf_counter() - t0, 3), "bytes": total}


def python_dict_dedup(data_dir: str, out_path: str) -> dict:
    """Two passes in one Python process: (1) key -> latest (ledger, entry, index) by parsing
    metadata with pulsar_pb2; (2) re-read and write the entries holding survivors."""
    from compactmq.protocol import pulsar_pb2 as pb
    from compactmq.storage import ledger_file as lf

    def messages(buf, offs, lens):
        mv = memoryview(buf)
        for o, ln in zip(offs.tolist(), lens.tolist()):
            o += lf.RECORD_HEADER_SIZE
            (size,) = struct.unpack_from(">I", mv, o + 6)
            md = pb.MessageMetadata()
            md.ParseFromString(mv[o + 10 : o + 10 + size])
            payload = mv[o + 10 + size : o + ln]
            if not md.HasField("num_messages_in_batch"):
                yield o, ln, 0, md.partition_key, len(payload) == 0
                continue
            p = 0
            for i in range(md.num_messages_in_batch):
                (n,) = struct.unpack_from(">I", payload, p)
                smm = pb.SingleMessageMetadata()
                smm.ParseFromString(payload[p + 4 : p + 4 + n])
                p += 4 + n + smm.payload_size
                yield o, ln, i, smm.partition_key, smm.payload_size == 0

    files = ledger_files(data_dir)
    t0 = time.perf_counter()
    latest: dict = {}
    for fi, path in enumerate(files):
        with open(path, "rb") as f:
            buf = f.read()
        ids, offs, lens = lf.scan_entries(buf, verify_crc=False)
        for o, ln, i, key, tomb in messages(buf, offs, lens):
            latest[key] = None if tomb else (fi, o, i)
    t1 = time.perf_counter()
    keep = {v[:2] for v in latest.values() if v is not None}
    written = 0
    with open(out_path, "wb") as out:
        for fi, path in enumerate(files):
            with open(path, "rb") as f:
                buf = f.read()
            ids, offs, lens = lf.scan_entries(buf, verify_crc=False)
            for o, ln in zip(offs.tolist(), lens.tolist()):
                if (fi, o + lf.RECORD_HEADER_SIZE) in keep:
                    out.write(buf[o : o + lf.RECORD_HEADER_SIZE + ln])
                    written += 1
    t2 = time.perf_counter()
    os.unlink(out_path)
    return {
        "seconds": round(t2 - t0, 3),
        "pass1_seconds": round(t1 - t0, 3),
        "pass2_seconds": round(t2 - t1, 3),
        "keys_alive": len(keep) and sum(1 for v in latest.values() if v is not None),
        "entries_written": written,
    }


# --- the runs ---------------------------------------------------------------------------------


def compact_once(d: str, spark_conf: dict, sampler_pid) -> tuple[dict, object]:
    from compactmq.compaction.jobs import SparkCompactionService
    from compactmq.config import load_config
    from compactmq.storage import Storage

    cfg = load_config(
        overrides={
            "managedLedgerMaxEntriesPerLedger": PER_LEDGER,
            "managedLedgerMinLedgerRolloverTimeMinutes": 0,  # ledgers of PER_LEDGER entries at once
            "managedLedgerSyncData": False,
        }
    )
    storage = Storage(os.path.join(d, "data"), cfg)
    try:
        storage.open_managed_ledger(TOPIC)  # a broker has its topics open; recovery is not compaction
        service = SparkCompactionService(storage, TOPIC, cfg, spark_conf=spark_conf)
        last = [0.0]

        def progress(p):
            now = time.perf_counter()
            if now - last[0] > 2 or p.phase in ("commit", "done"):
                last[0] = now
                log(f"  {p.phase:<9} {p.entries_processed}/{p.entries_total} entries")

        with MemorySampler(sampler_pid) as mem:
            c0 = mem.cpu_seconds()
            t0 = time.perf_counter()
            result = service.compact(progress)
            secs = time.perf_counter() - t0
            c1 = mem.cpu_seconds()
        return {
            "seconds": round(secs, 3),
            "cpu_seconds": {k: round(c1[k] - c0[k], 2) for k in c0},
            "step_seconds": result.step_seconds,
            "messages_read": result.messages_read,
            "messages_kept": result.messages_kept,
            "entries_written": result.entries_written,
            "peak_memory": mem.peak,
            "load_average": os.getloadavg(),
        }, storage
    except BaseException:
        storage.close()
        raise


def incremental(
    d: str, spark_conf: dict, sampler_pid, n_new: int, keys: int, batched: bool, seed: int
) -> dict:
    from compactmq.compaction.jobs import SparkCompactionService
    from compactmq.config import load_config
    from compactmq.storage import Storage

    cfg = load_config(
        overrides={
            "managedLedgerMaxEntriesPerLedger": PER_LEDGER,
            "managedLedgerMinLedgerRolloverTimeMinutes": 0,  # ledgers of PER_LEDGER entries at once
            "managedLedgerSyncData": False,
        }
    )
    storage = Storage(os.path.join(d, "data"), cfg)
    try:
        ml = storage.open_managed_ledger(TOPIC)
        key_ids, tomb = make_messages(n_new, keys, 0.01, seed)
        entries = build_entries(key_ids, tomb, batched, seed, 10**9 + seed)
        for e0 in range(0, len(entries), PER_LEDGER):
            ml.append_many(entries[e0 : e0 + PER_LEDGER])
        # the new messages are in the topic: dropped here, or the driver's peak would count them
        # (at 30 M messages: 300,000 entries of ~150 bytes each, held through the run)
        del entries, key_ids, tomb
        service = SparkCompactionService(storage, TOPIC, cfg, spark_conf=spark_conf)
        with MemorySampler(sampler_pid) as mem:
            c0 = mem.cpu_seconds()
            t0 = time.perf_counter()
            result = service.compact()
            secs = time.perf_counter() - t0
            c1 = mem.cpu_seconds()
        view = service.compacted_ledger()  # the chain this run extended (or wrote fresh)
        shape = {"runs": view.manifest.runs, "segments": view.segment_count} if view.is_chain else None
        return {
            "seconds": round(secs, 3),
            "cpu_seconds": {k: round(c1[k] - c0[k], 2) for k in c0},
            "step_seconds": result.step_seconds,
            "view_chain": shape,
            "entries_written": result.entries_written,
            "messages_read": result.messages_read,
            "new_messages": n_new,
            "new_messages_per_second": round(n_new / secs),
            "messages_kept": result.messages_kept,
            "peak_memory": mem.peak,
            "load_average": os.getloadavg(),
        }
    finally:
        storage.close()


def history(work_dir: str, sizes: list[int], keys: int, spark_conf: dict, jvm_pid) -> dict:
    """Run time against history size: per size one warm full run, then one incremental run after
    1 % new messages (non-batched; the key count is ``keys`` capped at the size)."""
    out: dict = {"layout": "nonbatched", "keys": keys, "sizes": []}
    # the first run in a session is cold (JIT, Python workers): warm up on the smallest size first
    d = prepare(work_dir, "nonbatched", min(sizes), min(keys, min(sizes)), seed=11)
    restore_metadata(d)
    log("history: warm-up run (not reported)")
    compact_once(d, spark_conf, jvm_pid)[1].close()
    for n in sizes:
        k = min(keys, n)
        d = prepare(work_dir, "nonbatched", n, k, seed=11)
        restore_metadata(d)
        log(f"history {n}: full run")
        full, storage = compact_once(d, spark_conf, jvm_pid)
        storage.close()
        log(f"history {n}: incremental run after {n // 100} new messages")
        inc = incremental(d, spark_conf, jvm_pid, n // 100, k, False, 500)
        restore_metadata(d)
        log(f"history {n}: full {full['seconds']}s, incremental {inc['seconds']}s")
        out["sizes"].append(
            {
                "messages": n,
                "keys": k,
                "full_seconds": full["seconds"],
                "incremental_seconds": inc["seconds"],
                "incremental_over_full": round(inc["seconds"] / full["seconds"], 3),
                "full_steps": full["step_seconds"],
                "incremental_steps": inc["step_seconds"],
                "peak_memory": {"full": full["peak_memory"], "incremental": inc["peak_memory"]},
                "load_average": [full["load_average"], inc["load_average"]],
            }
        )
    return out


def plot_history(hist: dict, path: str) -> None:
    """Run time against history size, full and incremental, as a PNG (skipped, with a note in
    the log, when matplotlib -- the ``bench`` extra -- is not installed)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib is not installed (pip install '.[bench]'): no plot")
        return
    xs = [s["messages"] / 1e6 for s in hist["sizes"]]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ax.plot(xs, [s["full_seconds"] for s in hist["sizes"]], "o-", label="full run")
    ax.plot(xs, [s["incremental_seconds"] for s in hist["sizes"]], "s-", label="incremental (after 1 % new)")
    ax.set_xlabel("history size (M messages)")
    ax.set_ylabel("run time (s, warm session)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(f"compaction run time vs history ({hist['keys'] / 1e6:g} M keys, local Spark)")
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    log(f"wrote {path}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 M messages, 100 k keys")
    ap.add_argument(
        "--large",
        action="store_true",
        help="100 M messages over 50 M keys, non-batched: a warm-up on 1 M messages, then one full "
        "and one incremental run (default memory settings), to bench/results/compaction_large.json",
    )
    ap.add_argument("--messages", type=int, default=10_000_000)
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--layouts", default="nonbatched,batched")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--baselines", default="yes", choices=("yes", "no"))
    ap.add_argument(
        "--incremental", default="yes", choices=("yes", "no"), help="no: full runs only (phase-one tuning)"
    )
    ap.add_argument("--work-dir", default="/tmp/compactmq-bench")
    ap.add_argument("--spark-master", default="local[2]")
    ap.add_argument(
        "--spark-conf", action="append", default=[], metavar="KEY=VALUE", help="extra Spark settings"
    )
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "compaction.json"))
    ap.add_argument(
        "--history-sizes",
        default="",
        metavar="N1,N2,...",
        help="also time one full and one incremental run per history size (non-batched layout)",
    )
    ap.add_argument("--plot", default=os.path.join(ROOT, "bench", "results", "compaction_history.png"))
    ap.add_argument("--prepare-only", metavar="LAYOUT", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.prepare_only:
        prepare(args.work_dir, args.prepare_only, args.messages, args.keys, seed=11, in_child=True)
        return 0
    if args.quick:
        args.messages, args.keys = 1_000_000, 100_000
    if args.large:
        args.messages, args.keys, args.repeat, args.baselines = 100_000_000, 50_000_000, 1, "no"
        if args.layouts == ap.get_default("layouts"):
            args.layouts = "nonbatched"
        if args.out == ap.get_default("out"):
            args.out = os.path.join(ROOT, "bench", "results", "compaction_large.json")
    self_test()
    spark_conf = {
        "spark.master": args.spark_master,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "4",
        **dict(kv.split("=", 1) for kv in args.spark_conf),
    }
    from compactmq.compaction.jobs.session import get_session

    t0 = time.perf_counter()
    spark = get_session(spark_conf)
    jvm_start = time.perf_counter() - t0
    jvm_pid = getattr(getattr(spark.sparkContext._gateway, "proc", None), "pid", None)
    log(f"Spark session up in {jvm_start:.1f}s (JVM pid {jvm_pid})")
    report = {
        "benchmark": "compaction",
        "machine": {"cpus": os.cpu_count(), "load_average_at_start": os.getloadavg()},
        "params": {
            "messages": args.messages,
            "keys": args.keys,
            "payload_bytes": PAYLOAD,
            "tombstone_rate": 0.01,
            "batch_size": BATCH,
            "entries_per_ledger": PER_LEDGER,
            "spark_master": args.spark_master,
            "repeat": args.repeat,
            "large": args.large,
        },
        "jvm_and_session_start_seconds": round(jvm_start, 2),
        "layouts": {},
    }
    for layout in [name for name in args.layouts.split(",") if name]:  # --layouts "": history only
        d = prepare(args.work_dir, layout, args.messages, args.keys, seed=11)
        res: dict = {}
        runs = []
        full_runs = args.repeat + 1
        if args.large:  # one run, warm: the session's first run (JIT, Python workers) on 1 M messages
            small = prepare(args.work_dir, layout, 1_000_000, 1_000_000, seed=11)
            restore_metadata(small)
            log(f"{layout}: warm-up run on 1 M messages (not reported)")
            compact_once(small, spark_conf, jvm_pid)[1].close()
            restore_metadata(small)
            full_runs = 1
            res["warmed_up_on_messages"] = 1_000_000
        for rep in range(full_runs):
            restore_metadata(d)
            log(f"{layout}: full compaction run {rep + 1}/{full_runs}")
            run, storage = compact_once(d, spark_conf, jvm_pid)
            storage.close()
            run["messages_per_second"] = round(args.messages / run["seconds"])
            log(
                f"{layout}: {run['seconds']}s = {run['messages_per_second']:,} msg/s, kept {run['messages_kept']}, "
                f"cpu {run['cpu_seconds']}, steps {run['step_seconds']}, load {os.getloadavg()[0]:.1f}"
            )
            runs.append(run)
        if not args.large:
            res["full_cold"] = runs[0]
        warm = runs if args.large else (runs[1:] or runs)
        res["full_runs"] = warm
        res["full_median_seconds"] = statistics.median(r["seconds"] for r in warm)
        res["full_median_messages_per_second"] = round(args.messages / res["full_median_seconds"])
        cpu_total = statistics.median(sum(r["cpu_seconds"].values()) for r in warm)
        res["full_median_cpu_seconds"] = round(cpu_total, 2)
        # what the run would take with both cores to itself: CPU seconds over the core count
        res["full_messages_per_cpu_second"] = round(args.messages / cpu_total)
        incs = []
        for rep in range(args.repeat if args.incremental == "yes" else 0):
            log(f"{layout}: incremental run {rep + 1}/{args.repeat} after 1 % new messages")
            inc = incremental(
                d, spark_conf, jvm_pid, args.messages // 100, args.keys, layout == "batched", 100 + rep
            )
            log(
                f"{layout}: incremental {inc['seconds']}s, cpu {inc['cpu_seconds']}, steps {inc['step_seconds']}"
            )
            incs.append(inc)
        res["incremental_runs"] = incs
        if incs:
            res["incremental_median_seconds"] = statistics.median(r["seconds"] for r in incs)
            res["incremental_over_full"] = round(
                res["incremental_median_seconds"] / res["full_median_seconds"], 3
            )
            res["incremental_median_new_messages_per_second"] = statistics.median(
                r["new_messages_per_second"] for r in incs
            )
        res["peak_memory_mb"] = {
            k: max(r["peak_memory"][k] for r in runs + incs) for k in runs[0]["peak_memory"]
        }
        restore_metadata(d)  # leave the cached data dir as built (appended increments stay; harmless)
        if args.baselines == "yes":
            res["read_input_once"] = read_once(os.path.join(d, "data"))
            log(f"{layout}: read input once {res['read_input_once']}")
            log(f"{layout}: plain Python two-pass dict dedup ...")
            res["python_dict_dedup"] = python_dict_dedup(
                os.path.join(d, "data"), os.path.join(d, "dedup.out")
            )
            log(f"{layout}: python dict {res['python_dict_dedup']}")
            res["ratios"] = {
                "python_dict_over_spark": round(
                    res["python_dict_dedup"]["seconds"] / res["full_median_seconds"], 2
                ),
                "spark_over_read_once": round(
                    res["full_median_seconds"] / max(1e-9, res["read_input_once"]["seconds"]), 1
                ),
            }
        report["layouts"][layout] = res
    if args.history_sizes:
        sizes = [int(x) for x in args.history_sizes.split(",") if x]
        report["history"] = history(args.work_dir, sizes, args.keys, spark_conf, jvm_pid)
        plot_history(report["history"], args.plot)
    report["machine"]["load_average_at_end"] = os.getloadavg()
    report["driver_max_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    log(f"wrote {args.out}")
    print(
        json.dumps(
            {
                k: {
                    kk: v.get(kk)
                    for kk in (
                        "full_median_messages_per_second",
                        "incremental_median_seconds",
                        "incremental_over_full",
                    )
                }
                for k, v in report["layouts"].items()
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
