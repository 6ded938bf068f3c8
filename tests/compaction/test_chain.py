"""Chained compacted views (``compaction.chain``): the manifest, the merged index the reader
builds over the segments (latest run wins, drops hide), a view of the old one-file layout beside
it, and the orphan sweep that keeps every segment the view in force names."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest

from compactmq.compaction import chain
from compactmq.compaction import compacted_ledger as cl
from compactmq.compaction import compacted_writer as cw
from compactmq.errors import StorageError


def _segment(directory, run_id, group, items) -> tuple:
    """Write a complete segment of ``items`` ((ledger, entry, bytes) in id order)."""
    name = chain.segment_name(run_id, group)
    path = os.path.join(directory, name)
    w = cw.PartWriter(path, complete=True)
    for lid, eid, data in items:
        w.append(lid, eid, data)
    n = w.close()
    return name, n, os.path.getsize(path)


def _view(reader) -> list:
    return [(tuple(p), d) for p, d in reader]


def test_manifest_roundtrip_and_damage_is_refused(tmp_path):
    m = chain.Manifest.fresh([("a.seg", 3, 100), ("b.seg", 2, 80)])
    m = m.extended([("c.seg", 1, 40)], [5, 7], [1, 0])
    path = str(tmp_path / "000000000001.compacted")
    chain.write(path, m)
    back = chain.read(path)
    assert back.segments == [("a.seg", 0, 3, 100), ("b.seg", 0, 2, 80), ("c.seg", 1, 1, 40)]
    assert back.runs == 2 and back.stored == 6 and back.size == 220
    assert [(int(d["ledger_id"]), int(d["entry_id"]), int(d["run"])) for d in back.dropped] == [
        (5, 1, 1),
        (7, 0, 1),
    ]
    raw = bytearray(open(path, "rb").read())
    raw[12] ^= 0xFF
    open(path, "wb").write(bytes(raw))
    with pytest.raises(StorageError, match="checksum"):
        chain.read(path)
    open(path, "wb").write(bytes(raw[:-3]))
    with pytest.raises(StorageError, match="incomplete"):
        chain.read(path)


def test_a_chain_reads_as_one_sorted_view_latest_run_wins_and_drops_hide(tmp_path):
    d = str(tmp_path)
    run0 = [
        _segment(d, 10, 0, [(3, 0, b"a0"), (3, 1, b"a1"), (4, 0, b"b0")]),
        _segment(d, 10, 1, [(4, 5, b"b5"), (6, 0, b"c0"), (6, 2, b"c2")]),
    ]
    # run 1 rewrites (3, 1) and (6, 0), drops (4, 0) and (6, 2), adds newer entries
    run1 = [
        _segment(d, 11, 0, [(3, 1, b"A1"), (6, 0, b"C0")]),
        _segment(d, 11, 1, [(7, 0, b"n0"), (7, 3, b"n3")]),
    ]
    m = chain.Manifest.fresh(run0).extended(run1, [4, 6], [0, 2])
    path = os.path.join(d, "000000000011.compacted")
    chain.write(path, m)
    r = cl.CompactedLedgerReader(path)
    assert r.is_chain and r.segment_count == 4
    expected = [
        ((3, 0), b"a0"),
        ((3, 1), b"A1"),
        ((4, 5), b"b5"),
        ((6, 0), b"C0"),
        ((7, 0), b"n0"),
        ((7, 3), b"n3"),
    ]
    assert _view(r) == expected
    assert len(r) == 6 and r.find((4, 0)) == 2 and r.find((6, 1)) == 4 and r.find((8, 0)) == 6
    assert [tuple(p) for p, _ in r.read((3, 1), 3)] == [(3, 1), (4, 5), (6, 0)]
    assert r.entries(0, 6) == [b for _, b in expected]
    assert r.last() == ((7, 3), b"n3") and list(r.distinct_ledger_ids()) == [3, 4, 6, 7]
    assert r.entry_at(3) == b"C0"
    assert r.size_bytes == os.path.getsize(path) + m.size
    with pytest.raises(StorageError, match="single buffer"):
        r.buffer
    # a reader holds every segment: deleting files after the open changes nothing for it
    for name in m.names():
        os.unlink(os.path.join(d, name))
    assert _view(r) == expected
    with pytest.raises((StorageError, OSError)):
        cl.CompactedLedgerReader(path)


def test_a_fresh_chain_needs_no_sort_and_a_one_file_view_still_reads(tmp_path):
    d = str(tmp_path)
    segs = [_segment(d, 2, g, [(g, e, bytes([g, e])) for e in range(3)]) for g in range(3)]
    path = os.path.join(d, "000000000002.compacted")
    chain.write(path, chain.Manifest.fresh(segs))
    r = cl.CompactedLedgerReader(path)
    assert _view(r) == [((g, e), bytes([g, e])) for g in range(3) for e in range(3)]
    assert list(r.segment_ids) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    old = os.path.join(d, "000000000001.compacted")  # the old layout, one file
    w = cw.CompactedLedgerWriter(old)
    w.append(1, 1, b"x")
    w.finish()
    one = cl.CompactedLedgerReader(old)
    assert not one.is_chain and _view(one) == [((1, 1), b"x")] and bytes(one.buffer)[:8] == cl.HEADER


def test_merged_index_matches_a_dict_model_over_random_chains(tmp_path):
    rnd = random.Random(7)
    d = str(tmp_path)
    model: dict = {}
    manifest = None
    for run in range(6):
        run_id = 100 + run
        live = sorted(model)
        # rewrite some old entries, drop others, add new ones past the current end
        rewrite = sorted(rnd.sample(live, min(len(live), rnd.randint(0, 4))))
        rest = [p for p in live if p not in set(rewrite)]
        drop = sorted(rnd.sample(rest, min(len(rest), rnd.randint(0, 3))))
        top = max(live)[0] + 1 if live else 0
        new = [(top + i // 3, i % 3) for i in range(rnd.randint(1, 7))]
        for p in drop:
            del model[p]
        items = sorted([(p, b"r%d" % run) for p in rewrite] + [(p, b"n%d" % run) for p in new])
        for p, b in items:
            model[p] = b
        half = len(items) // 2
        segs = [
            _segment(d, run_id, g, [(p[0], p[1], b) for p, b in part])
            for g, part in enumerate((items[:half], items[half:]))
            if part
        ]
        if manifest is None:
            assert not drop and not rewrite
            manifest = chain.Manifest.fresh(segs)
        else:
            manifest = manifest.extended(segs, [p[0] for p in drop], [p[1] for p in drop])
        path = os.path.join(d, f"{run_id:012d}.compacted")
        chain.write(path, manifest)
        r = cl.CompactedLedgerReader(path)
        assert _view(r) == sorted(model.items())
        assert len(r) == len(model)
        for p in list(model)[:5]:
            assert tuple(r.position_at(r.find(p))) == p


def test_merge_policy():
    m = chain.Manifest.fresh([("a", 100, 1)])
    assert not chain.should_merge(m, 100, 8, 0.25)
    assert chain.should_merge(m, 70, 8, 0.25)  # 30 % of the stored entries are dead
    assert chain.should_merge(None, 0, 8, 0.25)
    for _ in range(7):
        m = m.extended([], [], [])
    assert m.runs == 8 and chain.should_merge(m, 100, 8, 0.25)
    assert chain.should_merge(chain.Manifest.fresh([]), 0, 1, 0.25)  # max runs 1: never chain


def test_orphan_sweep_keeps_every_segment_the_view_in_force_names(tmp_path, monkeypatch):
    d = str(tmp_path / "t")
    os.makedirs(d)
    monkeypatch.setattr(cl, "topic_dir", lambda data_dir, topic: d)
    older = _segment(d, 5, 0, [(1, 0, b"a")])
    mine = _segment(d, 6, 0, [(2, 0, b"b")])
    crashed = _segment(d, 7, 0, [(3, 0, b"c")])
    chain.write(
        os.path.join(d, "000000000006.compacted"), chain.Manifest.fresh([older]).extended([mine], [], [])
    )
    chain.write(os.path.join(d, "000000000007.compacted"), chain.Manifest.fresh([crashed]))
    assert cl.remove_orphans(str(tmp_path), "t", keep=6) == [7]
    assert sorted(os.listdir(d)) == sorted(["000000000006.compacted", older[0], mine[0]])
    # an unreadable manifest in force: no segment is assumed unnamed
    with open(os.path.join(d, "000000000006.compacted"), "r+b") as f:
        f.seek(10)
        f.write(b"\xff\xff")
    cl.remove_orphans(str(tmp_path), "t", keep=6)
    assert older[0] in os.listdir(d) and mine[0] in os.listdir(d)


def test_stale_segments_are_those_the_new_chain_does_not_name():
    a = chain.Manifest.fresh([("x", 1, 1), ("y", 1, 1)])
    b = a.extended([("z", 1, 1)], [], [])
    assert chain.stale_segments(a, b) == []
    assert chain.stale_segments(b, chain.Manifest.fresh([("w", 1, 1)])) == ["x", "y", "z"]
    assert chain.stale_segments(None, b) == [] and chain.stale_segments(a, None) == ["x", "y"]
    assert np.array_equal(
        chain.merge_index([np.array([1, 2])], [np.array([0, 0])], [0], np.zeros(0, chain.DROPPED_DTYPE))[2],
        [0, 1],
    )


def test_gather_copies_the_entries_of_several_segments_in_id_order():
    from compactmq.compaction.tasks import gather

    a = np.frombuffer(b"..AAA.BB", np.uint8)
    b = np.frombuffer(b"CCCC.D", np.uint8)
    pieces = [
        (a, np.array([1, 4]), np.array([2, 6]), np.array([3, 2])),
        (b, np.array([2, 7]), np.array([0, 5]), np.array([4, 1])),
    ]
    buf, eids, offs, lens = gather(pieces)
    assert list(eids) == [1, 2, 4, 7]
    assert [bytes(buf[o : o + n]) for o, n in zip(offs, lens)] == [b"AAA", b"CCCC", b"BB", b"D"]
    buf, eids, offs, lens = gather(pieces, np.array([2, 4]))
    assert [bytes(buf[o : o + n]) for o, n in zip(offs, lens)] == [b"CCCC", b"BB"]
    with pytest.raises(Exception, match="missing"):
        gather(pieces, np.array([3]))


def _rewritten(entry: bytes, kept: list) -> bytes:
    """``entry`` as phase two rewrites it to keep only batch indexes ``kept``."""
    from compactmq.compaction.batch_rewrite import rebuild_ranges

    buf = np.frombuffer(entry, np.uint8)
    src, lens, extra, xo = rebuild_ranges(buf, [0], [len(entry)], np.zeros(len(kept), np.int64), kept)
    assert lens[0] >= 0
    return bytes(extra[xo[0] : xo[0] + lens[0]]) if xo[0] >= 0 else bytes(buf[src[0] : src[0] + lens[0]])


def _masks(items) -> tuple:
    """``(ledger_ids, entry_ids, counts, kept)`` for ``Manifest.extended`` from ``[(pos, kept)]``."""
    return (
        [p[0] for p, _ in items],
        [p[1] for p, _ in items],
        [len(k) for _, k in items],
        [b for _, k in items for b in k],
    )


def test_manifest_with_masks_roundtrips_and_an_old_manifest_still_reads(tmp_path):
    m = chain.Manifest.fresh([("a.seg", 3, 100)])
    path = str(tmp_path / "000000000001.compacted")
    chain.write(path, m.extended([], [], []))
    assert open(path, "rb").read(8) == chain.MAGIC  # no masks: the first format, as before
    m = m.extended([("b.seg", 1, 10)], [1], [2], _masks([((3, 4), [0, 5]), ((1, 1), [7])]))
    m = m.extended([], [], [], _masks([((3, 4), [5])]))
    chain.write(path, m)
    assert open(path, "rb").read(8) == chain.MAGIC_MASKS
    back = chain.read(path)
    assert back.runs == 3 and back.segments == m.segments
    rows = [
        (
            int(r["ledger_id"]),
            int(r["entry_id"]),
            int(r["run"]),
            back.kept[r["offset"] : r["offset"] + r["count"]].tolist(),
        )
        for r in back.masks
    ]
    assert rows == [(1, 1, 1, [7]), (3, 4, 1, [0, 5]), (3, 4, 2, [5])]
    assert np.array_equal(back.dropped, m.dropped)
    # masks count as partly stale in the merge policy
    assert not chain.should_merge(chain.Manifest.fresh([("x", 100, 1)]), 100, 8, 0.25)
    masked = chain.Manifest.fresh([("x", 100, 1)]).extended(
        [], [], [], _masks([((1, e), [0]) for e in range(100)])
    )
    assert chain.should_merge(masked, 100, 8, 0.05) and not chain.should_merge(masked, 100, 8, 0.15)


def test_masked_entries_read_as_their_rewrite_latest_run_wins(tmp_path):
    """A mask reads its position's latest stored copy of an earlier run rewritten to the kept
    batch indexes; a later mask, rewrite or drop of the position supersedes it."""
    from . import entries as E

    d = str(tmp_path)
    b = {e: E.batch([(f"k{e}{i}", b"v%d" % i, 0) for i in range(5)], codec=pb_codec(e)) for e in range(6)}
    run0 = [_segment(d, 1, 0, [(2, e, b[e]) for e in range(6)])]
    m = chain.Manifest.fresh(run0)
    # run 1: masks 0, 1, 2, 3; run 2: masks 0 again, rewrites 1, drops 2; run 3: masks 1 (over
    # the rewrite of run 2)
    m = m.extended([], [], [], _masks([((2, 0), [1, 2, 4]), ((2, 1), [0, 3]), ((2, 2), [4]), ((2, 3), [2])]))
    r1 = _rewritten(b[1], [0, 3])
    run2 = [_segment(d, 3, 0, [(2, 1, _rewritten(r1, [3]))])]
    m = m.extended(run2, [2], [2], _masks([((2, 0), [2])]))
    m = m.extended([], [], [], _masks([((2, 1), [3])]))
    path = os.path.join(d, "000000000004.compacted")
    chain.write(path, m)
    r = cl.CompactedLedgerReader(path)
    expected = [
        ((2, 0), _rewritten(_rewritten(b[0], [1, 2, 4]), [2])),
        ((2, 1), _rewritten(_rewritten(r1, [3]), [3])),
        ((2, 3), _rewritten(b[3], [2])),
        ((2, 4), b[4]),
        ((2, 5), b[5]),
    ]
    assert _view(r) == expected
    assert r.masked_count == 3 and len(r) == 5
    assert [r.entry_at(i) for i in range(5)] == [x for _, x in expected]
    assert r.entries(1, 4) == [x for _, x in expected[1:4]]
    assert [tuple(p) for p, _ in r.read((2, 2), 2)] == [(2, 3), (2, 4)]
    # a mask over a mask is the mask of the base copy: the same bytes
    assert _rewritten(_rewritten(b[0], [1, 2, 4]), [2]) == _rewritten(b[0], [2])
    assert r.size_bytes == os.path.getsize(path) + m.size  # stored bytes: base copies and manifest
    # phase two's loader serves the masked bytes too (the next run rewrites what the view serves)
    from compactmq.compaction import tasks
    from compactmq.compaction.plan import COMPACTED, Segment

    tasks._compacted_cache.clear()
    seg = Segment(0, 2, COMPACTED, path, None, 0, 10, 0)
    buf, eids, offs, lens = tasks.gather(tasks.load_pieces(seg))
    raw = np.asarray(buf).tobytes()
    assert [(int(e), raw[o : o + n]) for e, o, n in zip(eids, offs, lens)] == [(p[1], x) for p, x in expected]
    buf, eids, offs, lens = tasks.gather(tasks.load_pieces(seg, np.array([1, 4])))
    assert eids.tolist() == [1, 4]
    # a mask with no stored copy before it is refused
    bad = chain.Manifest.fresh([]).extended([], [], [], _masks([((9, 9), [0])]))
    chain.write(path, bad)
    with pytest.raises(StorageError, match="masks an entry"):
        cl.CompactedLedgerReader(path)


def pb_codec(e: int):
    from compactmq.protocol import pulsar_pb2 as pb

    return [pb.NONE, pb.LZ4, pb.ZLIB, pb.ZSTD, pb.SNAPPY][e % 5]


def test_merged_index_with_masks_matches_a_dict_model(tmp_path):
    """Random chains of runs that store, drop and mask positions: the merged index names, for
    each live position, the latest stored copy and the latest mask after it."""
    rnd = random.Random(11)
    for _ in range(30):
        model: dict = {}  # position -> (row, mask or -1)
        lids, eids, runs, dropped, masks = [], [], [], [], []
        row = 0
        for run in range(rnd.randint(1, 6)):
            live = sorted(model)
            touched = rnd.sample(live, min(len(live), rnd.randint(0, 5)))
            new = [(run + 10, i) for i in range(rnd.randint(0, 4))]
            stored = sorted([p for p in touched if rnd.random() < 0.3] + new)
            rest = [p for p in touched if p not in stored]
            drops = [p for p in rest if rnd.random() < 0.3]
            for p in drops:
                del model[p]
                dropped.append((p[0], p[1], run))
            for p in [p for p in rest if p not in drops]:
                model[p] = (model[p][0], len(masks))
                masks.append((p[0], p[1], run, 0, 1))
            for p in stored:
                model[p] = (row, -1)
                row += 1
            if stored:
                lids.append(np.array([p[0] for p in stored]))
                eids.append(np.array([p[1] for p in stored]))
                runs.append(run)
        d = np.array(dropped, chain.DROPPED_DTYPE) if dropped else np.zeros(0, chain.DROPPED_DTYPE)
        mk = np.array(masks, chain.MASK_DTYPE) if masks else np.zeros(0, chain.MASK_DTYPE)
        sl, se, sr, sm = chain.merge_index(lids, eids, runs, d, mk)
        got = {(int(a), int(b)): (int(r), int(m)) for a, b, r, m in zip(sl, se, sr, sm)}
        assert list(zip(sl.tolist(), se.tolist())) == sorted(model)
        assert got == model
