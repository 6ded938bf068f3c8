"""Issue 28: a sealed ledger's index is read piece by piece from its file, never held whole.

The 10-minute soak held RSS flat until the first rollover (~600 s), then a consumer a little
behind read the just-sealed ledger and the broker loaded its whole index (16 bytes an entry,
~15 MiB per busy topic) and kept it: +60 % RSS. These tests bound what one read of a long
sealed ledger keeps in memory, and check that reads through the piecewise index give the same
entries, sizes and publish times as before, and that a damaged index is still rebuilt.
"""

import os

import numpy as np
import pytest

from compactmq.storage import ledger_file as lf
from compactmq.storage import sealed_index
from compactmq.storage.sealed_index import SealedColumn, open_columns

#: what a seal may hold at once while it writes the index: its pieces, whatever the ledger's length
PIECES_PEAK = 3 * 2**20


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(sealed_index, "CHUNK", 16)
    monkeypatch.setattr(sealed_index, "VERIFY_PIECE", 100)


def _reader(blob: bytes):
    reads = []

    def read(offset: int, length: int) -> bytes:
        reads.append((offset, length))
        return blob[offset : offset + length]

    return read, reads


def test_columns_match_the_index_they_read(small_chunks):
    n = 100
    offsets = np.arange(n, dtype=np.int64) * 37 + lf.FILE_HEADER_SIZE
    pts = 1_700_000_000_000 + np.arange(n, dtype=np.int64) * 3
    read, _ = _reader(lf.encode_index(7, offsets, pts, 9999))
    offs_col, pts_col, data_end = open_columns(read, 7, n)
    assert data_end == 9999 and len(offs_col) == len(pts_col) == n
    assert [offs_col[i] for i in range(n)] == offsets.tolist()
    assert offs_col[-1] == offsets[-1] and pts_col[-n] == pts[0]
    assert type(offs_col[3]) is int
    for lo, hi in [(0, 0), (0, 5), (14, 18), (15, 16), (0, 100), (30, 95), (90, 200)]:
        assert offs_col[lo:hi].tolist() == offsets[lo:hi].tolist()
        assert pts_col[lo:hi].tolist() == pts[lo:hi].tolist()
    assert np.asarray(pts_col).tolist() == pts.tolist()
    with pytest.raises(IndexError):
        offs_col[n]
    with pytest.raises(IndexError):
        offs_col[-n - 1]


def test_a_column_keeps_at_most_a_few_pieces_however_long(small_chunks):
    n = 1000
    offsets = np.arange(n, dtype=np.int64)
    read, reads = _reader(lf.encode_index(1, offsets, offsets, 5))
    col, _, _ = open_columns(read, 1, n)
    reads.clear()
    assert sum(col[i] for i in range(n)) == sum(range(n))  # a reader walking the whole ledger
    assert col.cached_bytes <= sealed_index.CACHED_CHUNKS * 16 * 8
    assert len(reads) == n // 16 + 1  # each piece read once, walking forward
    assert col[0:500].tolist() == list(range(500))  # a long range: one read, nothing kept
    assert col.cached_bytes <= sealed_index.CACHED_CHUNKS * 16 * 8


@pytest.mark.parametrize(
    "damage",
    ["header", "body", "short", "longer", "other ledger", "other count", "missing"],
)
def test_a_damaged_or_foreign_index_is_refused(damage):
    n = 50
    offsets = np.arange(n, dtype=np.int64)
    blob = bytearray(lf.encode_index(3, offsets, offsets, 77))
    ledger_id, count = 3, n
    if damage == "header":
        blob[20] ^= 1
    elif damage == "body":
        blob[-3] ^= 1
    elif damage == "short":
        del blob[-8:]
    elif damage == "longer":
        blob += b"\0" * 8
    elif damage == "other ledger":
        ledger_id = 4
    elif damage == "other count":
        count = n + 1

    def read(offset: int, length: int) -> bytes:
        if damage == "missing":
            raise FileNotFoundError("no index")
        return bytes(blob[offset : offset + length])

    assert open_columns(read, ledger_id, count) is None


def test_a_read_of_a_long_sealed_ledger_keeps_a_few_pieces_of_its_index(open_storage):
    """The soak's case: a ledger of many entries sealed, a consumer reads its last entries and
    a stats call sizes the backlog; what stays in memory is a few pieces, not 16 bytes for each
    of the ledger's entries."""
    n = 20_000  # 320 KB of index if loaded whole
    ml = open_storage(managedLedgerMaxEntriesPerLedger=n).open_managed_ledger("t")
    ps = []
    for k in range(0, n, 1000):
        ps += ml.append_many([b"e%d" % i for i in range(k, k + 1000)])
    ml.append(b"next")  # rolls over: the first ledger is sealed
    state = ml._ledgers
    sealed = state.by_id[ps[0].ledger_id]
    assert sealed is not state.current and sealed.offsets is None
    assert [d for _, d in ml.read_entries(ps[n - 50], 50)] == [b"e%d" % i for i in range(n - 50, n)]
    assert ml.size_after(ps[n - 100]) == sum(len(b"e%d" % i) for i in range(n - 99, n)) + 4
    assert isinstance(sealed.offsets, SealedColumn) and isinstance(sealed.publish_times, SealedColumn)
    held = sealed.offsets.cached_bytes + sealed.publish_times.cached_bytes
    assert held <= 2 * sealed_index.CACHED_CHUNKS * sealed_index.CHUNK * 8
    assert held < n * 16 / 2


def test_reads_through_the_piecewise_index_are_the_reads_of_before(open_storage, clock, small_chunks):
    ml = open_storage(managedLedgerMaxEntriesPerLedger=100).open_managed_ledger("t")
    ps = [ml.append(b"m%d" % i, clock.now + i) for i in range(250)]
    datas = [b"m%d" % i for i in range(250)]
    state = ml._ledgers
    first = state.by_id[ps[0].ledger_id]
    assert [d for _, d in ml.read_entries(ps[0], 1000)] == datas
    fit, used = [], 0
    for d in datas[37:127]:
        if used + len(d) > 200:
            break
        fit.append(d)
        used += len(d)
    assert [d for _, d in ml.read_entries(ps[37], 90, max_bytes=200)] == fit  # crosses a ledger
    assert ml.read_entry(ps[99]) == b"m99" and ml.read_entry(ps[100]) == b"m100"
    assert isinstance(first.offsets, SealedColumn)
    assert ml.publish_time_of(ps[63]) == clock.now + 63
    assert ml.find_position_by_publish_time(clock.now + 150) == ps[150]
    assert ml.find_position_by_publish_time(clock.now + 77) == ps[77]
    assert ml.size_after(ps[10]) == sum(len(d) for d in datas[11:])
    assert ml.total_size() == sum(len(d) for d in datas)
    cur = ml.open_cursor("c")
    cur.ack_individual([p for p in ps[:180]])
    assert cur.mark_delete_position == ps[179] and cur.backlog() == 70


def test_a_damaged_sealed_index_is_rebuilt(open_storage):
    st = open_storage(managedLedgerMaxEntriesPerLedger=30)
    ml = st.open_managed_ledger("t")
    ps = [ml.append(b"%d" % i) for i in range(40)]
    idx = lf.index_path_for(ml.ledger_path(ps[0].ledger_id))
    st.close()
    with open(idx, "r+b") as f:
        f.seek(-2, os.SEEK_END)
        f.write(b"!!")
    ml = open_storage(managedLedgerMaxEntriesPerLedger=30).open_managed_ledger("t")
    assert [d for _, d in ml.read_entries(ps[0], 100)] == [b"%d" % i for i in range(40)]
    with open(idx, "rb") as f:
        assert lf.decode_index(f.read()).ledger_id == ps[0].ledger_id  # written again, intact


def test_sealing_a_long_ledger_holds_no_copy_of_its_index(open_storage):
    """Every busy topic rolls over at about the same time (they were created together, and
    the minimum rollover time is the same); the seal used to make five whole copies of the
    index (80 bytes an entry) on its way to the file, then one (16 bytes an entry: the
    10-minute soak's RSS jumped by half at the rollover). Now it writes the file piece by
    piece: what it holds at once does not grow with the ledger."""
    import tracemalloc

    n = 300_000
    ml = open_storage(
        managedLedgerSyncData=False, managedLedgerMaxEntriesPerLedger=2 * n
    ).open_managed_ledger("t")
    for k in range(0, n, 5000):
        ml.append_many([b"x"] * 5000)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        assert ml.rollover()
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    # the pieces in flight (65,536 values, a few copies of 512 KiB); it was 16 bytes an entry
    # (4.6 MiB here), and 64 before that
    assert peak <= PIECES_PEAK, f"{peak} bytes at the seal of {n} entries"
    (sealed,) = [led for led in ml._ledgers.ledgers if led.state == "CLOSED"]
    assert sealed.count == n and sealed.offsets is None
    assert ml.read_entry((sealed.ledger_id, n - 1)) == b"x"
