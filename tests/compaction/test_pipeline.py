"""DataFrame -> DataFrame pieces of the pipeline, on small literal inputs (order ignored)."""

from __future__ import annotations

import pytest

from compactmq.compaction.spark import pipeline

pytestmark = pytest.mark.spark


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_partition_keys_give_each_group_its_own_task(spark, n):
    from pyspark.sql import functions as F

    keys = pipeline.partition_keys(spark, n)
    df = spark.createDataFrame([(k,) for k in keys], "k int").repartition(n, "k")
    placed = {r.k: r.pid for r in df.select("k", F.spark_partition_id().alias("pid")).collect()}
    assert [placed[k] for k in keys] == list(range(n))


def _keyed(spark, rows):
    return spark.createDataFrame(rows, "h1 long, h2 long, pos long, tomb boolean, et long")


ROWS = [  # key (1,1): a, tombstone, b, c ; key (2,2): x ; key (3,3): only a tombstone; key (1,9): collides on h1
    (1, 1, 10, False, 5),
    (1, 1, 20, True, 0),
    (1, 1, 30, False, 9),
    (1, 1, 40, False, 2),
    (2, 2, 15, False, 0),
    (3, 3, 25, True, 0),
    (1, 9, 35, False, 0),
]


def test_keep_latest_first_and_event_time(spark):
    keyed = _keyed(spark, ROWS)
    assert sorted(r.pos for r in pipeline.keep_latest(keyed).collect()) == [15, 35, 40]
    assert sorted(r.pos for r in pipeline.keep_first(keyed).collect()) == [15, 30, 35]
    assert sorted(r.pos for r in pipeline.event_time(keyed).collect()) == [15, 30, 35]


def test_keep_latest_plans_a_hash_aggregate(spark, capsys):
    pipeline.keep_latest(_keyed(spark, ROWS)).explain()
    plan = capsys.readouterr().out
    assert "HashAggregate" in plan and "SortAggregate" not in plan and "ObjectHashAggregate" not in plan


@pytest.mark.parametrize("with_extension", [True, False], ids=["C-table", "numpy"])
def test_reduce_latest_is_keep_latest_whatever_the_order_of_its_batches(monkeypatch, with_extension):
    """``keep_latest_reduced``'s task: rows of several parsing tasks, in any order, give each key's
    latest row unless it is a tombstone (one from the retention cut stays) or below the TTL cut --
    the rule ``keep_latest`` aggregates with Spark -- routed by the position's group."""
    import os
    import random

    import numpy as np
    import pyarrow as pa

    from compactmq.compaction import entry_scan as es
    from compactmq.compaction import native
    from compactmq.compaction.plan import LIVE, RunPlan, Segment

    if not with_extension:
        monkeypatch.setattr(native, "library", lambda: None)
    elif native.library() is None:
        pytest.skip("the C extension is not built")
    shift = es.ENTRY_BITS + es.BATCH_BITS
    segs = [Segment(o, 100 + o, LIVE, "l", None, 0, 1 << 40, 10) for o in range(4)]
    rng = random.Random(5)
    rows = []  # (h1, h2, pos, flags): positions unique, keys colliding on h1 now and then
    for o in range(4):
        for e in range(300):
            k = rng.randrange(60)
            rows.append(
                (
                    k % 17,
                    k,
                    (o << shift) | (e << es.BATCH_BITS),
                    es.FLAG_TOMBSTONE if rng.random() < 0.2 else 0,
                )
            )
    for cut in [dict(), dict(tombstones_from=(2 << shift), drop_before=(1 << shift))]:
        plan = RunPlan("t", segs, [[0, 1], [2, 3]], os.path.join("/nonexistent", "run"), "keep-latest", **cut)
        latest: dict = {}
        for h1, h2, pos, flags in rows:
            if (h1, h2) not in latest or pos > latest[(h1, h2)][0]:
                latest[(h1, h2)] = (pos, flags)
        expected = sorted(
            (pos, h1, h2, flags)
            for (h1, h2), (pos, flags) in latest.items()
            if (not flags or pos >= cut.get("tombstones_from", 1 << 62)) and pos >= cut.get("drop_before", 0)
        )
        shuffled = rows[:]
        rng.shuffle(shuffled)
        batches = []
        for a in range(0, len(shuffled), 97):
            h1, h2, pos, flags = (np.array(c, np.int64) for c in zip(*shuffled[a : a + 97]))
            names = ["h1", "h2", "pos", "flags"]
            batches.append(
                pa.RecordBatch.from_arrays(
                    [pa.array(h1), pa.array(h2), pa.array(pos), pa.array(flags.astype(np.int8))], names=names
                )
            )
        (out,) = list(pipeline.reduce_latest(plan, [70, 71], iter(batches)))
        got = sorted(zip(*(out.column(c).to_pylist() for c in ("pos", "h1", "h2", "tomb"))))
        assert [(p, a, b, int(t != 0)) for p, a, b, t in got] == [
            (p, a, b, int(f != 0)) for p, a, b, f in expected
        ]
        route = dict(zip(out.column("pos").to_pylist(), out.column("route").to_pylist()))
        assert all(route[p] == (70 if (p >> shift) < 2 else 71) for p in route)
