"""The stages of one compaction run, and what a failure at each of them leaves to undo.

A run (``runner.CompactionRunner.run``) moves through four stages, in this order and no other:

    (started) --plan--> PLANNED --write--> WRITTEN --commit--> COMMITTED --clean--> CLEANED

* PLANNED: the run knows what it reads (``plan.RunPlan``) and where its view goes
  (``view_store.ViewStore.prepare``); it holds the topic's retention hold and a new view id.
* WRITTEN: the engine wrote the parts, the view's manifest and key sidecar exist under names no
  committed view uses, and the view is published for readers to find once committed.
* COMMITTED: one compare-and-set in the metadata store (``state.CompactionStates.commit``)
  made the new view the one in force, with its horizon.
* CLEANED: the retention hold moved to the new horizon, the run's scratch directory and what
  the previous view named and the new one does not are gone.

Before COMMITTED a failure discards what the run wrote (the view in force is untouched); from
COMMITTED on nothing is discarded, because the new view is in force: what clean-up a crash cuts
short, an orphan sweep redoes. ``RunStages.advance`` refuses any other order, so a change to
the runner that commits before it wrote, or cleans before it committed, fails loudly.

These stages are the run's own. The topic's compaction *status* in the metadata store
(NOT_RUN, RUNNING, SUCCESS, ERROR; ``state``) is what operators see: RUNNING covers
PLANNED to COMMITTED, and the commit sets SUCCESS. A run that finds nothing to compact on a
topic never compacted plans nothing and goes NOT_RUN -> RUNNING -> SUCCESS
(``CompactionStates.record_empty``) without entering these stages.
"""

from __future__ import annotations

import enum
from typing import Optional

from ..errors import CompactionError


class RunStage(enum.Enum):
    PLANNED = "planned"
    WRITTEN = "written"
    COMMITTED = "committed"
    CLEANED = "cleaned"


#: the one stage each stage may move to (None: a run that has not planned yet)
NEXT: dict[Optional[RunStage], RunStage] = {
    None: RunStage.PLANNED,
    RunStage.PLANNED: RunStage.WRITTEN,
    RunStage.WRITTEN: RunStage.COMMITTED,
    RunStage.COMMITTED: RunStage.CLEANED,
}


class RunStages:
    """Where one run is (module docstring); ``advance`` is the only way to move."""

    def __init__(self) -> None:
        self.stage: Optional[RunStage] = None

    def advance(self, to: RunStage) -> None:
        expected = NEXT.get(self.stage)
        if to is not expected:
            raise CompactionError(
                f"a compaction run cannot go from {self.stage.value if self.stage else 'started'} "
                f"to {to.value}"
            )
        self.stage = to

    @property
    def committed(self) -> bool:
        """Whether the run's view is in force: nothing it wrote may be discarded any more."""
        return self.stage in (RunStage.COMMITTED, RunStage.CLEANED)
