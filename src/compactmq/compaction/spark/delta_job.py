"""The Spark job of a delta run (``compaction.delta`` explains the design).

One action, three stages, like a full run's: the new groups are parsed and combined (one task
per group), their rows are shuffled by key into one aggregate, whose partitions look their keys
up in the previous view's sidecar (``delta.lookup``, a ``mapInArrow``), and the survivors and
superseded positions -- with one marker row per old group -- are routed to phase two by group
(``pipeline.copy_survivors``). Only new rows and superseded positions cross the JVM.
"""

from __future__ import annotations

import numpy as np

from .. import delta
from ..plan import RunPlan


def run(spark, plan: RunPlan, counter=None, keyless_counter=None) -> list[dict]:
    """Run ``plan`` as a delta run; the part descriptions of every group, by group."""
    from pyspark.sql import functions as F

    from . import pipeline

    fresh = delta.new_groups(plan)
    keys = pipeline.partition_keys(spark, max(1, len(plan.groups)))
    ddl = delta.ROW_DDL + ", grp int, route int"
    marked = np.array([delta.marker_position(plan, g) for g in delta.old_groups(plan)], np.int64)
    m_grp, m_route = pipeline.routes(plan, keys, marked)
    markers = spark.createDataFrame(
        [(int(p), 0, 0, 0, delta.MARKER, int(g), int(r)) for p, g, r in zip(marked, m_grp, m_route)], ddl
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
            found["grp"], found["route"] = pipeline.routes(plan, keys, found["pos"])
            names = ["pos", "h1", "h2", "tomb", "kind", "grp", "route"]
            yield pa.RecordBatch.from_arrays([pa.array(found[c]) for c in names], names=names)

        # one lookup task per core: each loads the sidecar's rows once (``delta.old_rows``)
        cores = max(1, int(spark.sparkContext.defaultParallelism))
        rows = latest.coalesce(cores).mapInArrow(look_up, ddl).unionByName(markers)
    return pipeline.copy_survivors(rows, plan, counter, keyless_counter)
