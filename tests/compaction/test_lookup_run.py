"""Lookup runs (``compaction.lookup_run``) without Spark: the key match, the keep-latest rule, and the
chained sidecar's retired rows. The runs themselves are in the parity tests (``test_parity``),
against the reference model and against runs that re-aggregate every key."""

from __future__ import annotations

import os

import numpy as np

from compactmq.compaction import lookup_run, view_keys
from compactmq.compaction import entry_scan as es
from compactmq.compaction import message_rows as mr
from compactmq.compaction.plan import COMPACTED, RunPlan, Segment


def test_match_pairs_exactly_the_keys_equal_on_both_halves():
    rng = np.random.default_rng(7)
    # few distinct h1 values: many keys share one, so h2 must decide
    old_h1 = rng.integers(0, 40, 3000)
    old_h2 = rng.integers(-(2**62), 2**62, 3000)
    keep = np.unique(np.stack([old_h1, old_h2], 1), axis=0, return_index=True)[1]
    old_h1, old_h2 = old_h1[keep], old_h2[keep]
    pick = rng.choice(len(old_h1), 500, replace=False)
    new_h1 = np.r_[old_h1[pick], rng.integers(0, 40, 700)]
    new_h2 = np.r_[old_h2[pick], rng.integers(-(2**62), 2**62, 700)]
    i, j = lookup_run.match(old_h1, old_h2, new_h1, new_h2)
    where = {(a, b): k for k, (a, b) in enumerate(zip(old_h1.tolist(), old_h2.tolist()))}
    expected = sorted(
        (where[(a, b)], k)
        for k, (a, b) in enumerate(zip(new_h1.tolist(), new_h2.tolist()))
        if (a, b) in where
    )
    assert sorted(zip(i.tolist(), j.tolist())) == expected
    assert len(expected) == 500
    # the caller's order gives the same answer; empty sides give none
    i2, j2 = lookup_run.match(old_h1, old_h2, new_h1, new_h2, np.argsort(old_h1, kind="stable"))
    assert sorted(zip(i2.tolist(), j2.tolist())) == expected
    assert len(lookup_run.match(old_h1, old_h2, new_h1[:0], new_h2[:0])[0]) == 0
    assert len(lookup_run.match(old_h1[:0], old_h2[:0], new_h1, new_h2)[0]) == 0


def _plan(tmp_path, **kw) -> RunPlan:
    segs = [Segment(o, 10 + o, COMPACTED, "view", None, 0, 1 << 40, 10) for o in range(3)]
    return RunPlan("t", segs, [[0, 1], [2]], os.path.join(str(tmp_path), "run"), "keep-latest", **kw)


def test_the_keep_latest_rule_is_the_spark_aggregates():
    shift = es.ENTRY_BITS + es.BATCH_BITS
    pos = np.array([1 << shift, 2 << shift, 3 << shift, 4 << shift], np.int64)
    tomb = np.array([0, 1, 1, 0])
    plan = _plan(".")
    assert lookup_run.survives(plan, pos, tomb).tolist() == [True, False, False, True]
    plan = _plan(".", tombstones_from=int(3 << shift), drop_before=int(2 << shift))
    # a tombstone from the cut stays; anything below the TTL cut goes
    assert lookup_run.survives(plan, pos, tomb).tolist() == [False, False, True, True]


def test_gone_files_hide_the_rows_lookup_runs_retired(tmp_path):
    """The live rows of a chained sidecar are its rows minus every ``gone`` file's, per ledger
    (the same id in another ledger stays)."""
    lids = np.repeat([10, 11, 12], 4)
    ids = np.tile(np.array([0, 1, 2, 3], np.int64) << es.BATCH_BITS, 3)
    h = np.arange(12, dtype=np.int64) + 100
    base = str(tmp_path / "keys-000000.parquet")
    view_keys.write_part(base, lids, ids, h, h, np.zeros(12, np.int8))
    gone = str(tmp_path / view_keys.gone_name(5, 0))
    view_keys.write_gone(gone, [10, 12, 12], [1 << es.BATCH_BITS, 0, 3 << es.BATCH_BITS])
    plan = _plan(tmp_path)
    plan.view_keys = view_keys.plan_entry([base], gone=[gone])
    rows = lookup_run.old_rows(plan)
    left = [(int(p >> (es.ENTRY_BITS + es.BATCH_BITS)), int(p & ((1 << 40) - 1)) >> 16) for p in rows.pos]
    assert left == [(0, 0), (0, 2), (0, 3), (1, 0), (1, 1), (1, 2), (1, 3), (2, 1), (2, 2)]
    assert rows.h1.tolist() == [100, 102, 103, 104, 105, 106, 107, 109, 110]
    # a group's rows are a slice of the same rows
    part = lookup_run.old_rows(plan, [plan.segments[2]])
    assert part.h1.tolist() == [109, 110]


def test_superseded_rows_agree_with_and_without_the_extension(monkeypatch):
    from compactmq.compaction import native

    rng = np.random.default_rng(3)
    old_h1 = rng.integers(0, 50, 2000)
    old_h2 = rng.integers(-(2**62), 2**62, 2000)
    old = mr.Rows(
        old_h1, old_h2, np.arange(2000, dtype=np.int64), np.zeros(2000, np.int8), np.zeros(2000, np.int64)
    )
    pick = rng.choice(2000, 300, replace=False)
    new_h1 = np.r_[old_h1[pick], rng.integers(0, 50, 100)]
    new_h2 = np.r_[old_h2[pick], rng.integers(-(2**62), 2**62, 100)]
    expected = np.sort(pick)
    if native.library() is not None:
        assert np.array_equal(np.sort(lookup_run.superseded_rows(old, new_h1, new_h2)), expected)
    monkeypatch.setattr(native, "library", lambda: None)
    assert np.array_equal(np.sort(lookup_run.superseded_rows(old, new_h1, new_h2)), expected)
