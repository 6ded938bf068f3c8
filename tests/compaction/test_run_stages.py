"""The stages of a compaction run (``run_stages``) and the typed fields of its plan."""

import pytest

from compactmq.compaction.plan import RunPlan
from compactmq.compaction.run_stages import RunStage, RunStages
from compactmq.errors import CompactionError


def test_a_run_moves_through_its_stages_in_order_only():
    stages = RunStages()
    assert stages.stage is None and not stages.committed
    with pytest.raises(CompactionError, match="from started to written"):
        stages.advance(RunStage.WRITTEN)
    stages.advance(RunStage.PLANNED)
    with pytest.raises(CompactionError, match="from planned to committed"):
        stages.advance(RunStage.COMMITTED)  # a commit of what was never written
    stages.advance(RunStage.WRITTEN)
    assert not stages.committed
    with pytest.raises(CompactionError, match="from written to cleaned"):
        stages.advance(RunStage.CLEANED)  # cleaning up before the view is in force
    stages.advance(RunStage.COMMITTED)
    assert stages.committed
    stages.advance(RunStage.CLEANED)
    assert stages.committed and stages.stage is RunStage.CLEANED
    with pytest.raises(CompactionError):
        stages.advance(RunStage.PLANNED)  # a run is one-shot


def test_the_plan_extra_mapping_reads_and_writes_its_typed_fields():
    plan = RunPlan("t", [], [], "/nowhere", "keep-latest")
    assert dict(plan.extra) == {} and "view_keys" not in plan.extra and not plan.is_delta
    plan.extra["chain"] = {
        "dir": "d",
        "run": 7,
        "incremental": True,
        "masks": True,
        "direct_io": False,
        "delta": True,
    }
    plan.extra.update(store="s3://b", prefix="p/7")
    assert plan.chain is not None and plan.chain["run"] == 7 and plan.is_delta
    assert (plan.store, plan.prefix) == ("s3://b", "p/7")
    assert sorted(plan.extra) == ["chain", "prefix", "store"]
    assert plan.extra.get("view_keys") is None
    del plan.extra["store"]
    assert plan.store is None and "store" not in plan.extra
    with pytest.raises(KeyError):
        plan.extra["anything"] = 1  # only the plan's fields: a typo is an error, not a silent key
