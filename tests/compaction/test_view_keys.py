"""The key sidecar of a compacted view (``view_keys``), without Spark: the rows the next run reads
from it are exactly the rows parsing the view gives, and orphan sidecars are swept."""

from __future__ import annotations

import os

import numpy as np
import pytest

from compactmq.compaction import entry_scan as es
from compactmq.compaction import message_rows as mr
from compactmq.compaction import tasks, view_keys
from compactmq.compaction.compacted_ledger import CompactedLedgerReader, remove_orphans, topic_dir
from compactmq.compaction.compacted_writer import concatenate_parts
from compactmq.compaction.plan import RunPlan, build_groups, build_segments

from .test_tasks import _plan


def _all_rows(plan: RunPlan) -> mr.Rows:
    return mr.Rows.concat([r for g in range(len(plan.groups)) for r in tasks.group_rows(plan, g)])


def _keep_latest(rows: mr.Rows) -> np.ndarray:
    """Indexes of keep-latest survivors (the last row per key, unless a tombstone)."""
    last: dict = {}
    for i, (a, b) in enumerate(zip(rows.h1.tolist(), rows.h2.tolist())):
        last[(a, b)] = i
    keep = [i for i in last.values() if not rows.flags[i] & es.FLAG_TOMBSTONE]
    return np.array(sorted(keep, key=lambda i: rows.pos[i]), np.int64)


def _compact_with_sidecar(tmp_path, with_et: bool):
    """Phase two by hand: copy keep-latest survivors of a random topic with their sidecar rows
    into a compacted ledger; returns (storage, compacted ledger path, sidecar files)."""
    storage, plan = _plan(tmp_path, combine=False)
    rows = _all_rows(plan)
    surv = rows.take(_keep_latest(rows))
    group_of = plan.group_of_ordinal()
    ords = surv.pos >> (es.ENTRY_BITS + es.BATCH_BITS)
    parts, names = [], []
    for g in range(len(plan.groups)):
        m = np.array([group_of[o] == g for o in ords.tolist()], bool)
        if not m.any():
            continue
        keys = {"h1": surv.h1[m], "h2": surv.h2[m], "tomb": surv.flags[m] & 1}
        if with_et:
            keys["et"] = surv.event_time[m] + 7
        out = tasks.copy_group(plan, g, surv.pos[m], keys)
        parts.append(out["path"])
        names.append(os.path.join(plan.run_dir, view_keys.STORE_DIR, out["keys"]))
    path = str(tmp_path / "view.compacted")
    concatenate_parts(path, parts)
    return storage, path, names, len(surv)


def _compacted_plan(tmp_path, path: str, bound=None, strategy="keep-latest") -> RunPlan:
    reader = CompactedLedgerReader(path)
    lids, counts = np.unique(reader.ledger_ids, return_counts=True)
    ledgers = {int(l): (int(c), 0) for l, c in zip(lids, counts)}
    if bound is not None:
        ledgers = {l: (c, bound[1] if l == bound[0] else 0) for l, (c, _) in ledgers.items() if l >= bound[0]}
    # a live ledger before the view's ledgers shifts every ordinal: the sidecar must repack
    segments = build_segments({"path": path, "ledgers": ledgers}, [])
    segments = [s.__class__(**{**s.__dict__, "ordinal": s.ordinal + 3}) for s in segments]
    segments = [*_dummy(3), *segments]
    run = tmp_path / "run2"
    run.mkdir(exist_ok=True)
    groups = [g for g in build_groups(segments, 2, min_group=10) if g[0] >= 3]
    return RunPlan("t", segments, groups, str(run), strategy)


def _dummy(n: int) -> list:
    from compactmq.compaction.plan import LIVE, Segment

    return [Segment(i, i, LIVE, "", None, 0, -1, 0) for i in range(n)]


@pytest.mark.parametrize("with_et", [False, True])
def test_sidecar_rows_equal_parsed_rows(tmp_path, with_et):
    storage, path, files, kept = _compact_with_sidecar(tmp_path, with_et)
    try:
        strategy = "event-time" if with_et else "keep-latest"
        plan = _compacted_plan(tmp_path, path, strategy=strategy)
        parsed = _all_rows(plan)
        assert len(parsed) == kept > 20
        plan.view_keys = view_keys.plan_entry(files)
        fast = _all_rows(plan)
        for col in ("h1", "h2", "pos", "flags"):
            assert np.array_equal(getattr(fast, col), getattr(parsed, col)), col
        if with_et:  # the sidecar's event times are the ones phase two was given
            assert np.array_equal(fast.event_time, parsed.event_time + 7)
        # retention trimmed the view's first ids: the sidecar skips them as the parse does
        reader = CompactedLedgerReader(path)
        mid = reader.position_at(len(reader) // 2)
        plan = _compacted_plan(tmp_path, path, bound=(mid[0], mid[1]), strategy=strategy)
        parsed = _all_rows(plan)
        plan.view_keys = view_keys.plan_entry(files)
        fast = _all_rows(plan)
        assert 0 < len(fast) < kept
        assert np.array_equal(fast.pos, parsed.pos) and np.array_equal(fast.h1, parsed.h1)
    finally:
        storage.close()


def test_orphan_sweep_removes_sidecars_of_other_views(tmp_path):
    d = topic_dir(str(tmp_path), "persistent://public/default/t")
    os.makedirs(d)
    for vid in (5, 6):
        open(os.path.join(d, f"{vid:012d}.compacted"), "wb").close()
        os.makedirs(view_keys.local_dir(d, vid))
        open(os.path.join(view_keys.local_dir(d, vid), view_keys.part_name(0)), "wb").close()
    os.makedirs(view_keys.local_dir(d, 7))  # a crashed run's, without its ledger file
    assert remove_orphans(str(tmp_path), "persistent://public/default/t", keep=6) == [5]
    assert sorted(os.listdir(d)) == ["000000000006.compacted", "000000000006.keys"]


def test_a_file_read_for_a_ledger_range_is_the_same_kept_or_too_large_to_keep(tmp_path, monkeypatch):
    """``view_keys._columns``: a worker keeps a sidecar file it read whole (the next view names
    the same file); a file of more rows than it keeps is read for the asked ledgers only. Both
    give the same rows."""
    import numpy as np

    from compactmq.compaction import view_keys as vk

    path = str(tmp_path / "keys-000000.parquet")
    lids, ids = np.repeat(np.arange(10, 20), 500), np.tile(np.arange(500, dtype=np.int64) << 16, 10)
    h = np.arange(5000, dtype=np.int64)
    vk.write_part(path, lids, ids, h, h + 1, np.zeros(5000, np.int8))
    source = vk.plan_entry([path])
    cols = ("ledger_id", "id", "h1", "h2", "flags")
    monkeypatch.setattr(vk, "_file_cache", type(vk._file_cache)())
    kept = vk._columns(source, path, 12, 14, cols)
    assert len(vk._file_cache) == 1 and kept["ledger_id"].tolist() == [12] * 500 + [13] * 500 + [14] * 500
    monkeypatch.setattr(vk, "_file_cache", type(vk._file_cache)())
    monkeypatch.setattr(vk, "FILE_CACHE_ROWS", 100)
    ranged = vk._columns(source, path, 12, 14, cols)
    assert not vk._file_cache
    assert all(ranged[c].tolist() == kept[c].tolist() for c in cols)
