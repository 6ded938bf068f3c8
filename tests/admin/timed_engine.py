"""A compaction factory whose jobs take a set time: ``fixed + per_topic x topics`` seconds.

For the monitor's scheduling (``compaction_jobsize``, the lag bound) the compacted data does not
matter, the time a job takes does: each run reads its horizon (the topic's last entry) when
the job starts, sleeps -- a sleep needs no CPU, so a busy machine changes the figures little --
and commits that horizon through the real compaction state (SQLite), as a run does. Used by
``test_compaction_lag_jobsize`` and ``bench/lag_schedule_bench.py --engine timed``.
"""

from __future__ import annotations

import time

from compactmq.compaction import CompactionResult, CompactionServiceFactory, TopicCompactionService
from compactmq.compaction.state import states_of


class TimedCompaction(TopicCompactionService):
    """One topic: mark running, read the horizon, wait, commit."""

    def __init__(self, factory: "TimedFactory", topic: str) -> None:
        self.factory = factory
        self.topic = topic

    def state(self):
        return states_of(self.factory.storage).get(self.topic)

    def get_last_compacted_position(self):
        return self.state().horizon

    def read_compacted_entries(self, start_position, n):
        return []

    def read_last_compacted_entry(self):
        return None

    def begin(self):
        states = states_of(self.factory.storage)
        st = states.mark_running(self.topic, self.state().version)
        ml = self.factory.storage.open_managed_ledger(self.topic, create=False)
        return st, ml.last_position()

    def finish(self, begun) -> CompactionResult:
        st, horizon = begun
        if self.topic in self.factory.fail:
            states_of(self.factory.storage).record_failure(self.topic, "boom", expected_version=st.version)
            raise RuntimeError(f"compaction of {self.topic} failed: boom")
        view = self.factory.storage.resources.ledger_ids.allocate()
        states_of(self.factory.storage).commit(self.topic, view, horizon, expected_version=st.version)
        return CompactionResult(self.topic, view, horizon, 1, 1, 1, 1, 0, 1)

    def compact(self, progress=None):
        return self.factory.compact_together([self])[0]


class TimedFactory(CompactionServiceFactory):
    """Jobs of ``fixed + per_topic x topics`` seconds; topics in ``fail`` fail on their own."""

    def __init__(self, storage, fixed: float, per_topic: float) -> None:
        self.storage = storage
        self.fixed = fixed
        self.per_topic = per_topic
        self.fail: set[str] = set()
        self.jobs: list[int] = []  # topics of each job, in order

    def new_service(self, topic):
        return TimedCompaction(self, topic)

    def compact_together(self, services, progress=None) -> list:
        begun: list = []
        for s in services:
            try:
                begun.append(s.begin())
            except Exception as e:  # noqa: BLE001 - this topic's outcome
                begun.append(e)
        self.jobs.append(len(services))
        time.sleep(self.fixed + self.per_topic * len(services))
        outcomes: list = []
        for s, b in zip(services, begun):
            try:
                outcomes.append(b if isinstance(b, Exception) else s.finish(b))
            except Exception as e:  # noqa: BLE001 - this topic's outcome
                outcomes.append(e)
        return outcomes
