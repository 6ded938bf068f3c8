"""The latest value of a key from the broker (``GET .../latest/{key}``) while a producer publishes.

Starts ``compactmq standalone`` on free ports with a fresh data directory, then:

1. publishes ``--messages`` x (1 - ``--tail``) messages of ``--size`` bytes over ``--keys`` keys
   (key ``i % keys``) with the official client, batching on;
2. compacts the topic once, in this process, as ``compact-topic`` does (the broker seals its
   ledger; Spark ``local[2]``), so the view has its key sidecar;
3. publishes the remaining ``--tail`` fraction (the uncompacted tail: updates of random keys);
4. starts a second process publishing keyed updates at ``--rate`` messages/s with the official
   client (it keeps publishing through the measurement), asks one key cold (building the view's
   key index and the tail index: ``first_lookup_ms``), then times ``--lookups`` GETs of uniformly
   random keys on one keep-alive HTTP connection, and ``--batches`` POSTs of ``--batch-keys`` keys.

Every answer is checked: the value names its message number, which must be a message of that
key (``i % keys == key``). Reported: per-GET latency percentiles (p50, p90, p99, max) in ms,
per-key time of the POSTs, the producer's achieved rate, the broker's CPU seconds during the
lookups, and the topic's ``latestValue`` stats (index sizes, whether the tail overflowed).

    .venv/bin/python bench/latest_value_bench.py --full                # 10,000,000 messages, 1,000,000 keys
    .venv/bin/python bench/latest_value_bench.py --quick --out bench/results/latest_value_quick.json
The default sizes are the full ones (``--full`` says so explicitly: the 10 M / 1 M / 1 % tail the
goal is stated at); ``--quick`` is 200,000 messages over 20,000 keys and 5,000 GETs. ``goal_met``
in the JSON compares p50 and p99 with the goal, and says whether the run was at the goal's scale.
Writes bench/results/latest_value.json (``--out`` to change); progress lines go to stderr;
``bench/plot.py`` draws the GET latency percentiles against the goal (latest_value.png).
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

sys.path.insert(0, str(Path(__file__).resolve().parent))
from read_compacted_bench import RETENTION_OVERRIDES, _client_version, compact, publish  # noqa: E402
from standalone import ROOT, StandaloneBroker  # noqa: E402

TOPIC = "persistent://public/default/latest-bench"
PATH = "/admin/v2/persistent/public/default/latest-bench"


def progress(text: str) -> None:
    print(f"[latest_value_bench {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def publish_tail(url: str, first: int, n: int, keys: int, size: int, seed: int) -> None:
    """``n`` updates of random keys, message numbers from ``first`` (value ``%011d|`` + pad)."""
    import pulsar

    c = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    p = c.create_producer(TOPIC, batching_max_publish_delay_ms=10, block_if_queue_full=True)
    rng = random.Random(seed)
    pad = b"x" * max(0, size - 12)
    for i in range(first, first + n):
        k = rng.randrange(keys)
        i = i - (i % keys) + k  # a message number of key k
        p.send_async(b"%011d|" % i + pad, None, partition_key=f"key-{k}")
    p.flush()
    p.close()
    c.close()


def background_publisher(url: str, keys: int, size: int, rate: int, stop, counter) -> None:
    """Publish updates of random keys at ``rate`` messages/s until ``stop`` is set."""
    import pulsar

    c = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    p = c.create_producer(TOPIC, batching_max_publish_delay_ms=5, block_if_queue_full=True)
    rng = random.Random(7)
    pad = b"x" * max(0, size - 12)
    t0 = time.perf_counter()
    sent = 0
    while not stop.is_set():
        due = int((time.perf_counter() - t0) * rate)
        while sent < due:
            k = rng.randrange(keys)
            i = k + keys * (1000 + sent % 1000)  # a message number of key k (checked by ``check``)
            p.send_async(b"%011d|" % i + pad, None, partition_key=f"key-{k}")
            sent += 1
        time.sleep(0.002)
    p.flush()
    counter.value = sent
    p.close()
    c.close()


def get(conn: http.client.HTTPConnection, key: str) -> tuple[float, int, dict]:
    t0 = time.perf_counter()
    conn.request("GET", f"{PATH}/latest/{quote(key, safe='')}")
    resp = conn.getresponse()
    body = json.loads(resp.read())
    return (time.perf_counter() - t0) * 1000, resp.status, body


def post(conn: http.client.HTTPConnection, keys: list[str]) -> tuple[float, list]:
    data = json.dumps(keys).encode()
    t0 = time.perf_counter()
    conn.request("POST", f"{PATH}/latest", body=data, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    body = json.loads(resp.read())
    if resp.status != 200:
        raise RuntimeError(f"POST answered {resp.status}: {body}")
    return (time.perf_counter() - t0) * 1000, body


def check(answer: dict, keys: int) -> None:
    import base64

    k = int(answer["key"].split("-")[1])
    i = int(base64.b64decode(answer["value"])[:11])
    if i % keys != k:
        raise RuntimeError(f"{answer['key']} answered message {i}, which is not one of its messages")


def percentiles(ms: list[float]) -> dict:
    s = sorted(ms)

    def pct(p: float) -> float:
        return round(s[min(len(s) - 1, int(p * len(s)))], 3)

    return {
        "count": len(s),
        "cdf_ms": {str(p): pct(p / 100) for p in (1, 5, 10, 25, 50, 75, 90, 95, 99, 99.9)},
        "p50_ms": pct(0.50),
        "p90_ms": pct(0.90),
        "p99_ms": pct(0.99),
        "max_ms": round(s[-1], 3),
        "mean_ms": round(sum(s) / len(s), 3),
    }


def measure(broker, a, rng: random.Random) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", broker.web_port, timeout=120)
    ms, status, body = get(conn, f"key-{rng.randrange(a.keys)}")
    if status != 200:
        raise RuntimeError(f"the first lookup answered {status}: {body}")
    first_ms = ms
    progress(f"first (cold) lookup {first_ms:.1f} ms; timing {a.lookups} GETs")
    cpu0 = broker.cpu()
    lat = []
    t0 = time.perf_counter()
    for n in range(a.lookups):
        ms, status, body = get(conn, f"key-{rng.randrange(a.keys)}")
        if status != 200:
            raise RuntimeError(f"a lookup answered {status}: {body}")
        check(body, a.keys)
        lat.append(ms)
        if (n + 1) % max(1, a.lookups // 5) == 0:
            progress(f"{n + 1} GETs, p50 so far {percentiles(lat)['p50_ms']} ms")
    get_secs = time.perf_counter() - t0
    cpu_get = broker.cpu() - cpu0
    batch_ms = []
    for _ in range(a.batches):
        ms, answers = post(conn, [f"key-{rng.randrange(a.keys)}" for _ in range(a.batch_keys)])
        for x in answers:
            check(x, a.keys)
        batch_ms.append(ms)
    conn.close()
    out = {
        "first_lookup_ms": round(first_ms, 3),
        "get": percentiles(lat) | {"per_second": round(len(lat) / get_secs, 1)},
        "broker_cpu_seconds_during_gets": round(cpu_get, 3),
    }
    if batch_ms:
        per_key = percentiles([m / a.batch_keys for m in batch_ms])
        out["post"] = {"keys_per_request": a.batch_keys, "request": percentiles(batch_ms), "per_key": per_key}
    return out


def run(a, work: str) -> dict:
    data_dir = os.path.join(work, "data")
    broker = StandaloneBroker(data_dir, RETENTION_OVERRIDES)
    tail = int(a.messages * a.tail)
    try:
        progress(f"publishing {a.messages - tail} messages over {a.keys} keys")
        publish_secs = publish(broker.url, TOPIC, a.messages - tail, a.keys, a.size, True)
        progress(f"published in {publish_secs:.1f} s; compacting (Spark local[2])")
        compaction = compact(data_dir, TOPIC)
        progress(f"compacted in {compaction['seconds']} s; publishing a tail of {tail} messages")
        publish_tail(broker.url, a.messages - tail, tail, a.keys, a.size, seed=3)
        stop, counter = multiprocessing.Event(), multiprocessing.Value("l", 0)
        pub = multiprocessing.Process(
            target=background_publisher, args=(broker.url, a.keys, a.size, a.rate, stop, counter)
        )
        pub.start()
        time.sleep(1.0)  # the producer connects and reaches its rate
        cpu0, w0 = broker.cpu(), time.perf_counter()
        time.sleep(3.0)  # the broker's CPU for the publishing alone, to tell the lookups' apart
        publish_cpu_per_s = (broker.cpu() - cpu0) / (time.perf_counter() - w0)
        t0 = time.perf_counter()
        try:
            result = measure(broker, a, random.Random(11))
        finally:
            stop.set()
            pub.join(60)
        seconds = time.perf_counter() - t0 + 4.0
        get_secs = result["get"]["count"] / result["get"]["per_second"]
        lookup_cpu = result["broker_cpu_seconds_during_gets"] - publish_cpu_per_s * get_secs
        result["broker_cpu_ms_per_get_net_of_publishing"] = round(
            1000 * lookup_cpu / result["get"]["count"], 3
        )
        result["broker_cpu_seconds_per_second_publishing_alone"] = round(publish_cpu_per_s, 3)
        conn = http.client.HTTPConnection("127.0.0.1", broker.web_port, timeout=60)
        conn.request("GET", f"{PATH}/stats")
        stats = json.loads(conn.getresponse().read())
        conn.close()
    finally:
        broker.stop()
    return {
        "messages": a.messages,
        "keys": a.keys,
        "tail_messages": tail,
        "message_bytes": a.size,
        "publish_seconds": round(publish_secs, 3),
        "compaction": compaction,
        "concurrent_publish": {"target_per_s": a.rate, "sent": counter.value, "seconds": round(seconds, 2)},
        "latestValue_stats": stats.get("latestValue"),
        "load_average_1m": round(os.getloadavg()[0], 2),
    } | result


def goal_met(result: dict) -> dict:
    """p50 <= 2 ms and p99 <= 20 ms per GET, and whether this run had the goal's scale."""
    get = result["get"]
    return {
        "p50": get["p50_ms"] <= 2.0,
        "p99": get["p99_ms"] <= 20.0,
        "at_goal_scale": result["messages"] >= 10_000_000
        and result["keys"] >= 1_000_000
        and result["tail_messages"] >= result["messages"] // 100,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=10_000_000)
    p.add_argument("--keys", type=int, default=1_000_000)
    p.add_argument("--tail", type=float, default=0.01, help="uncompacted fraction of the messages")
    p.add_argument("--size", type=int, default=100, help="message size in bytes")
    p.add_argument("--lookups", type=int, default=20_000, help="timed GETs")
    p.add_argument("--batches", type=int, default=50, help="timed POSTs")
    p.add_argument("--batch-keys", type=int, default=100, help="keys per POST")
    p.add_argument("--rate", type=int, default=2000, help="messages/s published during the lookups")
    p.add_argument("--out", help="result file (default bench/results/latest_value.json)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--full", action="store_true", help="10 M messages, 1 M keys, 1 %% tail (the goal's)")
    size.add_argument("--quick", action="store_true", help="200,000 messages, 20,000 keys, 5,000 GETs")
    a = p.parse_args(argv)
    if a.full:
        a.messages, a.keys, a.tail = 10_000_000, 1_000_000, 0.01
    if a.quick:
        a.messages, a.keys, a.lookups = 200_000, 20_000, 5_000
    out = Path(a.out) if a.out else ROOT / "bench" / "results" / "latest_value.json"
    sys.path.insert(0, str(ROOT / "src"))
    from compactmq.compaction.jobs.session import get_session

    spark = get_session(
        {"spark.master": "local[2]", "spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false"}
    )
    work = tempfile.mkdtemp(prefix="cmq-latest-bench-")
    try:
        result = run(a, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        spark.stop()
    doc = {
        "benchmark": "latest_value",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "client": "pulsar-client " + _client_version(),
        "goal": "p50 <= 2 ms and p99 <= 20 ms per key at 10 M messages / 1 M keys / 1 % tail, publishing",
        "notes": (
            "GETs of uniformly random keys on one keep-alive HTTP connection from this process while a second "
            "process publishes keyed updates with the official client; latency includes HTTP and JSON on both "
            "sides; every answer is checked to be a message of its key; broker, client and publisher share "
            "the machine (see load_average_1m)"
        ),
        "goal_met": goal_met(result),
        "result": result,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    progress(f"wrote {out}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
