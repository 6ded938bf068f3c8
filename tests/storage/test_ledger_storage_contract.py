"""The contract of ``LedgerStorage``: every implementation passes this module unchanged.

Add an implementation by adding one entry to ``IMPLEMENTATIONS``: a function that takes a
pytest ``tmp_path``, a topic and the pytest ``request`` (for the servers it needs) and returns a
factory; each call of the factory opens a NEW
storage object over the same place (so tests can check what survives a reopen). The tests
only use the interface: no paths, no file descriptors.
"""

from __future__ import annotations

import threading

import pytest

from compactmq.errors import StorageError
from compactmq.storage import ledger_file as lf
from compactmq.storage.metadata_store import create_metadata_store
from compactmq.storage.object_group_flush import GroupFlush
from compactmq.storage.ledger_storage import LedgerStorage, LedgerWriter, LocalLedgerStorage
from compactmq.storage.object_ledgers import ObjectLedgerSettings, ObjectLedgerStorage
from compactmq.storage.offload.blobstore import BlobStore, OffloadLocation

TOPIC = "persistent://public/default/contract"


def _local(tmp_path, topic, request):
    return lambda: LocalLedgerStorage(str(tmp_path / "ledgers"), topic)


def _object(tmp_path, topic, request):
    """Ledgers in SeaweedFS, each test under its own prefix; every reopen is a new client."""
    server = request.getfixturevalue("seaweedfs")
    loc = OffloadLocation("s3", server.create_bucket("contract"), "us-east-1", server.endpoint, tmp_path.name)
    return lambda: ObjectLedgerStorage(BlobStore(loc), topic, ObjectLedgerSettings(flush_interval_ms=1))


def _object_group(tmp_path, topic, request):
    """The same, every flush through a group flush (one shared object per write, ranges
    committed in a metadata store): each reopen is a new client, group and store session."""
    server = request.getfixturevalue("seaweedfs")
    loc = OffloadLocation("s3", server.create_bucket("contract"), "us-east-1", server.endpoint, tmp_path.name)
    name = f"memory:contract-{tmp_path.name}"

    def make() -> ObjectLedgerStorage:
        store = BlobStore(loc)
        # solo off: even a lone flush goes to a shared object (solo, it is the "object" path)
        group = GroupFlush(store, create_metadata_store(name, data_dir=tmp_path), solo=False)
        return ObjectLedgerStorage(store, topic, ObjectLedgerSettings(flush_interval_ms=1), group=group)

    return make


IMPLEMENTATIONS = {"local": _local, "object": _object, "object-group": _object_group}


@pytest.fixture(params=sorted(IMPLEMENTATIONS))
def reopen(request, tmp_path):
    opened: list[LedgerStorage] = []

    def make() -> LedgerStorage:
        st = IMPLEMENTATIONS[request.param](tmp_path, TOPIC, request)()
        st.claim(TOPIC)
        opened.append(st)
        return st

    yield make
    for st in opened:
        st.close()


@pytest.fixture
def storage(reopen):
    return reopen()


def _record(entry_id: int, data: bytes) -> bytes:
    return lf.encode_record_header(entry_id, 1000 + entry_id, data) + data


def _append(writer: LedgerWriter, end: int, entry_id: int, data: bytes) -> int:
    rec = _record(entry_id, data)
    writer.write(rec, end)
    return end + len(rec)


def test_a_new_ledger_holds_only_its_header_and_is_durable(reopen):
    st = reopen()
    w = st.create(7)
    w.close()
    again = reopen()
    buf = again.read_all(7)
    assert buf is not None and len(buf) == lf.FILE_HEADER_SIZE
    assert lf.decode_file_header(buf) == 7
    assert again.exists(7) and 7 in again.list()


def test_written_records_read_back_by_range_and_whole(storage):
    w = storage.create(1)
    end = lf.FILE_HEADER_SIZE
    starts = []
    for i in range(5):
        starts.append(end)
        end = _append(w, end, i, b"entry-%d" % i)
    w.sync()
    # readable while the ledger is still being written (readers see the current ledger)
    blob = storage.read_range(1, starts[1], starts[3])
    assert lf.split_records(blob, starts[1], starts[1:3], starts[3], 1) == [b"entry-1", b"entry-2"]
    # a ledger being written may carry zeros after its records (a local writer writes them
    # ahead), which a scan reads as a torn tail: the records end where they end
    scan = lf.scan_records(storage.read_all(1), verify_crc=True)
    assert len(scan.entry_ids) == 5 and scan.valid_end == end
    w.sync_all()
    w.close()
    assert storage.read_range(1, starts[4], end) == _record(4, b"entry-4")
    # sealed (sync_all): the ledger is exactly its records
    buf = storage.read_all(1)
    assert buf is not None and len(buf) == end and not lf.scan_records(buf, verify_crc=True).torn


def test_truncate_undoes_a_write(storage):
    w = storage.create(2)
    end = _append(w, lf.FILE_HEADER_SIZE, 0, b"kept")
    _append(w, end, 1, b"dropped")
    w.truncate(end)
    w.sync()
    w.close()
    scan = lf.scan_records(storage.read_all(2), verify_crc=True)
    assert len(scan.entry_ids) == 1 and not scan.torn


def test_write_parts_places_the_concatenation(reopen):
    # header + entry buffers without a joined copy; more buffers than one pwritev takes
    st = reopen()
    w = st.create(4)
    datas = [b"e%d" % i * (i % 7) for i in range(1500)]
    parts, _, _, end = lf.frame_records(
        datas, [None] * len(datas), 5, 0, lf.FILE_HEADER_SIZE, lf.MAX_ENTRY_SIZE
    )
    w.write_parts(parts[:2], lf.FILE_HEADER_SIZE, len(parts[0]) + len(parts[1]))
    w.write_parts(
        parts[2:],
        lf.FILE_HEADER_SIZE + len(parts[0]) + len(parts[1]),
        end - lf.FILE_HEADER_SIZE - len(parts[0]) - len(parts[1]),
    )
    w.sync_all()
    w.close()
    buf = reopen().read_all(4)
    assert buf == lf.encode_file_header(4) + b"".join(parts)
    scan = lf.scan_records(buf, verify_crc=True)
    assert [lf.entry_bytes(buf, o, n) for o, n in zip(scan.offsets, scan.lengths)] == datas


def test_the_interface_joins_parts_for_a_writer_that_only_writes():
    class OnlyWrite(LedgerWriter):
        def __init__(self):
            self.calls = []

        def write(self, data, offset):
            self.calls.append((bytes(data), offset))

        truncate = sync = sync_all = close = lambda self, *a: None  # noqa: E731

    w = OnlyWrite()
    w.write_parts([b"ab", memoryview(b"cd"), b""], 30, 4)
    assert w.calls == [(b"abcd", 30)]


def test_bytes_survive_a_reopen_after_sync(reopen):
    st = reopen()
    w = st.create(3)
    end = _append(w, lf.FILE_HEADER_SIZE, 0, b"x" * 100)
    w.sync_all()
    w.close()
    again = reopen()
    assert again.read_range(3, lf.FILE_HEADER_SIZE, end) == _record(0, b"x" * 100)


def test_cut_shortens_a_ledger_nobody_writes(reopen):
    st = reopen()
    w = st.create(4)
    end = _append(w, lf.FILE_HEADER_SIZE, 0, b"a")
    _append(w, end, 1, b"torn")
    w.close()
    st.cut(4, end)
    buf = reopen().read_all(4)
    assert buf is not None and len(buf) == end


def test_index_round_trip_replace_and_absence(reopen):
    st = reopen()
    assert st.read_index(5) is None
    st.create(5).close()
    st.write_index(5, b"first")
    st.write_index(5, b"second")
    assert reopen().read_index(5) == b"second"
    st.write_index(5, b"third", durable=False)
    assert st.read_index(5) == b"third"


def test_missing_ledgers(storage):
    assert storage.read_all(99) is None
    assert not storage.exists(99)
    with pytest.raises(StorageError):
        storage.read_range(99, 0, 10)
    storage.delete(99)  # absent: no error
    storage.delete(99, durable=True)


def test_delete_removes_bytes_and_index_for_good(reopen):
    st = reopen()
    for lid in (10, 11):
        w = st.create(lid)
        _append(w, lf.FILE_HEADER_SIZE, 0, b"e")
        w.close()
        st.write_index(lid, b"idx")
    st.read_range(10, 0, lf.FILE_HEADER_SIZE)  # a read handle may be cached
    st.delete(10, durable=True)
    for view in (st, reopen()):
        assert not view.exists(10) and view.read_all(10) is None and view.read_index(10) is None
        assert view.list() == {11}


def test_discard_partial_writes_keeps_complete_ledgers(storage):
    w = storage.create(12)
    _append(w, lf.FILE_HEADER_SIZE, 0, b"e")
    w.close()
    storage.write_index(12, b"idx")
    storage.discard_partial_writes()
    assert storage.list() == {12} and storage.read_index(12) == b"idx"


def test_locations_name_each_ledger(storage):
    storage.create(20).close()
    storage.create(21).close()
    a, b = storage.location(20), storage.location(21)
    assert isinstance(a, str) and a and a != b


def test_reads_across_more_ledgers_than_handles_and_after_close(storage):
    ends = {}
    for lid in range(1, 71):
        w = storage.create(lid)
        ends[lid] = _append(w, lf.FILE_HEADER_SIZE, 0, b"L%d" % lid)
        w.close()
    for _ in range(2):
        for lid in range(1, 71):
            blob = storage.read_range(lid, lf.FILE_HEADER_SIZE, ends[lid])
            assert blob == _record(0, b"L%d" % lid)
        storage.close()  # releases handles; the storage stays usable


def test_sync_runs_beside_writes(storage):
    w = storage.create(30)
    end = lf.FILE_HEADER_SIZE
    stop = threading.Event()
    errors: list[BaseException] = []

    def syncing():
        while not stop.is_set():
            try:
                w.sync()
            except BaseException as e:  # pragma: no cover - reported below
                errors.append(e)
                return

    t = threading.Thread(target=syncing)
    t.start()
    try:
        for i in range(200):
            end = _append(w, end, i, b"%d" % i)
    finally:
        stop.set()
        t.join()
    w.sync()
    w.close()
    assert errors == []
    assert len(lf.scan_records(storage.read_all(30), verify_crc=True).entry_ids) == 200
