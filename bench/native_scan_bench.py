"""Entry-scan micro-benchmark: the C accelerator against the numpy reference, no Spark.

Phase one of a compaction run parses every stored entry of the history: the outer
``MessageMetadata``, every sub-message of a batch, the two key hashes, and the map-side
keep-latest combiner. This times exactly that (``message_rows.entry_rows`` then ``combine_latest``)
on in-memory entries built as ``compaction_bench.py`` builds them (100-byte payloads, 1 %
tombstones), once with the accelerator and once with ``COMPACTMQ_NATIVE=0`` (numpy only), in
both layouts, and reports messages per second of wall and of CPU time (best of --repeat, single thread).

It also records which accelerator was loaded (``native.describe()``, or "ctypes" for releases
that compiled it at run time), so results before and after a change of the accelerator compare.

    .venv/bin/python bench/native_scan_bench.py [--messages N] [--keys K] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))
sys.path.insert(0, os.path.join(ROOT, "bench"))


def _concat(entries: list[bytes]):
    """Entries (magic + crc + metadata + payload) back to back, with their offsets and lengths."""
    lens = np.fromiter((len(e) for e in entries), np.int64, len(entries))
    offs = np.zeros(len(entries), np.int64)
    np.cumsum(lens[:-1], out=offs[1:])
    return np.frombuffer(b"".join(entries), np.uint8), offs, lens


def _time(fn, repeat: int) -> tuple[float, float]:
    """Best wall and best CPU seconds of ``repeat`` calls (CPU time is what to compare on a
    loaded machine: it does not count the time other processes held the core)."""
    best, best_cpu = float("inf"), float("inf")
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        best = min(best, time.perf_counter() - t0)
        best_cpu = min(best_cpu, time.process_time() - c0)
    return best, best_cpu


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "native_scan.json"))
    args = ap.parse_args(argv)

    from compaction_bench import build_entries, make_messages

    from compactmq.compaction import message_rows as mr
    from compactmq.compaction import native

    describe = getattr(native, "describe", None)
    accel = describe() if describe else ("ctypes" if native.library() is not None else "none")
    key_ids, tomb = make_messages(args.messages, args.keys, 0.01, 7)
    result = {
        "benchmark": "native_scan",
        "accelerator": accel,
        "machine": {"cpus": os.cpu_count(), "load_average_at_start": list(os.getloadavg())},
        "params": {"messages": args.messages, "keys": args.keys, "repeat": args.repeat},
        "layouts": {},
    }
    for layout in ("nonbatched", "batched"):
        buf, offs, lens = _concat(build_entries(key_ids, tomb, layout == "batched", 1))
        ids = np.arange(len(offs), dtype=np.int64)
        row = {}
        for path in ("native", "numpy"):
            if path == "numpy":
                os.environ["COMPACTMQ_NATIVE"] = "0"
            else:
                os.environ.pop("COMPACTMQ_NATIVE", None)
                if native.library() is None:
                    row[path] = None
                    continue

            def run():
                mr.combine_latest(mr.entry_rows(buf, ids, offs, lens, 0))

            s, cpu = _time(run, args.repeat)
            row[path] = {
                "seconds": round(s, 4),
                "cpu_seconds": round(cpu, 4),
                "msg_per_s": round(args.messages / s),
                "msg_per_cpu_s": round(args.messages / cpu),
            }
            print(
                f"{layout:10s} {path:6s} {s:.3f} s wall, {cpu:.3f} s cpu, {args.messages / cpu / 1e6:.2f} M msg/cpu-s",
                file=sys.stderr,
            )
        os.environ.pop("COMPACTMQ_NATIVE", None)
        result["layouts"][layout] = row
    result["machine"]["load_average_at_end"] = list(os.getloadavg())
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
