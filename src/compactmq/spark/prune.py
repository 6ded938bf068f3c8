"""What pushed filters let the planner skip before any task reads a byte (the direct path).

``pushdown`` turns Spark's filters into a ``Pushed`` value; this module turns that value into
smaller splits, from what the driver can see without parsing entries:

* **Publish time**: a closed ledger's index (``.idx``) holds the publish time the broker stored
  with each entry. A ledger with no entry in the window gets no split; otherwise its split is
  narrowed to its first .. last entry in the window (the task then skips the entries between
  that are outside, and checks each message). The stored time is the metadata's, or the time of
  the write when the metadata had 0 -- such a message's ``__publishTime`` is 0, inside no window
  that starts after 0 -- so only a window with a start after 0 is read from the index (as the
  task's own entry skipping, ``direct._in_window``).
* **Message id**: a serialized id starts with ``0x08 varint(ledger) 0x10 varint(entry)``. Spark
  compares ids byte by byte, so when a ledger's prefix ``0x08 varint(ledger)`` already differs
  from a bound's first bytes, every id of that ledger is on the same side of the bound
  (``side``); the ledger is skipped or kept whole without looking at it. A ledger whose prefix
  equals the bound's is narrowed the same way by entry prefixes. Compacted splits (grouped by
  source ledger) are skipped by ledger only.
* **Keys** on ``compacted`` / ``latest``: the compacted view's key index
  (``compaction.key_index``, built from the view's key sidecar) names the one entry of the view
  that holds each key, so the compacted part becomes one split over those entries instead of a
  scan of the view. Only a view with a sidecar is looked up this way (parsing the whole view on
  the driver would cost more than the scan it saves); a hash hit is only a candidate, and the
  task compares the keys themselves.

Everything here returns a superset: each message is still checked against the split bounds and
the pushed filters in the task (``pushdown.row_mask``), and Spark checks every row again.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..compaction.entry_scan import encode_varint as varint
from .pushdown import Pushed

LEDGER_TAG = b"\x08"
ENTRY_TAG = b"\x10"


def side(prefix: bytes, bound: bytes) -> int:
    """Where every byte string that starts with ``prefix`` (and is longer than it) sorts against
    ``bound``: -1 all below, 1 all above, 0 it depends on the bytes after the prefix."""
    head = bound[: len(prefix)]
    if prefix != head:  # they differ at a byte, or the bound is shorter (a prefix of ``prefix``)
        return -1 if prefix < head else 1
    return 1 if len(bound) == len(prefix) else 0


def keeps(prefix: bytes, pushed: Pushed) -> bool:
    """Whether some id starting with ``prefix`` may lie within ``[id_lo, id_hi]``."""
    if pushed.id_lo is not None and side(prefix, pushed.id_lo) < 0:
        return False
    if pushed.id_hi is not None and side(prefix, pushed.id_hi) > 0:
        return False
    return True


def ledger_prefix(ledger_id: int) -> bytes:
    return LEDGER_TAG + varint(ledger_id)


def _entry_sides(ledger_id: int, entries: np.ndarray, bound: bytes) -> np.ndarray:
    """``side`` of each entry prefix of ``ledger_id`` against ``bound``, for all entries at once:
    the prefixes of one varint width compare with the bound's first bytes as one Arrow array."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from .arrow_columns import _varints

    raw, lens = _varints(entries)
    base = np.frombuffer(ledger_prefix(ledger_id) + ENTRY_TAG, np.uint8)
    out = np.zeros(len(entries), np.int8)
    for width in np.unique(lens).tolist():
        rows = np.flatnonzero(lens == width)
        n = len(base) + width
        data = np.hstack([np.broadcast_to(base, (len(rows), len(base))), raw[rows, :width]])
        offsets = (np.arange(len(rows) + 1, dtype=np.int64) * n).astype(np.int32)
        arr = pa.Array.from_buffers(
            pa.binary(), len(rows), [None, pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(data))]
        )
        head = pa.scalar(bound[:n], pa.binary())
        below = pc.less(arr, head).to_numpy(zero_copy_only=False)
        above = pc.greater(arr, head).to_numpy(zero_copy_only=False)
        # below but a prefix of the bound cannot happen here (the bound's head is n bytes, or
        # shorter, and then the prefix is longer and above it); equal: undecided, even when the
        # bound is exactly the prefix -- an id may BE the prefix (no batch index, no partition),
        # and then it equals the bound rather than sorting above it
        out[rows] = np.where(below, -1, np.where(above, 1, 0))
    return out


def id_entries(ledger_id: int, lo: int, hi: int, pushed: Pushed) -> tuple[int, int] | None:
    """The entries ``lo..hi`` (inclusive) of ledger ``ledger_id`` narrowed to the first and last
    whose prefix may hold an id within the pushed bounds (None: none may)."""
    if not pushed.by_id or hi < lo:
        return (lo, hi) if hi >= lo else None
    if not keeps(ledger_prefix(ledger_id), pushed):
        return None
    prefix = ledger_prefix(ledger_id)
    undecided = [b for b in (pushed.id_lo, pushed.id_hi) if b is not None and side(prefix, b) == 0]
    if not undecided:
        return lo, hi
    entries = np.arange(lo, hi + 1, dtype=np.int64)
    keep = np.ones(len(entries), bool)
    if pushed.id_lo is not None and pushed.id_lo in undecided:
        keep &= _entry_sides(ledger_id, entries, pushed.id_lo) >= 0
    if pushed.id_hi is not None and pushed.id_hi in undecided:
        keep &= _entry_sides(ledger_id, entries, pushed.id_hi) <= 0
    found = np.flatnonzero(keep)
    if not len(found):
        return None
    return int(entries[found[0]]), int(entries[found[-1]])


def time_entries(publish_times, lo: int, hi: int, start_time, end_time) -> tuple[int, int] | None:
    """The entries ``lo..hi`` narrowed to the first and last whose stored publish time is in
    ``[start_time, end_time)`` (None: none is); unchanged unless the window starts after 0."""
    if start_time is None or start_time <= 0 or publish_times is None:
        return lo, hi
    pts = np.asarray(publish_times, np.int64)[lo : hi + 1]
    keep = pts >= start_time
    if end_time is not None:
        keep &= pts < end_time
    found = np.flatnonzero(keep)
    if not len(found):
        return None
    return lo + int(found[0]), lo + int(found[-1])


def index_publish_times(path: str | None):
    """The publish times of a closed ledger's index file (None: no index, e.g. an open ledger)."""
    if path is None:
        return None
    from ..errors import StorageError
    from ..storage import ledger_file as lf

    try:
        with open(lf.index_path_for(path), "rb") as f:
            return lf.decode_index(f.read()).publish_times
    except (OSError, StorageError):
        return None


def live(splits: list, pushed: Pushed) -> list:
    """Live splits (with their ledger file paths) narrowed by publish time and message id."""
    out = []
    for s in splits:
        got: tuple | None = (s.lo, s.hi)
        if pushed.by_id:
            got = id_entries(s.ledger_id, s.lo, s.hi, pushed)
        if got is not None and s.start_time is not None and s.start_time > 0:
            pts = index_publish_times(s.path)
            if pts is not None and got[1] < len(pts):
                got = time_entries(pts, got[0], got[1], s.start_time, s.end_time)
        if got is not None:
            out.append(replace(s, lo=got[0], hi=got[1]))
    return out


def compacted(splits: list, pushed: Pushed) -> list:
    """Compacted splits (one per source ledger) without the ledgers no pushed id can be in."""
    if not pushed.by_id:
        return splits
    return [s for s in splits if s.ledger_id < 0 or keeps(ledger_prefix(s.ledger_id), pushed)]


def key_entries(storage, topic: str, view_path: str, keys: frozenset) -> tuple | None:
    """Indexes in the compacted ledger ``view_path`` of the entries holding ``keys`` (sorted),
    from the view's key index; None when the view in force is another one or has no sidecar."""
    from ..compaction.entry_scan import hash_key_py
    from ..compaction.service import LedgerCompactionService
    from ..config import load_config

    service = LedgerCompactionService(storage, topic, load_config())
    try:
        view = service.open_view()
        if view is None or view.sidecar is None or view.reader.path != view_path:
            return None
        index = view.key_index()
        found = set()
        for key in keys:
            hit = index.find(*hash_key_py(key.encode()))
            if hit is None:
                continue
            i = view.reader.find(hit.position)
            if i < len(view.reader) and tuple(view.reader.position_at(i)) == hit.position:
                found.add(i)
        return tuple(sorted(found))
    finally:
        service.close()


def restrict_compacted(splits: list, indexes: tuple) -> list:
    """The compacted splits (direct: slices ``lo..hi`` of one compacted ledger) cut down to the
    ``indexes`` each holds, as one split per compacted ledger (the entries travel with it)."""
    if not splits:
        return []
    wanted = [i for i in indexes if any(s.lo <= i < s.hi for s in splits)]
    if not wanted:
        return []
    first = splits[0]
    return [replace(first, lo=wanted[0], hi=wanted[-1] + 1, entries=tuple(wanted), ledger_id=-1)]
