"""Phase two of a compaction inside a Python worker: copy each group's surviving messages into
its part of the new compacted view.

Phase one (``tasks``) turned every group of segments into rows and the job chose, per key, the
message that survives. A phase-two task gets one group and the sorted positions of its
survivors (``copy_group``) and writes them, in id order, as stored entries: an entry whose
messages all survive is copied byte for byte, a batch that lost some is rewritten
(``batch_rewrite``). Where the part goes depends on the view's layout:

* a **one-file view**: ``part-NNNNNN`` in the run directory, joined by the driver at commit;
* a **chained view** (``chain``): a complete compacted-ledger segment of the chain; an
  incremental run leaves the previous view's untouched batches where they are and records the
  entries that lost messages as *masks* (``encode_masks`` / ``decode_masks``, ``retire_entries``
  and ``touched_entries`` find them) instead of rewriting them;
* **tiered storage** (``plan.store``): a scratch file of the task, uploaded to the
  object store, so the driver's disk is never needed.

With ``keys`` the task also writes its rows of the new view's key sidecar (``view_keys``).
``sorted_runs`` / ``sorted_isin`` are numpy helpers the copies share. Plain
functions of a ``RunPlan`` and numpy arrays, no Spark, as in ``tasks``; ``tasks`` still exports
these names (``tasks.copy_group``...), so callers need not know of the split.
"""

from __future__ import annotations

import os
from typing import Optional

import numpy as np

from ..errors import CompactionError
from . import batch_rewrite
from . import entry_scan as es
from .compacted_writer import PartWriter
from .plan import COMPACTED, RunPlan
from .tasks import _locate, chunks, gather, load_live, load_pieces, reached


def copy_group(plan: RunPlan, group: int, positions: np.ndarray, keys: Optional[dict] = None) -> dict:
    """Copy the surviving messages ``positions`` (sorted, all in ``group``) into the group's part
    file: per segment in id order, raw bytes of each surviving entry, batches rewritten.

    ``keys`` (``h1``, ``h2``, ``tomb`` and, for event-time, ``et``: arrays aligned with
    ``positions``): also write the part's rows of the new view's key sidecar (``view_keys``),
    ``keys-NNNNNN.parquet`` in the run directory's ``keys`` folder; the result names it.

    With ``plan.store`` (tiered storage configured) the part goes straight to the object
    store, as ``<plan.prefix>/part-NNNNNN`` (and ``.idx``, and the sidecar file under
    ``keys/``): written to a scratch file of this task, then uploaded, so the driver's disk is
    never needed."""
    from . import view_keys

    reached(plan, "phase-two-task")
    store = plan.store
    chained = plan.chain
    # a lookup run's sidecar files join the previous view's, so their names carry the run
    run = int(chained["run"]) if chained is not None and chained.get("lookup") else None
    name = view_keys.part_name(group, run) if keys is not None else None
    if store is None and chained is not None:
        out = _copy_group_to_segment(plan, group, positions, chained)
        if name is not None:
            _write_keys(plan, positions, keys, os.path.join(plan.run_dir, view_keys.STORE_DIR, name))
        out["keys"] = name
        return out
    if store is None:
        out = _copy_group_to(plan, group, positions, plan.part_path(group))
        if name is not None:
            _write_keys(plan, positions, keys, os.path.join(plan.run_dir, view_keys.STORE_DIR, name))
        out["keys"] = name
        return out
    import shutil
    import tempfile

    from ..storage.offload import open_store

    scratch = tempfile.mkdtemp(prefix="compactmq-part-")
    try:
        out = _copy_group_to(plan, group, positions, os.path.join(scratch, "part"))
        key = f"{plan.prefix}/part-{group:06d}"
        blobs = open_store(store)
        if name is not None:
            local = os.path.join(scratch, name)
            _write_keys(plan, positions, keys, local)
            blobs.put_file(f"{plan.prefix}/{view_keys.STORE_DIR}/{name}", local)
        blobs.put_file(key + ".idx", out["path"] + ".idx")
        blobs.put_file(key, out["path"])
        out["path"] = key
        out["keys"] = name
        return out
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _copy_group_to_segment(plan: RunPlan, group: int, positions: np.ndarray, chained: dict) -> dict:
    """The group's segment of a chained view (``chain``), a complete compacted-ledger file named
    ``chain.segment_name(run, group)`` in ``chained["dir"]`` (none when it would be empty).

    In an incremental run (``chained["incremental"]``) a group of the previous view's entries
    goes through ``retire_entries``. ``messages`` counts every survivor of the group."""
    segments = [plan.segments[o] for o in plan.groups[group]]
    if chained.get("incremental") and segments and all(s.kind == COMPACTED for s in segments):
        return retire_entries(plan, group, positions, chained)
    out = _copy_group_to(plan, group, positions, _segment_path(plan, group, chained), complete=True)
    return _finish_segment(out, len(positions))


def retire_entries(
    plan: RunPlan,
    group: int,
    positions: np.ndarray,
    chained: dict,
    old: Optional[np.ndarray] = None,
    messages: Optional[int] = None,
) -> dict:
    """What an incremental run does to old ``group`` whose surviving messages are ``positions``
    (sorted; ``old``: every message the group held before, read from the key sidecar when not
    given; a caller may pass both for only the entries that lost a message, and the group's
    surviving ``messages`` then): write nothing of an unchanged entry, report in ``dropped`` (raw ``>i8`` pairs
    ledger id, entry id) the old entries that lost every message and, for an old batch that
    lost some, a *mask* in ``masks`` (``encode_masks``: the batch indexes it keeps; ``chain``),
    or with ``chained["masks"]`` false rewrite it under its own position into the run's segment
    (the older way, kept to check that both give the same bytes)."""
    segments = [plan.segments[o] for o in plan.groups[group]]
    copy, dropped = touched_entries(plan, segments, positions, old)
    masks = b""
    if chained.get("masks", True):
        masks = encode_masks(plan, copy)
        copy = copy[:0]
    out = _copy_group_to(plan, group, copy, _segment_path(plan, group, chained), complete=True)
    out = _finish_segment(out, len(positions) if messages is None else messages)
    out["dropped"] = dropped.tobytes()
    out["masks"] = masks
    return out


def _segment_path(plan: RunPlan, group: int, chained: dict) -> str:
    from . import chain

    return os.path.join(chained["dir"], chain.segment_name(int(chained["run"]), group))


def _finish_segment(out: dict, messages: int) -> dict:
    if out["entries"] == 0:
        os.unlink(out["path"])
        out["path"] = ""
    out["messages"] = messages
    out.setdefault("dropped", b"")
    out.setdefault("masks", b"")
    return out


MASK_ROW = np.dtype([("ledger_id", ">i8"), ("entry_id", ">i8"), ("count", ">u4")])


def encode_masks(plan: RunPlan, positions: np.ndarray) -> bytes:
    """The masks of the old entries holding ``positions`` (sorted survivors of entries that lost
    some message): ``[u64 n] n x MASK_ROW [u32 batch index] x sum(count)`` (``decode_masks``)."""
    positions = np.asarray(positions, np.int64)
    if not len(positions):
        return b""
    ords, eids, bidx = es.unpack_positions(positions)
    entry = positions >> es.BATCH_BITS
    starts = np.flatnonzero(np.r_[True, entry[1:] != entry[:-1]])
    counts = np.diff(np.r_[starts, len(entry)])
    ledger_of = np.array([s.ledger_id for s in plan.segments], np.int64)
    rows = np.zeros(len(starts), MASK_ROW)
    rows["ledger_id"], rows["entry_id"], rows["count"] = ledger_of[ords[starts]], eids[starts], counts
    return np.array([len(rows)], ">u8").tobytes() + rows.tobytes() + np.asarray(bidx, ">u4").tobytes()


def decode_masks(blobs: list) -> tuple:
    """``(ledger_ids, entry_ids, counts, kept)`` of the masks several tasks reported, in order."""
    lids, eids, counts, kept = [], [], [], []
    for raw in blobs:
        if not raw:
            continue
        raw = bytes(raw)
        (n,) = np.frombuffer(raw[:8], ">u8")
        rows = np.frombuffer(raw[8 : 8 + int(n) * MASK_ROW.itemsize], MASK_ROW)
        lids.append(rows["ledger_id"].astype(np.int64))
        eids.append(rows["entry_id"].astype(np.int64))
        counts.append(rows["count"].astype(np.int64))
        kept.append(np.frombuffer(raw[8 + int(n) * MASK_ROW.itemsize :], ">u4").astype(np.int64))
    if not lids:
        z = np.zeros(0, np.int64)
        return z, z, z, z
    return tuple(np.concatenate(x) for x in (lids, eids, counts, kept))


def touched_entries(
    plan: RunPlan, segments: list, positions: np.ndarray, old: Optional[np.ndarray] = None
) -> tuple:
    """Of compacted ``segments`` and their surviving ``positions``: the survivors in old entries
    that lost some message (to mask or rewrite) and, as ``>i8`` pairs (ledger id, entry id), the
    old entries that lost all. The previous view's messages (``old``) come from its key sidecar
    when not given."""
    if old is None:
        from . import view_keys

        sidecar = plan.view_keys
        if sidecar is None:
            raise CompactionError("an incremental chained run needs the previous view's key sidecar")
        rows = view_keys.segment_rows(sidecar, segments, False)
        old = np.concatenate([r.pos for r in rows]) if rows else np.zeros(0, np.int64)
    old_e = np.asarray(old, np.int64) >> es.BATCH_BITS
    surv_e = np.asarray(positions, np.int64) >> es.BATCH_BITS
    uo, co = sorted_runs(old_e)
    us, cs = sorted_runs(surv_e)
    at = np.searchsorted(uo, us)
    if len(us) and ((at >= len(uo)).any() or (uo[np.minimum(at, len(uo) - 1)] != us).any()):
        raise CompactionError("a survivor of the previous view is missing from its key sidecar")
    kept = np.zeros(len(uo), np.int64)
    kept[at] = cs
    rewrite = uo[(kept > 0) & (kept < co)]
    gone = uo[kept == 0]
    copy = np.asarray(positions, np.int64)[sorted_isin(surv_e, rewrite)]
    ledger_of = np.array([s.ledger_id for s in plan.segments], np.int64)
    pairs = np.empty((len(gone), 2), ">i8")
    pairs[:, 0] = ledger_of[gone >> es.ENTRY_BITS] if len(gone) else 0
    pairs[:, 1] = gone & ((1 << es.ENTRY_BITS) - 1)
    return copy, pairs.reshape(-1)


def sorted_runs(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(a, return_counts=True)`` of a sorted array, without sorting (or hashing) it."""
    if not len(a):
        return a[:0], np.zeros(0, np.int64)
    starts = np.flatnonzero(np.r_[True, a[1:] != a[:-1]])
    return a[starts], np.diff(np.r_[starts, len(a)])


def sorted_isin(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``np.isin(a, b)`` for a sorted ``b``: one binary search per element of ``a`` (numpy's isin
    hashes or sorts both arrays: several times slower on the millions of positions of a view)."""
    if not len(b):
        return np.zeros(len(a), bool)
    at = np.minimum(np.searchsorted(b, a), len(b) - 1)
    return b[at] == a


def _write_keys(plan: RunPlan, positions: np.ndarray, keys: dict, path: str) -> None:
    from . import view_keys

    ledger_of = np.array([s.ledger_id for s in plan.segments], np.int64)
    ords = np.asarray(positions, np.int64) >> (es.ENTRY_BITS + es.BATCH_BITS)
    view_keys.write_part(
        path,
        ledger_of[ords] if len(ords) else np.zeros(0, np.int64),
        positions,
        keys["h1"],
        keys["h2"],
        view_keys.flags_of(keys["tomb"], keys["h2"]),
        keys.get("et"),
    )


def _copy_group_to(
    plan: RunPlan, group: int, positions: np.ndarray, path: str, complete: bool = False
) -> dict:
    # a chain segment bypasses the page cache unless turned off (``compactionDirectIO``)
    writer = PartWriter(path, complete=complete, direct=bool(plan.chain and plan.chain.get("direct_io")))
    if len(positions) > 1 and (positions[1:] < positions[:-1]).any():
        positions = np.sort(positions)
    ords, eids, bidx = es.unpack_positions(positions)
    entries = messages = 0
    per_ledger: dict[int, int] = {}  # entries written per source ledger (the view's counts)
    # positions are sorted: each segment's survivors are one slice, and within it the entry ids
    # are sorted, so every selection below is a slice found by binary search (a boolean mask per
    # segment and per chunk would scan all the group's survivors each time: quadratic)
    mine = np.asarray(plan.groups[group], np.int64)
    bounds, ends = np.searchsorted(ords, mine, side="left"), np.searchsorted(ords, mine, side="right")
    for o, a, b in zip(plan.groups[group], bounds.tolist(), ends.tolist()):
        if a == b:
            continue
        seg = plan.segments[o]
        cand, counts = sorted_runs(eids[a:b])
        inverse = np.repeat(np.arange(len(cand), dtype=np.int64), counts)  # survivor -> its entry
        pieces = load_pieces(seg, cand) if seg.kind == COMPACTED else [load_live(seg, cand)]
        # several pieces: a chained view's entries of this ledger lie in several segments
        copy = _copy_gathered if len(pieces) > 1 else _copy_piece
        written = copy(writer, seg.ledger_id, pieces, cand, inverse, bidx[a:b])
        entries += written
        messages += b - a
        per_ledger[seg.ledger_id] = per_ledger.get(seg.ledger_id, 0) + written
    writer.close()
    ledgers = np.array(sorted(per_ledger.items()), ">i8").reshape(-1, 2)
    return {
        "group": group,
        "path": path,
        "entries": entries,
        "messages": messages,
        "ledgers": ledgers.tobytes(),
    }


def _copy_piece(writer, ledger_id: int, pieces: list, cand, inverse, bidx) -> int:
    """Copy the survivors of entries ``cand`` (sorted, all in the one piece of ``pieces``) a
    chunk of entries at a time, straight from the piece's buffer. ``inverse`` (each survivor's
    index in ``cand``) is sorted."""
    buf, seg_eids, offs, lens = pieces[0]
    at = np.searchsorted(seg_eids, cand)
    if (at >= len(seg_eids)).any() or (seg_eids[np.minimum(at, len(seg_eids) - 1)] != cand).any():
        raise CompactionError(f"surviving entries of ledger {ledger_id} vanished during compaction")
    c_offs, c_lens = offs[at], lens[at]
    written = 0
    for lo, hi in chunks(c_lens):
        sel = slice(*np.searchsorted(inverse, [lo, hi]).tolist())
        src, new_lens, extra, extra_off = batch_rewrite.rebuild_ranges(
            buf, c_offs[lo:hi], c_lens[lo:hi], inverse[sel] - lo, bidx[sel]
        )
        written += writer.append_ranges(ledger_id, cand[lo:hi], buf, src, new_lens, extra, extra_off)
    return written


def _copy_gathered(writer, ledger_id: int, pieces: list, cand, inverse, bidx) -> int:
    """Copy the survivors of entries ``cand`` (sorted, held by several pieces) a chunk of
    entries at a time, each chunk gathered into a buffer of its own (memory stays one chunk).
    ``inverse`` (each survivor's index in ``cand``) is sorted."""
    c_lens = _locate(pieces, cand)[2]
    written = 0
    for lo, hi in chunks(c_lens):
        buf, _, c_offs, cl = gather(pieces, cand[lo:hi])
        sel = slice(*np.searchsorted(inverse, [lo, hi]).tolist())
        src, new_lens, extra, extra_off = batch_rewrite.rebuild_ranges(
            buf, c_offs, cl, inverse[sel] - lo, bidx[sel]
        )
        written += writer.append_ranges(ledger_id, cand[lo:hi], buf, src, new_lens, extra, extra_off)
    return written


__all__ = [
    "copy_group",
    "retire_entries",
    "MASK_ROW",
    "encode_masks",
    "decode_masks",
    "touched_entries",
    "sorted_runs",
    "sorted_isin",
    "gather",
]
