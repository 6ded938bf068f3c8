"""ObjectLedgerStorage against SeaweedFS: what the LedgerStorage contract does not say.

The merge on seal (objects shrink to two, reads unchanged), ranged reads (one GET of just the
bytes asked for; recent bytes from memory), a crash in the middle of a flush (nothing of it
visible), durability after sync (a new storage over a new client sees the entries), the
background flush, and a ManagedLedger running over object ledgers end to end. Objects are
counted with boto3, not through the code under test.
"""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from compactmq.config import load_config
from compactmq.storage import ledger_file as lf
from compactmq.storage import object_ledgers
from compactmq.storage.managed_ledger import ManagedLedger
from compactmq.storage.object_ledgers import ObjectLedgerSettings, ObjectLedgerStorage, ledgers_prefix
from compactmq.storage.offload.blobstore import BlobStore
from compactmq.storage.position import Position
from harness.wait import wait_until

from . import object_crash_writer as crash

TOPIC = "persistent://public/default/objects"
BUCKET = "object-ledgers"


@pytest.fixture
def place(seaweedfs, object_location):
    """(server, location) under a prefix of this test's own."""
    return seaweedfs, object_location(BUCKET)


def _open(loc, **settings) -> ObjectLedgerStorage:
    """A new storage over a new client (nothing shared with earlier ones)."""
    return ObjectLedgerStorage(BlobStore(loc), TOPIC, ObjectLedgerSettings(**settings))


def _record(entry_id: int, data: bytes) -> bytes:
    return lf.encode_record_header(entry_id, 1000 + entry_id, data) + data


def _ledger_keys(server, loc, ledger_id: int) -> list[str]:
    return server.keys(BUCKET, f"{loc.prefix}/{ledgers_prefix(TOPIC)}/{ledger_id:012d}/")


def _kinds(server, loc, ledger_id: int) -> list[str]:
    """The first letter of each object of a ledger: f(lush), m(erged), i(ndex)."""
    return sorted(k.rsplit("/", 1)[1][:1] for k in _ledger_keys(server, loc, ledger_id))


def _write_flushes(st, ledger_id: int, flushes: int, per_flush: int = 3):
    """Write ``flushes`` syncs of ``per_flush`` records; (writer, record starts, end)."""
    w = st.create(ledger_id)
    end, starts, n = lf.FILE_HEADER_SIZE, [], 0
    for _ in range(flushes):
        for _ in range(per_flush):
            rec = _record(n, b"entry-%04d" % n)
            w.write(rec, end)
            starts.append(end)
            end += len(rec)
            n += 1
        w.sync()
    return w, starts, end


def test_seal_merges_flush_objects_into_one_and_reads_stay_correct(place):
    server, loc = place
    st = _open(loc, flush_interval_ms=0)
    w, starts, end = _write_flushes(st, 1, flushes=6)
    assert len(_ledger_keys(server, loc, 1)) == 7  # the header's object + one per sync
    w.sync_all()
    w.close()
    buf = st.read_all(1)
    scan = lf.scan_records(buf, verify_crc=True)
    st.write_index(1, lf.encode_index(1, scan.offsets, scan.publish_times, scan.valid_end))
    assert st.wait_merged(timeout=30)  # the merge runs in the background
    keys = _ledger_keys(server, loc, 1)
    assert [k.rsplit("/", 1)[1].split("-")[0] for k in keys] == ["index", "m"]
    for view in (st, _open(loc)):
        assert view.read_all(1) == buf
        for i, lo in enumerate(starts):
            hi = starts[i + 1] if i + 1 < len(starts) else end
            assert lf.split_records(view.read_range(1, lo, hi), lo, [lo], hi, i) == [b"entry-%04d" % i]
        assert lf.decode_index(view.read_index(1)).ledger_id == 1
    assert st.location(1).startswith(f"s3://{BUCKET}/") and "/m-" in st.location(1)


def test_reads_are_ranged_gets_and_recent_bytes_come_from_memory(place, monkeypatch):
    server, loc = place
    st = _open(loc, flush_interval_ms=0, tail_cache_bytes=0)
    w, starts, end = _write_flushes(st, 2, flushes=4)
    asked: list[tuple[str, int, int]] = []
    real = BlobStore.read_range

    def recording(self, key, offset, length, size=None):
        asked.append((key.rsplit("/", 1)[1], offset, length))
        return real(self, key, offset, length, size)

    monkeypatch.setattr(BlobStore, "read_range", recording)
    # no tail cache: a flushed record of the open ledger is one ranged GET of its flush object
    lo, hi = starts[4], starts[5]
    assert st.read_range(2, lo, hi) == _record(4, b"entry-0004")
    assert len(asked) == 1 and asked[0][1:] == (lo - starts[3], hi - lo) and asked[0][0].startswith("f-")
    # bytes written and not yet flushed are read from memory
    rec = _record(12, b"unflushed")
    w.write(rec, end)
    asked.clear()
    assert st.read_range(2, end, end + len(rec)) == rec and asked == []
    # a range that starts in flushed bytes and ends in unflushed ones: a GET, then memory
    assert st.read_range(2, starts[11], end + len(rec)) == _record(11, b"entry-0011") + rec
    assert len(asked) == 1 and asked[0][1:] == (starts[11] - starts[9], end - starts[11])
    w.sync_all()
    w.close()
    st.write_index(2, b"idx")
    assert st.wait_merged(timeout=30)
    # sealed and merged: one GET of exactly the range asked for, from the merged object
    other = _open(loc)
    asked.clear()
    assert other.read_range(2, starts[7], starts[9]) == _record(7, b"entry-0007") + _record(8, b"entry-0008")
    assert (
        len(asked) == 1
        and asked[0][0].startswith("m-")
        and asked[0][1:] == (starts[7], starts[9] - starts[7])
    )


def test_the_tail_cache_serves_readers_that_keep_up(place, monkeypatch):
    _, loc = place
    st = _open(loc, flush_interval_ms=0, tail_cache_bytes=1 << 20)
    _, starts, end = _write_flushes(st, 3, flushes=3)
    monkeypatch.setattr(BlobStore, "read_range", lambda *a, **k: pytest.fail("read from the store"))
    assert st.read_range(3, starts[0], end).startswith(_record(0, b"entry-0000"))


def test_a_crash_in_the_middle_of_a_flush_leaves_nothing_of_it_visible(place):
    server, loc = place
    out = subprocess.run(
        [sys.executable, crash.__file__, server.endpoint, BUCKET, loc.prefix],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 9, out.stderr[-2000:]
    assert out.stdout.split()[0] == "synced" and "survived" not in out.stdout
    synced_end = int(out.stdout.split()[1])
    # the process died with part of the flush object uploaded, the upload never completed
    assert any(k.startswith(loc.prefix + "/") for k in server.unfinished_uploads(BUCKET))
    st = ObjectLedgerStorage(BlobStore(loc), crash.TOPIC)
    buf = st.read_all(1)
    assert buf is not None and len(buf) == synced_end
    scan = lf.scan_records(buf, verify_crc=True)
    assert len(scan.entry_ids) == crash.DURABLE and not scan.torn
    # an object cut short but published anyway (its size disagrees with the range its key
    # names) is never read, and recovery's discard removes it
    key = st.flush_key(1, synced_end, synced_end + 100)
    st.store.put(key, [b"half a record"])
    fresh = ObjectLedgerStorage(BlobStore(loc), crash.TOPIC)
    assert fresh.read_all(1) == buf
    fresh.discard_partial_writes()
    assert key not in server.keys(BUCKET, loc.prefix + "/")
    assert fresh.read_all(1) == buf


def test_appends_are_durable_once_sync_returns(place):
    _, loc = place
    # nothing flushes by itself for 3 s (the check below takes milliseconds); the sync waits
    # at most those 3 s for more appends to share its object write
    st = _open(loc, flush_interval_ms=3000)
    w = st.create(4)
    rec = _record(0, b"acknowledged")
    w.write(rec, lf.FILE_HEADER_SIZE)
    # written, not synced: only in this process's memory
    assert _open(loc).read_all(4) == lf.encode_file_header(4)
    w.sync()
    # synced: a storage over a new client sees it, while the writer is still open
    assert _open(loc).read_range(4, lf.FILE_HEADER_SIZE, lf.FILE_HEADER_SIZE + len(rec)) == rec
    w.close()


def test_unsynced_bytes_are_flushed_by_interval_and_by_size(place):
    _, loc = place
    st = _open(loc, flush_interval_ms=50, flush_max_bytes=64 * 1024)
    w = st.create(5)
    rec = _record(0, b"nobody syncs me")
    w.write(rec, lf.FILE_HEADER_SIZE)
    end = lf.FILE_HEADER_SIZE + len(rec)
    wait_until(
        lambda: _open(loc).read_all(5) == lf.encode_file_header(5) + rec, timeout=10, what="interval flush"
    )
    big = _record(1, b"b" * (64 * 1024))
    slow = _open(loc, flush_interval_ms=60_000, flush_max_bytes=64 * 1024)
    w2 = slow.create(6)
    w2.write(big, lf.FILE_HEADER_SIZE)
    wait_until(
        lambda: len(_open(loc).read_all(6) or b"") == lf.FILE_HEADER_SIZE + len(big), what="size flush"
    )
    w.close()
    w2.close()
    assert end == len(st.read_all(5))


def test_bytes_written_during_a_flush_are_flushed_by_the_interval_too(place, monkeypatch):
    _, loc = place
    st = _open(loc, flush_interval_ms=50)
    w = st.create(9)
    first, second = _record(0, b"first"), _record(1, b"written while the PUT runs")
    end = lf.FILE_HEADER_SIZE + len(first)
    real = object_ledgers.put_object

    def put_and_write_meanwhile(store, key, data):
        if not calls:
            calls.append(key)
            w.write(second, end)
        real(store, key, data)

    calls: list[str] = []
    monkeypatch.setattr(object_ledgers, "put_object", put_and_write_meanwhile)
    w.write(first, lf.FILE_HEADER_SIZE)  # nobody syncs: the background flush writes both
    whole = lf.encode_file_header(9) + first + second
    wait_until(lambda: _open(loc).read_all(9) == whole, timeout=10, what="both records flushed")
    w.close()


def test_delete_removes_every_object_of_a_ledger(place):
    server, loc = place
    st = _open(loc, flush_interval_ms=0)
    w, _, _ = _write_flushes(st, 7, flushes=3)
    w.close()
    st.write_index(7, b"idx")
    _write_flushes(st, 8, flushes=2)[0].close()
    st.delete(7, durable=True)
    assert _ledger_keys(server, loc, 7) == [] and _ledger_keys(server, loc, 8)
    assert _open(loc).list() == {8}


def _ml_opener(open_storage, loc, **overrides):
    """A function opening the managed ledger of TOPIC over object ledgers in ``loc`` (a new
    client each time), its metadata in a local metadata store."""
    overrides = {
        "managedLedgerMinLedgerRolloverTimeMinutes": 0,
        "objectLedgerFlushIntervalMillis": 1,
        **overrides,
    }
    st = open_storage(**overrides)
    st.ensure_namespace("public/default")
    st.topic_metadata.create_topic(TOPIC)
    config = load_config(overrides=overrides)

    def open_ml() -> ManagedLedger:
        storage = ObjectLedgerStorage(BlobStore(loc), TOPIC, ObjectLedgerSettings.from_config(config))
        return ManagedLedger(
            TOPIC, str(st.topic_dir(TOPIC)), st.topic_metadata, config, st._clock, ledger_storage=storage
        )

    return open_ml


def test_a_managed_ledger_runs_over_object_ledgers(place, open_storage):
    """Append, roll over, close, reopen over a new client, read everything back."""
    server, loc = place
    overrides = {"managedLedgerMaxEntriesPerLedger": 5, "managedLedgerMinLedgerRolloverTimeMinutes": 0}
    st = open_storage(**overrides)
    st.ensure_namespace("public/default")
    st.topic_metadata.create_topic(TOPIC)
    config = load_config(overrides={**overrides, "objectLedgerFlushIntervalMillis": 1})

    def open_ml() -> ManagedLedger:
        settings = ObjectLedgerSettings.from_config(config)
        storage = ObjectLedgerStorage(BlobStore(loc), TOPIC, settings)
        return ManagedLedger(
            TOPIC, str(st.topic_dir(TOPIC)), st.topic_metadata, config, st._clock, ledger_storage=storage
        )

    ml = open_ml()
    positions = [ml.append(b"m-%02d" % i) for i in range(12)]
    positions += ml.append_many([b"m-%02d" % i for i in range(12, 15)])
    assert len({p.ledger_id for p in positions}) >= 3  # rolled over by entry count
    assert [d for _, d in ml.read_entries(positions[0], 100)] == [b"m-%02d" % i for i in range(15)]
    ml.close()
    ml = open_ml()  # recovery from the object store and the metadata store alone
    try:
        got = ml.read_entries(Position(positions[0].ledger_id, 0), 100)
        assert [d for _, d in got] == [b"m-%02d" % i for i in range(15)]
        assert [p for p, _ in got] == positions
        assert ml.read_entry(positions[7]) == b"m-07"
        # every sealed ledger gets merged (in the background): an index and one data object
        for lid in {p.ledger_id for p in positions}:
            wait_until(
                lambda: _kinds(server, loc, lid) == ["i", "m"], timeout=30, what=f"ledger {lid} merged"
            )
        assert ml.append(b"after reopen").ledger_id > positions[-1].ledger_id
    finally:
        ml.close()


def test_concurrent_appends_share_flush_objects(place, open_storage, monkeypatch):
    """Group commit over object writes: appenders that arrive within one flush interval, or
    while a PUT runs, are acknowledged by one object write."""
    _, loc = place
    open_ml = _ml_opener(open_storage, loc, objectLedgerFlushIntervalMillis=5)
    ml = open_ml()
    flushes: list[str] = []
    real = object_ledgers.put_object

    def counting(store, key, data):
        if "/f-" in key:
            flushes.append(key)
        real(store, key, data)

    monkeypatch.setattr(object_ledgers, "put_object", counting)
    threads, per_thread = 8, 25
    acked: list[Position] = []

    def appender(t: int) -> None:
        for i in range(per_thread):
            acked.append(ml.append(b"t%d-%d" % (t, i)))

    workers = [threading.Thread(target=appender, args=(t,)) for t in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    try:
        assert len(acked) == threads * per_thread
        assert len(flushes) <= len(acked) // 2, (len(flushes), len(acked))
        assert len(ml.read_entries(Position(acked[0].ledger_id, 0), 1000)) == len(acked)
    finally:
        ml.close()


def test_a_managed_ledger_recovers_from_the_object_store_after_a_crash(place, open_storage):
    """The writer's process is gone without closing anything: a new one recovers the ledger
    left OPEN from its flush objects, with every acknowledged entry."""
    server, loc = place
    open_ml = _ml_opener(open_storage, loc)
    crashed = open_ml()
    positions = crashed.append_many([b"acked-%d" % i for i in range(6)])
    open_id = positions[0].ledger_id
    assert any("/f-" in k for k in _ledger_keys(server, loc, open_id))  # not merged: still open
    ml = open_ml()  # `crashed` is abandoned as a killed process would leave it
    try:
        got = ml.read_entries(positions[0], 100)
        assert [p for p, _ in got] == positions
        assert [d for _, d in got] == [b"acked-%d" % i for i in range(6)]
        # recovery sealed it: merged (in the background), with its index
        wait_until(
            lambda: _kinds(server, loc, open_id) == ["i", "m"], timeout=30, what="recovered ledger merged"
        )
    finally:
        ml.close()


def test_reads_go_on_while_a_sealed_ledger_is_merged(place):
    """Readers holding the flush-object layout when the merge deletes those objects list the
    ledger again and read the merged object: no read fails, every byte is the same."""
    server, loc = place
    st = _open(loc, flush_interval_ms=0)
    w, starts, end = _write_flushes(st, 10, flushes=20, per_flush=2)
    w.close()
    expected = st.read_all(10)
    reader = _open(loc)
    reader.read_range(10, starts[0], end)  # lists the flush objects (cached layout)
    errors: list[BaseException] = []
    done = threading.Event()

    def reading() -> None:
        while not done.is_set():
            try:
                assert reader.read_range(10, starts[0], end) == expected[starts[0] :]
            except BaseException as e:
                errors.append(e)
                return

    t = threading.Thread(target=reading)
    t.start()
    try:
        st.write_index(10, b"idx")
        assert st.wait_merged(timeout=30)
        wait_until(lambda: _kinds(server, loc, 10) == ["i", "m"], timeout=30, what="merged")
        reader.read_range(10, starts[0], end)
    finally:
        done.set()
        t.join()
    assert errors == []


def test_the_location_of_a_sealed_ledger_is_one_readable_object(place):
    """Another process (a Spark task) reads a sealed ledger by URI as one object: location
    merges it first when the background merger has not yet."""
    from compactmq.storage.offload.blobstore import location_from_url, open_store

    server, loc = place
    st = _open(loc, flush_interval_ms=0)
    w, _, _ = _write_flushes(st, 12, flushes=3)
    assert "/m-" not in st.location(12)  # being written: no single object names it
    w.close()
    st.put_object(f"{st.ledger_prefix(12)}/index", b"idx")  # sealed, merge not scheduled
    url = st.location(12)
    assert "/m-" in url and _kinds(server, loc, 12) == ["i", "m"]
    where, key = location_from_url(url)
    assert bytes(open_store(where).read_all(key)) == st.read_all(12)


def test_the_location_of_a_ledger_sealed_during_a_sync_is_its_merged_object(place):
    """The appender seals a ledger while a sync still uses its writer, and closes the writer
    only when that sync ends: the index is written with the writer still open. A compaction
    run asking the ledger's location meanwhile gets its merged object once the writer closed,
    never its key prefix (a Spark task failed on it: FileNotFoundError)."""
    server, loc = place
    st = _open(loc, flush_interval_ms=0)
    w, _, _ = _write_flushes(st, 15, flushes=3)
    st.write_index(15, b"idx")  # sealed; the writer closes when the sync in flight ends
    closer = threading.Timer(0.5, w.close)
    closer.start()
    try:
        url = st.location(15)
    finally:
        closer.join()
    assert "/m-" in url
    assert st.wait_merged(timeout=30)
    assert _kinds(server, loc, 15) == ["i", "m"]


def test_the_location_of_a_deleted_ledger_is_an_error_not_a_key_prefix(place):
    """A compaction run plans on a ledger list, then asks each ledger's location: one deleted
    meanwhile (a trim, a new owner's recovery) is a clear StorageError there -- the run fails and
    is tried again -- not its key prefix, which a Spark task failed to read as FileNotFoundError."""
    from compactmq.errors import StorageError

    _server, loc = place
    st = _open(loc, flush_interval_ms=0)
    w, _, _ = _write_flushes(st, 13, flushes=2)
    w.close()
    assert st.exists(13)
    _open(loc).delete(13)  # another storage of the topic deleted it
    with pytest.raises(StorageError, match="ledger 13 has no objects"):
        st.location(13)


def test_a_sealed_ledger_left_unmerged_is_merged_at_the_next_open(place):
    """The index was written, the process stopped before its merge: the next open's
    discard_partial_writes (recovery's first step) merges it."""
    server, loc = place
    st = _open(loc, flush_interval_ms=0)
    w, _, _ = _write_flushes(st, 11, flushes=4)
    w.close()
    st.put_object(f"{st.ledger_prefix(11)}/index", b"idx")  # the seal's index, no merge
    assert _kinds(server, loc, 11) == ["f"] * 5 + ["i"]
    again = _open(loc)
    again.discard_partial_writes()
    assert again.wait_merged(timeout=30)
    assert _kinds(server, loc, 11) == ["i", "m"]
    assert again.read_all(11) == st.read_all(11)


def test_writes_go_in_at_once_while_a_flush_is_in_flight(place, open_storage, monkeypatch):
    """The broker's loop writes SENDs to an object ledger at once (``try_write_many``), even
    while a flush's PUT is in flight; they become visible only after a later sync flushed
    them -- so the next flush carries everything written during the PUT."""
    _, loc = place
    ml = _ml_opener(open_storage, loc, objectLedgerFlushIntervalMillis=0)()
    real = object_ledgers.put_object
    started, gate = threading.Event(), threading.Event()
    flushed: list[bytes] = []

    def held(store, key, data):
        if "/f-" in key:
            flushed.append(bytes(data))
            if len(flushed) == 1:
                started.set()
                assert gate.wait(20)
        real(store, key, data)

    monkeypatch.setattr(object_ledgers, "put_object", held)
    try:
        assert ml.try_write_many([b"a"], [None]) is not None  # no rollover due: written here
        assert ml.try_sync_written() is None  # a PUT is never made on the broker's loop
        syncer = threading.Thread(target=ml.sync_written)
        syncer.start()
        assert started.wait(10)
        written = [ml.try_write_many([b"w%d" % i], [None]) for i in range(3)]  # during the PUT
        assert all(w is not None for w in written)
        assert ml.durable_seq < written[-1][2]  # written, not acknowledged: not durable yet
        gate.set()
        syncer.join(20)
        assert ml.sync_written() == written[-1][2]
        got = [d for _, d in ml.read_entries(ml.first_position(), 10)]
        assert got == [b"a", b"w0", b"w1", b"w2"]
        assert len(flushed) == 2 and all(b"w%d" % i in flushed[1] for i in range(3))  # one flush
    finally:
        gate.set()
        ml.close()


def test_a_recovery_whose_fenced_commit_fails_deletes_no_object(place, open_storage, monkeypatch):
    """A broker that lost the topic (paused past its session) and recovers it anyway must
    delete nothing: its commit fails on the fence, and every delete of recovery -- superseded
    objects included (``discard_partial_writes``, which once ran first, unfenced) -- comes only
    after that commit (issue 26)."""
    from compactmq.storage.resources.fence import Fenced
    from compactmq.storage.resources.topic_metadata import TopicMetadata

    server, loc = place
    open_ml = _ml_opener(open_storage, loc)
    ml = open_ml()
    positions = ml.append_many([b"acked-%d" % i for i in range(4)])
    ml.close()  # sealed: index written, merged in the background
    sealed = positions[0].ledger_id
    wait_until(lambda: _kinds(server, loc, sealed) == ["i", "m"], timeout=30, what="sealed ledger merged")
    # a flush object the merge superseded (as a crash between the merged write and the deletes
    # leaves it): exactly what discard_partial_writes removes -- but only under the fence
    st = _open(loc)
    superseded = f"{st.ledger_prefix(sealed)}/f-0000000000000000-0000000000000024-e0000000000"
    st.store.put(superseded, [lf.encode_file_header(sealed)])
    before = sorted(server.keys(BUCKET, f"{loc.prefix}/"))

    def fenced(self, *args, **kwargs):
        raise Fenced("ownership epoch 1 is over")

    monkeypatch.setattr(TopicMetadata, "add_ledger", fenced)
    with pytest.raises(Fenced):
        open_ml()
    assert sorted(server.keys(BUCKET, f"{loc.prefix}/")) == before
    monkeypatch.undo()
    ml = open_ml()  # the owner's recovery: its commit goes through, then the superseded goes
    try:
        assert [d for _, d in ml.read_entries(positions[0], 100)] == [b"acked-%d" % i for i in range(4)]
        assert f"{loc.prefix}/{superseded}" not in server.keys(BUCKET, f"{loc.prefix}/")
    finally:
        ml.close()
