"""The shell every compaction job on Spark runs in: one job group, counters, progress, cancel.

A single topic's run (``SparkEngine.run``: a full run or a lookup run, ``lookup_job``) and a joint
job of several topics (``multi.JointRun``: the partitions of a partitioned topic, the topics due
at one check) differ in what the job computes, not in how it runs. Each names a job group (what
``cancel`` cancels and ``timeline`` reads back), counts the messages parsed and the keyless
messages kept in Spark accumulators (one pair per topic of the job), reports progress from
Spark's status tracker in a thread of its own (``SparkEngine._poll``), and unsets the thread's
job group when done, whatever happened. ``spark_job`` is that shell, written once; a single
topic's job is a job of one member.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

from .. import CompactionProgress, ProgressCallback
from ..plan import RunPlan


@dataclass
class SparkJob:
    """One running job: its group and, per member, its two counters."""

    group: str
    counters: list  # messages parsed, per member (Spark accumulators)
    keyless: list  # keyless messages kept, per member
    started: float  # wall clock at the start (``timeline``)


@contextlib.contextmanager
def spark_job(
    engine,
    plan: RunPlan,
    report: ProgressCallback,
    description: str,
    *,
    members: int = 1,
    prefix: str = "compactmq",
    on_group: Callable[[Optional[str]], None] = lambda group: None,
) -> Iterator[SparkJob]:
    """Run the body as one Spark job group of ``engine``'s session: ``plan`` is what progress
    is measured against (a joint job's joint plan), ``on_group`` hears the group when it starts
    and None when it is over (so a ``cancel`` from another thread finds it). Progress reports
    phase one at the start and phase two once the body returned."""
    sc = engine.spark.sparkContext
    started = time.time()
    counters = [sc.accumulator(0) for _ in range(members)]
    keyless = [sc.accumulator(0) for _ in range(members)]
    group = f"{prefix}-{uuid.uuid4().hex[:12]}"
    sc.setJobGroup(group, description, interruptOnCancel=True)
    on_group(group)
    stop = threading.Event()
    poller = threading.Thread(target=engine._poll, args=(sc, group, plan, report, stop), daemon=True)
    poller.start()
    try:
        report(CompactionProgress("phase-one", 0, plan.estimated_entries))
        yield SparkJob(group, counters, keyless, started)
    finally:
        on_group(None)
        stop.set()
        poller.join()
        sc.setLocalProperty("spark.jobGroup.id", None)
    report(CompactionProgress("phase-two", plan.estimated_entries, plan.estimated_entries))
