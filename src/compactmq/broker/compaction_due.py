"""Which topics are due for compaction, and which of the waiting runs the next job takes.

The compaction monitor (``compaction_monitor``) asks this module two questions.

* **Is a topic due?** (``DueCheck.due_topics``, at every periodic check, for the topics that
  changed since the last one: ``compaction_watch``.) A persistent topic with a compaction
  threshold (topic policy, else namespace policy, else
  ``brokerServiceCompactionThresholdInBytes``) is due when its backlog since the horizon -- what
  a run would compact now -- exceeds it; one with a maximum lag (``compactionMaxLagSeconds``,
  ``compaction.lag``) when its oldest uncompacted message is older than that. A minimum lag
  holds back what is younger than it, by size and by age. Each due topic comes with a
  *priority*, how far past its policy it is (the larger of backlog / threshold and lag / max
  lag), and its backlog in bytes. A maximum lag bounds when a message is in a committed view,
  so a topic is due by age a *lead* before it (``lag_lead_ms``: the time a run started now takes
  to commit, as the monitor estimates it), and when any topic is due, lag topics that would
  fall due within one more job's length join it (``join_ms``), so lag topics that fall due a
  little apart share one job rather than drift into jobs that alternate. A topic not due yet says when time alone may make it due
  (``next_look_ms``: its lags), so the check looks at it again then. The check also creates the
  ``__compaction`` cursor of every topic with a threshold or a maximum lag, so retention keeps
  what compaction has not read.
* **What does the next job take?** (``take_job``.) Runs wait in *units* (one topic, or the
  partitions of a partitioned topic, which are never split). A job takes the waiting units in
  order -- manual triggers first, then the one that fell due first (the most overdue), then the first queued (``unit_order``)
  -- as long as they fit its bounds: a number of topics and a number of backlog bytes. The
  first unit always goes, whatever its size, so nothing waits forever. A topic whose last run
  failed runs *alone*: a failure of the Spark job fails every topic in it, so a topic that
  breaks its job (a damaged ledger, a bad policy) must not take the healthy ones down with it
  at every check.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional, Sequence

from ..compaction.lag import (
    compaction_lag_ms,
    first_uncompacted,
    lag_seconds_setting,
    last_compactable,
    oldest_uncompacted_publish_ms,
)
from ..config import int_setting
from ..errors import CompactMQError
from ..naming import TopicName
from ..compaction.state import RUNNING
from ..config.policy_keys import DEFAULT_SETTINGS
from ..storage import COMPACTION_CURSOR, COMPACTION_MAX_LAG, COMPACTION_MIN_LAG, COMPACTION_THRESHOLD

if TYPE_CHECKING:  # pragma: no cover
    from .compaction_lagqueue import LagPlan

log = logging.getLogger(__name__)


class DueCheck:
    """The periodic check's reading of policies and backlogs (see the module notes)."""

    def __init__(self, storage, config, state_of: Callable[[str], Any]) -> None:
        """``state_of(topic)``: the topic's compaction state, from its compaction service."""
        self.storage = storage
        self.state_of = state_of
        # the broker settings the policies fall back to (declared in config.policy_keys)
        self.default_threshold = int_setting(config, DEFAULT_SETTINGS[COMPACTION_THRESHOLD])
        self.default_max_lag = int_setting(config, DEFAULT_SETTINGS[COMPACTION_MAX_LAG])
        self.default_min_lag = int_setting(config, DEFAULT_SETTINGS[COMPACTION_MIN_LAG])
        #: the last ``due_topics``' timeline of each topic it found due: ``(publish time of its
        #: oldest uncompacted message, when it fell due, in ms; its maximum lag)`` -- the monitor
        #: keeps them on the run (``RunProgress``), so a run's lag at commit can be told
        self.timeline: dict[str, tuple[Optional[int], int, int]] = {}
        #: the maximum lag (seconds, 0: none) of every topic the last ``due_topics`` looked at:
        #: the monitor holds them against the least lag it can keep (``compaction_lagbound``)
        self.max_lags: dict[str, int] = {}

    def threshold_of(self, topic: str) -> int:
        value = self.storage.policies.effective_policy(topic, COMPACTION_THRESHOLD, self.default_threshold)
        try:
            return int(value or 0)
        except (TypeError, ValueError):
            return 0

    def max_lag_of(self, topic: str) -> int:
        return lag_seconds_setting(self.storage.policies, topic, COMPACTION_MAX_LAG, self.default_max_lag)

    def min_lag_of(self, topic: str) -> int:
        return lag_seconds_setting(self.storage.policies, topic, COMPACTION_MIN_LAG, self.default_min_lag)

    def settings_of(self, topic: str, namespaces: dict[str, dict]) -> tuple[int, int, int]:
        """``(threshold, max lag, min lag)`` of ``topic`` (``threshold_of``, ``max_lag_of``,
        ``min_lag_of``) from ONE read of its policies; its namespace's policies are read once
        per check (``namespaces``: what this check has read so far)."""
        policies = self.storage.policies
        own = policies.get_topic_policies(topic)
        ns_name = TopicName.parse(topic).namespace_name
        ns = namespaces.get(ns_name)
        if ns is None:
            try:
                ns = policies.get_namespace_policies(ns_name)
            except CompactMQError:  # a namespace deleted meanwhile: no policies
                ns = {}
            namespaces[ns_name] = ns

        def value(key: str, default: Any) -> Any:
            return own[key] if key in own else ns.get(key, default)

        return (
            _whole(value(COMPACTION_THRESHOLD, self.default_threshold)),
            max(0, _whole(value(COMPACTION_MAX_LAG, self.default_max_lag))),
            max(0, _whole(value(COMPACTION_MIN_LAG, self.default_min_lag))),
        )

    def due_topics(
        self,
        busy: set[str],
        now_ms: int,
        running_elsewhere: Callable[[str], bool],
        topics: Optional[Iterable[str]] = None,
        watch: Any = None,
        retry_ms: int = 60_000,
        lead_ms: int = 0,
        join_ms: int = 0,
        plan: Optional["LagPlan"] = None,
    ) -> list[tuple[str, str, float, int]]:
        """``(topic, why, priority, backlog bytes)`` of every topic due, by size or by age, but
        those in ``busy`` and those ``running_elsewhere`` (a ``compact-topic`` job) says are.

        ``topics``: only these (the ones that changed, ``compaction_watch``), else every topic of
        the storage. ``watch`` (a ``DueWatch``) learns each topic looked at and when to look at
        a topic that is not due yet again: when its lags say it may become due
        (``next_look_ms``), or after ``retry_ms`` when another process is compacting it.
        ``lead_ms``: how long before its maximum lag a topic is due (``lag_lead_ms``); with a
        ``plan`` (``compaction_lagqueue``) each lag topic's lead is that of its rank in deadline
        order instead, the deadlines read are kept in the plan's queue, and the topics before a
        due one in deadline order are read and due with it.
        ``join_ms``: when some topic is due, a topic with a maximum lag that would fall due within
        this long comes along (its priority below 1), so lag topics that fall due a little apart
        share one job instead of drifting into jobs that alternate, each waiting for the other."""
        self.timeline = {}
        self.max_lags = {}
        namespaces: dict[str, dict] = {}  # the namespaces' policies, read once per check
        read = []
        for topic in self.storage.topics() if topics is None else topics:
            entry = self._read(topic, busy, watch, namespaces, plan)
            if entry is not None:
                read.append(entry)
        cut = None
        if plan is not None:
            seen = {entry[0] for entry in read}
            for topic in plan.queue.due(now_ms, plan):  # before a due one: read them too
                if topic in seen:
                    continue
                entry = self._read(topic, busy, watch, namespaces, plan)
                if entry is not None:
                    read.append(entry)
                elif topic in plan.queue:  # busy meanwhile: its run's end is looked at anyway
                    plan.queue.hold(topic, now_ms + retry_ms)
            cut = plan.queue.cut(now_ms, plan)  # the prefix's deadlines as they are now
        due: list = []
        joining: list = []
        for entry in read:
            try:
                lead = lead_ms if plan is None else _lead_in_plan(plan, entry[0], cut, now_ms)
                self._decide(entry, now_ms, running_elsewhere, watch, retry_ms, lead, join_ms, due, joining)
            except CompactMQError as e:  # a topic deleted meanwhile, a damaged one: skip it
                log.debug("threshold check of %s skipped: %s", entry[0], e)
            if plan is not None and entry[0] not in self.timeline and _through(plan, entry[0], cut):
                plan.queue.hold(entry[0], now_ms + retry_ms)  # the queue said due, the topic is not
        return due + joining if due else due

    def _read(self, topic: str, busy: set[str], watch: Any, namespaces: dict, plan: Optional["LagPlan"]):
        """``(topic, ledger, state, threshold, max lag, min lag)`` of a topic the check looks at,
        None for one it skips; a lag topic's deadline goes into ``plan``'s queue."""
        try:
            if not TopicName.parse(topic).persistent or topic in busy:
                return None
            if watch is not None:
                watch.reading(topic)  # its timer goes: _decide sets the one its ledger calls for
            threshold, max_lag, min_lag = self.settings_of(topic, namespaces)
            self.max_lags[topic] = max_lag
            if threshold <= 0 and max_lag <= 0:
                if watch is not None:
                    watch.lag_policy(topic, None)
                if plan is not None:
                    plan.queue.remove(topic)
                return None
            ml = self.storage.open_managed_ledger(topic, create=False)
            ensure_compaction_cursor(ml)
            state = self.state_of(topic)
            if plan is not None:
                oldest = oldest_uncompacted_publish_ms(ml, state.horizon) if max_lag > 0 else None
                if oldest is None:
                    plan.queue.remove(topic)
                else:
                    size = ml.size_after(state.horizon) if state.horizon is not None else ml.total_size()
                    plan.queue.set(topic, oldest + max_lag * 1000, size)
            return topic, ml, state, threshold, max_lag, min_lag
        except CompactMQError as e:  # a topic deleted meanwhile, a damaged one: skip it
            log.debug("threshold check of %s skipped: %s", topic, e)
            if plan is not None:
                plan.queue.remove(topic)
            return None

    def _decide(
        self, entry, now_ms, running_elsewhere, watch, retry_ms, lead_ms, join_ms, due, joining
    ) -> None:
        """Append the topic of ``entry`` (``_read``) to ``due`` or ``joining`` when it is, and
        tell the ``watch`` when to look at it again."""
        topic, ml, state, threshold, max_lag, min_lag = entry
        lead = lag_lead_ms(max_lag, lead_ms)
        if watch is not None:
            watch.lag_policy(
                topic,
                (max_lag * 1000 - lead) / 1000 if max_lag > 0 else None,
                time_only=threshold <= 0 and min_lag <= 0,
            )
        found = overdue(ml, state.horizon, threshold, max_lag, min_lag, now_ms, lead)
        if found is not None and state.status == RUNNING and running_elsewhere(topic):
            if watch is not None:
                watch.wake_at(topic, (now_ms + retry_ms) / 1000)
        elif found is not None:
            due.append((topic, *found))
            self.timeline[topic] = (*fell_due(ml, state.horizon, max_lag, now_ms, lead), max_lag)
            return
        if max_lag > 0 and join_ms > 0 and found is None:
            soon = overdue(
                ml, state.horizon, 0, max_lag, min_lag, now_ms, lag_lead_ms(max_lag, lead + join_ms)
            )
            if soon is not None:
                joining.append((topic, f"joins a job, {soon[0]}", 0.0, soon[2]))  # after the due
                self.timeline[topic] = (*fell_due(ml, state.horizon, max_lag, now_ms, lead), max_lag)
        if watch is not None and found is None:
            later = next_look_ms(ml, state.horizon, max_lag, min_lag, now_ms, lead)
            if later is not None:
                watch.wake_at(topic, later / 1000)


def _through(plan: "LagPlan", topic: str, cut) -> bool:
    """Whether ``topic`` is in ``plan``'s queue at or before the ``cut`` (``LagQueue.cut``)."""
    deadline = plan.queue.deadline_of(topic)
    return cut is not None and deadline is not None and (deadline, topic) <= cut


def _lead_in_plan(plan: "LagPlan", topic: str, cut, now_ms: int) -> int:
    """A lag topic's lead (ms): that of its rank; through the ``cut``, at least up to its
    deadline (it is due with the topics after it: ``compaction_lagqueue``)."""
    lead = plan.lead_ms(topic)
    if _through(plan, topic, cut):
        lead = max(lead, int(plan.queue.deadline_of(topic) or 0) - now_ms + 1)
    return lead


def _whole(value: Any) -> int:
    """A stored policy as a whole number; one that is not a number reads as 0 (off), as
    ``compaction.lag.lag_seconds_setting`` and ``DueCheck.threshold_of`` read it."""
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def lag_lead_ms(max_lag: int, lead_ms: int) -> int:
    """How long before its maximum lag (seconds) a topic is due: the time a run started now takes
    to commit (``lead_ms``, the monitor's estimate: ``compaction_lagbound``), at most the whole
    lag -- a run slower than the lag leaves the topic due whenever a message is uncompacted, so
    its runs go back to back (the monitor warns that the lag cannot be kept)."""
    if max_lag <= 0:
        return 0
    return int(min(max(0, lead_ms), max_lag * 1000))


def overdue(ml, horizon, threshold: int, max_lag: int, min_lag: int, now_ms: int, lead_ms: int = 0):
    """``(why, priority, backlog bytes)`` when the topic is due, else None (module notes).

    By age, a topic is due ``lead_ms`` (``lag_lead_ms``) before its oldest uncompacted message
    turns ``max_lag`` old, so that the run commits by then rather than starting then."""
    end = ml.last_position()
    if min_lag > 0:
        end = last_compactable(ml, min_lag, now_ms)
        if end is None or (horizon is not None and tuple(end) <= tuple(horizon)):
            return None  # everything uncompacted is younger than the minimum lag
    if end is None:
        return None
    after = ml.size_after(horizon) if horizon is not None else ml.total_size()
    backlog = after - ml.size_after(end)  # what a run would compact now
    why, priority = None, 0.0
    if threshold > 0 and backlog > threshold:
        why, priority = f"backlog {backlog} B > threshold {threshold} B", backlog / threshold
    if max_lag > 0:
        lag_ms = compaction_lag_ms(ml, horizon, now_ms)
        if lag_ms + lead_ms > max_lag * 1000:
            priority = max(priority, (lag_ms + lead_ms) / (max_lag * 1000))
            why = why or (
                f"oldest uncompacted message {lag_ms / 1000:.1f} s old, max lag {max_lag} s "
                f"(a run takes ~{lead_ms / 1000:.1f} s)"
            )
    return None if why is None else (why, priority, max(0, backlog))


def fell_due(ml, horizon, max_lag: int, now_ms: int, lead_ms: int) -> tuple[Optional[int], int]:
    """``(publish time of the oldest uncompacted message, when the topic fell due)`` in ms: by
    age, its maximum lag less ``lead_ms`` after that message (later than now for a topic that
    joins a job early); by size (or with no uncompacted message), now."""
    oldest = oldest_uncompacted_publish_ms(ml, horizon)
    if max_lag <= 0 or oldest is None:
        return oldest, now_ms
    return oldest, oldest + max_lag * 1000 - lead_ms


def next_look_ms(ml, horizon, max_lag: int, min_lag: int, now_ms: int, lead_ms: int = 0) -> Optional[int]:
    """When a topic that is not due now may become due with no append (ms), or None: its
    oldest uncompacted message reaching the maximum lag (less ``lead_ms``), or the first message
    the minimum lag holds back aging past it (which may put the backlog over the threshold)."""
    times = []
    if max_lag > 0:
        oldest = oldest_uncompacted_publish_ms(ml, horizon)
        due_at = None if oldest is None else oldest + max_lag * 1000 - lead_ms + 1
        # due then; already past it and not due: the min lag holds it
        if due_at is not None and due_at > now_ms:
            times.append(due_at)
    if min_lag > 0:
        end = last_compactable(ml, min_lag, now_ms)
        young = first_uncompacted(ml, end if end is not None else horizon)
        published = ml.publish_time_of(young) if young is not None else None
        if published is not None:
            times.append(max(now_ms + 1, published + min_lag * 1000))  # compactable from then on
    return min(times) if times else None


def unit_order(unit: Sequence[Any]) -> tuple:
    """Manual triggers first, then the earliest *deadline*, then the furthest past its policy,
    then the first queued (``RunProgress`` fields ``reason``, ``priority``, ``seq`` and its
    ``deadline()``).

    A deadline is a time, so units queued by different checks compare: a run of a topic with a
    maximum lag must commit by its oldest uncompacted message's publish time plus that lag; any
    other run was due when its check found it. (A priority is a ratio taken at its check: a
    topic queued when it was barely due would otherwise wait behind every topic a later check
    found further past its lag, job after job; and when it fell due depends on the lead of its
    check, which moves.)"""
    manual = any(run.reason == "manual" for run in unit)
    return (
        not manual,
        min(run.deadline() for run in unit),
        -max(run.priority for run in unit),
        min(run.seq for run in unit),
    )


def take_job(pending: list, max_topics: int, max_bytes: int) -> tuple[list, list]:
    """``(the next job's runs, the units left waiting)`` from ``pending`` units of runs (fields
    ``size_bytes`` and those of ``unit_order``), within ``max_topics`` topics and ``max_bytes``
    of backlog; the first unit in order always goes."""
    job: list = []
    size = 0
    rest = []
    closed = False  # the job took a unit that must run alone
    for unit in sorted(pending, key=unit_order):
        unit_size = sum(run.size_bytes for run in unit)
        alone = any(getattr(run, "alone", False) for run in unit)
        fits = len(job) + len(unit) <= max_topics and size + unit_size <= max_bytes
        if not job or (fits and not alone and not closed):
            job.extend(unit)
            size += unit_size
            closed = alone
        else:
            rest.append(unit)
    return job, rest


def ensure_compaction_cursor(ml) -> None:
    """Create the ``__compaction`` durable cursor at the earliest position when it is missing:
    from then on retention keeps every entry until a compaction has read it."""
    if ml.get_cursor(COMPACTION_CURSOR) is None:
        ml.open_cursor(COMPACTION_CURSOR, True, "earliest")


__all__ = [
    "DueCheck",
    "ensure_compaction_cursor",
    "fell_due",
    "lag_lead_ms",
    "next_look_ms",
    "overdue",
    "take_job",
    "unit_order",
]
