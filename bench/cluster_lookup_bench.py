"""What a binary LOOKUP costs on one broker (embedded store) and in a three-broker cluster (zk:).

One raw connection sends ``--n`` LOOKUPs one after the other (request, answer, next), so the
figure is the round trip of one lookup, and the broker's CPU per lookup is read from /proc.

- ``single``: ``compactmq standalone`` on the embedded store: the broker serves every topic;
- ``cluster_owned``: the broker asked owns the topic's bundle (answered from memory: Connect);
- ``cluster_other``: another broker owns it (one read of the ownership key: Connect to the owner);
- ``cluster_assign``: the first lookup of each of a fresh namespace's bundles, through the leader
  (a Redirect and a second lookup where the leader sends the client; timed end to end, per bundle).

The ZooKeeper server is the tests' (``tests/storage/metadata_store/zk_server.py``). Timings on a
shared machine are noisy: compare the CPU per lookup, and runs taken side by side.

    .venv/bin/python bench/cluster_lookup_bench.py            # 2,000 lookups per scenario
    .venv/bin/python bench/cluster_lookup_bench.py --quick    # 300
Writes bench/results/cluster_lookup.json (``--out`` to change).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from compactmq.broker.cluster.bundles import boundaries_for, bundle_of  # noqa: E402
from compactmq.protocol import frames  # noqa: E402
from standalone import StandaloneBroker  # noqa: E402
from tests.protocol import client_commands as commands  # noqa: E402
from tests.storage.metadata_store.zk_server import ZooKeeperServer, find_classpath  # noqa: E402

NS = "public/default"


class Raw:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.decoder = frames.FrameDecoder()
        self.queue: list = []
        self.sock.sendall(frames.encode_command(commands.connect("bench", 20)))
        self.recv()
        self.request_id = 0

    def recv(self):
        while not self.queue:
            self.queue.extend(self.decoder.feed(self.sock.recv(65536)))
        return self.queue.pop(0).command

    def lookup(self, topic: str, authoritative: bool = False):
        self.request_id += 1
        self.sock.sendall(
            frames.encode_command(commands.lookup(topic, self.request_id, authoritative=authoritative))
        )
        return self.recv().lookupTopicResponse

    def close(self) -> None:
        self.sock.close()


def timed_lookups(broker: StandaloneBroker, topic: str, n: int) -> dict:
    raw = Raw(broker.port)
    raw.lookup(topic)  # warm: namespace and bundle boundaries cached
    cpu0, t0 = broker.cpu(), time.perf_counter()
    for _ in range(n):
        raw.lookup(topic)
    wall, cpu = time.perf_counter() - t0, broker.cpu() - cpu0
    raw.close()
    return {"lookups": n, "per_second": round(n / wall), "us_per_lookup": round(wall / n * 1e6, 1),
            "broker_cpu_us_per_lookup": round(cpu / n * 1e6, 1)}  # fmt: skip


def owner_port(brokers: list[StandaloneBroker], topic: str) -> int:
    answer = Raw(brokers[0].port).lookup(topic)
    return int(answer.brokerServiceUrl.rsplit(":", 1)[1])


def assign_bundles(brokers: list[StandaloneBroker]) -> list[float]:
    """Milliseconds to the Connect for the first lookup of each bundle (redirects followed)."""
    out = []
    ports = {b.port: b for b in brokers}
    for lo in boundaries_for(4)[:-1]:
        topic = next(t for t in (f"persistent://{NS}/a-{uuid.uuid4().hex[:8]}" for _ in iter(int, 1))
                     if bundle_of(NS, boundaries_for(4), t).lower == lo)  # fmt: skip
        t0 = time.perf_counter()
        port, authoritative = brokers[-1].port, False
        for _ in range(5):
            raw = Raw(port)
            answer = raw.lookup(topic, authoritative)
            raw.close()
            port = int(answer.brokerServiceUrl.rsplit(":", 1)[1])
            if answer.response == answer.Connect:
                break
            authoritative = answer.authoritative
        assert port in ports
        out.append(round((time.perf_counter() - t0) * 1000, 2))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "cluster_lookup.json"))
    a = ap.parse_args()
    n = 300 if a.quick else a.n
    results: dict = {"load_average_before": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory() as tmp:
        single = StandaloneBroker(f"{tmp}/single")
        try:
            results["single"] = timed_lookups(single, f"persistent://{NS}/t", n)
        finally:
            single.stop()
        zk = ZooKeeperServer(
            Path(tmp) / "zk", find_classpath() or sys.exit("ZooKeeper not installed")
        ).start()
        store = f"metadataStoreUrl=zk:{zk.hosts}/bench"
        brokers = [StandaloneBroker(f"{tmp}/b{i}", [store]) for i in range(3)]
        try:
            results["cluster_assign_ms"] = assign_bundles(brokers)
            topics = [f"persistent://{NS}/t{i}" for i in range(40)]
            owned = next(t for t in topics if owner_port(brokers, t) == brokers[0].port)
            other = next(t for t in topics if owner_port(brokers, t) != brokers[0].port)
            results["cluster_owned"] = timed_lookups(brokers[0], owned, n)
            results["cluster_other"] = timed_lookups(brokers[0], other, n)
        finally:
            for b in brokers:
                b.stop()
            zk.stop()
    results["load_average_after"] = os.getloadavg()[0]
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
