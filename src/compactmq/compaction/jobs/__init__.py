"""The default compaction service: the two-phase pipeline on Apache Spark (through PySpark).

``SparkCompactionServiceFactory`` is what ``compactionServiceFactoryClassName`` names by default.
The SparkSession is created on the first ``compact()`` (never at import) with the config's
``spark.*`` settings, or reused when the process already has one (``getOrCreate``); a broker
with ``compactionSparkWarmup`` creates and warms it in the background at start (``warmup``).
"""

from __future__ import annotations

import functools
import os
import time
from typing import Mapping, Optional

from ...config import int_setting
from .. import CompactionProgress, CompactionServiceFactory
from ..service import LedgerCompactionService
from . import timeline
from .session import get_session


class SparkEngine:
    """Runs phase one and phase two of a ``RunPlan`` as one Spark action."""

    #: runs a lookup run when the plan asks for one (``compaction.lookup_run``); a joint job does not
    lookup_runs = True

    def __init__(
        self,
        spark_conf: Optional[Mapping[str, str]] = None,
        poll_seconds: float = 0.5,
        in_process_max_bytes: int = 0,
        fused_max_bytes: Optional[int] = None,
    ):
        self.spark_conf = dict(spark_conf or {})
        self.poll_seconds = poll_seconds
        #: plans reading at most this many bytes run without a Spark job (``inprocess``)
        self.in_process_max_bytes = in_process_max_bytes
        #: one-group keep-latest runs reading at most this many bytes are one Spark task (``fused``)
        if fused_max_bytes is None:
            from .fused import FUSED_MAX_BYTES as fused_max_bytes  # numpy and the scanner: not at import
        self.fused_max_bytes = fused_max_bytes
        self.last_stats: dict = {}
        self._spark = None
        self._group: Optional[str] = None
        self._local = None  # the in-process engine of the run in progress, if it is one

    @property
    def spark(self):
        # a session whose context was stopped (its JVM gone, or stopped by its owner) is asked
        # for again rather than kept: the next run would otherwise fail for the broker's life
        if self._spark is None or self._spark.sparkContext._jsc is None:
            self._spark = get_session(self.spark_conf)
        return self._spark

    @property
    def parallelism(self) -> int:
        if self._spark is None and self.in_process_max_bytes > 0:
            # a run that may go in-process need not start Spark to be planned: a local master
            # says its cores (``local_parallelism``)
            guess = local_parallelism(self.spark_conf)
            if guess:
                return guess
        return self.spark.sparkContext.defaultParallelism

    def run(self, plan, strategy, report) -> list[dict]:
        from . import fused, inprocess, pipeline
        from .joint_plan import JointPlan

        if inprocess.suits(plan, self.in_process_max_bytes):  # small: no Spark job at all
            self._local = inprocess.InProcessEngine()
            try:
                parts = self._local.run(plan, strategy, report)
            finally:
                self.last_stats, self._local = self._local.last_stats, None
            return parts
        from .job import spark_job

        with spark_job(self, plan, report, f"compaction of {plan.topic}", on_group=self._set_group) as job:
            if plan.is_lookup_run:
                from . import lookup_job

                parts = lookup_job.run(self.spark, plan, job.counters[0], job.keyless[0])
            elif fused.suits(plan, self.fused_max_bytes):  # one group: one task, no shuffle
                parts = fused.run(self.spark, plan, job.counters[0], job.keyless[0])
            else:  # a joint job of one member (``joint_plan``)
                (parts,) = pipeline.compact(self.spark, JointPlan.of([plan]), strategy, job)
        sc = self.spark.sparkContext
        self.last_stats = {
            "messages_read": job.counters[0].value,
            "keyless_kept": job.keyless[0].value,
            "job_group": job.group,
            # read from Spark only when someone looks (``timeline``): not on the run's path
            "timings": functools.partial(timeline.split, sc, job.group, job.started, time.time()),
        }
        return parts

    def _set_group(self, group: Optional[str]) -> None:
        self._group = group

    def cancel(self) -> None:
        """Cancel this run's Spark jobs (from another thread); the run then fails."""
        local = self._local
        if local is not None:
            local.cancel()
        group = self._group
        if group is not None and self._spark is not None:
            self._spark.sparkContext.cancelJobGroup(group)

    def _poll(self, sc, group, plan, report, stop) -> None:
        """Progress from Spark's status tracker: the parse stage (one task per group) is phase one,
        the stages after it phase two."""
        tracker = sc.statusTracker()
        total = plan.estimated_entries
        n = len(plan.groups)
        if plan.is_lookup_run:  # only the new groups are parsed
            from .. import lookup_run

            n = len(lookup_run.new_groups(plan))
        while not stop.wait(self.poll_seconds):
            try:
                stages = []
                for job_id in tracker.getJobIdsForGroup(group):
                    info = tracker.getJobInfo(job_id)
                    if info is not None:
                        stages.extend(
                            s for s in (tracker.getStageInfo(i) for i in info.stageIds) if s is not None
                        )
                if not stages:
                    continue
                stages.sort(key=lambda s: s.stageId)
                parse = stages[0]
                if parse.numCompletedTasks < parse.numTasks or parse.numTasks != n:
                    done = total * parse.numCompletedTasks // max(1, parse.numTasks)
                    report(CompactionProgress("phase-one", done, total))
                else:
                    last = stages[-1]
                    done = total * last.numCompletedTasks // max(1, last.numTasks)
                    report(CompactionProgress("phase-two", done, total))
            except Exception:  # progress is best effort; never fail a run over it
                continue


def local_parallelism(spark_conf: Mapping[str, str]) -> Optional[int]:
    """The default parallelism a local session of ``spark_conf`` would have (its
    ``spark.default.parallelism``, else the N of ``local[N]``, the cores of ``local[*]``), or None
    for another master."""
    from .session import session_conf

    conf = session_conf(spark_conf)
    explicit = conf.get("spark.default.parallelism")
    if explicit and explicit.isdigit() and int(explicit) > 0:
        return int(explicit)
    master = conf.get("spark.master", "")
    if master == "local":
        return 1
    if master.startswith("local[") and master.endswith("]"):
        inner = master[6:-1].split(",")[0]
        if inner == "*":
            return os.cpu_count() or 1
        if inner.isdigit() and int(inner) > 0:
            return int(inner)
    return None


class SparkCompactionService(LedgerCompactionService):
    """``TopicCompactionService`` of one topic, compacting on Spark."""

    def __init__(
        self,
        storage,
        topic: str,
        config,
        *,
        spark_conf: Optional[Mapping[str, str]] = None,
        abort_hook=None,
        task_probe=None,
    ):
        super().__init__(storage, topic, config, abort_hook=abort_hook, task_probe=task_probe)
        self.spark_conf = dict(spark_conf if spark_conf is not None else getattr(config, "spark", {}) or {})

    def engine(self) -> SparkEngine:
        small = int_setting(self.config, "compactionInProcessMaxBytes")
        fused = int_setting(self.config, "compactionSparkFusedMaxBytes")
        return SparkEngine(self.spark_conf, in_process_max_bytes=small, fused_max_bytes=fused)


class SparkCompactionServiceFactory(CompactionServiceFactory):
    """The default factory (``compactionServiceFactoryClassName``)."""

    def initialize(self, storage, config) -> None:
        super().initialize(storage, config)
        self.spark_conf = dict(getattr(config, "spark", {}) or {})
        self.joint_jobs = 0  # Spark jobs run by compact_together (one per call, normally)

    def new_service(self, topic: str) -> SparkCompactionService:
        return SparkCompactionService(self.storage, topic, self.config, spark_conf=self.spark_conf)

    def warm_up(self) -> bool:
        """Start the session and warm it with a scratch run in the background (``warmup``)."""
        from .warmup import WARMUP

        WARMUP.start(self.spark_conf)
        return True

    def warmup_state(self) -> Optional[dict]:
        from .warmup import WARMUP

        return WARMUP.state()

    def compact_together(self, services, progress=None) -> list:
        """All the topics in ONE Spark job (``spark.multi``); each still commits on its own."""
        from .multi import JointRun, compact_together

        services = list(services)
        reports = list(progress) if progress is not None else [None] * len(services)
        mine = [i for i, s in enumerate(services) if isinstance(s, SparkCompactionService)]
        ours = set(mine)  # once: a joint job of 1,000 topics would build it a million times
        others = [i for i in range(len(services)) if i not in ours]
        outcomes: list = [None] * len(services)
        if others:  # not ours to share a job with: one after another
            done = super().compact_together([services[i] for i in others], [reports[i] for i in others])
            for i, outcome in zip(others, done):
                outcomes[i] = outcome
        if mine:
            small = int_setting(self.config, "compactionInProcessMaxBytes")
            conf = getattr(services[mine[0]], "spark_conf", self.spark_conf)
            engine = SparkEngine(conf, in_process_max_bytes=small)
            joint = JointRun(engine, len(mine))
            done = compact_together(joint, [services[i] for i in mine], [reports[i] for i in mine])
            for i, outcome in zip(mine, done):
                outcomes[i] = outcome
            self.joint_jobs += joint.jobs
        return outcomes


__all__ = ["SparkCompactionService", "SparkCompactionServiceFactory", "SparkEngine", "get_session"]
