"""How long a graceful stop (SIGTERM) of ``compactmq standalone`` takes against its loaded topics.

For each topic count N, a fresh broker (a subprocess on free ports, its own data directory)
gets N topics over the official client: each topic --messages 100-byte messages over a few
keys; with ``--subscribe`` a consumer of one subscription per topic receives and acknowledges
them (so each topic has a cursor to persist at close); with ``--compact`` every topic is
compacted over REST (in the broker's process: ``compactionInProcessMaxBytes`` at 8 MiB, no
Spark) and the runs are awaited, so each topic also has a compacted view. Then the broker gets
SIGTERM and the seconds until it exits are the figure (``stop_seconds``). With ``--verify`` the
broker is started again on the same directory and a sample of topics is read back in full
(every message acknowledged before the stop is there).

    .venv/bin/python bench/shutdown_bench.py [--topics 100 300 1000] [--messages 3]
    .venv/bin/python bench/shutdown_bench.py --topics 200 --subscribe --compact --verify
    .venv/bin/python bench/shutdown_bench.py --src /work/main/src     # another checkout (before)

Writes bench/results/shutdown.json (``--out``). The machine is shared: the load average is
recorded; compare counts within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from standalone import ROOT, StandaloneBroker  # noqa: E402

import pulsar  # noqa: E402

NS = "persistent://public/default"
IN_PROCESS = "compactionInProcessMaxBytes=8388608"


def _http(method: str, url: str) -> bytes:
    req = urllib.request.Request(url, method=method)
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.read()


def load_topics(broker: StandaloneBroker, n: int, messages: int, subscribe: bool) -> None:
    client = pulsar.Client(broker.url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        for i in range(n):
            topic = f"{NS}/stop-{i}"
            consumer = client.subscribe(topic, "stop-sub") if subscribe else None
            producer = client.create_producer(topic, batching_enabled=False)
            for j in range(messages):
                producer.send_async(b"x" * 100, None, partition_key=f"key-{j % 3}")
            producer.flush()
            producer.close()
            if consumer is not None:
                for _ in range(messages):
                    consumer.acknowledge(consumer.receive(10_000))
                consumer.close()
    finally:
        client.close()


def compact_all(broker: StandaloneBroker, n: int, timeout: float = 300) -> None:
    for i in range(n):
        _http("PUT", f"{broker.admin_url}/admin/v2/persistent/public/default/stop-{i}/compaction")
    deadline = time.monotonic() + timeout
    for i in range(n):
        url = f"{broker.admin_url}/admin/v2/persistent/public/default/stop-{i}/compaction"
        while json.loads(_http("GET", url))["status"] != "SUCCESS":
            if time.monotonic() > deadline:
                raise RuntimeError(f"stop-{i} not compacted within {timeout} s")
            time.sleep(0.2)


def verify(data_dir: str, n: int, messages: int, overrides: list[str], src: str | None) -> float:
    """Start again, read a sample of topics from the start; returns the start's seconds."""
    began = time.monotonic()
    broker = StandaloneBroker(data_dir, overrides, src)
    started = time.monotonic() - began
    client = pulsar.Client(broker.url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        for i in sorted({0, n // 2, n - 1}):
            reader = client.create_reader(f"{NS}/stop-{i}", pulsar.MessageId.earliest)
            got = 0
            while reader.has_message_available():
                reader.read_next(10_000)
                got += 1
            if got != messages:
                raise RuntimeError(f"stop-{i}: {got} messages after the restart, expected {messages}")
    finally:
        client.close()
        broker.stop()
    return started


def run(n: int, args: argparse.Namespace) -> dict:
    overrides = [IN_PROCESS] if args.compact else []
    with tempfile.TemporaryDirectory(prefix="shutdown-bench-") as data_dir:
        broker = StandaloneBroker(data_dir, overrides, args.src)
        try:
            began = time.monotonic()
            load_topics(broker, n, args.messages, args.subscribe)
            if args.compact:
                compact_all(broker, n)
            loaded = time.monotonic() - began
        except BaseException:
            broker.stop()
            raise
        load = os.getloadavg()[0]
        stop_s = broker.stop(args.stop_timeout)
        result = {"topics": n, "load_seconds": round(loaded, 2), "stop_seconds": round(stop_s, 3),
                  "exit_code": broker.proc.returncode, "load_average_1m": load}  # fmt: skip
        if args.verify:
            result["restart_seconds"] = round(verify(data_dir, n, args.messages, overrides, args.src), 2)
        print(json.dumps(result), flush=True)
        return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--topics", type=int, nargs="+", default=[100, 300, 1000])
    ap.add_argument("--messages", type=int, default=3)
    ap.add_argument("--subscribe", action="store_true", help="one acknowledging subscription per topic")
    ap.add_argument("--compact", action="store_true", help="compact every topic (in process) before the stop")
    ap.add_argument("--verify", action="store_true", help="restart and read a sample of topics back")
    ap.add_argument("--stop-timeout", type=float, default=120.0)
    ap.add_argument("--src", default=None, help="run the broker from another checkout's src (before figures)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "shutdown.json"))
    args = ap.parse_args()
    result = {
        "benchmark": "shutdown",
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "machine": {"cpus": os.cpu_count(), "load_average_at_start": list(os.getloadavg())},
        "runs": [run(n, args) for n in args.topics],
    }
    result["machine"]["load_average_at_end"] = list(os.getloadavg())
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
