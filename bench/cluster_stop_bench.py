"""A graceful stop of one cluster broker: how long it takes to hand its bundles back.

A rolling restart stops each broker in turn (SIGTERM); the broker first unloads every bundle it
owns (``ClusterService.release_all``: close and seal each topic, revoke the fence, release the
ownership key) so that its clients move on at once. This measures that stop for several trees,
interleaved round by round as ``cluster_many_ab.py`` does (same variant syntax, ``label=SRC``;
the group flush is on, the default): per run, three brokers of the variant's tree, ``topics``
topics of a ``bundles``-bundle namespace each given ``messages`` messages (so each has an open
ledger to seal), then SIGTERM to the broker owning the most of them, timed until its process
exits; then the time until every one of its topics takes a publish on another broker.

    .venv/bin/python bench/cluster_stop_bench.py --rounds 3 --variant before=/tmp/x/src \\
        --variant after=. --out bench/results/cluster_stop.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cluster_setup as cs  # noqa: E402  (puts src/, tests/ and bench/ on sys.path)
from cluster_many_ab import parse_variant, which_tree  # noqa: E402


def one_run(zk, s3, bucket: str, tmp: Path, variant: tuple[str, str, bool], a, run: int) -> dict:
    label, src, _ = variant
    tag = f"r{run}-{label}"
    # a 30 s session: only the stop's own release frees bundles
    overrides = cs.cluster_overrides(zk, s3, bucket, f"stop-{tag}", tag, 30000)
    os.environ["PYTHONPATH"] = src
    with contextlib.ExitStack() as stack:
        brokers = cs.start_brokers(stack, [tmp / tag / f"b{i}" / "data" for i in range(3)], overrides)
        ns = f"public/stop{run}"
        cs.http_json(
            f"{brokers[0].web_url}/admin/v2/namespaces/{ns}", "PUT", {"bundles": {"numBundles": a.bundles}}
        )
        topics = [f"persistent://{ns}/t{i}" for i in range(a.topics)]
        client = cs.new_client(brokers)
        try:
            producers = [client.create_producer(t, batching_enabled=False) for t in topics]
            for p in producers:
                for _ in range(a.messages):
                    p.send_async(b"s" * 100, None)
            for p in producers:
                p.flush()
            owners = {t: cs.owner(brokers, t).web_port for t in topics}
            by_port = {b.web_port: b for b in brokers}
            port = max(by_port, key=lambda q: sum(1 for o in owners.values() if o == q))
            leaving = by_port[port]
            mine = [t for t, o in owners.items() if o == port]
            t0 = time.perf_counter()
            rc = leaving.stop(signal.SIGTERM, timeout=120)
            stop_s = time.perf_counter() - t0
            # every topic it had takes a publish again (the producers reconnect on their own)
            for t in mine:
                producers[topics.index(t)].send(b"after")
            moved_s = time.perf_counter() - t0
            for p in producers:
                p.close()
        finally:
            client.close()
    return {
        "variant": label,
        "round": run,
        "topics_on_leaving_broker": len(mine),
        "stop_seconds": round(stop_s, 3),
        "exit_code": rc,
        "all_moved_seconds": round(moved_s, 3),
        "load_average_1m": cs.load(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variant", action="append", required=True, help="LABEL=SRC (SRC . = this tree)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--topics", type=int, default=60)
    ap.add_argument("--bundles", type=int, default=16)
    ap.add_argument("--messages", type=int, default=20)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    variants = [parse_variant(v if v.endswith((":on", ":off")) else v + ":on") for v in a.variant]
    trees = {label: which_tree(src) for label, src, _ in variants}
    cs.log(f"trees: {json.dumps(trees)}")
    started, load_before = time.monotonic(), cs.load()
    runs = cs.interleaved_runs(
        "cluster-stop",
        variants,
        a.rounds,
        lambda zk, s3, bucket, tmp, v, rnd: one_run(zk, s3, bucket, tmp, v, a, rnd),
    )
    summary = {}
    for label, _src, _ in variants:
        mine = [r for r in runs if r["variant"] == label]
        summary[label] = {
            "stop_seconds_median": statistics.median(r["stop_seconds"] for r in mine),
            "stop_seconds": [r["stop_seconds"] for r in mine],
            "all_moved_seconds_median": statistics.median(r["all_moved_seconds"] for r in mine),
            "topics_on_leaving_broker": [r["topics_on_leaving_broker"] for r in mine],
        }
    results = {
        "what": "graceful stop (SIGTERM) of the cluster broker owning the most topics (bench/cluster_stop_bench.py)",
        "params": {"rounds": a.rounds, "topics": a.topics, "bundles": a.bundles, "messages": a.messages},
        "trees": trees,
        "summary": summary,
        "runs": runs,
    }
    cs.write_results(a.out, results, started, load_before)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
