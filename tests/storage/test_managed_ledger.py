import threading

import pytest

from compactmq.errors import NotFound, TopicNotFound
from compactmq.storage import LEDGER_CLOSED, LEDGER_OPEN, Position


def test_append_then_read_back(open_storage):
    ml = open_storage().open_managed_ledger("t")
    p0 = ml.append(b"hello")
    p1 = ml.append(b"")
    p2 = ml.append(b"x" * 100_000)
    assert (
        p0 < p1 < p2 and p0.ledger_id == p2.ledger_id and [p0.entry_id, p1.entry_id, p2.entry_id] == [0, 1, 2]
    )
    assert ml.read_entry(p0) == b"hello"
    assert ml.read_entry(p1) == b""
    assert ml.read_entry(p2) == b"x" * 100_000
    assert ml.first_position() == p0 and ml.last_position() == p2
    assert [d for _, d in ml.read_entries(Position(0, 0), 10)] == [b"hello", b"", b"x" * 100_000]


def test_empty_topic_positions(open_storage):
    ml = open_storage().open_managed_ledger("t")
    assert ml.first_position() is None and ml.last_position() is None
    assert ml.read_entries(Position(0, 0), 10) == []
    nxt = ml.next_position(Position(-1, -1))
    assert nxt.entry_id == 0  # where the first append goes
    assert ml.append(b"a") == nxt


def test_read_missing_entry_is_not_found(open_storage):
    ml = open_storage().open_managed_ledger("t")
    p = ml.append(b"a")
    with pytest.raises(NotFound):
        ml.read_entry(Position(p.ledger_id, 1))
    with pytest.raises(NotFound):
        ml.read_entry(Position(999, 0))


def test_rollover_by_entry_count(open_storage):
    ml = open_storage(managedLedgerMaxEntriesPerLedger=3).open_managed_ledger("t")
    ps = [ml.append(b"%d" % i) for i in range(8)]
    assert [p.entry_id for p in ps] == [0, 1, 2, 0, 1, 2, 0, 1]
    infos = ml.ledgers()
    assert [i.entry_count for i in infos] == [3, 3, 2]
    assert [i.state for i in infos] == [LEDGER_CLOSED, LEDGER_CLOSED, LEDGER_OPEN]
    assert [d for _, d in ml.read_entries(ps[0], 100)] == [b"%d" % i for i in range(8)]


def test_rollover_by_size(open_storage):
    ml = open_storage(managedLedgerMaxSizePerLedgerMbytes=1).open_managed_ledger("t")
    for _ in range(5):
        ml.append(b"z" * 400_000)
    assert [i.entry_count for i in ml.ledgers()] == [3, 2]


def test_rollover_by_age(open_storage, clock):
    ml = open_storage(managedLedgerMaxLedgerRolloverTimeMinutes=10).open_managed_ledger("t")
    a = ml.append(b"a")
    clock.advance(9 * 60_000)
    b = ml.append(b"b")
    clock.advance(2 * 60_000)
    c = ml.append(b"c")
    assert a.ledger_id == b.ledger_id != c.ledger_id
    assert not ml.maybe_rollover()
    clock.advance(11 * 60_000)
    assert ml.maybe_rollover()


def test_minimum_rollover_time_keeps_a_full_young_ledger(open_storage, clock):
    """Pulsar's currentLedgerIsFull: a ledger past its entry, size or age limit rolls only once
    it is older than managedLedgerMinLedgerRolloverTimeMinutes (strictly), however full."""
    ml = open_storage(
        managedLedgerMaxEntriesPerLedger=3,
        managedLedgerMaxSizePerLedgerMbytes=1,
        managedLedgerMinLedgerRolloverTimeMinutes=10,
        managedLedgerMaxLedgerRolloverTimeMinutes=15,
    ).open_managed_ledger("t")
    first = [ml.append(b"z" * 400_000) for _ in range(8)]  # past both the entry and size limits
    assert len({p.ledger_id for p in first}) == 1 and [i.entry_count for i in ml.ledgers()] == [8]
    assert not ml.maybe_rollover()
    clock.advance(10 * 60_000)  # exactly the minimum: not older than it yet
    assert not ml.maybe_rollover()
    clock.advance(1)
    rolled = ml.append(b"next")
    assert rolled.ledger_id != first[0].ledger_id and [i.entry_count for i in ml.ledgers()] == [8, 1]
    # a ledger under every space limit rolls at the maximum age, the minimum long past
    clock.advance(15 * 60_000)
    assert ml.maybe_rollover()


def test_minimum_rollover_time_wins_over_a_shorter_maximum(open_storage, clock):
    ml2 = open_storage(
        managedLedgerMinLedgerRolloverTimeMinutes=10, managedLedgerMaxLedgerRolloverTimeMinutes=5
    ).open_managed_ledger("t2")
    ml2.append(b"a")
    clock.advance(6 * 60_000)
    assert not ml2.maybe_rollover()
    clock.advance(5 * 60_000)
    assert ml2.maybe_rollover()


def test_default_minimum_rollover_time_is_pulsars():
    from compactmq.config import SETTINGS

    # the test run sets 0 (tests/conftest.py); the shipped default is Pulsar's 10 minutes
    assert SETTINGS["managedLedgerMinLedgerRolloverTimeMinutes"].help.startswith("never roll")
    import subprocess
    import sys

    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from compactmq.config import load_config; "
            "print(load_config()['managedLedgerMinLedgerRolloverTimeMinutes'])",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert out == "10"


def test_append_many_is_one_ledger_in_order(open_storage):
    ml = open_storage().open_managed_ledger("t")
    ps = ml.append_many([b"a", b"b", b"c"], [10, 20, 30])
    assert [p.entry_id for p in ps] == [0, 1, 2]
    assert [d for _, d in ml.read_entries(ps[0], 10)] == [b"a", b"b", b"c"]
    assert ml.ledgers()[0].first_publish_ms == 10 and ml.ledgers()[0].last_publish_ms == 30


def test_reopen_after_close_keeps_everything(open_storage, tmp_path):
    st = open_storage(managedLedgerMaxEntriesPerLedger=4)
    ml = st.open_managed_ledger("t")
    ps = [ml.append(b"%d" % i) for i in range(10)]
    st.close()
    ml = open_storage(managedLedgerMaxEntriesPerLedger=4).open_managed_ledger("t")
    assert [d for _, d in ml.read_entries(ps[0], 100)] == [b"%d" % i for i in range(10)]
    new = ml.append(b"new")
    assert new > ps[-1]


def test_open_without_create(open_storage):
    st = open_storage()
    with pytest.raises(TopicNotFound):
        st.open_managed_ledger("nope", create=False)
    st.open_managed_ledger("yes")
    assert st.open_managed_ledger("persistent://public/default/yes", create=False) is st.open_managed_ledger(
        "yes"
    )
    assert st.topics() == ["persistent://public/default/yes"]


def test_concurrent_appenders_all_land(open_storage):
    ml = open_storage(managedLedgerMaxEntriesPerLedger=50).open_managed_ledger("t")
    results: dict[int, list] = {}

    def writer(k):
        results[k] = [ml.append(b"%d-%d" % (k, i)) for i in range(100)]

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    everything = ml.read_entries(Position(0, 0), 10_000)
    assert len(everything) == 400
    by_pos = dict(everything)
    for k, ps in results.items():
        assert ps == sorted(ps)
        assert [by_pos[p] for p in ps] == [b"%d-%d" % (k, i) for i in range(100)]


def test_group_commit_shares_syncs(open_storage, monkeypatch):
    import os
    import time

    ml = open_storage(managedLedgerMaxEntriesPerLedger=100_000).open_managed_ledger("t")
    calls = []
    real = os.fdatasync

    def slow_sync(fd):
        calls.append(fd)
        time.sleep(0.002)  # a disk that takes 2 ms per sync
        real(fd)

    monkeypatch.setattr(os, "fdatasync", slow_sync)
    threads = [threading.Thread(target=lambda: [ml.append(b"e") for _ in range(25)]) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert ml.entry_count() == 200
    assert len(calls) < 100, f"{len(calls)} syncs for 200 appends from 8 threads"
    calls.clear()
    ml.append_many([b"m"] * 50)
    assert len(calls) == 1


def test_sync_every_append_when_alone(open_storage, monkeypatch):
    import os

    ml = open_storage().open_managed_ledger("t")
    calls = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (calls.append(fd), real(fd)))
    for _ in range(5):
        ml.append(b"e")
    assert len(calls) == 5


def test_no_sync_when_sync_data_is_off(open_storage, monkeypatch):
    import os

    ml = open_storage(managedLedgerSyncData=False).open_managed_ledger("t")
    calls = []
    monkeypatch.setattr(os, "fdatasync", lambda fd: calls.append(fd))
    ps = [ml.append(b"e") for _ in range(5)]
    assert calls == [] and ml.last_position() == ps[-1]


def test_read_entries_byte_limit(open_storage):
    ml = open_storage().open_managed_ledger("t")
    ps = [ml.append(b"x" * 100) for _ in range(10)]
    assert len(ml.read_entries(ps[0], 100, max_bytes=350)) == 3
    assert len(ml.read_entries(ps[0], 100, max_bytes=10)) == 1  # at least one entry
    assert [p for p, _ in ml.read_entries(ps[8], 100, max_bytes=10_000)] == ps[8:]


def test_reads_start_at_first_entry_at_or_after_position(open_storage):
    ml = open_storage(managedLedgerMaxEntriesPerLedger=2).open_managed_ledger("t")
    ps = [ml.append(b"%d" % i) for i in range(5)]
    assert ml.read_entries(Position(ps[1].ledger_id, 5), 1)[0][0] == ps[2]
    assert ml.read_entries(Position(ps[2].ledger_id, -1), 1)[0][0] == ps[2]
    assert ml.next_position(ps[1]) == ps[2] and ml.next_position(ps[-1]) == Position(ps[-1].ledger_id, 1)
    assert ml.previous_position(ps[2]) == Position(ps[2].ledger_id, -1)


def test_find_position_by_publish_time(open_storage):
    ml = open_storage(managedLedgerMaxEntriesPerLedger=3).open_managed_ledger("t")
    ps = [ml.append(b"%d" % i, publish_time_ms=1000 + 10 * i) for i in range(8)]
    assert ml.find_position_by_publish_time(0) == ps[0]
    assert ml.find_position_by_publish_time(1000) == ps[0]
    assert ml.find_position_by_publish_time(1001) == ps[1]
    assert ml.find_position_by_publish_time(1030) == ps[3]
    assert ml.find_position_by_publish_time(1070) == ps[7]
    assert ml.find_position_by_publish_time(5000) == ml.next_position(ps[7])


def test_sizes_and_backlog_helpers(open_storage):
    ml = open_storage(managedLedgerMaxEntriesPerLedger=3).open_managed_ledger("t")
    ps = [ml.append(b"y" * (i + 1)) for i in range(7)]  # sizes 1..7
    assert ml.total_size() == 28 and ml.entry_count() == 7
    assert ml.entries_after(ps[2]) == 4 and ml.size_after(ps[2]) == 4 + 5 + 6 + 7
    assert ml.entries_after(ps[4]) == 2 and ml.size_after(ps[4]) == 13
    assert ml.entries_after(Position(ps[0].ledger_id, -1)) == 7
    assert ml.size_after(ps[6]) == 0
    assert sum(i.size for i in ml.ledgers()) == 28


def test_lost_index_is_rebuilt(open_storage):
    import os

    from compactmq.storage import ledger_file as lf

    st = open_storage(managedLedgerMaxEntriesPerLedger=3)
    ml = st.open_managed_ledger("t")
    ps = [ml.append(b"%d" % i) for i in range(5)]
    idx = lf.index_path_for(ml.ledger_path(ps[0].ledger_id))
    st.close()
    os.unlink(idx)
    ml = open_storage(managedLedgerMaxEntriesPerLedger=3).open_managed_ledger("t")
    assert ml.read_entry(ps[1]) == b"1"
    assert os.path.exists(idx)


def test_damaged_closed_ledger_is_an_error_not_silence(open_storage):
    from compactmq.errors import StorageError

    st = open_storage(managedLedgerMaxEntriesPerLedger=3)
    ml = st.open_managed_ledger("t")
    ps = [ml.append(b"entry-%d" % i) for i in range(4)]
    path = ml.ledger_path(ps[0].ledger_id)
    st.close()
    with open(path, "r+b") as f:
        f.seek(-1, 2)
        f.write(b"!")
    ml = open_storage(managedLedgerMaxEntriesPerLedger=3).open_managed_ledger("t")
    assert ml.read_entry(ps[0]) == b"entry-0"
    with pytest.raises(StorageError):
        ml.read_entry(ps[2])


def test_orphan_files_are_removed_on_open(open_storage):
    import os

    st = open_storage()
    ml = st.open_managed_ledger("t")
    ml.append(b"a")
    orphan = ml.ledger_path(424242)
    st.close()
    with open(orphan, "wb") as f:
        f.write(b"left by a crash")
    open_storage().open_managed_ledger("t")
    assert not os.path.exists(orphan)


def test_data_dir_is_locked_by_one_writer(open_storage):
    from compactmq.errors import StorageError

    open_storage()
    with pytest.raises(StorageError):
        open_storage()
    open_storage(read_only=True)  # a compaction job beside the broker is fine


def test_read_only_storage_sees_the_writers_entries(open_storage):
    writer = open_storage(managedLedgerMaxEntriesPerLedger=3)
    ml = writer.open_managed_ledger("t")
    ps = [ml.append(b"%d" % i) for i in range(5)]
    reader = open_storage(read_only=True)
    ro = reader.open_managed_ledger("t", create=False)
    assert [d for _, d in ro.read_entries(Position(0, 0), 10)] == [b"%d" % i for i in range(5)]
    assert ro.last_position() == ps[-1]
    with pytest.raises(Exception):
        ro.append(b"no")
    ps.append(ml.append(b"5"))
    ro.refresh()
    assert ro.last_position() == ps[-1]
    with pytest.raises(TopicNotFound):
        reader.open_managed_ledger("other")
    # the read-only side changed nothing
    assert [i.entry_count for i in ml.ledgers()] == [3, 3]


def test_a_compaction_hold_moved_by_another_process_is_learnt_at_retention(open_storage):
    from compactmq.storage import COMPACTION_CURSOR

    writer = open_storage()
    ml = writer.open_managed_ledger("t")
    ps = [ml.append(b"%d" % i) for i in range(5)]
    job = open_storage(read_only=True)
    job_ml = job.open_managed_ledger("t", create=False)
    assert job_ml.hold_for_compaction()  # a compact-topic job: written to the store only
    job_ml.open_cursor(COMPACTION_CURSOR).ack_cumulative(ps[2])  # its commit moves the hold
    assert ml.get_cursor(COMPACTION_CURSOR) is None  # learnt at the next retention check
    ml.trim_to_retention(retention_time_minutes=60, retention_size_mb=-1)  # keeps all, reads holds
    assert ml.get_cursor(COMPACTION_CURSOR).mark_delete_position == ps[2]


def test_delete_managed_ledger(open_storage):
    import os

    st = open_storage()
    ml = st.open_managed_ledger("t")
    ml.append(b"a")
    ml.open_cursor("s")
    d = st.topic_dir("t")
    st.delete_managed_ledger("t")
    assert not os.path.exists(d) and st.topics() == []
    with pytest.raises(TopicNotFound):
        st.delete_managed_ledger("t")
    ml = st.open_managed_ledger("t")
    assert ml.last_position() is None and ml.cursors() == []


def test_topic_dirs_are_safe_for_any_name(open_storage):
    from compactmq.errors import InvalidTopicName

    st = open_storage()
    d = st.topic_dir("persistent://a/b/c%2F:=")
    assert d.startswith(str(st.data_dir / "ledgers")) and "/../" not in d and not d.endswith("/..")
    for name in ("persistent://../../x", "persistent://a/b/..", "persistent://a/b/."):
        with pytest.raises(InvalidTopicName):  # '.' and '..' are path segments, not names
            st.open_managed_ledger(name)
    ml = st.open_managed_ledger("persistent://public/default/...")
    ml.append(b"ok")
    assert ml.read_entry(ml.last_position()) == b"ok"


def test_unacknowledged_writes_are_invisible_until_durable(open_storage, monkeypatch):
    """Readers never see an entry a crash could take back (the LAC rule)."""
    import os

    ml = open_storage().open_managed_ledger("t")
    first = ml.append(b"a")
    gate = threading.Event()
    entered = threading.Event()
    real = os.fdatasync

    def held_sync(fd):
        entered.set()
        gate.wait(5)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", held_sync)
    t = threading.Thread(target=ml.append, args=(b"b",))
    t.start()
    assert entered.wait(5)
    assert ml.last_position() == first and len(ml.read_entries(first, 10)) == 1
    gate.set()
    t.join()
    assert len(ml.read_entries(first, 10)) == 2


def test_failed_sync_fences_and_reopen_recovers(open_storage, monkeypatch):
    import os

    from compactmq.errors import StorageError

    st = open_storage()
    ml = st.open_managed_ledger("t")
    good = ml.append(b"good")

    def broken(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", broken)
    with pytest.raises(StorageError):
        ml.append(b"unsure")
    assert ml.fenced
    with pytest.raises(StorageError):
        ml.append(b"refused")
    assert ml.read_entry(good) == b"good"  # reads go on
    monkeypatch.undo()
    ml2 = st.open_managed_ledger("t")  # reopened and recovered
    assert ml2 is not ml and not ml2.fenced
    assert ml2.read_entry(good) == b"good"
    p = ml2.append(b"again")
    assert ml2.read_entry(p) == b"again"


def test_oversized_entry_is_refused(open_storage, monkeypatch):
    from compactmq.errors import InvalidInput
    from compactmq.storage import ledger_file as lf

    ml = open_storage().open_managed_ledger("t")
    monkeypatch.setattr(lf, "MAX_ENTRY_SIZE", 10)
    with pytest.raises(InvalidInput):
        ml.append(b"x" * 11)
    assert ml.append(b"x" * 10).entry_id == 0


def test_closed_ledger_indexes_are_evicted_and_reloaded(open_storage, monkeypatch):
    from compactmq.storage import reader

    monkeypatch.setattr(reader, "MAX_LOADED_INDEXES", 2)
    ml = open_storage(managedLedgerMaxEntriesPerLedger=2).open_managed_ledger("t")
    ps = [ml.append(b"%d" % i) for i in range(12)]
    state = ml._ledgers
    loaded = [led for led in state.ledgers if led.offsets is not None and led is not state.current]
    assert len(loaded) <= 2
    assert [d for _, d in ml.read_entries(ps[0], 100)] == [b"%d" % i for i in range(12)]
    assert ml.find_position_by_publish_time(0) == ps[0]


@pytest.mark.timeout(60)
def test_appends_reads_acks_and_trims_at_once(open_storage):
    """Appenders (single and batched), a tailing reader, an acking cursor and retention,
    all at once across frequent rollovers: no deadlock, nothing lost or reordered."""
    ml = open_storage(
        managedLedgerMaxEntriesPerLedger=7, managedLedgerGroupCommitMaxDelayMicros=100
    ).open_managed_ledger("t")
    cursor = ml.open_cursor("sub")
    stop = threading.Event()
    errors = []
    written: dict[int, list[Position]] = {}

    def appender(k):
        try:
            mine = written.setdefault(k, [])
            for i in range(120):
                if k == 0:
                    mine.extend(ml.append_many([b"%d:%d" % (k, i)] * 3))
                else:
                    mine.append(ml.append(b"%d:%d" % (k, i)))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    def tail_reader():
        try:
            while not stop.is_set():
                got = cursor.read_entries(50)
                if got:
                    ps = [p for p, _ in got]
                    assert ps == sorted(ps)
                    cursor.ack_individual(ps[::2])
                    cursor.ack_individual(ps[1::2])
                else:
                    stop.wait(0.001)
        except Exception as e:  # pragma: no cover
            errors.append(e)

    def trimmer():
        try:
            while not stop.is_set():
                ml.trim_to_retention(retention_time_minutes=0, retention_size_mb=0)
                stop.wait(0.002)
        except Exception as e:  # pragma: no cover
            errors.append(e)

    writers = [threading.Thread(target=appender, args=(k,)) for k in range(4)]
    others = [threading.Thread(target=tail_reader), threading.Thread(target=trimmer)]
    for t in writers + others:
        t.start()
    for t in writers:
        t.join()
    last = ml.last_position()
    deadline = threading.Event()
    for _ in range(500):
        if cursor.mark_delete_position >= last:
            break
        deadline.wait(0.01)
    stop.set()
    for t in others:
        t.join()
    assert not errors, errors
    assert cursor.mark_delete_position == last
    assert sum(len(v) for v in written.values()) == 3 * 120 + 3 * 120
    for ps in written.values():
        assert ps == sorted(ps) and len(set(ps)) == len(ps)
    ml.trim_to_retention(retention_time_minutes=0, retention_size_mb=0)
    assert len(ml.ledgers()) <= 2


def test_io_errors_surface_as_storage_errors(open_storage, monkeypatch):
    import os

    from compactmq.errors import StorageError

    st = open_storage(managedLedgerMaxEntriesPerLedger=2)
    ml = st.open_managed_ledger("t")
    ps = [ml.append(b"%d" % i) for i in range(3)]

    def eio(*a, **k):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "pread", eio)
    with pytest.raises(StorageError):
        ml.read_entries(ps[0], 10)
    with pytest.raises(StorageError):
        ml.read_entry(ps[0])
    monkeypatch.undo()
    assert ml.read_entry(ps[0]) == b"0"


def test_close_whose_final_sync_fails_is_reported(open_storage, monkeypatch):
    import os

    from compactmq.errors import StorageError

    ml = open_storage().open_managed_ledger("t")
    ml.append(b"a")
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(5, "Input/output error")))
    with pytest.raises(StorageError):
        ml.close()
    assert ml.fenced and ml.closed


@pytest.mark.parametrize("size", [100, 9000])
def test_append_many_of_more_records_than_one_pwritev_takes(open_storage, size):
    # 9000 B entries go out as header + entry buffers (pwritev), in slices of IOV_MAX buffers;
    # 100 B ones joined: both must land whole, in order, and survive a reopen (recovery scan)
    from compactmq.storage.appender import VECTORED_WRITE_MIN_BYTES
    from compactmq.storage.ledger_storage import IOV_MAX

    assert (size >= VECTORED_WRITE_MIN_BYTES) == (size == 9000)
    n = IOV_MAX + 37  # 2n buffers: three slices
    datas = [bytes([i % 251]) * size for i in range(n)]
    st = open_storage()
    ml = st.open_managed_ledger("t")
    first = ml.append(b"head" * 3000)  # one large single append: write_parts too
    ps = ml.append_many(datas, list(range(n)))
    assert [p.entry_id for p in ps] == list(range(1, n + 1))
    assert [d for _, d in ml.read_entries(ps[0], 2 * n)] == datas
    st.close()
    ml = open_storage().open_managed_ledger("t")
    assert ml.read_entry(first) == b"head" * 3000
    assert [d for _, d in ml.read_entries(ps[0], 2 * n)] == datas
    assert ml.append(b"after") > ps[-1]


def test_an_oversized_entry_is_refused_and_nothing_of_its_batch_lands(open_storage, monkeypatch):
    from compactmq.errors import InvalidInput
    from compactmq.storage import ledger_file as lf

    monkeypatch.setattr(lf, "MAX_ENTRY_SIZE", 10)
    ml = open_storage().open_managed_ledger("t")
    p = ml.append(b"ok")
    with pytest.raises(InvalidInput):
        ml.append_many([b"fine", b"x" * 11])
    with pytest.raises(InvalidInput):
        ml.append(b"y" * 11)
    assert ml.append(b"next") == Position(p.ledger_id, 1)


def test_a_sealed_ledgers_index_leaves_memory_and_reads_load_it_back(open_storage):
    """Issue 28: the open ledger's index (16 bytes an entry) used to stay in memory as numpy
    arrays once the ledger rolled over, for every rollover of a loaded topic (a 10-minute soak
    grew 50 MB at its first rollover). After the seal it is on disk only; a read of the sealed
    ledger loads it from the index file, as after a restart."""
    ml = open_storage(managedLedgerMaxEntriesPerLedger=100).open_managed_ledger("t")
    ps = [ml.append(b"m%d" % i) for i in range(250)]
    state = ml._ledgers
    sealed = [led for led in state.by_id.values() if led is not state.current]
    assert len(sealed) == 2
    assert all(led.offsets is None and led.publish_times is None for led in sealed)
    assert state.current.offsets is not None  # the open ledger keeps its (spilling) columns
    assert [d for _, d in ml.read_entries(ps[0], 300)] == [b"m%d" % i for i in range(250)]
    assert sealed[0].offsets is not None and len(sealed[0].offsets) == 100  # loaded by the read


def test_a_sealed_index_no_read_used_for_a_while_leaves_memory(open_storage):
    """What a reader loaded to read a sealed ledger (16 bytes an entry) goes once no read has
    used it for ``idle_s`` (the broker's inactive sweep calls this every sweep); a later read
    loads it again."""
    ml = open_storage(managedLedgerMaxEntriesPerLedger=100).open_managed_ledger("t")
    ps = [ml.append(b"m%d" % i) for i in range(150)]
    state = ml._ledgers
    (sealed,) = [led for led in state.by_id.values() if led is not state.current]
    assert ml.read_entry(ps[5]) == b"m5"
    assert sealed.offsets is not None
    assert ml.release_idle_indexes(3600) == 0  # just used: kept
    assert sealed.offsets is not None
    assert ml.release_idle_indexes(0) == 1
    assert sealed.offsets is None and sealed.publish_times is None
    assert state.current.offsets is not None  # the open ledger's columns are never dropped
    assert [d for _, d in ml.read_entries(ps[0], 200)] == [b"m%d" % i for i in range(150)]


def test_a_stale_ledger_list_at_recovery_deletes_no_committed_ledger(open_storage, monkeypatch):
    """Recovery's first read of the ledger list may be stale (a ZooKeeper read served before the
    last commit reached it, or a broker paused between its read and its work). A ledger committed
    but missing from that read is not an orphan: its bytes must survive. Orphans are deleted only
    after recovery's own commit, against the list as it reads then (issue 26's chaos test lost
    acknowledged messages when a lapsed broker deleted ledgers it had not seen)."""
    import os

    from compactmq.storage.resources.topic_metadata import TopicMetadata

    st = open_storage(managedLedgerMaxEntriesPerLedger=2, managedLedgerMinLedgerRolloverTimeMinutes=0)
    ml = st.open_managed_ledger("t")
    ps = [ml.append(b"entry-%d" % i) for i in range(5)]
    last = max(p.ledger_id for p in ps)
    st.close()

    real = TopicMetadata.ledgers
    reads = []

    def stale_first(self, topic):
        got = real(self, topic)
        reads.append(topic)
        return [i for i in got if i.ledger_id != last] if len(reads) == 1 else got

    monkeypatch.setattr(TopicMetadata, "ledgers", stale_first)
    cfg = {"managedLedgerMaxEntriesPerLedger": 2, "managedLedgerMinLedgerRolloverTimeMinutes": 0}
    st = open_storage(**cfg)
    ml = st.open_managed_ledger("t")
    assert len(reads) >= 2  # the orphan check read the list again after the commit
    assert os.path.exists(ml.ledger_path(last))
    st.close()
    monkeypatch.setattr(TopicMetadata, "ledgers", real)
    # the next open, reading the list as committed, serves every acknowledged entry
    ml = open_storage(**cfg).open_managed_ledger("t")
    assert [ml.read_entry(p) for p in ps] == [b"entry-%d" % i for i in range(5)]


def test_an_orphan_made_during_recovery_by_another_owner_is_left_alone(open_storage, monkeypatch):
    """Bytes that appear after recovery listed the store (the next owner's new ledger, when this
    broker was paused past its session) are not this recovery's to delete."""
    import os

    from compactmq.storage import recovery

    st = open_storage()
    ml = st.open_managed_ledger("t")
    ml.append(b"a")
    path_of = ml.ledger_path
    st.close()
    late = path_of(777777)
    # the late ledger's bytes appear between recovery's listing and its deletes
    real_remove = recovery._remove_orphans

    def appear_then_remove(storage, unlisted, metadata, topic):
        with open(late, "wb") as f:
            f.write(b"another owner's ledger")
        return real_remove(storage, unlisted, metadata, topic)

    monkeypatch.setattr(recovery, "_remove_orphans", appear_then_remove)
    open_storage().open_managed_ledger("t")
    assert os.path.exists(late)
