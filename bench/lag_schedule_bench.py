"""The compaction monitor's lag scheduling, in one process: many topics under a maximum lag.

What ``many_topics_bench.py --lag-topics`` measures through a broker (official client, REST,
/metrics samples) is here measured where it is decided: a real ``CompactionMonitor`` with its
check loop, real storage (SQLite metadata, ledger files), the default compaction factory with
small runs in-process (``compactionInProcessMaxBytes``: no Spark, no JVM), and no sockets.
Every ``--tick`` seconds each of ``--topics`` topics gets one batched entry of ``--rate x tick``
messages (publish time: now) and the monitor is told of the append, as the broker's topics tell
it. Each committed run records when its topic fell due, was checked, queued, started and
committed, and when its oldest uncompacted message was published (``lastCompactionRun``'s
``timelineMs``), so the wait of the oldest message of every run is exact, not sampled:
``lag_at_commit`` p50 / p99 / max against the policy, and the split of the largest ones into
the terms that make it up (due -> checked -> queued -> started -> committed).

It also counts the work of the scheduling itself: topics the checks read, checks, jobs, the
metadata store's statements while publishing stops and one check reads every topic (a full
check), and the process's CPU seconds.

    .venv/bin/python bench/lag_schedule_bench.py [--topics 100] [--max-lag 5] [--seconds 30]
    .venv/bin/python bench/lag_schedule_bench.py --topics 200 --max-lag 3 --seconds 15 --out /tmp/x.json
    .venv/bin/python bench/lag_schedule_bench.py --engine timed --fixed 0.3 --per-topic 0.025
    .venv/bin/python bench/lag_schedule_bench.py --scaling 50 100 200 --out /tmp/scaling.json

``--engine timed``: jobs that take ``--fixed + --per-topic x topics`` seconds (a sleep) and commit
the horizon they read at their start (``tests/admin/timed_engine.py``): the monitor's scheduling
alone, little changed by a busy machine.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, os.path.join(ROOT, "src"))

NS = "public/default"


class Broker:
    """What the monitor asks of the broker: config, storage, a worker pool, no listeners."""

    def __init__(self, storage, config) -> None:
        self.storage = storage
        self.config = config
        self.shutting_down = False
        self.post_compaction_hooks = ()
        self.executor = ThreadPoolExecutor(4, thread_name_prefix="bench-blocking")

    def run_blocking(self, fn, *args):
        return asyncio.get_running_loop().run_in_executor(self.executor, functools.partial(fn, *args))


def count_store_calls(store) -> dict[str, int]:
    """Count the metadata store's operations (reads and writes that reach SQLite: the caches of
    ``storage.resources`` answer the rest) by wrapping them on this one instance."""
    counts: dict[str, int] = {}
    for name in ("get", "exists", "get_children", "put", "delete", "commit"):
        fn = getattr(store, name, None)
        if fn is None:
            continue

        def counted(*a, _fn=fn, _name=name, **kw):
            counts[_name] = counts.get(_name, 0) + 1
            return _fn(*a, **kw)

        setattr(store, name, counted)
    return counts


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


async def publish_for(monitor, storage, topics, args, runs_seen: list) -> None:
    """Append one entry to every topic each tick for --seconds; collect every committed run."""
    from many_topics_bench import batched_entries

    per_tick = max(1, int(args.rate * args.tick))
    seen: dict[str, int] = {}
    t_end = time.time() + args.seconds
    drain_end = t_end + 2 * args.max_lag + 5
    while True:
        now = time.time()
        if now < t_end:
            entry = batched_entries(per_tick, args.keys, int(now * 1000))
            for t in topics:
                storage.open_managed_ledger(t).append_many(entry, [int(now * 1000)] * len(entry))
                monitor.watch.touch(t)
        for t in topics:
            last = monitor.last_runs.get(t)
            if last is not None and seen.get(t) != last["timelineMs"]["committed"]:
                seen[t] = last["timelineMs"]["committed"]
                runs_seen.append(dict(last, topic=t))
        if now >= t_end and (not monitor.running_topics or now > drain_end):
            break
        await asyncio.sleep(max(0.0, now + args.tick - time.time()))


def split_of(run: dict) -> dict:
    """The terms of one run's lag at commit, in seconds."""
    tl = run["timelineMs"]

    def d(a, b):
        return None if tl.get(a) is None or tl.get(b) is None else round((tl[b] - tl[a]) / 1000, 3)

    return {
        "oldest_to_due": d("oldestPublished", "due"),
        "due_to_checked": d("due", "checked"),
        "checked_to_queued": d("checked", "queued"),
        "queued_to_started": d("queued", "started"),
        "started_to_committed": d("started", "committed"),
        "lag_at_commit": run.get("lagAtCommitMs", 0) / 1000,
        "job_topics": len(run.get("jobTopics") or []),
    }


async def run_bench(args) -> dict:
    from compactmq.broker.compaction_monitor import CompactionMonitor
    from compactmq.config import load_config
    from compactmq.storage import COMPACTION_MAX_LAG, Storage

    d = tempfile.mkdtemp(prefix="lag-schedule-")
    config = load_config(
        overrides={
            "dataDir": os.path.join(d, "data"),
            "brokerServiceCompactionMonitorIntervalInSeconds": args.interval,
            "compactionInProcessMaxBytes": 8 << 20,
            "compactionJointMaxTopics": args.max_topics,
            "compactionJointLagSplit": not args.no_split,
            "managedLedgerSyncData": False,
        }
    )
    storage = Storage(os.path.join(d, "data"), config)
    broker = Broker(storage, config)
    topics = [f"persistent://{NS}/lag-{i:05d}" for i in range(args.topics)]
    for t in topics:
        storage.topic_metadata.create_topic(t)
        storage.open_managed_ledger(t)
    calls = count_store_calls(storage.metadata_store)
    storage.policies.set_namespace_policy(NS, COMPACTION_MAX_LAG, args.max_lag)
    monitor = CompactionMonitor(broker)
    if args.engine == "timed":  # jobs of a set length: the scheduling alone (tests/admin/timed_engine.py)
        sys.path.insert(0, ROOT)
        from tests.admin.timed_engine import TimedFactory

        monitor._factory = TimedFactory(storage, args.fixed, args.per_topic)
    runs: list[dict] = []
    cpu0, t0 = cpu_seconds(), time.perf_counter()
    try:
        await monitor.start()
        await publish_for(monitor, storage, topics, args, runs)
        cpu, wall = cpu_seconds() - cpu0, time.perf_counter() - t0
        checked, checks, jobs = monitor.watch.topics_checked, monitor.checks, monitor.jobs_started
        model = monitor.sizer.model()
        store_calls = dict(calls)
        # the cost of one full check of every topic, publishing stopped and nothing running
        before = dict(calls)
        c0, w0 = cpu_seconds(), time.perf_counter()
        await broker.run_blocking(monitor._due_topics, set(), None, 0, 0)
        full_check = {
            "cpu_seconds": round(cpu_seconds() - c0, 3),
            "seconds": round(time.perf_counter() - w0, 3),
            "metadata_store_calls": {
                k: v - before.get(k, 0) for k, v in calls.items() if v - before.get(k, 0)
            },
        }
    finally:
        await monitor.close()
        broker.executor.shutdown(wait=True)
        storage.close()
        shutil.rmtree(d, ignore_errors=True)
    settled = [r for r in runs if r["timelineMs"]["checked"] and r["timelineMs"]["checked"] / 1000 > 0]
    settled = settled[len(topics) :]  # the first round: the topics' first runs, found by the first check
    lags = [r["lagAtCommitMs"] / 1000 for r in settled if "lagAtCommitMs" in r]
    worst = sorted(settled, key=lambda r: -r.get("lagAtCommitMs", 0))[:5]
    terms = [split_of(r) for r in settled]
    return {
        "engine": args.engine
        if args.engine == "in-process"
        else f"timed {args.fixed} + {args.per_topic} x topics s",
        "topics": args.topics,
        "split_jobs": not args.no_split,
        "max_lag_policy_seconds": args.max_lag,
        "messages_per_second_per_topic": args.rate,
        "publish_seconds": args.seconds,
        "runs": len(settled),
        "lag_at_commit_seconds": {
            "p50": round(percentile(lags, 0.5), 3),
            "p99": round(percentile(lags, 0.99), 3),
            "max": round(max(lags, default=float("nan")), 3),
        },
        "within_policy": bool(lags) and max(lags) <= args.max_lag,
        "runs_over_policy": sum(lag > args.max_lag for lag in lags),
        "median_terms_seconds": {
            k: round(statistics.median([t[k] for t in terms if t[k] is not None]), 3)
            for k in terms[0]
            if any(t[k] is not None for t in terms)
        }
        if terms
        else {},
        "worst_runs": [split_of(r) for r in worst],
        "checks": checks,
        "topics_checked": checked,
        "jobs": jobs,
        "job_model_fixed_and_per_topic_seconds": None if model is None else [round(x, 4) for x in model],
        "metadata_store_calls": store_calls,
        "metadata_store_calls_per_run": round(sum(store_calls.values()) / max(1, len(runs)), 1),
        "cpu_seconds": round(cpu, 2),
        "wall_seconds": round(wall, 2),
        "full_check": full_check,
        "load_average_1m": os.getloadavg()[0],
    }


def scaling(counts: list[int]) -> list[dict]:
    """For each count N: N topics of 60 messages, then one full check of the monitor and ONE
    joint job of all N through it (``_run_together_blocking``: begin, the factory's
    ``compact_together`` with small runs in-process, each topic's outcome), twice (the second
    an incremental run); CPU seconds and metadata-store calls per topic. Flat per-topic figures
    as N grows: nothing in them is O(topics^2)."""
    from compactmq.broker.compaction_monitor import CompactionMonitor
    from compactmq.broker.compaction_runs import RunProgress
    from compactmq.config import load_config
    from compactmq.storage import COMPACTION_THRESHOLD, Storage
    from many_topics_bench import batched_entries

    rows = []
    for n in counts:
        d = tempfile.mkdtemp(prefix="lag-scaling-")
        config = load_config(
            overrides={
                "dataDir": os.path.join(d, "data"),
                "compactionInProcessMaxBytes": 8 << 20,
                "compactionJointMaxTopics": n,
                "managedLedgerSyncData": False,
            }
        )
        storage = Storage(os.path.join(d, "data"), config)
        broker = Broker(storage, config)
        monitor = CompactionMonitor(broker)
        topics = [f"persistent://{NS}/scale-{i:05d}" for i in range(n)]
        storage.policies.set_namespace_policy(NS, COMPACTION_THRESHOLD, 1)
        calls = count_store_calls(storage.metadata_store)
        row: dict = {"topics": n}
        try:
            for rnd in ("first", "incremental"):
                now = int(time.time() * 1000)
                entries = batched_entries(60, 50, now)
                for t in topics:
                    if rnd == "first":
                        storage.topic_metadata.create_topic(t)
                    storage.open_managed_ledger(t).append_many(entries, [now] * len(entries))
                before, c0, w0 = sum(calls.values()), cpu_seconds(), time.perf_counter()
                due = monitor._due_topics(set(), None)
                check = (cpu_seconds() - c0, time.perf_counter() - w0, sum(calls.values()) - before)
                runs = [RunProgress(t, "bench", queued_at=time.time()) for t, *_ in due]
                before, c0, w0 = sum(calls.values()), cpu_seconds(), time.perf_counter()
                monitor._run_together_blocking(runs)
                job = (cpu_seconds() - c0, time.perf_counter() - w0, sum(calls.values()) - before)
                ok = sum(1 for t in topics if (monitor.last_run(t) or {}).get("status") == "SUCCESS")
                row[rnd] = {
                    "due": len(due),
                    "succeeded": ok,
                    "check_cpu_ms_per_topic": round(check[0] * 1000 / n, 2),
                    "check_store_calls_per_topic": round(check[2] / n, 1),
                    "job_seconds": round(job[1], 2),
                    "job_cpu_ms_per_topic": round(job[0] * 1000 / n, 2),
                    "job_store_calls_per_topic": round(job[2] / n, 1),
                }
                print(f"scaling {n} {rnd}: {row[rnd]}", file=sys.stderr)
        finally:
            broker.executor.shutdown(wait=True)
            storage.close()
            shutil.rmtree(d, ignore_errors=True)
        rows.append(row)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--topics", type=int, default=100)
    ap.add_argument("--max-lag", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=30, help="how long every topic is published to")
    ap.add_argument("--rate", type=float, default=20, help="messages/s per topic")
    ap.add_argument("--tick", type=float, default=0.25, help="seconds between a topic's entries")
    ap.add_argument("--keys", type=int, default=50)
    ap.add_argument("--interval", type=int, default=1, help="the monitor's interval, seconds")
    ap.add_argument("--max-topics", type=int, default=100, help="compactionJointMaxTopics")
    ap.add_argument(
        "--engine",
        choices=["in-process", "timed"],
        default="in-process",
        help="in-process: the default factory, small runs without Spark; timed: jobs of --fixed + "
        "--per-topic x topics seconds (a sleep) committing the horizon: the scheduling alone",
    )
    ap.add_argument("--fixed", type=float, default=0.3, help="timed engine: a job's fixed seconds")
    ap.add_argument("--per-topic", type=float, default=0.025, help="timed engine: seconds per topic")
    ap.add_argument(
        "--no-split",
        action="store_true",
        help="compactionJointLagSplit=false (the default): every due lag topic in one job, to the bound; "
        "without it the run sets compactionJointLagSplit=true",
    )
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "lag_schedule.json"))
    ap.add_argument(
        "--scaling",
        type=int,
        nargs="*",
        default=None,
        help="instead: one full check and one joint job of N topics for each N (e.g. 50 100 200): "
        "CPU and metadata-store calls per topic (``scaling``)",
    )
    args = ap.parse_args(argv)
    result: dict = {"benchmark": "lag_schedule", "machine": {"cpus": os.cpu_count()}}
    if args.scaling:
        result["scaling"] = scaling(args.scaling)
    else:
        result["run"] = asyncio.run(run_bench(args))
    result["machine"]["load_average_1m_at_end"] = os.getloadavg()[0]
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
