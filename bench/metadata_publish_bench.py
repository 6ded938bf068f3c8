"""Publish throughput and topic creation per second on each metadata store, against ``main``.

Issue 25 moved the broker's metadata onto a versioned key-value store (embedded SQLite by
default, or ZooKeeper). This benchmark answers whether that costs the user anything: in ONE run it
starts, side by side,

- ``embedded``: this checkout's broker on the default store (no ``metadataStoreUrl``);
- ``zk``: this checkout's broker with ``metadataStoreUrl=zk:...``, on a ZooKeeper server it starts
  the way the tests do (``tests/storage/metadata_store/zk_server.py``, Debian's package);
- ``main-embedded`` (with ``--main-src``): the broker of another checkout's ``src`` (today's
  ``main``) on its default store.

Each round, for each broker in turn: the official client publishes ``--messages`` messages of
``--size`` bytes to a fresh topic with batching off, then again with batching on (``send_async``,
``flush``; msg/s from the first send to the flush), then ``--topics`` topics are created one by one
over REST (``PUT /admin/v2/persistent/public/default/<topic>``; topics/s). Reported: the median
over ``--rounds`` rounds, each round's values, and the broker's CPU per message / per topic
(``/proc/<pid>/stat``), which is steadier than wall time on a shared machine.

``main``'s C extensions: when ``--main-src`` holds ``_wire.c`` but no compiled ``_wire`` module
(a checkout whose extensions were installed elsewhere), the tree and its ``setup.py`` are copied to
a temporary directory and built there (``build_ext --inplace``), so both sides run native code.

    .venv/bin/python bench/metadata_publish_bench.py --main-src /work/main/src
    .venv/bin/python bench/metadata_publish_bench.py --messages 20000 --topics 200 --rounds 3 \\
        --main-src /work/main/src                       # the small form (about 2 minutes)

Progress goes to stderr; the JSON to bench/results/metadata_publish.json (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.standalone import StandaloneBroker  # noqa: E402
from tests.storage.metadata_store.zk_server import ZooKeeperServer, find_classpath  # noqa: E402


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def prepare_main_src(src: str, scratch: str) -> str:
    """``src`` itself when its extensions are compiled; else a built copy under ``scratch``."""
    proto = Path(src) / "compactmq" / "protocol"
    if not (proto / "_wire.c").exists() or any(proto.glob("_wire*.so")):
        return src
    copy = Path(scratch) / "main"
    shutil.copytree(Path(src), copy / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    shutil.copy(Path(src).parent / "setup.py", copy / "setup.py")
    for name in ("pyproject.toml", "README.md"):  # what setup.py reads
        if (Path(src).parent / name).exists():
            shutil.copy(Path(src).parent / name, copy / name)
    log(f"building main's C extensions in {copy}")
    subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
        cwd=copy,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return str(copy / "src")


def publish(url: str, topic: str, n: int, payload: bytes, batching: bool) -> float:
    """msg/s of ``n`` messages through the official client, to the flush."""
    import pulsar

    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    try:
        producer = client.create_producer(
            topic,
            batching_enabled=batching,
            batching_max_publish_delay_ms=1,
            block_if_queue_full=True,
            max_pending_messages=1000,
        )
        producer.send(payload)  # the topic is loaded and the connection warm before timing
        failures: list = []

        def done(res, _mid):
            if res != pulsar.Result.Ok:
                failures.append(res)

        t0 = time.perf_counter()
        for _ in range(n):
            producer.send_async(payload, done)
        producer.flush()
        seconds = time.perf_counter() - t0
        producer.close()
    finally:
        client.close()
    if failures:
        raise RuntimeError(f"{len(failures)} sends failed on {url}: {failures[0]}")
    return n / seconds


def create_topics(admin_url: str, prefix: str, m: int) -> float:
    """topics/s of ``m`` REST topic creations, one after another."""
    t0 = time.perf_counter()
    for i in range(m):
        req = urllib.request.Request(
            f"{admin_url}/admin/v2/persistent/public/default/{prefix}-{i}", method="PUT"
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            if resp.status not in (200, 204):
                raise RuntimeError(f"topic creation answered {resp.status}")
    return m / (time.perf_counter() - t0)


def one_round(name: str, broker: StandaloneBroker, r: int, args) -> dict:
    payload = os.urandom(args.size)
    out = {}
    for mode, batching in (("unbatched", False), ("batched", True)):
        cpu0 = broker.cpu()
        rate = publish(
            broker.url, f"persistent://public/default/pub-{mode}-{r}", args.messages, payload, batching
        )
        cpu_us = (broker.cpu() - cpu0) / args.messages * 1e6
        out[mode] = {"msg_per_s": round(rate, 1), "broker_cpu_us_per_msg": round(cpu_us, 2)}
        log(f"  round {r} {name:14s} {mode:9s} {rate:>10,.0f} msg/s  {cpu_us:7.1f} us broker CPU/msg")
    cpu0 = broker.cpu()
    rate = create_topics(broker.admin_url, f"created-{r}", args.topics)
    cpu_ms = (broker.cpu() - cpu0) / args.topics * 1e3
    out["topics"] = {"topics_per_s": round(rate, 1), "broker_cpu_ms_per_topic": round(cpu_ms, 3)}
    log(f"  round {r} {name:14s} topics    {rate:>10,.1f} topics/s  {cpu_ms:6.2f} ms broker CPU/topic")
    return out


def summarize(rounds: list[dict]) -> dict:
    def med(path):
        return round(statistics.median(r[path[0]][path[1]] for r in rounds), 2)

    return {
        "unbatched_msg_per_s": med(("unbatched", "msg_per_s")),
        "batched_msg_per_s": med(("batched", "msg_per_s")),
        "topics_per_s": med(("topics", "topics_per_s")),
        "unbatched_broker_cpu_us_per_msg": med(("unbatched", "broker_cpu_us_per_msg")),
        "batched_broker_cpu_us_per_msg": med(("batched", "broker_cpu_us_per_msg")),
        "broker_cpu_ms_per_topic": med(("topics", "broker_cpu_ms_per_topic")),
    }


def start_brokers(tmp: str, zk: ZooKeeperServer, main_src: str | None) -> dict[str, StandaloneBroker]:
    specs: dict[str, tuple[list[str], str | None]] = {
        "embedded": ([], None),
        "zk": ([f"metadataStoreUrl=zk:{zk.hosts}/bench"], None),
    }
    if main_src:
        specs["main-embedded"] = ([], main_src)
    brokers: dict[str, StandaloneBroker] = {}
    try:
        for name, (overrides, src) in specs.items():
            log(f"starting broker {name}")
            brokers[name] = StandaloneBroker(os.path.join(tmp, name), overrides, src=src)
    except BaseException:
        for b in brokers.values():
            b.stop()
        raise
    return brokers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=50_000)
    ap.add_argument("--topics", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--size", type=int, default=100, help="payload bytes")
    ap.add_argument("--main-src", help="also run the broker of this src directory (label main-embedded)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "metadata_publish.json"))
    args = ap.parse_args()
    classpath = find_classpath()
    if classpath is None:
        sys.exit("ZooKeeper is not installed (scripts/setup.sh installs Debian's zookeeper)")
    with tempfile.TemporaryDirectory(prefix="metadata-publish-") as tmp:
        main_src = prepare_main_src(args.main_src, tmp) if args.main_src else None
        zk = ZooKeeperServer(Path(tmp) / "zookeeper", classpath).start()
        try:
            brokers = start_brokers(tmp, zk, main_src)
            try:
                per_round: dict[str, list[dict]] = {name: [] for name in brokers}
                for r in range(args.rounds):
                    for name, broker in brokers.items():  # interleaved: each round sees the same load
                        per_round[name].append(one_round(name, broker, r, args))
            finally:
                for b in brokers.values():
                    b.stop()
        finally:
            zk.stop()
    result = {
        "benchmark": "metadata_publish",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "params": {k: getattr(args, k) for k in ("messages", "topics", "rounds", "size", "main_src")},
        "median": {name: summarize(rounds) for name, rounds in per_round.items()},
        "rounds": per_round,
    }
    if "main-embedded" in result["median"]:
        ours, main_ = result["median"]["embedded"], result["median"]["main-embedded"]
        result["embedded_vs_main"] = {
            k: round(ours[k] / main_[k], 3)
            for k in ("unbatched_msg_per_s", "batched_msg_per_s", "topics_per_s")
        }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    log(json.dumps(result["median"], indent=2))
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
