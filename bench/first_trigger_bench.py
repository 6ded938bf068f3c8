"""First-trigger latency: how long the first compaction after ``compactmq standalone`` starts takes.

Each round starts a fresh broker (``compactmq standalone`` as a subprocess, a new data directory),
produces --messages 100-byte messages over --keys keys with the official client (batched), then
triggers compaction over REST (``PUT .../compaction``) and polls ``GET .../compaction`` every
50 ms: the figure is the time from the trigger to SUCCESS.

* cold: ``compactionSparkWarmup=false``, triggered as soon as the messages are in: the run starts
  Spark itself (what every first run cost before the warm-up existed);
* warm: ``compactionSparkWarmup=true``, triggered once the broker has been up --min-uptime
  seconds (default 60, "a broker that has been up for a minute") and ``/metrics`` says the
  warm-up ended; the wait is recorded too.

Rounds alternate cold and warm; the JSON (bench/results/first_trigger.json or --out) has every
round, the medians, and the load average before and after (the machine is shared).

    .venv/bin/python bench/first_trigger_bench.py [--rounds 3] [--messages 200000] [--keys 10000]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import compaction_fixed_cost_bench as fixed_cost  # noqa: E402
from compaction_fixed_cost_bench import log, warm_state  # noqa: E402

TOPIC = "persistent://public/default/first-trigger"
REST_TOPIC = "/admin/v2/persistent/public/default/first-trigger"


def produce(url: str, n: int, keys: int) -> float:
    import pulsar

    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    try:
        return fixed_cost.produce(client, TOPIC, n, keys)
    finally:
        client.close()


def trigger_to_success(admin_url: str) -> tuple[float, dict]:
    """The PUT of the compaction to SUCCESS, polled every 50 ms, for at most 15 minutes."""
    return fixed_cost.trigger_to_success(admin_url, REST_TOPIC, poll=0.05, timeout=900)


def one_round(mode: str, args) -> dict:
    from standalone import StandaloneBroker

    d = tempfile.mkdtemp(prefix=f"first-trigger-{mode}-")
    overrides = [
        f"compactionSparkWarmup={'true' if mode == 'warm' else 'false'}",
        f"spark.master={args.master}",
        # the topic has no subscription: keep its ledgers, so every round compacts all messages
        "defaultRetentionTimeInMinutes=-1",
        "defaultRetentionSizeInMB=-1",
    ]
    load0 = os.getloadavg()
    t_start = time.perf_counter()
    broker = StandaloneBroker(os.path.join(d, "data"), overrides)
    try:
        ready = time.perf_counter() - t_start
        produce_s = produce(broker.url, args.messages, args.keys)
        waited = 0.0
        if mode == "warm":
            t_w = time.perf_counter()
            while (
                time.perf_counter() - t_start < args.min_uptime or warm_state(broker.admin_url) == "warming"
            ) and time.perf_counter() - t_w < 900:
                time.sleep(0.5)
            waited = time.perf_counter() - t_w
        state = warm_state(broker.admin_url)
        uptime = time.perf_counter() - t_start
        secs, st = trigger_to_success(broker.admin_url)
        row = {
            "mode": mode,
            "trigger_to_success_seconds": round(secs, 3),
            "broker_ready_seconds": round(ready, 3),
            "produce_seconds": round(produce_s, 3),
            "waited_for_warmup_seconds": round(waited, 3),
            "uptime_at_trigger_seconds": round(uptime, 1),
            "warmup_state_at_trigger": state,
            "status": {k: v for k, v in st.items() if k != "lastError"},
            "load_average_before": list(load0),
            "load_average_after": list(os.getloadavg()),
        }
        log(f"{mode}: trigger -> SUCCESS {secs:.2f} s (warm-up {state}, up {uptime:.0f} s)")
        return row
    finally:
        broker.stop()
        shutil.rmtree(d, ignore_errors=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--min-uptime", type=float, default=60.0)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--quick", action="store_true", help="one round of each, 20 k messages, 10 s uptime")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "first_trigger.json"))
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds, args.messages, args.min_uptime = 1, 20_000, 10.0
    result: dict = {
        "benchmark": "first_trigger",
        "machine": {"cpus": os.cpu_count(), "load_average_at_start": list(os.getloadavg())},
        "params": {
            "messages": args.messages,
            "keys": args.keys,
            "payload_bytes": 100,
            "rounds": args.rounds,
            "min_uptime_seconds": args.min_uptime,
            "spark_master": args.master,
            "target_seconds": 3.0,
        },
        "rounds": [],
    }
    for _ in range(args.rounds):
        for mode in ("cold", "warm"):
            result["rounds"].append(one_round(mode, args))
    for mode in ("cold", "warm"):
        xs = [r["trigger_to_success_seconds"] for r in result["rounds"] if r["mode"] == mode]
        result[f"{mode}_median_seconds"] = round(statistics.median(xs), 3)
    result["machine"]["load_average_at_end"] = list(os.getloadavg())
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    print(json.dumps({k: v for k, v in result.items() if k != "rounds"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
