import io

import numpy as np
import pytest

from compactmq.errors import StorageError
from compactmq.protocol import wire
from compactmq.storage import ledger_file as lf


def build(entries, ledger_id=7, times=None):
    times = times or [1000 + i for i in range(len(entries))]
    buf = bytearray(lf.encode_file_header(ledger_id))
    offsets = []
    for i, data in enumerate(entries):
        offsets.append(len(buf))
        buf += lf.encode_record(i, times[i], data)
    return bytes(buf), offsets, times


ENTRIES = [b"alpha", b"", b"x" * 5000, bytes(range(256))]


def test_header_round_trip_and_rejects_foreign_files():
    assert lf.decode_file_header(lf.encode_file_header(42)) == 42
    with pytest.raises(StorageError):
        lf.decode_file_header(b"PK\x03\x04" + b"\0" * 40)
    with pytest.raises(StorageError):
        lf.decode_file_header(b"short")


def test_scan_finds_every_entry():
    buf, offsets, times = build(ENTRIES)
    ids, offs, lens = lf.scan_entries(buf)
    assert ids.tolist() == [0, 1, 2, 3]
    assert offs.tolist() == offsets
    assert lens.tolist() == [len(e) for e in ENTRIES]
    assert [lf.entry_bytes(buf, o, n) for o, n in zip(offs, lens)] == ENTRIES
    scan = lf.scan_records(buf)
    assert scan.publish_times.tolist() == times and not scan.torn and scan.valid_end == len(buf)


def test_record_header_matches_encode_record():
    data = b"payload"
    assert lf.encode_record_header(3, 99, data) + data == lf.encode_record(3, 99, data)


@pytest.mark.parametrize("cut", range(1, 40))
def test_scan_stops_at_a_torn_tail(cut):
    buf, offsets, _ = build(ENTRIES)
    torn = buf[: len(buf) - cut]
    scan = lf.scan_records(torn)
    assert len(scan.entry_ids) == 3 and scan.torn and scan.valid_end == offsets[3]


def test_scan_stops_at_corruption_and_at_zero_fill():
    buf, offsets, _ = build(ENTRIES)
    bad = bytearray(buf)
    bad[offsets[2] + lf.RECORD_HEADER_SIZE + 10] ^= 1
    scan = lf.scan_records(bytes(bad))
    assert len(scan.entry_ids) == 2 and scan.valid_end == offsets[2] and scan.torn
    first_bad = bytearray(buf)
    first_bad[offsets[0] + lf.RECORD_HEADER_SIZE] ^= 1
    scan = lf.scan_records(bytes(first_bad))
    assert len(scan.entry_ids) == 0 and scan.valid_end == lf.FILE_HEADER_SIZE
    zero_tail = buf + b"\0" * 100
    scan = lf.scan_records(zero_tail)
    assert len(scan.entry_ids) == 4 and scan.torn and scan.valid_end == len(buf)
    # without CRC checks, a damaged payload is not noticed (for trusted, fast scans)
    assert len(lf.scan_records(bytes(bad), verify_crc=False).entry_ids) == 4


def test_index_round_trip_and_vectorised_scan():
    buf, offsets, times = build(ENTRIES)
    index = lf.encode_index(7, offsets, times, len(buf))
    dec = lf.decode_index(index)
    assert dec.ledger_id == 7 and dec.offsets.tolist() == offsets and dec.publish_times.tolist() == times
    a = lf.scan_records(buf, index=index)
    b = lf.scan_records(buf)
    for x, y in zip(a[:4], b[:4]):
        assert np.array_equal(x, y)
    assert a.valid_end == b.valid_end


def test_index_that_disagrees_with_the_file_is_ignored():
    buf, offsets, times = build(ENTRIES)
    wrong = lf.encode_index(7, [offsets[0], offsets[1] + 1, offsets[2], offsets[3]], times, len(buf))
    assert lf.scan_records(buf, index=wrong).lengths.tolist() == [len(e) for e in ENTRIES]
    damaged = bytearray(lf.encode_index(7, offsets, times, len(buf)))
    damaged[-1] ^= 0xFF
    with pytest.raises(StorageError):
        lf.decode_index(bytes(damaged))
    assert len(lf.scan_records(buf, index=bytes(damaged)).entry_ids) == 4


def test_index_scan_detects_bit_rot():
    buf, offsets, times = build(ENTRIES)
    bad = bytearray(buf)
    bad[offsets[2] + lf.RECORD_HEADER_SIZE] ^= 1
    with pytest.raises(StorageError):
        lf.scan_records(bytes(bad), index=lf.encode_index(7, offsets, times, len(buf)))


def test_read_entry_at_from_bytes_file_object_and_fd(tmp_path):
    buf, offsets, times = build(ENTRIES)
    path = tmp_path / "1.log"
    path.write_bytes(buf)
    for i, off in enumerate(offsets):
        assert lf.read_entry_at(buf, off) == (i, times[i], ENTRIES[i])
        assert lf.read_entry_at(io.BytesIO(buf), off) == (i, times[i], ENTRIES[i])
    import os

    fd = os.open(path, os.O_RDONLY)
    try:
        assert lf.read_entry_at(fd, offsets[2]) == (2, times[2], ENTRIES[2])
        with pytest.raises(StorageError):
            lf.read_entry_at(fd, offsets[2] + 1)
    finally:
        os.close(fd)


def test_parse_records_splits_a_run():
    buf, offsets, times = build(ENTRIES)
    blob = lf.read_records(buf, offsets[1], len(buf))
    got = lf.parse_records(blob, offsets[1], offsets[1:], 1)
    assert got == [(i, times[i], ENTRIES[i]) for i in (1, 2, 3)]


def test_scan_through_pyarrow_filesystem(tmp_path):
    """What a Spark task on another machine does: open the file through pyarrow.fs."""
    from pyarrow import fs

    buf, offsets, times = build(ENTRIES)
    (tmp_path / "7.log").write_bytes(buf)
    (tmp_path / "7.idx").write_bytes(lf.encode_index(7, offsets, times, len(buf)))
    local = fs.LocalFileSystem()
    with local.open_input_file(str(tmp_path / "7.log")) as f:
        data = f.read_buffer()
    with local.open_input_file(str(tmp_path / "7.idx")) as f:
        index = f.read()
    ids, offs, lens = lf.scan_entries(memoryview(data), index=index)
    assert [lf.entry_bytes(memoryview(data), o, n) for o, n in zip(offs, lens)] == ENTRIES
    with local.open_input_file(str(tmp_path / "7.log")) as f:
        assert lf.read_entry_at(f, offsets[3])[2] == ENTRIES[3]


def test_scan_of_many_entries_is_fast_enough():
    entries = [b"m" * 100] * 50_000
    buf, offsets, times = build(entries, times=[0] * len(entries))
    index = lf.encode_index(7, offsets, times, len(buf))
    scan = lf.scan_records(buf, index=index, verify_crc=False)
    assert len(scan.entry_ids) == 50_000 and int(scan.lengths.sum()) == 5_000_000


# --- framing records for the appender: the C twin (when built) and the Python one -----------

FRAMERS = [lf._py_frame_records] + ([wire.NATIVE.frame_records] if wire.NATIVE is not None else [])
HEADERS = [lf._py_record_header] + ([wire.NATIVE.record_header] if wire.NATIVE is not None else [])


def test_the_implementation_in_use_follows_compactmq_native():
    expected = "python" if wire.NATIVE is None else "native"
    assert lf.RECORD_IMPLEMENTATION == expected
    assert (lf.frame_records is lf._py_frame_records) == (expected == "python")


@pytest.mark.parametrize("header", HEADERS)
def test_record_header_is_the_record_format(header):
    for eid, pt, data in [(0, 0, b""), (5, -1, b"abc"), (2**40, 1_700_000_000_000, bytes(range(256)) * 41)]:
        assert header(eid, pt, data) + data == lf.encode_record(eid, pt, data)
        assert header(eid, pt, memoryview(data)) + data == lf.encode_record(eid, pt, data)


@pytest.mark.parametrize("frame", FRAMERS)
def test_frame_records_writes_records_a_scan_reads_back(frame):
    datas = [b"alpha", b"", b"x" * 5000, bytes(range(256)), bytearray(b"ba")]
    pts = [None, 7, -1, 2.0, None]
    start = lf.FILE_HEADER_SIZE
    parts, offsets, times, end = frame(datas, pts, 1234, 0, start, lf.MAX_ENTRY_SIZE)
    assert parts[1::2] == datas and all(p is d for p, d in zip(parts[1::2], datas))  # no copies
    buf = lf.encode_file_header(9) + b"".join(parts)
    assert end == len(buf)
    scan = lf.scan_records(buf)
    assert np.frombuffer(offsets, np.int64).tolist() == scan.offsets.tolist()
    assert np.frombuffer(times, np.int64).tolist() == [1234, 7, -1, 2, 1234] == scan.publish_times.tolist()
    assert [lf.entry_bytes(buf, o, n) for o, n in zip(scan.offsets, scan.lengths)] == datas
    assert not scan.torn


@pytest.mark.parametrize("frame", FRAMERS)
def test_frame_records_continues_a_ledger_and_refuses_oversized_entries(frame):
    parts, offsets, _, end = frame([b"a", b"bc"], [1, 2], 0, 40, 1000, 10)
    assert np.frombuffer(offsets, np.int64).tolist() == [1000, 1025] and end == 1051
    assert parts[0] == lf.encode_record(40, 1, b"a")[: lf.RECORD_HEADER_SIZE]
    assert parts[2] == lf.encode_record(41, 2, b"bc")[: lf.RECORD_HEADER_SIZE]
    assert frame([b"a", b"x" * 11], [None, None], 0, 0, 24, 10) is None
    assert frame([], [], 0, 0, 24, 10) == ([], b"", b"", 24)


def test_both_framers_agree_byte_for_byte():
    if wire.NATIVE is None:
        pytest.skip("the _wire extension is not built or COMPACTMQ_NATIVE=0")
    rng = np.random.default_rng(3)
    datas = [rng.bytes(int(n)) for n in rng.integers(0, 3000, 200)]
    pts = [None if i % 3 else int(t) for i, t in enumerate(rng.integers(-1, 2**62, 200))]
    args = (datas, pts, 99, 123456, 4096, lf.MAX_ENTRY_SIZE)
    assert lf._py_frame_records(*args) == wire.NATIVE.frame_records(*args)
