"""Worker-side tasks without Spark: chunked scanning and copying give the same results."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest

from compactmq.compaction import entry_scan as es
from compactmq.compaction import message_rows as mr
from compactmq.compaction import previous_view, tasks
from compactmq.compaction.compacted_writer import read_part_index
from compactmq.compaction.plan import RunPlan, build_groups, build_segments
from compactmq.config import load_config
from compactmq.protocol import pulsar_pb2 as pb
from compactmq.storage import Storage
from compactmq.storage import ledger_file as lf
from compactmq.storage.ledger_file import index_path_for

from . import entries as E


def _plan(tmp_path, combine):
    cfg = load_config(overrides={"managedLedgerMaxEntriesPerLedger": 40, "managedLedgerSyncData": False})
    storage = Storage(str(tmp_path / "data"), cfg)
    ml = storage.open_managed_ledger("t")
    rng = random.Random(3)
    for i in range(150):
        if i % 3:
            ml.append(E.single(f"k{rng.randrange(30)}", b"" if rng.random() < 0.1 else b"v%d" % i))
        else:
            ml.append(
                E.batch(
                    [(f"k{rng.randrange(30)}", b"b%d" % j, 0) for j in range(rng.randrange(1, 6))],
                    codec=rng.choice([pb.NONE, pb.LZ4]),
                )
            )
    last = ml.last_position()
    live = [
        {
            "ledger_id": l.ledger_id,
            "path": ml.ledger_path(l.ledger_id),
            "index_path": index_path_for(ml.ledger_path(l.ledger_id)),
            "lo": 0,
            "hi": last.entry_id if l.ledger_id == last.ledger_id else 1 << 40,
            "count": max(l.entry_count, 1),
        }
        for l in ml.ledgers()
        if l.ledger_id <= last.ledger_id
    ]
    segments = build_segments(None, live)
    (tmp_path / "run").mkdir(exist_ok=True)
    return storage, RunPlan(
        "t",
        segments,
        build_groups(segments, 2, min_group=10),
        str(tmp_path / "run"),
        "keep-latest",
        combine=combine,
    )


def test_chunked_scan_and_copy_match_unchunked(tmp_path, monkeypatch):
    storage, plan = _plan(tmp_path, combine=False)
    try:

        def run(limit):
            monkeypatch.setattr(tasks, "CHUNK_BYTES", limit)
            rows = mr.Rows.concat([r for g in range(len(plan.groups)) for r in tasks.group_rows(plan, g)])
            # survivors: last row per key, not a tombstone
            last = {}
            for h1, h2, p, f in zip(
                rows.h1.tolist(), rows.h2.tolist(), rows.pos.tolist(), rows.flags.tolist()
            ):
                last[(h1, h2)] = (p, f)
            surv = np.array(sorted(p for p, f in last.values() if not f & es.FLAG_TOMBSTONE), np.int64)
            table = np.array(plan.group_of_ordinal())
            parts = []
            for g in range(len(plan.groups)):
                mine = surv[table[surv >> (es.ENTRY_BITS + es.BATCH_BITS)] == g]
                out = tasks.copy_group(plan, g, mine)
                parts.append(open(out["path"], "rb").read())
                # the per-ledger counts the task reports are those of the index it wrote
                lids, counts = np.unique(read_part_index(out["path"])["ledger_id"], return_counts=True)
                assert previous_view.part_counts([out]) == dict(zip(lids.tolist(), counts.tolist()))
            return sorted(rows.pos.tolist()), parts

        assert run(1 << 30) == run(64)
    finally:
        storage.close()


def test_a_combiner_that_gives_up_hands_on_rows_the_aggregate_reduces_alike(tmp_path, monkeypatch):
    """A group whose keys barely repeat stops combining after the probe (``COMBINE_PROBE_ROWS``):
    its first rows come out combined, the rest as parsed, and the per-key latest the aggregate
    finds is the same as from a combiner that never gives up."""
    storage, plan = _plan(tmp_path, combine=True)
    try:
        monkeypatch.setattr(tasks, "CHUNK_BYTES", 256)  # many chunks per segment
        monkeypatch.setattr(tasks, "COMBINE_PROBE_ROWS", 20)

        def rows_with(max_distinct):
            monkeypatch.setattr(tasks, "COMBINE_MAX_DISTINCT", max_distinct)
            return [mr.Rows.concat(list(tasks.group_rows(plan, g))) for g in range(len(plan.groups))]

        def latest(groups):
            best: dict = {}
            for rows in groups:
                for h1, h2, p, f in zip(
                    rows.h1.tolist(), rows.h2.tolist(), rows.pos.tolist(), rows.flags.tolist()
                ):
                    p2 = (p << 1) | bool(f & es.FLAG_TOMBSTONE)
                    best[(h1, h2)] = max(best.get((h1, h2), -1), p2)
            return best

        kept = rows_with(1.0)  # never gives up: one row per key and group
        given_up = rows_with(0.0)  # gives up at the first probe
        assert all(len({(a, b) for a, b in zip(r.h1.tolist(), r.h2.tolist())}) == len(r) for r in kept)
        assert sum(map(len, given_up)) > sum(map(len, kept))
        assert latest(given_up) == latest(kept)
    finally:
        storage.close()


def test_group_rows_counts_the_keyless_messages_it_retains(tmp_path):
    cfg = load_config(overrides={"managedLedgerSyncData": False})
    storage = Storage(str(tmp_path / "data"), cfg)
    try:
        ml = storage.open_managed_ledger("t")
        ml.append(E.single("k", b"v"))
        ml.append(E.single(None, b"n1"))
        ml.append(E.batch([(None, b"n2", 0), ("k", b"w", 0), (None, b"n3", 0)], codec=pb.NONE))
        last = ml.last_position()
        live = [
            {
                "ledger_id": last.ledger_id,
                "path": ml.ledger_path(last.ledger_id),
                "index_path": index_path_for(ml.ledger_path(last.ledger_id)),
                "lo": 0,
                "hi": last.entry_id,
                "count": 3,
            }
        ]
        segments = build_segments(None, live)
        for retain, keyless in ((True, 3), (False, 0)):
            plan = RunPlan(
                "t",
                segments,
                build_groups(segments, 1),
                str(tmp_path),
                "keep-latest",
                retain_null_key=retain,
                combine=True,
            )
            stats: dict = {}
            rows = mr.Rows.concat(list(tasks.group_rows(plan, 0, stats)))
            assert stats["messages"] == 5 and stats.get("keyless", 0) == keyless
            assert len(rows) == 1 + keyless  # the key's last row, and each retained keyless message
    finally:
        storage.close()


@pytest.mark.parametrize("native", ["1", "0"])
def test_live_ledgers_are_read_through_their_index_and_checked_against_it(tmp_path, monkeypatch, native):
    """``load_live`` locates a ledger's entries (all, or the wanted ones: phase two) through its
    index: the same bytes as scanning the whole ledger (``storage.ledger_file``), and an index
    that disagrees with the records it points at is not trusted: the ledger is scanned instead.
    With the C extension and without it."""
    monkeypatch.setenv("COMPACTMQ_NATIVE", native)
    storage, plan = _plan(tmp_path, combine=False)
    try:
        rng = np.random.default_rng(5)
        indexed = [s for s in plan.segments if s.index_path and os.path.exists(s.index_path)]
        assert len(indexed) >= 2 and any(not os.path.exists(s.index_path or "") for s in plan.segments)

        def scanned(seg):
            ids, offs, lens = lf.scan_entries(open(seg.path, "rb").read(), verify_crc=False)
            return (
                np.frombuffer(open(seg.path, "rb").read(), np.uint8),
                ids,
                offs + lf.RECORD_HEADER_SIZE,
                lens,
            )

        def same(seg, wanted):
            buf, ids, offs, lens = scanned(seg)
            at = np.searchsorted(ids, wanted)
            got_buf, got_ids, got_offs, got_lens = tasks.load_live(seg, wanted)
            assert got_ids.tolist() == wanted.tolist()
            assert [bytes(got_buf[o : o + n]) for o, n in zip(got_offs.tolist(), got_lens.tolist())] == [
                bytes(buf[o : o + n]) for o, n in zip(offs[at].tolist(), lens[at].tolist())
            ]

        for seg in plan.segments:
            ids = scanned(seg)[1]
            assert tasks.load_segment(seg)[1].tolist() == ids.tolist()
            for _ in range(3):
                same(seg, np.sort(rng.choice(ids, size=rng.integers(1, len(ids) + 1), replace=False)))
        # an index that disagrees with its ledger must not be followed: here each entry id
        # points at the next entry's record (a valid record, of the wrong id)
        b = indexed[1]
        with open(b.index_path, "rb") as f:  # type: ignore[arg-type]
            index = lf.decode_index(f.read())
        with open(b.index_path, "wb") as f:  # type: ignore[arg-type]
            f.write(
                lf.encode_index(index.ledger_id, index.offsets[1:], index.publish_times[1:], index.data_end)
            )
        ids = scanned(b)[1]
        same(b, ids[1::2])
        same(b, ids)
        got, want = tasks.load_segment(b), scanned(b)
        assert got[1].tolist() == want[1].tolist() and got[2].tolist() == want[2].tolist()
    finally:
        storage.close()
