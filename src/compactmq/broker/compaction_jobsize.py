"""How many topics with a maximum lag one compaction job takes, learned from recent jobs.

The compaction monitor gathers the due topics into joint jobs (``compaction_due.take_job``), at
most ``compactionJointMaxTopics`` each. For topics under a maximum lag (``compaction.lag``) one
big job can break the bound on its own. The lag of a message is at most

    (time until its topic is picked) + (the wait behind a running job) + (its job's duration).

A topic falls due a *lead* before its maximum lag (``compaction_monitor.lag_lead_seconds``), so
while a job of all of them is short the first and last terms add up to the lag less a slack.
But a message published just after its topic's run read the ledger waits for the rest of that
job, and then -- when the topic is due again as soon as that job ends, because the job took
longer than the lag less the lead -- for the whole of the next one. With every lag topic in
one job of ``J`` seconds, jobs run back to back and the wait is about ``2 J``: 100 topics whose
job takes 2.7 s wait 5.5 s under a 5 s policy however early they fall due.

Splitting the lag topics into ``k`` jobs taken round-robin (the most overdue first, which is
what ``unit_order`` does) makes the wait about one cycle of all ``k`` jobs plus one of them:

    wait(k) = k x fixed + per_topic x N        (the cycle: every topic's run once)
              + fixed + per_topic x ceil(N / k)  (the topic's own job, after the cycle)

Each job pays a fixed cost (a Spark job's start, the joint run's meeting), so ``k`` is not
simply "as many as possible": ``JobSizer`` fits ``seconds = fixed + per_topic x topics`` to the
last jobs (least squares; with one size seen, all of it per topic), and when one job of every
lag topic would not keep ``2 x its length`` within ``SPLIT_SHARE`` of the smallest maximum lag,
picks the ``k`` with the smallest ``wait(k)`` (``cap``). When even that exceeds the lag, the
machine cannot keep the policy for that many topics; the smallest wait is still the best it can
do. Jobs that hold no lag topics are bounded by the configuration only.

The monitor applies the cap only with ``compactionJointLagSplit`` (off by default: measured on a
loaded machine, the split lowered the typical lag and the share of runs over the policy but
raised the largest lag; it learns the model either way).

Plain arithmetic over numbers the monitor hands in; no clock, no I/O.
"""

from __future__ import annotations

import collections
import math
from typing import Optional

#: one job of every lag topic is kept while twice its length fits in this share of the lag
#: (the rest: the check's latency and noise)
SPLIT_SHARE = 0.8

#: jobs are split only when the model's wait drops below this share of one job's (the model is
#: fitted to noisy timings; a small gain is not worth more fixed costs)
SPLIT_GAIN = 0.85

#: the least fixed cost of a job ``cap`` assumes: the monitor's own work per job (taking it, the
#: check after it) is not in the jobs' lengths, and a fit to noisy timings may say 0, which
#: would split the topics into jobs of one
MIN_FIXED_SECONDS = 0.05

#: jobs the model is fitted to
JOBS_KEPT = 12


class JobSizer:
    """The last jobs' sizes and lengths, and the topics per job that keeps lags lowest."""

    def __init__(self, bound: int, kept: int = JOBS_KEPT) -> None:
        """``bound``: the configured topics per job (``compactionJointMaxTopics``)."""
        self.bound = max(1, int(bound))
        self._jobs: collections.deque[tuple[int, float]] = collections.deque(maxlen=kept)
        self.last_cap: Optional[int] = None  # the last cap below the bound (tests and metrics)
        #: with jobs split, the model's longest wait (``wait_seconds``): the monitor's lead is at
        #: least that, so every lag topic is queued as soon as its run ends and the queue's
        #: deadline order is the round-robin (a topic queued late loses its turn to later ones)
        self.last_wait = 0.0

    def observe(self, topics: int, seconds: float) -> None:
        """A job of ``topics`` topics took ``seconds`` (from its start to its last commit)."""
        if topics > 0 and seconds >= 0:
            self._jobs.append((int(topics), float(seconds)))

    def model(self) -> Optional[tuple[float, float]]:
        """``(fixed seconds, seconds per topic)`` of a job, None before the first job."""
        if not self._jobs:
            return None
        sizes = {n for n, _ in self._jobs}
        if len(sizes) < 2:  # one size: fixed cost and per-topic cost cannot be told apart
            return 0.0, max(s / n for n, s in self._jobs)
        count = len(self._jobs)
        mean_n = sum(n for n, _ in self._jobs) / count
        mean_s = sum(s for _, s in self._jobs) / count
        var = sum((n - mean_n) ** 2 for n, _ in self._jobs)
        per_topic = sum((n - mean_n) * (s - mean_s) for n, s in self._jobs) / var
        if per_topic <= 0:  # noise larger than the sizes' effect: all of it per topic
            return 0.0, max(s / n for n, s in self._jobs)
        fixed = min(max(0.0, mean_s - per_topic * mean_n), min(s for _, s in self._jobs))
        return fixed, per_topic

    def seconds(self, topics: int) -> Optional[float]:
        """The model's length of a job of ``topics`` topics (None before the first job)."""
        m = self.model()
        return None if m is None else m[0] + m[1] * max(0, topics)

    def cap(self, lag_topics: int, max_lag: float) -> int:
        """Topics per job while ``lag_topics`` topics with a maximum lag (the smallest of them
        ``max_lag`` seconds) keep falling due (module notes); the bound when one job does."""
        m = self.model()
        if m is None or lag_topics <= 1 or max_lag <= 0:
            return self.bound
        m = (max(m[0], MIN_FIXED_SECONDS), m[1])  # a job is never free, whatever the fit says
        k_min = max(1, math.ceil(lag_topics / self.bound))
        if wait_seconds(m, lag_topics, k_min) <= SPLIT_SHARE * max_lag:  # the largest jobs keep it
            self.last_cap, self.last_wait = None, 0.0
            return self.bound
        best = min(range(k_min, lag_topics + 1), key=lambda k: (wait_seconds(m, lag_topics, k), k))
        if wait_seconds(m, lag_topics, best) > SPLIT_GAIN * wait_seconds(m, lag_topics, k_min):
            self.last_cap, self.last_wait = None, 0.0  # not worth more jobs' fixed costs
            return self.bound
        cap = min(self.bound, max(1, math.ceil(lag_topics / best)))
        self.last_cap = cap if cap < self.bound else None
        self.last_wait = wait_seconds(m, lag_topics, best)
        return cap


def wait_seconds(model: tuple[float, float], topics: int, jobs: int) -> float:
    """The longest wait of a message when ``topics`` lag topics run in ``jobs`` jobs round-robin,
    back to back (module notes)."""
    fixed, per_topic = model
    size = math.ceil(topics / jobs)
    jobs = math.ceil(topics / size)
    return jobs * fixed + per_topic * topics + fixed + per_topic * size


__all__ = ["JobSizer", "SPLIT_GAIN", "SPLIT_SHARE", "wait_seconds"]
