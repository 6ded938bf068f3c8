"""Many small topics due at once: the compaction monitor's joint jobs against one run per topic.

For each topic count, one broker per mode in turn (``compactmq standalone`` subprocesses, warm
Spark): ``joint`` (the default: the topics due at a check share Spark jobs of up to
``compactionJointMaxTopics``), ``one-by-one`` (``compactionJointMaxTopics=1``: what the
monitor did before) and ``joint-in-process`` (joint, with ``compactionInProcessMaxBytes`` at
8 MiB: topics that small are compacted in the broker's process without a Spark job). Each publishes --messages 100-byte messages over --keys keys to every
topic with the official client, then sets a namespace compaction threshold over REST, so every
topic falls due at the same check, and polls each topic's ``GET .../compaction`` until all are
SUCCESS. The figure is the time from the policy's PUT to the last SUCCESS; the JSON also has
the Spark job groups the runs used (from the topic stats) and the load average (the machine is
shared: compare the modes, run on a quiet machine for absolute figures).

    .venv/bin/python bench/many_topics_bench.py [--topics 10 100 1000] [--messages 10000] [--keys 1000]
    .venv/bin/python bench/many_topics_bench.py --quick       # 10 topics x 2,000 messages
    .venv/bin/python bench/many_topics_bench.py --topics 10 100 --modes joint joint-in-process
    .venv/bin/python bench/plot.py many_topics                # total time against due topics
    .venv/bin/python bench/many_topics_bench.py --topics --lag-topics 100 --modes joint-in-process

``--lag-topics N``: N topics published to continuously (``--rate`` messages/s each) for
``--lag-seconds`` under a namespace ``compactionMaxLagSeconds`` of ``--max-lag``; the JSON's
``lag_runs`` hold the largest compaction lag /metrics showed after the first max-lag period.
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

NS = "public/default"

#: the broker overrides of each mode (besides the common ones), given the joint bound
MODES = {
    "joint": lambda max_topics: [f"compactionJointMaxTopics={max_topics}"],
    "one-by-one": lambda max_topics: ["compactionJointMaxTopics=1"],
    "joint-in-process": lambda max_topics: [
        f"compactionJointMaxTopics={max_topics}",
        f"compactionInProcessMaxBytes={8 * 1024 * 1024}",
    ],
}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def http(method: str, url: str, body=None) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"} if data is not None else {}
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def wait_warm(admin_url: str, limit: float = 600) -> None:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < limit:
        _, body = http("GET", admin_url + "/metrics")
        if 'state="warming"' not in body.decode() and 'state="cold"' not in body.decode():
            return
        time.sleep(0.5)


def produce(client, topics: list[str], n: int, keys: int) -> None:
    payload = b"x" * 100
    producers = [
        client.create_producer(t, batching_enabled=True, batching_max_messages=1000, block_if_queue_full=True)
        for t in topics
    ]
    for p in producers:
        for i in range(n):
            p.send_async(payload, None, partition_key=f"key-{i % keys:07d}")
    for p in producers:
        p.flush()
        p.close()


def one_mode(mode: str, count: int, args) -> dict:
    import pulsar

    from standalone import StandaloneBroker

    d = tempfile.mkdtemp(prefix=f"many-topics-{mode}-")
    overrides = [
        "compactionSparkWarmup=true",
        f"spark.master={args.master}",
        "defaultRetentionTimeInMinutes=-1",
        "defaultRetentionSizeInMB=-1",
        f"brokerServiceCompactionMonitorIntervalInSeconds={args.interval}",
        *MODES[mode](args.max_topics),
    ]
    broker = StandaloneBroker(os.path.join(d, "data"), overrides)
    client = pulsar.Client(broker.url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    names = [f"many-{i:05d}" for i in range(count)]
    try:
        wait_warm(broker.admin_url)
        t_p = time.perf_counter()
        produce(client, [f"persistent://{NS}/{n}" for n in names], args.messages, args.keys)
        produce_s = time.perf_counter() - t_p
        load0 = os.getloadavg()[0]
        t0 = time.perf_counter()
        status, body = http("POST", f"{broker.admin_url}/admin/v2/namespaces/{NS}/compactionThreshold", 1)
        if status >= 300:
            raise RuntimeError(f"policy refused: {status} {body!r}")
        waiting = set(names)
        while waiting:
            for n in sorted(waiting):
                _, body = http("GET", f"{broker.admin_url}/admin/v2/persistent/{NS}/{n}/compaction")
                st = json.loads(body)["status"]
                if st == "ERROR":
                    raise RuntimeError(f"{n}: {body!r}")
                if st == "SUCCESS":
                    waiting.discard(n)
            if time.perf_counter() - t0 > args.timeout:
                raise RuntimeError(f"{len(waiting)} topics not compacted in {args.timeout} s")
            time.sleep(0.05)
        seconds = time.perf_counter() - t0
        jobs = set()
        in_process = 0
        phases: dict = {}
        for n in names:
            _, body = http("GET", f"{broker.admin_url}/admin/v2/persistent/{NS}/{n}/stats")
            compaction = json.loads(body)["compaction"]
            job = compaction.get("lastCompactionJob")
            jobs.add(job)
            in_process += job is None  # no Spark job group: compacted in the broker's process
            for k, v in ((compaction.get("lastCompactionRun") or {}).get("phasesMs") or {}).items():
                phases.setdefault(k, []).append(v)
        jobs.discard(None)
        row = {
            "mode": mode,
            "topics": count,
            "policy_to_all_success_seconds": round(seconds, 3),
            "spark_job_groups": len(jobs),
            "topics_in_process": in_process,
            # each topic's own phases (its queue wait includes the job's wait for a worker)
            "median_phases_ms": {k: round(statistics.median(v), 1) for k, v in sorted(phases.items())},
            "produce_seconds": round(produce_s, 2),
            "load_average_1m": [load0, os.getloadavg()[0]],
        }
        log(f"{mode} x {count}: {seconds:.2f} s, {len(jobs)} job groups")
        return row
    finally:
        client.close()
        broker.stop()
        shutil.rmtree(d, ignore_errors=True)


LAG_RE = re.compile(r'^pulsar_compaction_lag_seconds\{[^}]*topic="([^"]+)"[^}]*\} ([0-9.eE+-]+)$', re.M)


def lags(admin_url: str) -> dict[str, float]:
    """``pulsar_compaction_lag_seconds`` of every topic, from ``/metrics``."""
    _, body = http("GET", admin_url + "/metrics")
    return {t: float(v) for t, v in LAG_RE.findall(body.decode())}


def lag_mode(mode: str, count: int, args) -> dict:
    """``count`` topics published to continuously (--rate messages/s each, batched) for
    --lag-seconds, with a namespace ``compactionMaxLagSeconds`` of --max-lag: the compaction lag
    of every topic sampled from /metrics twice a second. The figure is the largest lag seen
    once the first max-lag period is over (the policy's bound plus at most the monitor's
    interval and a run's length, as in Pulsar)."""
    import pulsar

    from standalone import StandaloneBroker

    d = tempfile.mkdtemp(prefix=f"many-topics-lag-{mode}-")
    overrides = [
        "compactionSparkWarmup=true",
        f"spark.master={args.master}",
        "defaultRetentionTimeInMinutes=-1",
        "defaultRetentionSizeInMB=-1",
        f"brokerServiceCompactionMonitorIntervalInSeconds={args.interval}",
        *MODES[mode](args.max_topics),
    ]
    broker = StandaloneBroker(os.path.join(d, "data"), overrides)
    client = pulsar.Client(broker.url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    topics = [f"persistent://{NS}/lag-{i:05d}" for i in range(count)]
    try:
        wait_warm(broker.admin_url)
        producers = [
            client.create_producer(t, batching_enabled=True, batching_max_publish_delay_ms=50) for t in topics
        ]
        status, body = http(
            "POST", f"{broker.admin_url}/admin/v2/namespaces/{NS}/compactionMaxLagSeconds", args.max_lag
        )
        if status >= 300:
            raise RuntimeError(f"policy refused: {status} {body!r}")
        t0 = time.perf_counter()
        sent, worst, samples, next_sample = 0, 0.0, 0, t0
        while (now := time.perf_counter()) - t0 < args.lag_seconds:
            for p in producers:
                p.send_async(b"x" * 100, None, partition_key=f"key-{sent % args.keys:07d}")
            sent += 1
            if now >= next_sample:
                next_sample = now + 0.5
                seen = lags(broker.admin_url)
                if now - t0 > args.max_lag + args.interval:
                    worst = max([worst, *seen.values()])
                    samples += 1
            time.sleep(max(0.0, t0 + sent / args.rate - time.perf_counter()))
        for p in producers:
            p.flush()
            p.close()
        row = {
            "mode": mode,
            "topics": count,
            "max_lag_policy_seconds": args.max_lag,
            "publish_seconds": args.lag_seconds,
            "messages_per_second_per_topic": args.rate,
            "max_lag_seen_seconds": round(worst, 3),
            "lag_samples": samples,
            "load_average_1m": os.getloadavg()[0],
        }
        log(f"lag {mode} x {count}: max lag {worst:.2f} s (policy {args.max_lag} s)")
        return row
    finally:
        client.close()
        broker.stop()
        shutil.rmtree(d, ignore_errors=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--topics", type=int, nargs="*", default=[10, 100, 1000])
    ap.add_argument("--messages", type=int, default=10_000)
    ap.add_argument("--keys", type=int, default=1_000)
    ap.add_argument("--max-topics", type=int, default=100, help="compactionJointMaxTopics of the joint mode")
    ap.add_argument("--interval", type=int, default=1, help="the monitor's interval, seconds")
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    ap.add_argument(
        "--lag-topics",
        type=int,
        nargs="*",
        default=[],
        help="also: this many topics published to continuously under a compactionMaxLagSeconds policy",
    )
    ap.add_argument("--max-lag", type=int, default=5, help="the lag runs' compactionMaxLagSeconds")
    ap.add_argument("--lag-seconds", type=float, default=30, help="how long the lag runs publish")
    ap.add_argument("--rate", type=float, default=20, help="messages/s per topic in the lag runs")
    ap.add_argument("--quick", action="store_true", help="10 topics x 2,000 messages over 200 keys")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "many_topics.json"))
    args = ap.parse_args(argv)
    if args.quick:
        args.topics, args.messages, args.keys = [10], 2_000, 200
    result: dict = {
        "benchmark": "many_topics",
        "machine": {"cpus": os.cpu_count(), "load_average_at_start": list(os.getloadavg())},
        "params": {
            "topics": args.topics,
            "messages_per_topic": args.messages,
            "keys_per_topic": args.keys,
            "payload_bytes": 100,
            "joint_max_topics": args.max_topics,
            "monitor_interval_seconds": args.interval,
            "spark_master": args.master,
            "modes": args.modes,
            "target_seconds_1000_topics": 60,
        },
        "runs": [],
    }
    for count in args.topics:
        for mode in args.modes:
            result["runs"].append(one_mode(mode, count, args))
    for count in args.lag_topics:
        for mode in args.modes:
            result.setdefault("lag_runs", []).append(lag_mode(mode, count, args))
    result["machine"]["load_average_at_end"] = list(os.getloadavg())
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    print(json.dumps({k: result.get(k) for k in ("runs", "lag_runs")}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
