"""Compaction inside the broker: runs on demand and the periodic threshold check.

One ``CompactionMonitor`` per broker (``BrokerService.compaction_monitor``). It owns:

* **Runs.** ``trigger(topic)`` starts one compaction of a topic in a worker thread (the
  ``TopicCompactionService`` from the configured factory blocks for the whole run; the default
  one starts a local SparkSession on its first run, one JVM per broker). At most one run per
  topic: a second trigger while one is queued or running is a ``Conflict`` (HTTP 409). At most
  ``compactionMaxConcurrentRuns`` run at once; triggers beyond that wait their turn in the
  worker pool and report the phase ``queued``. ``trigger_together(topics)`` queues the
  partitions of a partitioned topic as ONE run (one worker, the factory's ``compact_together``:
  one Spark job for the default factory); each partition still has its own status and outcome.
* **Joint jobs.** Runs wait in ``_pending`` until a worker is free; a free worker takes every
  waiting run that fits one job (``_take_job``: at most ``compactionJointMaxTopics`` topics and
  ``compactionJointMaxBytes`` of backlog, the first always) and hands them to
  ``compact_together`` (``compaction_due`` holds the rule). So the topics due at one check, and
  the triggers that arrive while every worker is busy, are compacted by one Spark job each
  batch, paying a job's fixed cost once; each topic still locks, plans, commits and fails on
  its own. Order: manual triggers first,
  then the most overdue (backlog / threshold, lag / max lag), then the first queued. A trigger
  that finds a worker free starts at once, alone: nothing waits to be gathered.
* **Status.** The persisted status (NOT_RUN / RUNNING / SUCCESS / ERROR, last error, timestamps)
  lives in the metadata store's compaction state, written by the compaction run itself, so it
  survives a restart (unlike Pulsar, whose status is in broker memory). While a run is in this
  process its live progress (phase, entries processed, estimated total, an ETA) is added.
  A run cut short by a crash leaves RUNNING in the store: at start the monitor turns such a
  state into ERROR, unless another process (a ``compact-topic`` job) holds the topic's lock.
* **The periodic check** (the rules are in ``compaction_due``), every
  ``brokerServiceCompactionMonitorIntervalInSeconds``, looks only at the topics that changed
  since the last one (``compaction_watch``: appended to, a policy changed, a lag came due, a run
  ended), and at every topic at the first check and every
  ``compactionMonitorFullScanIntervalInSeconds``: for each persistent topic with a threshold
  (topic policy, else namespace policy, else
  ``brokerServiceCompactionThresholdInBytes``; 0 disables), estimate the backlog since the
  horizon -- the bytes after the horizon, or, for a topic never compacted (typically read only
  by readers, with no cursor to measure), its total size -- and trigger a run when it exceeds
  the threshold. A failed run is recorded as ERROR with its reason; the next check retries it
  when the backlog is still over the threshold. The check also makes sure every topic with a
  threshold (or a maximum lag) has the ``__compaction`` cursor, so retention keeps what
  compaction has not read.
* **The time-based trigger** (``compaction.lag`` explains both lags), in the same check: a topic
  whose oldest uncompacted message is older than its ``compactionMaxLagSeconds`` (topic policy,
  else namespace policy, else ``brokerServiceCompactionMaxLagInSeconds``; 0 disables) is
  compacted whatever its backlog. With a ``compactionMinLagSeconds`` only what is older than the
  minimum lag counts: a topic whose uncompacted messages are all younger is not due, by size or
  by age (a run could not move its horizon).
* **Statistics** for ``/metrics`` (Pulsar's compaction metric names), one summary log line per
  run, and each topic's last run here (the topic stats' ``lastCompactionRun``): ``compaction_stats``.
* **The services.** ``service_of(topic)`` is the one ``TopicCompactionService`` of a topic the
  broker and the admin adapter read the compacted view and its stats through; everything this
  monitor knows of compacted data (sizes, locks, cancellation) it also asks the service.

State of one topic, as this monitor sees it::

    idle --trigger--> queued --worker free--> running --ok--> idle (SUCCESS persisted)
                                                      \\--fail--> idle (ERROR persisted)
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional

from ..errors import CompactMQError, Conflict, NotAllowed, ServiceNotReady, TopicNotFound
from ..naming import TopicName
from ..compaction.state import ERROR, RUNNING, states_of
from ..compaction.tiered import attach as attach_tiered
from ..compaction.tiered import sweep_all_view_orphans
from .compaction_due import DueCheck, ensure_compaction_cursor, overdue, take_job
from .compaction_stats import RunRecords, TopicCompactionStats
from .compaction_watch import DueWatch
from .background import stop_task

__all__ = ["CompactionMonitor", "RunProgress", "TopicCompactionStats", "ensure_compaction_cursor"]

if TYPE_CHECKING:  # pragma: no cover
    from ..compaction import CompactionServiceFactory, TopicCompactionService

if TYPE_CHECKING:  # pragma: no cover
    from .server import BrokerService

log = logging.getLogger(__name__)

# How long broker shutdown waits for running compactions to stop after their Spark jobs are
# cancelled (they record ERROR and release the topic lock on the way out).
SHUTDOWN_WAIT_SECONDS = 20.0

# After a policy change the check starts this much later, so that policies set one after another
# (a namespace's threshold and lag, a partitioned topic's partitions) are checked together.
POLICY_CHECK_DELAY_SECONDS = 0.05


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


class CompactionMonitor:
    """Runs compactions for the broker; see the module notes."""

    def __init__(self, service: "BrokerService", clock: Callable[[], float] = time.time) -> None:
        self.service = service
        self.config = service.config
        self.storage = service.storage
        self.clock = clock
        self.max_runs = max(1, int(self.config["compactionMaxConcurrentRuns"]))
        self.interval = float(self.config["brokerServiceCompactionMonitorIntervalInSeconds"])
        self._due = DueCheck(self.storage, self.config, lambda topic: self.service_of(topic).state())
        # tiered storage may now copy this broker's self-contained compacted views
        attach_tiered(self.storage)
        self._executor = ThreadPoolExecutor(self.max_runs, thread_name_prefix="compaction")
        # bounds of one joint job (``_take_job``)
        self.max_job_topics = max(1, int(self.config.get("compactionJointMaxTopics", 100)))
        self.max_job_bytes = max(1, int(self.config.get("compactionJointMaxBytes", 1 << 30)))
        self._pending: list[list[RunProgress]] = []  # units waiting for a worker (``_pump``)
        self._active = 0  # jobs in the worker pool
        self._seq = 0  # arrival order, the last tie-break of priorities
        self.jobs_started = 0  # jobs handed to the worker pool (tests and metrics)
        self._runs: dict[str, RunProgress] = {}
        self._futures: set[asyncio.Future] = set()
        self.records = RunRecords()  # counters and last runs (``compaction_stats``)
        self.stats: dict[str, TopicCompactionStats] = self.records.stats
        self.last_runs: dict[str, dict[str, Any]] = self.records.last_runs
        # the topics a check looks at: those that changed (``compaction_watch``)
        self.watch = DueWatch(float(self.config.get("compactionMonitorFullScanIntervalInSeconds", 300)))
        self._factory: Optional["CompactionServiceFactory"] = None
        self._factory_lock = threading.Lock()
        self._services: dict[str, "TopicCompactionService"] = {}  # read side, per topic
        self._running: dict[str, "TopicCompactionService"] = {}  # compact() in progress
        self._check_task: asyncio.Task | None = None
        self._wake: asyncio.Event | None = None  # set by a policy change: check now (``_check_loop``)
        self._closing = False
        self.checks = 0  # periodic checks done (tests and metrics)

    # --- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        await self.service.run_blocking(self._reconcile_interrupted_runs)
        if self.interval > 0:
            topics = getattr(self.service, "topics", None)
            if topics is not None:  # appends and policy changes make a topic worth a look
                topics.appended_listeners.append(self.watch.touch)
                topics.policy_listeners.append(self._policies_changed)
            self._wake = asyncio.Event()
            self._check_task = asyncio.get_running_loop().create_task(self._check_loop())

    async def close(self) -> None:
        """Stop checking, cancel running Spark jobs, wait (bounded) for runs to record their end."""
        self._closing = True
        await stop_task(self._check_task)
        topics = getattr(self.service, "topics", None)
        for listeners, fn in (
            (getattr(topics, "appended_listeners", []), self.watch.touch),
            (getattr(topics, "policy_listeners", []), self._policies_changed),
        ):
            if fn in listeners:
                listeners.remove(fn)
        # queued runs never start; running ones have their Spark jobs cancelled and end as ERROR
        for unit in self._pending:
            for run in unit:
                self._runs.pop(run.topic, None)
        self._pending.clear()
        self._executor.shutdown(wait=False, cancel_futures=True)
        if self._futures:
            for service in list(self._running.values()):
                try:
                    service.cancel()
                except Exception:  # pragma: no cover - best effort at shutdown
                    log.exception("cancelling a compaction failed")
            done, pending = await asyncio.wait(list(self._futures), timeout=SHUTDOWN_WAIT_SECONDS)
            if pending:
                log.warning("%d compaction(s) still running at shutdown", len(pending))
        for service in list(self._services.values()):
            try:
                service.close()
            except Exception:  # pragma: no cover - best effort at shutdown
                log.exception("closing a compaction service failed")
        self._services.clear()
        if self._factory is not None:
            try:
                self._factory.close()
            except Exception:  # pragma: no cover - best effort at shutdown
                log.exception("closing the compaction service factory failed")

    def _reconcile_interrupted_runs(self) -> None:
        """RUNNING in the store with nobody holding the topic's lock: the process that ran it died."""
        try:  # objects of views a run or an offload left before its commit (tiered storage)
            removed = sweep_all_view_orphans(self.storage)
            if removed:
                log.warning("deleted %d orphaned compacted-view object(s) at start", len(removed))
        except CompactMQError as e:  # an unreachable object store delays the clean-up only
            log.warning("sweeping orphaned compacted-view objects failed: %s", e)
        states = states_of(self.storage)
        for topic, state in states.all().items():
            if state.status != RUNNING:
                continue
            lock = self.service_of(topic).try_lock()
            if lock is None:
                continue  # a compact-topic job is running it right now
            try:
                # on the version read: a run that started since is not the interrupted one
                states.record_failure(
                    topic,
                    "interrupted: the process running this compaction stopped",
                    expected_version=state.version,
                )
                log.warning("compaction of %s was interrupted by a restart; recorded as ERROR", topic)
            finally:
                lock.release()

    # --- triggering ----------------------------------------------------------------------------

    def is_running(self, topic: str) -> bool:
        return topic in self._runs

    @property
    def running_topics(self) -> list[str]:
        return list(self._runs)

    async def trigger(self, name: str, reason: str = "manual") -> None:
        """Queue one compaction of ``name``.

        Raises:
            InvalidTopicName: ``name`` is not a topic name.
            NotAllowed: a non-persistent topic (nothing is stored to compact).
            TopicNotFound: no such topic.
            Conflict: a compaction of this topic is already queued or running.
            ServiceNotReady: the broker is shutting down.
        """
        topic, size = await self._admit(name)
        self._start([self._progress(topic, reason, size=size)])

    async def trigger_together(self, names: list[str], reason: str = "manual") -> list[str]:
        """Queue ONE run compacting the topics ``names`` together: the partitions of a
        partitioned topic, which the factory's ``compact_together`` runs as one piece of work
        (one Spark job for the default factory), each partition still committing its own view.

        Topics already queued or running (here or in a ``compact-topic`` job) are left out and
        returned; topics that do not exist are skipped; the others start.

        Raises:
            the errors of ``trigger`` other than Conflict and TopicNotFound.
        """
        runs: dict[str, RunProgress] = {}
        conflicts = []
        for name in names:
            try:
                topic, size = await self._admit(name)
            except Conflict:
                conflicts.append(str(TopicName.parse(name)))
                continue
            except TopicNotFound:
                continue
            runs.setdefault(topic, self._progress(topic, reason, size=size))
        if runs:
            self._start(list(runs.values()))
        return conflicts

    def _progress(self, topic: str, reason: str, priority: float = 0.0, size: int = 0) -> RunProgress:
        self._seq += 1
        failed = self.records.last_failed(topic)
        return RunProgress(
            topic,
            reason,
            queued_at=self.clock(),
            priority=priority,
            size_bytes=size,
            seq=self._seq,
            alone=failed,
        )

    async def _admit(self, name: str) -> tuple[str, int]:
        """The canonical name of a topic that may start a run now (the checks of ``trigger``), and
        its backlog since the horizon in bytes (what bounds a joint job)."""
        tn = TopicName.parse(name)
        if not tn.persistent:
            raise NotAllowed(f"{tn}: compaction is only for persistent topics")
        topic = str(tn)
        if self._closing:
            raise ServiceNotReady("the broker is shutting down")
        if topic in self._runs:
            raise Conflict(f"a compaction of {topic} is already running")
        size = await self.service.run_blocking(self._admission, topic)
        if size is None:
            raise Conflict(f"a compaction of {topic} is already running in another process")
        if topic in self._runs:  # another trigger got in while we looked
            raise Conflict(f"a compaction of {topic} is already running")
        return topic, size

    def _admission(self, topic: str) -> Optional[int]:
        """(worker thread) The topic's backlog since its horizon in bytes, or None while a
        ``compact-topic`` job compacts it. Raises TopicNotFound."""
        if not self.storage.topic_metadata.topic_exists(topic):
            raise TopicNotFound(f"topic {topic} does not exist")
        if self._running_elsewhere(topic):
            return None
        try:
            ml = self.storage.open_managed_ledger(topic, create=False)
            horizon = self.service_of(topic).get_last_compacted_position()
            return ml.size_after(horizon) if horizon is not None else ml.total_size()
        except CompactMQError:
            return 0  # the run finds out what is wrong and records it

    def _start(self, runs: list[RunProgress]) -> None:
        """Register ``runs`` (one unit: they will share a job) and queue them for the worker
        pool (no await in between, so no other trigger can slip in)."""
        for run in runs:
            self._runs[run.topic] = run
        self._pending.append(runs)
        self._pump()

    def _pump(self) -> None:
        """(event loop) Hand jobs to the worker pool while it has a free worker: each job takes
        the waiting units first by priority (``_take_job``), so triggers that arrive while every
        worker is busy (the due topics of a check, manual triggers during a run) are compacted
        together by the next job. A trigger that finds a worker free starts at once, alone."""
        loop = asyncio.get_running_loop()
        while self._pending and self._active < self.max_runs and not self._closing:
            runs = self._take_job()
            self._active += 1
            self.jobs_started += 1
            if len(runs) == 1:
                fut = loop.run_in_executor(self._executor, self._run_blocking, runs[0])
            else:
                fut = loop.run_in_executor(self._executor, self._run_together_blocking, runs)
            self._futures.add(fut)
            topics = [run.topic for run in runs]
            fut.add_done_callback(lambda f, topics=topics: self._run_done(topics, f))

    def _take_job(self) -> list[RunProgress]:
        """The next job's runs (``compaction_due.take_job``)."""
        job, self._pending = take_job(self._pending, self.max_job_topics, self.max_job_bytes)
        return job

    def _running_elsewhere(self, topic: str) -> bool:
        """RUNNING in the store and the topic's compaction lock held: a ``compact-topic`` job."""
        if self.service_of(topic).state().status != RUNNING:
            return False
        lock = self.service_of(topic).try_lock()
        if lock is None:
            return True
        lock.release()
        return False

    def _run_done(self, topics: list[str], fut: asyncio.Future) -> None:
        self._futures.discard(fut)
        self._active -= 1
        for topic in topics:
            self._runs.pop(topic, None)
            self.watch.touch(topic)  # a failed run is retried, a backlog that grew meanwhile seen
        if not fut.cancelled() and fut.exception() is not None:  # already logged in the thread
            pass
        if not self._closing:
            self._pump()  # the triggers that arrived meanwhile: the next job

    # --- one run (worker thread) ----------------------------------------------------------------

    def factory(self):
        with self._factory_lock:
            if self._factory is None:
                from ..compaction import load_factory

                self._factory = load_factory(self.config, self.storage)
            return self._factory

    def engine_warmup(self) -> Optional[dict]:
        """The factory's warm-up state (``compactionSparkWarmup``), None while no factory is loaded
        or when it has nothing to warm; never loads the factory itself."""
        factory = self._factory
        return factory.warmup_state() if factory is not None else None

    def service_of(self, topic: str) -> "TopicCompactionService":
        """The topic's compaction service for reads, stats and locks (one per topic, kept)."""
        service = self._services.get(topic)
        if service is None:
            service = self.factory().new_service(topic)
            with self._factory_lock:
                service = self._services.setdefault(topic, service)
        return service

    def forget(self, topic: str) -> None:
        """A deleted topic: drop its service."""
        service = self._services.pop(topic, None)
        if service is not None:
            service.close()

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
        for (run, b), outcome in zip(begun, outcomes):
            mark = time.perf_counter()
            if isinstance(outcome, BaseException):
                self._failed(run, outcome)
            else:
                run.phases.update(getattr(outcome, "step_seconds", None) or {})
                self._succeeded(run, b, outcome)
            run.phases["after"] = time.perf_counter() - mark
            self._record_last_run(run, outcome)

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
            bytes_out = max(0, self.service_of(topic).stats().size_bytes) if result.horizon is not None else 0
        except CompactMQError:
            bytes_out = 0
        self.records.succeeded(topic, run.reason, result, bytes_in, bytes_out)
        self._after_compaction(topic, result)

    def _after_compaction(self, topic: str, result: Any) -> None:
        """Run the post-compaction hooks (``compaction.hooks``): a failing one is logged, never
        turned into a failed compaction (the view is committed already)."""
        for hook in getattr(self.service, "post_compaction_hooks", ()):
            try:
                hook(self.storage, self.service.config, topic, result)
            except Exception as e:  # noqa: BLE001 - an adapter's failure is its own
                log.error(
                    "post-compaction hook %s failed for %s: %s",
                    getattr(hook, "__name__", hook),
                    topic,
                    str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__,
                )

    # --- status ---------------------------------------------------------------------------------

    def status_blocking(self, topic: str) -> dict[str, Any]:
        """The body of ``GET .../compaction`` (call from a worker thread: it reads the store)."""
        state = self.service_of(topic).state()
        run = self._runs.get(topic)
        body: dict[str, Any] = {"status": state.status, "lastError": state.last_error or ""}
        if run is not None:
            body["status"] = RUNNING
            body["progress"] = run.as_json(self.clock())
        elif state.status == RUNNING:
            # running in another process (a compact-topic job): no live progress from here
            body["progress"] = {
                "phase": "external",
                "entriesProcessed": 0,
                "entriesTotal": 0,
                "etaSeconds": None,
            }
        if state.status == ERROR and run is None:
            body["lastError"] = state.last_error or "unknown error"
        if run is not None and len(run.job_group) > 1:
            body["progress"]["jobTopics"] = len(run.job_group)
        return body

    # --- the periodic check ---------------------------------------------------------------------

    def _policies_changed(self, name: str) -> None:
        """(event loop) A topic or namespace policy changed through the admin API: the topics it
        concerns are looked at, by a check that starts now rather than at the next interval (a
        threshold or lag just set makes its topics due at once)."""
        self.watch.policies_changed(name)
        if self._wake is not None:
            self._wake.set()

    async def _check_loop(self) -> None:
        assert self._wake is not None
        while not self._closing:
            try:
                await asyncio.wait_for(self._wake.wait(), self.interval)
                await asyncio.sleep(POLICY_CHECK_DELAY_SECONDS)  # changes made together, checked together
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            try:
                await self.check_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("compaction threshold check failed")

    async def check_once(self) -> list[str]:
        """Queue every topic due for compaction among those that changed since the last check
        (``compaction_watch``; every topic at the first check and every full-scan interval);
        returns them."""
        if self._closing or self.service.shutting_down:
            return []
        busy = set(self._runs)
        topics = self.watch.take(self.clock())
        due = await self.service.run_blocking(self._due_topics, busy, topics)
        self.checks += 1
        if self._closing:
            return []
        triggered = []
        for topic, reason, priority, size in due:
            if topic in self._runs:  # triggered by hand while the check looked
                continue
            run = self._progress(topic, reason, priority, size)
            self._runs[topic] = run
            self._pending.append([run])
            triggered.append(topic)
        self._pump()  # no await since the check: every due topic waits together
        return triggered

    def _due_topics(
        self, busy: set[str], topics: Optional[list[str]] = None
    ) -> list[tuple[str, str, float, int]]:
        """``(topic, why, priority, backlog bytes)`` of every topic due (``compaction_due``) among
        ``topics`` (None: all), leaving out those a ``compact-topic`` job compacts right now."""
        return self._due.due_topics(
            busy,
            int(self.clock() * 1000),
            self._running_elsewhere,
            topics=topics,
            watch=self.watch,
            retry_ms=int(max(1.0, self.interval) * 1000),
        )

    def _why_due(self, ml, horizon, threshold: int, max_lag: int, min_lag: int) -> str | None:
        """Why the topic is due for compaction, or None when it is not."""
        found = overdue(ml, horizon, threshold, max_lag, min_lag, int(self.clock() * 1000))
        return None if found is None else found[0]
