"""The orphan sweep of the group flush's shared objects (``groups/<incarnation>/<counter>``).

``object_group_flush`` writes a shared object, then commits its range records and one
reference key per member under ``<GROUPS_ROOT>/<incarnation>-<counter>`` (the *group node*);
whoever releases the last reference deletes the object, then the group node. Two crashes leave
an object nobody will ever delete:

(a) the writing process died after the object's PUT and before its commit: an object and no
    group node at all (no records, no references);
(b) a process died between releasing the last reference and deleting the object: an object
    whose group node has no children.

``sweep_orphan_groups`` lists ``groups/`` (one LIST, with modification times) and deletes an
object only when BOTH hold:

* it is older than ``grace_s`` (``ORPHAN_GRACE_S`` by default, 10 minutes): far longer than a
  live broker's group is in flight (the write before it, one PUT, one metadata commit --
  seconds at worst), and longer than any metadata-store session (``metadataStoreSessionTimeoutMillis``,
  30 s by default), past which a paused broker's commit fails on its ownership fence anyway.
  The sweeping process's own in-flight group (``GroupFlush``, passed as ``own``) is skipped
  whatever its age;
* no reference names it: its group node has no children. For case (a) the sweep first creates
  the group node itself (a *tombstone*, with ``NEW``: it fails if a commit just made it), and a
  group's commit creates its node with ``NEW`` too, so a commit arriving after the sweep decided
  -- a broker frozen for longer than the grace, with no fence to stop it -- fails instead of
  naming a deleted object: that flush errors, nothing of it is acknowledged, nothing is lost.

Group nodes with no children whose object is gone (a tombstone, or a crash between the object's
delete and the node's) are removed once they are older than ``grace_s`` too, so a tombstone
outlives its object by at least one grace period.

A broker runs the sweep from its maintenance (``Storage.run_maintenance``, at most every
``SWEEP_INTERVAL_S``) when ``objectLedgerGroupFlushEnabled``; several brokers at once are safe
(the tombstone's ``NEW`` decides between them and a late commit; deletes are idempotent).

Nothing here reads a user value: keys come from the store's own listing and are parsed as two
integers before any use.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..errors import CompactMQError, StorageError
from .metadata_store import NEW, BadVersion, MetadataStore, NotEmpty
from .object_group_flush import GROUPS_PREFIX, GROUPS_ROOT, group_node
from .object_layout import delete_object
from .offload.blobstore import BlobStore

if TYPE_CHECKING:  # pragma: no cover
    from .object_group_flush import GroupFlush

log = logging.getLogger(__name__)

#: how old a shared object must be before the sweep may delete it (see the module docstring)
ORPHAN_GRACE_S = 600.0
#: how often a broker runs the sweep (from its maintenance, ``retentionCheckIntervalInSeconds``):
#: a LIST of ``groups/`` each time, and orphans only appear after crashes
SWEEP_INTERVAL_S = 300.0
#: the value of a group node the sweep created (case (a)): tells a tombstone from a real node
TOMBSTONE = b"swept"


@dataclass
class SweepResult:
    deleted: list[str] = field(default_factory=list)  # shared objects deleted
    nodes_removed: list[str] = field(default_factory=list)  # empty group nodes removed
    tombstones: list[str] = field(default_factory=list)  # group nodes made by this sweep (kept)


def _list_groups(store: BlobStore) -> dict[str, float | None]:
    """``groups/<incarnation>/<counter>`` keys -> modification time (epoch seconds; None when
    the store does not say, which the sweep treats as too young)."""
    from pyarrow import fs

    base = store.path(GROUPS_PREFIX)
    try:
        infos = store.fs.get_file_info(fs.FileSelector(base, recursive=True, allow_not_found=True))
    except Exception as e:
        raise StorageError(f"listing {GROUPS_PREFIX}/ failed: {e}") from e
    out: dict[str, float | None] = {}
    for i in infos:
        if i.type != fs.FileType.File:
            continue
        rel = i.path[len(base) + 1 :].split("/")
        if len(rel) == 2 and rel[0].isdigit() and rel[1].isdigit():
            out[f"{GROUPS_PREFIX}/{rel[0]}/{rel[1]}"] = i.mtime.timestamp() if i.mtime else None
    return out


def _in_flight(key: str, own: "GroupFlush | None") -> bool:
    """The sweeping process's own group being written now, or one still to come."""
    _, incarnation, counter = key.split("/")
    return own is not None and int(incarnation) == own.incarnation and int(counter) >= own.counter


def _unreferenced(metadata: MetadataStore, key: str, result: SweepResult) -> bool:
    """True when no reference names ``key`` and none can be added from now on (its group node
    exists: a commit of the group would fail on ``NEW``)."""
    node = group_node(key)
    if metadata.get(node) is None:
        try:
            metadata.put(node, TOMBSTONE, expected_version=NEW)
        except BadVersion:
            return False  # its commit happened just now: a live group
        result.tombstones.append(node)
    return not metadata.get_children(node)


def sweep_orphan_groups(
    store: BlobStore,
    metadata: MetadataStore,
    grace_s: float = ORPHAN_GRACE_S,
    own: "GroupFlush | None" = None,
    now: float | None = None,
) -> SweepResult:
    """Delete shared objects that no reference names and that are older than ``grace_s``, then
    empty group nodes whose object is gone (see the module docstring). Safe to run from any
    number of processes at once; a failure leaves the rest for the next sweep."""
    now = time.time() if now is None else now
    result = SweepResult()
    objects = _list_groups(store)
    for key, mtime in sorted(objects.items()):
        if mtime is None or now - mtime < grace_s or _in_flight(key, own):
            continue
        try:
            if _unreferenced(metadata, key, result):
                delete_object(store, key, "orphan sweep: unreferenced past the grace")
                result.deleted.append(key)
        except (OSError, CompactMQError) as e:
            log.warning("orphan sweep: %s left for the next sweep: %s", key, e)
    gone = {group_node(k) for k in result.deleted}
    live_nodes = ({group_node(k) for k in objects} - gone) | set(result.tombstones)
    for child in metadata.get_children(GROUPS_ROOT):
        node = f"{GROUPS_ROOT}/{child}"
        if node in live_nodes:
            continue
        got = metadata.get(node)
        if got is None or now * 1000 - got.stat.created_ms < grace_s * 1000:
            continue
        try:
            metadata.delete(node)
            result.nodes_removed.append(node)
        except (NotEmpty, CompactMQError):
            pass  # referenced (a range still names it: its object is for the ranges' owner), or gone
    if result.deleted or result.nodes_removed:
        log.info(
            "orphan sweep: deleted %d shared object(s), %d empty group node(s)",
            len(result.deleted),
            len(result.nodes_removed),
        )
    return result
