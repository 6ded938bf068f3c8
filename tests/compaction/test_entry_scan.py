"""The vectorised metadata scanner agrees with pulsar_pb2, and batch rewriting keeps ids."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from compactmq.compaction import batch_rewrite
from compactmq.compaction import entry_scan as es
from compactmq.compaction import message_rows as mr
from compactmq.protocol import pulsar_pb2 as pb

from . import entries as E

CODECS = [pb.NONE, pb.LZ4, pb.ZLIB, pb.ZSTD, pb.SNAPPY]


def _concat(blobs):
    buf = np.frombuffer(b"".join(blobs), np.uint8)
    lens = np.array([len(b) for b in blobs], np.int64)
    offs = np.zeros(len(blobs), np.int64)
    np.cumsum(lens[:-1], out=offs[1:])
    return buf, offs, lens


def _rows_as_set(rows, keys):
    """Rows as (entry, batch index, key, tombstone, event time); keys found back by their hash."""
    by_hash = {es.hash_key_py(k.encode()): k for k in keys if k is not None}
    ordinal, entry, bidx = es.unpack_positions(rows.pos)
    assert list(rows.pos) == sorted(rows.pos)
    out = set()
    for i in range(len(rows)):
        keyless = bool(rows.flags[i] & es.FLAG_KEYLESS)
        if keyless:
            assert rows.h1[i] == rows.pos[i] and rows.h2[i] == es.KEYLESS_MARK
        key = None if keyless else by_hash[(int(rows.h1[i]), int(rows.h2[i]))]
        out.add(
            (
                int(entry[i]),
                int(bidx[i]),
                key,
                bool(rows.flags[i] & es.FLAG_TOMBSTONE),
                int(rows.event_time[i]),
            )
        )
    return out


def _expected(blobs):
    out = set()
    for eid, blob in enumerate(blobs):
        md, msgs = E.decode(blob)
        if md.HasField("marker_type"):
            continue
        for bidx, key, payload, et, co in msgs:
            if co:
                continue
            out.add((eid, bidx, key, key is not None and len(payload) == 0, et))
    return out


keys = st.one_of(st.none(), st.text(alphabet="abcé\u4e2d", max_size=4))
payloads = st.binary(max_size=6)
msg = st.tuples(keys, payloads, st.integers(0, 2**40))
entry = st.one_of(
    st.builds(
        lambda m, pt: E.single(m[0], m[1], event_time=m[2], publish_time=pt, props={"a": "b"}),
        msg,
        st.integers(0, 2**41),
    ),
    st.builds(
        lambda ms, c: E.batch(ms, codec=c), st.lists(msg, min_size=1, max_size=5), st.sampled_from(CODECS)
    ),
    st.builds(lambda k: E.single(k, b"", marker=True), keys),
    st.builds(lambda k: E.single(k, b"x", encrypted=True), keys),
)


@pytest.fixture(params=["native", "numpy"])
def path(request, monkeypatch):
    """Run a test with the C accelerator and with numpy only."""
    from compactmq.compaction import native

    if request.param == "numpy":
        monkeypatch.setenv("COMPACTMQ_NATIVE", "0")
    elif native.library() is None:
        pytest.skip("no C compiler here: the numpy path is the only one")
    return request.param


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(entry, min_size=1, max_size=8))
def test_rows_match_protobuf(path, blobs):
    buf, offs, lens = _concat(blobs)
    rows = mr.entry_rows(buf, np.arange(len(blobs)), offs, lens, 3)
    keys = {m[1] for b in blobs for m in E.decode(b)[1]}
    assert _rows_as_set(rows, keys) == _expected(blobs)
    assert (es.unpack_positions(rows.pos)[0] == 3).all()


def test_metadata_fields_match_protobuf(path):
    blobs = [
        E.single("k", b"v", event_time=77, publish_time=123456789),
        E.batch([("a", b"1", 5)], codec=pb.LZ4),
        E.single(None, b"", marker=True),
    ]
    buf, offs, lens = _concat(blobs)
    info = es.scan_entry_metadata(buf, offs, lens)
    assert info.publish_time.tolist() == [123456789, 1000, 1000]
    assert info.batched.tolist() == [False, True, False]
    assert info.compression.tolist() == [0, pb.LZ4, 0]
    assert info.marker.tolist() == [False, False, True]
    assert info.event_time.tolist()[0] == 77


def test_position_packing_roundtrip_and_limits():
    pos = es.pack_positions([0, 5, es.MAX_ORDINAL], [0, 7, es.MAX_ENTRY], [0, 3, es.MAX_BATCH])
    assert [list(a) for a in es.unpack_positions(pos)] == [
        [0, 5, es.MAX_ORDINAL],
        [0, 7, es.MAX_ENTRY],
        [0, 3, es.MAX_BATCH],
    ]
    assert (pos < 2**62).all() and list(pos) == sorted(pos)
    with pytest.raises(es.CompactionError):
        es.pack_positions([0], [es.MAX_ENTRY + 1], [0])


@pytest.mark.parametrize("codec", CODECS)
def test_rebuild_batch_with_placeholders(path, codec):
    msgs = [("a", b"A1", 1), ("b", b"B1", 2), (None, b"N", 0), ("a", b"", 0), ("c", b"C" * 50, 3)]
    blobs = [E.batch(msgs, codec=codec), E.single("x", b"y"), E.batch([("q", b"1", 0)], codec=codec)]
    buf, offs, lens = _concat(blobs)
    out = batch_rewrite.rebuild_entries(buf, offs, lens, [0, 0, 1], [1, 4, 0])
    assert out[2] is None  # no survivor: not written
    assert bytes(out[1]) == blobs[1]
    md, got = E.decode(bytes(out[0]))
    assert md.compression == codec and md.num_messages_in_batch == 5
    # the placeholder form only: PIP-429's field 31 would tell a client that knows it that the
    # payload holds the listed indexes alone, which is not what we wrote
    assert list(md.compacted_batch_indexes) == []
    assert [(i, k, p, co) for i, k, p, _, co in got] == [
        (0, "a", b"", True),
        (1, "b", b"B1", False),
        (2, None, b"", True),
        (3, "a", b"", True),
        (4, "c", b"C" * 50, False),
    ]
    from compactmq.protocol.entry_format import parse_entry

    parse_entry(bytes(out[0]), verify_checksum=True)  # checksum recomputed
    # a second rewrite of the rewritten batch keeps placeholders and drops one more
    buf2, offs2, lens2 = _concat([bytes(out[0])])
    again = batch_rewrite.rebuild_entries(buf2, offs2, lens2, [0], [4])
    _, got2 = E.decode(bytes(again[0]))
    assert [(i, p, co) for i, _, p, _, co in got2] == [
        (0, b"", True),
        (1, b"", True),
        (2, b"", True),
        (3, b"", True),
        (4, b"C" * 50, False),
    ]
    # all survive: the bytes are untouched
    assert (
        bytes(batch_rewrite.rebuild_entries(buf, offs, lens, [0, 0, 0, 0, 0, 1, 2], [0, 1, 2, 3, 4, 0, 0])[0])
        == blobs[0]
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(entry, min_size=1, max_size=8), st.randoms(use_true_random=False))
def test_native_and_numpy_batch_rewrites_agree(monkeypatch, blobs, rnd):
    """Phase two's batch rewrite (``rebuild_ranges``) gives the same bytes with the C assembly of
    placeholders as with numpy's, whichever messages survive."""
    from compactmq.compaction import native

    monkeypatch.delenv("COMPACTMQ_NATIVE", raising=False)  # (examples share the monkeypatch)
    if native.library() is None:
        pytest.skip("no C compiler")
    buf, offs, lens = _concat(blobs)
    counts = [max(1, len(E.decode(b)[1])) for b in blobs]
    pairs = [(e, i) for e, c in enumerate(counts) for i in range(c) if rnd.random() < 0.5]
    se = np.array([e for e, _ in pairs], np.int64)
    sb = np.array([i for _, i in pairs], np.int64)
    got = []
    for flag in ("1", "0"):
        monkeypatch.setenv("COMPACTMQ_NATIVE", flag)
        got.append(
            [None if x is None else bytes(x) for x in batch_rewrite.rebuild_entries(buf, offs, lens, se, sb)]
        )
    assert got[0] == got[1]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.binary(max_size=40), min_size=1, max_size=20))
def test_vectorised_key_hash_matches_reference(path, keys):
    buf = np.frombuffer(b"".join(keys) + b"tail", np.uint8)
    lens = np.array([len(k) for k in keys], np.int64)
    offs = np.zeros(len(keys), np.int64)
    np.cumsum(lens[:-1], out=offs[1:])
    h1, h2 = es.hash_keys(buf, offs, lens)
    assert [(int(a), int(b)) for a, b in zip(h1, h2)] == [es.hash_key_py(k) for k in keys]


def test_key_hash_separates_similar_keys():
    keys = [b"", b"\0", b"\0\0", b"a", b"a\0", b"key-0000001", b"key-0000002", b"x" * 8, b"x" * 9]
    assert len({es.hash_key_py(k) for k in keys}) == len(keys)


def test_combine_latest_keeps_the_last_row_per_key_in_position_order(path):
    h1 = np.array([5, 7, 5, 5, 9, 7], np.int64)
    h2 = np.array([1, 1, 2, 1, 1, 1], np.int64)  # (5, 2) shares h1 with (5, 1): a collision
    rows = mr.Rows(
        h1,
        h2,
        np.arange(6, dtype=np.int64) * 10,
        np.array([0, 0, 0, 1, 0, 0], np.int8),
        np.zeros(6, np.int64),
    )
    out = mr.combine_latest(rows)
    # last rows: (5,1) at 30 (a tombstone), (5,2) at 20, 9 at 40, 7 at 50 -- exactly, on both
    # paths, although the collision interleaves (5,1) and (5,2): a lookup run and the Python
    # reduce take the combiner's rows as one per key
    assert out.pos.tolist() == [20, 30, 40, 50]
    assert out.flags.tolist() == [0, 1, 0, 0]


def test_native_and_numpy_scans_agree_on_malformed_input(monkeypatch):
    from compactmq.compaction import native

    if native.library() is None:
        pytest.skip("no C compiler")
    for good, cut in (
        (g, c)
        for g in (E.batch([("a", b"1", 0), ("b", b"22", 0)]), E.single("key", b"value"))
        for c in range(12, len(g))
    ):
        bad = good[:cut]
        buf, offs, lens = _concat([E.single("k", b""), bad])
        outcomes = []
        for flag in ("1", "0"):
            monkeypatch.setenv("COMPACTMQ_NATIVE", flag)
            try:
                rows = mr.entry_rows(buf, np.arange(2), offs, lens, 0)
                outcomes.append(("ok", rows.pos.tolist()))
            except es.CompactionError:
                outcomes.append(("error", None))
        assert outcomes[0] == outcomes[1], cut


def test_copy_ranges_and_part_writer_ranges(path, tmp_path):
    from compactmq.compaction import compacted_ledger as cl
    from compactmq.compaction import compacted_writer as cw

    src = np.frombuffer(bytes(range(200)), np.uint8)
    dst = np.zeros(50, np.uint8)
    es.copy_ranges(dst, [0, 10, 30], src, [5, 100, 0], [3, 0, 4])
    assert dst[:3].tolist() == [5, 6, 7] and dst[30:34].tolist() == [0, 1, 2, 3] and not dst[3:30].any()
    w = cw.PartWriter(str(tmp_path / "p"))
    extra = np.frombuffer(b"XYZ", np.uint8)
    assert w.append_ranges(7, [1, 2, 3, 4], src, [10, 0, 0, 20], [2, -1, 3, 1], extra, [-1, -1, 0, -1]) == 3
    w.close()
    cw.concatenate_parts(str(tmp_path / "c"), [str(tmp_path / "p")])
    got = [(tuple(p), d) for p, d in cl.CompactedLedgerReader(str(tmp_path / "c"))]
    assert got == [((7, 1), bytes([10, 11])), ((7, 3), b"XYZ"), ((7, 4), bytes([20]))]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 2)), max_size=60))
def test_combiner_never_drops_a_key_s_last_row(path, keys):
    h1 = np.array([k for k, _ in keys], np.int64)
    h2 = np.array([k2 for _, k2 in keys], np.int64)
    n = len(keys)
    rows = mr.Rows(h1, h2, np.arange(n, dtype=np.int64), np.zeros(n, np.int8), np.zeros(n, np.int64))
    out = mr.combine_latest(rows)
    last = {}
    for i, k in enumerate(keys):
        last[k] = i
    assert set(last.values()) <= set(out.pos.tolist())
    assert out.pos.tolist() == sorted(out.pos.tolist())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(st.tuples(st.integers(0, 400), st.integers(0, 1), st.booleans()), max_size=900),
    st.lists(st.integers(1, 300), min_size=1, max_size=6),
)
def test_streaming_combiner_keeps_each_key_s_last_row(path, keys, cuts):
    """Rows fed in position-ordered chunks (the table grows past its first size, keys collide on
    h1, keyless-like h1 values share their low bits): per key exactly its last row survives,
    with that row's flags."""
    from compactmq.compaction import native

    n = len(keys)
    # h1 = k << 16 mimics a retained keyless row (h1 = its position: low 16 bits all 0)
    h1 = np.array([k << 16 for k, _, _ in keys], np.int64)
    h2 = np.array([k2 for _, k2, _ in keys], np.int64)
    pos = np.arange(n, dtype=np.int64) * 3
    flags = np.array([int(t) for _, _, t in keys], np.int8)
    rows = mr.Rows(h1, h2, pos, flags, np.zeros(n, np.int64))
    combiner = mr.LatestCombiner()
    if path == "native":
        combiner._table = native.LatestTable(native.library(), capacity=2)  # grows many times
    at = 0
    for c in cuts * (n // max(1, sum(cuts)) + 1):
        combiner.add(rows.take(slice(at, at + c)))
        at += c
        if at >= n:
            break
    out = combiner.rows()
    last = {}
    for i, (k, k2, t) in enumerate(keys):
        last[(k << 16, k2)] = (3 * i, int(t))
    got = {(int(a), int(b)): (int(p), int(f)) for a, b, p, f in zip(out.h1, out.h2, out.pos, out.flags)}
    if path == "native":
        assert got == last  # exactly one row per key
    else:
        assert set(last.items()) <= set(got.items())  # numpy may keep harmless extra rows


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 2**22 - 1), st.integers(0, 2**24 - 1), st.integers(0, 2**16 - 1)),
        max_size=300,
    ),
    st.integers(0, 3),
)
def test_position_order_is_a_stable_argsort(parts, repeat):
    """The dense re-packing sorts like ``argsort(kind="stable")``, ties (a position twice) in
    index order, whether the key fits in 63 bits or falls back to argsort (wide ordinals)."""
    pos = np.array([(o << 40) | (e << 16) | b for o, e, b in parts], np.int64)
    pos = np.concatenate([pos] + [pos[::2]] * repeat)
    assert es.position_order(pos).tolist() == np.argsort(pos, kind="stable").tolist()


def test_position_order_sorts_a_large_group():
    """A million positions over a few hundred ledgers (the dense key's case) come out sorted."""
    rng = np.random.default_rng(7)
    n = 1_000_000
    ords = rng.integers(300, 600, n)
    pos = (ords << 40) | (rng.integers(0, 100_000, n) << 16) | rng.integers(0, 100, n)
    order = es.position_order(pos)
    assert (np.diff(pos[order]) >= 0).all()
    assert sorted(order.tolist()) == list(range(n))
