"""Compacted views in tiered storage: where a view is read from, and which view file may be copied.

Storage offloads sealed ledgers to object storage and keeps a catalog of what it copied
(``storage.offload``); it knows nothing of compacted views, their files or their format. This
module is what the compaction layer tells it:

* ``compacted_location(storage, topic, view_id)``: where a view is read from -- its local file
  while there is one, else the URI of its offloaded object (any process or Spark task opens it
  through ``pyarrow.fs``);
* ``attach(storage)``: registers ``ViewOffload`` as one of the offloader's companions: during a
  topic's offload it copies the view in force to the object store when its local file may be
  copied as it stands (``copyable_view_file``: a self-contained compacted ledger, its magic
  ``compacted_ledger.HEADER``), records it in the offload catalog, and deletes the local file
  after the deletion lag. A chained view (``chain``) names local segment files and is not copied
  as such; a run of a topic with an offload location writes its view to the object store
  instead, as a chain there (``object_chain``) whose segments the sweeps below keep. Until ``attach`` is called (the broker calls it when its compaction monitor starts)
  the offloader neither offloads compacted views nor deletes their local copies.
"""

from __future__ import annotations

import functools
import logging
import os
import uuid
from typing import Optional

from ..errors import CompactMQError
from ..storage.topic_paths import topic_relpath
from ..storage.offload import open_store
from .topic_lock import TopicLock
from .compacted_ledger import HEADER, compacted_ledger_path, topic_dir

log = logging.getLogger(__name__)

#: where a topic's views live in the object store, under the offload location's prefix
STORE_ROOT = "compacted"


def _store_dir(topic: str) -> str:
    return f"{STORE_ROOT}/{topic_relpath(topic).replace(os.sep, '/')}"


def new_view_prefix(topic: str, view_id: int) -> str:
    """A fresh prefix for a view a run writes straight to the object store (its parts and
    manifest, see ``compaction.compacted_ledger``): never used before, so an interrupted run's
    objects are orphans no catalog row names."""
    return f"{_store_dir(topic)}/{view_id:012d}-{uuid.uuid4().hex}"


def sweep_view_orphans(storage, topic: str) -> list[str]:
    """Delete the objects of ``topic``'s views no catalog row names (a run that died between its
    upload and its commit). Call while holding the topic's compaction lock: a run uploading now
    holds it, so its objects are never taken for orphans."""
    offloader = storage.offloader
    loc = store_location(storage, topic)
    if loc is None:
        return []
    known = offloader.catalog.known_keys() | _chained(storage, loc, topic)
    prefixes = tuple(k for k in known if k.endswith("/"))
    store = open_store(loc)
    removed = [k for k in store.list(_store_dir(topic)) if k not in known and not k.startswith(prefixes)]
    for key in removed:
        store.delete(key)
    return removed


def _chained(storage, location, topic: Optional[str] = None) -> set[str]:
    """Keys a chained view in the object store still names beyond its catalog row's
    (``object_chain.protected_keys``: its segments, its sidecar files)."""
    from .object_chain import protected_keys

    return protected_keys(storage, location, topic)


def compacted_location(storage, topic: str, view_id: int) -> str:
    """The view's local file while there is one, else its offloaded object's URI (else the
    local path, which then does not exist: the caller's open fails as for a deleted view)."""
    path = compacted_ledger_path(storage.data_dir, topic, view_id)
    if os.path.exists(path):
        return path
    offloader = getattr(storage, "offloader", None)
    rec = offloader.compacted_record(view_id) if offloader is not None else None
    return rec.location.url(rec.data_key) if rec is not None else path


def local_copy_deleted(storage, topic: str, view_id: int) -> bool:
    """True once tiered storage deleted the local file of an offloaded view."""
    return not os.path.exists(compacted_ledger_path(storage.data_dir, topic, view_id))


def copyable_view_file(data_dir, topic: str, view_id: int) -> Optional[str]:
    """The local file of view ``view_id`` when it is a self-contained compacted ledger (what the
    offloader may copy whole), else None (a chain manifest, or no file any more)."""
    path = compacted_ledger_path(data_dir, topic, view_id)
    try:
        with open(path, "rb") as f:
            magic = f.read(len(HEADER))
    except FileNotFoundError:
        return None
    return path if magic == HEADER else None


# --- a run that writes its view straight to the object store (``runner``) ----------------------


def store_location(storage, topic: str):
    """Where a run writes ``topic``'s view straight to the object store, else None (local):
    where the topic offloads to when tiered storage is configured, else -- ledgers in the object
    store (``objectLedgerStorageUrl``, cluster mode) -- that store, so the view lives with the
    ledgers and a broker that takes the topic over finds it through the catalog row."""
    offloader = getattr(storage, "offloader", None)
    if offloader is None:
        return None
    try:
        location = offloader.location_for(topic)
    except CompactMQError:
        location = None
    if location is None:
        object_store = getattr(storage, "object_store", None)
        location = getattr(object_store, "location", None)
    return location


def sweep_quietly(storage, topic: str) -> None:
    """``sweep_view_orphans``; an unreachable store delays the clean-up, not the run."""
    try:
        sweep_view_orphans(storage, topic)
    except CompactMQError:
        pass


def write_view_manifest(storage, topic: str, location, prefix: str, view_id: int, parts: list[dict]):
    """Write the manifest of the parts a run's tasks uploaded under ``prefix``; returns the
    catalog row that will name the view (added just before the commit) and its entry count."""
    from ..storage.offload import COMPACTED, OffloadRecord

    from .compacted_writer import write_manifest

    key, size, written = write_manifest(open_store(location), prefix, [p for p in parts if p["entries"]])
    now = storage.now_ms()
    # index_key names the prefix (ending in "/"): deleting the view deletes every part
    record = OffloadRecord(
        key, prefix + "/", COMPACTED, topic, view_id, location, size, now, local_deleted_ms=now
    )
    return record, written


def forget_record(storage, record) -> None:
    """Remove the row of a view whose commit was refused (else the next ``delete_dead`` does)."""
    try:
        storage.offloader.catalog.remove(record)
    except CompactMQError:
        pass


def delete_uploaded(location, prefix: str) -> None:
    """Delete what a run that did not commit uploaded (else an orphan the next sweep deletes)."""
    try:
        open_store(location).delete_prefix(prefix)
    except CompactMQError:
        pass


def try_lock(data_dir, topic: str) -> Optional[TopicLock]:
    """The topic's compaction lock, or None while a run (here or in another process) holds it."""
    return TopicLock.try_acquire(topic_dir(data_dir, topic))


def _owns(storage, topic: str) -> bool:
    """Whether this process may judge ``topic``'s view objects: always on a single node; in
    cluster mode only while it owns the topic (the lock above is local to a data directory,
    so another broker's run -- its row added, its commit not yet made -- holds no lock here)."""
    fence_for = getattr(storage, "fence_for", None)
    return fence_for is None or not fence_for(topic).lost


def _clustered(storage) -> bool:
    """Whether ownership of topics is decided by a cluster (``storage.resources.fence``)."""
    from ..storage.resources.fence import NO_FENCE

    fence_for = getattr(storage, "fence_for", None)
    return fence_for is not None and fence_for("persistent://public/default/__probe__") is not NO_FENCE


def owned_lock(storage, topic: str) -> Optional[TopicLock]:
    """``try_lock`` for a topic this process owns (``_owns``), else None: not ours to judge."""
    if not _owns(storage, topic):
        return None
    return try_lock(storage.data_dir, topic)


class ViewOffload:
    """The offloader's companion for compacted views (``storage.offload.offloader.Companion``)."""

    def __init__(self, storage):
        self.storage = storage
        self.offloader = storage.offloader

    def _view(self, topic: str) -> Optional[int]:
        return self.offloader.compacted_view(topic)

    def pending(self, topic: str) -> bool:
        """A view in force that is not offloaded yet."""
        cid = self._view(topic)
        return cid is not None and self.offloader.compacted_record(cid) is None

    def offload(self, topic: str, loc) -> None:
        offload_view(self.storage, topic, loc)

    def delete_local(self, topic: str, lag_ms: int) -> None:
        """Unlink the local file of the offloaded view in force once ``lag_ms`` has passed;
        readers that hold it open (memory-mapped) keep reading, new ones open the object."""
        offloader = self.offloader
        cid = self._view(topic)
        rec = offloader.compacted_record(cid) if cid is not None else None
        if rec is None or rec.local_deleted_ms is not None:
            return
        now = offloader.clock()
        if now - rec.offloaded_ms < lag_ms:
            return
        path = copyable_view_file(self.storage.data_dir, topic, cid)  # None: gone already
        try:
            if path is not None:
                os.unlink(path)
        except FileNotFoundError:
            pass
        offloader.catalog.mark_local_deleted(rec, now)


def offload_view(storage, topic: str, loc=None):
    """Offload ``topic``'s compacted view in force (sealed from birth) unless it is already:
    write the object under a fresh name, then its catalog row, then check that the view is still
    the one in force; a newer compaction meanwhile makes the row dead and the offloader deletes
    it and the object at once. Returns the row, or None when nothing was offloaded."""
    from ..storage.offload import COMPACTED, OffloadRecord

    offloader = storage.offloader
    if offloader.read_only:
        return None
    loc = loc or offloader.location_for(topic)
    cid = offloader.compacted_view(topic)
    if loc is None or cid is None or offloader.compacted_record(cid) is not None:
        return None
    path = copyable_view_file(storage.data_dir, topic, cid)
    if path is None:  # a chain manifest (the next run writes its view to the store whole)
        return None
    store = open_store(loc)
    key = f"{_store_dir(topic)}/{cid:012d}-{uuid.uuid4().hex}.compacted"
    try:
        f = open(path, "rb")
    except FileNotFoundError:  # replaced by a newer compaction since we looked
        return None
    with f:
        size = store.put(key, iter(lambda: f.read(offloader.max_block), b""))
    offloader.reached("compacted-after-data")
    # no index object: a compacted ledger's own index and trailer are inside it, and its reader
    # fetches them (then entries) by ranges
    rec = OffloadRecord(key, key, COMPACTED, topic, cid, loc, size, offloader.clock())
    if not offloader.commit_record(rec, store):
        return None
    log.info("offloaded compacted ledger %d of %s to %s (%d bytes)", cid, topic, store.uri(key), size)
    return rec


def attach(storage) -> None:
    """Make this layer's views a companion of ``storage``'s offloader, and let it judge dead
    compacted rows under the topic's compaction lock (module docstring). Idempotent."""
    offloader = getattr(storage, "offloader", None)
    if offloader is None:
        return
    offloader.compacted_lock = functools.partial(owned_lock, storage)
    if not any(isinstance(c, ViewOffload) for c in offloader.companions):
        offloader.companions.append(ViewOffload(storage))


def sweep_all_view_orphans(storage) -> list[str]:
    """At start: delete the objects of views no catalog row names, in every location (a run or
    an offload that died between its upload and its commit). A topic's are swept only under its
    compaction lock: a compact-topic job uploading right now holds it. In cluster mode this
    sweep is left to each topic's owner (``sweep_view_orphans`` at the start of its runs): a
    local lock says nothing of another broker's run uploading now."""
    offloader = storage.offloader
    removed: list[str] = []
    if _clustered(storage):
        return removed
    locations = set(offloader.locations())
    object_store = getattr(storage, "object_store", None)
    if object_store is not None:  # views written beside the ledgers (``store_location``)
        locations.add(object_store.location)
    for loc in locations:
        store = open_store(loc)
        known = offloader.catalog.known_keys() | _chained(storage, loc)
        prefixes = tuple(k for k in known if k.endswith("/"))
        by_topic: dict[tuple, list[str]] = {}
        for key in store.list(STORE_ROOT):
            parts = tuple(key.split("/")[1:5])
            if key in known or key.startswith(prefixes) or len(parts) != 4 or {"", ".", ".."} & set(parts):
                continue
            by_topic.setdefault(parts, []).append(key)
        for parts, keys in by_topic.items():
            removed += _delete_locked(storage, store, loc, parts, keys)
    return removed


def _delete_locked(storage, store, loc, parts: tuple, keys: list[str]) -> list[str]:
    from . import COMPACTED_DIR

    # the key's topic part is the data directory's own encoding of the topic (topic_relpath)
    lock = TopicLock.try_acquire(os.path.join(str(storage.data_dir), COMPACTED_DIR, *parts))
    if lock is None:
        return []  # a run of this topic is uploading: its objects are not orphans
    try:
        # listed before the lock was taken: a run may have committed some of them since
        known = storage.offloader.catalog.known_keys() | _chained(storage, loc)
        prefixes = tuple(k for k in known if k.endswith("/"))
        keys = [k for k in keys if k not in known and not k.startswith(prefixes)]
        for key in keys:
            store.delete(key)
    finally:
        lock.release()
    return keys
