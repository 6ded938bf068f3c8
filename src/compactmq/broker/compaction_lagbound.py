"""Keeping a maximum lag: how early a lag topic must be queued, and whether its policy can be kept.

``compactionMaxLagSeconds`` (``compaction.lag``) bounds when a message is in a committed view.
The compaction monitor keeps it as a bound, not as a trigger point: a run queued now commits
after

    check   the check's latency: from the moment the topic falls due (the check loop wakes at
            its lag timer) to its run being queued -- the longest of the last checks' (how late
            the loop woke, plus how long the check took);
  + wait    the wait for a worker: the rest of the job in flight, then the jobs of every run
            that goes before it -- manual and size-triggered runs waiting, and the lag topics
            with earlier deadlines (``compaction_lagqueue``: the queue ahead of the topic);
  + run     its own job, as long as the longest of the last jobs of its size (a lag bound is
            a promise about every message: the longest, not the mean).

A job's length grows with its topics, so a job is remembered with its size (``job_ended``) and
the length of a job of ``n`` topics (``run(n)``, ``job_length``) is the longest of the recent
jobs of about that size -- of the smallest size seen that is at least ``n``, up to twice that --
or, when every job seen was smaller, the largest ones scaled up in proportion (a job's fixed cost
is not paid again per topic, so that bounds it from above). The longest job of any size would
make a wave of 1,000 topics wait behind ten estimates of the warm-up's one-topic job: measured,
the first wave after a start was queued with a lead of ten jobs of two topics and committed nine
jobs of 100 late (900 runs, 12 s past a 60 s policy). A floor from a length scaled up more than
twice is not judged (``measured``): it would report a policy as unkeepable only until the first
job of the size ran.

So a topic falls due when its oldest uncompacted message is ``max lag - lead`` old, with the
*lead* ``(check + wait + run) x (1 + share) + MARGIN_SECONDS`` (``lead``). Not earlier: a run
started sooner commits a view the next one replaces, and pays a job's fixed cost for it.

The *share* is the measured spread of the jobs a job's length is priced from -- ``(longest -
shortest) / longest`` of the recent jobs of about its size (``spread``) -- and at least
``MARGIN_SHARE``. The longest recent job prices one job well, but the lead of a topic ten jobs
back adds up ten jobs still to come, and when jobs grow longer (a shared machine's load
climbing: in the benchmark, jobs of 100 topics went from 6.6 s to 26 s in four minutes) the
longest of the last ones falls short of the next ones; a fixed 10 % let runs commit past a
policy the floor said was kept (simulated: a job's worth, 100 runs, with jobs growing 2 % a
job). Jobs that differ that much say by how much: the lead grows with them, and so does the
floor, so a policy that cannot be kept is reported rather than promised. Jobs that hardly
differ keep the 10 %.
With the lag topics' jobs split round-robin (``compactionJointLagSplit``, ``compaction_jobsize``)
the lead is at least the model's round (``split_wait``), so each lag topic is queued as soon as
its run ends and the deadline order is the round-robin.

The bound cannot always be kept. A message published just after its topic's run read the
ledger is not in that run's view: it waits for that run to end (``run``), and only then can the
topic fall due for it, behind every other lag topic. So the least maximum lag the monitor
keeps -- its *floor* -- is ``run + lead`` with the wait of the last topic in the lag queue
(``floor``, ``compaction_lagqueue.LagPlan.floor``); with split jobs, the model's round with its
margin, when larger.
A topic whose maximum lag is below the floor cannot be kept: the monitor says so -- one WARN
line per topic and policy (``judge``: not one per check), the per-topic gauge
``pulsar_compaction_max_lag_unkeepable``, the broker's ``compactmq_compaction_max_lag_floor_seconds``
and the topic stats' ``compaction.maxLag`` -- and keeps compacting it: its lead is then its
whole lag (``compaction_due.lag_lead_ms`` caps it there), so it is due whenever a message is
uncompacted and its runs go back to back, the least lag the machine gives it.

The check interval (``brokerServiceCompactionMonitorIntervalInSeconds``, 60 s by default) is
not a term of the lead: the watch's lag timers wake the check loop when a topic falls due
(``compaction_watch``), so the latency that counts is the check's own, measured.

Plain bookkeeping over numbers the monitor hands in (seconds); no clock, no I/O.
"""

from __future__ import annotations

import collections
import logging
import time
from dataclasses import dataclass
from typing import Optional

log = logging.getLogger("compactmq.broker.compaction_monitor")  # operators grep the monitor's lines

#: the lead is at least this much longer than its terms add up to (jobs and checks vary from one
#: to the next); more when the recent jobs differ more (``LagBound.spread``)
MARGIN_SHARE = 0.1

#: ... and this many seconds: the commit's own latency, the loop's wake-up
MARGIN_SECONDS = 0.25

#: jobs and checks remembered: the longest of the last this many is the estimate
KEPT = 5

#: jobs remembered with their sizes (``job_length``): enough that a size met every few jobs
#: (the last job of a wave, smaller than the others) is still known
SIZED_KEPT = 12

#: topics named one by one in the log per check (WARN: cannot keep; INFO: kept again), the rest
#: summed up in one line -- each topic stays listed in its stats and in the unkeepable metric
LOG_LINES_PER_CHECK = 5

#: after topics of one maximum lag were told unkeepable, more of that lag within this many seconds
#: of the last are told at DEBUG: 1,000 topics of a namespace policy are read by the checks of a
#: wave, one job's worth each, and one WARN of five names and a sum says it (each topic is in its
#: stats and the metric); measured, with jobs of 15 s, a window from the first WARN alone let a
#: second one through a minute later, in the same wave
LOG_QUIET_SECONDS = 60.0

#: the length of a job while no job was seen (``run``): unknown, so a lag topic is queued as soon
#: as it has an uncompacted message -- counting 0 s would queue the first wave after a start at
#: its deadline -- and no floor is judged (``measured``)
UNKNOWN_JOB_SECONDS = 1e6


@dataclass(frozen=True)
class TopicBound:
    """A lag topic as its last check saw it: its maximum lag and the floor then (seconds)."""

    max_lag: int
    floor: float

    @property
    def kept(self) -> bool:
        return self.max_lag >= self.floor

    def as_json(self) -> dict:
        """The topic stats' ``compaction.maxLag``."""
        return {
            "policySeconds": self.max_lag,
            "floorSeconds": round(self.floor, 3),
            "keepable": self.kept,
        }


class LagBound:
    """The terms of the lead, the floor, and which lag topics are below it (module notes)."""

    def __init__(self, kept: int = KEPT) -> None:
        self.job_seconds: collections.deque[float] = collections.deque(maxlen=kept)
        #: (topics, seconds) of the last jobs whose size the monitor told (``job_length``)
        self.job_sizes: collections.deque[tuple[int, float]] = collections.deque(maxlen=SIZED_KEPT)
        self.check_seconds: collections.deque[float] = collections.deque(maxlen=kept)
        self.last_floor = 0.0  # the floor at the last check (metrics)
        self._topics: dict[str, TopicBound] = {}  # lag topics, as the last check of each saw them
        self._warned: dict[str, int] = {}  # topic -> the maximum lag a WARN line was logged for
        self._kept_again: set[str] = set()  # ... and an INFO line said it is kept again
        self._told_at: dict[int, float] = {}  # maximum lag -> when topics of it were last told unkeepable

    # --- what the monitor measures --------------------------------------------------------------

    def job_ended(self, seconds: float, topics: Optional[int] = None) -> None:
        """A job (of ``topics`` topics, when told) took ``seconds`` from its hand-over to the
        worker pool to its last commit."""
        if seconds >= 0:
            self.job_seconds.append(float(seconds))
            if topics is not None and topics > 0:
                self.job_sizes.append((int(topics), float(seconds)))

    def check_ended(self, seconds: float) -> None:
        """A check queued its due topics ``seconds`` after it should have started."""
        if seconds >= 0:
            self.check_seconds.append(float(seconds))

    def run(self, topics: Optional[int] = None) -> float:
        """One job's length (module notes): of ``topics`` topics, from the recent jobs of about
        that size (``job_length``); with no size, or no job's size told, the longest of the last
        jobs (0 before the first)."""
        if topics is not None and not self.job_sizes and not self.job_seconds:
            return UNKNOWN_JOB_SECONDS
        if topics is None or not self.job_sizes:
            return max(self.job_seconds, default=0.0)
        return job_length(self.job_sizes, topics)[0]

    def spread(self, topics: Optional[int] = None) -> float:
        """How much the jobs the length of a job of ``topics`` topics comes from differ (module
        notes): ``(longest - shortest) / longest`` of them, 0 with fewer than two."""
        if topics is None or not self.job_sizes:
            lengths = list(self.job_seconds)
        else:
            lengths = priced_jobs(self.job_sizes, topics)[0]
        longest = max(lengths, default=0.0)
        return (longest - min(lengths)) / longest if len(lengths) > 1 and longest > 0 else 0.0

    def share(self, topics: Optional[int] = None) -> float:
        """The lead's margin as a share of its terms: the measured spread of job lengths, at
        least ``MARGIN_SHARE``."""
        return max(MARGIN_SHARE, self.spread(topics))

    def measured(self, topics: Optional[int] = None) -> bool:
        """Whether ``run(topics)`` comes from jobs of at least half that size (a floor from a
        length scaled up further is not judged: module notes)."""
        if topics is not None and not self.job_sizes and not self.job_seconds:
            return False
        if topics is None or not self.job_sizes:
            return True
        return job_length(self.job_sizes, topics)[1]

    def check(self) -> float:
        """The check's latency: the longest of the last checks' (0 before the first)."""
        return max(self.check_seconds, default=0.0)

    # --- the model ------------------------------------------------------------------------------

    def lead(self, wait: float, split_wait: float = 0.0, topics: Optional[int] = None) -> float:
        """How long before its maximum lag a topic must be queued (module notes): ``wait`` for a
        worker, then a job (of ``topics`` topics); with split lag jobs, at least their round
        ``split_wait``."""
        terms = max(self.check() + max(0.0, wait) + self.run(topics), self.check() + max(0.0, split_wait))
        return terms * (1 + self.share(topics)) + MARGIN_SECONDS

    def floor(self, wait: float, split_wait: float = 0.0, topics: Optional[int] = None) -> float:
        """The least maximum lag kept: the run (a job of ``topics`` topics) that just missed a
        message, then the lead; with split lag jobs, their round (which holds the missed run
        already), when larger."""
        plain = self.run(topics) + self.lead(wait, topics=topics)
        return max(plain, self.lead(0.0, split_wait)) if split_wait > 0 else plain

    # --- the topics -----------------------------------------------------------------------------

    def judge(self, max_lags: dict[str, int], floor: float) -> list[str]:
        """Record the topics a check looked at (``topic -> maximum lag`` seconds, 0: none) against
        the ``floor`` then; WARN once per topic and policy that cannot be kept, and say at INFO,
        once, when it is kept again (a floor that moves around the policy logs no more: a topic
        is told again only when its policy changes). Returns the topics warned about now."""
        self.last_floor = floor
        warned: list[tuple[str, int]] = []
        kept_again: list[tuple[str, int]] = []
        for topic, max_lag in max_lags.items():
            if max_lag <= 0:
                self.forget(topic)
                continue
            bound = TopicBound(int(max_lag), float(floor))
            self._topics[topic] = bound
            if bound.kept:
                if topic in self._warned and topic not in self._kept_again:
                    kept_again.append((topic, max_lag))
                    self._kept_again.add(topic)
                continue
            if self._warned.get(topic) == max_lag:
                continue
            self._warned[topic] = max_lag
            self._kept_again.discard(topic)
            warned.append((topic, max_lag))
        self._log_kept_again(kept_again, floor)
        self._log_unkeepable(warned, floor)
        return [topic for topic, _ in warned]

    def _log_unkeepable(self, warned: list[tuple[str, int]], floor: float) -> None:
        """One WARN line per topic, at most ``LOG_LINES_PER_CHECK`` of them, then one line for the
        rest: a namespace policy that hundreds of topics share becomes unkeepable at one check.
        Topics of a maximum lag told within ``LOG_QUIET_SECONDS`` go to DEBUG."""
        now = time.monotonic()
        quiet = [
            (t, lag)
            for t, lag in warned
            if now - self._told_at.get(lag, -LOG_QUIET_SECONDS) < LOG_QUIET_SECONDS
        ]
        if quiet:
            log.debug("%d more topics cannot keep their max lag (floor %.1f s)", len(quiet), floor)
        self._told_at.update((lag, now) for _, lag in warned)  # quiet ones too: one wave, one WARN
        warned = [item for item in warned if item not in quiet]
        for topic, max_lag in warned[:LOG_LINES_PER_CHECK]:
            log.warning(
                "compaction of %s cannot keep its max lag of %d s: a message published just after a "
                "run read the topic waits for that run, then for the jobs of every lag topic before "
                "it, about %.1f s with the last jobs (%.1f s each); its runs go back to back. Raise "
                "compactionMaxLagSeconds, put fewer topics under it, or make jobs shorter",
                topic,
                max_lag,
                floor,
                self.run(),
            )
        if len(warned) > LOG_LINES_PER_CHECK:
            log.warning(
                "%d more topics cannot keep their max lag (floor %.1f s); each is listed in "
                "pulsar_compaction_max_lag_unkeepable and in its topic stats (compaction.maxLag)",
                len(warned) - LOG_LINES_PER_CHECK,
                floor,
            )

    def _log_kept_again(self, kept_again: list[tuple[str, int]], floor: float) -> None:
        for topic, max_lag in kept_again[:LOG_LINES_PER_CHECK]:
            log.info(
                "compaction of %s keeps its max lag of %d s again (a run commits within %.1f s)",
                topic,
                max_lag,
                floor,
            )
        if len(kept_again) > LOG_LINES_PER_CHECK:
            log.info(
                "%d more topics keep their max lag again (floor %.1f s)",
                len(kept_again) - LOG_LINES_PER_CHECK,
                floor,
            )

    def bound_of(self, topic: str) -> Optional[TopicBound]:
        """The topic's maximum lag and the floor as its last check saw them (None: no max lag)."""
        return self._topics.get(topic)

    def unkeepable(self) -> list[str]:
        """The lag topics whose last check found their maximum lag below the floor."""
        return [t for t, b in self._topics.items() if not b.kept]

    def forget(self, topic: str) -> None:
        """The topic no longer has a maximum lag, or was deleted."""
        self._topics.pop(topic, None)
        self._warned.pop(topic, None)
        self._kept_again.discard(topic)


def job_length(jobs, topics: int) -> tuple[float, bool]:
    """``(seconds, measured)``: how long a job of ``topics`` topics takes, from ``jobs``
    ``(topics, seconds)`` (not empty), and whether jobs of at least half that size were seen
    (module notes): the longest of ``priced_jobs``."""
    lengths, measured = priced_jobs(jobs, topics)
    return max(lengths), measured


def priced_jobs(jobs, topics: int) -> tuple[list[float], bool]:
    """``(lengths, measured)``: the lengths a job of ``topics`` topics is priced from, out of
    ``jobs`` ``(topics, seconds)`` (not empty) -- the jobs of the smallest size seen that is at
    least ``topics``, up to twice that size; when every job was smaller, the largest ones (at
    least half the largest size) scaled up in proportion -- and whether jobs of at least half
    that size were seen."""
    n = max(1, int(topics))
    sizes = [m for m, _ in jobs if m >= n]
    if sizes:
        least = min(sizes)
        return [s for m, s in jobs if least <= m <= 2 * least], True
    top = max(m for m, _ in jobs)
    return [s * n / m for m, s in jobs if 2 * m >= top], 2 * top >= n


__all__ = [
    "KEPT",
    "LagBound",
    "SIZED_KEPT",
    "job_length",
    "MARGIN_SECONDS",
    "MARGIN_SHARE",
    "priced_jobs",
    "TopicBound",
]
