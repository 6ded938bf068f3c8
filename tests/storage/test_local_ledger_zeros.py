"""A local ledger's writer keeps zeros written ahead of its records (``LocalLedgerWriter``):
later appends overwrite allocated blocks, so their fdatasync changes no file size. These tests
pin what that may and may not change: the zeros stay bounded, the bytes written read back,
a failed write's undo and a seal (``sync_all``) leave the file ending at its last record, and
a ledger left open with zeros after its records scans as records + torn tail (what recovery
cuts; the crash tests in ``test_crash`` kill a writer for real)."""

from __future__ import annotations

import os

from compactmq.storage import ledger_file as lf
from compactmq.storage.ledger_storage import ZERO_AHEAD_MAX, ZERO_AHEAD_MIN, LocalLedgerStorage


def _record(entry_id: int, data: bytes) -> bytes:
    return lf.encode_record_header(entry_id, 1000 + entry_id, data) + data


def _file(st: LocalLedgerStorage, ledger_id: int) -> bytes:
    with open(st.path(ledger_id), "rb") as f:
        return f.read()


def _storage(tmp_path) -> LocalLedgerStorage:
    st = LocalLedgerStorage(str(tmp_path / "ledgers"), "persistent://public/default/zeros")
    st.claim("persistent://public/default/zeros")
    return st


def test_zeros_ahead_are_bounded_and_read_as_a_torn_tail(tmp_path):
    st = _storage(tmp_path)
    w = st.create(1)
    assert os.path.getsize(st.path(1)) == lf.FILE_HEADER_SIZE  # nothing ahead before a write
    end = lf.FILE_HEADER_SIZE
    for i in range(50):
        rec = _record(i, b"m%d" % i * 20)
        w.write(rec, end)
        end += len(rec)
        buf = _file(st, 1)
        assert 0 < len(buf) - end <= ZERO_AHEAD_MIN  # a small ledger: the minimum ahead
        assert not any(buf[end:])
    w.sync()
    scan = lf.scan_records(_file(st, 1), verify_crc=True)
    assert len(scan.entry_ids) == 50 and scan.valid_end == end and scan.torn
    w.close()
    st.close()


def test_zeros_ahead_grow_with_the_ledger_up_to_the_maximum(tmp_path):
    st = _storage(tmp_path)
    w = st.create(2)
    end = lf.FILE_HEADER_SIZE
    big = b"x" * (300 * 1024)
    rec = _record(0, big)
    w.write_parts([rec[: lf.RECORD_HEADER_SIZE], big], end, len(rec))  # past the zeros: more
    end += len(rec)
    assert os.path.getsize(st.path(2)) == 2 * end  # as many zeros as the ledger holds
    huge = b"y" * (ZERO_AHEAD_MAX + 4096)
    rec2 = _record(1, huge)
    w.write(rec2, end)
    end += len(rec2)
    buf = _file(st, 2)
    assert len(buf) == end + ZERO_AHEAD_MAX and not any(buf[end:])
    scan = lf.scan_records(buf, verify_crc=True)
    assert list(scan.entry_ids) == [0, 1] and scan.valid_end == end
    w.close()
    st.close()


def test_undo_and_seal_leave_the_file_ending_at_its_last_record(tmp_path):
    st = _storage(tmp_path)
    w = st.create(3)
    kept = _record(0, b"kept")
    w.write(kept, lf.FILE_HEADER_SIZE)
    end = lf.FILE_HEADER_SIZE + len(kept)
    w.write(_record(1, b"undone"), end)
    w.truncate(end)  # a failed write's undo: no zeros left either
    assert os.path.getsize(st.path(3)) == end
    w.write(_record(1, b"again"), end)  # zeros ahead come back with the next write
    end += len(_record(1, b"again"))
    assert os.path.getsize(st.path(3)) > end
    w.sync_all()  # sealing
    buf = _file(st, 3)
    assert len(buf) == end
    scan = lf.scan_records(buf, verify_crc=True)
    assert list(scan.entry_ids) == [0, 1] and not scan.torn
    w.close()
    st.close()
