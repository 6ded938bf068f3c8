"""Cluster mode against one broker, in one run: publish, object writes, topic spread, failover.

Two set-ups, one after the other, driven by the official ``pulsar-client``:

* **single node**: one ``compactmq standalone`` with the defaults (ledgers on its local disk);
* **cluster**: three ``compactmq standalone`` processes sharing a real ZooKeeper (the tests'
  ``tests/storage/metadata_store/zk_server.py``, ``metadataStoreUrl=zk:...``) and a SeaweedFS
  bucket (``tests/seaweedfs_server.py``, ``objectLedgerStorageUrl=s3://...``): entries are
  acknowledged once they are in the object store, fenced by the bundle's epoch. The client is
  given all three brokers in its service URL.

Measured on each (same client code, same message size):

* **publish throughput**: one producer, batching on, ``send_async`` of ``messages`` messages
  until every receipt is back (messages/s, MiB/s);
* **publish latency**: one producer, batching off, ``latency_sends`` synchronous sends, each
  timed from ``send`` to its receipt (p50, p99, mean, max in ms);
* **many topics**: ``many_topics`` producers (batching off, 100 messages in flight each) on as
  many topics of a 16-bundle namespace, for ``many_seconds``: messages/s, and on the cluster
  the object writes that load costs;

and on the cluster only:

* **object writes**: what the brokers actually PUT -- each broker's
  ``compactmq_object_store_puts_total`` (``/metrics``; counted by ``offload.blobstore`` on every
  completed upload) before and after each publish phase, summed over the brokers, per second of
  the phase (with the group flush, the default: flushes of several topics that wait during a
  write share one object, their ranges committed in ZooKeeper); and **objects per GB** stored: the bucket as
  SeaweedFS lists it (boto3, not the code under test) after publishing, then again after
  every namespace is unloaded (the ledgers sealed and their flush objects merged; shared
  objects counted as ``group_shared``). GB = 10^9 bytes;
* **spread**: ``topics`` topic names in ``public/default`` (``defaultNumberOfNamespaceBundles``
  bundles) and in a namespace of ``--spread-bundles`` bundles, each looked up over HTTP
  (``/lookup/v2/topic``, the askers taking turns); the owner from each answer, counted per broker;
* **failover**: ``bench/cluster_failover_bench.py``'s ``measure_failovers`` (imported): ``kills``
  SIGKILLs of a topic's owner, each timed to the first successful publish on the new owner,
  deduplication on for that topic's namespace, the whole topic read back (lost, duplicated).

Everything shares the machine (client, brokers, ZooKeeper, SeaweedFS), so the figures compare
the two set-ups on it, not what a real deployment does; the load average is recorded at each
step (``os.getloadavg``). Writes ``bench/results/cluster.json`` (``--out``) and draws
``cluster.png`` beside it (``bench/plot.py``'s ``plot_cluster``; needs matplotlib).

    .venv/bin/python bench/cluster_bench.py --quick   # about 1 to 2 minutes: 20,000 messages, 3 kills
    .venv/bin/python bench/cluster_bench.py           # about 4-5 minutes: 200,000 messages, 10 kills
    .venv/bin/python bench/cluster_bench.py --quick --no-group-flush   # the cluster without the group flush
    .venv/bin/python bench/cluster_bench.py --quick --compare-group-flush   # publish only, both clusters at once: off vs on
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pulsar  # noqa: E402
from cluster_failover_bench import measure_failovers  # noqa: E402
from cluster_setup import (  # noqa: E402  (puts src/, tests/ and bench/ on sys.path)
    ROOT,
    START_TIMEOUT_S,
    cluster_overrides,
    http_json,
    load,
    log,
    new_client,
    start_brokers,
    start_stores,
    write_results,
)
from harness.broker import BrokerProcess  # noqa: E402
from harness.http import object_store_counters  # noqa: E402

MODES = {
    "quick": {
        "messages": 20_000,
        "latency_sends": 300,
        "many_topics": 30,
        "many_seconds": 5,
        "topics": 300,
        "kills": 3,
    },
    "full": {
        "messages": 200_000,
        "latency_sends": 3_000,
        "many_topics": 30,
        "many_seconds": 30,
        "topics": 300,
        "kills": 10,
    },
}
BUCKET = "cluster-bench"


# --- publishing ------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (nearest rank) of ``values``."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


def publish_throughput(client, topic: str, n: int, size: int) -> dict:
    producer = client.create_producer(
        topic, batching_enabled=True, batching_max_messages=1000, batching_max_publish_delay_ms=5,
        max_pending_messages=10000, block_if_queue_full=True,
    )  # fmt: skip
    payload = b"x" * size
    failures: list = []

    def done(res, _mid) -> None:
        if res != pulsar.Result.Ok:
            failures.append(str(res))

    t0 = time.perf_counter()
    for _ in range(n):
        producer.send_async(payload, done)
    producer.flush()
    secs = time.perf_counter() - t0
    producer.close()
    if failures:
        raise SystemExit(f"{len(failures)} of {n} sends failed: {failures[:3]}")
    return {
        "messages": n,
        "message_bytes": size,
        "seconds": round(secs, 3),
        "msgs_per_s": round(n / secs),
        "mib_per_s": round(n * size / secs / 2**20, 2),
    }


def publish_latency(client, topic: str, n: int, size: int) -> dict:
    producer = client.create_producer(topic, batching_enabled=False)
    payload = b"y" * size
    producer.send(payload)  # the first send pays for the connection and the topic's load
    times = []
    t_all = time.perf_counter()
    for _ in range(n):
        t0 = time.perf_counter()
        producer.send(payload)
        times.append((time.perf_counter() - t0) * 1000)
    secs = time.perf_counter() - t_all
    producer.close()
    return {
        "sends": n,
        "seconds": round(secs, 3),
        "p50_ms": round(percentile(times, 50), 3),
        "p99_ms": round(percentile(times, 99), 3),
        "mean_ms": round(statistics.fmean(times), 3),
        "max_ms": round(max(times), 3),
    }


def publish_many(client, topics: list[str], seconds: float, size: int, started=None) -> dict:
    """One producer per topic (batching off, at most 100 messages in flight each), sending in
    turn for ``seconds``: what the store sees when many topics publish at once. ``started()``,
    if given, is called once every producer exists, just before the first send (a caller counts
    from there, the topics' creation left out)."""
    producers = [
        client.create_producer(t, batching_enabled=False, max_pending_messages=100, block_if_queue_full=True)
        for t in topics
    ]
    payload = b"z" * size
    acked, failures = [0], []

    def done(res, _mid) -> None:
        if res == pulsar.Result.Ok:
            acked[0] += 1
        else:
            failures.append(str(res))

    if started is not None:
        started()
    t0 = time.perf_counter()
    sent = 0
    while time.perf_counter() - t0 < seconds:
        for producer in producers:
            producer.send_async(payload, done)
        sent += len(producers)
    for producer in producers:
        producer.flush()
    secs = time.perf_counter() - t0
    for producer in producers:
        producer.close()
    if failures:
        raise SystemExit(f"{len(failures)} of {sent} sends failed: {failures[:3]}")
    return {
        "topics": len(topics),
        "messages": acked[0],
        "seconds": round(secs, 3),
        "msgs_per_s": round(acked[0] / secs),
    }


def publish_phases(brokers: list[BrokerProcess], p: dict, size: int, counted=None) -> dict:
    """Throughput, latency, then many topics at once, on fresh topics (the last in a namespace of
    16 bundles, so that they spread); ``counted(phase, fn)`` wraps each (the cluster counts object
    writes around it)."""
    client = new_client(brokers)
    tag = uuid.uuid4().hex[:6]
    counted = counted or (lambda _phase, fn: (fn(), {}))
    ns = f"public/many{tag}"
    http_json(f"{brokers[0].web_url}/admin/v2/namespaces/{ns}", "PUT", {"bundles": {"numBundles": 16}})
    many = [f"persistent://{ns}/t{i}" for i in range(p["many_topics"])]
    try:
        out = {}
        for phase, fn in (
            ("throughput", lambda: publish_throughput(client, f"bench-tput-{tag}", p["messages"], size)),
            ("latency", lambda: publish_latency(client, f"bench-lat-{tag}", p["latency_sends"], size)),
            ("many_topics", lambda: publish_many(client, many, p["many_seconds"], size)),
        ):
            result, extra = counted(phase, fn)
            out[phase] = {**result, **extra, "load_average_1m": load()}
            log(f"  {phase}: {json.dumps(out[phase])}")
        return out
    finally:
        client.close()


# --- object counts ---------------------------------------------------------------------------


def object_counters(b: BrokerProcess) -> dict[str, int]:
    """The broker's ``compactmq_object_store_*`` counters from its ``/metrics``."""
    out = object_store_counters(b)
    if len(out) != 3:
        raise SystemExit(f"broker {b.web_url} exports no compactmq_object_store_* counters")
    return out


def counted_by(brokers: list[BrokerProcess]):
    def counted(_phase: str, fn):
        before = [object_counters(b) for b in brokers]
        t0 = time.perf_counter()
        result = fn()
        secs = time.perf_counter() - t0
        after = [object_counters(b) for b in brokers]
        puts = sum(a["puts"] - b["puts"] for a, b in zip(after, before))
        put_bytes = sum(a["put_bytes"] - b["put_bytes"] for a, b in zip(after, before))
        return result, {
            "phase_seconds": round(secs, 3),  # producers' creation included, as in the counts
            "object_writes": puts,
            "object_writes_per_s": round(puts / secs, 1),
            "object_bytes_written": put_bytes,
            "messages_per_object_write": round(
                result.get("messages", result.get("sends", 0)) / max(1, puts), 1
            ),
        }

    return counted


def stored_objects(s3, bucket: str, prefix: str) -> dict:
    """The bucket under ``prefix`` as SeaweedFS lists it: objects, bytes, objects per GB, and the
    objects per kind (ledger flush ``f-``, merged ``m-``, ``index``, anything else)."""
    import boto3

    client = boto3.client("s3", endpoint_url=s3.endpoint, region_name="us-east-1")
    count = size = 0
    kinds = {"ledger_flush": 0, "ledger_merged": 0, "ledger_index": 0, "group_shared": 0, "other": 0}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for o in page.get("Contents", []):
            if o["Key"].endswith("/"):
                continue  # pyarrow's directory markers are not objects
            count += 1
            size += int(o["Size"])
            name = o["Key"].rsplit("/", 1)[1]
            ledger = "/ledgers/" in "/" + o["Key"]
            kind = (
                "ledger_flush" if ledger and name.startswith("f-") else
                "ledger_merged" if ledger and name.startswith("m-") else
                "ledger_index" if ledger and name == "index" else
                "group_shared" if "/groups/" in "/" + o["Key"] else "other"
            )  # fmt: skip
            kinds[kind] += 1
    return {
        "objects": count,
        "bytes": size,
        "objects_per_gb": round(count / (size / 1e9), 1) if size else None,
        "by_kind": kinds,
    }


def sealed_objects(brokers, s3, bucket: str, prefix: str, timeout: float = 60.0) -> dict:
    """Unload every namespace of ``public`` (every topic closes, its ledger is sealed), wait
    until the merges left no flush object (or ``timeout``), and list the bucket again."""
    for ns in http_json(f"{brokers[0].web_url}/admin/v2/namespaces/public"):  # type: ignore[union-attr]
        http_json(f"{brokers[0].web_url}/admin/v2/namespaces/{ns}/unload", "PUT")
    deadline = time.monotonic() + timeout
    got = stored_objects(s3, bucket, prefix)
    unmerged = ("ledger_flush", "group_shared")
    while any(got["by_kind"][k] for k in unmerged) and time.monotonic() < deadline:
        time.sleep(1.0)
        got = stored_objects(s3, bucket, prefix)
    got["merges_settled"] = not any(got["by_kind"][k] for k in unmerged)
    return got


# --- spread ----------------------------------------------------------------------------------


def spread(brokers: list[BrokerProcess], namespace: str, topics: int) -> dict:
    by_port = {b.web_port: i for i, b in enumerate(brokers)}
    counts = [0] * len(brokers)
    t0 = time.perf_counter()
    for i in range(topics):
        asker = brokers[i % len(brokers)]
        answer = http_json(f"{asker.web_url}/lookup/v2/topic/persistent/{namespace}/spread-{i}")
        counts[by_port[urlsplit(answer["httpUrl"]).port]] += 1  # type: ignore[index]
    secs = time.perf_counter() - t0
    bundles = http_json(f"{brokers[0].web_url}/admin/v2/namespaces/{namespace}/bundles")
    return {
        "namespace": namespace,
        "bundles": bundles["numBundles"],  # type: ignore[index]
        "topics": topics,
        "topics_per_broker": counts,
        "lookups_per_s": round(topics / secs, 1),
    }


# --- the two set-ups -------------------------------------------------------------------------


def single_node(tmp: Path, p: dict, size: int) -> dict:
    log("single node (defaults, local disk)")
    (tmp / "single").mkdir()
    broker = BrokerProcess(tmp / "single" / "data")
    broker.start(START_TIMEOUT_S)
    try:
        return publish_phases([broker], p, size)
    finally:
        broker.stop()


def start_cluster(stack: contextlib.ExitStack, tmp: Path, session_ms: int, group_flush: bool):
    """ZooKeeper, a SeaweedFS bucket and three brokers, stopped when ``stack`` closes; returns
    (brokers, s3 server, bucket, key prefix)."""
    log(f"cluster: ZooKeeper, SeaweedFS, 3 brokers (group flush {'on' if group_flush else 'off'})")
    tag = "gf" if group_flush else "b"
    zk, s3 = start_stores(stack, tmp / f"zk-{tag}")
    bucket = s3.create_bucket(BUCKET)
    prefix = uuid.uuid4().hex[:8]
    overrides = cluster_overrides(
        zk, s3, bucket, "bench", prefix, session_ms, objectLedgerGroupFlushEnabled=str(group_flush).lower()
    )
    brokers = start_brokers(stack, [tmp / f"{tag}{i}" / "data" for i in range(3)], overrides)
    return brokers, s3, bucket, prefix


def cluster(
    tmp: Path,
    p: dict,
    size: int,
    session_ms: int,
    spread_bundles: int,
    group_flush: bool = False,
) -> dict:
    with contextlib.ExitStack() as stack:
        brokers, s3, bucket, prefix = start_cluster(stack, tmp, session_ms, group_flush)
        out: dict = {"session_timeout_ms": session_ms, "load_average_at_start": load()}
        out.update(publish_phases(brokers, p, size, counted_by(brokers)))
        out["stored_after_publish"] = stored_objects(s3, bucket, prefix)
        out["stored_after_unload"] = sealed_objects(brokers, s3, bucket, prefix)
        log(f"  stored: {out['stored_after_publish']} / sealed: {out['stored_after_unload']}")
        ns = f"public/spread{spread_bundles}"
        http_json(
            f"{brokers[0].web_url}/admin/v2/namespaces/{ns}",
            "PUT",
            {"bundles": {"numBundles": spread_bundles}},
        )
        out["spread"] = [spread(brokers, "public/default", p["topics"]), spread(brokers, ns, p["topics"])]
        log(f"  spread: {out['spread']}")
        http_json(
            f"{brokers[0].web_url}/admin/v2/namespaces/public/failover", "PUT", {"bundles": {"numBundles": 1}}
        )
        http_json(f"{brokers[0].web_url}/admin/v2/namespaces/public/failover/deduplication", "POST", True)
        out["failover"] = {
            **measure_failovers(brokers, p["kills"], "persistent://public/failover/failover-bench"),
            "kills": p["kills"],
            "load_average_1m": load(),
        }
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="about 2 minutes: fewer messages and kills")
    ap.add_argument("--size", type=int, default=100, help="message bytes")
    ap.add_argument("--session-ms", type=int, default=3000, help="metadataStoreSessionTimeoutMillis")
    ap.add_argument("--spread-bundles", type=int, default=16, help="bundles of the second spread namespace")
    ap.add_argument(
        "--group-flush",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="objectLedgerGroupFlushEnabled on the cluster (the default; --no-group-flush: one object per "
        "ledger per flush)",
    )
    ap.add_argument(
        "--compare-group-flush",
        action="store_true",
        help="only the cluster's publish phases, group flush off then on, back to back (writes "
        "cluster_<mode>_gf_compare.json unless --out)",
    )
    ap.add_argument("--on-first", action="store_true", help="with --compare-group-flush: on, then off")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    mode = "quick" if a.quick else "full"
    p = MODES[mode]
    if a.compare_group_flush:
        compare_group_flush(a, mode, p)
        return
    a.out = a.out or str(ROOT / "bench" / "results" / "cluster.json")
    started, load_before = time.monotonic(), load()
    with tempfile.TemporaryDirectory(prefix=f"cluster-bench-{uuid.uuid4().hex[:6]}-") as tmp:
        single = single_node(Path(tmp), p, a.size)
        clustered = cluster(Path(tmp), p, a.size, a.session_ms, a.spread_bundles, a.group_flush)
    results = {
        "mode": mode,
        "params": {
            **p,
            "message_bytes": a.size,
            "brokers": 3,
            "session_timeout_ms": a.session_ms,
            "group_flush": a.group_flush,
        },
        "single_node": single,
        "cluster": clustered,
        "cluster_vs_single": {
            "throughput_ratio": round(
                clustered["throughput"]["msgs_per_s"] / single["throughput"]["msgs_per_s"], 3
            ),
            "many_topics_ratio": round(
                clustered["many_topics"]["msgs_per_s"] / single["many_topics"]["msgs_per_s"], 3
            ),
            "latency_p50_ratio": round(clustered["latency"]["p50_ms"] / single["latency"]["p50_ms"], 2),
            "latency_p99_ratio": round(clustered["latency"]["p99_ms"] / single["latency"]["p99_ms"], 2),
        },
    }
    write_results(a.out, results, started, load_before)
    out = Path(a.out)
    print(json.dumps(results, indent=2))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import plot
    except ImportError as e:  # matplotlib missing (the bench extra): the JSON is the result
        log(f"no plot: {e}")
        return
    plot.plot_cluster(plt, results, out.stem)


def latency_interleaved(clusters: dict[str, list[BrokerProcess]], n: int, size: int, block: int = 25) -> dict:
    """A lone producer on each cluster (batching off, synchronous sends), taking turns in blocks
    of ``block`` sends, ``n`` each: both see the same moments of a loaded machine."""
    clients = {name: new_client(brokers) for name, brokers in clusters.items()}
    try:
        topic = f"bench-interleaved-{uuid.uuid4().hex[:6]}"
        producers = {name: c.create_producer(topic, batching_enabled=False) for name, c in clients.items()}
        payload = b"y" * size
        times: dict[str, list[float]] = {name: [] for name in clusters}
        for producer in producers.values():
            producer.send(payload)  # the connection and the topic's load
        while any(len(t) < n for t in times.values()):
            for name, producer in producers.items():
                for _ in range(min(block, n - len(times[name]))):
                    t0 = time.perf_counter()
                    producer.send(payload)
                    times[name].append((time.perf_counter() - t0) * 1000)
        for producer in producers.values():
            producer.close()
    finally:
        for c in clients.values():
            c.close()
    out = {
        name: {
            "sends": len(t),
            "block": block,
            "p50_ms": round(percentile(t, 50), 3),
            "p99_ms": round(percentile(t, 99), 3),
            "mean_ms": round(statistics.fmean(t), 3),
            "max_ms": round(max(t), 3),
            "load_average_1m": load(),
        }
        for name, t in times.items()
    }
    log(f"  latency, interleaved: {json.dumps(out)}")
    return out


def throughput_interleaved(
    clusters: dict[str, list[BrokerProcess]], n: int, size: int, turns: int = 3
) -> dict:
    """``publish_throughput`` on each cluster in turn, ``turns`` times (a fresh topic each):
    the median and every run's messages/s."""
    clients = {name: new_client(brokers) for name, brokers in clusters.items()}
    runs: dict[str, list[int]] = {name: [] for name in clusters}
    try:
        for turn in range(turns):
            for name, client in clients.items():
                topic = f"bench-tput-turn{turn}-{uuid.uuid4().hex[:6]}"
                runs[name].append(publish_throughput(client, topic, n, size)["msgs_per_s"])
    finally:
        for c in clients.values():
            c.close()
    out = {
        name: {"median_msgs_per_s": statistics.median(r), "msgs_per_s": r, "load_average_1m": load()}
        for name, r in runs.items()
    }
    log(f"  throughput, interleaved: {json.dumps(out)}")
    return out


def compare_group_flush(a: argparse.Namespace, mode: str, p: dict) -> None:
    """The cluster's publish phases with ``objectLedgerGroupFlushEnabled`` off, then on, in one
    run (a loaded machine moves between two runs more than the two set-ups differ): both
    clusters run at once; first a lone producer on each takes turns (``latency_interleaved``),
    then each cluster's phases one after the other; each phase's figures and the on/off ratios."""
    started, load_before = time.monotonic(), load()
    runs: dict[str, dict] = {}
    order = (("on", True), ("off", False)) if a.on_first else (("off", False), ("on", True))
    with tempfile.TemporaryDirectory(prefix=f"cluster-bench-{uuid.uuid4().hex[:6]}-") as tmp:
        with contextlib.ExitStack() as stack:
            clusters = {name: start_cluster(stack, Path(tmp), a.session_ms, on) for name, on in order}
            both = {name: c[0] for name, c in clusters.items()}
            interleaved = latency_interleaved(both, p["latency_sends"], a.size)
            tput_turns = throughput_interleaved(both, p["messages"], a.size)
            for name, _on in order:
                brokers, s3, bucket, prefix = clusters[name]
                log(f"publish phases, group flush {name}")
                runs[name] = {"load_average_at_start": load()}
                runs[name].update(publish_phases(brokers, p, a.size, counted_by(brokers)))
                runs[name]["latency_interleaved"] = interleaved[name]
                runs[name]["throughput_interleaved"] = tput_turns[name]
                runs[name]["stored_after_publish"] = stored_objects(s3, bucket, prefix)
                runs[name]["stored_after_unload"] = sealed_objects(brokers, s3, bucket, prefix)
    off, on = runs["off"], runs["on"]

    def ratio(phase: str, key: str) -> float | None:
        x, y = off[phase].get(key), on[phase].get(key)
        return round(y / x, 3) if x and y is not None else None

    results = {
        "mode": mode,
        "params": {
            **p,
            "message_bytes": a.size,
            "brokers": 3,
            "session_timeout_ms": a.session_ms,
            "order": "on, off" if a.on_first else "off, on",
        },
        "group_flush_off": off,
        "group_flush_on": on,
        "on_vs_off": {
            "throughput_msgs_ratio": ratio("throughput", "msgs_per_s"),
            "many_topics_msgs_ratio": ratio("many_topics", "msgs_per_s"),
            "many_topics_object_writes_ratio": ratio("many_topics", "object_writes"),
            "many_topics_messages_per_write_ratio": ratio("many_topics", "messages_per_object_write"),
            "throughput_object_writes_ratio": ratio("throughput", "object_writes"),
            "latency_p50_ratio": ratio("latency", "p50_ms"),
            "latency_p99_ratio": ratio("latency", "p99_ms"),
            "latency_mean_ratio": ratio("latency", "mean_ms"),
            "interleaved_latency_p50_ratio": ratio("latency_interleaved", "p50_ms"),
            "interleaved_latency_p99_ratio": ratio("latency_interleaved", "p99_ms"),
            "interleaved_latency_mean_ratio": ratio("latency_interleaved", "mean_ms"),
            "interleaved_throughput_median_ratio": ratio("throughput_interleaved", "median_msgs_per_s"),
        },
    }
    write_results(
        a.out or ROOT / "bench" / "results" / f"cluster_{mode}_gf_compare.json", results, started, load_before
    )
    print(json.dumps(results["on_vs_off"], indent=2))


if __name__ == "__main__":
    main()
