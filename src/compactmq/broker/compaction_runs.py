"""One compaction job in a worker thread: the runs it holds, their bookkeeping and outcomes.

The compaction monitor (``compaction_monitor``) decides *when* topics are compacted and which
runs share a job; this module is what a worker thread of its pool does with one job
(``RunWorker._run_together_blocking``), and the record of a run while it waits and runs
(``RunProgress``):

1. **Begin** each run on its own (``_begin``): read the topic's compaction state and sizes, make
   sure it has the ``__compaction`` cursor, and take a fresh compaction service. A run that
   cannot begin (the topic was deleted, the broker is closing) fails alone and the job goes on
   without it.
2. **Compact**: one topic calls its service's ``compact``; several call the factory's
   ``compact_together`` (one Spark job for the default factory), which returns one outcome per
   topic -- a result or an exception -- so a topic that fails does not fail the others.
3. **Record** each outcome on its own (``_succeeded`` / ``_failed``): counters and the summary log
   line (``compaction_stats``), a failure the run could not record itself written to the
   compaction state, the post-compaction hooks of a committed view, and the topic's last run
   with milliseconds per phase (the queue wait, ``begin``, the run's own steps, ``after``).

``RunWorker`` is a mixin of ``CompactionMonitor``: it uses the monitor's storage, records, clock,
factory and services, and its ``_running`` map (what ``close`` cancels).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional

from ..compaction.state import states_of
from ..errors import CompactMQError, Conflict, ServiceNotReady
from .compaction_due import ensure_compaction_cursor
from .compaction_stats import RunRecords

if TYPE_CHECKING:  # pragma: no cover
    from ..compaction import TopicCompactionService

log = logging.getLogger("compactmq.broker.compaction_monitor")  # operators grep the monitor's lines

#: runs committed past their maximum lag are told at WARN at most this often (``_report_late``)
LATE_LOG_SECONDS = 60.0


@dataclass
class RunProgress:
    """One queued or running compaction in this process."""

    topic: str
    reason: str
    queued_at: float
    phase: str = "queued"
    entries_processed: int = 0
    entries_total: int = 0
    phase_started: float = 0.0
    started_at: float | None = None
    before_version: Any = None  # the compaction state's version when the run began
    job_group: list[str] = field(default_factory=list)  # the topics of its joint job (itself alone)
    priority: float = 0.0  # how overdue (``_priority``); manual triggers go first whatever it is
    size_bytes: int = 0  # what it would read from the topic (its backlog), for the job's bound
    seq: int = 0  # arrival order in this monitor
    alone: bool = False  # its last run here failed: it gets a job of its own (``compaction_due``)
    phases: dict[str, float] = field(default_factory=dict)  # seconds per phase (``last_run``)
    # its timeline (clock seconds), for the lag bound: the check that found it due started at
    # ``checked_at``; by its policy it fell due at ``due_at`` (a maximum lag less the lead); its
    # oldest uncompacted message then was published at ``oldest_ms``; the job recorded its
    # outcome at ``committed_at`` (so that message waited ``committed_at - oldest_ms / 1000``)
    checked_at: float | None = None
    due_at: float | None = None
    oldest_ms: int | None = None
    max_lag: int = 0
    committed_at: float | None = None
    #: for a lag topic, what its check counted (``compaction_checks.lag_decision``)
    lag_plan: Optional[dict[str, Any]] = None

    def deadline(self) -> float:
        """When it must commit by: with a maximum lag, its oldest uncompacted message's publish
        time plus that lag; else when it fell due (``compaction_due.unit_order``)."""
        if self.max_lag > 0 and self.oldest_ms is not None:
            return self.oldest_ms / 1000 + self.max_lag
        return self.due_at if self.due_at is not None else self.queued_at

    def lag_at_commit(self) -> float | None:
        """Seconds its oldest uncompacted message waited for this run's commit (None: unknown)."""
        if self.committed_at is None or self.oldest_ms is None:
            return None
        return max(0.0, self.committed_at - self.oldest_ms / 1000)

    def update(self, phase: str, processed: int, total: int, now: float) -> None:
        if phase != self.phase:
            self.phase_started = now
        self.phase = phase
        self.entries_processed = int(processed)
        self.entries_total = int(total)

    def as_json(self, now: float) -> dict[str, Any]:
        eta = None
        done, total = self.entries_processed, self.entries_total
        if self.started_at is not None and 0 < done < total:
            elapsed = now - self.started_at
            eta = round(elapsed * (total - done) / done, 1)
        elif total and done >= total:
            eta = 0.0
        return {"phase": self.phase, "entriesProcessed": done, "entriesTotal": total, "etaSeconds": eta}


@dataclass
class _Begun:
    """A run about to call its service: the state and sizes before it, and the service."""

    before: Any
    ml: Any
    prev_size: int
    live_before: int
    service: "TopicCompactionService"


class RunWorker:
    """The worker-thread half of the compaction monitor (module notes)."""

    storage: Any
    service: Any
    records: RunRecords
    clock: Callable[[], float]
    _closing: bool
    _running: dict[str, "TopicCompactionService"]
    _late_logged_at: float = float("-inf")  # when a late run was last told at WARN

    def factory(self) -> Any:  # pragma: no cover - the monitor's
        raise NotImplementedError

    def service_of(self, topic: str) -> "TopicCompactionService":  # pragma: no cover - the monitor's
        raise NotImplementedError

    def _run_blocking(self, run: RunProgress) -> None:
        self._run_together_blocking([run])

    def _run_together_blocking(self, runs: list[RunProgress]) -> None:
        """One run of one topic (``service.compact``), or of several topics together
        (``factory.compact_together``); each topic's outcome is recorded on its own."""
        begun: list[tuple[RunProgress, _Begun]] = []
        group = [run.topic for run in runs]
        try:
            for run in runs:
                run.job_group = group
                try:
                    begun.append((run, self._begin(run)))
                except BaseException as e:
                    self._failed(run, e)
            services = [b.service for _, b in begun]
            reports = [self._reporter(run) for run, _ in begun]
            if len(services) == 1:
                try:
                    outcomes: list = [services[0].compact(progress=reports[0])]
                except Exception as e:
                    outcomes = [e]
            elif services:
                outcomes = self.factory().compact_together(services, reports)
            else:
                outcomes = []
        finally:
            for run, b in begun:
                self._running.pop(run.topic, None)
                try:
                    b.service.close()
                except Exception:  # pragma: no cover
                    log.exception("closing the compaction service of %s failed", run.topic)
        committed = self.clock()  # every run of the job committed by now
        for (run, b), outcome in zip(begun, outcomes):
            run.committed_at = committed
            mark = time.perf_counter()
            if isinstance(outcome, BaseException):
                self._failed(run, outcome)
            else:
                run.phases.update(outcome.step_seconds or {})
                self._succeeded(run, b, outcome)
            run.phases["after"] = time.perf_counter() - mark
            self._record_last_run(run, outcome)
        self._report_late([run for run, _ in begun])

    def _report_late(self, runs: list[RunProgress]) -> None:
        """Runs of a job that committed past their maximum lag: one WARN line for the worst, at
        most one every ``LATE_LOG_SECONDS`` (the rest at DEBUG), with its timeline and what its
        check counted -- unless its policy is below the floor, which was reported already."""
        late = [
            (lag, run)
            for run in runs
            if run.max_lag > 0 and (lag := run.lag_at_commit()) and lag > run.max_lag
        ]
        if not late:
            return
        lag, worst = max(late, key=lambda item: item[0])
        bound = getattr(self, "lag_bound", None)
        topic_bound = bound.bound_of(worst.topic) if bound is not None else None
        now = time.monotonic()
        warn = (topic_bound is None or topic_bound.kept) and now >= self._late_logged_at + LATE_LOG_SECONDS
        if warn:
            self._late_logged_at = now
        oldest = (worst.oldest_ms or 0) / 1000

        def at(t: Optional[float]) -> str:
            return "?" if t is None else f"{t - oldest:+.1f}"

        log.log(
            logging.WARNING if warn else logging.DEBUG,
            "%d of the %d runs of a compaction job committed past their max lag; the worst, %s, "
            "%.1f s after its oldest uncompacted message (max lag %d s): due %s s, checked %s s, "
            "queued %s s, started %s s, committed %s s after that message; its check counted %s",
            len(late),
            len(runs),
            worst.topic,
            lag,
            worst.max_lag,
            at(worst.due_at),
            at(worst.checked_at),
            at(worst.queued_at),
            at(worst.started_at),
            at(worst.committed_at),
            worst.lag_plan,
        )

    def _record_last_run(self, run: RunProgress, outcome: Any) -> None:
        self.records.record_last_run(run, outcome)

    def last_run(self, topic: str) -> Optional[dict[str, Any]]:
        """(worker thread) The topic's last run in this process (``compaction_stats``), None
        before its first."""
        return self.records.last_run(topic)

    def _reporter(self, run: RunProgress):
        return lambda p: run.update(p.phase, p.entries_processed, p.entries_total, self.clock())

    def _begin(self, run: RunProgress) -> "_Begun":
        """What a run needs before it starts: the topic's state and sizes, a fresh service."""
        topic = run.topic
        mark = time.perf_counter()
        run.started_at = self.clock()
        run.phases["queue"] = max(0.0, run.started_at - run.queued_at)  # trigger -> a worker took it
        run.update("start", 0, 0, run.started_at)
        before = self.service_of(topic).state()
        run.before_version = before.version
        if self._closing:
            raise ServiceNotReady("the broker is shutting down")
        ml = self.storage.open_managed_ledger(topic, create=False)
        # as Pulsar's __compaction subscription: from the first run on, retention keeps what no
        # run has read -- including the ledger this run seals and then reads, which retention
        # could otherwise delete between the seal and the read (a joint run of many partitions
        # reads it seconds later)
        ensure_compaction_cursor(ml)
        prev_h = before.horizon
        prev_size = max(0, self.service_of(topic).stats().size_bytes)
        live_before = ml.size_after(prev_h) if prev_h is not None else ml.total_size()
        service = self.factory().new_service(topic)
        self._running[topic] = service
        if self._closing:
            self._running.pop(topic, None)
            service.close()
            raise ServiceNotReady("the broker is shutting down")
        run.phases["begin"] = time.perf_counter() - mark
        return _Begun(before, ml, prev_size, live_before, service)

    def _failed(self, run: RunProgress, e: BaseException) -> None:
        topic = run.topic
        if isinstance(e, Conflict):  # another process got the topic's lock first: not a failure of ours
            log.warning("compaction of %s not run (%s): %s", topic, run.reason, e)
            return
        started = run.started_at if run.started_at is not None else self.clock()
        elapsed_ms = int((self.clock() - started) * 1000)
        self.records.failed(topic, elapsed_ms)
        reason = str(e) or type(e).__name__
        try:
            after = self.service_of(topic).state()
            recorded = run.before_version is not None and after.version != run.before_version
        except CompactMQError:
            recorded = False
        if not recorded and not isinstance(e, ServiceNotReady):
            # failed before the run could record anything (factory, storage): record it here
            try:
                states_of(self.storage).record_failure(
                    topic, reason, expected_version=run.before_version, duration_ms=elapsed_ms
                )
            except CompactMQError:
                log.exception("recording the failed compaction of %s failed", topic)
        log.error(
            "compaction of %s failed after %.1fs (%s): %s", topic, elapsed_ms / 1000, run.reason, reason
        )

    def _succeeded(self, run: RunProgress, begun: "_Begun", result: Any) -> None:
        topic = run.topic
        ml, prev_size, live_before = begun.ml, begun.prev_size, begun.live_before
        # what the run read (previous compacted ledger + live entries up to the new horizon)
        # and what it wrote (the new compacted ledger)
        live_after = ml.size_after(result.horizon) if result.horizon is not None else 0
        bytes_in = prev_size + max(0, live_before - live_after)
        try:
            bytes_out = self._view_bytes(topic, result) if result.horizon is not None else 0
        except CompactMQError:
            bytes_out = 0
        self.records.succeeded(topic, run.reason, result, bytes_in, bytes_out)
        self._after_compaction(topic, result)

    def _view_bytes(self, topic: str, result: Any) -> int:
        """The size of the view ``result`` committed: what its run recorded with the commit (the
        state's details, one metadata read), else the view's own size (opening it: its chain and
        key sidecar, about 5 ms a topic -- in a joint job of many topics, one after another)."""
        state = self.service_of(topic).state()
        view = result.compacted_ledger_id
        mine = view is not None and getattr(state, "details_of", None) == view
        recorded = (getattr(state, "details", None) or {}).get("bytes") if mine else None
        if isinstance(recorded, int) and recorded >= 0:
            return recorded
        return max(0, self.service_of(topic).stats().size_bytes)

    def _after_compaction(self, topic: str, result: Any) -> None:
        """Run the post-compaction hooks (``compaction.hooks``): a failing one is logged, never
        turned into a failed compaction (the view is committed already)."""
        for hook in self.service.post_compaction_hooks:
            try:
                hook(self.storage, self.service.config, topic, result)
            except Exception as e:  # noqa: BLE001 - an adapter's failure is its own
                log.error(
                    "post-compaction hook %s failed for %s: %s",
                    getattr(hook, "__name__", hook),
                    topic,
                    str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__,
                )


__all__ = ["RunProgress", "RunWorker"]
