"""One compaction run from start to commit (``CompactionRunner``).

A run moves through four stages, planned -> written -> committed -> cleaned; ``run_stages``
writes them down with what a failure at each leaves to undo, and refuses any other order. The
topic's status in the metadata store goes NOT_RUN/SUCCESS/ERROR -> RUNNING -> SUCCESS or ERROR
(``state``), and NOT_RUN -> RUNNING -> SUCCESS for an empty topic never compacted.

The runner does everything that is not the two phases: the per-topic lock, orphan cleanup, the
plan (and whether the run extends the view's chain of segments or writes it fresh, ``chain``;
what it needs of the previous view comes from its manifest, ``previous_view``), the chain
manifest naming the segments the tasks wrote (``chain_manifest``), the key sidecar beside it (``view_keys``), the
one-transaction commit and the clean-up after it (the previous manifest and the segments the
new one does not name). The phases come from an *engine* (``SparkEngine`` by default) with one
method, ``run(plan, strategy, progress) -> list of part descriptions``. ``service`` wraps a
runner per run and serves the view it commits.

Abort hook: ``abort_hook(point)`` is called at each named point (``ABORT_POINTS``); tests make it
raise or kill the process to show that every point leaves the old view or the new one. A chain
run writes only new files (segments named by its own run id, its manifest, its sidecar) before
the commit, and deletes files of the previous view only after it, so a view in force never
names a missing file.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from typing import Any, Callable, NoReturn, Optional

from ..config import float_setting, int_setting
from ..errors import CompactionError, CompactMQError
from . import (
    CompactionProgress,
    CompactionResult,
    ProgressCallback,
    RetentionFilter,
)
from .compacted_ledger import (
    remove_orphans,
    topic_dir,
)
from .lag import last_compactable
from .plan import RunPlan, build_groups, build_segments, packed_cut
from ..storage.managed_ledger import fsync_dir
from ..storage.position import EARLIEST, Position
from .topic_lock import TopicLock
from .run_stages import RunStage, RunStages
from .settings import topic_settings
from .state import CompactionState, CompactionStates, advance_hold, states_of
from ..storage.resources.fence import NO_FENCE, Fenced
from .tiered import compacted_location
from .strategies import allowed_strategy_classes, resolve_strategy
from . import chain, chain_manifest, object_chain, previous_view, view_keys, view_store

__all__ = ["ABORT_POINTS", "CompactionRunner", "topic_settings"]  # topic_settings: for older callers

log = logging.getLogger(__name__)

ABORT_POINTS = ("start", "planned", "phase-one-two", "parts-written", "before-commit", "after-commit")


@dataclass
class _Run:
    """One run's working state, from its RUNNING mark on: what the failure path must undo and
    what the result reports."""

    t0: float
    report: ProgressCallback
    views: view_store.ViewStore  # where the new view goes
    running: CompactionState  # the run's RUNNING state: the commit expects its version
    fence: Any  # the ownership the run started under: its commit holds only while that one does
    stages: RunStages = field(default_factory=RunStages)
    new_id: Optional[int] = None
    plan: Optional[RunPlan] = None
    held: bool = False  # the managed ledger's retention hold for compaction is taken
    parts: list = field(default_factory=list)
    written: int = 0  # entries of the new view
    kept: int = 0  # messages of the new view
    read: int = 0  # messages the engine read
    duration_ms: int = 0
    removed: int = 0
    previous: Optional[int] = None  # the view the commit replaced
    strategy: Any = None  # the resolved strategy (``strategies``)
    size: int = 0  # stored bytes of the new view
    sidecar: Optional[dict] = None  # what the commit records of the new view's key sidecar


class CompactionRunner:
    def __init__(
        self,
        storage,
        topic: str,
        config,
        engine,
        *,
        abort_hook: Optional[Callable[[str], None]] = None,
        clock: Callable[[], float] = time.time,
        task_probe: Optional[Callable[[str], None]] = None,
        combine: bool = True,
    ):
        from ..naming import canonical

        self.storage = storage
        self.topic = canonical(topic)
        self.config = config
        self.engine = engine
        self.abort_hook = abort_hook or (lambda point: None)
        self.clock = clock
        self.task_probe = task_probe  # handed to the tasks with the plan (``RunPlan.task_probe``)
        self.combine = combine
        self._prev_reader: Optional[previous_view.PreviousView] = None  # the view in force, once planned
        self._prev_view_id: Optional[int] = None  # its id
        self._prev_start = 0  # its first entry retention keeps
        self._prev_sidecar: tuple = ("", [], [])  # its local sidecar: directory, files, gone files
        self._steps: dict = {}  # wall seconds of each step of this run (``_step``)
        self._mark = 0.0

    def _step(self, name: str) -> None:
        """Close step ``name``: the wall time since the previous step ended (or the run began) is
        recorded in the run's ``phaseSeconds`` (topic stats' ``lastCompactionPhaseTimesInMillis``),
        so an operator sees where a run's time went."""
        now = time.perf_counter()
        self._steps[name] = round(self._steps.get(name, 0.0) + now - self._mark, 4)
        self._mark = now

    @property
    def data_dir(self) -> str:
        return str(self.storage.data_dir)

    def _engine_split(self) -> Optional[Callable[[], Optional[dict]]]:
        """The engine's own split of the ``spark`` step (``spark.timeline``: seconds of the
        driver, of the jobs, and the rest, plus the jobs' count), as a function to call when
        someone looks (it asks Spark), or None when the engine reports none."""
        timings = self.engine.last_stats.get("timings")
        total = self._steps.get("spark")
        if timings is None or total is None:
            return None

        def split() -> Optional[dict]:
            found = timings() if callable(timings) else timings
            if not found:
                return None
            out = {k: float(v) for k, v in found.items()}
            # the engine measured inside the step: what it did not see is the driver's too
            rest = total - sum(v for k, v in out.items() if k != "count")
            out["driver"] = round(out.get("driver", 0.0) + max(0.0, rest), 4)
            return out

        return split

    # --- the run: planned -> written -> committed -> cleaned (``run_stages``) ----------------------

    def run(self, progress: Optional[ProgressCallback] = None) -> CompactionResult:
        report = progress or (lambda p: None)
        t0 = self.clock()
        self._steps, self._mark = {}, time.perf_counter()
        lock = TopicLock(topic_dir(self.data_dir, self.topic))
        views = view_store.for_run(self.storage, self.topic)  # where the new view goes
        try:
            states = self.states
            state = states.get(self.topic)
            settings = topic_settings(self.storage, self.topic, self.config)
            if state.compacted_ledger_id is None and self._nothing_compactable(settings):
                return self._record_empty(state, t0)
            # files of a crashed run (or a previous ledger whose deletion was cut short); the
            # objects of one that died between its upload and its commit: ``views.prepare``
            remove_orphans(self.data_dir, self.topic, keep=state.compacted_ledger_id)
            fence = self.storage.fence_for(self.topic) if hasattr(self.storage, "fence_for") else NO_FENCE
            running = states.mark_running(self.topic, expected_version=state.version)
            run = _Run(t0, report, views, running, fence)
            try:
                self._plan_run(run, state, settings)
                self._write(run)
                self._commit(run)
            except BaseException as e:
                self._abandon(run, e)  # raises
            self._clean(run)
            return self._result(run)
        finally:
            lock.release()

    def _record_empty(self, state, t0: float) -> CompactionResult:
        """Nothing to compact on a topic never compacted: NOT_RUN -> RUNNING -> SUCCESS, so the
        operator who triggered it sees that it ran (``state``)."""
        running = self.states.mark_running(self.topic, expected_version=state.version)
        duration = int((self.clock() - t0) * 1000)
        self.states.record_empty(self.topic, running.version, duration_ms=duration)
        return CompactionResult(self.topic, None, None, 0, 0, 0, 0, 0, duration)

    def _plan_run(self, run: _Run, state, settings) -> None:
        """-> PLANNED: the strategy, a new view id, the retention hold, the plan, the view's place."""
        self.abort_hook("start")
        # a policy names only a built-in or a class the operator allowed (docs/security.md)
        strategy = resolve_strategy(settings["strategy"], allowed_strategy_classes(self.config))
        run.strategy = strategy
        run.new_id = new_id = self.storage.resources.ledger_ids.allocate()  # one id space with ledgers
        self._step("start")
        # retention keeps what the run reads until the commit moves the cursor past it
        run.held = self._managed_ledger().hold_for_compaction()
        run.plan = plan = self._plan(state, settings, strategy, new_id)
        run.views.prepare(self, plan, new_id)
        self._step("plan")
        run.stages.advance(RunStage.PLANNED)
        run.report(CompactionProgress("start", 0, plan.estimated_entries))
        self.abort_hook("planned")

    def _write(self, run: _Run) -> None:
        """-> WRITTEN: the engine's two phases, then the view's manifest and key sidecar, under
        names no committed view uses, published for readers to find once committed."""
        plan, new_id = run.plan, run.new_id
        assert plan is not None and new_id is not None
        run.parts = parts = self.engine.run(plan, run.strategy, run.report)
        self._step("spark")
        self.abort_hook("parts-written")
        run.report(CompactionProgress("commit", plan.estimated_entries, plan.estimated_entries))
        run.written, run.size = run.views.write_view(self, plan, parts, new_id)
        run.sidecar = self._place_view_keys(plan, parts, new_id, run.views)
        self._step("build")
        run.kept = sum(p["messages"] for p in parts)
        run.read = int(self.engine.last_stats.get("messages_read", 0))
        run.stages.advance(RunStage.WRITTEN)
        self.abort_hook("before-commit")
        run.views.publish()

    def _commit(self, run: _Run) -> None:
        """-> COMMITTED: ONE compare-and-set, the view pointer and its horizon together, if the
        state is still the one this run marked RUNNING (else StaleCompaction: nothing written)."""
        plan = run.plan
        assert plan is not None and run.new_id is not None
        # every live key has one survivor, and so has every retained keyless message and every
        # tombstone that tombstone retention keeps (a deleted key, not counted)
        tombstones = sum(int(p.get("tombstones", 0)) for p in run.parts)
        keys = max(0, run.kept - int(self.engine.last_stats.get("keyless_kept", 0)) - tombstones)
        run.duration_ms = duration = int((self.clock() - run.t0) * 1000)
        run.removed = max(0, run.read - run.kept)
        details = {
            "keys": keys,
            "tombstones": tombstones,
            "entries": run.written,
            "bytes": run.size,
            "messagesRead": run.read,
            "messagesKept": run.kept,
            "durationMs": duration,
            "phaseSeconds": dict(self._steps),
            "job": self.engine.last_stats.get("job_group"),
        }
        if run.sidecar is not None:
            details[view_keys.DETAILS_KEY] = run.sidecar
        run.previous, _ = self.states.commit(
            self.topic,
            run.new_id,
            plan.new_horizon,
            expected_version=run.running.version,
            stats={"duration_ms": duration, "removed_event_count": run.removed},
            details=details,
            fence=run.fence,
        )
        run.stages.advance(RunStage.COMMITTED)
        self._step("commit")

    def _abandon(self, run: _Run, e: BaseException) -> NoReturn:
        """The run failed before its commit took: undo what it wrote (unless the store says the
        commit did take), record the failure while the state is still this run's, and raise."""
        plan, new_id = run.plan, run.new_id
        committed = run.stages.committed or self._committed(new_id if plan is not None else None)
        if run.held and not committed:
            self._release_hold()
        if not committed:
            run.views.discard(plan, new_id if plan is not None and new_id is not None else -1)
        if plan is not None:
            shutil.rmtree(plan.run_dir, ignore_errors=True)
        message = f"{type(e).__name__}: {e}"
        # only while the state is still this run's (a stale run records nothing), and never by a
        # deposed owner (Fenced: the new owner records the interrupted run)
        if not isinstance(e, Fenced):
            try:
                self.states.record_failure(
                    self.topic,
                    message,
                    expected_version=run.running.version,
                    duration_ms=int((self.clock() - run.t0) * 1000),
                )
            except Exception:
                pass
        if isinstance(e, CompactMQError) or not isinstance(e, Exception):
            raise e
        raise CompactionError(f"compaction of {self.topic} failed: {message}") from e

    def _clean(self, run: _Run) -> None:
        """-> CLEANED: the new view is in force; what follows is clean-up an orphan sweep redoes."""
        plan = run.plan
        assert plan is not None and run.new_id is not None
        advance_hold(self.storage, self.topic, plan.new_horizon)
        self.abort_hook("after-commit")
        shutil.rmtree(plan.run_dir, ignore_errors=True)
        if run.previous is not None and run.previous != run.new_id:
            run.views.retire(run.previous, run.new_id)
        self._step("cleanup")
        run.stages.advance(RunStage.CLEANED)
        run.report(CompactionProgress("done", plan.estimated_entries, plan.estimated_entries))

    def _result(self, run: _Run) -> CompactionResult:
        plan = run.plan
        assert plan is not None and run.new_id is not None
        return CompactionResult(
            topic=self.topic,
            compacted_ledger_id=run.new_id,
            horizon=plan.new_horizon,
            entries_read=plan.estimated_entries,
            messages_read=run.read,
            entries_written=run.written,
            messages_kept=run.kept,
            removed_event_count=run.removed,
            duration_ms=run.duration_ms,
            previous_ledger_id=run.previous,
            step_seconds=self._steps,
            job=self.engine.last_stats.get("job_group"),
            engine_seconds=self._engine_split(),
        )

    # --- the chain of segments (chain) -------------------------------------------------------------

    def _extends_chain(self, plan: RunPlan) -> bool:
        """Whether this run extends the previous view's chain (an incremental run that copies only
        what changed) rather than writing a fresh one: the previous view is a local chain, its
        key sidecar is usable, and the merge policy does not ask for a rewrite."""
        prev = self._prev_reader
        if prev is None or not prev.is_chain or plan.view_keys is None or plan.strategy == "user":
            return False
        max_runs = int_setting(self.config, "compactionChainMaxRuns")
        max_stale = float_setting(self.config, "compactionChainMaxStaleRatio")
        return not chain.should_merge(prev.manifest, len(prev), max_runs, max_stale)

    def _chain_manifest(self, plan: RunPlan, parts: list[dict]):
        """The new view's manifest and its entry count (``chain_manifest.build``)."""
        return chain_manifest.build(plan, parts, self._prev_reader, self._prev_start)

    # --- the key sidecar of the view (view_keys) -------------------------------------------------

    @property
    def _topic_dir(self) -> str:
        return topic_dir(self.data_dir, self.topic)

    def _place_view_keys(self, plan: RunPlan, parts: list[dict], new_id: int, views) -> Optional[dict]:
        """Put the sidecar the phase-two tasks wrote in place beside the new view (before the
        commit) and return what the commit records of it; None when the run wrote none (a user
        strategy) or not for every part."""
        extend = getattr(views, "extend_keys", None)  # a chain in the object store
        if plan.is_lookup_run:
            if extend is not None:
                return extend(plan, parts, new_id, self._prev_sidecar)
            return self._extend_view_keys(plan, parts, new_id)
        # every part with survivors has sidecar rows, whether or not it wrote entries (an
        # incremental chain run's group of unchanged old entries writes none)
        names = [p.get("keys") for p in parts if p["messages"]]
        if not all(names):
            return None
        views.place_keys(plan, parts, new_id)
        names = getattr(views, "key_names", None) or names  # (an object chain's, relative to it)
        return {"files": names, "et": plan.strategy == "event-time"}

    def _extend_view_keys(self, plan: RunPlan, parts: list[dict], new_id: int) -> dict:
        """A lookup run's sidecar (``view_keys``, Chained sidecars): the previous view's files,
        hard-linked beside the new view, plus the new rows and retired rows this run wrote."""
        prev_dir, prev_files, prev_gone = self._prev_sidecar
        written = [p["keys"] for p in parts if p.get("keys")]
        wrote = os.path.isdir(os.path.join(plan.run_dir, view_keys.STORE_DIR))
        dst = view_keys.place_run_dir(plan.run_dir, self._topic_dir, new_id, move=wrote)
        for name in [*prev_files, *prev_gone]:
            src_file, dst_file = os.path.join(prev_dir, name), os.path.join(dst, name)
            try:
                os.link(src_file, dst_file)
            except OSError:  # a file system without hard links: copy (the files are small)
                shutil.copyfile(src_file, dst_file)
        fsync_dir(dst)
        fsync_dir(self._topic_dir)
        files = prev_files + [n for n in written if not n.startswith("gone-")]
        gone = prev_gone + [n for n in written if n.startswith("gone-")]
        return {"files": files, "gone": gone, "et": False}

    def _previous_view_keys(self, state, strategy_name: str) -> Optional[dict]:
        """The plan's ``view_keys`` entry for the view in force, when it has a usable sidecar."""
        view_id = state.compacted_ledger_id
        details_of, details = state.details_of, state.details
        info = details.get(view_keys.DETAILS_KEY) if details_of == view_id else None
        if not isinstance(info, dict) or (strategy_name == "event-time" and not info.get("et")):
            return None
        names = list(info.get("files") or [])
        gone = list(info.get("gone") or [])
        local = view_keys.local_dir(self._topic_dir, view_id)
        if os.path.isdir(local):
            self._prev_sidecar = (local, names, gone)
            return view_keys.plan_entry(
                [os.path.join(local, n) for n in names], gone=[os.path.join(local, n) for n in gone]
            )
        offloader = getattr(self.storage, "offloader", None)
        rec = offloader.compacted_record(view_id) if offloader is not None else None
        if object_chain.is_chain_record(rec):  # a chain in the object store: names relative to it
            self._prev_sidecar = (object_chain.chain_prefix(rec), names, gone)
            return view_keys.plan_entry(
                object_chain.sidecar_keys(rec, names), rec.location, object_chain.sidecar_keys(rec, gone)
            )
        if rec is not None and rec.index_key.endswith("/"):  # written to the store with its parts
            base = rec.index_key.rstrip("/")
            return view_keys.plan_entry(
                [f"{base}/{view_keys.STORE_DIR}/{n}" for n in names],
                rec.location,
                [f"{base}/{view_keys.STORE_DIR}/{n}" for n in gone],
            )
        return None  # (e.g. an old view, or its local sidecar is gone): parse the view instead

    def _committed(self, new_id) -> bool:
        """Whether the metadata store names ``new_id`` (a failure after the commit, e.g. in a
        listener, must not delete the ledger in force)."""
        if new_id is None:
            return False
        try:
            return self.states.get(self.topic).compacted_ledger_id == new_id
        except Exception:
            return True  # cannot tell: leave the files to the orphan sweeps

    @property
    def states(self) -> CompactionStates:
        return states_of(self.storage)

    def _release_hold(self) -> None:
        try:
            self._managed_ledger().release_compaction_hold()
        except CompactMQError:  # the topic is gone, or the store is: nothing left to hold
            pass

    def _managed_ledger(self):
        ml = self.storage.open_managed_ledger(self.topic, create=False)
        refresh = getattr(ml, "refresh", None)
        if refresh:
            refresh()
        return ml

    def _nothing_compactable(self, settings) -> bool:
        """An empty topic, or one whose every message is younger than the minimum lag."""
        return self._last_compactable(self._managed_ledger(), settings) is None

    def _last_compactable(self, ml, settings):
        """The new horizon's candidate: the last sealed entry (``_last_sealed``), or with a minimum
        lag the last one older than it (``lag.last_compactable``; the clock is the runner's, so
        tests pass their own)."""
        sealed = self._last_sealed(ml)
        if sealed is None:
            return None
        young = last_compactable(ml, settings["min_lag_seconds"], int(self.clock() * 1000))
        return None if young is None else min(Position(*sealed), Position(*young))

    def _last_sealed(self, ml):
        """The last position of the topic's sealed ledgers: what a run may read. The broker's own
        storage seals the current ledger first (a rollover); a read-only ``compact-topic`` job had
        it sealed before it started (``storage.seal``), and whatever was appended since lies in
        the ledger being written, which waits for the next run.

        Either way the answer is read from the SEALED ledgers, never ``last_position``: a
        rollover that found the current ledger empty seals nothing, and entries appended right
        after land in the ledger being written -- a plan reaching into it handed a Spark task
        that ledger's key prefix in cluster mode (no single object while it is written), which
        failed the joint run of every topic in it on FileNotFoundError (the chaos test)."""
        if not getattr(self.storage, "read_only", True):
            ml.rollover()
        from ..storage.position import LEDGER_CLOSED

        for info in reversed(ml.ledgers()):
            if getattr(info, "state", LEDGER_CLOSED) == LEDGER_CLOSED and info.entry_count > 0:
                return Position(info.ledger_id, info.entry_count - 1)
        return None

    def _plan(self, state, settings, strategy, new_id: int) -> RunPlan:
        ml = self._managed_ledger()
        self._step("start")
        last = self._last_compactable(ml, settings)  # sealed ledgers only; stops before too young entries
        self._step("seal")
        prev_h = state.horizon
        self._prev_view_id = state.compacted_ledger_id
        new_horizon = last if (prev_h is None or (last is not None and last > prev_h)) else prev_h
        live = self._live_ledgers(ml, last, prev_h) if last is not None else []
        compacted = None
        if state.compacted_ledger_id is not None:
            compacted = self._compacted_ledgers(state, settings, ml.first_position(), new_horizon)
        segments = build_segments(compacted, live)
        drop_before, tombstones_from = self._time_cuts(ml, settings, strategy, segments)
        parallelism = max(1, int(getattr(self.engine, "parallelism", 2)))
        groups = build_groups(segments, parallelism)
        run_dir = os.path.join(topic_dir(self.data_dir, self.topic), f"run-{new_id}")
        os.makedirs(run_dir, exist_ok=True)
        native = getattr(strategy, "native", None)
        sidecar = None if compacted is None else self._previous_view_keys(state, native or "user")
        return RunPlan(
            topic=self.topic,
            segments=segments,
            groups=groups,
            run_dir=run_dir,
            strategy=native or "user",
            retain_null_key=settings["retain_null_key"],
            combine=native == "keep-latest" and self.combine,
            new_horizon=Position(*new_horizon),
            estimated_entries=sum(s.est_entries for s in segments),
            task_probe=self.task_probe,
            drop_before=drop_before,
            tombstones_from=tombstones_from,
            view_keys=sidecar,
        )

    def _live_ledgers(self, ml, last, prev_h) -> list[dict]:
        """The live part of the plan (``plan.build_segments``): each ledger's entries after the
        previous horizon ``prev_h`` up to the new one ``last``."""
        from ..storage.ledger_file import index_path_for

        live = []
        for info in ml.ledgers():
            lid = info.ledger_id
            if lid > last[0] or (prev_h is not None and lid < prev_h[0]):
                continue
            lo = prev_h[1] + 1 if prev_h is not None and lid == prev_h[0] else 0
            hi = last[1] if lid == last[0] else max(info.entry_count - 1, 0)
            if lid != last[0] and info.entry_count == 0:
                continue
            if lo > hi:
                continue
            # an offloaded ledger is read from the object store (a URI), wherever the task runs
            path = ml.ledger_url(lid) if hasattr(ml, "ledger_url") else ml.ledger_path(lid)
            live.append(
                {
                    "ledger_id": lid,
                    "path": path,
                    "index_path": None if "://" in path else index_path_for(path),
                    "lo": lo,
                    "hi": hi if lid == last[0] else (1 << 40),
                    "count": hi - lo + 1,
                }
            )
        return live

    def _compacted_ledgers(self, state, settings, first, new_horizon) -> dict:
        """The compacted part of the plan (``plan.build_segments``): the view in force, per
        ledger, less what topic retention removed (``first``: the topic's first position)."""
        path = compacted_location(self.storage, self.topic, state.compacted_ledger_id)
        reader = previous_view.PreviousView(path)  # its manifest alone, when that answers
        self._prev_reader = reader  # an incremental chained run drops entries of it
        start = 0
        bound = None
        keep = RetentionFilter(settings["retention_mode"], first)
        if keep.bounded:
            # a message retention removed from the topic leaves the compacted view too (what
            # readers already skip through the same filter); nothing visible: drop them all
            bound = keep.start(EARLIEST) or new_horizon_next(new_horizon)
            start = reader.find(bound)
        self._prev_start = start
        lids, counts = reader.ledger_runs(start)  # one lookup per ledger, not per entry
        los = {int(l): 0 for l in lids}
        if bound is not None and int(bound[0]) in los:
            los[int(bound[0])] = int(bound[1])
        return {"path": path, "ledgers": {int(l): (int(c), los[int(l)]) for l, c in zip(lids, counts)}}

    def _time_cuts(self, ml, settings, strategy, segments) -> tuple[int, Optional[int]]:
        """Packed positions for the key TTL and the tombstone retention (``RunPlan``): a message
        published before ``now - seconds`` (by the entry index's publish times, as ``lag`` reads
        them) is below the cut. A compacted entry whose ledger retention deleted counts as older
        than every retained one."""
        ttl, keep_tombs = settings["key_ttl_seconds"], settings["tombstone_retention_seconds"]
        if (ttl > 0 or keep_tombs > 0) and getattr(strategy, "native", None) != "keep-latest":
            raise CompactionError(
                "compactedViewKeyTtlSeconds and compactionTombstoneRetentionSeconds work with "
                "the keep-latest strategy only"
            )
        now_ms = int(self.clock() * 1000)

        def cut(seconds: int) -> int:
            return packed_cut(segments, ml.find_position_by_publish_time(now_ms - seconds * 1000))

        return (cut(ttl) if ttl > 0 else 0), (cut(keep_tombs) if keep_tombs > 0 else None)


def new_horizon_next(pos):
    """A position just after ``pos`` (everything at or before it is gone)."""
    return (pos[0], pos[1] + 1)
