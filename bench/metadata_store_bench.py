"""What one metadata-store operation costs on each implementation: memory:, sqlite:, zk:.

A baseline for the migration of storage/metadata.py's callers onto the store: how many ledger
rollovers, cursor writes or topic creations per second each implementation takes, from one
client thread, and the CPU each costs. Scenarios, each on ``--n`` keys or writes:

- ``create``: ``put(path, value, NEW)`` of new keys under one parent (topic creation);
- ``cas_update``: ``put(path, value, version)`` on one key, the version carried along (a cursor
  or ledger list written by its owner);
- ``get``: ``get`` of the created keys; ``children``: ``get_children`` of their parent (20 times);
- ``commit10``: ``commit`` of 10 unversioned puts (a rollover-sized multi).

Per scenario: ops/s and this process's CPU time per op (client side, kazoo's threads included);
for zk: also the ZooKeeper server's CPU per op (from /proc). The ZooKeeper server is the one the
tests use (Debian's package, ``tests/storage/metadata_store/zk_server.py``), fsyncing its log as
configured by default; SQLite commits persistent puts with synchronous=FULL. Timings on a shared
machine are noisy: compare CPU per op, and runs taken side by side.

    .venv/bin/python bench/metadata_store_bench.py            # 2,000 ops per scenario
    .venv/bin/python bench/metadata_store_bench.py --n 300    # quick
Writes bench/results/metadata_store.json (``--out`` to change).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

from compactmq.storage.metadata_store import NEW, Put, create_metadata_store  # noqa: E402
from tests.storage.metadata_store.zk_server import ZooKeeperServer, find_classpath  # noqa: E402

VALUE = os.urandom(200)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(name: str, ops: int, fn, server_pid: int | None) -> dict:
    server0 = proc_cpu_s(server_pid) if server_pid else 0.0
    cpu0, t0 = time.process_time(), time.perf_counter()
    fn()
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    out = {"ops": ops, "seconds": round(wall, 4), "ops_per_s": round(ops / wall, 1),
           "client_cpu_us_per_op": round(cpu / ops * 1e6, 1)}  # fmt: skip
    if server_pid:
        out["server_cpu_us_per_op"] = round((proc_cpu_s(server_pid) - server0) / ops * 1e6, 1)
    log(f"  {name:11s} {out['ops_per_s']:>10,.0f} ops/s  {out['client_cpu_us_per_op']:>8} us CPU/op")
    return out


def run(store, n: int, server_pid: int | None) -> dict:
    paths = [f"/managed-ledgers/public/default/persistent/topic-{i}" for i in range(n)]
    results = {}

    def create():
        for p in paths:
            store.put(p, VALUE, NEW)

    def cas_update():
        version = store.put("/cursor", VALUE).version
        for _ in range(n):
            version = store.put("/cursor", VALUE, version).version

    def get():
        for p in paths:
            store.get(p)

    def children():
        for _ in range(20):
            store.get_children("/managed-ledgers/public/default/persistent")

    def commit10():
        for i in range(n // 10):
            store.commit([Put(f"/multi/{i}/{k}", VALUE) for k in range(10)])

    results["create"] = measure("create", n, create, server_pid)
    results["cas_update"] = measure("cas_update", n, cas_update, server_pid)
    results["get"] = measure("get", n, get, server_pid)
    results["children"] = measure("children", 20, children, server_pid)
    results["commit10"] = measure("commit10", n // 10, commit10, server_pid)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "metadata_store.json"))
    args = ap.parse_args()
    out: dict = {"n": args.n, "value_bytes": len(VALUE), "results": {},
                 "machine": {"python": platform.python_version(), "platform": platform.platform(),
                             "cpus": os.cpu_count()}}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="metastore-bench-") as tmp:
        server = ZooKeeperServer(Path(tmp) / "zk", find_classpath() or sys.exit("ZooKeeper not installed"))
        (Path(tmp) / "zk").mkdir()
        server.start()
        try:
            for url, pid in (
                ("memory:", None),
                ("sqlite:bench.db", None),
                (f"zk:{server.hosts}/bench", server.proc.pid),
            ):
                log(url.split(":")[0])
                with create_metadata_store(url, data_dir=tmp) as store:
                    out["results"][url.split(":")[0]] = run(store, args.n, pid)
        finally:
            server.stop()
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
