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
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import cluster_bench as cb  # noqa: E402  (puts src/, tests/ and bench/ on sys.path)
from cluster_many_ab import parse_variant, which_tree  # noqa: E402
from harness.broker import BrokerProcess  # noqa: E402
from seaweedfs_server import start_seaweedfs, stop_seaweedfs  # noqa: E402
from storage.metadata_store.zk_server import ZooKeeperServer, find_classpath  # noqa: E402


def owner_port(brokers: list[BrokerProcess], topic: str) -> int:
    answer = cb.http_json(f"{brokers[0].web_url}/lookup/v2/topic/{topic.replace('://', '/')}")
    return urlsplit(answer["httpUrl"]).port  # type: ignore[index]


def one_run(zk, s3, bucket: str, tmp: Path, variant: tuple[str, str, bool], a, run: int) -> dict:
    label, src, _ = variant
    tag = f"r{run}-{label}"
    overrides = {
        "metadataStoreUrl": f"zk:{zk.hosts}/stop-{tag}",
        "objectLedgerStorageUrl": f"s3://{bucket}/{tag}?region=us-east-1&endpoint={s3.endpoint}",
        "metadataStoreSessionTimeoutMillis": "30000",  # only the stop's own release frees bundles
        "loadBalancerReportUpdateMinIntervalMillis": "300",
    }
    os.environ["PYTHONPATH"] = src
    brokers = [BrokerProcess(tmp / tag / f"b{i}" / "data", overrides) for i in range(3)]
    try:
        for b in brokers:
            b.data_dir.parent.mkdir(parents=True)
            b.start(cb.START_TIMEOUT_S)
        ns = f"public/stop{run}"
        cb.http_json(
            f"{brokers[0].web_url}/admin/v2/namespaces/{ns}", "PUT", {"bundles": {"numBundles": a.bundles}}
        )
        topics = [f"persistent://{ns}/t{i}" for i in range(a.topics)]
        client = cb.new_client(brokers)
        try:
            producers = [client.create_producer(t, batching_enabled=False) for t in topics]
            for p in producers:
                for _ in range(a.messages):
                    p.send_async(b"s" * 100, None)
            for p in producers:
                p.flush()
            owners = {t: owner_port(brokers, t) for t in topics}
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
    finally:
        for b in brokers:
            b.stop(signal.SIGKILL)
    return {
        "variant": label,
        "round": run,
        "topics_on_leaving_broker": len(mine),
        "stop_seconds": round(stop_s, 3),
        "exit_code": rc,
        "all_moved_seconds": round(moved_s, 3),
        "load_average_1m": cb.load(),
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
    cb.log(f"trees: {json.dumps(trees)}")
    started, load_before = time.monotonic(), cb.load()
    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="cluster-stop-") as tmpdir, contextlib.ExitStack() as stack:
        tmp = Path(tmpdir)
        zk = ZooKeeperServer(tmp / "zk", find_classpath() or sys.exit("ZooKeeper not installed")).start()
        stack.callback(zk.stop)
        s3 = start_seaweedfs()
        stack.callback(stop_seaweedfs, s3)
        bucket = s3.create_bucket("cluster-stop")
        for rnd in range(a.rounds):
            for v in variants if rnd % 2 == 0 else variants[::-1]:
                r = one_run(zk, s3, bucket, tmp, v, a, rnd)
                runs.append(r)
                cb.log(f"  {json.dumps(r)}")
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
        "load_average_before": load_before,
        "load_average_after": cb.load(),
        "cpus": os.cpu_count(),
        "seconds": round(time.monotonic() - started, 1),
    }
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
