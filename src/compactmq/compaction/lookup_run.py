"""Lookup runs: an incremental keep-latest compaction whose cost follows the new messages.

Why
---
A chained view (``chain``) lets an incremental run *name* the old entries it keeps instead of
copying them, but the run still has to learn which old messages the new ones supersede. Doing
that with the full pipeline means handing every row of the previous view's key sidecar to the
shuffle and aggregating it again with the new rows: at 10 M messages over 1 M keys a run after
1 % new messages moved 1.1 M rows through the JVM twice to change about 100 k of them, and paid
most of a full run for it. A lookup run moves only the new rows through Spark and *looks up*
their keys in the sidecar instead.

The three steps (``jobs.lookup_job`` is the Spark shell around them)
--------------------------------------------------------------------
1. Phase one over the *new* groups only: parse, combine per task, then one Spark aggregate
   ``max((pos << 1) | tombstone)`` per 128-bit key hash over the new rows -- the latest new
   message of every key the run touched, tombstones included (a new tombstone deletes an old
   value as surely as a new value replaces it). A small run parses every new group in one
   task, whose combiner alone gives one row per key.
2. ``lookup`` (a Python task per core): loads the live rows of the previous view's sidecar
   (``old_rows``: its files minus its ``gone`` files, positions packed with this run's
   ordinals; loaded once per worker and run), finds the old row of each new key by an exact
   match of both hash halves (``superseded_rows``: one pass of the combiner's C hash table, or
   a binary search over the rows sorted by hash), and
   emits two kinds of row: the new *survivors* (the keep-latest rule: not a tombstone unless
   tombstone retention keeps it, not older than the key TTL) and the old positions they
   *supersede*.
3. Phase two, routed by group as in a full run (or, for a small run, in the same task:
   ``jobs.lookup_job``): a new group's task copies its survivors into
   the run's segment and writes their sidecar rows (``keys-<run>-<group>``); an old group's task
   (``retire_group``; every old group gets one, through a marker row) turns the positions
   superseded in its ledgers, plus the rows the key TTL, tombstone retention or topic retention
   now remove, into the chain's drops and masks (``tasks.touched_entries``, the same code a
   re-aggregating run uses) and writes them as its ``gone`` file (``view_keys``).

What grows with what
--------------------
The shuffles carry the new rows (after the per-task combiner) and the superseded positions:
both grow with the new data. The sidecar is read, not shuffled: each lookup worker reads its
columns once (about 0.2 s per million keys, from local Parquet; a worker keeps up to
``CACHE_ROWS`` of them for the run's old groups, and keeps the files it read for later runs,
``view_keys._columns``), and each old group's task reads its own ledgers' rows. Reading the
sidecar is the part that still grows with the view. Over a large view (more than
``jobs.lookup_job.SPLIT_OLD_ENTRIES`` entries) the new keys are broadcast instead and each old
group's task looks them up in its own rows (``superseded_in``): the view is read once, in
parallel, by the tasks that retire its rows. For an old group only the entries that lost a
message are worked on (masks, drops). Nothing is rewritten that did not change: unchanged old
entries stay where they are, an old batch that lost some messages gets a mask, and the sidecar
gains one file of new rows and one of retired ones per group.

When it applies
---------------
Keep-latest only, on a run that extends a local chain whose sidecar is usable
(``LedgerCompactionService`` decides, ``compactionChainDeltaRuns`` turns it off); keep-first,
event-time and user strategies, fresh chains and views in the object store use the
re-aggregating pipeline. Both give the same view: the parity tests compare them.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional

import numpy as np

from ..errors import CompactionError
from . import entry_scan as es
from . import message_rows as mr
from .plan import COMPACTED, RunPlan

# the kinds of row the lookup emits (and phase two routes)
SURVIVOR, SUPERSEDED, MARKER = 0, 1, 2

ROW_DDL = "pos long, h1 long, h2 long, tomb long, kind byte"

# the previous view's live sidecar rows, loaded once per worker process and run (up to
# CACHE_ROWS of them, about 33 bytes each: a worker keeps them until its next lookup run)
_old_cache: dict = {}
_order_cache: dict = {}
CACHE_ROWS = 8_000_000


def compacted_segments(plan: RunPlan) -> list:
    return [s for s in plan.segments if s.kind == COMPACTED]


def old_groups(plan: RunPlan) -> list[int]:
    return [g for g, ords in enumerate(plan.groups) if plan.segments[ords[0]].kind == COMPACTED]


def new_groups(plan: RunPlan) -> list[int]:
    return [g for g, ords in enumerate(plan.groups) if plan.segments[ords[0]].kind != COMPACTED]


def marker_position(plan: RunPlan, group: int) -> int:
    """A packed position inside old ``group`` (its first segment's first id) that routes a
    marker row to the group's phase-two task."""
    seg = plan.segments[plan.groups[group][0]]
    return (seg.ordinal << (es.ENTRY_BITS + es.BATCH_BITS)) | (
        min(int(seg.entry_lo), (1 << es.ENTRY_BITS) - 1) << es.BATCH_BITS
    )


def old_rows(plan: RunPlan, segments: Optional[list] = None) -> mr.Rows:
    """The live rows of the previous view's sidecar in ``segments`` (all compacted segments by
    default), in position order, positions packed with the plan's ordinals."""
    from . import view_keys

    source = plan.view_keys
    if source is None:
        raise CompactionError("a lookup run needs the previous view's key sidecar")
    cached = _old_cache.get(plan.run_dir)
    if segments is not None:
        if cached is None:  # this worker looked nothing up: read only these ledgers' rows
            parts = view_keys.segment_rows(source, segments, False)
            return mr.Rows.concat(parts) if parts else mr.no_rows()
        shift = es.ENTRY_BITS + es.BATCH_BITS
        lo = min(s.ordinal for s in segments) << shift
        hi = (max(s.ordinal for s in segments) + 1) << shift
        a, b = np.searchsorted(cached.pos, [lo, hi])
        return cached.take(slice(int(a), int(b)))
    if cached is None:
        parts = view_keys.segment_rows(source, compacted_segments(plan), False)
        rows = mr.Rows.concat(parts) if parts else mr.no_rows()
        _old_cache.clear()
        _order_cache.clear()
        if len(rows) <= CACHE_ROWS:
            _old_cache[plan.run_dir] = rows
        return rows
    return cached


def survives(plan: RunPlan, pos: np.ndarray, tomb: np.ndarray) -> np.ndarray:
    """The keep-latest rule for a key's latest message (``pipeline.keep_latest``'s, in numpy):
    not a tombstone unless tombstone retention keeps it, and not below the key TTL's cut."""
    live = ~tomb.astype(bool)
    if plan.tombstones_from is not None:
        live |= pos >= int(plan.tombstones_from)
    if plan.drop_before:
        live &= pos >= int(plan.drop_before)
    return live


def match(old_h1, old_h2, new_h1, new_h2, old_order=None) -> tuple[np.ndarray, np.ndarray]:
    """Indexes ``(i, j)`` with ``old[i] == new[j]`` on both hash halves; keys are unique on
    each side. ``old_order``: ``argsort(old_h1)`` when the caller has it (``by_hash``): the new
    keys, sorted, are binary-searched in the old ones, then checked on ``h2``."""
    z = np.zeros(0, np.int64)
    if not len(new_h1) or not len(old_h1):
        return z, z
    if old_order is None:
        old_order = np.argsort(old_h1, kind="stable")
    sorted_h1 = old_h1[old_order]
    ns = np.argsort(new_h1, kind="stable")
    lo = np.searchsorted(sorted_h1, new_h1[ns], side="left")
    hi = np.searchsorted(sorted_h1, new_h1[ns], side="right")
    count = hi - lo  # old rows sharing each new key's h1: almost always 0 or 1
    total = int(count.sum())
    if not total:
        return z, z
    first = np.cumsum(count) - count
    k = np.repeat(lo, count) + (np.arange(total) - np.repeat(first, count))
    i = old_order[k]
    j = np.repeat(ns, count)
    same = old_h2[i] == new_h2[j]
    return i[same].astype(np.int64), j[same].astype(np.int64)


def by_hash(rows: mr.Rows) -> np.ndarray:
    """``argsort`` of ``rows.h1`` (remembered with the cached rows, ``old_rows``)."""
    if _order_cache.get("rows") is not rows:
        _order_cache.clear()
        _order_cache.update(rows=rows, order=np.argsort(rows.h1, kind="stable"))
    return _order_cache["order"]


def superseded_rows(old: mr.Rows, h1: np.ndarray, h2: np.ndarray) -> np.ndarray:
    """Indexes of the ``old`` rows whose key is one of the new keys ``(h1, h2)`` (unique): with
    the extension, the map-side combiner's hash table over the old rows then the new ones (an
    old row that is not the last of its key has a new one after it: one pass, no sort), else
    ``match``."""
    from . import native

    lib = native.library()
    if lib is None:
        return match(old.h1, old.h2, h1, h2, by_hash(old))[0]
    last = native.last_per_key(lib, np.r_[old.h1, h1], np.r_[old.h2, h2])
    return np.flatnonzero(~last[: len(old)])


def superseded_in(rows: mr.Rows, h1: np.ndarray, h2: np.ndarray) -> np.ndarray:
    """Packed positions of the old ``rows`` (a group's) whose key is one of the new keys
    ``(h1, h2)``: what a newer message supersedes (a keyless row is a key of its own)."""
    i = superseded_rows(rows, np.asarray(h1, np.int64), np.asarray(h2, np.int64))
    return rows.pos[i[(rows.flags[i] & es.FLAG_KEYLESS) == 0]]


def lookup(plan: RunPlan, h1, h2, p2) -> dict:
    """Step 2 for one partition of the new keys (``h1, h2`` and ``p2 = pos << 1 | tombstone``,
    one row per key): columns of ``ROW_DDL`` -- the survivors among them, then the old
    positions they supersede."""
    h1, h2, p2 = (np.asarray(a, np.int64) for a in (h1, h2, p2))
    pos, tomb = p2 >> 1, p2 & 1
    old = old_rows(plan)
    i = superseded_rows(old, h1, h2)
    i = i[(old.flags[i] & es.FLAG_KEYLESS) == 0]  # a keyless row is a key of its own
    live = survives(plan, pos, tomb)
    gone = old.pos[i]
    n, g = int(live.sum()), len(gone)
    z = np.zeros(g, np.int64)
    return {
        "pos": np.r_[pos[live], gone],
        "h1": np.r_[h1[live], z],
        "h2": np.r_[h2[live], z],
        "tomb": np.r_[tomb[live], z],
        "kind": np.r_[np.full(n, SURVIVOR, np.int8), np.full(g, SUPERSEDED, np.int8)],
    }


def retire_group(
    plan: RunPlan,
    group: int,
    superseded: np.ndarray,
    stats: Optional[dict] = None,
    rows: Optional[mr.Rows] = None,
) -> dict:
    """Step 3 for old ``group``: what the run drops and masks of its entries, and its ``gone``
    sidecar file. ``superseded``: the packed positions of its messages newer ones replace.
    ``stats`` gains ``messages`` (the group's live rows, as a re-aggregating run would count
    them read) and ``keyless`` (retained keyless messages that stay)."""
    from . import tasks, view_keys

    chained = plan.chain
    if chained is None:
        raise CompactionError("a lookup run writes a local chain")
    segments = [plan.segments[o] for o in plan.groups[group]]
    if rows is None:  # (given: the caller loaded the group's rows to look keys up in them)
        rows = old_rows(plan, segments)
    superseded = tasks.sorted_runs(np.sort(np.asarray(superseded, np.int64)))[0]
    at = np.searchsorted(rows.pos, superseded)  # rows are in position order
    if len(superseded) and (
        int(at[-1]) >= len(rows) or (rows.pos[np.minimum(at, len(rows) - 1)] != superseded).any()
    ):
        raise CompactionError("a superseded message of the previous view is missing from its key sidecar")
    gone = np.zeros(len(rows), bool)
    gone[at] = True
    tomb = (rows.flags & es.FLAG_TOMBSTONE) != 0
    if plan.drop_before or plan.tombstones_from is not None or tomb.any():
        gone |= ~survives(plan, rows.pos, tomb)
    # only the entries that lost a message change (a mask or a drop): what the work follows
    idx = _entries_rows(rows.pos, gone)
    old = rows.pos[idx]
    out = tasks.retire_entries(
        plan, group, old[~gone[idx]], chained, old=old, messages=len(rows) - int(np.count_nonzero(gone))
    )
    kept_flags = rows.flags[~gone]
    out["tombstones"] = int(np.count_nonzero(kept_flags & es.FLAG_TOMBSTONE))
    trimmed = _trimmed_rows(plan, segments)
    lids, ids = _ledger_ids(plan, np.r_[rows.pos[gone], trimmed])
    name = ""
    if len(ids):
        name = view_keys.gone_name(int(chained["run"]), group)
        view_keys.write_gone(os.path.join(plan.run_dir, view_keys.STORE_DIR, name), lids, ids)
    out["keys"] = name
    out.setdefault("dropped", b"")
    out.setdefault("masks", b"")
    if stats is not None:
        stats["messages"] = stats.get("messages", 0) + len(rows)
        stats["keyless"] = stats.get("keyless", 0) + int(np.count_nonzero(kept_flags & es.FLAG_KEYLESS))
    return out


def _entries_rows(pos: np.ndarray, hit: np.ndarray) -> np.ndarray:
    """Indexes of every row of ``pos`` (packed positions, sorted) in an entry where ``hit`` is
    true for some row."""
    from . import tasks

    entry = pos >> es.BATCH_BITS
    touched = tasks.sorted_runs(entry[hit])[0]
    lo = np.searchsorted(entry, touched, side="left")
    hi = np.searchsorted(entry, touched, side="right")
    n = hi - lo
    starts = np.cumsum(n) - n
    return np.arange(int(n.sum()), dtype=np.int64) + np.repeat(lo - starts, n)


def _trimmed_rows(plan: RunPlan, segments: list) -> np.ndarray:
    """Packed positions of the sidecar rows below a segment's ``entry_lo`` (topic retention
    trimmed the view there; the run drops those entries), so they are retired too."""
    from . import view_keys

    cut = [dataclasses.replace(s, entry_lo=0) for s in segments if s.entry_lo > 0]
    if not cut:
        return np.zeros(0, np.int64)
    lo = {s.ordinal: int(s.entry_lo) << es.BATCH_BITS for s in segments}
    out = []
    for r in view_keys.segment_rows(plan.view_keys, cut, False):
        ords = r.pos >> (es.ENTRY_BITS + es.BATCH_BITS)
        ids = r.pos & ((1 << (es.ENTRY_BITS + es.BATCH_BITS)) - 1)
        below = ids < np.array([lo[int(o)] for o in ords], np.int64) if len(ords) else ids < 0
        out.append(r.pos[below])
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def _ledger_ids(plan: RunPlan, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(ledger ids, ids)`` of packed positions, sorted (the sidecar's own numbering)."""
    positions = np.sort(np.asarray(positions, np.int64))
    ledger_of = np.array([s.ledger_id for s in plan.segments], np.int64)
    ords = positions >> (es.ENTRY_BITS + es.BATCH_BITS)
    ids = positions & ((1 << (es.ENTRY_BITS + es.BATCH_BITS)) - 1)
    return (ledger_of[ords] if len(ords) else np.zeros(0, np.int64)), ids
