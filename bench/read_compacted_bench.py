"""Rewinding a keyed topic: a read-compacted reader against a plain reader, official client.

Starts ``compactmq standalone`` on free ports with a fresh data directory and, per mode
(batching off, batching on):

1. publishes ``--messages`` messages of ``--size`` bytes over ``--keys`` keys (key ``i % keys``,
   so every key is overwritten ``messages / keys`` times) with one producer;
2. compacts the topic once, in this process, against the broker's data directory as
   ``compact-topic`` does (the broker seals the ledger it is writing, then a read-only ``Storage``
   beside the broker runs the compaction) on a local Spark session;
3. times, from ``MessageId.earliest`` to the end (``has_message_available()`` false):
   a plain reader (the whole history) and a reader with ``is_read_compacted=True`` (the
   compacted ledger, then the topic after the horizon), each on a fresh client connection,
   ``--repeat`` times each (median reported, every run listed).

Reported per mode: median seconds and messages/s of each reader, messages each received, and
``speedup`` = plain seconds / compacted seconds, next to ``keys_per_message`` (the fraction of
the history a compacted reader has to read). The compaction's own duration is reported too,
but is not part of either reader's time.

    .venv/bin/python bench/read_compacted_bench.py            # 1,000,000 messages, 10,000 keys
    .venv/bin/python bench/read_compacted_bench.py --quick    # 100,000 messages, 1,000 keys
Writes bench/results/read_compacted.json (read_compacted_quick.json with --quick; --out to change).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from standalone import ROOT, StandaloneBroker  # noqa: E402

# infinite retention: with no subscription, retention 0 would let the housekeeping timer
# delete the history the plain reader is timed on
RETENTION_OVERRIDES = ["defaultRetentionTimeInMinutes=-1", "defaultRetentionSizeInMB=-1"]


def client(url: str):
    import pulsar

    return pulsar.Client(
        url, operation_timeout_seconds=60, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    )


def publish(url: str, topic: str, messages: int, keys: int, size: int, batching: bool) -> float:
    import pulsar

    c = client(url)
    producer = c.create_producer(
        topic,
        batching_enabled=batching,
        batching_max_messages=1000,
        batching_max_publish_delay_ms=10,
        max_pending_messages=10000,
        block_if_queue_full=True,
    )
    errors = []

    def done(res, _mid):
        if res != pulsar.Result.Ok:
            errors.append(res)

    pad = b"x" * max(0, size - 12)
    keys_text = [f"key-{k}" for k in range(keys)]
    t0 = time.perf_counter()
    for i in range(messages):
        producer.send_async(b"%011d|" % i + pad, done, partition_key=keys_text[i % keys])
    producer.flush()
    secs = time.perf_counter() - t0
    producer.close()
    c.close()
    if errors:
        raise RuntimeError(f"{len(errors)} publish errors, first {errors[0]}")
    return secs


def compact(data_dir: str, topic: str) -> dict:
    from compactmq.compaction.jobs import SparkCompactionService
    from compactmq.config import load_config
    from compactmq.storage import Storage
    from compactmq.storage.seal import NOT_SEALED, seal_before_compaction

    config = load_config()
    # as `compact-topic` does: the broker seals the ledger it is writing, so the run reads it all
    if seal_before_compaction(data_dir, config, topic) == NOT_SEALED:
        raise RuntimeError(f"the broker did not seal the current ledger of {topic} in time")
    storage = Storage(data_dir, config, read_only=True)
    try:
        t0 = time.perf_counter()
        result = SparkCompactionService(storage, topic, config).compact()
        secs = time.perf_counter() - t0
    finally:
        storage.close()
    return {
        "seconds": round(secs, 3),
        "entries_read": result.entries_read,
        "messages_read": result.messages_read,
        "messages_kept": result.messages_kept,
    }


def read_to_end(url: str, topic: str, compacted: bool) -> tuple[float, int, dict]:
    """Seconds and messages from earliest until has_message_available() is false, and the
    latest value seen per key (to check both readers agree on the end state)."""
    import pulsar

    c = client(url)
    reader = c.create_reader(
        topic, pulsar.MessageId.earliest, is_read_compacted=compacted, receiver_queue_size=5000
    )
    n = 0
    state: dict = {}
    t0 = time.perf_counter()
    while reader.has_message_available():
        msg = reader.read_next(60_000)
        state[msg.partition_key()] = msg.data()[:11]
        n += 1
    secs = time.perf_counter() - t0
    reader.close()
    c.close()
    return secs, n, state


def timed_reads(url: str, topic: str, compacted: bool, repeat: int) -> tuple[list, int, dict]:
    runs, n, state = [], 0, {}
    for _ in range(repeat):
        secs, n, state = read_to_end(url, topic, compacted)
        runs.append(round(secs, 3))
    return runs, n, state


def reader_result(runs: list, n: int) -> dict:
    median = sorted(runs)[len(runs) // 2]
    return {
        "seconds": median,
        "runs_seconds": runs,
        "messages": n,
        "msgs_per_s": round(n / median) if median else None,
    }


def run_mode(work: str, messages: int, keys: int, size: int, batching: bool, repeat: int) -> dict:
    data_dir = os.path.join(work, f"data-{'batch' if batching else 'nobatch'}")
    load_before = round(os.getloadavg()[0], 2)
    broker = StandaloneBroker(data_dir, RETENTION_OVERRIDES)
    topic = f"persistent://public/default/rewind-{'batch' if batching else 'nobatch'}"
    try:
        publish_secs = publish(broker.url, topic, messages, keys, size, batching)
        compaction = compact(data_dir, topic)
        plain_runs, plain_n, plain_state = timed_reads(broker.url, topic, False, repeat)
        comp_runs, comp_n, comp_state = timed_reads(broker.url, topic, True, repeat)
    finally:
        broker.stop()
    if plain_state != comp_state:
        raise RuntimeError("the compacted reader ended with a different value per key than the plain one")
    return {
        "mode": "batch" if batching else "nobatch",
        "messages": messages,
        "keys": keys,
        "message_bytes": size,
        "keys_per_message": round(keys / messages, 6),
        "publish_seconds": round(publish_secs, 3),
        "compaction": compaction,
        "load_average_1m": {"before": load_before, "after": round(os.getloadavg()[0], 2)},
        "plain_reader": reader_result(plain_runs, plain_n),
        "compacted_reader": reader_result(comp_runs, comp_n),
    } | _ratios(reader_result(plain_runs, plain_n)["seconds"], reader_result(comp_runs, comp_n)["seconds"])


def _ratios(plain_secs: float, comp_secs: float) -> dict:
    return {
        "speedup": round(plain_secs / comp_secs, 2) if comp_secs else None,
        "time_ratio_compacted_over_plain": round(comp_secs / plain_secs, 5) if plain_secs else None,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="100,000 messages over 1,000 keys")
    p.add_argument("--messages", type=int)
    p.add_argument("--keys", type=int)
    p.add_argument("--size", type=int, default=100, help="message size in bytes (default 100)")
    p.add_argument("--modes", default="nobatch,batch", help="comma-separated: nobatch, batch")
    p.add_argument("--repeat", type=int, default=3, help="reads per reader; the median is reported")
    p.add_argument("--out", help="result file (default bench/results/read_compacted[_quick].json)")
    a = p.parse_args(argv)
    messages = a.messages or (100_000 if a.quick else 1_000_000)
    keys = a.keys or (1_000 if a.quick else 10_000)
    out = (
        Path(a.out)
        if a.out
        else ROOT / "bench" / "results" / ("read_compacted_quick.json" if a.quick else "read_compacted.json")
    )
    sys.path.insert(0, str(ROOT / "src"))
    import pulsar  # noqa: F401  (fail early when the client is missing)
    from compactmq.compaction.jobs.session import get_session

    spark = get_session(
        {"spark.master": "local[2]", "spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false"}
    )
    work = tempfile.mkdtemp(prefix="cmq-rc-bench-")
    results = []
    try:
        for mode in [m.strip() for m in a.modes.split(",") if m.strip()]:
            r = run_mode(work, messages, keys, a.size, batching=(mode == "batch"), repeat=max(1, a.repeat))
            print(json.dumps(r), flush=True)
            results.append(r)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        spark.stop()
    doc = {
        "benchmark": "read_compacted",
        "quick": bool(a.quick),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "client": "pulsar-client " + _client_version(),
        "config_overrides": RETENTION_OVERRIDES,
        "notes": (
            "time from MessageId.earliest until has_message_available() is false, one reader each on a "
            "fresh connection; compaction (Spark local[2], in-process) is not included in either time; "
            "speedup = plain seconds / compacted seconds; client and broker share the machine (other work on "
            "it shows in load_average_1m; the compacted reader's sub-second time is the noisier one)"
        ),
        "results": results,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


def _client_version() -> str:
    try:
        from importlib.metadata import version

        return version("pulsar-client")
    except Exception:  # pragma: no cover
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
