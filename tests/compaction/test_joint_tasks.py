"""How many tasks a joint job's stages get (``spark.multi.task_count``): small topics share
tasks, large ones keep a task per group, and phase two's routes follow phase one's runs of
groups. No Spark: plans over files of known sizes."""

from __future__ import annotations

from compactmq.compaction.plan import LIVE, RunPlan, Segment
from compactmq.compaction.jobs.joint_plan import JointPlan
from compactmq.compaction.jobs.multi import TASK_BYTES, task_count
from compactmq.compaction.jobs.pipeline import packed_routes


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


def test_a_plan_of_its_own_is_a_joint_plan_of_one_member(tmp_path):
    """A single topic's run computes the joint plan of its one plan (``joint_plan``): the plan
    itself, its rows and key hashes its own (offset 0, salt 0), so the view is the one the topic
    gets alone -- while a second member's rows are moved and salted apart."""
    import numpy as np

    from compactmq.compaction import entry_scan as es
    from compactmq.compaction import message_rows as mr
    from compactmq.compaction.jobs.joint_plan import relabel, unsalt

    path = tmp_path / "seg"
    path.write_bytes(b"x")
    plan = _plan(str(path), 3)
    joint = JointPlan.of([plan])
    assert joint.plan is plan and joint.offsets == [0] and joint.owners == [(0, 0), (0, 1), (0, 2)]
    assert (joint.base(0), joint.end(0)) == (0, 3 << (es.ENTRY_BITS + es.BATCH_BITS))
    pos = np.array([5, 9, 1 << 40], np.int64)
    keyless = np.array([0, es.FLAG_KEYLESS, 0], np.int8)
    h2 = np.array([7, es.KEYLESS_MARK, 8], np.int64)
    rows = mr.Rows(np.array([11, 9, 13], np.int64), h2, pos, keyless, None)
    assert relabel(rows, 0, 0) is rows
    assert unsalt(rows.h1, h2, pos, 0).tolist() == rows.h1.tolist()
    # a second member: positions offset, keyed hashes salted, a keyless row's hash its position
    second = relabel(rows, 1, 3)
    shift = np.int64(3 << (es.ENTRY_BITS + es.BATCH_BITS))
    assert second.pos.tolist() == (pos + shift).tolist()
    assert second.h1[1] == second.pos[1] and second.h1[0] != 11 and second.h1[2] != 13
    assert unsalt(second.h1, h2, pos, 1).tolist() == rows.h1.tolist()
