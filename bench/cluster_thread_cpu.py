"""Where a cluster broker's CPU goes, thread by thread, while 30 topics publish.

Starts the bench cluster (``cluster_setup``: ZooKeeper, SeaweedFS, three brokers of ``--src``),
runs ``cluster_bench.publish_many`` on ``--topics`` topics of a 16-bundle namespace, and reads
each broker thread's CPU time (``/proc/<pid>/task/<tid>/stat``) when the first send goes and
after the last receipt. Python 3.11 does not name its threads for the OS, so the names come
from ``py-spy dump`` (``--py-spy``, a separate tool: ``pip install py-spy`` in a venv of its
own); without it the threads are listed by id. Also the CPU of SeaweedFS, ZooKeeper and this
client over the same time. Prints and writes (``--out``) microseconds of CPU per message.

    .venv/bin/python bench/cluster_thread_cpu.py --py-spy /tmp/pyspy-venv/bin/py-spy \\
        --out bench/results/cluster_thread_cpu_x.json
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cluster_bench as cb  # noqa: E402
import cluster_setup as cs  # noqa: E402
from cluster_setup import ROOT  # noqa: E402
from standalone import cpu_seconds  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def thread_names(py_spy: str | None, pid: int) -> dict[str, str]:
    if not py_spy:
        return {}
    out = subprocess.run([py_spy, "dump", "-p", str(pid)], capture_output=True, text=True).stdout
    return {m.group(1): m.group(2) for m in re.finditer(r'Thread (\d+) \([^)]*\): "([^"]+)"', out)}


def thread_cpu(pid: int, names: dict[str, str]) -> collections.Counter:
    """CPU seconds per thread name (a trailing number dropped: ``sync-3`` counts as ``sync``)."""
    out: collections.Counter = collections.Counter()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended
        name = re.sub(r"[-_]?\d+$", "", names.get(tid, f"tid {tid}"))
        out[name] += (int(fields[11]) + int(fields[12])) / TICK
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--src", default=str(ROOT / "src"), help="the brokers' tree (PYTHONPATH)")
    ap.add_argument("--topics", type=int, default=30)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--py-spy", default=None, help="py-spy binary, to name the threads")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.environ["PYTHONPATH"] = a.src
    started_at, load_before = time.monotonic(), cs.load()
    with tempfile.TemporaryDirectory(prefix="cluster-thread-cpu-") as td, contextlib.ExitStack() as stack:
        tmp = Path(td)
        zk, s3 = cs.start_stores(stack, tmp / "zk")
        bucket = s3.create_bucket("thread-cpu")
        overrides = cs.cluster_overrides(zk, s3, bucket, "thread-cpu", "thread-cpu", 3000)
        cs.log("starting 3 brokers")
        brokers = cs.start_brokers(stack, [tmp / f"b{i}" / "data" for i in range(3)], overrides)
        client = cs.new_client(brokers)
        ns = "public/many"
        cs.http_json(f"{brokers[0].web_url}/admin/v2/namespaces/{ns}", "PUT", {"bundles": {"numBundles": 16}})
        topics = [f"persistent://{ns}/t{i}" for i in range(a.topics)]
        names: dict[str, str] = {}
        at: dict = {}

        def started() -> None:
            for b in brokers:
                names.update(thread_names(a.py_spy, b.proc.pid))  # type: ignore[union-attr]
            at["threads"] = [thread_cpu(b.proc.pid, names) for b in brokers]  # type: ignore[union-attr]
            at["others"] = (cpu_seconds(s3.process.pid), cpu_seconds(zk.proc.pid), time.process_time())

        cs.log(f"publishing on {a.topics} topics for {a.seconds} s")
        got = cb.publish_many(client, topics, a.seconds, a.size, started)
        for b in brokers:
            names.update(thread_names(a.py_spy, b.proc.pid))  # type: ignore[union-attr]
        after = [thread_cpu(b.proc.pid, names) for b in brokers]  # type: ignore[union-attr]
        others = (cpu_seconds(s3.process.pid), cpu_seconds(zk.proc.pid), time.process_time())
        client.close()
    per_msg = 1e6 / max(1, got["messages"])
    threads: collections.Counter = collections.Counter()
    for x, y in zip(after, at["threads"]):
        for k in x:
            threads[k] += x[k] - y.get(k, 0.0)
    result = {
        "what": "CPU per message by broker thread, 30-topic publish (bench/cluster_thread_cpu.py)",
        "src": a.src,
        "publish": got,
        "us_per_message": {
            "brokers": round(sum(threads.values()) * per_msg, 1),
            "seaweedfs": round((others[0] - at["others"][0]) * per_msg, 1),
            "zookeeper": round((others[1] - at["others"][1]) * per_msg, 1),
            "client": round((others[2] - at["others"][2]) * per_msg, 1),
        },
        "broker_threads_us_per_message": {
            k: round(v * per_msg, 1) for k, v in threads.most_common() if v > 0
        },
    }
    cs.write_results(a.out, result, started_at, load_before)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
