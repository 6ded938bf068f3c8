"""What issue 12's dispatch changes cost per entry, measured in the broker's own code paths.

- ``key_hash``: the Key_Shared slot of a key, Pulsar's Murmur3 (``mmh3``) against the CRC32C slot
  it replaced, over 16-byte keys;
- ``pending_acks``: recording a sent entry and removing it on acknowledgement in the
  dispatcher's ``PendingAcks`` (which counts unacknowledged messages for the limits) against
  the plain dict it replaced;
- ``auto_split_select``: choosing a consumer for a key on the AUTO_SPLIT ring of 8 consumers.

Single-threaded, in-process, best of ``--repeat`` runs; nanoseconds per operation.

    .venv/bin/python bench/dispatch_overhead_bench.py [--n 200000] [--out bench/results/dispatch_overhead.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import crc32c  # noqa: E402

from compactmq.broker.limits import PendingAcks  # noqa: E402
from compactmq.broker.selectors import HASH_RANGE_SIZE, HashRingSelector, key_hash  # noqa: E402


def best_ns_per_op(fn, n: int, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter_ns()
        fn()
        best = min(best, (time.perf_counter_ns() - t0) / n)
    return round(best, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=200_000, help="operations per run")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "dispatch_overhead.json"))
    args = ap.parse_args()
    n = args.n
    keys = [f"key-{i:012d}".encode() for i in range(n)]
    consumer = SimpleNamespace(unacked_messages=0, blocked_on_unacked=False)
    positions = [(1, i) for i in range(n)]

    def murmur():
        for k in keys:
            key_hash(k)

    def crc():
        for k in keys:
            crc32c.crc32c(k) % HASH_RANGE_SIZE

    def pending_acks():
        p = PendingAcks(50_000, 200_000)
        for pos in positions:
            p.add(pos, consumer, 1)
            p.pop(pos, None)

    def plain_dict():
        p: dict = {}
        for pos in positions:
            p[pos] = consumer
            p.pop(pos, None)

    class Consumer:  # hashable by identity, like the broker's
        def __init__(self, name: str) -> None:
            self.name = name

    ring = HashRingSelector()
    for i in range(8):
        ring.add(Consumer(f"consumer-{i}"))

    def select():
        for k in keys:
            ring.select(k)

    results = {
        "key_hash_murmur3_ns": best_ns_per_op(murmur, n, args.repeat),
        "key_hash_crc32c_ns (before)": best_ns_per_op(crc, n, args.repeat),
        "pending_acks_add_remove_ns": best_ns_per_op(pending_acks, n, args.repeat),
        "plain_dict_add_remove_ns (before)": best_ns_per_op(plain_dict, n, args.repeat),
        "auto_split_select_ns": best_ns_per_op(select, n, args.repeat),
    }
    out = {
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "loadavg_1m": round(os.getloadavg()[0], 2),
        },
        "operations_per_run": n,
        "repeat": args.repeat,
        "results": results,
    }
    print(json.dumps(out, indent=2))
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
