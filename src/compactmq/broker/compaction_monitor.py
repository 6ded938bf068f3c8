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
  then the earliest deadline (a lag topic's oldest uncompacted message plus its maximum lag; else
  when it fell due), then the most overdue, then the first queued. While topics with a maximum
  lag wait, with ``compactionJointLagSplit`` a job takes at most as many as keeps their lags
  lowest when jobs run back to back (``compaction_jobsize``: a model of a job's length learned
  from the last jobs; the model is learned either way). A trigger
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
  compacted whatever its backlog. A maximum lag is a bound on when a message is in a committed
  view, which the monitor keeps rather than waits for: a topic falls due that much *earlier*,
  the *lead* (``lag_lead_seconds``, ``compaction_lagbound``): the time a run queued now takes to
  commit -- the check's measured latency, the wait for a busy worker, the jobs of the lag topics
  with earlier deadlines (``compaction_lagqueue``: the topics before it in deadline order, by the
  jobs' bounds and the workers; when a topic is due so are those) and the longest of the last
  jobs -- with a margin, at most the whole lag. When a topic's lag is below the least the
  monitor can keep (a message published just after a run read the topic waits for that run,
  then the lead), it says so once per topic (a WARN line, ``max_lag_status``, a metric) and
  runs the topic back to back. The check does not wait for the interval to
  find such a topic: the watch's lag timers wake the check loop (an append to a lag topic
  starts one), and so does the end of a run of a lag topic (what was published meanwhile is
  as old as the run already). With a ``compactionMinLagSeconds`` only what is older than the
  minimum lag counts: a topic whose uncompacted messages are all younger is not due, by size or
  by age (a run could not move its horizon).
* **Each run's timeline** (``RunProgress``: when its topic fell due, was checked, queued, started
  and committed, and when its oldest uncompacted message was published) is in its last run
  (``timelineMs``, ``lagAtCommitMs``), so which term of a lag overshoots can be told.
* **Statistics** for ``/metrics`` (Pulsar's compaction metric names), one summary log line per
  run, and each topic's last run here (the topic stats' ``lastCompactionRun``): ``compaction_stats``.
* **One job in a worker thread** (begin each run, compact, record each outcome on its own) is
  ``compaction_runs.RunWorker``, a mixin of the monitor.
* **The services.** ``service_of(topic)`` is the one ``TopicCompactionService`` of a topic the
  broker and the admin adapter read the compacted view and its stats through; everything this
  monitor knows of compacted data (sizes, locks, cancellation) it also asks the service.

State of one topic, as this monitor sees it::

    idle --trigger--> queued --worker free--> running --ok--> idle (SUCCESS persisted)
                                                      \\--fail--> idle (ERROR persisted)
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable, Optional

from ..config import bool_setting, int_setting
from ..errors import CompactMQError, Conflict, NotAllowed, ServiceNotReady, TopicNotFound
from ..naming import TopicName
from ..compaction.state import ERROR, RUNNING, states_of
from ..compaction.tiered import attach as attach_tiered
from ..compaction.tiered import sweep_all_view_orphans
from .compaction_jobsize import JobSizer
from .compaction_lagbound import LagBound, TopicBound
from .compaction_lagqueue import LagPlan, LagQueue
from .compaction_due import DueCheck, ensure_compaction_cursor, take_job
from .compaction_checks import DueChecks
from .compaction_runs import RunProgress, RunWorker
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

# The time a run takes is estimated from the longest of the last this many jobs (conservative:
# a lag bound is a promise about every message); the check's latency likewise.
JOB_TIMES_KEPT = 5


class CompactionMonitor(RunWorker, DueChecks):
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
        self.max_job_topics = max(1, int_setting(self.config, "compactionJointMaxTopics"))
        self.max_job_bytes = max(1, int_setting(self.config, "compactionJointMaxBytes"))
        self._pending: list[list[RunProgress]] = []  # units waiting for a worker (``_pump``)
        # topics per job while lag topics wait: learned from the last jobs (``compaction_jobsize``)
        self.sizer = JobSizer(self.max_job_topics)
        self.lag_split = bool_setting(self.config, "compactionJointLagSplit")
        self._job_cap = self.max_job_topics  # the bound the last job was taken with
        self._lag_topics: dict[str, tuple[float, int]] = {}  # lag topic -> (its last commit, max lag)
        self._active = 0  # jobs in the worker pool
        self._seq = 0  # arrival order, the last tie-break of priorities
        self.jobs_started = 0  # jobs handed to the worker pool (tests and metrics)
        self._runs: dict[str, RunProgress] = {}
        self._futures: set[asyncio.Future] = set()
        self.records = RunRecords()  # counters and last runs (``compaction_stats``)
        self.stats: dict[str, TopicCompactionStats] = self.records.stats
        self.last_runs: dict[str, dict[str, Any]] = self.records.last_runs
        # the topics a check looks at: those that changed (``compaction_watch``)
        self.watch = DueWatch(
            float(int_setting(self.config, "compactionMonitorFullScanIntervalInSeconds")),
            lambda: self.clock(),
        )
        self.watch.on_timer = self._timer_started
        # the terms of a lag topic's lead, and which lag topics are below the least lag kept
        self.lag_bound = LagBound(JOB_TIMES_KEPT)
        self._job_seconds: collections.deque[float] = self.lag_bound.job_seconds
        # the lag topics not running, in deadline order: the queue ahead of each (``lag_plan``)
        self.lag_queue = LagQueue()
        self._check_late = 0.0  # how late the check loop woke for the check about to run
        self._job_started: dict[int, float] = {}  # id of a job's future -> when it started
        self._job_size: dict[int, int] = {}  # id of a job's future -> its topics
        self._sleep_until: float | None = None  # when the check loop wakes next (``_check_loop``)
        self._check_now = False  # a policy change or a lag topic's run ended: check at once
        self._loop: asyncio.AbstractEventLoop | None = None
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
            topics = self.service.topics  # appends and policy changes make a topic worth a look
            topics.appended_listeners.append(self.watch.touch)
            topics.policy_listeners.append(self._policies_changed)
            self._wake = asyncio.Event()
            self._loop = asyncio.get_running_loop()
            self._check_task = self._loop.create_task(self._check_loop())

    async def close(self) -> None:
        """Stop checking, cancel running Spark jobs, wait (bounded) for runs to record their end."""
        self._closing = True
        await stop_task(self._check_task)
        topics = self.service.topics
        for listeners, fn in (
            (topics.appended_listeners, self.watch.touch),
            (topics.policy_listeners, self._policies_changed),
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
            self.watch.busy(run.topic)
            self.lag_queue.queued(run.topic)
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
            for run in runs:  # in flight: no longer ahead of the lag topics waiting
                self.lag_queue.remove(run.topic)
            self._active += 1
            self.jobs_started += 1
            if len(runs) == 1:
                fut = loop.run_in_executor(self._executor, self._run_blocking, runs[0])
            else:
                fut = loop.run_in_executor(self._executor, self._run_together_blocking, runs)
            self._futures.add(fut)
            self._job_started[id(fut)] = time.monotonic()
            self._job_size[id(fut)] = len(runs)
            topics = [run.topic for run in runs]
            fut.add_done_callback(lambda f, topics=topics: self._run_done(topics, f))
            if len(self.lag_queue):
                self._rearm()  # the waiting lag topics now wait for this job too: sleep less

    def _take_job(self) -> list[RunProgress]:
        """The next job's runs (``compaction_due.take_job``): while topics with a maximum lag
        wait, at most as many as keeps their lags lowest (``compaction_jobsize``)."""
        self._job_cap = self.max_job_topics
        if self.lag_split and any(run.max_lag > 0 for unit in self._pending for run in unit):
            # the lag topics in the cycle: waiting or running, or committed within two of their lags
            now = self.clock()
            for topic, (at, lag) in list(self._lag_topics.items()):
                if now - at > 2 * lag:
                    del self._lag_topics[topic]
            lags = {t: r.max_lag for t, r in self._runs.items() if r.max_lag > 0}
            lags.update((t, lag) for t, (_, lag) in self._lag_topics.items() if t not in lags)
            self._job_cap = self.sizer.cap(len(lags), min(lags.values()))
        job, self._pending = take_job(self._pending, self._job_cap, self.max_job_bytes)
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
        started = self._job_started.pop(id(fut), None)
        size = self._job_size.pop(id(fut), len(topics))
        if started is not None:
            self.lag_bound.job_ended(time.monotonic() - started, size)
            self.sizer.observe(size, time.monotonic() - started)
        for topic in topics:
            run = self._runs.pop(topic, None)
            if self.lag_split and run is not None and run.max_lag > 0:  # pruned by _take_job
                self._lag_topics[topic] = (self.clock(), run.max_lag)
            self.watch.run_ended(topic)  # a failed run is retried, a backlog that grew meanwhile seen
        if self._closing:
            return
        self._pump()  # the triggers that arrived meanwhile: the next job
        if any(self.watch.has_lag(topic) for topic in topics):
            # what was published during the run is as old as the run already: look at once
            self._request_check()

    def _inflight_wait(self) -> float:
        """How long a run queued now waits for a worker to free, when every worker is busy: the
        rest of the soonest-ending job in flight, as long as the last jobs of its size."""
        if self._active < self.max_runs or not self._job_started:
            return 0.0
        now = time.monotonic()
        return max(
            0.0,
            min(
                started + self.lag_bound.run(self._job_size.get(job)) - now
                for job, started in self._job_started.items()
            ),
        )

    def lag_plan(self) -> LagPlan:
        """The queue ahead of each lag topic now (``compaction_lagqueue``): the lag topics in
        deadline order, the runs waiting that go before all of them, topics per job (the bound
        the last job was taken with, and the bytes bound over the queue's mean backlog), the
        workers, the wait for a busy one."""
        others = sum(1 for unit in self._pending for run in unit if run.topic not in self.lag_queue)
        return LagPlan(
            self.lag_queue,
            self.lag_bound,
            per_job=LagPlan.per_job_of(self.lag_queue, self._job_cap, self.max_job_bytes),
            slots=self.max_runs,
            inflight=self._inflight_wait(),
            ahead=others,
            split_wait=self.sizer.last_wait,
        )

    def lag_lead_seconds(self) -> float:
        """How long before its maximum lag a topic at the head of the lag queue is due
        (``compaction_due.lag_lead_ms``): the time a run queued now takes to commit -- the
        check's latency, the wait for a worker and the jobs of the runs already waiting that go
        first, the run itself -- with a margin (``compaction_lagbound.LagBound.lead``); with the
        lag topics' jobs split round-robin, at least the model's round. A topic further back
        waits for the jobs of the lag topics before it too (``lag_plan``)."""
        plan = self.lag_plan()
        return plan.lead_of_jobs(plan.ahead // plan.per_job)

    def lag_floor_seconds(self) -> float:
        """The least maximum lag the monitor keeps now (``compaction_lagqueue.LagPlan.floor``),
        for every lag topic in the cycle (waiting, queued or running): below it a lag topic's
        runs go back to back and it is reported."""
        return self.lag_plan().floor(self._lag_topics_in_cycle())

    def lag_floor_measured(self) -> bool:
        """Whether the floor comes from jobs of about the queue's size (``LagBound.measured``):
        one scaled up from much smaller jobs (the warm-up's, after a start) is not judged."""
        return self.lag_plan().floor_measured(self._lag_topics_in_cycle())

    def _lag_topics_in_cycle(self) -> int:
        """The lag topics waiting, queued or running."""
        running = sum(1 for t, r in self._runs.items() if r.max_lag > 0 and t not in self.lag_queue)
        return len(self.lag_queue) + running

    def max_lag_status(self, topic: str) -> Optional[dict[str, Any]]:
        """The topic stats' ``compaction.maxLag``: its maximum lag, the least lag the monitor
        kept at its last check, and whether the policy is kept (None: no maximum lag seen)."""
        bound: Optional[TopicBound] = self.lag_bound.bound_of(topic)
        return None if bound is None else bound.as_json()

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
        self._lag_topics.pop(topic, None)
        self.lag_bound.forget(topic)
        self.lag_queue.remove(topic)
        service = self._services.pop(topic, None)
        if service is not None:
            service.close()

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
