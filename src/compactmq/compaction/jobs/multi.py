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

Keeping the partitions apart in one job
---------------------------------------
* **Positions.** The plans' segments are renumbered into one list: plan ``i``'s ordinals are
  offset by the segments of the plans before it, so a packed position names one message of one
  partition and positions of different partitions never meet (``JointPlan.offsets``).
* **Keys.** Phase one groups by the 128-bit key hash; the same key in two partitions must not
  merge. Each parsing task XORs ``h1`` of a keyed row with a salt of its plan (``_salt``), so
  the two hashes of one key in different partitions differ, and two different keys meet only
  with the probability of any 128-bit collision. A retained keyless row keeps its rule: its
  (now joint) position stands in for the hash.
* **Per-partition cuts.** The key TTL and the tombstone retention (``RunPlan.drop_before``,
  ``tombstones_from``) are packed positions of each plan; the joint keep-latest applies each
  plan's own cuts to the keys of its range of positions.
* Phase one parses and phase two copies each group with its own plan (``tasks.group_rows``,
  ``tasks.copy_group``), so per-partition settings (keyless messages, task probes, the object
  store prefix of the new ledger, and whether the run extends the partition's chain of segments
  or writes it fresh, ``compaction.chain``) stay per partition: each partition's view is a chain
  of its own, extended by the joint job exactly as by a run of its own. Plans that cannot share an aggregation
  (another strategy by topic policy) run as a second job of the same joint run.

Plans small enough for the in-process engine (``inprocess``, ``compactionInProcessMaxBytes``)
are run by it first, one after another in the leading thread, each failing on its own; the
Spark job takes the rest. Cancelling one member cancels the joint job (all its partitions fail
and keep their views).
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Callable, Optional, Sequence

import numpy as np

from ... import errors
from .. import CompactionProgress, ProgressCallback
from .. import entry_scan as es
from .. import message_rows as mr
from .. import tasks
from ..plan import RunPlan

_POS_SHIFT = es.ENTRY_BITS + es.BATCH_BITS
# larger than any packed position, so "tombstones from here" keeps none
_NEVER = 1 << (es.ORDINAL_BITS + _POS_SHIFT)


def _salt(index: int) -> int:
    """A 64-bit salt per plan (0 for the first): Weyl sequence of the golden ratio, signed."""
    value = (index * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    return value - (1 << 64) if value >= 1 << 63 else value


@dataclasses.dataclass
class JointPlan:
    """The plans of one job, side by side. ``plan`` is a ``RunPlan`` over all their segments
    (renumbered) and groups (global numbers): what the shared pipeline functions, the user
    strategy's message loader and the progress poller read."""

    plans: list[RunPlan]
    offsets: list[int]  # ordinal offset of each plan's segments
    owners: list[tuple[int, int]]  # global group -> (plan index, the plan's own group number)
    plan: RunPlan

    @staticmethod
    def of(plans: Sequence[RunPlan]) -> "JointPlan":
        if not plans:
            raise ValueError("a joint plan needs at least one plan")
        segments, groups, offsets, owners = [], [], [], []
        for i, p in enumerate(plans):
            offset = len(segments)
            offsets.append(offset)
            segments.extend(dataclasses.replace(s, ordinal=s.ordinal + offset) for s in p.segments)
            for g, ords in enumerate(p.groups):
                groups.append([o + offset for o in ords])
                owners.append((i, g))
        if len(segments) > es.MAX_ORDINAL + 1:
            raise errors.CompactionError(
                f"{len(segments)} ledger segments are too many for one compaction job"
            )
        first = plans[0]
        joint = RunPlan(
            topic=", ".join(p.topic for p in plans),
            segments=segments,
            groups=groups,
            run_dir="",
            strategy=first.strategy,
            strategy_class=first.strategy_class,
            estimated_entries=sum(p.estimated_entries for p in plans),
        )
        return JointPlan(list(plans), offsets, owners, joint)

    def base(self, i: int) -> int:
        """The smallest joint packed position of plan ``i``."""
        return self.offsets[i] << _POS_SHIFT

    def end(self, i: int) -> int:
        """One past the largest joint packed position of plan ``i``."""
        return (self.offsets[i] + len(self.plans[i].segments)) << _POS_SHIFT


def relabel(rows: mr.Rows, index: int, offset: int) -> mr.Rows:
    """Rows of plan ``index`` in the joint job: positions offset, key hashes salted."""
    pos = rows.pos + np.int64(offset << _POS_SHIFT) if offset else rows.pos
    keyless = (rows.flags & es.FLAG_KEYLESS) != 0
    h1 = np.where(keyless, pos, rows.h1 ^ np.int64(_salt(index)))
    return mr.Rows(h1, rows.h2, pos, rows.flags, rows.event_time)


def unsalt(h1: np.ndarray, h2: np.ndarray, local_pos: np.ndarray, index: int) -> np.ndarray:
    """``relabel`` undone on survivors, for the view's key sidecar: a keyed row's own hash, a
    retained keyless row's own (plan-local) position."""
    keyless = np.asarray(h2, np.int64) == es.KEYLESS_MARK
    return np.where(keyless, local_pos, np.asarray(h1, np.int64) ^ np.int64(_salt(index)))


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


def packed_routes(keys: list[int], n: int) -> list[int]:
    """The partition key of each of ``n`` groups when ``len(keys)`` tasks take them in
    contiguous runs (as ``spark.range`` hands phase one its groups)."""
    count = max(1, len(keys))
    return [keys[g * count // n] for g in range(n)]


def read_rows(spark, joint: JointPlan, counters=None, keyless_counters=None, packed=False, n_tasks=None):
    """Phase-one rows of every group of every plan (``pipeline.read_rows`` for several plans,
    ``packed`` alike), in ``n_tasks`` tasks (default: one per group), each parsing a contiguous
    run of groups; ``counters[i]`` adds up plan ``i``'s messages parsed."""
    from . import pipeline

    plans, offsets, owners = joint.plans, joint.offsets, joint.owners
    with_et = joint.plan.strategy == "event-time"
    schema = pipeline.row_schema(with_et, packed)

    def parse(batches):
        for batch in batches:
            for g in batch.column(0).to_pylist():
                i, local = owners[g]
                stats: dict = {}
                for rows in tasks.group_rows(plans[i], local, stats):
                    yield tasks.rows_to_arrow(relabel(rows, i, offsets[i]), with_et, packed)
                if counters is not None:
                    counters[i].add(stats.get("messages", 0))
                if keyless_counters is not None:
                    keyless_counters[i].add(stats.get("keyless", 0))

    n = len(owners)
    return spark.range(0, n, 1, min(n, n_tasks or n)).mapInArrow(parse, schema)


def keep_latest(packed, joint: JointPlan):
    """keep-latest over the joint ``packed`` rows, each plan with its own key TTL and tombstone cuts."""
    from pyspark.sql import functions as F

    from . import pipeline

    plans = joint.plans
    if all(p.drop_before == 0 and p.tombstones_from is None for p in plans):
        return pipeline.keep_latest(packed)
    pos = F.shiftright("p2", 1)
    tomb = F.col("p2").bitwiseAND(F.lit(1)) == 1
    live = None
    for i, p in enumerate(plans):
        base = joint.base(i)
        keep_tomb = _NEVER if p.tombstones_from is None else p.tombstones_from + base
        drop_before = p.drop_before + base if p.drop_before else 0
        rule = (~tomb | (pos >= F.lit(int(keep_tomb)))) & (pos >= F.lit(int(drop_before)))
        live = (
            F.when(pos < F.lit(joint.end(i)), rule)
            if live is None
            else live.when(pos < F.lit(joint.end(i)), rule)
        )
    assert live is not None
    kept = any(p.tombstones_from is not None for p in plans)  # a tombstone may survive
    return (
        packed.groupBy("h1", "h2")
        .agg(F.max("p2").alias("p2"))
        .where(live.otherwise(False))
        .select(pos.alias("pos"), "h1", "h2", *pipeline.tomb_column(kept))
    )


def survivors(spark, joint: JointPlan, strategy, counters=None, keyless_counters=None, n_tasks=None):
    """Phase one of a joint job: the joint packed positions of the surviving messages."""
    from . import pipeline

    name = joint.plan.strategy
    if name == "keep-latest":
        return keep_latest(read_rows(spark, joint, counters, keyless_counters, True, n_tasks), joint)
    keyed = pipeline.with_key_hash(read_rows(spark, joint, counters, keyless_counters, n_tasks=n_tasks))
    if name == "keep-first":
        return pipeline.keep_first(keyed)
    if name == "event-time":
        return pipeline.event_time(keyed)
    return pipeline.user_strategy(keyed, joint.plan, strategy)


def copy_survivors(survivors_df, joint: JointPlan, n_tasks=None) -> list[list[dict]]:
    """Phase two of a joint job: one shuffle of the survivors to ``n_tasks`` tasks (default: one
    per group, of any plan; fewer take contiguous runs of groups); each task copies each of its
    groups with its plan, positions turned back into the plan's own. Returns the part
    descriptions of each plan, as ``pipeline.copy_survivors`` does for one."""
    from . import pipeline

    plans, offsets, owners = joint.plans, joint.offsets, joint.owners
    n = max(1, len(owners))
    table = joint.plan.group_of_ordinal()
    # both as SQL text, one round trip each: a job over many topics has many segments, and a
    # literal column per segment cost several round trips each
    group = pipeline.route_column(list(range(n)), table)
    parts_n = min(n, n_tasks or n)
    keys = packed_routes(pipeline.partition_keys(survivors_df.sparkSession, parts_n), n)
    route = pipeline.route_column(keys, table)

    key_cols = pipeline.key_columns(survivors_df)

    def copy(batches):
        import pyarrow as pa

        arrays = pipeline.gather_sorted(batches, ["grp", "pos", *key_cols])
        if arrays is None:
            return
        grp, pos = arrays["grp"], arrays["pos"]
        out = []
        for g in np.unique(grp).tolist():
            i, local = owners[g]
            m = grp == g
            mine = pos[m] - np.int64(offsets[i] << _POS_SHIFT)
            h1 = unsalt(arrays["h1"][m], arrays["h2"][m], mine, i) if "h1" in arrays else None
            part = pipeline.copy_part(plans[i], local, mine, arrays, m, key_cols, h1)
            out.append(dict(part, plan=i))
        yield pa.RecordBatch.from_pylist(out, schema=pipeline.part_schema(("plan", pa.int32())))

    rows = (
        survivors_df.select(group.alias("grp"), route.alias("route"), "pos", *key_cols)
        .repartition(parts_n, "route")
        .sortWithinPartitions("pos")
        .mapInArrow(copy, "plan int, " + pipeline.PART_DDL)
        .toArrow()  # as Arrow: see ``pipeline.collect_parts``
        .to_pylist()
    )
    parts: list[list[dict]] = [[] for _ in plans]
    for d in rows:
        parts[d.pop("plan")].append(d)
    return [sorted(p, key=lambda d: d["group"]) for p in parts]


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
            found = survivors(spark, joint, entries[0].strategy, job.counters, job.keyless, n_tasks)
            parts = copy_survivors(found, joint, n_tasks)
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
