"""The manifest of the view a local chain run writes, from the segments its tasks wrote.

A fresh chain names every segment the run wrote. An incremental run (``chain``: it extends the
previous view's chain) names the previous chain's segments plus its own, and records which of
the previous view's entries it drops (``dropped_entries``): those the tasks reported (every
message of the entry lost), every entry of a compacted group no survivor reached (no task ran
for it), and those topic retention removed (below the first entry the plan keeps).

The manifest also carries each ledger's live entry count and their total (``previous_view``
explains why: the next run plans from them without opening the view). The runner calls
``build`` once the engine is done and before the commit; nothing here touches the metadata
store.
"""

from __future__ import annotations

import os

import numpy as np

from . import chain, previous_view
from .plan import COMPACTED, RunPlan


def build(plan: RunPlan, parts: list[dict], prev, prev_start: int) -> tuple[chain.Manifest, int]:
    """The new view's manifest and its entry count. ``prev``: the view in force
    (``previous_view.PreviousView``, None for a fresh chain's first run); ``prev_start``: its
    first entry retention keeps."""
    written = [p for p in parts if p["entries"]]
    segments = [(os.path.basename(p["path"]), p["entries"], os.path.getsize(p["path"])) for p in written]
    assert plan.chain is not None
    incremental = plan.chain["incremental"]
    # the entries new to the view: all of a fresh chain's, a chained run's new groups' only
    # (an old group's segment rewrites entries the view already counts)
    fresh_parts = [p for p in written if plan.segments[plan.groups[p["group"]][0]].kind != COMPACTED]
    counted = fresh_parts if incremental else written
    added = previous_view.part_counts(counted)
    if added is None:
        added = previous_view.segment_counts([p["path"] for p in counted])
    if not incremental:
        manifest, entries = chain.Manifest.fresh(segments), sum(p["entries"] for p in written)
        manifest.ledgers = previous_view.ledger_counts(None, np.zeros(0, np.int64), added, entries)
    else:
        assert prev is not None and prev.manifest is not None
        lids, eids = dropped_entries(plan, parts, prev, prev_start)
        from . import tasks

        masks = tasks.decode_masks([p.get("masks") or b"" for p in parts])
        manifest = prev.manifest.extended(segments, lids, eids, masks)
        entries = len(prev) - len(lids) + sum(p["entries"] for p in fresh_parts)
        before = prev.manifest.ledgers
        if before is None:  # a manifest from before the counts: the plan opened the view
            before = np.stack(prev.ledger_runs(0), axis=1).reshape(-1, 2)
        manifest.ledgers = previous_view.ledger_counts(before, lids, added, entries)
    manifest.entries = entries if manifest.ledgers is not None else None
    return manifest, entries


def dropped_entries(plan: RunPlan, parts: list[dict], prev, start: int) -> tuple:
    """``(ledger ids, entry ids)`` of the previous view's entries this run drops (module
    docstring), sorted, each once."""
    chunks = []
    for p in parts:
        raw = p.get("dropped") or b""
        if raw:
            chunks.append(np.frombuffer(bytes(raw), ">i8").astype(np.int64).reshape(-1, 2))
    reported = {p["group"] for p in parts}
    for g, ords in enumerate(plan.groups):
        if g in reported or plan.segments[ords[0]].kind != COMPACTED:
            continue
        for o in ords:
            seg = plan.segments[o]
            lo, hi = prev.ledger_range(seg.ledger_id)
            e = prev.columns(lo, hi)[1]
            e = e[(e >= seg.entry_lo) & (e <= seg.entry_hi)]
            chunks.append(np.stack([np.full(len(e), seg.ledger_id, np.int64), e], axis=1))
    if start:
        chunks.append(np.stack(prev.columns(0, start)[:2], axis=1))
    if not chunks:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    pairs = np.concatenate(chunks)
    order = np.lexsort((pairs[:, 1], pairs[:, 0]))
    pairs = pairs[order]
    if len(pairs) > 1:  # the same entry reported twice (it cannot be, but a drop is a set)
        keep = np.ones(len(pairs), bool)
        keep[1:] = (pairs[1:] != pairs[:-1]).any(axis=1)
        pairs = pairs[keep]
    return pairs[:, 0], pairs[:, 1]
