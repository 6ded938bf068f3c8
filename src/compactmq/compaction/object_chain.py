"""A compacted view in the object store as a *chain* of segments, so an incremental run uploads
only what it wrote, not the whole view again.

Why
---
A view written to the object store (``view_store.ObjectPartsStore``: a manifest of parts) is
written whole by every run: after a hundred new messages on a view of 20 k keys a run uploaded
6.6 MB, as much as the first run. A local view is a chain (``chain``): an incremental run writes
segments for its new survivors and a manifest that names the older segments instead of copying
them. This module puts the same chain, in the same manifest format, in the object store.

Layout
------
A chain lives under one *chain prefix* ``C`` (``tiered.new_view_prefix`` of the run that started
it, fresh at every merge), in the topic's directory of the store::

    C/<run id>-<group>.seg       a segment (``chain.segment_name``): a complete compacted ledger
    C/<run id>/keys/<name>       the key sidecar files run ``run id`` wrote (``view_keys``)
    C/<view id>.chain            the chain manifest of view ``view id`` (``chain.encode``)

The manifest names segments relative to ``C``, so a reader (``CompactedLedgerReader`` given the
manifest's URI, ``compacted_sources.ChainObject``) opens each segment beside it by ranges. The
catalog row of view ``V`` (``storage.offload``) names its manifest only: ``data_key`` and
``index_key`` both ``C/V.chain``, so deleting the row of a replaced view deletes its manifest and
nothing a newer view of the same chain still names. The sidecar files the view uses are listed
in the details committed with it, relative to ``C`` (``sidecar_keys``).

A run
-----
The tasks write their segments and sidecar files into the run's scratch directory exactly as for
a local chain (``view_store._chain_target``); the store then uploads the segments the run wrote
(``write_view``), the manifest, and the run's sidecar files (``place_keys`` / ``extend_keys``),
every one under a name no committed view uses. ``publish`` adds the catalog row; the commit is
the compaction state's one compare-and-set under the ownership fence (``state``), exactly as for
any view: a run whose fence or expected version is gone commits nothing and ``discard`` deletes
what it uploaded (only its own objects: the chain prefix is shared with the view in force).

An incremental run extends the chain the view in force lives in; the merge policy
(``chain.should_merge``) makes a run write a fresh chain under a new prefix instead. A new owner
after a failover reads the chain from the catalog row like any reader and extends it.

What is deleted, and when
-------------------------
After the commit, the replaced view's catalog row goes (``offloader.delete_dead``): its manifest
only. Everything else is the orphan sweep's (``protected_keys``), run by the owner under the
topic's compaction lock at the start of each run: it keeps every object a catalog row names,
every segment a chain manifest named by a row names, and the sidecar files of the view in force,
and deletes the rest of the topic's directory -- a dead run's uploads, and a chain a merge
replaced. Segments a merge left therefore go at the next run, not at the merge: a reader that
opened the previous view just before the merge (its manifest is in memory, its segments are read
by ranges) keeps reading for one run interval. Each segment is deleted only when no committed
view's manifest names it, so the view in force never points at a deleted segment.
"""

from __future__ import annotations

import os
import posixpath
from typing import Optional

from ..errors import CompactMQError, StorageError
from ..storage.offload import open_store
from . import chain, tiered, view_keys

#: the suffix of a chain manifest's key (what tells a chain's catalog row from a parts view's)
MANIFEST_SUFFIX = ".chain"


def is_chain_record(rec) -> bool:
    """Whether catalog row ``rec`` names a chain manifest in the object store."""
    return rec is not None and rec.data_key.endswith(MANIFEST_SUFFIX) and rec.index_key == rec.data_key


def chain_prefix(rec) -> str:
    """The chain prefix ``C`` of a chain row's view (its manifest's directory)."""
    return posixpath.dirname(rec.data_key)


def manifest_key(prefix: str, view_id: int) -> str:
    return f"{prefix}/{view_id:012d}{MANIFEST_SUFFIX}"


def keys_dir(run_id: int) -> str:
    """Where run ``run_id``'s sidecar files go, relative to the chain prefix."""
    return f"{run_id:012d}/{view_keys.STORE_DIR}"


def sidecar_keys(rec, names: list[str]) -> list[str]:
    """The object keys of sidecar files ``names`` of a chain row's view (names relative to ``C``)."""
    base = chain_prefix(rec)
    return [f"{base}/{n}" for n in names]


def read_manifest(store, key: str) -> chain.Manifest:
    data = bytes(store.read_all(key))
    return chain.decode(data, key)


def protected_keys(storage, location, topic: Optional[str] = None) -> set[str]:
    """Objects of chained views in ``location`` the orphan sweep must keep (module docstring):
    every segment a chain manifest named by a catalog row names, and the sidecar files of the
    view in force. ``StorageError`` when a named manifest exists but cannot be read (then
    nothing may be swept)."""
    from .state import states_of

    store = open_store(location)
    keep: set[str] = set()
    for rec in storage.offloader.catalog.compacted(topic):
        if not is_chain_record(rec) or rec.location != location:
            continue
        if not store.exists(rec.data_key):  # a dead row whose deletion was cut short
            continue
        base = chain_prefix(rec)
        keep.update(f"{base}/{name}" for name in read_manifest(store, rec.data_key).names())
        state = states_of(storage).get(rec.topic)
        info = state.details.get(view_keys.DETAILS_KEY) if state.details_of == rec.ledger_id else None
        if state.compacted_ledger_id == rec.ledger_id and isinstance(info, dict):
            keep.update(sidecar_keys(rec, [*(info.get("files") or []), *(info.get("gone") or [])]))
    return keep


class ObjectChainStore:
    """The object-store half of ``view_store.ObjectChainStore`` (kept here with its layout):
    uploads, the catalog row, and the clean-up of a run that did not commit."""

    def __init__(self, storage, topic: str, location) -> None:
        self.storage = storage
        self.topic = topic
        self.location = location
        self.prefix: Optional[str] = None  # the chain prefix ``C`` the run writes under
        self.extends = False  # the run extends the chain of the view in force
        self.uploaded: list[str] = []  # every object this run put (what ``discard`` deletes)
        self.record = None
        self.published = False

    @property
    def store(self):
        return open_store(self.location)

    def choose_prefix(self, previous_record, incremental: bool, new_id: int) -> bool:
        """The chain prefix of the run: the previous view's chain when the run extends it, else a
        fresh one. Returns whether the run extends it."""
        self.extends = bool(incremental and is_chain_record(previous_record))
        self.prefix = (
            chain_prefix(previous_record) if self.extends else tiered.new_view_prefix(self.topic, new_id)
        )
        return self.extends

    def put_file(self, key: str, path: str) -> None:
        self.uploaded.append(key)  # before the put: a put cut short may leave the object
        self.store.put_file(key, path)

    def upload_segments(self, paths: list[str]) -> None:
        """Upload the segments the run's tasks wrote (local files in the run's scratch space)."""
        assert self.prefix is not None
        for path in paths:
            self.put_file(f"{self.prefix}/{os.path.basename(path)}", path)

    def write_manifest(self, manifest: chain.Manifest, new_id: int):
        """Upload the view's manifest; returns the catalog row that will name the view and the
        view's stored size (manifest and segments)."""
        from ..storage.offload import COMPACTED, OffloadRecord

        assert self.prefix is not None
        key = manifest_key(self.prefix, new_id)
        data = chain.encode(manifest)
        self.uploaded.append(key)
        self.store.put(key, [data])
        now = self.storage.now_ms()
        size = len(data) + manifest.size
        self.record = OffloadRecord(key, key, COMPACTED, self.topic, new_id, self.location, size, now, now)
        return self.record, size

    def upload_keys(self, local_dir: str, names: list[str], run_id: int) -> list[str]:
        """Upload sidecar files ``names`` from ``local_dir``; returns their names relative to the
        chain prefix (what the commit's details list)."""
        assert self.prefix is not None
        out = []
        for name in names:
            rel = f"{keys_dir(run_id)}/{name}"
            self.put_file(f"{self.prefix}/{rel}", os.path.join(local_dir, name))
            out.append(rel)
        return out

    def publish(self) -> None:
        self.storage.offloader.catalog.add(self.record)
        self.published = True

    def discard(self) -> None:
        """The run did not commit: its row, then its own objects (never the shared chain's)."""
        if self.published:
            tiered.forget_record(self.storage, self.record)
        try:
            store = self.store
            for key in self.uploaded:
                store.delete(key)
            if self.prefix is not None and not self.extends:
                store.delete_prefix(self.prefix)  # a fresh chain's prefix is this run's alone
        except (CompactMQError, StorageError, OSError):
            pass  # the next run's orphan sweep deletes them
