"""Where a run's compacted view lives: one ``ViewStore`` interface, one implementation per place.

A compaction run (``runner.CompactionRunner``) does the same steps wherever its view goes: it
tells the tasks where to write (``prepare``), writes the view's manifest once the tasks are done
(``write_view``), puts the key sidecar beside it (``place_keys``), makes what the commit will
name findable (``publish``), commits through ``state.CompactionStates`` (one compare-and-set,
not the store's business), and then either retires what the previous view named and the new one
does not (``retire``), or -- the commit was refused or the run failed -- deletes everything it
wrote (``discard``). Every write before the commit goes under a name no committed view uses, so
a view in force never names a missing file or object, whatever step a crash stops at.

The places:

* ``LocalChainStore`` -- the data directory's compaction area (``compacted_ledger.topic_dir``):
  the view is a chain manifest naming segment files (``chain``), which an incremental run
  extends (it writes only the segments of what changed), and a key sidecar directory.
* ``ObjectChainStore`` -- the object store the topic offloads to, or its ledgers' store in
  cluster mode (``tiered.store_location``): a chain as the local one, in the store
  (``object_chain``), recorded in the offload catalog so any process that sees the metadata
  store (another broker, a Spark task) reads it by URI; an incremental run uploads its new
  segments and a manifest only.
* ``ObjectPartsStore`` -- the same place, the older layout (``compactionObjectStoreChains``
  false): the tasks upload their parts under a fresh prefix, the view is the manifest of those
  parts (``tiered.write_view_manifest``). A run writes it whole.

``for_run(storage, topic)`` picks the place: the object store when the topic has one, else the
local chain. Readers do not care where a view is: ``tiered.compacted_location`` gives the local
file or the URI of a committed view.
"""

from __future__ import annotations

import abc
import os
from typing import Any, Optional

from ..config import bool_setting
from ..errors import CompactMQError, StorageError
from ..storage.managed_ledger import fsync_dir
from . import chain, tiered, view_keys
from .compacted_ledger import compacted_ledger_path, is_remote, topic_dir
from .plan import RunPlan


class ViewStore(abc.ABC):
    """Where one run's view is written, committed from and cleaned up (module docstring). An
    instance serves one run: it remembers what that run wrote."""

    def __init__(self, storage, topic: str):
        self.storage = storage
        self.topic = topic

    @property
    def topic_dir(self) -> str:
        """The topic's directory in the compaction area (runs' scratch space, the lock)."""
        return topic_dir(self.storage.data_dir, self.topic)

    @abc.abstractmethod
    def prepare(self, run, plan: RunPlan, new_id: int) -> None:
        """Tell the tasks where and how to write (``plan.chain``, or ``plan.store`` and ``plan.prefix``), before the engine runs."""

    @abc.abstractmethod
    def write_view(self, run, plan: RunPlan, parts: list[dict], new_id: int) -> tuple[int, int]:
        """Write view ``new_id``'s manifest from what the tasks wrote (``parts``), not yet in
        force. Returns ``(entries, stored bytes)``."""

    def place_keys(self, plan: RunPlan, parts: list[dict], new_id: int) -> None:
        """Put the key sidecar the tasks wrote beside the new view (when they did not already)."""

    def publish(self) -> None:
        """Just before the commit: make the new view findable by id once the commit names it."""

    @abc.abstractmethod
    def discard(self, plan: Optional[RunPlan], new_id: int) -> None:
        """The run did not commit: delete everything it wrote (quietly; a sweep redoes it)."""

    #: the new view's chain manifest when it is a local chain (what ``retire`` keeps)
    manifest: Optional[chain.Manifest] = None

    def retire(self, previous: int, new_id: int) -> None:
        """After the commit: delete what view ``previous`` named and ``new_id`` does not,
        wherever the previous one lives (a run may be the first to write to the object store
        after local ones): its local manifest and the segments the new chain does not name, its
        sidecar, and -- through the offload catalog -- its objects."""
        previous_path = compacted_ledger_path(self.storage.data_dir, self.topic, previous)
        try:  # its segments the new chain does not name go with it
            stale = chain.stale_segments(chain.read(previous_path), self.manifest)
        except (StorageError, OSError):
            stale = []  # unreadable: the next run's orphan sweep decides
        for path in [previous_path, *(os.path.join(self.topic_dir, name) for name in stale)]:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        view_keys.remove_local(self.topic_dir, previous)
        offloader = getattr(self.storage, "offloader", None)
        if offloader is not None:
            try:  # the previous view's objects are dead now; maintenance retries
                offloader.delete_dead(self.topic, compaction_locked=True)
            except CompactMQError:
                pass


def for_run(storage, topic: str) -> ViewStore:
    """The place of a run's view: the topic's object store when it has one (a chain there
    unless ``compactionObjectStoreChains`` is false), else local."""
    location = tiered.store_location(storage, topic)
    if location is not None:
        if bool_setting(storage.config, "compactionObjectStoreChains"):
            return ObjectChainStore(storage, topic, location)
        return ObjectPartsStore(storage, topic, location)
    return LocalChainStore(storage, topic)


def _chain_target(run, plan: RunPlan, new_id: int, directory: str, incremental: bool) -> dict:
    """``plan.chain``: how the tasks write a chain's segments into ``directory``."""
    config = run.config
    return {
        "dir": directory,
        "run": new_id,
        "incremental": incremental,
        # old batches that lost some message are masked, not rewritten
        "masks": bool_setting(config, "compactionChainMasks"),
        # segments are written with direct I/O where the file system allows it
        "direct_io": bool_setting(config, "compactionDirectIO"),
        # only the new messages go through Spark, looked up in the sidecar (a lookup run)
        "lookup": incremental
        and plan.strategy == "keep-latest"
        and bool(run._prev_sidecar[0])
        and getattr(run.engine, "lookup_runs", False)
        and bool_setting(config, "compactionChainDeltaRuns"),
    }


def _still_owned(storage, topic: str) -> bool:
    """Whether the topic's ownership fence holds now (always on a single node)."""
    fence_for = getattr(storage, "fence_for", None)
    if fence_for is None:
        return True
    try:
        return fence_for(topic).holds(storage.metadata_store)
    except CompactMQError:
        return False


def _previous_is_remote(run) -> bool:
    prev = run._prev_reader
    return prev is not None and is_remote(prev.path)


class LocalChainStore(ViewStore):
    """A chain of segment files and its manifest in the topic's compaction directory."""

    def __init__(self, storage, topic: str):
        super().__init__(storage, topic)
        self.path: Optional[str] = None  # the new view's manifest, once written

    def prepare(self, run, plan: RunPlan, new_id: int) -> None:
        # a chain in the object store (the topic's store was dropped since) is not extended here
        incremental = run._extends_chain(plan) and not _previous_is_remote(run)
        plan.chain = _chain_target(run, plan, new_id, self.topic_dir, incremental)

    def write_view(self, run, plan: RunPlan, parts: list[dict], new_id: int) -> tuple[int, int]:
        self.path = compacted_ledger_path(self.storage.data_dir, self.topic, new_id)
        # the tasks fsynced their segments; the manifest (fsynced with the directory) names them,
        # and the commit makes it the view
        self.manifest, written = run._chain_manifest(plan, parts)
        chain.write(self.path, self.manifest)
        return written, chain.view_size(self.path, self.manifest)

    def place_keys(self, plan: RunPlan, parts: list[dict], new_id: int) -> None:
        """Move the sidecar directory the tasks wrote into place beside the view."""
        names = [p.get("keys") for p in parts if p["messages"]]
        view_keys.place_run_dir(plan.run_dir, self.topic_dir, new_id, move=bool(names))
        fsync_dir(self.topic_dir)

    def discard(self, plan: Optional[RunPlan], new_id: int) -> None:
        if self.path and os.path.exists(self.path):
            os.unlink(self.path)
        if plan is not None:
            view_keys.remove_local(self.topic_dir, new_id)
            chain.remove_run_segments(self.topic_dir, new_id)


class ObjectPartsStore(ViewStore):
    """Parts and their manifest under a fresh prefix in the topic's object store, named by a row
    of the offload catalog (``tiered``)."""

    def __init__(self, storage, topic: str, location: Any):
        super().__init__(storage, topic)
        self.location = location
        self.prefix: Optional[str] = None
        self.record = None  # the catalog row naming the view, once its manifest is written
        self.published = False

    def prepare(self, run, plan: RunPlan, new_id: int) -> None:
        # objects of a run that died between its upload and its commit (we hold the lock)
        tiered.sweep_quietly(self.storage, self.topic)
        self.prefix = tiered.new_view_prefix(self.topic, new_id)
        plan.store, plan.prefix = self.location, self.prefix  # the tasks upload their parts

    def write_view(self, run, plan: RunPlan, parts: list[dict], new_id: int) -> tuple[int, int]:
        assert self.prefix is not None
        self.record, written = tiered.write_view_manifest(
            self.storage, self.topic, self.location, self.prefix, new_id, parts
        )
        return written, int(self.record.data_size)

    def publish(self) -> None:
        # the row first: until the commit names the view, the row is "dead" and only a sweep
        # holding this topic's compaction lock (held by this run) may delete its objects
        self.storage.offloader.catalog.add(self.record)
        self.published = True

    def discard(self, plan: Optional[RunPlan], new_id: int) -> None:
        if self.published:  # its row, added before the refused commit
            tiered.forget_record(self.storage, self.record)
        if self.prefix is not None:
            tiered.delete_uploaded(self.location, self.prefix)


class ObjectChainStore(ViewStore):
    """A chain of segments in the topic's object store (``object_chain``): the tasks write the
    run's segments and sidecar files into its scratch directory as for a local chain, and this
    store uploads them, with the chain manifest, under the chain's prefix."""

    def __init__(self, storage, topic: str, location: Any):
        super().__init__(storage, topic)
        from .object_chain import ObjectChainStore as Uploads

        self.uploads = Uploads(storage, topic, location)
        self.key_names: list[str] = []  # the sidecar files the run uploaded, relative to its chain

    def prepare(self, run, plan: RunPlan, new_id: int) -> None:
        # objects of a run that died between its upload and its commit, and segments of a
        # chain a merge replaced (we hold the lock; ``object_chain``: what is kept) -- only while
        # this broker still owns the topic: a deposed owner must not judge the new one's uploads
        if _still_owned(self.storage, self.topic):
            tiered.sweep_quietly(self.storage, self.topic)
        previous = run._prev_view_id
        rec = self.storage.offloader.compacted_record(previous) if previous is not None else None
        incremental = self.uploads.choose_prefix(rec, run._extends_chain(plan), new_id)
        staging = os.path.join(plan.run_dir, "segments")
        os.makedirs(staging, exist_ok=True)
        plan.chain = _chain_target(run, plan, new_id, staging, incremental)

    def write_view(self, run, plan: RunPlan, parts: list[dict], new_id: int) -> tuple[int, int]:
        self.manifest, written = run._chain_manifest(plan, parts)
        self.uploads.upload_segments([p["path"] for p in parts if p["entries"] and p.get("path")])
        _, size = self.uploads.write_manifest(self.manifest, new_id)
        return written, size

    def place_keys(self, plan: RunPlan, parts: list[dict], new_id: int) -> None:
        names = [p["keys"] for p in parts if p["messages"]]
        local = os.path.join(plan.run_dir, view_keys.STORE_DIR)
        self.key_names = self.uploads.upload_keys(local, names, new_id)

    def extend_keys(self, plan: RunPlan, parts: list[dict], new_id: int, previous: tuple) -> dict:
        """A lookup run's sidecar: the previous view's files (same chain, names relative to its
        prefix) plus the files this run wrote, uploaded."""
        _, prev_files, prev_gone = previous
        written = [p["keys"] for p in parts if p.get("keys")]
        local = os.path.join(plan.run_dir, view_keys.STORE_DIR)
        names = self.uploads.upload_keys(local, written, new_id)
        files = prev_files + [r for n, r in zip(written, names) if not n.startswith("gone-")]
        gone = prev_gone + [r for n, r in zip(written, names) if n.startswith("gone-")]
        return {"files": files, "gone": gone, "et": False}

    def publish(self) -> None:
        self.uploads.publish()

    def discard(self, plan: Optional[RunPlan], new_id: int) -> None:
        self.uploads.discard()
