"""What the cluster benchmarks share: ZooKeeper, SeaweedFS and three ``compactmq standalone``.

A bench cluster is the tests' servers, started as the tests start them: the ZooKeeper of
``tests/storage/metadata_store/zk_server.py``, the SeaweedFS of ``tests/seaweedfs_server.py``
(one bucket, the brokers' ``objectLedgerStorageUrl``) and ``tests/harness``'s ``BrokerProcess``
for each broker. Everything a bench starts is registered on a ``contextlib.ExitStack`` as it
starts, so a failed start or an error mid-run still stops whatever already runs: the brokers
are SIGKILLed (nothing of a bench cluster is kept), ZooKeeper and SeaweedFS stopped.

- ``start_stores(stack, zk_dir)``: ZooKeeper and SeaweedFS;
- ``cluster_overrides(...)``: the settings every bench cluster runs with (the metadata store,
  the object store, the session timeout, a fast load report), plus the bench's own;
- ``start_brokers(stack, data_dirs, overrides)``: one broker per data directory, all started;
- ``new_client``, ``http_json``, ``owner``: the official client on every broker, the REST API,
  and which broker owns a topic;
- ``interleaved_runs``: several variants (trees, settings) run round after round on one
  ZooKeeper and SeaweedFS (``cluster_many_ab.py``, ``cluster_stop_bench.py``).

Importing this module puts ``src/``, ``tests/`` and ``bench/`` on ``sys.path``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _p in ("bench", "tests", "src"):
    if str(ROOT / _p) not in sys.path:
        sys.path.insert(0, str(ROOT / _p))

import pulsar  # noqa: E402
from harness.broker import BrokerProcess  # noqa: E402
from seaweedfs_server import start_seaweedfs, stop_seaweedfs  # noqa: E402
from storage.metadata_store.zk_server import ZooKeeperServer, find_classpath  # noqa: E402

START_TIMEOUT_S = 120.0  # a broker's start on a loaded machine


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def load() -> float:
    return round(os.getloadavg()[0], 2)


def http_json(url: str, method: str = "GET", body: object = None) -> object:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        raw = resp.read()
    return json.loads(raw) if raw else None


def new_client(brokers: list[BrokerProcess], connection_timeout_ms: int = 5000):
    """The official client, every broker of the cluster in its service URL."""
    url = "pulsar://" + ",".join(f"127.0.0.1:{b.port}" for b in brokers)
    return pulsar.Client(
        url, connection_timeout_ms=connection_timeout_ms, operation_timeout_seconds=60,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
    )  # fmt: skip


def owner(brokers: list[BrokerProcess], topic: str) -> BrokerProcess:
    """The broker that owns ``topic``, by an HTTP lookup on the first broker still alive."""
    asker = next(b for b in brokers if b.alive())
    answer = http_json(f"{asker.web_url}/lookup/v2/topic/{topic.replace('://', '/')}")
    return next(b for b in brokers if b.web_url == answer["httpUrl"])  # type: ignore[index]


def start_stores(stack: contextlib.ExitStack, zk_dir: Path):
    """ZooKeeper (its data in ``zk_dir``) and SeaweedFS, stopped when ``stack`` closes."""
    zk = ZooKeeperServer(zk_dir, find_classpath() or sys.exit("ZooKeeper not installed")).start()
    stack.callback(zk.stop)
    s3 = start_seaweedfs()
    stack.callback(stop_seaweedfs, s3)
    return zk, s3


def cluster_overrides(zk, s3, bucket: str, chroot: str, prefix: str, session_ms: int, **extra: str) -> dict:
    """The brokers' settings: metadata under ZooKeeper's ``/chroot``, ledgers under ``prefix/`` of
    ``bucket``, ``session_ms`` sessions, a load report every 300 ms; then ``extra``."""
    return {
        "metadataStoreUrl": f"zk:{zk.hosts}/{chroot}",
        "objectLedgerStorageUrl": f"s3://{bucket}/{prefix}?region=us-east-1&endpoint={s3.endpoint}",
        "metadataStoreSessionTimeoutMillis": str(session_ms),
        "loadBalancerReportUpdateMinIntervalMillis": "300",
        **extra,
    }


def start_brokers(stack: contextlib.ExitStack, data_dirs: list[Path], overrides: dict) -> list[BrokerProcess]:
    """A broker per data directory (its parent, new, holds the broker's log), started one after
    the other; each SIGKILLed when ``stack`` closes, including those started before one failed."""
    brokers = [BrokerProcess(d, overrides) for d in data_dirs]

    def kill_all() -> None:
        for b in brokers:
            b.stop(signal.SIGKILL)

    stack.callback(kill_all)
    for b in brokers:
        b.data_dir.parent.mkdir(parents=True)
        b.start(START_TIMEOUT_S)
    return brokers


def interleaved_runs(name: str, variants: list, rounds: int, one_run) -> list[dict]:
    """``one_run(zk, s3, bucket, tmp, variant, round)`` for every variant, round after round,
    the order reversed every other round (no variant always first), so every variant sees the
    same moments of a loaded machine. One ZooKeeper and one SeaweedFS (bucket ``name``) serve
    every run; each run is logged as it ends. Answers the runs' results in the order they ran."""
    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix=f"{name}-") as tmpdir, contextlib.ExitStack() as stack:
        tmp = Path(tmpdir)
        zk, s3 = start_stores(stack, tmp / "zk")
        bucket = s3.create_bucket(name)
        for rnd in range(rounds):
            for v in variants if rnd % 2 == 0 else variants[::-1]:
                r = one_run(zk, s3, bucket, tmp, v, rnd)
                runs.append(r)
                log(f"  {json.dumps(r)}")
    return runs


def write_results(out: str | Path, results: dict, started: float, load_before: float) -> None:
    """``results`` and the run's context (the 1-minute load average before and after, the
    machine's CPUs, the seconds since ``started``, a ``time.monotonic()``) as JSON in ``out``."""
    results.update(
        load_average_before=load_before,
        load_average_after=load(),
        cpus=os.cpu_count(),
        seconds=round(time.monotonic() - started, 1),
    )
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
