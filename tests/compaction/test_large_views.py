"""Large compacted views: the reader's memory does not grow with the view.

``CompactedLedgerReader`` reads a file's index in place (``chain.SortedRows``: a sample of the
positions in memory, binary searches over the memory-mapped rows), a fresh chain as the
concatenation of its segments, and merges a chain whose runs drop, mask or store positions again
range by range (``chain.merge_chunked``), spilling the merged index to a memory-mapped temporary
file. These tests shrink the sample, the chunk and the spill threshold so small views take every
path a large one takes, and compare with the all-in-memory ``chain.merge_index`` and a model.
"""

from __future__ import annotations

import os
import random
import tracemalloc

import numpy as np
import pytest

from compactmq.compaction import chain, chain_index
from compactmq.compaction import compacted_ledger as cl
from compactmq.compaction import compacted_writer as cw


def _segment(directory, run_id, group, items) -> tuple:
    name = chain.segment_name(run_id, group)
    path = os.path.join(directory, name)
    w = cw.PartWriter(path, complete=True)
    for lid, eid, data in items:
        w.append(lid, eid, data)
    n = w.close()
    return name, n, os.path.getsize(path)


def _rows(positions, dtype=cl.INDEX_DTYPE) -> np.ndarray:
    out = np.zeros(len(positions), dtype)
    if len(positions):
        out["ledger_id"] = [p[0] for p in positions]
        out["entry_id"] = [p[1] for p in positions]
    return out


def _random_chain(rnd, masks_too: bool):
    """Runs that store new and old positions, drop and mask some: ``(per segment positions, runs,
    dropped, masks)`` as a chain manifest holds them (dropped and masks sorted by position)."""
    live: set = set()
    segs, runs, dropped, masks = [], [], [], []
    top = 0
    for run in range(rnd.randint(1, 6)):
        old = sorted(live)
        touched = rnd.sample(old, min(len(old), rnd.randint(0, 12)))
        stored = sorted({p for p in touched if rnd.random() < 0.4})
        new = []
        for _ in range(rnd.randint(0, 30)):
            top += rnd.randint(1, 3)
            new.append((top // 5, top % 5))
        rest = [p for p in touched if p not in stored]
        for p in rest:
            if masks_too and rnd.random() < 0.5:
                masks.append((p[0], p[1], run, 0, 1))
            else:
                dropped.append((p[0], p[1], run))
                live.discard(p)
        stored = sorted(stored + new)
        live.update(stored)
        cut = rnd.randint(0, len(stored))
        for part in (stored[:cut], stored[cut:]):
            if part:
                segs.append(part)
                runs.append(run)
    d = np.array(sorted(dropped), chain.DROPPED_DTYPE) if dropped else np.zeros(0, chain.DROPPED_DTYPE)
    m = np.array(sorted(masks), chain.MASK_DTYPE) if masks else np.zeros(0, chain.MASK_DTYPE)
    return segs, runs, d, m


@pytest.mark.parametrize("sample,chunk", [(2, 1), (3, 7), (5, 64), (1024, 1 << 20)])
def test_merging_range_by_range_equals_merging_at_once(monkeypatch, sample, chunk):
    monkeypatch.setattr(chain_index, "SAMPLE", sample)
    rnd = random.Random(sample * 1000 + chunk)
    for _ in range(60):
        segs, runs, dropped, masks = _random_chain(rnd, masks_too=True)
        want_l, want_e, want_row, want_mask = chain.merge_index(
            [np.array([p[0] for p in s]) for s in segs],
            [np.array([p[1] for p in s]) for s in segs],
            runs,
            dropped,
            masks,
        )
        got = chain.merge_chunked(
            [chain.SortedRows(_rows(s)) for s in segs], runs, dropped, masks, chunk=chunk, spill=4
        )
        assert np.asarray(got.row).tolist() == want_row.tolist()
        if got.mask is None:
            assert (want_mask < 0).all()
        else:
            assert np.asarray(got.mask).tolist() == want_mask.tolist()
        picks = np.arange(0, len(want_l), sample)
        assert got.sample_l.tolist() == want_l[picks].tolist()
        assert got.sample_e.tolist() == want_e[picks].tolist()
        if len(want_row) > 4:  # past the spill threshold: a memory-mapped temporary file
            assert isinstance(got.row, np.memmap)


def test_sorted_rows_find_is_the_first_position_at_or_after(monkeypatch):
    monkeypatch.setattr(chain_index, "SAMPLE", 4)
    rnd = random.Random(3)
    positions = sorted({(rnd.randint(0, 9), rnd.randint(0, 40)) for _ in range(150)})
    rows = chain.SortedRows(_rows(positions))
    for lid in range(-1, 11):
        for eid in range(-1, 42):
            want = sum(1 for p in positions if p < (lid, eid))
            assert rows.find(lid, eid) == want


@pytest.mark.parametrize("sample", [3, 1024])
def test_a_large_chain_reads_like_the_model(tmp_path, monkeypatch, sample):
    """A chain with rewrites and drops over many segments, read through every path a large view
    takes: sampled finds, a merge in small ranges, a spilled index."""
    monkeypatch.setattr(chain_index, "SAMPLE", sample)
    rnd = random.Random(sample)
    d = str(tmp_path)
    model: dict = {}
    manifest = None
    for run in range(5):
        run_id = 200 + run
        live = sorted(model)
        rewrite = sorted(rnd.sample(live, min(len(live), rnd.randint(0, 20))))
        rest = [p for p in live if p not in set(rewrite)]
        drop = sorted(rnd.sample(rest, min(len(rest), rnd.randint(0, 20))))
        top = max(live)[0] + 1 if live else 0
        new = [(top + i // 7, i % 7 * 2) for i in range(rnd.randint(20, 60))]
        for p in drop:
            del model[p]
        items = sorted([(p, b"r%d-%d" % (run, p[1])) for p in rewrite] + [(p, b"n%d" % run) for p in new])
        model.update(items)
        cuts = sorted(rnd.sample(range(1, len(items)), 3))
        segs = [
            _segment(d, run_id, g, [(p[0], p[1], b) for p, b in part])
            for g, part in enumerate(np.split(np.array(items, dtype=object), cuts))
            if len(part)
        ]
        manifest = (
            chain.Manifest.fresh(segs)
            if manifest is None
            else manifest.extended(segs, [p[0] for p in drop], [p[1] for p in drop])
        )
        path = os.path.join(d, f"{run_id:012d}.compacted")
        chain.write(path, manifest)
        r = cl.CompactedLedgerReader(path, merge_chunk=5, spill=10)
        want = sorted(model.items())
        assert [(tuple(p), x) for p, x in r] == want
        assert len(r) == len(want)
        keys = [p for p, _ in want]
        for lid in range(-1, keys[-1][0] + 2):
            for eid in range(-1, 15):
                assert r.find((lid, eid)) == sum(1 for p in keys if p < (lid, eid))
            lo, hi = r.ledger_range(lid)
            assert [p for p in keys[lo:hi]] == [p for p in keys if p[0] == lid]
        lids, counts = r.ledger_runs(3)
        u, c = np.unique([p[0] for p in keys[3:]], return_counts=True)
        assert lids.tolist() == u.tolist() and counts.tolist() == c.tolist()
        cl_l, cl_e, seg, offs, lens = r.columns(2, len(r) - 1)
        assert list(zip(cl_l.tolist(), cl_e.tolist())) == keys[2:-1]
        assert r.ledger_ids.tolist() == [p[0] for p in keys] and r.entry_ids.tolist() == [p[1] for p in keys]
        assert [bytes(r.segment_buffer(int(s))[o : o + n]) for s, o, n in zip(seg, offs, lens)] == [
            x for _, x in want[2:-1]
        ]
        assert r.last() == (want[-1][0], want[-1][1]) and r.entries(1, 4) == [x for _, x in want[1:4]]
        assert [(tuple(p), x) for p, x in r.read((keys[5][0], keys[5][1]), 4)] == want[5:9]


def _one_file(path, n):
    w = cw.CompactedLedgerWriter(path)
    for i in range(n):
        w.append(i // 1000, i % 1000, b"x")
    w.finish()


def test_opening_and_reading_a_view_takes_memory_that_does_not_grow_with_it(tmp_path):
    """A reader of a 200,000-entry view (one file, a fresh chain, a chain with drops merged in
    small ranges and spilled) allocates far less than one int64 array over its entries (1.6 MB):
    the index stays in the file."""
    n = 200_000
    one = str(tmp_path / "000000000001.compacted")
    _one_file(one, n)
    d = str(tmp_path / "chain")
    os.makedirs(d)
    segs = []
    for g in range(4):
        items = [(i // 1000, i % 1000, b"y") for i in range(g * n // 4, (g + 1) * n // 4)]
        segs.append(_segment(d, 7, g, items))
    fresh = os.path.join(d, "000000000007.compacted")
    chain.write(fresh, chain.Manifest.fresh(segs))
    extra = [_segment(d, 8, 0, [(2000, 0, b"z")])]
    dropped = chain.Manifest.fresh(segs).extended(extra, list(range(0, 100, 2)), [5] * 50)
    edited = os.path.join(d, "000000000008.compacted")
    chain.write(edited, dropped)
    cl.CompactedLedgerReader(one).read((0, 0), 1)  # imports and first-use caches, not measured
    for path, size in ((one, n), (fresh, n), (edited, n - 50 + 1)):
        tracemalloc.start()
        try:
            r = cl.CompactedLedgerReader(path, merge_chunk=1024, spill=10_000)
            assert len(r) == size
            assert r.find((50, 500)) == (50_500 if path != edited else 50_500 - 26)
            assert len(r.read((199, 990), 100)) == (10 if path != edited else 11)
            assert len(r.ledger_runs()[0]) == (200 if path != edited else 201)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 400_000, (path, peak)


def test_a_run_s_drops_and_masks_are_inserted_where_a_sort_would_put_them():
    rnd = random.Random(5)
    for big in (False, True):
        m = chain.Manifest.fresh([("a.seg", 10, 10)])
        model_d: list = []
        model_m: list = []
        for run in range(1, 6):
            base = (1 << 40) if big else 0  # past a packed key: the sorting fallback
            drops = {(base + rnd.randint(0, 20), rnd.randint(0, 30)) for _ in range(rnd.randint(0, 15))}
            masked = sorted({(rnd.randint(0, 20), rnd.randint(0, 30)) for _ in range(rnd.randint(0, 6))})
            ds = list(drops)
            rnd.shuffle(ds)
            kept = [[rnd.randint(0, 9)] for _ in masked]
            m = m.extended(
                [],
                [p[0] for p in ds],
                [p[1] for p in ds],
                ([p[0] for p in masked], [p[1] for p in masked], [1] * len(masked), [k[0] for k in kept]),
            )
            model_d += [(p[0], p[1], run) for p in drops]
            model_m += [(p[0], p[1], run, k[0]) for p, k in zip(masked, kept)]
            assert [tuple(int(x) for x in r) for r in m.dropped] == sorted(model_d)
            got = [
                (int(r["ledger_id"]), int(r["entry_id"]), int(r["run"]), int(m.kept[r["offset"]]))
                for r in m.masks
            ]
            assert got == sorted(model_m)
