"""Tiered-storage benchmark: reads and compaction from offloaded ledgers against local ledgers.

One run, per driver (``S3``: moto's S3 server on 127.0.0.1 started here as a subprocess;
``filesystem``: a ``file://`` directory on the same disk):

* sequential read throughput of ONE topic, read from earliest to end with
  ``ManagedLedger.read_entries`` (1000 entries per call, CRC-checked records): first while its
  ledgers are local, then after they are offloaded and their local copies deleted (same topic,
  same data, same process). Local reads come from the page cache (the data was just written);
  offloaded reads start with an empty read cache each trial, so every byte crosses the store's
  API (HTTP for S3). Trials alternate local and offloaded reads.
* the offload itself (MB/s written to the store).
* full compaction time (``SparkCompactionService.compact()``, local[2] session started and
  warmed before timing) of identical data three ways: ``local`` -- a data directory with no
  tiered storage, ledgers and compacted ledger on the local disk; ``local_ledgers_view_to_store``
  -- local ledgers, tiered storage configured, so the run's tasks write the compacted ledger
  straight to the store; ``object_store`` -- the offloaded topic, whose ledgers the tasks read
  from the store (pyarrow.fs) and whose compacted ledger they write there. Alternated; each
  repeat starts from no compacted view.
* the compacted view served to a read-compacted reader (``LedgerCompactionService``, the
  broker's read side): a cold seek into the middle (open + 100 entries, empty read cache) and a
  sequential read of the whole view, from the store (read by ranges through the read cache)
  against the local file (memory-mapped).

moto is a Python server, so S3 figures measure this client against moto on a shared machine,
not against a real S3 service; the ``filesystem`` driver shows the cost of the tier's read path
itself. Quote medians. Results go to bench/results/offload.json (or --out).

    .venv/bin/python bench/offload_bench.py [--quick] [--messages N] [--drivers S3,filesystem]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))
sys.path.insert(0, os.path.join(ROOT, "bench"))

from compaction_bench import build_entries, make_messages  # noqa: E402

PER_LEDGER = 1000  # entries (a batched entry holds 100 messages of 100 bytes)
DUMMY_AWS = {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_moto(log_dir: str):
    os.environ.update(DUMMY_AWS)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=open(os.path.join(log_dir, "moto.log"), "ab"),
        stderr=subprocess.STDOUT,
    )
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(endpoint + "/", timeout=2).close()
            break
        except urllib.error.HTTPError:
            break
        except OSError:
            time.sleep(0.1)
    else:
        proc.kill()
        raise SystemExit("moto server did not start")
    import boto3

    bucket = f"bench-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    conf = {
        "managedLedgerOffloadDriver": "S3",
        "s3ManagedLedgerOffloadBucket": bucket,
        "s3ManagedLedgerOffloadRegion": "us-east-1",
        "s3ManagedLedgerOffloadServiceEndpoint": endpoint,
    }
    return proc, conf


def fill(ml, entries: list[bytes]) -> int:
    for i in range(0, len(entries), 500):
        ml.append_many(entries[i : i + 500])
    ml.rollover()  # every entry in a sealed ledger
    return sum(len(e) for e in entries)


def read_all(ml) -> tuple[float, int, int]:
    from compactmq.storage import Position

    pos, n, nbytes = Position(-1, -1), 0, 0
    t = time.perf_counter()
    while True:
        got = ml.read_entries(pos, 1000) if n == 0 else ml.read_entries(ml.next_position(pos), 1000)
        if not got:
            break
        n += len(got)
        nbytes += sum(len(d) for _, d in got)
        pos = got[-1][0]
    return time.perf_counter() - t, n, nbytes


def offload_and_delete_local(st, ml) -> dict:
    t = time.perf_counter()
    ids = st.offloader.offload(ml)
    took = time.perf_counter() - t
    size = sum(info.size for info, off in ml.ledgers_with_offload() if off)
    for lid in ids:
        ml.release_local_copy(lid)
    assert not any(os.path.exists(ml.ledger_path(lid)) for lid in ids)
    return {"ledgers": len(ids), "seconds": round(took, 3), "MBps": round(size / took / 1e6, 1)}


def reset_compaction(st, topic: str) -> None:
    """Forget the topic's compacted view so the next run is a full one (bench only)."""
    from compactmq.compaction.state import states_of

    states_of(st).delete(topic)


def read_view(st, topic: str, config) -> dict:
    """A cold seek into the middle of the topic's compacted view, then a sequential read of it
    all (the broker's read side, batches of 1000 entries)."""
    from compactmq.compaction.service import LedgerCompactionService
    from compactmq.storage import Position
    from compactmq.storage.offload import shared_cache

    shared_cache().clear()
    service = LedgerCompactionService(st, topic, config)
    t = time.perf_counter()
    reader = service.compacted_ledger()
    assert reader is not None
    middle = reader.position_at(len(reader) // 2)
    want = min(100, len(reader) - len(reader) // 2)
    got = service.read_compacted_entries(middle, want)
    seek = time.perf_counter() - t
    assert len(got) == want
    shared_cache().clear()  # the sequential read fetches every byte again
    pos, n, nbytes = Position(0, 0), 0, 0
    t = time.perf_counter()
    while True:
        batch = service.read_compacted_entries(pos, 1000)
        if not batch:
            break
        n += len(batch)
        nbytes += sum(len(d) for _, d in batch)
        last = batch[-1][0]
        pos = Position(last[0], last[1] + 1)
    took = time.perf_counter() - t
    service.close()
    return {
        "remote": reader.remote,
        "entries": n,
        "bytes": nbytes,
        "cold_seek_ms": round(seek * 1000, 2),
        "sequential_MBps": round(nbytes / took / 1e6, 1),
        "sequential_seconds": round(took, 3),
    }


def compact(st, topic: str, config) -> float:
    from compactmq.compaction.jobs import SparkCompactionService

    reset_compaction(st, topic)
    service = SparkCompactionService(st, topic, config)
    t = time.perf_counter()
    result = service.compact()
    took = time.perf_counter() - t
    service.close()
    assert result.compacted_ledger_id is not None
    return took


def bench_driver(
    name: str, offload_conf: dict, entries: list[bytes], trials: int, repeat: int, work: str
) -> dict:
    from compactmq.compaction.jobs.session import TEST_CONF, get_session
    from compactmq.config import load_config
    from compactmq.storage import Storage
    from compactmq.storage.offload import shared_cache

    data = tempfile.mkdtemp(dir=work, prefix=f"{name}-")
    plain_data = tempfile.mkdtemp(dir=work, prefix=f"{name}-untiered-")
    base = {
        "managedLedgerMaxEntriesPerLedger": PER_LEDGER,
        "managedLedgerMinLedgerRolloverTimeMinutes": 0,  # ledgers of PER_LEDGER entries at once
        "managedLedgerSyncData": False,
        **TEST_CONF,
    }
    config = load_config(overrides={**base, "managedLedgerOffloadDeletionLagMs": 10**12, **offload_conf})
    plain_config = load_config(overrides=base)  # no tiered storage at all
    st = Storage(data, config)
    plain = Storage(plain_data, plain_config)
    try:
        topic = "persistent://public/default/offload-bench"
        ml = st.open_managed_ledger(topic)
        total = fill(ml, entries)
        log(f"{name}: {len(entries)} entries, {total / 1e6:.1f} MB in {len(ml.ledgers())} ledgers")

        # --- sequential reads, local first (same topic) ------------------------------------------
        local_reads = [read_all(ml) for _ in range(trials)]
        off = offload_and_delete_local(st, ml)
        log(f"{name}: offloaded {off['ledgers']} ledgers at {off['MBps']} MB/s")
        remote_reads = []
        for _ in range(trials):
            shared_cache().clear()  # every trial reads every byte from the store
            remote_reads.append(read_all(ml))
        for secs, n, nbytes in local_reads + remote_reads:
            assert n == len(entries) and nbytes == total
        local_mbps = statistics.median(total / s / 1e6 for s, _, _ in local_reads)
        remote_mbps = statistics.median(total / s / 1e6 for s, _, _ in remote_reads)
        log(f"{name}: sequential read local {local_mbps:.0f} MB/s, offloaded {remote_mbps:.0f} MB/s")

        # --- compaction: the same data local, local with the view written to the store, and
        # read from the store ------------------------------------------------------------------------
        twin = "persistent://public/default/offload-bench-local"
        fill(st.open_managed_ledger(twin), entries)
        fill(plain.open_managed_ledger(twin), entries)
        t = time.perf_counter()
        get_session(config.spark)
        jvm = time.perf_counter() - t
        compact(plain, twin, plain_config)  # warm-up (Python workers, JIT)
        runs: dict[str, list[float]] = {"local": [], "local_ledgers_view_to_store": [], "object_store": []}
        for _ in range(repeat):
            runs["local"].append(compact(plain, twin, plain_config))
            runs["local_ledgers_view_to_store"].append(compact(st, twin, config))
            runs["object_store"].append(compact(st, topic, config))
        med = {k: statistics.median(v) for k, v in runs.items()}
        log(
            f"{name}: compaction local {med['local']:.2f}s, view to the store {med['local_ledgers_view_to_store']:.2f}s, "
            f"from and to the object store {med['object_store']:.2f}s"
        )

        # --- the compacted view served from the store against from the local disk ---------------
        view_local = read_view(plain, twin, plain_config)
        view_store = read_view(st, topic, config)
        assert not view_local["remote"] and view_store["remote"]
        assert (view_local["entries"], view_local["bytes"]) == (view_store["entries"], view_store["bytes"])
        log(f"{name}: compacted view local {view_local}, from the store {view_store}")
        return {
            "entries": len(entries),
            "bytes": total,
            "ledgers": len(ml.ledgers()),
            "offload": off,
            "sequential_read": {
                "local_MBps_median": round(local_mbps, 1),
                "offloaded_MBps_median": round(remote_mbps, 1),
                "offloaded_over_local": round(remote_mbps / local_mbps, 3),
                "local_seconds": [round(s, 3) for s, _, _ in local_reads],
                "offloaded_seconds": [round(s, 3) for s, _, _ in remote_reads],
            },
            "compaction": {
                "spark_session_start_seconds": round(jvm, 2),
                "local_seconds_median": round(med["local"], 3),
                "local_ledgers_view_to_store_seconds_median": round(med["local_ledgers_view_to_store"], 3),
                "object_store_seconds_median": round(med["object_store"], 3),
                "object_store_over_local": round(med["object_store"] / med["local"], 3),
                "view_to_store_over_local": round(med["local_ledgers_view_to_store"] / med["local"], 3),
                "seconds": {k: [round(s, 3) for s in v] for k, v in runs.items()},
            },
            "compacted_view_read": {
                "local": view_local,
                "object_store": view_store,
                "sequential_store_over_local": round(
                    view_store["sequential_MBps"] / view_local["sequential_MBps"], 3
                ),
            },
        }
    finally:
        st.close()
        plain.close()
        shutil.rmtree(data, ignore_errors=True)
        shutil.rmtree(plain_data, ignore_errors=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--trials", type=int, default=3, help="sequential-read trials per side")
    ap.add_argument("--repeat", type=int, default=3, help="compactions per side")
    ap.add_argument("--drivers", default="S3,filesystem")
    ap.add_argument("--quick", action="store_true", help="200k messages, 20k keys, 2 repeats")
    ap.add_argument("--work-dir", default=None)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "offload.json"))
    a = ap.parse_args(argv)
    load_at_start = [round(x, 2) for x in os.getloadavg()]
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    if a.quick:
        a.messages, a.keys, a.repeat = 200_000, 20_000, 2
    work = a.work_dir or tempfile.mkdtemp(prefix="offload-bench-")
    os.makedirs(work, exist_ok=True)
    key_ids, tomb = make_messages(a.messages, a.keys, 0.01, 7)
    entries = build_entries(np.asarray(key_ids), np.asarray(tomb), True, 7)
    results: dict = {
        "benchmark": "offload",
        "messages": a.messages,
        "keys": a.keys,
        "message_bytes": 100,
        "entry_layout": "batches of 100",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "note": "S3 = moto's server (a Python process) on 127.0.0.1, not a real S3 service; "
        "local reads are page-cache hot; offloaded reads start with an empty read cache; "
        "with tiered storage configured a run writes the compacted ledger straight to the store",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "drivers": {},
    }
    moto = None
    try:
        for name in a.drivers.split(","):
            if name == "S3":
                moto, conf = start_moto(work)
            else:
                root = os.path.join(work, "fs-offload")
                conf = {"managedLedgerOffloadDriver": "filesystem", "fileSystemURI": f"file://{root}"}
            results["drivers"][name] = bench_driver(name, conf, entries, a.trials, a.repeat, work)
    finally:
        if moto is not None:
            moto.terminate()
            moto.wait(10)
        if a.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    results["loadavg_at_start"] = load_at_start
    results["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]  # a shared machine: how busy it was
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(results, f, indent=2)
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
