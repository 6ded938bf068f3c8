"""Many small topics due at once: the compaction monitor's joint jobs against one run per topic.

For each topic count, one broker per mode in turn (``compactmq standalone`` subprocesses, warm
Spark): ``joint`` (the default: the topics due at a check share Spark jobs of up to
``compactionJointMaxTopics``), ``one-by-one`` (``compactionJointMaxTopics=1``: what the
monitor did before) and ``joint-in-process`` (joint, with ``compactionInProcessMaxBytes`` at
8 MiB: topics that small are compacted in the broker's process without a Spark job).

Each mode's topics get --messages 100-byte messages over --keys keys each, in batches of up to
1,000 messages, by one of two paths (``--publish``):

* ``client`` (default): the official client, async sends from up to ``PRODUCER_WINDOW``
  producers at once (``publish_client``);
* ``direct``: written through the broker's own storage into the data directory before the
  broker starts (``ingest_direct``: ``Storage.open_managed_ledger(...).append_many``, the path
  compaction_bench and partitioned_bench use), the same batched entries without 10 M client
  sends: what the 1,000-topic run uses.

Then a namespace compaction threshold is set over REST, so every topic falls due at the same
check, and each topic's ``GET .../compaction`` is polled until all are SUCCESS. The figure is
the time from the policy's PUT to the last commit (``lastCompactionSucceedTimestamp``, so the
polling of 1,000 topics adds nothing); the JSON also has the Spark job groups the runs used and
the load average (the machine is shared: compare the modes, run on a quiet machine for absolute
figures).

    .venv/bin/python bench/many_topics_bench.py [--topics 10 100 1000] [--messages 10000] [--keys 1000]
    .venv/bin/python bench/many_topics_bench.py --quick       # 10 topics x 2,000 messages
    .venv/bin/python bench/many_topics_bench.py --topics 10 100 1000 --modes joint one-by-one --publish direct
    .venv/bin/python bench/plot.py many_topics                # total time against due topics
    .venv/bin/python bench/many_topics_bench.py --topics --lag-topics 100 --modes joint

``--lag-topics N``: N topics published to continuously (``--rate`` messages/s each) for
``--lag-seconds`` under a namespace ``compactionMaxLagSeconds`` of ``--max-lag``, then sampled
until everything is compacted. Each topic's compaction lag is read from /metrics every
``LAG_SAMPLE_SECONDS``; from those samples, each message's wait until a committed view held it
(``message_waits``). The JSON's ``lag_runs`` give p50 / p99 / max of the waits of the messages
sent after the first max-lag period, ``within_policy``, and the largest lag gauge seen; from the
broker's own counters (``lag_bound``, absent from brokers older than them) the runs of lag topics,
those whose oldest message waited past the policy, the longest such wait (exact: each run's
timeline, not a sample) and the least lag the monitor said it could keep -- at the end
(``floor_seconds_at_end``: after the drain, with the queue empty) and the largest read while
publishing (``floor_seconds_max_seen``); ``seconds_per_run_cycle_publishing`` is a lag topic's
time between runs while publishing, after the first max lag.
``--before-src DIR``: each lag run is made twice in one invocation, first with the broker from
another checkout's ``src`` (say the branch's base, ``git archive``-ed or copied), then with this
one, rows labelled ``before`` and ``after``:

    .venv/bin/python bench/many_topics_bench.py --topics --lag-topics 100 --modes joint \
        --max-lag 15 --lag-seconds 60 --before-src /tmp/base/src --out bench/results/many_topics_lag_bound.json
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

#: producers publishing at once in the client path (``publish_client``)
PRODUCER_WINDOW = 100

#: how often the lag runs read every topic's compaction lag from /metrics
LAG_SAMPLE_SECONDS = 0.5

#: the broker overrides of each mode (besides the common ones), given the joint bound
MODES = {
    # the Spark modes pin compactionInProcessMaxBytes=0 whatever its default is
    "joint": lambda max_topics: [f"compactionJointMaxTopics={max_topics}", "compactionInProcessMaxBytes=0"],
    "one-by-one": lambda max_topics: ["compactionJointMaxTopics=1", "compactionInProcessMaxBytes=0"],
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


def publish_client(client, topics: list[str], n: int, keys: int) -> None:
    """``n`` 100-byte messages over ``keys`` keys to each topic through the official client:
    every producer's sends are queued at once (async, batches of up to 1,000 messages), a window
    of ``PRODUCER_WINDOW`` producers at a time, so the client's I/O thread keeps many topics busy."""
    payload = b"x" * 100
    for w0 in range(0, len(topics), PRODUCER_WINDOW):
        producers = [
            client.create_producer(
                t,
                batching_enabled=True,
                batching_max_messages=1000,
                batching_max_publish_delay_ms=10,
                max_pending_messages=n + 1,
                block_if_queue_full=True,
            )
            for t in topics[w0 : w0 + PRODUCER_WINDOW]
        ]
        for i in range(n):
            key = f"key-{i % keys:07d}"
            for p in producers:
                p.send_async(payload, None, partition_key=key)
        for p in producers:
            p.flush()
            p.close()


def batched_entries(n: int, keys: int, publish_ms: int) -> list[bytes]:
    """The stored entries the client's batching makes of ``n`` 100-byte messages over ``keys``
    keys: batches of up to 1,000 messages (``MessageMetadata.num_messages_in_batch``)."""
    from compactmq.protocol import pulsar_pb2 as pb
    from compactmq.protocol.entry_format import build_entry

    payload = b"x" * 100
    out = []
    for b0 in range(0, n, 1000):
        count = min(1000, n - b0)
        parts = []
        for i in range(b0, b0 + count):
            smm = pb.SingleMessageMetadata(partition_key=f"key-{i % keys:07d}", payload_size=len(payload))
            raw = smm.SerializeToString()
            parts.append(len(raw).to_bytes(4, "big") + raw + payload)
        md = pb.MessageMetadata(
            producer_name="bench", sequence_id=b0, publish_time=publish_ms, num_messages_in_batch=count
        )
        out.append(build_entry(md, b"".join(parts)))
    return out


def ingest_direct(data_dir: str, topics: list[str], n: int, keys: int) -> None:
    """Write the topics before the broker starts, through the broker's own storage
    (``Storage.open_managed_ledger(...).append_many``, as compaction_bench and partitioned_bench
    do): the same batched entries as the client path, without 10 M client sends."""
    from compactmq.config import load_config
    from compactmq.storage import Storage

    entries = batched_entries(n, keys, int(time.time() * 1000))
    storage = Storage(data_dir, load_config(overrides={"managedLedgerSyncData": False}))
    try:
        for t in topics:
            storage.open_managed_ledger(t).append_many(entries)
    finally:
        storage.close()


def start_broker(mode: str, data_dir: str, args, src: str | None = None):
    """A warm ``compactmq standalone`` of ``mode`` on ``data_dir`` and an official client of it
    (``src``: the broker from another checkout's ``src`` directory)."""
    import pulsar

    from standalone import StandaloneBroker

    overrides = [
        "compactionSparkWarmup=true",
        f"spark.master={args.master}",
        "defaultRetentionTimeInMinutes=-1",
        "defaultRetentionSizeInMB=-1",
        f"brokerServiceCompactionMonitorIntervalInSeconds={args.interval}",
        *MODES[mode](args.max_topics),
        f"compactionJointLagSplit={'true' if args.lag_split else 'false'}",
    ]
    broker = StandaloneBroker(data_dir, overrides, src=src)
    try:
        client = pulsar.Client(broker.url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
        wait_warm(broker.admin_url)
        warm_joint(broker.admin_url, client)
    except BaseException:
        broker.stop()
        raise
    return broker, client


def warm_joint(admin_url: str, client) -> None:
    """One joint run before the measured ones: a 2-partition topic compacted by one REST trigger
    (``trigger_together``: one joint job), so the first measured joint job does not pay for the
    joint path's first use (Spark's start-up warm-up compacts one topic alone)."""
    base = f"persistent://{NS}/warm-joint"
    status, body = http("PUT", f"{admin_url}/admin/v2/persistent/{NS}/warm-joint/partitions", 2)
    if status >= 300:
        raise RuntimeError(f"warm-up topic refused: {status} {body!r}")
    publish_client(client, [base], 200, 20)
    status, body = http("PUT", f"{admin_url}/admin/v2/persistent/{NS}/warm-joint/compaction")
    if status >= 300:
        raise RuntimeError(f"warm-up trigger refused: {status} {body!r}")
    wait_all_success(admin_url, [f"warm-joint-partition-{i}" for i in range(2)], time.perf_counter(), 300)


def wait_all_success(admin_url: str, names: list[str], t0: float, timeout: float) -> None:
    """Poll ``GET .../compaction`` of the topics not yet SUCCESS until none is left. A pass
    stops at the first topic not done yet: the monitor queues due topics in the order it finds
    them (by name, at equal priority), so a pass costs the broker a request or two rather than
    one per topic -- polling 1,000 topics would otherwise compete with the runs it times."""
    waiting = sorted(names)
    while waiting:
        while waiting:
            n = waiting[0]
            _, body = http("GET", f"{admin_url}/admin/v2/persistent/{NS}/{n}/compaction")
            st = json.loads(body)["status"]
            if st == "ERROR":
                raise RuntimeError(f"{n}: {body!r}")
            if st != "SUCCESS":
                break
            waiting.pop(0)
        if time.perf_counter() - t0 > timeout:
            raise RuntimeError(f"{len(waiting)} topics not compacted in {timeout} s")
        if waiting:
            time.sleep(0.1)


def one_mode(mode: str, count: int, args) -> dict:
    d = tempfile.mkdtemp(prefix=f"many-topics-{mode}-")
    names = [f"many-{i:05d}" for i in range(count)]
    topics = [f"persistent://{NS}/{n}" for n in names]
    t_p = time.perf_counter()
    if args.publish == "direct":
        ingest_direct(os.path.join(d, "data"), topics, args.messages, args.keys)
    produce_s = time.perf_counter() - t_p
    broker, client = start_broker(mode, os.path.join(d, "data"), args)
    try:
        if args.publish == "client":
            t_p = time.perf_counter()
            publish_client(client, topics, args.messages, args.keys)
            produce_s = time.perf_counter() - t_p
        load0 = os.getloadavg()[0]
        t0, wall0 = time.perf_counter(), time.time()
        status, body = http("POST", f"{broker.admin_url}/admin/v2/namespaces/{NS}/compactionThreshold", 1)
        if status >= 300:
            raise RuntimeError(f"policy refused: {status} {body!r}")
        wait_all_success(broker.admin_url, names, t0, args.timeout)
        polled = time.perf_counter() - t0
        jobs = set()
        in_process = 0
        last_success_ms = 0
        phases: dict = {}
        for n in names:
            _, body = http("GET", f"{broker.admin_url}/admin/v2/persistent/{NS}/{n}/stats")
            compaction = json.loads(body)["compaction"]
            job = compaction.get("lastCompactionJob")
            jobs.add(job)
            in_process += job is None  # no Spark job group: compacted in the broker's process
            last_success_ms = max(last_success_ms, int(compaction.get("lastCompactionSucceedTimestamp") or 0))
            for k, v in ((compaction.get("lastCompactionRun") or {}).get("phasesMs") or {}).items():
                phases.setdefault(k, []).append(v)
        jobs.discard(None)
        # the last commit's own timestamp, not when polling saw it (polling 1,000 topics takes a while)
        seconds = last_success_ms / 1000 - wall0 if last_success_ms else polled
        row = {
            "mode": mode,
            "topics": count,
            "policy_to_all_success_seconds": round(seconds, 3),
            "policy_to_all_success_polled_seconds": round(polled, 3),
            "spark_job_groups": len(jobs),
            "topics_in_process": in_process,
            # each topic's own phases (its queue wait includes the job's wait for a worker)
            "median_phases_ms": {k: round(statistics.median(v), 1) for k, v in sorted(phases.items())},
            "publish": args.publish,
            "publish_seconds": round(produce_s, 2),
            "load_average_1m": [load0, os.getloadavg()[0]],
        }
        log(f"{mode} x {count}: {seconds:.2f} s, {len(jobs)} job groups")
        return row
    finally:
        client.close()
        log(f"broker shut down in {broker.stop():.1f} s")
        shutil.rmtree(d, ignore_errors=True)


LAG_RE = re.compile(r'^pulsar_compaction_lag_seconds\{[^}]*topic="([^"]+)"[^}]*\} ([0-9.eE+-]+)$', re.M)


SUCCEEDED_RE = re.compile(
    r'^pulsar_compaction_succeed_count\{[^}]*topic="[^"]*/lag-[^"]+"[^}]*\} ([0-9.eE+-]+)$', re.M
)


FLOOR_RE = re.compile(r"^compactmq_compaction_max_lag_floor_seconds\{[^}]*\} ([0-9.eE+-]+)$", re.M)


def lags(admin_url: str, seen: dict | None = None) -> dict[str, float]:
    """``pulsar_compaction_lag_seconds`` of every topic, from ``/metrics``; ``seen`` gets the
    broker's floor (``compactmq_compaction_max_lag_floor_seconds``, the largest seen) and its
    lag topics' successful runs so far (``runs``)."""
    _, body = http("GET", admin_url + "/metrics")
    text = body.decode()
    if seen is not None:
        floor = FLOOR_RE.search(text)
        if floor:
            seen["floor_max"] = max(seen.get("floor_max", 0.0), float(floor.group(1)))
        seen["runs"] = statistics.mean([int(float(v)) for v in SUCCEEDED_RE.findall(text)] or [0])
    return {t: float(v) for t, v in LAG_RE.findall(text)}


def message_waits(sent: list[float], samples: list[tuple[float, float]]) -> list[float]:
    """How long each message sent at ``sent`` (wall seconds) waited before it was in a committed
    compacted view, from a topic's lag samples ``(wall time, lag seconds)``: the oldest
    uncompacted message at a sample was published at ``time - lag`` (everything, at a lag of
    0), so a message is committed by the first sample whose oldest uncompacted message is newer.
    A sample's resolution (``LAG_SAMPLE_SECONDS``) adds up to that much to each wait; messages
    no sample saw committed are left out (``unseen`` in the JSON)."""
    horizon = [(t, t - lag if lag > 0 else t) for t, lag in samples]
    waits, j = [], 0
    for s in sent:
        while j < len(horizon) and horizon[j][1] <= s:
            j += 1
        if j == len(horizon):
            break  # sent is sorted: no later message was seen committed either
        waits.append(horizon[j][0] - s)
    return waits


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def publish_and_sample(admin_url: str, producers: list, topics: list[str], args) -> tuple:
    """Publish one message to every producer's topic --rate times a second for --lag-seconds,
    sampling every topic's compaction lag from /metrics every ``LAG_SAMPLE_SECONDS``, then keep
    sampling until everything is compacted (or 2 x --max-lag + 10 s). Returns ``(wall time of
    each round of sends, {topic: [(wall time, lag seconds)]})``."""
    t0 = time.perf_counter()
    sent_at: list[float] = []  # wall time of each round of sends (one message to every topic)
    samples: dict[str, list[tuple[float, float]]] = {t: [] for t in topics}
    next_sample = t0
    drain_until = None  # after publishing: sample until every message is committed
    seen = args.seen  # the floor and runs read with the lags (``lags``)
    while True:
        now = time.perf_counter()
        if now - t0 < args.lag_seconds:
            sent_at.append(time.time())
            for p in producers:
                p.send_async(b"x" * 100, None, partition_key=f"key-{len(sent_at) % args.keys:07d}")
        elif drain_until is None:
            for p in producers:
                p.flush()
            drain_until = now + 2 * args.max_lag + 10
        if now >= next_sample:
            next_sample = now + LAG_SAMPLE_SECONDS
            wall = time.time()
            for t, lag in lags(admin_url, seen).items():
                if t in samples:
                    samples[t].append((wall, lag))
            if drain_until is None:  # while publishing, after the first max lag: the steady state
                if "settled_runs" not in seen and now - t0 >= args.max_lag:
                    seen["settled_runs"], seen["settled_seconds"] = seen.get("runs", 0), now - t0
                seen["publishing_runs"], seen["publishing_seconds"] = seen.get("runs", 0), now - t0
            if drain_until is not None and (
                now > drain_until or all(s and s[-1][1] == 0 for s in samples.values())
            ):
                return sent_at, samples
        if drain_until is None:
            time.sleep(max(0.0, t0 + len(sent_at) / args.rate - time.perf_counter()))
        else:
            time.sleep(LAG_SAMPLE_SECONDS / 2)


def wait_stats(sent_at: list[float], samples: dict, settled: float, max_lag: float) -> dict:
    """p50 / p99 / max of the waits (``message_waits``) of the messages sent from ``settled`` on,
    and the largest lag gauge seen a max lag after that."""
    waits: list[float] = []
    unseen = 0
    gauge = 0.0
    sent = [s for s in sent_at if s >= settled]
    for series in samples.values():
        got = message_waits(sent, series)
        waits += got
        unseen += len(sent) - len(got)
        gauge = max([gauge, *(lag for w, lag in series if w >= settled + max_lag)])
    gaps = [b[0] - a[0] for series in samples.values() for a, b in zip(series, series[1:])]
    return {
        "p50": round(percentile(waits, 0.50), 3),
        "p99": round(percentile(waits, 0.99), 3),
        "max": round(max(waits, default=float("nan")), 3),
        "messages": len(waits),
        "unseen": unseen,
        # a wait is over-counted by up to the gap between samples (/metrics is slower under load)
        "sample_gap_seconds": round(statistics.mean(gaps), 3) if gaps else None,
        "gauge_max": round(gauge, 3),
    }


LAG_BOUND_RE = re.compile(
    r"^(compactmq_compaction_(?:lag_runs_total|lag_runs_over_policy_total|lag_at_commit_max_seconds|"
    r"max_lag_floor_seconds))\{[^}]*\} ([0-9.eE+-]+)$",
    re.M,
)
UNKEEPABLE_RE = re.compile(r"^pulsar_compaction_max_lag_unkeepable\{[^}]*\} 1$", re.M)


def lag_bound(metrics: str) -> dict | None:
    """The broker's own account of the lag bound (``compactmq_compaction_lag_*``), None from a
    broker without those metrics."""
    found = {name: float(v) for name, v in LAG_BOUND_RE.findall(metrics)}
    if not found:
        return None
    return {
        "lag_runs": int(found.get("compactmq_compaction_lag_runs_total", 0)),
        "lag_runs_over_policy": int(found.get("compactmq_compaction_lag_runs_over_policy_total", 0)),
        "lag_at_commit_max_seconds": found.get("compactmq_compaction_lag_at_commit_max_seconds"),
        "floor_seconds_at_end": found.get("compactmq_compaction_max_lag_floor_seconds"),
        "topics_unkeepable_at_end": len(UNKEEPABLE_RE.findall(metrics)),
    }


def _steady_cycle(seen: dict) -> float | None:
    """Seconds per run of a lag topic while publishing, from the first max lag on."""
    runs = seen.get("publishing_runs", 0) - seen.get("settled_runs", 0)
    if "settled_runs" not in seen or runs <= 0:
        return None
    return round((seen["publishing_seconds"] - seen["settled_seconds"]) / runs, 2)


def lag_mode(mode: str, count: int, args, src: str | None = None, label: str | None = None) -> dict:
    """``count`` topics published to continuously (--rate messages/s each, batched) for
    --lag-seconds, with a namespace ``compactionMaxLagSeconds`` of --max-lag (``publish_and_sample``);
    each message's wait until a committed view held it, after the first max-lag period:
    p50 / p99 / max against the policy (``wait_stats``). ``src``: the broker from another
    checkout (``label``: what the row calls it)."""
    d = tempfile.mkdtemp(prefix=f"many-topics-lag-{mode}-")
    broker, client = start_broker(mode, os.path.join(d, "data"), args, src=src)
    topics = [f"persistent://{NS}/lag-{i:05d}" for i in range(count)]
    try:
        producers = [
            client.create_producer(t, batching_enabled=True, batching_max_publish_delay_ms=50) for t in topics
        ]
        status, body = http(
            "POST", f"{broker.admin_url}/admin/v2/namespaces/{NS}/compactionMaxLagSeconds", args.max_lag
        )
        if status >= 300:
            raise RuntimeError(f"policy refused: {status} {body!r}")
        t0, wall0, cpu0 = time.perf_counter(), time.time(), broker.cpu()
        args.seen = seen = {}
        sent_at, samples = publish_and_sample(broker.admin_url, producers, topics, args)
        for p in producers:
            p.close()
        cpu, wall = broker.cpu() - cpu0, time.perf_counter() - t0
        metrics = http("GET", broker.admin_url + "/metrics")[1].decode()
        runs = statistics.mean([int(float(v)) for v in SUCCEEDED_RE.findall(metrics)] or [0])
        w = wait_stats(sent_at, samples, wall0 + args.max_lag + args.interval, args.max_lag)
        row = {
            "mode": mode,
            "broker": label or "this checkout",
            "topics": count,
            "max_lag_policy_seconds": args.max_lag,
            "publish_seconds": args.lag_seconds,
            "messages_per_second_per_topic": args.rate,
            "message_wait_seconds": w,
            "within_policy": w["messages"] > 0 and w["max"] <= args.max_lag,
            "lag_samples_per_topic": round(statistics.mean(len(s) for s in samples.values()), 1),
            # the model: a message waits at most about two runs (the one that missed it, its own)
            # plus a check's latency, so the policy holds when a cycle's run is under half of it
            "runs_per_topic": round(runs, 1),
            "seconds_per_run_cycle": round(wall / runs, 2) if runs else None,
            # while publishing, from the first max lag on (the wall time above includes the
            # first wave's wait for its deadline, the drain and the last runs)
            "seconds_per_run_cycle_publishing": _steady_cycle(seen),
            "floor_seconds_max_seen": seen.get("floor_max"),
            "broker_process_cpu_seconds_per_wall_second": round(cpu / wall, 2),  # not its JVM
            "lag_bound": lag_bound(metrics),
            "load_average_1m": os.getloadavg()[0],
        }
        log(
            f"lag {mode} x {count} ({row['broker']}): message wait p50 {w['p50']} s, p99 {w['p99']} s, "
            f"max {w['max']} s (policy {args.max_lag} s); broker: {row['lag_bound']}"
        )
        return row
    finally:
        client.close()
        log(f"broker shut down in {broker.stop():.1f} s")
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
    ap.add_argument(
        "--lag-split",
        action="store_true",
        help="compactionJointLagSplit=true: lag topics' joint jobs split round-robin by the learned model",
    )
    ap.add_argument(
        "--before-src",
        help="lag runs: first with the broker from this checkout's src directory (rows 'before'), "
        "then this one ('after')",
    )
    ap.add_argument(
        "--publish",
        choices=["client", "direct"],
        default="client",
        help="client: the official client (async, batched, many producers); direct: written through the "
        "broker's storage before it starts (same batched entries; for 1,000 topics x 10 k messages)",
    )
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
            "publish": args.publish,
            "lag_split": args.lag_split,
            "max_lag_seconds": args.max_lag,
            "lag_publish_seconds": args.lag_seconds,
            "lag_rate_per_topic": args.rate,
            "before_src": args.before_src,
            "target_seconds_1000_topics": 60,
        },
        "runs": [],
    }
    for count in args.topics:
        for mode in args.modes:
            result["runs"].append(one_mode(mode, count, args))
    for count in args.lag_topics:
        for mode in args.modes:
            if args.before_src:
                result.setdefault("lag_runs", []).append(
                    lag_mode(mode, count, args, args.before_src, "before")
                )
            label = "after" if args.before_src else None
            result.setdefault("lag_runs", []).append(lag_mode(mode, count, args, label=label))
    result["machine"]["load_average_at_end"] = list(os.getloadavg())
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    print(json.dumps({k: result.get(k) for k in ("runs", "lag_runs")}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
