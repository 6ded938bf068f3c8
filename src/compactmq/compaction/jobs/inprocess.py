"""Small keep-latest runs in the broker's own process, without a Spark job.

Why
---
A Spark job has a fixed cost that no tuning of the job removes: the driver builds and plans the
DataFrames, the scheduler starts a stage per shuffle, Python workers are handed their tasks,
and the parts come back through the JVM. On a warm session that is 0.3-0.4 s on a quiet 2-core
machine (``bench/compaction_fixed_cost_bench.py``: 94 % of a 10 k-message run), several times
what the work itself costs: parsing 10 k messages, keeping the latest per key and copying the
survivors take tens of milliseconds in one Python thread. Most topics of a real deployment are
that small (a namespace's ``__change_events``, a topic per tenant), so the broker runs a small
run here instead (``compactionInProcessMaxBytes``).

What runs
---------
Exactly the functions a Spark job runs in its tasks, called in the run's own thread, in the same
order and with the same plan, so the view is the one the job would write (the same chain
segments, key sidecar and part descriptions):

* a full keep-latest run: every group through ``tasks.group_rows`` (the parsing task's body,
  with its map-side combiner) into one ``LatestCombiner`` (what Spark's ``max(p2)`` aggregate
  computes), the key TTL and tombstone cuts of ``pipeline.keep_latest`` applied with numpy,
  then ``pipeline.copy_groups`` (the phase-two task's body) over the survivors in position order
  (``fused.keep_latest_parts``, also the body of the one task that runs a small run on Spark);
* a lookup run (``compaction.lookup_run``): ``lookup_job.fused_parts``, the body of the one task that
  runs a small lookup run on Spark.

Which runs
----------
``suits(plan, max_bytes)``: keep-latest only (the other strategies' Spark operators have no copy
here), a combining plan (as the runner makes them), a lookup run only in its one-task shape, and
at most ``max_bytes`` of files to read -- the live ledgers the plan reads (whole files: an upper
bound) and the previous view (its chain manifest and segments). A plan that reads from an
object store (a URI) or whose size cannot be told goes to Spark: the bound is there so a run
never holds the broker's process for long, and "unknown" is not small.

What it reports: the run's ``job`` is None (no Spark job group), and its engine timings count
zero Spark jobs, the whole step as driver time; ``cancel`` stops the run at the next group.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Optional

from ... import errors
from .. import CompactionProgress
from .. import chain
from .. import lookup_run
from ..plan import COMPACTED, RunPlan
from . import fused, lookup_job, pipeline


class Count:
    """A counter with a Spark accumulator's ``add`` and ``value``, for the shared task bodies."""

    def __init__(self) -> None:
        self.value = 0

    def add(self, n: int) -> None:
        self.value += int(n)


def plan_bytes(plan: RunPlan) -> Optional[int]:
    """Bytes of the files ``plan`` reads (live ledgers whole, the previous view with its chain
    segments), or None when one is not a local file or cannot be measured."""
    total = 0
    for path in {s.path for s in plan.segments}:
        if "://" in path:
            return None
        try:
            if any(s.kind == COMPACTED and s.path == path for s in plan.segments):
                manifest = chain.read(path)
                total += chain.view_size(path, manifest) if manifest is not None else os.path.getsize(path)
            else:
                total += os.path.getsize(path)
        except (OSError, errors.CompactMQError):
            return None
    return total


def suits(plan: RunPlan, max_bytes: int) -> bool:
    """Whether ``plan`` runs here rather than as a Spark job (module notes)."""
    if max_bytes <= 0 or plan.strategy != "keep-latest" or not plan.combine:
        return False
    if plan.store:  # tiered storage: parts go to an object store
        return False
    if plan.is_lookup_run:
        fresh = lookup_run.new_groups(plan)
        new = sum(plan.segments[o].est_entries for g in fresh for o in plan.groups[g])
        old = sum(s.est_entries for s in lookup_run.compacted_segments(plan))
        if new > lookup_job.FUSED_MAX_ENTRIES or old > lookup_job.SPLIT_OLD_ENTRIES:
            return False
    size = plan_bytes(plan)
    return size is not None and size <= max_bytes


class InProcessEngine:
    """Runs a ``RunPlan`` that ``suits`` in the calling thread (``SparkEngine``'s shape)."""

    lookup_runs = True

    def __init__(self, parallelism: int = 1) -> None:
        self.parallelism = parallelism
        self.last_stats: dict = {}
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        self._cancelled.set()

    def _check(self) -> None:
        if self._cancelled.is_set():
            raise errors.CompactionError("compaction cancelled")

    def run(self, plan: RunPlan, strategy, report) -> list[dict]:
        if plan.strategy != "keep-latest" or not plan.combine:
            raise errors.CompactionError("the in-process engine runs combining keep-latest plans only")
        started = time.perf_counter()
        counter, keyless = Count(), Count()
        report(CompactionProgress("phase-one", 0, plan.estimated_entries))
        if plan.is_lookup_run:
            self._check()
            parts = lookup_job.fused_parts(
                plan, lookup_run.new_groups(plan), lookup_job.marker_positions(plan), counter, keyless
            )
        else:
            parts = self._keep_latest(plan, report, counter, keyless)
        self._check()
        seconds = round(time.perf_counter() - started, 4)
        self.last_stats = {
            "messages_read": counter.value,
            "keyless_kept": keyless.value,
            "job_group": None,
            "timings": {"driver": seconds, "jobs": 0.0, "other": 0.0, "count": 0},
        }
        report(CompactionProgress("phase-two", plan.estimated_entries, plan.estimated_entries))
        return normalized(parts)

    def _keep_latest(self, plan: RunPlan, report, counter: Count, keyless: Count) -> list[dict]:
        """Phase one over every group into one table of the latest row per key, the plan's
        cuts, then phase two of every group with survivors (``fused.keep_latest_parts``: the body
        of the one task that runs a small run on Spark)."""
        done = 0

        def after_group(g: int) -> None:
            nonlocal done
            done += sum(plan.segments[o].est_entries for o in plan.groups[g])
            report(CompactionProgress("phase-one", done, plan.estimated_entries))

        return fused.keep_latest_parts(plan, counter, keyless, check=self._check, after_group=after_group)


def normalized(parts: list[dict]) -> list[dict]:
    """Part descriptions as a Spark job hands them back (``pipeline.collect_parts``): every field
    of ``PART_DDL`` (None where a task left one out), by group."""
    import pyarrow as pa

    table = pa.Table.from_pylist(parts, schema=pipeline.part_schema())
    return sorted(table.to_pylist(), key=lambda d: d["group"])


__all__ = ["InProcessEngine", "plan_bytes", "suits"]
