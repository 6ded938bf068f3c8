"""The merged index of a chained view: which stored copy serves each position, and how to find it.

A chained view (``chain``) is a list of segments written by successive runs, plus the positions
later runs dropped and the masks they put on old batches. A reader needs ONE sorted index over
all of that -- for each position still in the view, the row of the segment copy that serves it
(the latest run's; for a masked position, the latest earlier copy, its *base*) and the mask to
apply -- so that ``find``/``read``/``last`` stay a binary search (``compacted_ledger``).

Two ways to build it, with the same result:

* ``merge_index``: everything in memory at once. The segments' indexes, the dropped positions and
  the masks are concatenated, sorted by (position, run) unless they already are (a fresh chain's
  segments are disjoint and in order: no sort), and the last row of each position wins.
* ``merge_chunked``: for views too large to hold that way. Each sorted block of rows (a segment's
  index, the dropped positions, the masks) is read in place through ``SortedRows`` (a memory-map
  with every ``SAMPLE``-th position in memory); the merge goes range by range (``MERGE_CHUNK``
  stored rows at a time) and a result of more than ``SPILL_ENTRIES`` entries is written to a
  memory-mapped temporary file. ``MergedIndex`` is what it returns; ``find_sampled`` and ``bisect``
  search it and the blocks.

``chain`` re-exports these names, so code that reads ``chain.merge_index`` keeps working.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..errors import StorageError


def merge_index(
    ledger_ids: list,
    entry_ids: list,
    runs: list[int],
    dropped: np.ndarray,
    masks: Optional[np.ndarray] = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One sorted index over the segments of a chain (given in chain order, run by run):
    ``(ledger_ids, entry_ids, row, mask)`` where ``row`` numbers the entry's stored copy among
    the concatenated segment indexes (segment ``k``'s rows follow those of segments ``< k``) and
    ``mask`` is the row of ``masks`` applying to it (-1: none). For each position the latest run
    wins; dropped positions are left out; a position whose latest run is a mask reads the latest
    stored copy of an earlier run (its *base*) through that mask. ``runs`` is each segment's run.

    All in memory at once: ``merge_chunked`` computes the same index range by range, which is
    what a reader of a large view uses."""
    lids = np.concatenate(ledger_ids).astype(np.int64) if ledger_ids else np.zeros(0, np.int64)
    eids = np.concatenate(entry_ids).astype(np.int64) if entry_ids else np.zeros(0, np.int64)
    if masks is None:
        from .chain import MASK_DTYPE  # (chain imports this module: not at the top)

        masks = np.zeros(0, MASK_DTYPE)
    n = len(lids)
    rows = np.arange(n, dtype=np.int64)
    if not len(dropped) and not len(masks) and _strictly_increasing(lids, eids):
        return lids, eids, rows, np.full(n, -1, np.int64)  # a fresh chain: disjoint, in order
    seg_runs = np.concatenate(
        [np.full(len(x), r, np.int64) for x, r in zip(ledger_ids, runs)] or [np.zeros(0, np.int64)]
    )
    return _merge_core(
        np.concatenate([lids, dropped["ledger_id"].astype(np.int64), masks["ledger_id"].astype(np.int64)]),
        np.concatenate([eids, dropped["entry_id"].astype(np.int64), masks["entry_id"].astype(np.int64)]),
        np.concatenate([seg_runs, dropped["run"].astype(np.int64), masks["run"].astype(np.int64)]),
        np.concatenate(
            [rows, np.full(len(dropped), -1, np.int64), -2 - np.arange(len(masks), dtype=np.int64)]
        ),
    )


def _merge_core(all_l, all_e, all_r, tags) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``merge_index`` of rows given as positions, runs and tags (>= 0 a stored row, -1 a drop,
    -2 - m mask m), every row of a position among them."""
    # by run first, then a stable sort by position: each position's rows end up in run order (a
    # run holds at most one copy, drop or mask of a position)
    pre = np.argsort(all_r, kind="stable")
    all_l, all_e, tags = all_l[pre], all_e[pre], tags[pre]
    if (
        len(all_l)
        and all_l.min() >= 0
        and all_l.max() < (1 << 38)
        and all_e.min() >= 0
        and all_e.max() < (1 << 25)
    ):
        # one packed key: the stable sort (timsort) merges the already sorted runs of the chain
        order = np.argsort((all_l << 25) | all_e, kind="stable")
    else:
        order = np.lexsort((np.arange(len(all_l)), all_e, all_l))
    sl, se, st = all_l[order], all_e[order], tags[order]
    k = len(sl)
    last = np.ones(k, bool)
    first = np.ones(k, bool)
    if k > 1:
        last[:-1] = (sl[1:] != sl[:-1]) | (se[1:] != se[:-1])
        first[1:] = last[:-1]
    # the latest stored row at or before each item, within its position
    idx = np.arange(k, dtype=np.int64)
    base = np.maximum.accumulate(np.where(st >= 0, idx, -1)) if k else idx
    group_start = np.maximum.accumulate(np.where(first, idx, 0)) if k else idx
    keep = last & (st != -1)
    masked = keep & (st <= -2)
    if (base[masked] < group_start[masked]).any():
        raise StorageError("a chain manifest masks an entry no earlier run stored")
    row = np.where(masked, st[np.maximum(base, 0)], st)
    mask = np.where(masked, -2 - st, -1)
    return sl[keep], se[keep], row[keep], mask[keep]


# --- large views: sorted rows read in place, the merged index range by range -------------------

#: every SAMPLE-th position of a sorted block of rows is kept in memory (``SortedRows``)
SAMPLE = 1024
#: stored rows merged at once by ``merge_chunked`` (about; a merge takes ~160 bytes a row of it)
MERGE_CHUNK = 1 << 18
#: a merged index of more entries than this is kept in a temporary file, memory-mapped
SPILL_ENTRIES = 1 << 20


class SortedRows:
    """Rows sorted by ``(ledger_id, entry_id)`` -- a segment's index, a manifest's dropped
    positions or masks -- read where they are (a structured array over a memory-mapped file, in
    the file's big-endian layout), never copied whole: only every ``SAMPLE``-th position is held
    in memory, so ``find`` is a binary search of that sample and then of one slice of at most
    ``SAMPLE`` rows, and the memory a view takes does not grow with its entries."""

    def __init__(self, rows: np.ndarray) -> None:
        self.rows = rows
        picked = rows[::SAMPLE]
        self.sample_l = picked["ledger_id"].astype(np.int64)
        self.sample_e = picked["entry_id"].astype(np.int64)

    def __len__(self) -> int:
        return len(self.rows)

    def positions(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        part = self.rows[lo:hi]
        return part["ledger_id"].astype(np.int64), part["entry_id"].astype(np.int64)

    def find(self, ledger_id: int, entry_id: int) -> int:
        """Index of the first row at or after ``(ledger_id, entry_id)`` (``len`` when none)."""
        return find_sampled(self.sample_l, self.sample_e, len(self), self.positions, ledger_id, entry_id)


def find_sampled(sample_l, sample_e, n: int, positions, ledger_id: int, entry_id: int) -> int:
    """The first index at or after ``(ledger_id, entry_id)`` among ``n`` sorted positions, given
    every ``SAMPLE``-th of them and ``positions(lo, hi)`` for the others."""
    k = bisect(sample_l, sample_e, ledger_id, entry_id)  # sample[k - 1] < target <= sample[k]
    if k == 0:
        return 0
    lo = (k - 1) * SAMPLE + 1
    hi = min(n, k * SAMPLE) if k < len(sample_l) else n
    if hi <= lo:
        return lo
    lids, eids = positions(lo, hi)
    return lo + bisect(lids, eids, ledger_id, entry_id)


def bisect(lids: np.ndarray, eids: np.ndarray, ledger_id: int, entry_id: int) -> int:
    """The first index at or after ``(ledger_id, entry_id)`` in sorted native arrays."""
    lo = int(np.searchsorted(lids, ledger_id, side="left"))
    hi = int(np.searchsorted(lids, ledger_id, side="right"))
    return lo + int(np.searchsorted(eids[lo:hi], entry_id, side="left"))


@dataclass
class MergedIndex:
    """What ``merge_chunked`` returns: per entry of the view its stored row (among the
    concatenated segment indexes) and its mask (-1: none; ``mask`` is None when no entry has
    one), and every ``SAMPLE``-th entry's position (for ``find_sampled``)."""

    row: np.ndarray
    mask: Optional[np.ndarray]
    sample_l: np.ndarray
    sample_e: np.ndarray

    def __len__(self) -> int:
        return len(self.row)


def merge_chunked(
    segments: list,
    runs: list[int],
    dropped: np.ndarray,
    masks: np.ndarray,
    chunk: int = MERGE_CHUNK,
    spill: int = SPILL_ENTRIES,
) -> MergedIndex:
    """``merge_index`` over ``segments`` (``SortedRows``, in chain order) computed one range of
    positions at a time, about ``chunk`` stored rows each, so the memory it takes is bounded by
    the chunk, not by the view; the result (8 bytes per entry, 16 with masks) is kept in an
    unlinked temporary file, memory-mapped, once it has more than ``spill`` entries. Every row
    of a position falls in the same range (ranges are cut between positions), so each range
    merges alone exactly as the whole would."""
    drops, mrows = SortedRows(dropped), SortedRows(masks)
    sizes = np.array([len(s) for s in segments], np.int64)
    starts = np.concatenate(([0], np.cumsum(sizes)))
    total = int(starts[-1])
    # cut positions: every (chunk / SAMPLE)-th of the segments' samples, in position order
    cand_l = np.concatenate([s.sample_l for s in segments] or [np.zeros(0, np.int64)])
    cand_e = np.concatenate([s.sample_e for s in segments] or [np.zeros(0, np.int64)])
    order = np.lexsort((cand_e, cand_l))
    step = max(1, chunk // SAMPLE)
    picked = order[step::step]
    cuts = sorted(set(zip(cand_l[picked].tolist(), cand_e[picked].tolist())))
    row = _allocate(total, spill)
    mask = _allocate(total, spill) if len(masks) else None
    samples_l: list = []
    samples_e: list = []
    n = 0
    any_mask = False
    bounds: list = [None, *cuts, None]
    for a, b in zip(bounds[:-1], bounds[1:]):
        ls, es, rs, ts = [], [], [], []
        for k, s in enumerate(segments):
            lo = 0 if a is None else s.find(*a)
            hi = len(s) if b is None else s.find(*b)
            if hi > lo:
                pl, pe = s.positions(lo, hi)
                ls.append(pl)
                es.append(pe)
                rs.append(np.full(hi - lo, runs[k], np.int64))
                ts.append(np.arange(starts[k] + lo, starts[k] + hi, dtype=np.int64))
        for rows, tag in ((drops, None), (mrows, True)):
            lo = 0 if a is None else rows.find(*a)
            hi = len(rows) if b is None else rows.find(*b)
            if hi > lo:
                part = rows.rows[lo:hi]
                ls.append(part["ledger_id"].astype(np.int64))
                es.append(part["entry_id"].astype(np.int64))
                rs.append(part["run"].astype(np.int64))
                ts.append(-2 - np.arange(lo, hi, dtype=np.int64) if tag else np.full(hi - lo, -1, np.int64))
        if not ls:
            continue
        kl, ke, kr, km = _merge_core(
            np.concatenate(ls), np.concatenate(es), np.concatenate(rs), np.concatenate(ts)
        )
        m = len(kr)
        row[n : n + m] = kr
        if mask is not None:
            mask[n : n + m] = km
            any_mask = any_mask or bool((km >= 0).any())
        first = (-n) % SAMPLE  # the first index of this range that is a multiple of SAMPLE
        samples_l.append(kl[first::SAMPLE].copy())  # a copy: a view would keep the whole range alive
        samples_e.append(ke[first::SAMPLE].copy())
        n += m
    empty = np.zeros(0, np.int64)
    return MergedIndex(
        row[:n],
        mask[:n] if mask is not None and any_mask else None,
        np.concatenate(samples_l) if samples_l else empty,
        np.concatenate(samples_e) if samples_e else empty,
    )


def _allocate(n: int, spill: int) -> np.ndarray:
    """An int64 array of ``n``: in memory, or past ``spill`` entries in an unlinked temporary
    file, memory-mapped (its pages are the page cache's to evict, not the process's)."""
    if n <= spill:
        return np.empty(n, np.int64)
    import tempfile

    with tempfile.TemporaryFile(prefix="cmq-merged-") as f:
        return np.memmap(f, np.int64, "w+", shape=(n,))


def _strictly_increasing(lids: np.ndarray, eids: np.ndarray) -> bool:
    if len(lids) < 2:
        return True
    dl = np.diff(lids)
    return bool(((dl > 0) | ((dl == 0) & (np.diff(eids) > 0))).all())
