"""Compaction of a partitioned topic: all partitions in one Spark job (``compact_together``)
against one job per partition in turn (what Pulsar does, and this broker did before).

For each partition count, one data directory is filled with a partitioned topic (keyed,
non-batched messages, the same keys in every partition); every trial compacts a fresh copy of it
from scratch, the two modes alternating, in one warm local Spark session. Writes JSON to
``bench/results/partitioned.json``: wall time per mode (median of the trials), the ratio, and the
Spark jobs each mode ran.

    python bench/partitioned_bench.py                       # 2, 4 and 8 partitions x 50,000 messages
    python bench/partitioned_bench.py --partitions 8 --messages 20000 --trials 2
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

HERE = os.path.dirname(os.path.abspath(__file__))
TOPIC = "persistent://public/default/bench-parted"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def prepare(work: str, partitions: int, messages: int, keys: int) -> str:
    from compactmq.config import load_config
    from compactmq.protocol import pulsar_pb2 as pb
    from compactmq.protocol.entry_format import build_entry
    from compactmq.storage import Storage

    src = os.path.join(work, f"src-{partitions}-{messages}")
    storage = Storage(src, load_config(overrides={"managedLedgerSyncData": False}))
    try:
        storage.create_partitioned_topic(TOPIC, partitions)
        for p in range(partitions):
            ml = storage.open_managed_ledger(f"{TOPIC}-partition-{p}")
            batch = []
            for i in range(messages):
                md = pb.MessageMetadata(producer_name="bench", sequence_id=i, publish_time=1000)
                md.partition_key = f"key-{i % keys}"
                batch.append(build_entry(md, b"x" * 100))
                if len(batch) == 10_000:
                    ml.append_many(batch)
                    batch = []
            if batch:
                ml.append_many(batch)
    finally:
        storage.close()
    return src


def compact(src: str, work: str, partitions: int, joint: bool) -> tuple[float, int]:
    """Wall seconds to compact every partition of a fresh copy of ``src``, and Spark jobs run."""
    from compactmq.compaction import CompactionServiceFactory, load_factory
    from compactmq.config import load_config
    from compactmq.compaction.jobs.session import TEST_CONF
    from compactmq.storage import Storage

    dst = tempfile.mkdtemp(dir=work, prefix="trial-")
    shutil.rmtree(dst)
    shutil.copytree(src, dst)
    cfg = load_config(overrides={"managedLedgerSyncData": False, **TEST_CONF})
    storage = Storage(dst, cfg)
    factory = load_factory(cfg, storage)
    services = [factory.new_service(f"{TOPIC}-partition-{p}") for p in range(partitions)]
    try:
        t0 = time.perf_counter()
        if joint:
            outcomes = factory.compact_together(services)
        else:  # the default of the interface: one run (one Spark job) per partition in turn
            outcomes = CompactionServiceFactory.compact_together(factory, services)
        seconds = time.perf_counter() - t0
        for outcome in outcomes:
            if isinstance(outcome, Exception):
                raise outcome
        jobs = len({s.stats().last_run_job for s in services})
        return seconds, jobs
    finally:
        for s in services:
            s.close()
        factory.close()
        storage.close()
        shutil.rmtree(dst, ignore_errors=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--partitions", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--messages", type=int, default=50_000, help="per partition")
    ap.add_argument("--keys", type=int, default=5_000, help="per partition")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "partitioned.json"))
    args = ap.parse_args(argv)
    from compactmq.compaction.jobs.session import testing_session

    testing_session()  # one warm session for every trial
    work = tempfile.mkdtemp(prefix="cmq-parted-bench-")
    results = []
    try:
        warm = prepare(work, 2, 2_000, 100)
        compact(warm, work, 2, True)
        compact(warm, work, 2, False)
        for n in args.partitions:
            log(f"preparing {n} partitions x {args.messages} messages")
            src = prepare(work, n, args.messages, args.keys)
            times: dict = {"joint": [], "sequential": []}
            jobs: dict = {}
            for t in range(args.trials):
                for mode in ("joint", "sequential") if t % 2 == 0 else ("sequential", "joint"):
                    seconds, used = compact(src, work, n, mode == "joint")
                    times[mode].append(round(seconds, 3))
                    jobs[mode] = used
                    log(f"{n} partitions, {mode}: {seconds:.2f}s ({used} Spark job groups)")
            shutil.rmtree(src, ignore_errors=True)
            joint, seq = statistics.median(times["joint"]), statistics.median(times["sequential"])
            results.append(
                {
                    "partitions": n,
                    "messagesPerPartition": args.messages,
                    "keysPerPartition": args.keys,
                    "jointSeconds": joint,
                    "sequentialSeconds": seq,
                    "speedup": round(seq / joint, 2) if joint else None,
                    "sparkJobGroups": jobs,
                    "trials": times,
                }
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    body = {
        "benchmark": "partitioned topic compaction: one joint Spark job vs one job per partition",
        "spark": "local[2] (the test profile)",
        "loadavg": os.getloadavg(),
        "cpus": os.cpu_count(),
        "results": results,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(body, f, indent=2)
    print(json.dumps(body, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
