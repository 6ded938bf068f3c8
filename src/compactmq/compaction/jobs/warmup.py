"""Warming the compaction SparkSession in the background, so a broker's first run is not a cold one.

A run in a fresh process pays for much more than its data: starting the JVM and the
SparkSession, loading and JIT-compiling Spark's classes, generating code for the aggregate's plan,
forking the Python workers and importing numpy, pyarrow and compactmq in each. For a topic of
200,000 messages that was 16-19 s of a first trigger, against about a second warm.

``EngineWarmup.start()`` does all of that in a daemon thread, once per process, right after the
broker is ready (``compactionSparkWarmup``, on by default; ``cli/standalone.py`` asks the
compaction factory for it). The thread

1. obtains the SparkSession with the broker's ``spark.*`` settings (``session.get_session``: the
   same ``getOrCreate`` a run uses, so the run reuses it);
2. compacts a small scratch topic (single messages, a batch, a tombstone) written to a temporary
   directory of its own with ``SparkCompactionService.compact()``: the very path a run takes
   (a small run's one task, ``fused``; then again through the three-stage pipeline),
   phase one (``mapInArrow`` parsing in Python workers, the keep-latest aggregate) and phase two
   (the shuffle of survivors, the part writers), so the plan's generated code and the workers'
   imports are ready;
3. runs one task per core that imports what a run's tasks import, then a shuffle, so every Python
   worker Spark will reuse is started and warm, not only the one the scratch run used; then the
   same as an RDD job (a small run's one task, ``fused``: Spark keeps those workers apart).

The broker's readiness never waits for it, and a failure (no Java, a bad ``spark.master``) only
logs a warning: the first run then starts Spark as it would without the warm-up. The state
(``off``, ``warming``, ``warm``, ``failed``, with timings) is what ``state()`` returns; the broker
shows it in ``/metrics`` (``compactmq_compaction_engine_warm``) and logs one line when it ends.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
from typing import Any, Mapping, Optional

log = logging.getLogger(__name__)

SCRATCH_TOPIC = "persistent://public/default/__compactmq_warmup"


def _scratch_entries() -> list[bytes]:
    """A few stored entries covering what the scanner distinguishes: keyed single messages, a
    batch, a keyless message and a tombstone."""
    from ...protocol import pulsar_pb2 as pb
    from ...protocol.entry_format import build_entry

    out = []
    for i in range(16):
        md = pb.MessageMetadata(producer_name="warmup", sequence_id=i, publish_time=1000 + i)
        if i % 5:
            md.partition_key = f"k{i % 4}"
        out.append(build_entry(md, b"" if i == 12 else b"v%d" % i))
    body = bytearray()
    for j in range(4):
        payload = b"b%d" % j
        smm = pb.SingleMessageMetadata(partition_key=f"k{j}", payload_size=len(payload)).SerializeToString()
        body += len(smm).to_bytes(4, "big") + smm + payload
    md = pb.MessageMetadata(
        producer_name="warmup", sequence_id=16, publish_time=1016, num_messages_in_batch=4
    )
    out.append(build_entry(md, bytes(body)))
    return out


def _warm_workers(spark) -> int:
    """One task per core importing what a run's tasks import, then a shuffle; returns the number
    of tasks that ran."""
    n = max(1, spark.sparkContext.defaultParallelism)

    def touch(batches):
        import numpy  # noqa: F401 - imported for its side effect: a warm worker
        import pyarrow as pa

        from compactmq.compaction import entry_scan, native, tasks  # noqa: F401

        native.library()  # load the scan extension (or decide on numpy) now, not in a run
        for batch in batches:
            yield pa.RecordBatch.from_pydict({"id": batch.column(0), "one": [1] * batch.num_rows})

    def touch_rdd(ids):
        from compactmq.compaction import entry_scan, native, tasks  # noqa: F401

        native.library()
        return [sum(1 for _ in ids)]

    from pyspark.sql import functions as F

    rows = spark.range(0, n, 1, n).mapInArrow(touch, "id long, one long")
    warmed = int(
        rows.groupBy((F.col("id") % n).alias("g")).agg(F.sum("one").alias("s")).agg(F.sum("s")).first()[0]
    )
    # a one-task run (``fused``) is an RDD job, whose Python workers Spark keeps apart from the
    # SQL ones (their environments differ): those are started and warmed too
    spark.sparkContext.range(0, n, 1, n).mapPartitions(touch_rdd).sum()
    return warmed


class EngineWarmup:
    """The background warm-up of one process's compaction SparkSession."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None
        self._state: dict[str, Any] = {"state": "off"}

    def start(self, spark_conf: Optional[Mapping[str, str]] = None) -> bool:
        """Start warming in a daemon thread; False when it was started already."""
        with self._lock:
            if self._thread is not None:
                return False
            self._state = {"state": "warming", "startedAt": time.time()}
            self._thread = threading.Thread(
                target=self._run, args=(dict(spark_conf or {}),), name="compaction-warmup", daemon=True
            )
            self._thread.start()
            return True

    def state(self) -> dict[str, Any]:
        """``state`` (off, warming, warm, failed), and once it ended ``seconds`` (all of it),
        ``sessionSeconds`` (starting the session), ``scratchRunSeconds`` (the scratch compaction),
        ``workers`` (Python worker tasks warmed) or ``error``."""
        with self._lock:
            return dict(self._state)

    def wait(self, timeout: Optional[float] = None) -> dict[str, Any]:
        """The state once the warm-up ended (or when ``timeout`` ran out)."""
        t = self._thread
        if t is not None:
            t.join(timeout)
        return self.state()

    def _run(self, spark_conf: dict) -> None:
        t0 = time.perf_counter()
        try:
            result = warm_up(spark_conf)
        except Exception as e:  # noqa: BLE001 - never fatal: the first run starts Spark itself
            with self._lock:
                self._state = {**self._state, "state": "failed", "error": f"{type(e).__name__}: {e}"}
            log.warning(
                "compaction warm-up failed after %.1f s (the first compaction will start Spark): %s",
                time.perf_counter() - t0,
                e,
            )
            return
        with self._lock:
            self._state = {
                **self._state,
                **result,
                "state": "warm",
                "seconds": round(time.perf_counter() - t0, 3),
            }
        log.info(
            "compaction engine warm in %.1f s (session %.1f s, scratch run %.1f s, %d Python workers)",
            time.perf_counter() - t0,
            result["sessionSeconds"],
            result["scratchRunSeconds"],
            result["workers"],
        )


def warm_up(spark_conf: Optional[Mapping[str, str]] = None) -> dict[str, Any]:
    """Start the session and run the scratch compaction and the worker job (blocking); timings."""
    from ...config import load_config
    from ...storage import Storage
    from . import SparkCompactionService
    from .session import get_session

    t0 = time.perf_counter()
    spark = get_session(spark_conf)
    t1 = time.perf_counter()
    scratch = tempfile.mkdtemp(prefix="compactmq-warmup-")
    try:
        cfg = load_config(overrides={"managedLedgerSyncData": False})
        storage = Storage(scratch, cfg)
        try:
            # twice: a small topic's run is one task (``fused``), a larger one's the three-stage
            # pipeline, whose plan's generated code is warmed by the second
            for fused_max_bytes in (None, 0):
                topic = SCRATCH_TOPIC + ("" if fused_max_bytes is None else "-pipeline")
                ml = storage.open_managed_ledger(topic)
                ml.append_many(_scratch_entries())
                ml.rollover()  # a run reads sealed ledgers only
                service = SparkCompactionService(storage, topic, cfg, spark_conf=spark_conf)
                engine = service.engine()
                if fused_max_bytes is not None:
                    engine.fused_max_bytes = fused_max_bytes
                service.compact(engine=engine)
        finally:
            storage.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    t2 = time.perf_counter()
    workers = _warm_workers(spark)
    return {
        "sessionSeconds": round(t1 - t0, 3),
        "scratchRunSeconds": round(t2 - t1, 3),
        "workerSeconds": round(time.perf_counter() - t2, 3),
        "workers": workers,
    }


#: the process's warm-up (one SparkSession per process, so one warm-up)
WARMUP = EngineWarmup()
