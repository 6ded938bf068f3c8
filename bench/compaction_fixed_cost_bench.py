"""The fixed cost of one compaction run: ``PUT .../compaction`` -> SUCCESS for a small topic.

One warm broker (``compactmq standalone`` as a subprocess, ``compactionSparkWarmup=true``,
triggered only once ``/metrics`` says the warm-up ended, then one discarded run so the Python
workers are up). Each round publishes --messages 100-byte messages over --keys keys to a FRESH
topic with the official client (batched), then triggers compaction over REST and polls
``GET .../compaction`` every --poll-ms: the figure is the time from the PUT to the first answer
that says SUCCESS (so it includes up to one poll interval; 5 ms by default).

Beside the wall time each round records where the run's time went, as the broker reports it:
``lastCompactionRun`` of the topic stats (the monitor's queue wait and bookkeeping around the
run's steps, the Spark step split into driver, jobs and the rest, the number of Spark jobs). On a
loaded machine compare the phases by their share of the run, not by their seconds.

The JSON (bench/results/compaction_fixed_cost.json or --out) has every round, the median, the
median share of each phase, and the load average before and after (the machine is shared).

    .venv/bin/python bench/compaction_fixed_cost_bench.py [--rounds 15] [--messages 10000] [--keys 1000]
    .venv/bin/python bench/compaction_fixed_cost_bench.py --quick     # 5 rounds
    .venv/bin/python bench/compaction_fixed_cost_bench.py --compare   # Spark job vs in-process, one run
    .venv/bin/python bench/compaction_fixed_cost_bench.py --compare-fused  # three-stage job vs one task
    .venv/bin/python bench/compaction_fixed_cost_bench.py --compare-src /tmp/main/src  # before/after

``--in-process-max-bytes N`` sets the broker's ``compactionInProcessMaxBytes`` (small keep-latest
runs without a Spark job, ``compaction/jobs/inprocess.py``); ``--compare`` runs a broker with
every run a Spark job and then one with small runs in-process, in the same run of the bench.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))

WARM_RE = re.compile(r'^compactmq_compaction_engine_warm\{[^}]*state="(\w+)"\} \d+$', re.M)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def http(method: str, url: str) -> tuple[int, bytes]:
    req = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def produce(client, topic: str, n: int, keys: int) -> float:
    """``n`` 100-byte messages over ``keys`` keys, batched; answers the seconds from the first
    send to the last receipt (the producer's creation and close not counted)."""
    producer = client.create_producer(
        topic, batching_enabled=True, batching_max_messages=1000, block_if_queue_full=True
    )
    payload = b"x" * 100
    t0 = time.perf_counter()
    for i in range(n):
        producer.send_async(payload, None, partition_key=f"key-{i % keys:07d}")
    producer.flush()
    secs = time.perf_counter() - t0
    producer.close()
    return secs


def trigger_to_success(admin_url: str, rest: str, poll: float, timeout: float = 300) -> tuple[float, dict]:
    t0 = time.perf_counter()
    status, body = http("PUT", admin_url + rest + "/compaction")
    if status >= 300:
        raise RuntimeError(f"trigger refused: {status} {body!r}")
    while True:
        _, body = http("GET", admin_url + rest + "/compaction")
        st = json.loads(body)
        if st.get("status") in ("SUCCESS", "ERROR"):
            secs = time.perf_counter() - t0
            if st["status"] != "SUCCESS":
                raise RuntimeError(f"compaction failed: {st}")
            return secs, st
        if time.perf_counter() - t0 > timeout:
            raise RuntimeError("compaction did not end")
        time.sleep(poll)


def warm_state(admin_url: str) -> str:
    """The compaction engine's warm-up state as the broker's ``/metrics`` say it."""
    _, body = http("GET", admin_url + "/metrics")
    m = WARM_RE.search(body.decode())
    return m.group(1) if m else "unknown"


def wait_warm(admin_url: str, limit: float = 600) -> str:
    t0 = time.perf_counter()
    state = "unknown"
    while time.perf_counter() - t0 < limit:
        state = warm_state(admin_url)
        if state not in ("warming", "cold", "unknown"):
            return state
        time.sleep(0.5)
    return state


def one_round(broker, client, i: int, args) -> dict:
    name = f"fixed-cost-{i}"
    topic = f"persistent://public/default/{name}"
    rest = f"/admin/v2/persistent/public/default/{name}"
    produce(client, topic, args.messages, args.keys)
    load0 = os.getloadavg()[0]
    secs, _ = trigger_to_success(broker.admin_url, rest, args.poll_ms / 1000)
    _, body = http("GET", broker.admin_url + rest + "/stats")
    compaction = json.loads(body).get("compaction", {})
    last = compaction.get("lastCompactionRun") or {}
    phases = dict(last.get("phasesMs") or {})
    spark = dict(last.get("sparkMs") or {})
    if spark and "spark" in phases:  # the spark step, split as the engine saw it
        phases.pop("spark")
        phases.update({f"spark.{k}": v for k, v in spark.items() if k != "count"})
    return {
        "topic": topic,
        "put_to_success_seconds": round(secs, 4),
        "run_duration_ms": compaction.get("lastCompactionDurationTimeInMills"),
        "phases_ms": phases,
        "spark_jobs": spark.get("count"),
        "job": compaction.get("lastCompactionJob"),
        "load_average_1m": [load0, os.getloadavg()[0]],
    }


def shares(rounds: list[dict]) -> dict:
    """Median share (of the PUT -> SUCCESS time) of each phase the broker reported."""
    names = sorted({k for r in rounds for k in r["phases_ms"]})
    out = {}
    for k in names:
        xs = [r["phases_ms"].get(k, 0) / 1000 / r["put_to_success_seconds"] for r in rounds]
        out[k] = round(statistics.median(xs), 3)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--messages", type=int, default=10_000)
    ap.add_argument("--keys", type=int, default=1_000)
    ap.add_argument("--poll-ms", type=float, default=5.0)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--label", default="", help="a name for this build in the JSON (before/after)")
    ap.add_argument(
        "--in-process-max-bytes",
        type=int,
        default=0,
        help="compactionInProcessMaxBytes of the broker (0: every run a Spark job; 8388608: small "
        "runs without one)",
    )
    ap.add_argument(
        "--compare",
        action="store_true",
        help="two brokers one after the other in the same run: every run a Spark job, then small "
        "runs in-process (--in-process-max-bytes, default 8388608); both in the JSON",
    )
    ap.add_argument(
        "--compare-src",
        default="",
        help="a before/after run: a broker from this other checkout's src directory (e.g. main's, "
        "made with `git archive main src`), then one from this tree, every run a Spark job",
    )
    ap.add_argument(
        "--compare-fused",
        action="store_true",
        help="two brokers of this tree: compactionSparkFusedMaxBytes=0 (every run the three-stage "
        "job), then the default (a small run one Spark task)",
    )
    ap.add_argument("--quick", action="store_true", help="5 rounds")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "compaction_fixed_cost.json"))
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds = 5
    result: dict = {
        "benchmark": "compaction_fixed_cost",
        "label": args.label,
        "machine": {"cpus": os.cpu_count(), "load_average_at_start": list(os.getloadavg())},
        "params": {
            "messages": args.messages,
            "keys": args.keys,
            "payload_bytes": 100,
            "rounds": args.rounds,
            "poll_ms": args.poll_ms,
            "spark_master": args.master,
            "target_median_seconds": 0.25,
        },
    }
    if args.compare_src:
        before = run_config(args, 0, src=os.path.abspath(args.compare_src))
        result["configs"] = [{"label": "before", "src": args.compare_src, **before}]
        result["configs"].append({"label": "after", "src": "src", **run_config(args, 0)})
    elif args.compare_fused:
        off = run_config(args, 0, ["compactionSparkFusedMaxBytes=0"])
        result["configs"] = [{"label": "three-stage job", **off}]
        result["configs"].append({"label": "one task (default)", **run_config(args, 0)})
    elif args.compare:
        small = args.in_process_max_bytes or 8 * 1024 * 1024
        result["configs"] = [run_config(args, 0), run_config(args, small)]
    else:
        result.update(run_config(args, args.in_process_max_bytes))
    result["machine"]["load_average_at_end"] = list(os.getloadavg())
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    print(json.dumps(summary(result), indent=2))
    return 0


def summary(result: dict) -> dict:
    """The JSON without its rounds."""
    skip = ("rounds", "discarded_first_round")
    out = {k: v for k, v in result.items() if k not in skip and k != "configs"}
    if "configs" in result:
        out["configs"] = [{k: v for k, v in c.items() if k not in skip} for c in result["configs"]]
    return out


def run_config(args, in_process_max_bytes: int, extra: tuple = (), src: str | None = None) -> dict:
    """One warm broker with ``compactionInProcessMaxBytes=in_process_max_bytes`` and the ``extra``
    overrides, from this tree or ``src`` (another checkout's src directory): its rounds, median,
    minimum and median phase shares."""
    import pulsar

    from standalone import StandaloneBroker

    d = tempfile.mkdtemp(prefix="fixed-cost-")
    result: dict = {"compactionInProcessMaxBytes": in_process_max_bytes, "rounds": []}
    overrides = [
        "compactionSparkWarmup=true",
        f"spark.master={args.master}",
        "defaultRetentionTimeInMinutes=-1",
        "defaultRetentionSizeInMB=-1",
        f"compactionInProcessMaxBytes={in_process_max_bytes}",
        *extra,
    ]
    broker = StandaloneBroker(os.path.join(d, "data"), overrides, src=src)
    client = pulsar.Client(broker.url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    try:
        result["warmup_state"] = wait_warm(broker.admin_url)
        first = one_round(broker, client, 0, args)  # Python workers up, first job's JIT: not counted
        result["discarded_first_round"] = first
        log(f"first (discarded): {first['put_to_success_seconds']:.3f} s")
        for i in range(1, args.rounds + 1):
            row = one_round(broker, client, i, args)
            result["rounds"].append(row)
            log(f"round {i}: PUT -> SUCCESS {row['put_to_success_seconds']:.3f} s  {row['phases_ms']}")
    finally:
        client.close()
        broker.stop()
        shutil.rmtree(d, ignore_errors=True)
    xs = [r["put_to_success_seconds"] for r in result["rounds"]]
    result["median_seconds"] = round(statistics.median(xs), 4)
    result["min_seconds"] = round(min(xs), 4)
    result["median_phase_share"] = shares(result["rounds"])
    jobs = [r["spark_jobs"] for r in result["rounds"] if r["spark_jobs"] is not None]
    result["median_spark_jobs"] = statistics.median(jobs) if jobs else None
    log(f"compactionInProcessMaxBytes={in_process_max_bytes}: median {result['median_seconds']} s")
    return result


if __name__ == "__main__":
    sys.exit(main())
