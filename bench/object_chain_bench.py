"""Bytes a compaction run writes to the object store: the whole view every run (``before``: the
parts layout, ``compactionObjectStoreChains=false``) against a chain whose incremental runs
upload only their new segment (``after``: ``compaction.object_chain``).

One process, SeaweedFS on 127.0.0.1 (``tests/seaweedfs_server.py``), ledgers in the store
(``objectLedgerStorageUrl``: cluster mode's layout), the embedded SQLite metadata store, the
in-process compaction engine (no JVM: the figures are bytes and objects, which do not depend on
the engine). Per layout: a topic of ``--keys`` keys with ``--value``-byte values, one full run,
then ``--runs`` incremental runs each after ``--new`` new messages on random existing keys.
Per run: ``new_view_object_bytes``, the sizes of the view objects the run added (listed before
and after; the figure to quote), and ``put_bytes``/``puts``, the store's own put counters
(``OBJECT_COUNTERS``) around the run -- every object written meanwhile, so the first run's also
holds the topic's first ledger upload finishing in the background. A chain merge
(``compactionChainMaxRuns``, 8 by default) shows as one run as large as the first.

    .venv/bin/python bench/object_chain_bench.py [--keys 20000] [--value 200] [--new 150] [--runs 6]

Results go to bench/results/object_chain.json (or --out).
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

from seaweedfs_server import start_seaweedfs, stop_seaweedfs  # noqa: E402

from compactmq.compaction import tiered  # noqa: E402
from compactmq.compaction.runner import CompactionRunner  # noqa: E402
from compactmq.compaction.jobs.inprocess import InProcessEngine  # noqa: E402
from compactmq.config import load_config  # noqa: E402
from compactmq.storage import Storage  # noqa: E402
from compactmq.storage.offload import open_store  # noqa: E402
from compactmq.storage.offload.blobstore import OBJECT_COUNTERS  # noqa: E402

TOPIC = "persistent://public/default/object-chain-bench"


def _entry(key: str, value: bytes) -> bytes:
    from compactmq.protocol import pulsar_pb2 as pb
    from compactmq.protocol.entry_format import build_entry

    md = pb.MessageMetadata(producer_name="bench", sequence_id=0, publish_time=1000, partition_key=key)
    return build_entry(md, value)


def _publish(storage, keys, value: int, tag: int) -> None:
    ml = storage.open_managed_ledger(TOPIC)
    ml.append_many([_entry(f"k{k}", (b"%d:" % tag).ljust(value, b"x")) for k in keys])
    ml.rollover()  # sealed and uploaded before the run: the counters below see the view only


def _view_objects(storage) -> dict:
    store = open_store(storage.object_store.location)
    return {k: store.size(k) for k in store.list(tiered.STORE_ROOT)}


def _one_layout(server, args, chains: bool, work: Path) -> dict:
    bucket = server.create_bucket(f"chain-bench-{'after' if chains else 'before'}")
    url = f"s3://{bucket}/bench?region=us-east-1&endpoint={server.endpoint}"
    config = load_config(
        overrides={
            "managedLedgerSyncData": False,
            "objectLedgerStorageUrl": url,
            "compactionDirectIO": False,
            "compactionObjectStoreChains": chains,
        }
    )
    rng = random.Random(7)
    runs = []
    with Storage(work / ("after" if chains else "before"), config) as st:
        tiered.attach(st)
        _publish(st, range(args.keys), args.value, 0)
        for i in range(args.runs + 1):
            if i:
                _publish(st, [rng.randrange(args.keys) for _ in range(args.new)], args.value, i)
            listed = _view_objects(st)
            counted = OBJECT_COUNTERS.snapshot()
            t0 = time.perf_counter()
            result = CompactionRunner(st, TOPIC, config, InProcessEngine()).run()
            seconds = time.perf_counter() - t0
            after = OBJECT_COUNTERS.snapshot()
            now = _view_objects(st)
            runs.append(
                {
                    "run": "full" if i == 0 else "incremental",
                    "put_bytes": after["put_bytes"] - counted["put_bytes"],
                    "puts": after["puts"] - counted["puts"],
                    "new_view_object_bytes": sum(s for k, s in now.items() if k not in listed),
                    "view_entries": result.entries_written,
                    "seconds": round(seconds, 3),
                }
            )
    incremental = [r["put_bytes"] for r in runs[1:]]
    return {
        "runs": runs,
        "full_run_put_bytes": runs[0]["put_bytes"],
        "incremental_put_bytes_median": statistics.median(incremental) if incremental else None,
        "incremental_put_bytes_max": max(incremental) if incremental else None,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keys", type=int, default=20000)
    ap.add_argument("--value", type=int, default=200)
    ap.add_argument("--new", type=int, default=150, help="new messages before each incremental run")
    ap.add_argument("--runs", type=int, default=6, help="incremental runs after the full one")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "object_chain.json"))
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="cmq-chain-bench-"))
    server = start_seaweedfs()
    try:
        t0 = time.perf_counter()
        results = {
            "bench": "object_chain",
            "params": vars(args),
            "machine": {"python": platform.python_version(), "cpus": __import__("os").cpu_count()},
            "before_parts": _one_layout(server, args, False, work),
            "after_chains": _one_layout(server, args, True, work),
        }
        results["wall_seconds"] = round(time.perf_counter() - t0, 1)
    finally:
        stop_seaweedfs(server)
        shutil.rmtree(work, ignore_errors=True)
    b, a = results["before_parts"], results["after_chains"]
    if a["incremental_put_bytes_median"]:
        results["incremental_reduction"] = round(
            b["incremental_put_bytes_median"] / a["incremental_put_bytes_median"], 1
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
