"""What opening a large compacted view costs the process that opens it (the compaction driver
planning an incremental run, a broker serving the view, a Python worker copying from it).

It writes, once, a view of ``--entries`` entries (18.8 M by default: the survivors of the
30 M-message, 30 M-key benchmark) as a chain of ``--segments`` segments, as a full run writes
it, and a second view extending that chain by one incremental run: 1 % new entries in a new
segment and 1 % of the old entries dropped (each new message superseded an old one). Then, each
in a fresh process, it opens each view with ``CompactedLedgerReader`` and does what the driver
does with it when it plans a run (the entries per ledger from some start, a few finds and reads),
and reports wall and CPU seconds and the peak anonymous memory (RssAnon, sampled every 5 ms,
above what the process held before the open: memory-mapped files are not anonymous).

``--baseline-src DIR``: also run the same with the compactmq sources in DIR (e.g. an export of
an older commit), to compare. Results: bench/results/compaction_view_reader.json (or --out).

    .venv/bin/python bench/view_reader_bench.py [--entries N] [--baseline-src DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PER_LEDGER = 50_000
FIRST_LEDGER = 1000


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _write_segment(path: str, positions: np.ndarray) -> tuple:
    """A complete segment of 8-byte entries at ``positions`` (packed ``ledger << 32 | entry``)."""
    from compactmq.compaction.compacted_writer import PartWriter

    w = PartWriter(path, complete=True)
    lids = positions >> 32
    cuts = np.flatnonzero(np.diff(lids)) + 1
    for part in np.split(positions, cuts):
        if not len(part):
            continue
        buf = part.astype(">u8").view(np.uint8)
        n = len(part)
        w.append_ranges(
            int(part[0] >> 32),
            part & 0xFFFFFFFF,
            buf,
            np.arange(n, dtype=np.int64) * 8,
            np.full(n, 8, np.int64),
            buf,
            np.full(n, -1, np.int64),
        )
    count = w.close()
    return os.path.basename(path), count, os.path.getsize(path)


def build(work_dir: str, entries: int, segments: int) -> dict:
    """The two views (cached): ``{"fresh": manifest path, "extended": manifest path}``."""
    from compactmq.compaction import chain

    d = os.path.join(work_dir, f"view-{entries}-{segments}")
    views = {
        "fresh": os.path.join(d, "000000000001.compacted"),
        "extended": os.path.join(d, "000000000002.compacted"),
    }
    if os.path.exists(os.path.join(d, "READY")):
        return views
    os.makedirs(d, exist_ok=True)
    i = np.arange(entries, dtype=np.int64)
    positions = ((FIRST_LEDGER + i // PER_LEDGER) << 32) | (i % PER_LEDGER)
    segs = []
    for g, part in enumerate(np.array_split(positions, segments)):
        segs.append(_write_segment(os.path.join(d, chain.segment_name(1, g)), part))
        log(f"segment {g + 1}/{segments} written")
    fresh = chain.Manifest.fresh(segs)
    chain.write(views["fresh"], fresh)
    rng = np.random.default_rng(5)
    n_new = entries // 100
    top = FIRST_LEDGER + entries // PER_LEDGER + 1
    j = np.arange(n_new, dtype=np.int64)
    new = ((top + j // PER_LEDGER) << 32) | (j % PER_LEDGER)
    new_seg = _write_segment(os.path.join(d, chain.segment_name(2, 0)), new)
    dropped = np.sort(rng.choice(positions, n_new, replace=False))
    chain.write(views["extended"], fresh.extended([new_seg], dropped >> 32, dropped & 0xFFFFFFFF))
    open(os.path.join(d, "READY"), "w").close()
    return views


#: run in a fresh process: open the view, plan as the driver does, report time and memory
PROBE = r"""
import json, os, sys, threading, time
import numpy as np

def anon():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    return 0.0

from compactmq.compaction.compacted_ledger import CompactedLedgerReader
import pyarrow.fs, crc32c  # imported before the measure
path = sys.argv[1]
peak = [0.0]
stop = threading.Event()
def sample():
    while not stop.wait(0.005):
        peak[0] = max(peak[0], anon())
before = anon()
t = threading.Thread(target=sample, daemon=True)
t.start()
c0, t0 = time.process_time(), time.perf_counter()
r = CompactedLedgerReader(path)
t_open = time.perf_counter() - t0
last_ledger = int(r.position_at(len(r) - 1)[0])
start = r.find((1000 + (last_ledger - 1000) // 10, 0))  # retention removed the first tenth
if hasattr(r, "ledger_runs"):
    lids, counts = r.ledger_runs(start)
else:  # an older reader: what the driver did with it
    ids = r.ledger_ids[start:]
    starts = np.flatnonzero(np.concatenate(([True], ids[1:] != ids[:-1])))
    lids, counts = ids[starts], np.diff(np.append(starts, len(ids)))
rng = np.random.default_rng(1)
got = 0
for lid in rng.integers(1000, last_ledger + 1, 200).tolist():
    i = r.find((lid, 123))
    got += len(r.read((lid, 123), 16))
elapsed = time.perf_counter() - t0
cpu = time.process_time() - c0
stop.set()
t.join()
peak[0] = max(peak[0], anon())
print(json.dumps({
    "entries": len(r), "ledgers_from_start": len(lids), "entries_read": got,
    "open_seconds": round(t_open, 3), "open_and_plan_seconds": round(elapsed, 3),
    "cpu_seconds": round(cpu, 3), "peak_anon_mb_above_start": round(peak[0] - before, 1),
    "anon_mb_before_open": round(before, 1),
}))
"""


def probe(src: str, path: str) -> dict:
    env = dict(os.environ, PYTHONPATH=src)
    out = subprocess.run([sys.executable, "-c", PROBE, path], env=env, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--entries", type=int, default=18_800_000)
    ap.add_argument("--segments", type=int, default=8)
    ap.add_argument("--work-dir", default="/tmp/compactmq-view-bench")
    ap.add_argument("--baseline-src", default="", help="compactmq sources of an older tree, to compare")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "compaction_view_reader.json"))
    args = ap.parse_args(argv)
    src = os.path.join(ROOT, "src")
    sys.path.insert(0, src)
    views = build(args.work_dir, args.entries, args.segments)
    report: dict = {
        "benchmark": "compacted view reader",
        "params": {
            "entries": args.entries,
            "segments": args.segments,
            "new_and_dropped": args.entries // 100,
        },
        "machine": {"cpus": os.cpu_count(), "load_average_at_start": os.getloadavg()},
        "results": {},
    }
    trees = {"current": src}
    if args.baseline_src:
        trees["baseline"] = args.baseline_src
    for tree, path_src in trees.items():
        for name, path in views.items():
            res = probe(path_src, path)
            log(f"{tree} {name}: {res}")
            report["results"].setdefault(tree, {})[name] = res
    report["machine"]["load_average_at_end"] = os.getloadavg()
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
