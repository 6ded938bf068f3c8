"""Failover time: SIGKILL of a topic's owner to the first successful publish on the new owner.

Three brokers (``compactmq standalone``, each its own process) share a ZooKeeper (the tests'
``tests/storage/metadata_store/zk_server.py``) and a SeaweedFS bucket (``tests/seaweedfs_server.py``,
``objectLedgerStorageUrl``), with ``metadataStoreSessionTimeoutMillis`` = ``--session-ms``. The
official client (all three hosts in its service URL) publishes to one topic with deduplication on;
then ``--kills`` times: look up the owner, SIGKILL it, time one synchronous ``send`` (it waits
while the client fails over: the dead owner's session expires, another broker takes the bundle
and recovers the topic from ZooKeeper and the object store), start the killed broker again on its
ports. At the end a reader reads the whole topic: every acknowledged message must be there once.

Reported (JSON, ``--out``): each failover in seconds, the median and the maximum, the session
timeout, the messages acknowledged, lost and duplicated, and the machine's load average around
the run (timings on a shared machine are noisy: the session timeout is the floor).

    .venv/bin/python bench/cluster_failover_bench.py              # 10 kills, 3 s sessions
    .venv/bin/python bench/cluster_failover_bench.py --kills 3    # a quick look
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
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cluster_setup as cs  # noqa: E402  (puts src/, tests/ and bench/ on sys.path)
import pulsar  # noqa: E402
from cluster_setup import ROOT, log  # noqa: E402
from harness.broker import BrokerProcess  # noqa: E402

TOPIC = "persistent://public/default/failover-bench"


def read_all(client, topic: str = TOPIC) -> list[bytes]:
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    out = []
    while reader.has_message_available():
        out.append(reader.read_next(timeout_millis=30000).data())
    reader.close()
    return out


def measure_failovers(brokers: list[BrokerProcess], kills: int, topic: str = TOPIC) -> dict:
    """``kills`` times: SIGKILL the owner of ``topic`` (deduplication on for it), time the next
    synchronous send, start the killed broker again; then read the topic back (lost, duplicated).
    ``brokers`` are running ``BrokerProcess``es of one cluster (``cluster_bench`` passes its own)."""
    client = cs.new_client(brokers, connection_timeout_ms=2000)
    producer = client.create_producer(topic, producer_name="bench", send_timeout_millis=120000)
    sent = 0
    for _ in range(20):
        producer.send(b"m-%d" % sent)
        sent += 1
    times = []
    for k in range(kills):
        victim = cs.owner(brokers, topic)
        t0 = time.monotonic()
        victim.stop(signal.SIGKILL)
        producer.send(b"m-%d" % sent)
        times.append(time.monotonic() - t0)
        sent += 1
        log(f"kill {k + 1}/{kills}: {times[-1]:.2f} s")
        victim.start()
        for _ in range(10):
            producer.send(b"m-%d" % sent)
            sent += 1
    got = read_all(client, topic)
    client.close()
    return {
        "failover_s": [round(t, 3) for t in times],
        "failover_median_s": round(statistics.median(times), 3),
        "failover_max_s": round(max(times), 3),
        "messages_acknowledged": sent,
        "lost": len({b"m-%d" % i for i in range(sent)} - set(got)),
        "duplicated": len(got) - len(set(got)),
    }


def run(tmp: str, kills: int, session_ms: int) -> dict:
    with contextlib.ExitStack() as stack:
        zk, s3 = cs.start_stores(stack, Path(tmp) / "zk")
        bucket = s3.create_bucket("failover-bench")
        overrides = cs.cluster_overrides(
            zk, s3, bucket, "bench", "b", session_ms, brokerDeduplicationEnabled="true"
        )
        brokers = cs.start_brokers(stack, [Path(tmp) / f"b{i}" / "data" for i in range(3)], overrides)
        return {"session_timeout_ms": session_ms, **measure_failovers(brokers, kills)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--session-ms", type=int, default=3000)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "cluster_failover.json"))
    a = ap.parse_args()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix=f"failover-{uuid.uuid4().hex[:6]}-") as tmp:
        results = run(tmp, a.kills, a.session_ms)
    results.update(
        load_average_before=load_before, load_average_after=os.getloadavg()[0], cpus=os.cpu_count()
    )
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
