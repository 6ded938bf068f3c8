"""Storage benchmark: managed-ledger appends and reads against plain file I/O, same run.

Each scenario writes (or reads) the same bytes twice, once through compactmq's storage and
once with plain ``os.write``/``os.pread`` on a file in the same directory with the same sync
policy, and reports both throughputs and their ratio (storage / plain; 1.0 = as fast as the
bare file, above 1 = faster).

Fairness on a shared machine: the sync scenarios are bound by fdatasync latency, which on a
busy VM changes several-fold from one second to the next. So each trial cuts its entries into
``BLOCKS`` blocks and runs storage and plain block by block, alternating which goes first;
both sides see the same disk weather. Every scenario runs ``--trials`` times; quote medians.

Scenarios
  append_fsync_each   one appender; every append durable before the next (fdatasync each)
                      plain: write + fdatasync per entry
  append_group_commit --threads appenders at once, each append durable before it returns
                      plain: the same threads, each doing write (serialised) + fdatasync
  append_many         batches of --batch entries, one sync per batch
                      plain: one write of the batch's bytes + fdatasync
  append_no_sync      managedLedgerSyncData=false (page cache only)
                      plain: write per entry, no sync
  sequential_read     read every entry in order (read_entries of 1000, CRC checked)
                      plain: pread of the same bytes in chunks of the same size (warm cache);
                      also plain+split: a length-prefixed file read in chunks and cut into
                      one bytes object per entry, the floor for any per-entry Python reader

Usage: python bench/storage_bench.py [--quick] [--trials N] [--out bench/results/storage.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from compactmq.config import load_config  # noqa: E402
from compactmq.storage import Position, Storage  # noqa: E402
from compactmq.storage import ledger_file as lf  # noqa: E402

BLOCKS = 10


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def entries(n: int, size: int) -> list[bytes]:
    base = os.urandom(size + 64)
    return [base[i % 64 : i % 64 + size] for i in range(n)]


def _run_threads(n_threads: int, work) -> float:
    barrier = threading.Barrier(n_threads + 1)

    def run(k):
        barrier.wait()
        work(k)

    ts = [threading.Thread(target=run, args=(k,)) for k in range(n_threads)]
    for th in ts:
        th.start()
    barrier.wait()
    t = time.perf_counter()
    for th in ts:
        th.join()
    return time.perf_counter() - t


# --- the two sides of a write scenario -------------------------------------------------------


class StorageSide:
    def __init__(self, workdir: Path, **overrides):
        self.dir = Path(tempfile.mkdtemp(dir=workdir))
        cfg = load_config(
            overrides={
                "managedLedgerMaxEntriesPerLedger": 50_000,
                "managedLedgerMinLedgerRolloverTimeMinutes": 0,  # the rollover cost is measured
                **overrides,
            }
        )
        self.st = Storage(self.dir, cfg)
        self.ml = self.st.open_managed_ledger("bench")

    def each(self, block):
        append = self.ml.append
        t = time.perf_counter()
        for e in block:
            append(e)
        return time.perf_counter() - t

    def group(self, block, threads):
        chunks = [block[k::threads] for k in range(threads)]
        return _run_threads(threads, lambda k: [self.ml.append(e) for e in chunks[k]])

    def many(self, block, batch):
        t = time.perf_counter()
        for i in range(0, len(block), batch):
            self.ml.append_many(block[i : i + batch])
        return time.perf_counter() - t

    def close(self) -> int:
        n = self.ml.entry_count()
        self.st.close()
        shutil.rmtree(self.dir)
        return n


class PlainSide:
    def __init__(self, workdir: Path, sync: bool = True):
        self.dir = Path(tempfile.mkdtemp(dir=workdir))
        self.fd = os.open(self.dir / "plain.dat", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self.sync = sync
        self.lock = threading.Lock()

    def each(self, block):
        fd, sync = self.fd, self.sync
        t = time.perf_counter()
        for e in block:
            os.write(fd, e)
            if sync:
                os.fdatasync(fd)
        return time.perf_counter() - t

    def group(self, block, threads):
        chunks = [block[k::threads] for k in range(threads)]

        def work(k):
            for e in chunks[k]:
                with self.lock:  # one writer at a time, as a log file needs
                    os.write(self.fd, e)
                os.fdatasync(self.fd)

        return _run_threads(threads, work)

    def many(self, block, batch):
        t = time.perf_counter()
        for i in range(0, len(block), batch):
            os.write(self.fd, b"".join(block[i : i + batch]))
            os.fdatasync(self.fd)
        return time.perf_counter() - t

    def close(self) -> None:
        os.close(self.fd)
        shutil.rmtree(self.dir)


def write_trial(workdir, data, storage_overrides, plain_sync, op, trial) -> tuple[float, float]:
    """(storage seconds, plain seconds) for ``data``, run block by block, alternating."""
    ours, plain = StorageSide(workdir, **storage_overrides), PlainSide(workdir, plain_sync)
    t_ours = t_plain = 0.0
    step = -(-len(data) // BLOCKS)
    for b in range(BLOCKS):
        block = data[b * step : (b + 1) * step]
        if (b + trial) % 2:
            t_plain += op(plain, block)
            t_ours += op(ours, block)
        else:
            t_ours += op(ours, block)
            t_plain += op(plain, block)
    assert ours.close() == len(data)
    plain.close()
    return t_ours, t_plain


# --- reads ----------------------------------------------------------------------------------


def prepare_read(workdir, data):
    d = Path(tempfile.mkdtemp(dir=workdir))
    st = Storage(
        d,
        load_config(
            overrides={
                "managedLedgerSyncData": False,
                "managedLedgerMaxEntriesPerLedger": 50_000,
                "managedLedgerMinLedgerRolloverTimeMinutes": 0,
            }
        ),
    )
    ml = st.open_managed_ledger("bench")
    for i in range(0, len(data), 1000):
        ml.append_many(data[i : i + 1000])
    paths = [ml.ledger_path(i.ledger_id) for i in ml.ledgers() if i.entry_count]
    return d, st, ml, paths


def ml_read(ml, n_expected):
    t = time.perf_counter()
    pos, n = Position(0, 0), 0
    while True:
        batch = ml.read_entries(pos, 1000)
        if not batch:
            break
        n += len(batch)
        pos = ml.next_position(batch[-1][0])
    dt = time.perf_counter() - t
    assert n == n_expected
    return dt


def plain_read(paths, chunk):
    t = time.perf_counter()
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        off = 0
        while True:
            b = os.pread(fd, chunk, off)
            if not b:
                break
            off += len(b)
        os.close(fd)
    return time.perf_counter() - t


def prepare_plain_split(workdir, data):
    """The same entries in the simplest log a Python program could keep: u32 length + bytes."""
    path = Path(tempfile.mkdtemp(dir=workdir)) / "plain.log"
    with open(path, "wb") as f:
        for e in data:
            f.write(len(e).to_bytes(4, "big") + e)
    return path


def plain_read_split(path, chunk, n_expected):
    """Plain reads plus the least a reader must do per entry: find it and copy it out."""
    t = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    off, n, rest = 0, 0, b""
    while True:
        b = os.pread(fd, chunk, off)
        if not b:
            break
        off += len(b)
        buf = rest + b
        i = 0
        out = []
        while i + 4 <= len(buf):
            ln = int.from_bytes(buf[i : i + 4], "big")
            if i + 4 + ln > len(buf):
                break
            out.append(buf[i + 4 : i + 4 + ln])
            i += 4 + ln
        n += len(out)
        rest = buf[i:]
    os.close(fd)
    dt = time.perf_counter() - t
    assert n == n_expected
    return dt


# --- driver ---------------------------------------------------------------------------------


def summarize(n: int, size: int, rows: list[dict]) -> dict:
    ours = statistics.median(r["storage_s"] for r in rows)
    plain = statistics.median(r["plain_s"] for r in rows)
    ratios = [r["plain_s"] / r["storage_s"] for r in rows]
    return {
        "entries": n,
        "entry_bytes": size,
        "storage_entries_per_s": n / ours,
        "plain_entries_per_s": n / plain,
        "storage_MB_per_s": n * size / ours / 1e6,
        "plain_MB_per_s": n * size / plain / 1e6,
        "ratio_median": statistics.median(ratios),
        "ratios": ratios,
        "trials": rows,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes, 3 trials (about 20 s)")
    ap.add_argument("--trials", type=int, default=None)
    ap.add_argument("--entry-size", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "storage.json"))
    args = ap.parse_args()

    trials = args.trials or (3 if args.quick else 5)
    size = args.entry_size
    q = args.quick
    threads, batch = args.threads, args.batch
    scenarios = {
        # name: (entries, storage config, plain syncs?, operation on a side)
        "append_fsync_each": (2_000 if q else 10_000, {}, True, lambda side, b: side.each(b)),
        "append_group_commit": (4_000 if q else 20_000, {}, True, lambda side, b: side.group(b, threads)),
        "append_many": (20_000 if q else 200_000, {}, True, lambda side, b: side.many(b, batch)),
        "append_no_sync": (
            20_000 if q else 100_000,
            {"managedLedgerSyncData": False},
            False,
            lambda side, b: side.each(b),
        ),
    }
    n_read = 50_000 if q else 500_000
    workdir = Path(tempfile.mkdtemp(prefix="compactmq-bench-", dir=args.dir))
    results: dict = {}
    load_before = os.getloadavg()
    total_steps = trials * (len(scenarios) + 1)
    step = 0
    try:
        for name, (n, overrides, plain_sync, op) in scenarios.items():
            data = entries(n, size)
            rows = []
            for trial in range(trials):
                step += 1
                t_ours, t_plain = write_trial(workdir, data, overrides, plain_sync, op, trial)
                rows.append({"storage_s": t_ours, "plain_s": t_plain})
                log(
                    f"[{step}/{total_steps}] {name} trial {trial + 1}: storage {n / t_ours:,.0f} entries/s, "
                    f"plain {n / t_plain:,.0f} entries/s, ratio {t_plain / t_ours:.2f}"
                )
            results[name] = summarize(n, size, rows)

        data = entries(n_read, size)
        d, st, ml, paths = prepare_read(workdir, data)
        chunk = 1000 * (size + lf.RECORD_HEADER_SIZE)
        split_path = prepare_plain_split(workdir, data)
        plain_read(paths, chunk)  # warm the page cache for all three
        plain_read([split_path], chunk)
        rows = []
        for trial in range(trials):
            step += 1
            if trial % 2:
                t_split = plain_read_split(split_path, chunk, n_read)
                t_plain = plain_read(paths, chunk)
                t_ours = ml_read(ml, n_read)
            else:
                t_ours = ml_read(ml, n_read)
                t_plain = plain_read(paths, chunk)
                t_split = plain_read_split(split_path, chunk, n_read)
            rows.append({"storage_s": t_ours, "plain_s": t_plain, "plain_split_s": t_split})
            log(
                f"[{step}/{total_steps}] sequential_read trial {trial + 1}: storage {n_read / t_ours:,.0f} "
                f"entries/s, plain {n_read / t_plain:,.0f} entries/s, ratio {t_plain / t_ours:.2f}; "
                f"plain+split {n_read / t_split:,.0f} entries/s, ratio {t_split / t_ours:.2f}"
            )
        r = results["sequential_read"] = summarize(n_read, size, rows)
        r["plain_split_entries_per_s"] = n_read / statistics.median(x["plain_split_s"] for x in rows)
        r["ratio_vs_plain_split_median"] = statistics.median(
            x["plain_split_s"] / x["storage_s"] for x in rows
        )
        r["note"] = (
            "plain = pread of the ledger files' bytes in 1000-entry chunks, nothing per entry; "
            "plain_split = the same entries in a u32-length-prefixed file, read in chunks and cut "
            "into one bytes object per entry (what any Python reader of entries must do); storage "
            "also checks every entry's CRC32C and returns (Position, bytes) pairs"
        )
        st.close()
        shutil.rmtree(d)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    out = {
        "benchmark": "storage",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
        },
        "params": {
            "quick": q,
            "trials": trials,
            "entry_size": size,
            "threads": threads,
            "batch": batch,
            "blocks_per_trial": BLOCKS,
        },
        "note": "ratio = storage throughput / plain file I/O throughput for the same bytes and sync policy, "
        "per trial, both sides interleaved block by block; ratio_median is the median over trials "
        "(>1 means storage was faster). The sync scenarios are bound by fdatasync latency, which "
        "on a shared VM varies several-fold; read the ratios, not the rates.",
        "results": results,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    log(f"\nwrote {args.out}")
    log(f"{'scenario':22} {'storage/s':>12} {'plain/s':>12} {'ratio':>7}   (medians, {size}-byte entries)")
    for name, r in results.items():
        log(
            f"{name:22} {r['storage_entries_per_s']:>12,.0f} {r['plain_entries_per_s']:>12,.0f} "
            f"{r['ratio_median']:>7.2f}"
        )
    r = results["sequential_read"]
    log(
        f"{'  vs plain+split':22} {r['storage_entries_per_s']:>12,.0f} {r['plain_split_entries_per_s']:>12,.0f} "
        f"{r['ratio_vs_plain_split_median']:>7.2f}"
    )


if __name__ == "__main__":
    main()
