"""The key index of a compacted view (``compaction.key_index``): from parsed entries and from a
key sidecar written with ``view_keys`` (with a lookup run's ``gone`` file), the same rows; keyless
rows, markers and placeholders never found; tombstones found as tombstones."""

from __future__ import annotations

import os

import numpy as np

from compactmq.compaction import entry_scan as es
from compactmq.compaction import key_index, view_keys
from compactmq.protocol import pulsar_pb2 as pb

from . import entries as E


def h(key: str) -> tuple[int, int]:
    return es.hash_key_py(key.encode())


ENTRIES = [
    ((3, 0), E.single("a", b"1")),
    ((3, 1), E.batch([("b", b"2", 0), ("x", b"", 0, True), ("c", b"", 0)], codec=pb.LZ4)),
    ((3, 2), E.single(None, b"keyless")),
    ((5, 0), E.single("m", b"marker", marker=True)),
    ((5, 1), E.batch([("d", b"4", 0), ("a", b"newer", 0)])),
]


def test_parsed_entries_find_each_key_at_its_last_message():
    index = key_index.from_entries([ENTRIES[:2], ENTRIES[2:]])
    assert index.source == "parsed"
    a = index.find(*h("a"))
    assert (a.ledger_id, a.entry_id, a.batch_index, a.tombstone) == (5, 1, 1, False)
    b = index.find(*h("b"))
    assert (b.ledger_id, b.entry_id, b.batch_index) == (3, 1, 0)
    assert index.find(*h("c")).tombstone  # a tombstone the view keeps is found as one
    for missing in ("x", "m", "keyless", ""):  # a placeholder, a marker, keyless, never written
        assert index.find(*h(missing)) is None
    assert len(index) == 4  # a, b, c, d


def test_a_sidecar_gives_the_same_rows_minus_what_lookup_runs_retired(tmp_path):
    h1, h2, lids, ids, flags = key_index.rows_of_entries(ENTRIES)
    keyed = (flags & es.FLAG_KEYLESS) == 0
    half = len(h1) // 2
    d = str(tmp_path)
    pos = ids  # packed positions of ordinal 0 are the sidecar's ids
    view_keys.write_part(
        os.path.join(d, view_keys.part_name(0)), lids[:half], pos[:half], h1[:half], h2[:half], flags[:half]
    )
    view_keys.write_part(
        os.path.join(d, view_keys.part_name(1)), lids[half:], pos[half:], h1[half:], h2[half:], flags[half:]
    )
    # a lookup run retired b's row
    b = int(np.flatnonzero(keyed & (h1 == h("b")[0]))[0])
    view_keys.write_gone(os.path.join(d, view_keys.gone_name(7, 0)), [lids[b]], [ids[b]])
    source = view_keys.plan_entry(
        [os.path.join(d, view_keys.part_name(g)) for g in (0, 1)],
        gone=[os.path.join(d, view_keys.gone_name(7, 0))],
    )
    index = key_index.from_sidecar(source)
    assert index.source == "sidecar"
    assert index.find(*h("b")) is None
    parsed = key_index.from_entries([ENTRIES])
    for k in ("a", "c", "d"):
        assert index.find(*h(k)) == parsed.find(*h(k)), k
    assert index.nbytes > 0 and len(index) == 3
