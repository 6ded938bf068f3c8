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


def test_a_plan_is_a_delta_run_only_when_its_chain_says_so():
    plan = RunPlan("t", [], [], "/nowhere", "keep-latest")
    assert (plan.chain, plan.store, plan.prefix, plan.view_keys) == (None, None, None, None)
    assert not plan.is_lookup_run
    chain = {"dir": "d", "run": 7, "incremental": True, "masks": True, "direct_io": False, "lookup": False}
    plan.chain = chain
    assert not plan.is_lookup_run
    plan.chain = {**chain, "lookup": True}
    assert plan.chain["run"] == 7 and plan.is_lookup_run
    with pytest.raises(TypeError):
        RunPlan("t", [], [], "/nowhere", "keep-latest", extra={})
