"""The open ledger's index spills full chunks to an anonymous file (storage/tail_index.py):
memory stays bounded while reads, rollover, reopen and crash recovery see the same entries."""

import os
from array import array

import numpy as np
import pytest

from compactmq.storage import tail_index
from compactmq.storage.tail_index import SpillingColumn, column_pair


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(tail_index, "CHUNK", 8)
    return 8


def test_column_matches_an_array_across_chunks(tmp_path, small_chunks):
    col, ref = SpillingColumn(str(tmp_path)), array("q")
    for i in range(5):
        col.append(i * 7)
        ref.append(i * 7)
    batch = array("q", range(100, 137)).tobytes()
    col.frombytes(batch)
    ref.frombytes(batch)
    assert len(col) == len(ref) == 42
    assert col.spilled == 40  # five full chunks in the file, two values in memory
    assert [col[i] for i in range(len(ref))] == list(ref)
    assert col[-1] == ref[-1] and col[-42] == ref[0]
    for lo, hi in [(0, 42), (3, 9), (8, 16), (15, 41), (40, 42), (7, 7), (30, 100)]:
        got = col[lo:hi]
        assert isinstance(got, np.ndarray) and got.dtype == np.int64
        assert got.tolist() == list(ref[lo:hi])
    assert np.asarray(col, np.int64).tolist() == list(ref)
    with pytest.raises(IndexError):
        col[42]
    col.close()


def test_column_memory_is_bounded(tmp_path, small_chunks):
    col = SpillingColumn(str(tmp_path))
    for i in range(1000):
        col.append(i)
        assert len(col) - col.spilled < small_chunks
    for i in range(0, 1000, 37):  # random reads keep only a few chunks
        assert col[i] == i
    assert len(col._cache) <= tail_index.CACHED_CHUNKS
    assert os.listdir(tmp_path) == []  # the spill file has no name
    col.close()


def test_cut_back_inside_the_spilled_part(tmp_path, small_chunks):
    col = SpillingColumn(str(tmp_path))
    col.frombytes(array("q", range(30)).tobytes())
    del col[13:]
    assert len(col) == 13 and col[0:13].tolist() == list(range(13))
    col.frombytes(array("q", range(50, 70)).tobytes())
    assert col[:].tolist() == list(range(13)) + list(range(50, 70))
    del col[30:]
    assert col[:].tolist() == list(range(13)) + list(range(50, 67))
    col.close()


def test_managed_ledger_reads_a_spilled_open_ledger(open_storage, clock, small_chunks):
    ml = open_storage().open_managed_ledger("t")
    ps = [ml.append(b"m%d" % i, clock.now + i) for i in range(30)]
    ps += ml.append_many([b"b%d" % i for i in range(40)], [clock.now + 30 + i for i in range(40)])
    datas = [b"m%d" % i for i in range(30)] + [b"b%d" % i for i in range(40)]
    assert len({p.ledger_id for p in ps}) == 1  # all still in the open ledger
    led = ml._ledgers.current
    assert led.offsets.spilled >= 64 and led.publish_times.spilled >= 64
    assert [d for _, d in ml.read_entries(ps[0], 1000)] == datas
    assert [d for _, d in ml.read_entries(ps[17], 20)] == datas[17:37]
    assert ml.read_entry(ps[9]) == b"m9"
    assert ml.publish_time_of(ps[50]) == clock.now + 50
    assert ml.find_position_by_publish_time(clock.now + 44) == ps[44]
    ml.rollover()  # sealing writes the full index from the column
    assert [d for _, d in ml.read_entries(ps[0], 1000)] == datas
    assert ml.ledgers()[0].entry_count == 70


def test_reopen_after_close(open_storage, small_chunks):
    st = open_storage()
    ml = st.open_managed_ledger("t")
    first = [ml.append(b"a%d" % i) for i in range(21)]
    st.close()
    ml = open_storage().open_managed_ledger("t")
    more = ml.append_many([b"c%d" % i for i in range(19)])
    want = [b"a%d" % i for i in range(21)] + [b"c%d" % i for i in range(19)]
    assert [d for _, d in ml.read_entries(first[0], 100)] == want
    assert ml.last_position() == more[-1]


def test_a_ledgers_two_columns_share_one_file(tmp_path, small_chunks):
    offs, pts = column_pair(str(tmp_path))
    for i in range(40):
        offs.append(1000 + i)
        pts.append(-i)
    del offs[11:]  # a cut of one column leaves the other's chunks alone
    offs.frombytes(array("q", range(5000, 5029)).tobytes())
    assert offs[:].tolist() == list(range(1000, 1011)) + list(range(5000, 5029))
    assert pts[:].tolist() == [-i for i in range(40)]
    fd = offs._file.fd
    assert fd >= 0 and pts._file is offs._file
    offs.close()
    os.fstat(fd)  # still open: publish times use it
    pts.close()
    assert offs._file.fd == -1  # closed with the last column
