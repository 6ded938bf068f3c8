"""Several topics compacted by ONE Spark job: the partitions of a partitioned topic.

Pulsar compacts each partition of a partitioned topic on its own. Here ``PUT .../compaction`` on
a partitioned topic (and ``compact-topic`` on one) hands all its partitions to
``CompactionServiceFactory.compact_together``, which the Spark factory implements with this
module: one job group, one phase-one aggregation and one phase-two shuffle for every partition,
so N small partitions cost one job's fixed overhead instead of N.

What stays per partition
------------------------
Everything but the Spark job. Each partition is still a ``CompactionRunner`` run of its own
(in a thread of its own): its lock, its plan and new horizon, its compacted ledger, and its
commit in ONE metadata transaction of its own. The runners meet in a ``JointRun`` only for the
two phases: each hands its ``RunPlan`` to the joint run (``JointMember.run`` stands in for the
engine) and waits; when every runner has handed in its plan or dropped out (an empty topic, a
lock held elsewhere, a failure while planning), the last one to arrive runs the job for all and
each runner gets back the part files of its own plan. From there on the runners are independent
again: **a partition whose commit fails does not undo the others**; it keeps its previous view
and records ERROR, the others commit theirs (Pulsar's partitions are independent topics too).
A failure of the Spark job itself fails every partition that was in it.

The job computes a ``joint_plan.JointPlan`` of the plans handed in (which also says how the
partitions are kept apart in it) with ``pipeline``, as a single topic's run computes the joint
plan of its one plan.

Plans small enough for the in-process engine (``inprocess``, ``compactionInProcessMaxBytes``)
are run by it first, one after another in the leading thread, each failing on its own; the
Spark job takes the rest. Cancelling one member cancels the joint job (all its partitions fail
and keep their views).
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Callable, Optional, Sequence

from ... import errors
from .. import CompactionProgress, ProgressCallback
from ..plan import RunPlan
from .joint_plan import JointPlan


#: a task of a joint job gets at least this many bytes of input: the groups of small topics
#: share tasks (``task_count``)
TASK_BYTES = 64 << 20


def task_count(joint: JointPlan, cores: int) -> int:
    """Tasks per stage of a joint job: one per group when the plans are large, fewer when they
    are small -- a task per group of a hundred 1 MB topics cost a hundred Python task starts a
    stage for a few milliseconds of work each. At least ``cores`` (every core busy), at most one
    per group; one per group when a plan's size cannot be told (``inprocess.plan_bytes``)."""
    from .inprocess import plan_bytes

    n = max(1, len(joint.owners))
    total = 0
    for p in joint.plans:
        size = plan_bytes(p)
        if size is None:
            return n
        total += size
    return max(1, min(n, max(int(cores), -(-total // TASK_BYTES))))


# --- the meeting point of the runners --------------------------------------------------------


@dataclasses.dataclass
class _Entry:
    plan: RunPlan
    strategy: object
    report: Callable
    parts: Optional[list] = None
    error: Optional[BaseException] = None
    stats: dict = dataclasses.field(default_factory=dict)


class JointRun:
    """Where the runners of one ``compact_together`` meet; see the module notes.

    ``member(i)`` is runner ``i``'s engine. Each runner either calls its member's ``run`` (hands
    in its plan and waits for its parts) or never does; ``leave(i)`` is called for every runner
    when it is over, so the joint run knows nobody else is coming. The thread that completes
    the set runs the Spark job(s).
    """

    def __init__(self, engine, members: int) -> None:
        self.engine = engine  # a SparkEngine: the session and the progress poller
        self.jobs = 0  # Spark job groups run (one per compatible set of plans)
        self.job_groups: list[str] = []
        self._cond = threading.Condition()
        self._pending = set(range(members))  # neither handed in a plan nor left
        self._entries: dict[int, _Entry] = {}
        self._started = False
        self._finished = False
        self._cancelled = False
        self._group: Optional[str] = None
        self._local = None  # the in-process engine running a small plan, if one is

    def member(self, index: int) -> "JointMember":
        return JointMember(self, index)

    # called by the runners' threads

    def submit(self, index: int, plan: RunPlan, strategy, report) -> _Entry:
        with self._cond:
            if self._started:
                raise errors.CompactionError("the joint compaction job started without this topic")
            self._entries[index] = _Entry(plan, strategy, report)
            self._pending.discard(index)
            lead = self._take_lead()
        if lead:
            self._run_all()
        with self._cond:
            while not self._finished:
                self._cond.wait()
            return self._entries[index]

    def leave(self, index: int) -> None:
        with self._cond:
            if index not in self._pending:
                return
            self._pending.discard(index)
            lead = self._take_lead()
        if lead:
            self._run_all()

    def cancel(self) -> None:
        with self._cond:
            self._cancelled = True
            group = self._group
            local = self._local
        if local is not None:
            local.cancel()
        if group is not None:
            self.engine.spark.sparkContext.cancelJobGroup(group)

    # the job

    def _take_lead(self) -> bool:
        """(under the lock) True for the one thread that completes the set of runners."""
        if self._pending or self._started:
            return False
        self._started = True
        if not self._entries:
            self._finished = True
            self._cond.notify_all()
            return False
        return True

    def _run_all(self) -> None:
        try:
            small = self._run_small()
            rest = {i: e for i, e in self._entries.items() if i not in small}
            for batch in _compatible(rest):
                try:
                    self._run_job(batch)
                except BaseException as e:  # every plan of this job fails with it
                    for entry in batch.values():
                        entry.error = e
                    if not isinstance(e, Exception):
                        raise
        finally:
            with self._cond:
                for entry in self._entries.values():  # never hand back "no parts" for a job not run
                    if entry.parts is None and entry.error is None:
                        entry.error = errors.CompactionError("the joint compaction job did not run")
                self._finished = True
                self._cond.notify_all()

    def _run_small(self) -> set[int]:
        """Run the plans small enough for the in-process engine (``inprocess``: the engine's
        ``in_process_max_bytes``) one after another, without a Spark job; each fails on its
        own. Returns their indexes."""
        from . import inprocess

        max_bytes = int(getattr(self.engine, "in_process_max_bytes", 0) or 0)
        done: set[int] = set()
        for i in sorted(self._entries) if max_bytes > 0 else ():
            entry = self._entries[i]
            if not inprocess.suits(entry.plan, max_bytes):
                continue
            local = inprocess.InProcessEngine()
            with self._cond:
                if self._cancelled:
                    break
                self._local = local
            try:
                entry.parts = local.run(entry.plan, entry.strategy, entry.report)
                entry.stats = dict(local.last_stats)
            except Exception as e:  # this plan's failure; the others go on
                entry.error = e
            finally:
                with self._cond:
                    self._local = None
            done.add(i)
        return done

    def _run_job(self, batch: dict[int, _Entry]) -> None:
        with self._cond:
            if self._cancelled:
                raise errors.CompactionError("compaction cancelled")
        order = sorted(batch)
        entries = [batch[i] for i in order]
        joint = JointPlan.of([e.plan for e in entries])
        total = joint.plan.estimated_entries

        def report(p: CompactionProgress) -> None:
            # every member sees the joint job's fraction of its own estimate: the partitions'
            # progress adds up to the whole topic's, and ends together
            for e in entries:
                own = e.plan.estimated_entries
                done = own if total == 0 else p.entries_processed * own // max(1, total)
                e.report(CompactionProgress(p.phase, done, own))

        if not joint.owners:  # nothing to read in any plan: every new view is empty
            for e in entries:
                e.parts, e.stats = [], {"messages_read": 0, "keyless_kept": 0}
            return
        from . import pipeline
        from .job import spark_job

        def set_group(group: Optional[str]) -> None:
            with self._cond:
                self._group = group

        spark = self.engine.spark
        description = f"compaction of {len(entries)} topics: {joint.plan.topic}"
        with spark_job(
            self.engine,
            joint.plan,
            report,
            description,
            members=len(entries),
            prefix="compactmq-joint",
            on_group=set_group,
        ) as job:
            self.jobs += 1
            self.job_groups.append(job.group)
            n_tasks = task_count(joint, self.engine.parallelism)
            parts = pipeline.compact(spark, joint, entries[0].strategy, job, n_tasks)
        for e, p, c, k in zip(entries, parts, job.counters, job.keyless):
            e.parts = p
            e.stats = {"messages_read": c.value, "keyless_kept": k.value, "job_group": job.group}


def _compatible(entries: dict[int, _Entry]) -> list[dict[int, _Entry]]:
    """The handed-in plans in sets that can share one aggregation: same strategy (a user
    strategy: same class)."""
    batches: dict[tuple, dict[int, _Entry]] = {}
    for i in sorted(entries):
        e = entries[i]
        kind = e.plan.strategy
        if kind == "user":
            kind = f"user:{type(e.strategy).__module__}.{type(e.strategy).__qualname__}"
        batches.setdefault((kind,), {})[i] = e
    return list(batches.values())


class JointMember:
    """The engine a runner of a joint run sees (``SparkEngine``'s shape): its ``run`` hands the
    plan to the joint run and returns this plan's part files once the joint job is done."""

    def __init__(self, joint: JointRun, index: int) -> None:
        self.joint = joint
        self.index = index
        self.last_stats: dict = {}

    @property
    def parallelism(self) -> int:
        return self.joint.engine.parallelism

    def run(self, plan: RunPlan, strategy, report) -> list[dict]:
        entry = self.joint.submit(self.index, plan, strategy, report)
        if entry.error is not None:
            raise entry.error
        self.last_stats = dict(entry.stats)
        return list(entry.parts or [])

    def cancel(self) -> None:
        self.joint.cancel()


def compact_together(
    joint: JointRun, services: Sequence, progress: Optional[Sequence[Optional[ProgressCallback]]] = None
) -> list:
    """Compact ``services`` (``LedgerCompactionService``s) through ``joint`` (made for as many
    members): each in a thread of its own, meeting for the Spark job. Returns, in order, each
    one's ``CompactionResult`` or the exception its run ended with."""
    reports = list(progress) if progress is not None else [None] * len(services)
    if not getattr(joint.engine, "in_process_max_bytes", 0):
        joint.engine.spark  # create the session here, once, before the runners' threads ask for it
    outcomes: list = [None] * len(services)

    def one(i: int) -> None:
        try:
            outcomes[i] = services[i].compact(reports[i], engine=joint.member(i))
        except Exception as e:  # the outcome of this topic; the others go on
            outcomes[i] = e
        finally:
            joint.leave(i)

    threads = [
        threading.Thread(target=one, args=(i,), name=f"compaction-joint-{i}", daemon=True)
        for i in range(len(services))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcomes


__all__ = ["JointMember", "JointPlan", "JointRun", "compact_together"]
