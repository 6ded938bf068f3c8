"""The queue ahead of a lag topic: its deadline among the others', and when it must be queued.

A maximum lag (``compactionMaxLagSeconds``, ``compaction.lag``) gives each topic with an
uncompacted message a *deadline*: that message's publish time plus the lag; its run must commit
by then. The monitor takes waiting runs earliest deadline first, at most a job's bound of them
per job (``compaction_due.take_job``: ``compactionJointMaxTopics`` topics and
``compactionJointMaxBytes`` of backlog), one job per worker (``compactionMaxConcurrentRuns``).
So a topic's run does not start when it falls due: it starts after every topic with an earlier
deadline. A lead that counts one job (the wait for a worker, then its own job) is right for the
first hundred topics of a wave and wrong for the last: 1,000 topics that fall due together form
ten jobs of 100, and the last waits for nine of them.

This module keeps the lag topics that are not running -- those waiting for their deadline and
those queued for a worker -- in deadline order (``LagQueue``: a sorted list, updated only for the
topics a check reads, so the check stays O(topics that changed)). A topic at *rank* ``r`` (the
lag topics before it in deadline order) has ``ahead + r`` runs before it (``ahead``: manual and
size-triggered runs waiting, which go first), so ``(ahead + r) // per_job`` jobs go before its
own, in rounds of ``slots`` (the workers). ``LagPlan.lead`` turns that into the time a run queued
now takes to commit, with the lag model's check latency, job length and margins
(``compaction_lagbound.LagBound.lead``), and the wait for a busy worker.

A topic is due when ``now >= deadline - lead(rank)`` -- and then so is every topic before it in
deadline order, and the rest of the job's worth of topics it is in (``cut``): its lead counted
on the topics before it running first, but a run queued before them would start first when a
worker is free, and push them back behind its job; and a job's worth cut short would leave its
rest to one more job, which the leads behind it did not count. Queuing whole jobs' worth of the
prefix keeps the deadline order and the job count, so a wave of topics with one deadline is
compacted job after job, the last starting ten jobs before that deadline and committing at it.

The *floor* (the least maximum lag kept, ``LagPlan.floor``) uses the same queue term: a message
published just after its topic's run read the ledger waits for that run, then for the topic to
come round again behind every other lag topic. A policy below it is reported (a WARN line per
topic, ``compaction.maxLag`` in the topic stats, ``compactmq_compaction_max_lag_floor_seconds``).

A topic the check found not due although the queue said it was (a minimum lag holds its
messages back, another process compacts it) is *held* until the time the check gives, so it
neither wakes the check loop again at once nor pulls the topics before it into a job.

Plain bookkeeping over numbers (deadlines in ms of the monitor's clock); one (reentrant) lock,
because the check reads and updates the queue in a worker thread while the event loop starts jobs.
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:  # pragma: no cover
    from .compaction_lagbound import LagBound

#: sorts after any topic name: ``(deadline, LAST)`` bisects past every topic of that deadline
LAST = "\U0010ffff"

Key = tuple[int, str]


class LagQueue:
    """The lag topics that are not running, in deadline order (module notes)."""

    def __init__(self) -> None:
        # reentrant: the plan's lead, asked while the lock is held (``_blocks``), reads the
        # queue's length (a job's size: ``LagPlan.job_topics``)
        self._lock = threading.RLock()
        self._order: list[Key] = []  # (deadline ms, topic), sorted
        self._deadline: dict[str, int] = {}
        self._bytes: dict[str, int] = {}
        self._total_bytes = 0
        self._queued: set[str] = set()  # due and waiting for a worker
        self._held: dict[str, int] = {}  # topic -> until when (ms) the queue does not make it due

    def __len__(self) -> int:
        with self._lock:
            return len(self._order)

    def __contains__(self, topic: object) -> bool:
        with self._lock:
            return topic in self._deadline

    def set(self, topic: str, deadline_ms: int, size: int = 0) -> None:
        """``topic``'s oldest uncompacted message must be in a view by ``deadline_ms``; its
        backlog is ``size`` bytes. A new deadline ends a hold."""
        with self._lock:
            old = self._deadline.get(topic)
            if old != deadline_ms:
                if old is not None:
                    del self._order[bisect.bisect_left(self._order, (old, topic))]
                    self._held.pop(topic, None)
                bisect.insort(self._order, (int(deadline_ms), topic))
                self._deadline[topic] = int(deadline_ms)
            self._total_bytes += max(0, int(size)) - self._bytes.get(topic, 0)
            self._bytes[topic] = max(0, int(size))

    def remove(self, topic: str) -> None:
        """``topic``'s run started (it is in flight, not in the queue), it has no maximum lag or
        nothing uncompacted, or it was deleted."""
        with self._lock:
            old = self._deadline.pop(topic, None)
            if old is None:
                return
            del self._order[bisect.bisect_left(self._order, (old, topic))]
            self._total_bytes -= self._bytes.pop(topic, 0)
            self._queued.discard(topic)
            self._held.pop(topic, None)

    def queued(self, topic: str) -> None:
        """A run of ``topic`` waits for a worker: it is due already (and still ahead of the
        topics after it)."""
        with self._lock:
            if topic in self._deadline:
                self._queued.add(topic)

    def hold(self, topic: str, until_ms: int) -> None:
        """The check found ``topic`` not due although the queue made it so: leave it be until
        ``until_ms`` (or its next deadline)."""
        with self._lock:
            if topic in self._deadline:
                self._held[topic] = int(until_ms)

    def deadline_of(self, topic: str) -> Optional[int]:
        with self._lock:
            return self._deadline.get(topic)

    def rank(self, topic: str) -> int:
        """The lag topics before ``topic`` in deadline order (all of them when it is not here)."""
        with self._lock:
            at = self._deadline.get(topic)
            return len(self._order) if at is None else bisect.bisect_left(self._order, (at, topic))

    def mean_bytes(self) -> float:
        with self._lock:
            return self._total_bytes / len(self._order) if self._order else 0.0

    # --- the due prefix -------------------------------------------------------------------------

    def _blocks(self, plan: "LagPlan"):
        """``(first rank, end rank, lead ms)`` of each run of ranks with one lead (lock held)."""
        start = 0
        n = len(self._order)
        while start < n:
            jobs = (plan.ahead + start) // plan.per_job
            end = min(n, (jobs + 1) * plan.per_job - plan.ahead)
            yield start, end, plan.lead_ms_of_jobs(jobs)
            start = end

    def _free(self, topic: str, now_ms: int) -> bool:
        held = self._held.get(topic)
        return held is None or held <= now_ms

    def cut(self, now_ms: int, plan: "LagPlan") -> Optional[Key]:
        """The last topic of the last job's worth of topics (ranks with one lead) in which some
        topic that is not held is due by its rank's lead, or None: every topic through it is due
        (module notes). The whole job's worth: a job cut short leaves the rest of its topics for
        one more job, which the leads of the topics behind them did not count."""
        with self._lock:
            best: Optional[int] = None
            for start, end, lead in self._blocks(plan):
                i = bisect.bisect_right(self._order, (now_ms + lead, LAST), start, end) - 1
                while i >= start and not self._free(self._order[i][1], now_ms):
                    i -= 1
                if i >= start:
                    best = end - 1
            return None if best is None else self._order[best]

    def due(self, now_ms: int, plan: "LagPlan") -> list[str]:
        """The topics through ``cut`` that are neither queued nor held: those a check must read."""
        last = self.cut(now_ms, plan)
        if last is None:
            return []
        with self._lock:
            end = bisect.bisect_right(self._order, last)
            return [t for _, t in self._order[:end] if t not in self._queued and self._free(t, now_ms)]

    def next_due(self, now_ms: int, plan: "LagPlan") -> Optional[int]:
        """When the next topic that is neither queued nor held falls due by its rank (ms), or
        None: the check loop sleeps no longer than that. (A topic behind a due one is due with
        it: the earliest of each run of ranks with one lead is the one that counts.)"""
        with self._lock:
            soonest: Optional[int] = None
            for start, end, lead in self._blocks(plan):
                for deadline, topic in self._order[start:end]:
                    if topic not in self._queued and self._free(topic, now_ms):
                        at = deadline - lead
                        soonest = at if soonest is None else min(soonest, at)
                        break
            held = [until for until in self._held.values() if until > now_ms]
            if held:
                soonest = min(held) if soonest is None else min(soonest, min(held))
            return soonest


@dataclass
class LagPlan:
    """The terms of a lag topic's lead at one moment (the monitor's ``lag_plan``)."""

    queue: LagQueue
    bound: "LagBound"
    #: topics one job takes: its topic bound, or fewer when the queue's backlogs fill its bytes
    per_job: int = 1
    #: jobs run at once (``compactionMaxConcurrentRuns``)
    slots: int = 1
    #: seconds until a worker frees, when every worker is busy
    inflight: float = 0.0
    #: runs waiting that go before every lag topic (manual triggers, size-triggered runs)
    ahead: int = 0
    #: with split lag jobs (``compactionJointLagSplit``), the model's round (``compaction_jobsize``)
    split_wait: float = 0.0

    def __post_init__(self) -> None:
        self.per_job = max(1, int(self.per_job))
        self.slots = max(1, int(self.slots))
        self.ahead = max(0, int(self.ahead))

    @staticmethod
    def per_job_of(queue: LagQueue, max_topics: int, max_bytes: int) -> int:
        """Topics per job: the topic bound, or as many of the queue's mean backlog as fit the
        bytes bound (at least one)."""
        mean = queue.mean_bytes()
        by_bytes = int(max_bytes // mean) if mean > 0 else max_topics
        return max(1, min(int(max_topics), by_bytes))

    def job_topics(self, topics: Optional[int] = None) -> int:
        """Topics in one job of the queue: ``per_job``, or all of them when fewer wait (the runs
        that go first and the lag topics in the queue, or ``topics``)."""
        waiting = self.ahead + len(self.queue) if topics is None else topics
        return max(1, min(self.per_job, waiting))

    def lead_of_jobs(self, jobs: int) -> float:
        """Seconds a run takes to commit when ``jobs`` jobs go before its own (each as long as
        a job of the queue's size: ``LagBound.run``)."""
        rounds = max(0, jobs) // self.slots
        size = self.job_topics()
        return self.bound.lead(self.inflight + rounds * self.bound.run(size), self.split_wait, size)

    def lead_ms_of_jobs(self, jobs: int) -> int:
        return int(self.lead_of_jobs(jobs) * 1000)

    def lead_ms(self, topic: str) -> int:
        """The lead of ``topic`` at its rank (ms)."""
        return self.lead_ms_of_jobs((self.ahead + self.queue.rank(topic)) // self.per_job)

    def floor(self, topics: int) -> float:
        """The least maximum lag kept for ``topics`` lag topics in the cycle (module notes): the
        run that missed a message, then the lead of the last topic in the queue (no worker busy:
        the missed run has just ended)."""
        rounds = (max(0, topics - 1) // self.per_job) // self.slots
        size = self.job_topics(topics)
        return self.bound.floor(rounds * self.bound.run(size), self.split_wait, size)

    def floor_measured(self, topics: int) -> bool:
        """Whether ``floor(topics)`` comes from jobs of about that size (``LagBound.measured``)."""
        return self.bound.measured(self.job_topics(topics))


__all__ = ["LAST", "LagPlan", "LagQueue"]
