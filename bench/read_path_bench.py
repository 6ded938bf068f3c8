"""The read (dispatch) path alone: compactmq against an older checkout, in one run.

Each round, for each broker (``after`` = this checkout, ``before`` = ``--before-src``, run
alternately so the load of a shared machine hits both alike): publish ``--messages`` messages
of ``--size`` bytes to a fresh topic (batching off, then batched, in two topics), then time an
Exclusive consumer (the official client, ``broker_bench.consume``) reading each topic from the
earliest position and acknowledging every message. Per read: messages/s, broker CPU
microseconds per message (``/proc/<pid>/stat``) and client CPU microseconds per message (this
process, which runs the client's threads): a broker that uses far less CPU than the wall time
while the client is busy is waiting on the protocol, not working.

Ratios within one run are what to compare on a loaded machine; absolute figures are not.

    .venv/bin/python bench/read_path_bench.py --before-src /tmp/before/src [--messages 200000]
Writes bench/results/read_path.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from broker_bench import consume, publish  # noqa: E402
from standalone import ROOT, StandaloneBroker  # noqa: E402


def read_once(broker: StandaloneBroker, label: str, n: int, size: int, batching: bool, rnd: int) -> dict:
    import pulsar

    client = pulsar.Client(
        broker.url, operation_timeout_seconds=60, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    )
    try:
        topic = f"persistent://public/default/read-{label}-{'b' if batching else 'nb'}-{rnd}"
        producer, run, failures = publish(client, topic, n, size, batching)
        run()
        producer.close()
        if failures:
            raise RuntimeError(f"{len(failures)} publish failures")
        cpu0, own0, t0 = broker.cpu(), time.process_time(), time.perf_counter()
        consume(client, topic, n)()
        wall = time.perf_counter() - t0
        cpu, own = broker.cpu() - cpu0, time.process_time() - own0
    finally:
        client.close()
    return {
        "msg_per_s": n / wall,
        "broker_cpu_us_per_msg": cpu / n * 1e6,
        "client_cpu_us_per_msg": own / n * 1e6,
        "broker_busy_fraction": cpu / wall,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before-src", help="a checkout's src directory to compare against (label 'before')")
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "read_path.json"))
    args = ap.parse_args()

    results: dict[str, dict[str, list[dict]]] = {}
    with tempfile.TemporaryDirectory(prefix="read-path-") as tmp:
        brokers = {"after": StandaloneBroker(os.path.join(tmp, "after"))}
        if args.before_src:
            brokers["before"] = StandaloneBroker(os.path.join(tmp, "before"), src=args.before_src)
        try:
            for rnd in range(args.rounds):
                for batching in (False, True):
                    phase = "read_batch" if batching else "read_nobatch"
                    for label, broker in brokers.items():
                        r = read_once(broker, label, args.messages, args.size, batching, rnd)
                        results.setdefault(label, {}).setdefault(phase, []).append(r)
                        print(label, phase, rnd, {k: round(v, 2) for k, v in r.items()}, flush=True)
        finally:
            for broker in brokers.values():
                broker.stop()
    summary: dict = {}
    for label, phases in results.items():
        for phase, runs in phases.items():
            summary.setdefault(label, {})[phase] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    if "before" in summary:
        summary["ratio_after_over_before"] = {
            phase: {
                k: summary["after"][phase][k] / summary["before"][phase][k] for k in summary["after"][phase]
            }
            for phase in summary["after"]
        }
    out = {
        "messages": args.messages,
        "size": args.size,
        "rounds": args.rounds,
        "load": os.getloadavg(),
        "runs": results,
        "median": summary,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
