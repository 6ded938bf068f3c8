"""How many tasks a joint job's stages get (``spark.multi.task_count``): small topics share
tasks, large ones keep a task per group, and phase two's routes follow phase one's runs of
groups. No Spark: plans over files of known sizes."""

from __future__ import annotations

from compactmq.compaction.plan import LIVE, RunPlan, Segment
from compactmq.compaction.jobs.multi import TASK_BYTES, JointPlan, packed_routes, task_count


def _plan(path: str, groups: int = 1) -> RunPlan:
    segments = [Segment(i, 10 + i, LIVE, path, None, 0, 9, 10) for i in range(groups)]
    return RunPlan("persistent://t/n/x", segments, [[i] for i in range(groups)], "", "keep-latest")


def test_small_plans_share_tasks_large_ones_do_not(tmp_path):
    small = tmp_path / "small"
    small.write_bytes(b"x" * 1000)
    joint = JointPlan.of([_plan(str(small), 2) for _ in range(50)])
    assert task_count(joint, cores=2) == 2  # 100 groups of a few KB: one task per core
    big = tmp_path / "big"
    with open(big, "wb") as f:
        f.truncate(TASK_BYTES * 3)  # sparse: its size is what counts
    assert task_count(JointPlan.of([_plan(str(big), 2) for _ in range(3)]), cores=2) == 6
    assert task_count(JointPlan.of([_plan("s3://bucket/ledger", 4)]), cores=2) == 4  # size unknown


def test_packed_routes_give_each_task_a_contiguous_run_of_groups():
    keys = [101, 202, 303]
    routes = packed_routes(keys, 7)
    assert routes == sorted(routes, key=keys.index)  # runs, in task order
    assert set(routes) == set(keys)
    assert packed_routes([5], 4) == [5, 5, 5, 5]
    assert packed_routes([1, 2, 3, 4], 4) == [1, 2, 3, 4]
