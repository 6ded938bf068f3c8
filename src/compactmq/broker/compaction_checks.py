"""The compaction monitor's periodic check: when it runs and what it queues.

A ``DueChecks`` is the half of ``CompactionMonitor`` (``compaction_monitor``) that decides WHEN
to look for due topics and queues what it finds; the other half (``compaction_runs.RunWorker``
and the monitor itself) admits, groups and runs them. The check loop (``_check_loop``) sleeps
until the earliest of three things:

* the configured interval (``brokerServiceCompactionMonitorIntervalInSeconds``);
* the earliest lag timer of the watch (``compaction_watch.DueWatch``): an append to a topic with
  a maximum lag starts a timer at the moment the topic falls due, so a max lag is kept without
  checking every topic every interval;
* the next lag topic due by the queue ahead of it (``compaction_lagqueue.LagQueue.next_due``):
  a topic's lead grows with the lag topics whose deadlines come before its own, which its
  timer, set when it was last read, does not know of;
* a request to check at once: a policy changed over REST (``_policies_changed``), or a run of a
  lag topic ended.

Policy changes made together are checked together: the check starts
``POLICY_CHECK_DELAY_SECONDS`` after the first. A check (``check_once``) reads only the topics
the watch says changed (every topic at the first check and every full-scan interval), asks
``compaction_due.DueCheck`` which are due in a worker thread, and appends each due topic as a
unit of its own to the monitor's pending list; the monitor's pump then groups waiting units into
joint jobs. A check of many topics (more than ``CHECK_PART_TOPICS``: a start, a full scan, the
first wave of a thousand lag topics) is read and queued part by part, so the first job starts
while the rest are read. How late the loop woke and how long the check took feed the lag model
(``compaction_lagbound.LagBound``), which moves a lag topic's due time earlier by the time a run
needs, so its commit lands within the policy.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Callable, Optional

from .compaction_due import lag_lead_ms, overdue

if TYPE_CHECKING:  # pragma: no cover
    from .compaction_due import DueCheck
    from .compaction_lagbound import LagBound
    from .compaction_lagqueue import LagPlan, LagQueue
    from .compaction_runs import RunProgress
    from .compaction_watch import DueWatch

log = logging.getLogger("compactmq.broker.compaction_monitor")

# After a policy change the check starts this much later, so that policies set one after another
# (a namespace's threshold and lag, a partitioned topic's partitions) are checked together.
POLICY_CHECK_DELAY_SECONDS = 0.05

#: a check reads its topics this many at a time (or a job's worth, ``compactionJointMaxTopics``,
#: when more), queuing and pumping what each part finds due before it reads the next
#: (``check_once``): a check of this many topics or fewer is read whole, so the due topics of
#: the usual check (those whose runs just ended, a few appended to) wait together and the jobs
#: take them by priority; a check of thousands (a start, a full scan, a first wave) keeps the
#: worker busy while it reads. Measured, the 1,000-topic benchmark's first job started 4.1 s
#: after its check began (load 20 on 2 cores), 4.1 s of the first wave's 60 s policy
CHECK_PART_TOPICS = 100


class DueChecks:
    """The periodic check of ``CompactionMonitor`` (a mixin: it uses the monitor's clock, watch,
    lag model, pending list and pump)."""

    service: Any
    storage: Any
    clock: Callable[[], float]
    interval: float
    max_job_topics: int
    watch: "DueWatch"
    lag_bound: "LagBound"
    lag_queue: "LagQueue"
    checks: int
    _due: "DueCheck"
    _runs: dict[str, "RunProgress"]
    _pending: list[list["RunProgress"]]
    _closing: bool
    _wake: Optional[asyncio.Event]
    _loop: Optional[asyncio.AbstractEventLoop]
    _check_now: bool
    _check_late: float
    _sleep_until: Optional[float]

    def _progress(self, topic: str, reason: str, priority: float = 0.0, size: int = 0) -> "RunProgress":
        raise NotImplementedError  # pragma: no cover - the monitor's

    def _pump(self) -> None:
        raise NotImplementedError  # pragma: no cover - the monitor's

    def _running_elsewhere(self, topic: str) -> bool:
        raise NotImplementedError  # pragma: no cover - the monitor's

    def lag_lead_seconds(self) -> float:
        raise NotImplementedError  # pragma: no cover - the monitor's

    def lag_floor_seconds(self) -> float:
        raise NotImplementedError  # pragma: no cover - the monitor's

    def lag_plan(self) -> "LagPlan":
        raise NotImplementedError  # pragma: no cover - the monitor's

    def lag_floor_measured(self) -> bool:
        raise NotImplementedError  # pragma: no cover - the monitor's

    def _rearm(self) -> None:
        """(event loop) The lag queue's next due time may be earlier than the check loop sleeps
        until: it works its sleep out again (no check unless one is due)."""
        if self._wake is not None:
            self._wake.set()

    def _policies_changed(self, name: str) -> None:
        """(event loop) A topic or namespace policy changed through the admin API: the topics it
        concerns are looked at, by a check that starts now rather than at the next interval (a
        threshold or lag just set makes its topics due at once)."""
        self.watch.policies_changed(name)
        self._request_check()

    def _request_check(self) -> None:
        """(event loop) Check now rather than at the next interval or timer."""
        self._check_now = True
        if self._wake is not None:
            self._wake.set()

    def _timer_started(self, when: float) -> None:
        """(``DueWatch.on_timer``) An append started a lag timer: the check loop wakes at
        ``when`` if it was going to sleep past it."""
        if self._wake is not None and self._loop is not None:
            if self._sleep_until is None or when < self._sleep_until:
                self._sleep_until = when
                self._loop.call_soon_threadsafe(self._wake.set)

    async def _check_loop(self) -> None:
        """A check every interval, at the earliest lag timer of the watch, and at once after a
        policy change or the end of a run of a topic with a maximum lag."""
        assert self._wake is not None
        next_tick = self.clock() + self.interval
        while not self._closing:
            now = self.clock()
            until = next_tick
            timer = self.watch.next_timer()
            if timer is not None:
                until = min(until, timer)
            queued = (
                self.lag_queue.next_due(int(now * 1000), self.lag_plan()) if len(self.lag_queue) else None
            )
            if queued is not None:  # the lag queue's next topic due by its rank
                until = min(until, queued / 1000)
            self._sleep_until = until
            try:
                # at least 10 ms: a timer the check cannot take (the broker shutting down) never spins
                await asyncio.wait_for(self._wake.wait(), max(0.01, until - now))
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            self._sleep_until = None
            if self._check_now:
                self._check_now = False
                await asyncio.sleep(POLICY_CHECK_DELAY_SECONDS)  # changes made together, checked together
            elif self.clock() < until:
                continue  # an earlier timer was started: sleep until it instead
            else:  # woken for a timer or the interval: how late counts in the check's latency
                # (from when it was asked to wake: a lag topic's due time may have moved into the
                # past, a job having started; that is not the loop's latency)
                self._check_late = max(0.0, self.clock() - max(until, now))
            if self.clock() >= next_tick:
                next_tick = self.clock() + self.interval
            try:
                await self.check_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("compaction threshold check failed")

    async def check_once(self) -> list[str]:
        """Queue every topic due for compaction among those that changed since the last one
        (``compaction_watch``; every topic at the first check and every full-scan interval);
        returns them. The topics are read ``CHECK_PART_TOPICS`` (or a job's worth) at a time
        (``_check_part``), and what each part finds due is queued and pumped before the next
        part is read: a worker is not left idle while a check of a thousand topics reads the
        other nine hundred (the first wave then starts a part's reading after it fell due, not
        the whole check's). The price: a due topic of a later part waits for the job a part
        before started, which the lag plan counts (the job in flight) when it reads it."""
        if self._closing or self.service.shutting_down:
            return []
        late, self._check_late = self._check_late, 0.0
        checked = self.clock()
        join_ms = int(self.lag_bound.run() * 1000)  # one job's length
        topics = self.watch.take(checked, join_ms / 1000)
        if topics is None:  # a full scan: every topic of the storage
            topics = await self.service.run_blocking(self.storage.topics)
        part = max(1, CHECK_PART_TOPICS, self.max_job_topics)
        max_lags: dict[str, int] = {}
        triggered: list[str] = []
        # the check's latency, for the lead: how late it woke, then its longest part -- the
        # reading a topic that falls due waits for (a start's check of 1,000 topics, its parts
        # sharing the CPU with the job of the first, took 11.8 s in all)
        slowest, mark = 0.0, checked
        for start in range(0, max(1, len(topics)), part):
            found = await self._check_part(topics[start : start + part], join_ms, max_lags)
            if found is None:
                return []
            triggered += found
            slowest, mark = max(slowest, self.clock() - mark), self.clock()
        self.checks += 1
        if self.lag_floor_measured():  # not from a size of job never seen yet (the first wave)
            self.lag_bound.judge(max_lags, self.lag_floor_seconds())  # the queue as read now
        self.lag_bound.check_ended(late + slowest)
        return triggered

    async def _check_part(
        self, topics: list[str], join_ms: int, max_lags: dict[str, int]
    ) -> Optional[list[str]]:
        """Read ``topics`` (part of a check; with a lag plan, also the lag topics the queue says
        are due with them), queue the due ones and pump; returns them (None: closing). The lag
        plan is taken anew for each part: the queue has the deadlines the parts before read."""
        busy = set(self._runs)
        plan = self.lag_plan()
        lead_ms = int(plan.lead_of_jobs(plan.ahead // plan.per_job) * 1000)
        checked = self.clock()
        due = await self.service.run_blocking(self._due_topics, busy, topics, lead_ms, join_ms, plan)
        timeline = self._due.timeline
        max_lags.update(self._due.max_lags)
        if self._closing:
            return None
        self._settle_queue(busy)
        triggered = []
        for topic, reason, priority, size in due:
            if topic in self._runs:  # triggered by hand (or by a part before) while the check looked
                continue
            run = self._progress(topic, reason, priority, size)
            run.checked_at = checked
            run.oldest_ms, due_ms, run.max_lag = timeline.get(topic, (None, int(checked * 1000), 0))
            if run.max_lag > 0:
                run.lag_plan = lag_decision(plan, topic)
            run.due_at = due_ms / 1000
            self._runs[topic] = run
            self.watch.busy(topic)
            self.lag_queue.queued(topic)
            self._pending.append([run])
            triggered.append(topic)
        self._pump()  # no await since the part was read: its due topics wait together
        return triggered

    def _settle_queue(self, busy: set[str]) -> None:
        """(event loop) Runs triggered by hand while the check read the topics: the check may
        have put their deadlines back in the lag queue; a running one is not in it, a queued one
        is marked so."""
        for topic in set(self._runs) - busy:
            if topic in self.lag_queue:
                if any(run.topic == topic for unit in self._pending for run in unit):
                    self.lag_queue.queued(topic)
                else:
                    self.lag_queue.remove(topic)

    def _due_topics(
        self,
        busy: set[str],
        topics: Optional[list[str]] = None,
        lead_ms: int = 0,
        join_ms: int = 0,
        plan: Optional["LagPlan"] = None,
    ) -> list[tuple[str, str, float, int]]:
        """``(topic, why, priority, backlog bytes)`` of every topic due (``compaction_due``) among
        ``topics`` (None: all), leaving out those a ``compact-topic`` job compacts right now;
        with a lag ``plan`` (the monitor's ``lag_plan``), each lag topic's lead is its rank's in
        the lag queue, and the topics before a due one come along."""
        return self._due.due_topics(
            busy,
            int(self.clock() * 1000),
            self._running_elsewhere,
            topics=topics,
            watch=self.watch,
            retry_ms=int(max(1.0, self.interval) * 1000),
            lead_ms=lead_ms,
            join_ms=join_ms,
            plan=plan,
        )

    def _why_due(self, ml, horizon, threshold: int, max_lag: int, min_lag: int) -> str | None:
        """Why the topic is due for compaction, or None when it is not."""
        lead = lag_lead_ms(max_lag, int(self.lag_lead_seconds() * 1000))
        found = overdue(ml, horizon, threshold, max_lag, min_lag, int(self.clock() * 1000), lead)
        return None if found is None else found[0]


def lag_decision(plan: "LagPlan", topic: str) -> dict[str, Any]:
    """What the check counted when it queued a lag topic (its last run's ``lagPlan``): its rank
    in deadline order, the runs that went first, the jobs before its own, topics per job, the
    workers, the wait for a busy one, one job's length, the lead and its margin (module notes
    of ``compaction_lagqueue`` and ``compaction_lagbound``), so a run that commits past its
    policy tells which term was short."""
    rank = plan.queue.rank(topic)
    size = plan.job_topics()
    return {
        "rank": rank,
        "ahead": plan.ahead,
        "jobsAhead": (plan.ahead + rank) // plan.per_job,
        "perJob": plan.per_job,
        "jobTopics": size,
        "workers": plan.slots,
        "inflightMs": int(plan.inflight * 1000),
        "jobMs": int(plan.bound.run(size) * 1000),
        "checkMs": int(plan.bound.check() * 1000),
        "leadMs": plan.lead_ms(topic),
        # the lead's margin: the measured spread of the jobs its length is priced from
        "marginShare": round(plan.bound.share(size), 3),
    }
