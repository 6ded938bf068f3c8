"""The compacted-ledger file: ids next to bytes, binary search, parts, incomplete files, orphans."""

from __future__ import annotations

import os

import pytest

from compactmq.compaction import compacted_ledger as cl
from compactmq.compaction import compacted_writer as cw
from compactmq.errors import StorageError


def _write(path, items):
    w = cw.CompactedLedgerWriter(path)
    for lid, eid, data in items:
        w.append(lid, eid, data)
    w.finish()


ITEMS = [(3, 0, b"a"), (3, 7, b"bb"), (5, 1, b""), (5, 2, b"dddd"), (9, 0, b"e" * 1000)]


def test_roundtrip_and_binary_search(tmp_path):
    p = str(tmp_path / "1.compacted")
    _write(p, ITEMS)
    r = cl.CompactedLedgerReader(p)
    assert [(tuple(pos), data) for pos, data in r] == [((l, e), d) for l, e, d in ITEMS]
    assert r.find((0, 0)) == 0 and r.find((3, 1)) == 1 and r.find((3, 7)) == 1
    assert r.find((4, 0)) == 2 and r.find((5, 3)) == 4 and r.find((9, 1)) == 5
    assert [tuple(p) for p, _ in r.read((3, 5), 2)] == [(3, 7), (5, 1)]
    assert r.read((10, 0), 5) == [] and tuple(r.last()[0]) == (9, 0)
    assert list(r.distinct_ledger_ids()) == [3, 5, 9]


def test_read_through_pyarrow_uri(tmp_path):
    p = str(tmp_path / "2.compacted")
    _write(p, ITEMS)
    r = cl.CompactedLedgerReader("file://" + p)
    assert r.entry_at(3) == b"dddd"


def test_ids_must_increase(tmp_path):
    w = cw.CompactedLedgerWriter(str(tmp_path / "x"))
    w.append(3, 4, b"")
    with pytest.raises(StorageError):
        w.append(3, 4, b"")
    w.abort()
    assert not os.path.exists(tmp_path / "x")


def test_parts_concatenate_in_order(tmp_path):
    a, b = cw.PartWriter(str(tmp_path / "pa")), cw.PartWriter(str(tmp_path / "pb"))
    a.append(1, 0, b"x")
    a.append(1, 5, b"yy")
    b.append(2, 0, b"zzz")
    a.close(), b.close()
    out = str(tmp_path / "7.compacted")
    assert cw.concatenate_parts(out, [str(tmp_path / "pa"), str(tmp_path / "pb")]) == 3
    assert [(tuple(p), d) for p, d in cl.CompactedLedgerReader(out)] == [
        ((1, 0), b"x"),
        ((1, 5), b"yy"),
        ((2, 0), b"zzz"),
    ]
    with pytest.raises(StorageError):  # out of order
        cw.concatenate_parts(str(tmp_path / "8.compacted"), [str(tmp_path / "pb"), str(tmp_path / "pa")])
    assert not os.path.exists(tmp_path / "8.compacted")


def test_incomplete_or_damaged_file_is_refused(tmp_path):
    p = str(tmp_path / "3.compacted")
    _write(p, ITEMS)
    data = open(p, "rb").read()
    open(p, "wb").write(data[:-5])  # torn trailer
    with pytest.raises(StorageError):
        cl.CompactedLedgerReader(p)
    bad = bytearray(data)
    bad[-40] ^= 0xFF  # inside the index
    open(p, "wb").write(bytes(bad))
    with pytest.raises(StorageError):
        cl.CompactedLedgerReader(p)


def test_remove_orphans_keeps_the_named_ledger(tmp_path):
    topic = "persistent://public/default/t"
    d = cl.topic_dir(tmp_path, topic)
    for lid in (4, 9):
        _write(cl.compacted_ledger_path(tmp_path, topic, lid), ITEMS)
    os.makedirs(os.path.join(d, "run-12"))
    open(os.path.join(d, "run-12", "part-000000"), "wb").close()
    assert cl.list_compacted_ledgers(tmp_path, topic) == [4, 9]
    assert cl.remove_orphans(tmp_path, topic, keep=9) == [4]
    assert cl.list_compacted_ledgers(tmp_path, topic) == [9]
    assert not os.path.exists(os.path.join(d, "run-12"))


def test_compacted_paths_are_per_topic(tmp_path):
    a = cl.compacted_ledger_path(tmp_path, "a", 5)
    b = cl.compacted_ledger_path(tmp_path, "b", 5)
    assert a != b and a.endswith("000000000005.compacted") and "/compacted/" in a
