"""A small full keep-latest run as ONE Spark task: one job, one stage, no shuffle.

Why
---
A full run on Spark is a DataFrame pipeline (``pipeline``): a parsing stage, a shuffle into
``max(p2)`` per key, a shuffle routing the survivors to their group's phase-two task. For a
small topic that pipeline is almost all fixed cost: at 10 k messages / 1 k keys a warm run
launched 2 Spark jobs and 3 stages (plus a skipped one) and made about 160 round trips to the
JVM to build, plan and collect the DataFrames (``bench/compaction_fixed_cost_bench.py``), for
tens of milliseconds of actual work. A plan whose input is ONE group gains nothing from that
shape: its phase one is already one task, the aggregate receives one task's combined rows (one
per key already: nothing left to aggregate) and its phase two is one group's, so one task.

What runs
---------
``suits`` picks a combining keep-latest full run of one group reading at most
``FUSED_MAX_BYTES`` of local files; ``run`` hands it to one task of a plain RDD job (no SQL
planning, no Arrow conversions, a handful of JVM round trips) whose body is ``keep_latest_parts``:
the group parsed through ``tasks.group_rows`` into one ``LatestCombiner`` (what the aggregate
computes), the key TTL and tombstone cuts of ``pipeline.keep_latest``, then
``pipeline.copy_groups`` (the phase-two task's body). The in-process engine (``inprocess``) runs
the same body in the broker's thread, so the view is the one the three-stage job would write.
A lookup run has its own one-task shape (``lookup_job``); other strategies keep the pipeline.
"""

from __future__ import annotations

from typing import Callable, Iterable, Optional

import numpy as np

from .. import entry_scan as es
from .. import message_rows as mr
from .. import tasks
from ..plan import RunPlan

#: a one-group plan reading more than this (live ledgers whole) keeps the three-stage pipeline:
#: the bound keeps one worker's share of a run short (64 MiB: about 500 k 100-byte messages)
FUSED_MAX_BYTES = 64 * 1024 * 1024


def suits(plan: RunPlan, max_bytes: int = FUSED_MAX_BYTES) -> bool:
    """Whether ``plan`` runs as one task (module notes); ``max_bytes`` 0: never."""
    from .inprocess import plan_bytes

    if max_bytes <= 0 or plan.strategy != "keep-latest" or not plan.combine or plan.is_lookup_run:
        return False
    if len(plan.groups) != 1:
        return False
    size = plan_bytes(plan)
    return size is not None and size <= max_bytes


def latest_of_groups(
    plan: RunPlan,
    groups: Iterable[int],
    counter=None,
    keyless_counter=None,
    *,
    check: Callable[[], None] = lambda: None,
    after_group: Optional[Callable[[int], None]] = None,
):
    """The groups ``groups`` of ``plan`` parsed and combined, in the calling thread, into one row
    per key (its latest message, tombstones included: ``message_rows.LatestCombiner``); each
    group's parsed messages counted into ``counter`` and its retained keyless ones into
    ``keyless_counter``. ``check`` is called before each group (it raises to stop),
    ``after_group`` after it."""
    combiner = mr.LatestCombiner()
    for g in groups:
        check()
        stats: dict = {}
        for rows in tasks.group_rows(plan, g, stats):
            combiner.add(rows)
        if counter is not None:
            counter.add(stats.get("messages", 0))
        if keyless_counter is not None:
            keyless_counter.add(stats.get("keyless", 0))
        if after_group is not None:
            after_group(g)
    return combiner.rows()


def keep_latest_parts(
    plan: RunPlan,
    counter=None,
    keyless_counter=None,
    *,
    check: Callable[[], None] = lambda: None,
    after_group: Optional[Callable[[int], None]] = None,
) -> list[dict]:
    """The whole of a full keep-latest run in the calling thread: every group parsed and combined
    into the latest row per key, the plan's cuts, phase two of every group with survivors; the
    part descriptions (not normalized: ``inprocess.normalized``). ``check`` is called between
    steps (it raises to stop), ``after_group`` after each group is parsed."""
    latest = latest_of_groups(
        plan, range(len(plan.groups)), counter, keyless_counter, check=check, after_group=after_group
    )
    tomb = (latest.flags & es.FLAG_TOMBSTONE) != 0
    live = ~tomb
    if plan.tombstones_from is not None:
        live |= latest.pos >= np.int64(plan.tombstones_from)
    if plan.drop_before:
        live &= latest.pos >= np.int64(plan.drop_before)
    keep = np.flatnonzero(live)
    arrays = {"pos": latest.pos[keep], "h1": latest.h1[keep], "h2": latest.h2[keep]}
    key_cols = ["h1", "h2"]
    if plan.tombstones_from is not None:  # a tombstone may survive (``pipeline.tomb_column``)
        arrays["tomb"] = tomb[keep].astype(np.int64)
        key_cols.append("tomb")
    order = es.position_order(arrays["pos"])
    arrays = {c: a[order] for c, a in arrays.items()}
    check()
    from . import pipeline

    return pipeline.copy_groups(plan, arrays, key_cols, counter, keyless_counter)


def run(spark, plan: RunPlan, counter=None, keyless_counter=None) -> list[dict]:
    """``plan`` (one that ``suits``) as one task of one Spark job; the part descriptions, by
    group, as ``pipeline.collect_parts`` returns them."""
    return one_task(spark, lambda: keep_latest_parts(plan, counter, keyless_counter))


def one_task(spark, body: Callable[[], list]) -> list[dict]:
    """``body()`` (part descriptions) run by ONE task of a plain RDD job: a handful of JVM round
    trips, where a DataFrame's ``mapInArrow`` and ``toArrow`` cost some forty to build, plan and
    collect; the parts normalized and by group, as ``pipeline.collect_parts`` returns them."""
    from .inprocess import normalized

    def whole_run(_):
        return body()

    # ``range`` makes its one partition on the executor (nothing is serialised to the JVM)
    return normalized(spark.sparkContext.range(0, 1, 1, 1).mapPartitions(whole_run).collect())


__all__ = ["FUSED_MAX_BYTES", "keep_latest_parts", "one_task", "run", "suits"]
