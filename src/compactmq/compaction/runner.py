"""One compaction run from start to commit (``CompactionRunner``).

The runner does everything that is not the two phases: the per-topic lock, orphan cleanup, the
plan (and whether the run extends the view's chain of segments or writes it fresh, ``chain``;
what it needs of the previous view comes from its manifest, ``previous_view``), the chain
manifest naming the segments the tasks wrote, the key sidecar beside it (``view_keys``), the
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
from typing import Callable, Optional

import numpy as np

from ..config import parse_bool
from ..errors import CompactionError, CompactMQError
from . import (
    CompactionProgress,
    CompactionResult,
    ProgressCallback,
    RetentionFilter,
    retention_mode,
)
from .compacted_ledger import (
    remove_orphans,
    topic_dir,
)
from .lag import last_compactable, lag_seconds_setting
from .plan import COMPACTED, RunPlan, build_groups, build_segments, packed_cut
from ..storage.managed_ledger import fsync_dir
from ..storage.position import EARLIEST, Position
from .topic_lock import TopicLock
from .state import CompactionStates, advance_hold, states_of
from ..storage.resources.fence import NO_FENCE, Fenced
from .tiered import compacted_location
from .strategies import allowed_strategy_classes, resolve_strategy
from . import chain, previous_view, view_keys, view_store

log = logging.getLogger(__name__)

ABORT_POINTS = ("start", "planned", "phase-one-two", "parts-written", "before-commit", "after-commit")


def topic_settings(storage, topic: str, config) -> dict:
    """Strategy, retain-null-key, retention mode and minimum lag (seconds, see ``lag``) of a topic:
    its policy (or its namespace's), else the broker config."""
    from ..storage import (
        COMPACTED_VIEW_KEY_TTL,
        COMPACTION_MIN_LAG,
        COMPACTION_RETENTION_MODE,
        COMPACTION_STRATEGY,
        COMPACTION_TOMBSTONE_RETENTION,
        RETAIN_NULL_KEY,
    )

    meta = storage.policies
    mode = retention_mode(
        meta.effective_policy(topic, COMPACTION_RETENTION_MODE, config.get("topicCompactionRetentionMode"))
    )
    retain = meta.effective_policy(topic, RETAIN_NULL_KEY, config.get("topicCompactionRetainNullKey", False))
    return {
        "strategy": meta.effective_policy(topic, COMPACTION_STRATEGY, config.get("topicCompactionStrategy")),
        "retain_null_key": parse_bool(retain or False, default=False),
        "retention_mode": mode,
        "min_lag_seconds": lag_seconds_setting(
            meta, topic, COMPACTION_MIN_LAG, config.get("brokerServiceCompactionMinLagInSeconds", 0)
        ),
        "tombstone_retention_seconds": lag_seconds_setting(
            meta,
            topic,
            COMPACTION_TOMBSTONE_RETENTION,
            config.get("topicCompactionTombstoneRetentionSeconds", 0),
        ),
        "key_ttl_seconds": lag_seconds_setting(
            meta, topic, COMPACTED_VIEW_KEY_TTL, config.get("topicCompactedViewKeyTtlSeconds", 0)
        ),
    }


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
        fault_points: tuple = (),
        combine: bool = True,
    ):
        from ..naming import canonical

        self.storage = storage
        self.topic = canonical(topic)
        self.config = config
        self.engine = engine
        self.abort_hook = abort_hook or (lambda point: None)
        self.clock = clock
        self.fault_points = fault_points
        self.combine = combine
        self._prev_reader: Optional[previous_view.PreviousView] = None  # the view in force, once planned
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

    def run(self, progress: Optional[ProgressCallback] = None) -> CompactionResult:
        report = progress or (lambda p: None)
        t0 = self.clock()
        self._steps, self._mark = {}, time.perf_counter()
        steps = self._steps
        step = self._step
        lock = TopicLock(topic_dir(self.data_dir, self.topic))
        states = self.states
        plan = None
        views = view_store.for_run(self.storage, self.topic)  # where the new view goes
        try:
            state = states.get(self.topic)
            settings = topic_settings(self.storage, self.topic, self.config)
            if state.compacted_ledger_id is None and self._nothing_compactable(settings):
                # NOT_RUN -> RUNNING -> SUCCESS: the operator who triggered it sees that it ran
                running = states.mark_running(self.topic, expected_version=state.version)
                duration = int((self.clock() - t0) * 1000)
                states.record_empty(self.topic, running.version, duration_ms=duration)
                return CompactionResult(self.topic, None, None, 0, 0, 0, 0, 0, duration)
            # files of a crashed run (or a previous ledger whose deletion was cut short); the
            # objects of one that died between its upload and its commit: ``views.prepare``
            remove_orphans(self.data_dir, self.topic, keep=state.compacted_ledger_id)
            # the ownership this run starts under: its commit holds only while that one does
            fence = self.storage.fence_for(self.topic) if hasattr(self.storage, "fence_for") else NO_FENCE
            running = states.mark_running(self.topic, expected_version=state.version)
            held = False
            self.abort_hook("start")
            try:
                # a policy names only a built-in or a class the operator allowed (docs/security.md)
                strategy = resolve_strategy(settings["strategy"], allowed_strategy_classes(self.config))
                new_id = self.storage.resources.ledger_ids.allocate()  # one id space with ledgers
                step("start")
                # retention keeps what the run reads until the commit moves the cursor past it
                held = self._managed_ledger().hold_for_compaction()
                plan = self._plan(state, settings, strategy, new_id)
                views.prepare(self, plan, new_id)
                step("plan")
                report(CompactionProgress("start", 0, plan.estimated_entries))
                self.abort_hook("planned")
                parts = self.engine.run(plan, strategy, report)
                step("spark")
                self.abort_hook("parts-written")
                report(CompactionProgress("commit", plan.estimated_entries, plan.estimated_entries))
                written, size = views.write_view(self, plan, parts, new_id)
                sidecar = self._place_view_keys(plan, parts, new_id, views)
                step("build")
                kept = sum(p["messages"] for p in parts)
                read = int(self.engine.last_stats.get("messages_read", 0))
                # every live key has one survivor, and so has every retained keyless message and
                # every tombstone that tombstone retention keeps (a deleted key, not counted)
                tombstones = sum(int(p.get("tombstones", 0)) for p in parts)
                keys = max(0, kept - int(self.engine.last_stats.get("keyless_kept", 0)) - tombstones)
                duration = int((self.clock() - t0) * 1000)
                stats = {"duration_ms": duration, "removed_event_count": max(0, read - kept)}
                details = {
                    "keys": keys,
                    "tombstones": tombstones,
                    "entries": written,
                    "bytes": size,
                    "messagesRead": read,
                    "messagesKept": kept,
                    "durationMs": duration,
                    "phaseSeconds": dict(steps),
                    "job": self.engine.last_stats.get("job_group"),
                }
                if sidecar is not None:
                    details[view_keys.DETAILS_KEY] = sidecar
                self.abort_hook("before-commit")
                views.publish()
                # ONE compare-and-set: the view pointer and its horizon together, if the state is
                # still the one this run marked RUNNING (else StaleCompaction: nothing written)
                previous, _ = states.commit(
                    self.topic,
                    new_id,
                    plan.new_horizon,
                    expected_version=running.version,
                    stats=stats,
                    details=details,
                    fence=fence,
                )
                step("commit")
            except BaseException as e:
                committed = self._committed(new_id if plan is not None else None)
                if held and not committed:
                    self._release_hold()
                if not committed:
                    views.discard(plan, new_id if plan is not None else -1)
                if plan is not None:
                    shutil.rmtree(plan.run_dir, ignore_errors=True)
                message = f"{type(e).__name__}: {e}"
                # only while the state is still this run's (a stale run records nothing), and
                # never by a deposed owner (Fenced: the new owner records the interrupted run)
                if not isinstance(e, Fenced):
                    try:
                        states.record_failure(
                            self.topic,
                            message,
                            expected_version=running.version,
                            duration_ms=int((self.clock() - t0) * 1000),
                        )
                    except Exception:
                        pass
                if isinstance(e, CompactMQError) or not isinstance(e, Exception):
                    raise
                raise CompactionError(f"compaction of {self.topic} failed: {message}") from e
            # committed: the new view is in force; what follows is clean-up an orphan sweep redoes
            advance_hold(self.storage, self.topic, plan.new_horizon)
            self.abort_hook("after-commit")
            shutil.rmtree(plan.run_dir, ignore_errors=True)
            if previous is not None and previous != new_id:
                views.retire(previous, new_id)
            step("cleanup")
            report(CompactionProgress("done", plan.estimated_entries, plan.estimated_entries))
            return CompactionResult(
                topic=self.topic,
                compacted_ledger_id=new_id,
                horizon=plan.new_horizon,
                entries_read=plan.estimated_entries,
                messages_read=read,
                entries_written=written,
                messages_kept=kept,
                removed_event_count=stats["removed_event_count"],
                duration_ms=duration,
                previous_ledger_id=previous,
                step_seconds=steps,
                job=self.engine.last_stats.get("job_group"),
                engine_seconds=self._engine_split(),
            )
        finally:
            lock.release()

    # --- the chain of segments (chain) -------------------------------------------------------------

    def _extends_chain(self, plan: RunPlan) -> bool:
        """Whether this run extends the previous view's chain (an incremental run that copies only
        what changed) rather than writing a fresh one: the previous view is a local chain, its
        key sidecar is usable, and the merge policy does not ask for a rewrite."""
        prev = self._prev_reader
        if prev is None or not prev.is_chain or "view_keys" not in plan.extra or plan.strategy == "user":
            return False
        max_runs = int(self.config.get("compactionChainMaxRuns", chain.MAX_RUNS))
        max_stale = float(self.config.get("compactionChainMaxStaleRatio", chain.MAX_STALE_RATIO))
        return not chain.should_merge(prev.manifest, len(prev), max_runs, max_stale)

    def _chain_manifest(self, plan: RunPlan, parts: list[dict]):
        """The new view's manifest and its entry count, from the segments the tasks wrote (and,
        for an incremental run, the previous chain and what this run drops of it)."""
        written = [p for p in parts if p["entries"]]
        segments = [(os.path.basename(p["path"]), p["entries"], os.path.getsize(p["path"])) for p in written]
        info = plan.extra["chain"]
        # the entries new to the view: all of a fresh chain's, a chained run's new groups' only
        # (an old group's segment rewrites entries the view already counts)
        fresh_parts = [p for p in written if plan.segments[plan.groups[p["group"]][0]].kind != COMPACTED]
        counted = fresh_parts if info["incremental"] else written
        added = previous_view.part_counts(counted)
        if added is None:
            added = previous_view.segment_counts([p["path"] for p in counted])
        if not info["incremental"]:
            manifest, entries = chain.Manifest.fresh(segments), sum(p["entries"] for p in written)
            manifest.ledgers = previous_view.ledger_counts(None, np.zeros(0, np.int64), added, entries)
        else:
            prev = self._prev_reader
            assert prev is not None and prev.manifest is not None
            lids, eids = self._dropped(plan, parts, prev)
            from . import tasks

            masks = tasks.decode_masks([p.get("masks") or b"" for p in parts])
            manifest = prev.manifest.extended(segments, lids, eids, masks)
            entries = len(prev) - len(lids) + sum(p["entries"] for p in fresh_parts)
            before = prev.manifest.ledgers
            if before is None:  # a manifest from before the counts: the plan opened the view
                before = np.stack(prev.ledger_runs(0), axis=1).reshape(-1, 2)
            manifest.ledgers = previous_view.ledger_counts(before, lids, added, entries)
        manifest.entries = entries if manifest.ledgers is not None else None
        return manifest, entries

    def _dropped(self, plan: RunPlan, parts: list[dict], prev) -> tuple:
        """``(ledger ids, entry ids)`` of the previous view's entries this run drops: those the
        tasks reported (lost every message), every entry of a compacted group no survivor reached
        (it had no task), and those retention removed (below the plan's first compacted id)."""
        chunks = []
        for p in parts:
            raw = p.get("dropped") or b""
            if raw:
                chunks.append(np.frombuffer(bytes(raw), ">i8").astype(np.int64).reshape(-1, 2))
        reported = {p["group"] for p in parts}
        for g, ords in enumerate(plan.groups):
            if g in reported or plan.segments[ords[0]].kind != COMPACTED:
                continue
            for o in ords:
                seg = plan.segments[o]
                lo, hi = prev.ledger_range(seg.ledger_id)
                e = prev.columns(lo, hi)[1]
                e = e[(e >= seg.entry_lo) & (e <= seg.entry_hi)]
                chunks.append(np.stack([np.full(len(e), seg.ledger_id, np.int64), e], axis=1))
        start = self._prev_start
        if start:
            chunks.append(np.stack(prev.columns(0, start)[:2], axis=1))
        if not chunks:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        pairs = np.concatenate(chunks)
        order = np.lexsort((pairs[:, 1], pairs[:, 0]))
        pairs = pairs[order]
        if len(pairs) > 1:  # the same entry reported twice (it cannot be, but a drop is a set)
            keep = np.ones(len(pairs), bool)
            keep[1:] = (pairs[1:] != pairs[:-1]).any(axis=1)
            pairs = pairs[keep]
        return pairs[:, 0], pairs[:, 1]

    # --- the key sidecar of the view (view_keys) -------------------------------------------------

    @property
    def _topic_dir(self) -> str:
        return topic_dir(self.data_dir, self.topic)

    def _place_view_keys(self, plan: RunPlan, parts: list[dict], new_id: int, views) -> Optional[dict]:
        """Put the sidecar the phase-two tasks wrote in place beside the new view (before the
        commit) and return what the commit records of it; None when the run wrote none (a user
        strategy) or not for every part."""
        if (plan.extra.get("chain") or {}).get("delta"):
            return self._extend_view_keys(plan, parts, new_id)
        # every part with survivors has sidecar rows, whether or not it wrote entries (an
        # incremental chain run's group of unchanged old entries writes none)
        names = [p.get("keys") for p in parts if p["messages"]]
        if not all(names):
            return None
        views.place_keys(plan, parts, new_id)
        return {"files": names, "et": plan.strategy == "event-time"}

    def _extend_view_keys(self, plan: RunPlan, parts: list[dict], new_id: int) -> dict:
        """A delta run's sidecar (``view_keys``, Chained sidecars): the previous view's files,
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
        the ledger being written, which waits for the next run."""
        if not getattr(self.storage, "read_only", True):
            ml.rollover()
            return ml.last_position()
        from ..storage.position import LEDGER_CLOSED

        for info in reversed(ml.ledgers()):
            if getattr(info, "state", LEDGER_CLOSED) == LEDGER_CLOSED and info.entry_count > 0:
                return Position(info.ledger_id, info.entry_count - 1)
        return None

    def _plan(self, state, settings, strategy, new_id: int) -> RunPlan:
        from ..storage.ledger_file import index_path_for

        ml = self._managed_ledger()
        self._step("start")
        last = self._last_compactable(ml, settings)  # sealed ledgers only; stops before too young entries
        self._step("seal")
        first = ml.first_position()
        prev_h = state.horizon
        new_horizon = last if (prev_h is None or (last is not None and last > prev_h)) else prev_h
        live = []
        if last is not None:
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
        compacted = None
        if state.compacted_ledger_id is not None:
            path = _compacted_location(self.storage, self.topic, state.compacted_ledger_id)
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
            compacted = {
                "path": path,
                "ledgers": {int(l): (int(c), los[int(l)]) for l, c in zip(lids, counts)},
            }
        segments = build_segments(compacted, live)
        drop_before, tombstones_from = self._time_cuts(ml, settings, strategy, segments)
        parallelism = max(1, int(getattr(self.engine, "parallelism", 2)))
        groups = build_groups(segments, parallelism)
        run_dir = os.path.join(topic_dir(self.data_dir, self.topic), f"run-{new_id}")
        os.makedirs(run_dir, exist_ok=True)
        native = getattr(strategy, "native", None)
        extra = {}
        if compacted is not None:
            sidecar = self._previous_view_keys(state, native or "user")
            if sidecar is not None:
                extra["view_keys"] = sidecar
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
            fault_points=tuple(self.fault_points),
            drop_before=drop_before,
            tombstones_from=tombstones_from,
            extra=extra,
        )

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


def _compacted_location(storage, topic: str, ledger_id: int) -> str:
    """The local file, or the offloaded object's URI once tiered storage deleted the file."""
    return compacted_location(storage, topic, ledger_id)


def new_horizon_next(pos):
    """A position just after ``pos`` (everything at or before it is gone)."""
    return (pos[0], pos[1] + 1)
