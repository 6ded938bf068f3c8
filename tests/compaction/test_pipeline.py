"""DataFrame -> DataFrame pieces of the pipeline, on small literal inputs (order ignored)."""

from __future__ import annotations

import pytest

from compactmq.compaction.jobs import pipeline

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


def _packed(spark, rows):
    """keep-latest's rows as the workers hand them over (``tasks.rows_to_arrow(packed=True)``)."""
    return spark.createDataFrame(
        [(h1, h2, (p << 1) | int(t)) for h1, h2, p, t, _ in rows], "h1 long, h2 long, p2 long"
    )


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
    assert sorted(r.pos for r in pipeline.keep_latest(_packed(spark, ROWS)).collect()) == [15, 35, 40]
    assert sorted(r.pos for r in pipeline.keep_first(keyed).collect()) == [15, 30, 35]
    assert sorted(r.pos for r in pipeline.event_time(keyed).collect()) == [15, 30, 35]


def test_keep_latest_plans_a_hash_aggregate(spark, capsys):
    pipeline.keep_latest(_packed(spark, ROWS)).explain()
    plan = capsys.readouterr().out
    assert "HashAggregate" in plan and "SortAggregate" not in plan and "ObjectHashAggregate" not in plan
