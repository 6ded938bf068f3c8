"""The Spark job of a delta run (``compaction.delta`` explains the design).

One action. With many new entries, three stages like a full run's: the new groups are parsed
and combined (one task per group), their rows are shuffled by key into one aggregate, whose
partitions look their keys up in the previous view's sidecar (``delta.lookup``, a
``mapInArrow``), and the survivors and superseded positions -- with one marker row per old
group -- are routed to phase two by group (``pipeline.copy_survivors``). With few (up to
``FUSED_MAX_ENTRIES``: about 1 % of a 100 M-message topic), ONE task parses and combines all of
them, looks them up and does every group's phase two (``pipeline.copy_groups``): one stage, no
shuffle, as little of Spark's fixed cost per job as a job can have (the new survivors of 1 % of
10 M messages take a tenth of a second to copy). Either way only new rows and superseded
positions cross the JVM.
"""

from __future__ import annotations

import numpy as np

from .. import delta
from ..plan import RunPlan


#: new entries up to which one task does the whole run (``run``)
FUSED_MAX_ENTRIES = 1_000_000


def run(spark, plan: RunPlan, counter=None, keyless_counter=None) -> list[dict]:
    """Run ``plan`` as a delta run; the part descriptions of every group, by group."""
    from pyspark.sql import functions as F

    from . import pipeline

    fresh = delta.new_groups(plan)
    marked = np.array([delta.marker_position(plan, g) for g in delta.old_groups(plan)], np.int64)
    new_entries = sum(plan.segments[o].est_entries for g in fresh for o in plan.groups[g])
    if plan.combine and new_entries <= FUSED_MAX_ENTRIES:
        # few new messages: ONE task parses them all, combines them to one row per key, looks
        # those up and writes every group's part: no aggregate and no shuffle, one stage
        def whole_run(batches):
            import pyarrow as pa

            from .. import entry_scan as es
            from .. import tasks

            for _ in batches:
                stats: dict = {}
                combiner = es.LatestCombiner()
                for g in fresh:
                    for part in tasks.group_rows(plan, g, stats):
                        combiner.add(part)
                latest = combiner.rows()
                if counter is not None:
                    counter.add(stats.get("messages", 0))
                if keyless_counter is not None:
                    keyless_counter.add(stats.get("keyless", 0))
                p2 = (latest.pos << 1) | (latest.flags & es.FLAG_TOMBSTONE).astype(np.int64)
                found = delta.lookup(plan, latest.h1, latest.h2, p2)
                z = np.zeros(len(marked), np.int64)  # every old group has its say
                rows = {
                    "pos": np.r_[found["pos"], marked],
                    "h1": np.r_[found["h1"], z],
                    "h2": np.r_[found["h2"], z],
                    "tomb": np.r_[found["tomb"], z],
                    "kind": np.r_[found["kind"], np.full(len(marked), delta.MARKER, np.int8)],
                }
                order = np.argsort(rows["pos"], kind="stable")
                rows = {c: a[order] for c, a in rows.items()}
                out = pipeline.copy_groups(plan, rows, ["h1", "h2", "tomb"], counter, keyless_counter)
                yield pa.RecordBatch.from_pylist(out, schema=pipeline.part_schema())

        return pipeline.collect_parts(spark.range(0, 1, 1, 1).mapInArrow(whole_run, pipeline.PART_DDL))
    keys = pipeline.partition_keys(spark, max(1, len(plan.groups)))
    ddl = delta.ROW_DDL + ", route int"
    markers = spark.createDataFrame(
        [
            (int(p), 0, 0, 0, delta.MARKER, int(r))
            for p, r in zip(marked, pipeline.routes(plan, keys, marked))
        ],
        ddl,
    )
    rows = markers
    if fresh:
        keyed = pipeline.with_key_hash(
            pipeline.read_rows(spark, plan, counter, keyless_counter, groups=fresh)
        )
        p2 = F.shiftleft(F.col("pos"), 1).bitwiseOR(F.col("tomb").cast("long"))
        latest = keyed.groupBy("h1", "h2").agg(F.max(p2).alias("p2"))

        def look_up(batches):
            import pyarrow as pa

            cols: dict = {"h1": [], "h2": [], "p2": []}
            for b in batches:
                for c in cols:
                    cols[c].append(b.column(c).to_numpy(zero_copy_only=False))
            if not cols["h1"]:
                return
            found = delta.lookup(plan, *(np.concatenate(cols[c]) for c in ("h1", "h2", "p2")))
            found["route"] = pipeline.routes(plan, keys, found["pos"])
            names = ["pos", "h1", "h2", "tomb", "kind", "route"]
            yield pa.RecordBatch.from_arrays([pa.array(found[c]) for c in names], names=names)

        # one lookup task per core: each loads the sidecar's rows once (``delta.old_rows``)
        cores = max(1, int(spark.sparkContext.defaultParallelism))
        rows = latest.coalesce(cores).mapInArrow(look_up, ddl).unionByName(markers)
    return pipeline.copy_survivors(rows, plan, counter, keyless_counter)
