"""The Spark job of a lookup run (``compaction.lookup_run`` explains the design).

One action. With many new entries, three stages like a full run's: the new groups are parsed
and combined (one task per group), their rows are shuffled by key into one aggregate, whose
partitions look their keys up in the previous view's sidecar (``lookup_run.lookup``, a
``mapInArrow``), and the survivors and superseded positions -- with one marker row per old
group -- are routed to phase two by group (``pipeline.copy_survivors``). With few (up to
``FUSED_MAX_ENTRIES``: about 1 % of a 100 M-message topic), ONE task parses and combines all of
them, looks them up and does every group's phase two (``pipeline.copy_groups``): one stage, no
shuffle, as little of Spark's fixed cost per job as a job can have (the new survivors of 1 % of
10 M messages take a tenth of a second to copy). When the previous view is large (more than
``SPLIT_OLD_ENTRIES`` entries), that one task would read its whole key sidecar alone; the run
is then two jobs (``_split``): the new messages parsed and combined in one task, their keys
broadcast, and a task per group -- an old group's looks the keys up in its own rows only. In
every shape only new rows and superseded positions cross the JVM.
"""

from __future__ import annotations

import numpy as np

from .. import lookup_run
from ..plan import COMPACTED, RunPlan


#: new entries up to which one task does the whole run (``run``)
FUSED_MAX_ENTRIES = 1_000_000
#: previous views of more entries than this are looked up by their own groups' tasks (``_split``)
SPLIT_OLD_ENTRIES = 4_000_000


def run(spark, plan: RunPlan, counter=None, keyless_counter=None) -> list[dict]:
    """Run ``plan`` as a lookup run; the part descriptions of every group, by group."""
    from pyspark.sql import functions as F

    from . import pipeline
    from .joint_plan import JointPlan

    fresh = lookup_run.new_groups(plan)
    marked = marker_positions(plan)
    new_entries = sum(plan.segments[o].est_entries for g in fresh for o in plan.groups[g])
    old_entries = sum(s.est_entries for s in lookup_run.compacted_segments(plan))
    if plan.combine and new_entries <= FUSED_MAX_ENTRIES and old_entries > SPLIT_OLD_ENTRIES:
        return _split(spark, plan, fresh, counter, keyless_counter)
    if plan.combine and new_entries <= FUSED_MAX_ENTRIES:
        # few new messages: ONE task parses them all, combines them to one row per key, looks
        # those up and writes every group's part: no aggregate and no shuffle, one stage, of a
        # plain RDD job (no SQL planning or Arrow conversions on the driver: ``fused.one_task``)
        from .fused import one_task

        return one_task(spark, lambda: fused_parts(plan, fresh, marked, counter, keyless_counter))
    own = JointPlan.of([plan])  # a job of one member (``joint_plan``)
    keys = pipeline.partition_keys(spark, max(1, len(plan.groups)))
    ddl = lookup_run.ROW_DDL + ", route int"
    markers = spark.createDataFrame(
        [
            (int(p), 0, 0, 0, lookup_run.MARKER, int(r))
            for p, r in zip(marked, pipeline.routes(plan, keys, marked))
        ],
        ddl,
    )
    rows = markers
    if fresh:
        packed = pipeline.read_rows(spark, own, [counter], [keyless_counter], packed=True, groups=fresh)
        latest = packed.groupBy("h1", "h2").agg(F.max("p2").alias("p2"))

        def look_up(batches):
            import pyarrow as pa

            cols: dict = {"h1": [], "h2": [], "p2": []}
            for b in batches:
                for c in cols:
                    cols[c].append(b.column(c).to_numpy(zero_copy_only=False))
            if not cols["h1"]:
                return
            found = lookup_run.lookup(plan, *(np.concatenate(cols[c]) for c in ("h1", "h2", "p2")))
            found["route"] = pipeline.routes(plan, keys, found["pos"])
            names = ["pos", "h1", "h2", "tomb", "kind", "route"]
            yield pa.RecordBatch.from_arrays([pa.array(found[c]) for c in names], names=names)

        # one lookup task per core: each loads the sidecar's rows once (``lookup_run.old_rows``)
        cores = max(1, int(spark.sparkContext.defaultParallelism))
        rows = latest.coalesce(cores).mapInArrow(look_up, ddl).unionByName(markers)
    (parts,) = pipeline.copy_survivors(rows, own, [counter], [keyless_counter])
    return parts


def fused_parts(
    plan: RunPlan, fresh: list[int], marked: np.ndarray, counter=None, keyless_counter=None
) -> list:
    """The whole of a lookup run of few new messages, in the calling task: the new groups
    ``fresh`` parsed and combined to one row per key, looked up in the previous view's sidecar,
    and every group's phase two (``marked``: a marker position per old group, so each has its
    say); the part descriptions. One Spark task runs it (``run``), or the driver itself for a
    small run (``spark.inprocess``)."""
    from .. import entry_scan as es
    from . import pipeline

    latest = new_latest(plan, fresh, counter, keyless_counter)
    p2 = (latest.pos << 1) | (latest.flags & es.FLAG_TOMBSTONE).astype(np.int64)
    found = lookup_run.lookup(plan, latest.h1, latest.h2, p2)
    z = np.zeros(len(marked), np.int64)  # every old group has its say
    rows = {
        "pos": np.r_[found["pos"], marked],
        "h1": np.r_[found["h1"], z],
        "h2": np.r_[found["h2"], z],
        "tomb": np.r_[found["tomb"], z],
        "kind": np.r_[found["kind"], np.full(len(marked), lookup_run.MARKER, np.int8)],
    }
    order = np.argsort(rows["pos"], kind="stable")
    rows = {c: a[order] for c, a in rows.items()}
    return pipeline.copy_groups(plan, rows, ["h1", "h2", "tomb"], counter, keyless_counter)


def marker_positions(plan: RunPlan) -> np.ndarray:
    """A marker position per old group of ``plan`` (``lookup_run.marker_position``)."""
    return np.array([lookup_run.marker_position(plan, g) for g in lookup_run.old_groups(plan)], np.int64)


def new_latest(plan: RunPlan, fresh: list[int], counter=None, keyless_counter=None):
    """In one task: the new groups ``fresh`` parsed and combined to one row per key (its latest
    message, tombstones included); the messages parsed counted into ``counter``, the retained
    keyless ones into ``keyless_counter``."""
    from .fused import latest_of_groups

    return latest_of_groups(plan, fresh, counter, keyless_counter)


def _split(spark, plan: RunPlan, fresh: list[int], counter=None, keyless_counter=None) -> list[dict]:
    """A lookup run of few new messages over a large previous view, in two jobs. One task parses
    and combines the new messages (one row per key, to the driver: what grows with the new
    data); then every group has a task of its own, in parallel: a new group's copies its
    survivors, an old group's reads only its own ledgers' sidecar rows, finds those whose key
    is one of the new keys (broadcast) and retires them (``lookup_run.retire_group``). The one-task
    run reads the whole sidecar in one worker instead: 13.7 of the 13.9 s of a run after 1 %
    new messages at 30 M keys."""
    from .. import entry_scan as es
    from . import pipeline

    def parse(batches):
        from .. import tasks

        for _ in batches:
            yield tasks.rows_to_arrow(new_latest(plan, fresh, counter, keyless_counter), False)

    schema = "h1 long, h2 long, pos long, flags byte"
    latest = spark.range(0, 1, 1, 1).mapInArrow(parse, schema).toArrow()
    h1, h2, pos = (latest.column(c).to_numpy().astype(np.int64) for c in ("h1", "h2", "pos"))
    tomb = (latest.column("flags").to_numpy().astype(np.int64) & es.FLAG_TOMBSTONE) != 0
    keyed = h2 != es.KEYLESS_MARK
    live = lookup_run.survives(plan, pos, tomb)
    order = np.argsort(pos[live], kind="stable")
    shared = spark.sparkContext.broadcast(
        {
            "h1": h1[keyed],  # every new key, tombstones too: a newer delete supersedes as well
            "h2": h2[keyed],
            "survivors": {  # in position order, as phase two copies them
                "pos": pos[live][order],
                "h1": h1[live][order],
                "h2": h2[live][order],
                "tomb": tomb[live][order].astype(np.int64),
            },
        }
    )

    def phase_two(batches):
        import pyarrow as pa

        new = shared.value
        surv = new["survivors"]
        group_of = np.asarray(plan.group_of_ordinal(), np.int64)[surv["pos"] >> pipeline._POS_SHIFT]
        for b in batches:
            for g in b.column(0).to_pylist():
                if plan.segments[plan.groups[g][0]].kind == COMPACTED:
                    rows = lookup_run.old_rows(plan, [plan.segments[o] for o in plan.groups[g]])
                    stats: dict = {}
                    part = lookup_run.retire_group(
                        plan, g, lookup_run.superseded_in(rows, new["h1"], new["h2"]), stats, rows
                    )
                    if counter is not None:
                        counter.add(stats.get("messages", 0))
                    if keyless_counter is not None:
                        keyless_counter.add(stats.get("keyless", 0))
                else:
                    m = np.flatnonzero(group_of == g)
                    if not len(m):  # no survivor: no part (as in a one-task run)
                        continue
                    part = pipeline.copy_part(plan, g, surv["pos"][m], surv, m, ["h1", "h2", "tomb"])
                yield pa.RecordBatch.from_pylist([part], schema=pipeline.part_schema())

    n = len(plan.groups)
    try:
        return pipeline.collect_parts(spark.range(0, n, 1, n).mapInArrow(phase_two, pipeline.PART_DDL))
    finally:
        shared.unpersist()
