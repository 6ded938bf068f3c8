"""The cluster's 30-topic publish phase alone, for several trees and settings, interleaved.

``bench/cluster_bench.py``'s "many topics" phase (``publish_many``: one producer per topic,
batching off, 100 messages in flight each, for a few seconds, on a 16-bundle namespace) is
the one figure of that bench that moved between stops. A whole ``--quick`` run takes about two
minutes and one 5-second sample on a shared machine says little, so this runs ONLY that phase
(and a short synchronous-send probe of the store's latency) for every *variant* in turn, round
after round -- A B C A B C ... -- so every variant sees the same moments of a loaded machine,
and reports per variant the median and every run.

A variant is ``label=SRC:gf`` -- a ``src`` directory (a tree of another commit, unpacked with
``git archive``, its built ``*.so`` copied in; the brokers get it as ``PYTHONPATH``) and
``on``/``off`` for ``objectLedgerGroupFlushEnabled``; ``SRC`` ``.`` is this tree. One
ZooKeeper and one SeaweedFS serve every run (a fresh ZooKeeper chroot and key prefix per run);
three brokers of the variant's tree start for each run and are killed after it.

Per run: messages/s over the phase, the object writes the brokers counted
(``compactmq_object_store_puts_total``, summed), messages per object write, the probe's p50
(``probe_sends`` synchronous sends on a lone topic: the store's PUT + fence round trip), the
brokers' CPU seconds per second of the phase (``/proc/<pid>/stat``: are they CPU-bound?),
the client's, SeaweedFS's and ZooKeeper's, and the 1-minute load average; from the first send
on (the producers' creation left out), per 1,000 messages: object writes, ZooKeeper write
transactions (its ``zxid``, from ``srvr``) and requests of any kind.

    .venv/bin/python bench/cluster_many_ab.py --rounds 3 \\
        --variant a0=/tmp/bis_a0a39a7/src:off --variant head=.:off --out bench/results/x.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cluster_bench as cb  # noqa: E402
import cluster_setup as cs  # noqa: E402  (puts src/, tests/ and bench/ on sys.path)
from cluster_setup import ROOT  # noqa: E402
from standalone import cpu_seconds  # noqa: E402
from storage.metadata_store.zk_server import four_letter  # noqa: E402


def parse_variant(text: str) -> tuple[str, str, bool]:
    label, _, rest = text.partition("=")
    src, _, gf = rest.rpartition(":")
    if not label or not src or gf not in ("on", "off"):
        raise SystemExit(f"--variant {text!r}: want LABEL=SRC:on|off")
    src_dir = ROOT / "src" if src == "." else Path(src).resolve()
    if not (src_dir / "compactmq").is_dir():
        raise SystemExit(f"--variant {text!r}: no compactmq package under {src_dir}")
    return label, str(src_dir), gf == "on"


def which_tree(src: str) -> str:
    """Where a broker started with ``PYTHONPATH=src`` (cwd the repository root, as the
    harness starts it) imports compactmq from: checked, not assumed."""
    env = {**os.environ, "PYTHONPATH": src}
    out = subprocess.run(
        [sys.executable, "-c", "import compactmq; print(compactmq.__file__)"],
        cwd=ROOT, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return out.stdout.strip()


def probe(client, n: int, size: int) -> float:
    """p50 ms of ``n`` synchronous sends (batching off) on a fresh topic, the first excluded."""
    producer = client.create_producer(f"probe-{uuid.uuid4().hex[:6]}", batching_enabled=False)
    payload = b"p" * size
    producer.send(payload)
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        producer.send(payload)
        times.append((time.perf_counter() - t0) * 1000)
    producer.close()
    return round(statistics.median(times), 2)


def zk_counters(zk) -> dict[str, int]:
    """ZooKeeper's own counts (``srvr``): ``zxid`` grows by one per write transaction (a
    ``multi`` is one; session creations and expiries count too), ``received`` by one per
    request of any kind (reads, writes, pings)."""
    out = {}
    for line in four_letter(zk.port, b"srvr").decode().splitlines():
        name, _, value = line.partition(":")
        if name == "Zxid":
            out["zxid"] = int(value.strip(), 16)
        elif name == "Received":
            out["received"] = int(value.strip())
    return out


def one_run(zk, s3, bucket: str, tmp: Path, variant: tuple[str, str, bool], a, run: int) -> dict:
    label, src, gf = variant
    tag = f"r{run}-{label}"
    overrides = cs.cluster_overrides(
        zk, s3, bucket, f"ab-{tag}", tag, 3000, objectLedgerGroupFlushEnabled=str(gf).lower()
    )
    os.environ["PYTHONPATH"] = src  # BrokerProcess passes os.environ on
    with contextlib.ExitStack() as stack:
        brokers = cs.start_brokers(stack, [tmp / tag / f"b{i}" / "data" for i in range(3)], overrides)
        client = cs.new_client(brokers)
        try:
            ns = f"public/many{run}"
            cs.http_json(
                f"{brokers[0].web_url}/admin/v2/namespaces/{ns}", "PUT", {"bundles": {"numBundles": 16}}
            )
            probe_p50 = probe(client, a.probe_sends, a.size)
            topics = [f"persistent://{ns}/t{i}" for i in range(a.topics)]
            at_start: dict = {}

            def started() -> None:  # every producer created: count the sending alone
                at_start["objects"] = [cb.object_counters(b) for b in brokers]
                at_start["zk"] = zk_counters(zk)

            before = [cb.object_counters(b) for b in brokers]
            cpu0 = [cpu_seconds(b.proc.pid) for b in brokers]  # type: ignore[union-attr]
            store0 = (cpu_seconds(s3.process.pid), cpu_seconds(zk.proc.pid))
            me0 = time.process_time()
            got = cb.publish_many(client, topics, a.seconds, a.size, started)
            zk1 = zk_counters(zk)
            cpu1 = [cpu_seconds(b.proc.pid) for b in brokers]  # type: ignore[union-attr]
            store1 = (cpu_seconds(s3.process.pid), cpu_seconds(zk.proc.pid))
            me1 = time.process_time()
            after = [cb.object_counters(b) for b in brokers]
        finally:
            client.close()
    puts = sum(x["puts"] - y["puts"] for x, y in zip(after, before))
    sending_puts = sum(x["puts"] - y["puts"] for x, y in zip(after, at_start["objects"]))
    txns = zk1["zxid"] - at_start["zk"]["zxid"]
    requests = zk1["received"] - at_start["zk"]["received"]
    per_k = 1000 / max(1, got["messages"])
    secs = got["seconds"]
    return {
        "variant": label,
        "round": run,
        "msgs_per_s": got["msgs_per_s"],
        "messages": got["messages"],
        "seconds": secs,
        "object_writes": puts,
        "messages_per_object_write": round(got["messages"] / max(1, puts), 1),
        # from the first send on (the producers' creation left out), per 1,000 messages
        "object_writes_per_1k": round(sending_puts * per_k, 2),
        "zk_transactions_per_1k": round(txns * per_k, 2),
        "zk_requests_per_1k": round(requests * per_k, 2),
        "zk_transactions_per_s": round(txns / secs, 1),
        "probe_p50_ms": probe_p50,
        "broker_cpu_per_s": round((sum(cpu1) - sum(cpu0)) / secs, 3),  # over the phase (creation incl.)
        "client_cpu_per_s": round((me1 - me0) / secs, 3),
        # the object store's (the weed process: master, volume, filer, S3 gateway) and ZooKeeper's
        "seaweedfs_cpu_per_s": round((store1[0] - store0[0]) / secs, 3),
        "zookeeper_cpu_per_s": round((store1[1] - store0[1]) / secs, 3),
        "load_average_1m": cs.load(),
    }


def summary(runs: list[dict], variants: list[tuple[str, str, bool]]) -> dict:
    out = {}
    for label, src, gf in variants:
        mine = [r for r in runs if r["variant"] == label and "error" not in r]
        if not mine:
            out[label] = {"src": src, "group_flush": gf, "runs": 0}
            continue
        med = lambda k: statistics.median(r[k] for r in mine)  # noqa: E731
        out[label] = {
            "src": src,
            "group_flush": gf,
            "runs": len(mine),
            "msgs_per_s_median": med("msgs_per_s"),
            "msgs_per_s": [r["msgs_per_s"] for r in mine],
            "object_writes_median": med("object_writes"),
            "messages_per_object_write_median": med("messages_per_object_write"),
            "object_writes_per_1k_median": med("object_writes_per_1k"),
            "zk_transactions_per_1k_median": med("zk_transactions_per_1k"),
            "zk_requests_per_1k_median": med("zk_requests_per_1k"),
            "zk_transactions_per_s_median": med("zk_transactions_per_s"),
            "probe_p50_ms_median": med("probe_p50_ms"),
            "broker_cpu_per_s_median": med("broker_cpu_per_s"),
            "seaweedfs_cpu_per_s_median": med("seaweedfs_cpu_per_s"),
            "load_average_1m": [r["load_average_1m"] for r in mine],
        }
    first = variants[0][0]
    ok = {(r["variant"], r["round"]): r["msgs_per_s"] for r in runs if "error" not in r}
    rounds = sorted({r["round"] for r in runs})
    for label in out:
        # per round, this variant against the first (same moments of the machine)
        ratios = [
            round(ok[label, n] / ok[first, n], 3) for n in rounds if (label, n) in ok and (first, n) in ok
        ]
        out[label]["vs_first_per_round"] = ratios
        out[label]["vs_first_median"] = round(statistics.median(ratios), 3) if ratios else None
        out[label]["failed_runs"] = sum(1 for r in runs if r["variant"] == label and "error" in r)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variant", action="append", required=True, help="LABEL=SRC:on|off (SRC . = this tree)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5.0, help="the phase's publishing seconds")
    ap.add_argument("--topics", type=int, default=30)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--probe-sends", type=int, default=60)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    variants = [parse_variant(v) for v in a.variant]
    trees = {label: which_tree(src) for label, src, _ in variants}
    cs.log(f"trees: {json.dumps(trees)}")
    started, load_before = time.monotonic(), cs.load()

    def one_run_or_error(zk, s3, bucket: str, tmp: Path, v: tuple[str, str, bool], rnd: int) -> dict:
        try:
            return one_run(zk, s3, bucket, tmp, v, a, rnd)
        except Exception as e:  # noqa: BLE001 - a run that failed is recorded, not fatal
            # (at load 20 a 3 s ZooKeeper session can expire mid-run: bundles move)
            r = {"variant": v[0], "round": rnd, "error": f"{type(e).__name__}: {e}"[:300]}
            r["load_average_1m"] = cs.load()
            return r

    runs = cs.interleaved_runs("cluster-many-ab", variants, a.rounds, one_run_or_error)
    runs.sort(key=lambda r: (r["round"], [v[0] for v in variants].index(r["variant"])))
    results = {
        "what": "cluster_bench's many-topics phase alone, variants interleaved (bench/cluster_many_ab.py)",
        "params": {
            "rounds": a.rounds,
            "seconds": a.seconds,
            "topics": a.topics,
            "message_bytes": a.size,
            "probe_sends": a.probe_sends,
            "brokers": 3,
        },  # fmt: skip
        "trees": trees,
        "summary": summary(runs, variants),
        "runs": runs,
    }
    cs.write_results(a.out, results, started, load_before)
    print(json.dumps(results["summary"], indent=2))


if __name__ == "__main__":
    main()
