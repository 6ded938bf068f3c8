"""Publish latency at a fixed rate: this checkout against another (before/after) in one run.

The latency phase of ``vs_pulsar_lite`` (one producer with batching off, one consumer, a
fixed ``--rate``, publish = send to receipt, publish-to-consume = send to receive), without
the throughput rounds, and cut into ``--slices`` slices per broker that alternate between
the brokers: on a shared, loaded machine a burst of someone else's load then hits both
sides alike, and the ratio of the two is what to read. The samples of a broker's slices are
merged before the percentiles are taken. Brokers run with their defaults
(``managedLedgerSyncData=true``: a receipt waits for its fsync).

    .venv/bin/python bench/publish_latency_bench.py --before-src /tmp/before/src --seconds 60
    .venv/bin/python bench/publish_latency_bench.py --pulsar-lite /path/to/pulsar-lite

On a machine others load heavily, the brokers fall behind a fixed rate and every figure is
the backlog; ``chrt -r 1`` (the real-time round-robin class, which the kernel caps at 95 % of
the CPU) in front of the command keeps the run ahead of that load -- both sides alike.

``--before-src``: a second compactmq from another checkout's ``src`` (label ``before``);
``--pulsar-lite``: the pulsar-lite binary too (label ``pulsar-lite``). The fdatasync floor of
the file system (one small append + fdatasync) is taken before each slice. Writes
bench/results/publish_latency.json (or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from standalone import ROOT, StandaloneBroker  # noqa: E402
from vs_pulsar_lite import PulsarLite, _pct, fdatasync_floor, run_latency, say  # noqa: E402


def _summary(samples: dict, floors: list[float], cpu: list[float]) -> dict:
    out = {
        kind: {q: _pct(samples.get(kind, []), f) for q, f in (("p50", 0.5), ("p99", 0.99), ("p999", 0.999))}
        for kind in ("publish_ms", "publish_to_consume_ms")
    }
    out["samples"] = len(samples.get("publish_ms", []))
    out["fdatasync_floor_p50_ms"] = _pct(floors, 0.5)
    out["broker_cpu_us_per_msg_median"] = _pct(cpu, 0.5)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60, help="seconds per broker in all (default 60)")
    ap.add_argument("--slices", type=int, default=4, help="alternating slices per broker (default 4)")
    ap.add_argument("--rate", type=int, default=5000, help="messages/s (default 5,000)")
    ap.add_argument("--size", type=int, default=100, help="payload bytes (default 100)")
    ap.add_argument("--before-src", help="also run compactmq from this checkout's src (label 'before')")
    ap.add_argument("--pulsar-lite", help="also run this pulsar-lite binary (label 'pulsar-lite')")
    ap.add_argument("--override", action="append", default=[], help="config override for this checkout")
    ap.add_argument("--out", help="JSON path (default bench/results/publish_latency.json)")
    args = ap.parse_args(argv)
    out_path = Path(args.out) if args.out else ROOT / "bench" / "results" / "publish_latency.json"
    per_slice = args.seconds / args.slices
    load_before = os.getloadavg()
    brokers: dict[str, object] = {}
    samples: dict[str, dict] = {}
    floors: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="compactmq-latency-") as tmp:
        try:
            brokers["compactmq"] = StandaloneBroker(os.path.join(tmp, "compactmq"), args.override)
            if args.before_src:
                brokers["before"] = StandaloneBroker(os.path.join(tmp, "before"), src=args.before_src)
            if args.pulsar_lite:
                brokers["pulsar-lite"] = PulsarLite(args.pulsar_lite, os.path.join(tmp, "pulsar-lite"))
            for i in range(args.slices):
                for label, broker in brokers.items():
                    floor = fdatasync_floor(tmp, n=200)["p50"]
                    floors.setdefault(label, []).append(floor)
                    say(f"slice {i + 1}/{args.slices}: {label} ({per_slice:g} s; fdatasync p50 {floor} ms)")
                    got = run_latency(
                        label, broker, args.rate, per_slice, args.size, samples.setdefault(label, {})
                    )
                    cpu.setdefault(label, []).append(got["broker_cpu_us_per_msg"])
        finally:
            for broker in brokers.values():
                broker.stop()  # type: ignore[attr-defined]
    result: dict = {
        "benchmark": "publish_latency",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "rate": args.rate,
        "message_bytes": args.size,
        "seconds_per_broker": args.seconds,
        "slices": args.slices,
        "loadavg_1m": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "brokers": {label: _summary(samples[label], floors[label], cpu[label]) for label in samples},
    }
    if "before" in result["brokers"]:
        after, before = result["brokers"]["compactmq"], result["brokers"]["before"]
        result["after_over_before"] = {
            kind: {q: round(after[kind][q] / before[kind][q], 3) for q in ("p50", "p99")}
            for kind in ("publish_ms", "publish_to_consume_ms")
        }
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=2) + "\n")
    for label, s in result["brokers"].items():
        say(f"{label:12s} publish {s['publish_ms']}, end to end {s['publish_to_consume_ms']}")
    if "after_over_before" in result:
        say(f"after/before: {result['after_over_before']}")
    say(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
