"""The group flush (``object_group_flush``) against SeaweedFS and a real metadata store (SQLite).

Many topics' flushes waiting while a write is in flight are ONE object PUT (counted by the
process's blob-store counter, ``compactmq_object_store_puts_total``) and read back through their
range records by a new process's view; a lone flush is the ledger's own object, with no
metadata-store write and no wait; the next group's PUT runs during the previous commit; a member whose ownership fence fails is refused while the others commit;
a seal merges a ledger's ranges into its own object and the shared object goes once no ledger
names it. Objects are listed with boto3, not through the code under test.
"""

from __future__ import annotations

import threading
import time

import pytest

from compactmq.storage import ledger_file as lf
from compactmq.storage import object_group_flush, object_ledger_writer, object_ledgers
from compactmq.storage.metadata_store import Check, create_metadata_store
from compactmq.storage.object_group_flush import GROUPS_PREFIX, GROUPS_ROOT, RANGES_ROOT, GroupFlush
from compactmq.storage.object_ledgers import ObjectLedgerSettings, ObjectLedgerStorage
from compactmq.storage.offload.blobstore import OBJECT_COUNTERS, BlobStore
from compactmq.storage.resources.fence import Fence, Fenced

from harness.wait import wait_until

BUCKET = "group-flush"
TOPICS = [f"persistent://public/default/group-{i}" for i in range(8)]


@pytest.fixture
def place(seaweedfs, object_location, sqlite_meta):
    return seaweedfs, object_location(BUCKET), sqlite_meta


def _storages(loc, meta, topics, interval_ms=300, fences=None, solo=True, max_bytes=4 * 1024 * 1024):
    """A storage per topic, all over one client and one group flush (as in one broker)."""
    store = BlobStore(loc)
    group = GroupFlush(store, meta, solo=solo)
    settings = ObjectLedgerSettings(flush_interval_ms=interval_ms, flush_max_bytes=max_bytes)
    fences = fences or {}
    out = []
    for t in topics:
        st = ObjectLedgerStorage(store, t, settings, epoch=3, group=group)
        if t in fences:
            st.fence = fences[t]
        out.append(st)
    return group, out


def _gather(group, n: int) -> None:
    """As if a write were in flight until ``n`` flushes wait (they wait for it), then done: the
    group's PUT stage takes the ``n`` at once -- so a test knows which flushes share an object."""
    with group._cond:
        group._busy = True

    def write_done() -> None:
        wait_until(lambda: len(group._pending) >= n, timeout=60, what=f"{n} flushes waiting")
        with group._cond:
            group._busy = False
            group._cond.notify_all()

    threading.Thread(target=write_done, daemon=True).start()


def _record(entry_id: int, data: bytes) -> bytes:
    return lf.encode_record_header(entry_id, 1000 + entry_id, data) + data


def _write_and_sync_all(storages, ledger_id: int) -> tuple[list, list[bytes], dict[int, BaseException]]:
    """Each storage creates ``ledger_id``, writes one record, and all sync at once (threads)."""
    writers = [st.create(ledger_id) for st in storages]
    datas = []
    for i, w in enumerate(writers):
        rec = _record(0, b"topic-%d" % i)
        w.write(rec, lf.FILE_HEADER_SIZE)
        datas.append(rec)
    errors: dict[int, BaseException] = {}

    def sync(i: int) -> None:
        try:
            writers[i].sync()
        except BaseException as e:
            errors[i] = e

    before = OBJECT_COUNTERS.snapshot()["puts"]
    threads = [threading.Thread(target=sync, args=(i,)) for i in range(len(writers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return writers, datas, errors | {-1: OBJECT_COUNTERS.snapshot()["puts"] - before}  # type: ignore[dict-item]


def test_flushes_waiting_while_a_write_is_in_flight_are_one_object_put(place, monkeypatch):
    """The first flush finds nothing else waiting: written at once, alone, as the ledger's own
    object. The seven that come during its PUT wait for it, then go as ONE shared object."""
    server, loc, meta = place
    # flushes asked directly (a sync's without its linger); the background flusher's are a minute away
    group, storages = _storages(loc, meta, TOPICS, interval_ms=60_000)
    real_put, in_put = object_ledgers.put_object, threading.Event()

    def slow_first_put(store, key, data):
        if f"/f-{lf.FILE_HEADER_SIZE:016d}-" in key:  # the lone flush: the others come meanwhile
            in_put.set()
            wait_until(lambda: len(group._pending) == len(TOPICS) - 1, timeout=30, what="7 flushes waiting")
        real_put(store, key, data)

    monkeypatch.setattr(object_ledgers, "put_object", slow_first_put)
    writers = [st.create(5) for st in storages]
    datas = [_record(0, b"topic-%d" % i) for i in range(len(writers))]
    for w, rec in zip(writers, datas):
        w.write(rec, lf.FILE_HEADER_SIZE)
    before = OBJECT_COUNTERS.snapshot()["puts"]
    threads = [threading.Thread(target=w.flush, args=(w.written_end,)) for w in writers]
    threads[0].start()
    assert in_put.wait(30)
    for t in threads[1:]:
        t.start()
    for t in threads:
        t.join(60)
    puts = OBJECT_COUNTERS.snapshot()["puts"] - before
    assert all(w.durable_end == w.written_end for w in writers)
    assert puts == 2, f"{len(TOPICS)} topics' syncs made {puts} object writes"
    assert (group.solo_written, group.groups_written) == (1, 1)
    shared = server.keys(BUCKET, f"{loc.prefix}/{GROUPS_PREFIX}/")
    assert len(shared) == 1
    # a new process's view (new client, new group over the same metadata store) reads every
    # topic's bytes: the lone one from its own object, the others through their range records
    _, fresh = _storages(loc, meta, TOPICS)
    for st, data in zip(fresh, datas):
        assert st.read_all(5)[lf.FILE_HEADER_SIZE :] == data
        assert st.read_range(5, lf.FILE_HEADER_SIZE + 2, lf.FILE_HEADER_SIZE + 9) == data[2:9]
    records = [len(meta.get_children(f"{RANGES_ROOT}/{st.topic_path}/000000000005")) for st in storages]
    assert sorted(records) == [0] + [1] * (len(TOPICS) - 1)
    for w in writers:
        w.close()


def test_a_lone_flush_is_the_ledgers_own_object_and_writes_nothing_to_the_metadata_store(place, monkeypatch):
    """A lone producer pays what it pays without the group: one PUT, no metadata commit (the
    fence's lease is checked), and no waiting -- the writer's own linger ended at once
    (``objectLedgerFlushMaxBytes`` reached), and the group adds no timer of its own: with a
    one-minute interval the sync still returns at once."""
    server, loc, meta = place
    group, (st,) = _storages(loc, meta, TOPICS[:1], interval_ms=60_000, max_bytes=16)
    leases = []
    st.ownership_check = lambda: leases.append(1)
    w = st.create(11)
    commits = []
    real_commit = meta.commit
    monkeypatch.setattr(meta, "commit", lambda ops: commits.append(ops) or real_commit(ops))
    rec = _record(0, b"alone, at once")
    before = OBJECT_COUNTERS.snapshot()["puts"]
    t0 = time.monotonic()
    w.write(rec, lf.FILE_HEADER_SIZE)  # the background flusher may take it first: the same
    w.sync()
    assert time.monotonic() - t0 < 30  # the old group waited its interval: 60 s here
    assert OBJECT_COUNTERS.snapshot()["puts"] - before == 1
    assert commits == [] and leases == [1]
    assert (group.solo_written, group.groups_written) == (1, 0)
    assert w.layout.parts[-1][2].startswith("f-")
    assert server.keys(BUCKET, f"{loc.prefix}/{GROUPS_PREFIX}/") == []
    _, (fresh,) = _storages(loc, meta, TOPICS[:1])
    assert fresh.read_all(11) == lf.encode_file_header(11) + rec
    w.close()


def test_a_lone_flush_whose_fence_failed_is_never_acknowledged(place):
    """Alone, the flush is checked against its fence after its PUT, as without a group: a
    topic another broker took fails the sync (``Fenced``), and the writer refuses every later
    sync -- the new owner's recovery then seals the ledger without these bytes."""
    _server, loc, meta = place
    meta.put("/fence-solo", b"")
    fence = Fence(checks=(Check("/fence-solo", 0),), epoch=3, what="bundle solo")
    group, (st,) = _storages(loc, meta, TOPICS[:1], interval_ms=0, fences={TOPICS[0]: fence})
    w = st.create(12)
    w.write(_record(0, b"owned"), lf.FILE_HEADER_SIZE)
    w.sync()  # the fence holds: acknowledged
    meta.put("/fence-solo", b"taken")  # another broker took the bundle
    w.write(_record(1, b"zombie"), w.written_end)
    with pytest.raises(OSError) as got:
        w.sync()
    assert "epoch 3 is over" in str(got.value)
    assert (group.solo_written, group.groups_written) == (1, 0)  # the zombie's: not written
    with pytest.raises(OSError):
        w.sync()
    w.abandon()


def test_a_ledger_of_own_objects_and_shared_ranges_reads_back_and_merges_whole(place, monkeypatch):
    """Lone flushes (own objects) and grouped ones (shared ranges) alternate in one ledger: a
    new process reads it whole, and its seal's merge takes both kinds and drops its records."""
    server, loc, meta = place
    group, (a, b) = _storages(loc, meta, TOPICS[:2], interval_ms=60_000)
    wa, wb = a.create(14), b.create(14)
    recs = []

    def append(i: int) -> None:
        recs.append(_record(i, b"a-%d" % i))
        wa.write(recs[-1], wa.written_end)

    append(0)
    wa.flush(wa.written_end)  # alone
    append(1)
    wb.write(_record(0, b"b-0"), lf.FILE_HEADER_SIZE)
    _gather(group, 2)
    both = [threading.Thread(target=w.flush, args=(w.written_end,)) for w in (wa, wb)]
    for t in both:
        t.start()
    for t in both:
        t.join(60)
    append(2)
    wa.flush(wa.written_end)  # alone again
    assert [n[:2] for _s, _e, n in wa.layout.parts] == ["f-", "f-", "g:", "f-"]  # header first
    assert (group.solo_written, group.groups_written) == (2, 1)
    whole = lf.encode_file_header(14) + b"".join(recs)
    _, (fresh, _) = _storages(loc, meta, TOPICS[:2])
    assert fresh.read_all(14) == whole
    wa.close()
    scan = lf.scan_records(whole, verify_crc=True)
    a.write_index(14, lf.encode_index(14, scan.offsets, scan.publish_times, scan.valid_end))
    assert a.wait_merged(timeout=30)
    assert meta.get_children(f"{RANGES_ROOT}/{a.topic_path}/000000000014") == []
    assert len(server.keys(BUCKET, f"{loc.prefix}/{GROUPS_PREFIX}/")) == 1  # b's range names it
    _, (fresh, _) = _storages(loc, meta, TOPICS[:2])
    assert fresh.read_all(14) == whole
    wb.close()


def test_the_next_group_is_written_while_the_previous_commits(place, monkeypatch):
    """Pipelining: a group's PUT does not wait for the previous group's metadata commit, and
    no member is answered before its own group committed."""
    _server, loc, meta = place
    group, storages = _storages(loc, meta, TOPICS[:4], interval_ms=0, solo=False)
    release, entered = threading.Event(), threading.Event()
    real_commit = meta.commit

    def held_commit(ops):
        if not entered.is_set() and any(GROUPS_ROOT in getattr(op, "path", "") for op in ops):
            entered.set()
            assert release.wait(30)
        return real_commit(ops)

    monkeypatch.setattr(meta, "commit", held_commit)
    writers = [st.create(13) for st in storages]
    done: dict[int, BaseException | None] = {}

    def sync(i: int) -> None:
        writers[i].write(_record(0, b"t%d" % i), lf.FILE_HEADER_SIZE)
        try:
            writers[i].sync()
            done[i] = None
        except BaseException as e:
            done[i] = e

    first = threading.Thread(target=sync, args=(0,))
    first.start()
    assert entered.wait(30)  # group 1 written, its commit held
    others = [threading.Thread(target=sync, args=(i,)) for i in (1, 2, 3)]
    for t in others:
        t.start()
    wait_until(lambda: group.groups_written >= 2, timeout=30, what="group 2 written during group 1's commit")
    assert done == {}  # nobody answered: group 1 is not committed, group 2 waits behind it
    assert group.counter == 1  # the orphan sweep leaves groups 1 and on alone: both in flight
    release.set()
    for t in [first, *others]:
        t.join(60)
    assert done == {0: None, 1: None, 2: None, 3: None}
    _, fresh = _storages(loc, meta, TOPICS[:4])
    for i, st in enumerate(fresh):
        assert st.read_all(13)[lf.FILE_HEADER_SIZE :] == _record(0, b"t%d" % i)
    for w in writers:
        w.close()


def test_a_member_whose_fence_failed_is_refused_and_the_others_commit(place):
    server, loc, meta = place
    meta.put("/fence-a", b"")
    meta.put("/fence-b", b"")
    fence_a = Fence(checks=(Check("/fence-a", 0),), epoch=3, what="bundle a")
    fence_b = Fence(checks=(Check("/fence-b", 0),), epoch=3, what="bundle b")
    fences = {TOPICS[0]: fence_a, TOPICS[1]: fence_b, TOPICS[2]: fence_b}
    _, storages = _storages(loc, meta, TOPICS[:3], fences=fences, solo=False)
    meta.put("/fence-a", b"taken")  # another broker took bundle a: version 1
    writers, datas, errors = _write_and_sync_all(storages, 6)
    errors.pop(-1)
    assert set(errors) == {0}
    assert "epoch 3 is over" in str(errors[0]) or isinstance(errors[0].__cause__, Fenced)
    _, fresh = _storages(loc, meta, TOPICS[:3])
    assert fresh[0].read_all(6) == lf.encode_file_header(6)  # the zombie's bytes: not visible
    for st, data in zip(fresh[1:], datas[1:]):
        assert st.read_all(6)[lf.FILE_HEADER_SIZE :] == data
    for w in writers[1:]:
        w.close()


def test_a_seal_merges_the_ranges_and_the_shared_object_goes_with_the_last(place, monkeypatch):
    server, loc, meta = place
    group, storages = _storages(loc, meta, TOPICS[:2], interval_ms=100)
    _gather(group, 2)
    writers, datas, errors = _write_and_sync_all(storages, 7)
    errors.pop(-1)
    assert errors == {}
    assert len(server.keys(BUCKET, f"{loc.prefix}/{GROUPS_PREFIX}/")) == 1
    for n, (st, w) in enumerate(zip(storages, writers)):
        w.close()
        buf = st.read_all(7)
        scan = lf.scan_records(buf, verify_crc=True)
        st.write_index(7, lf.encode_index(7, scan.offsets, scan.publish_times, scan.valid_end))
        assert st.wait_merged(timeout=30)
        assert meta.get_children(f"{RANGES_ROOT}/{st.topic_path}/000000000007") == []
        left = server.keys(BUCKET, f"{loc.prefix}/{GROUPS_PREFIX}/")
        assert len(left) == (1 if n == 0 else 0)  # the other ledger still names it, then none
        assert st.read_all(7) == buf
    _, fresh = _storages(loc, meta, TOPICS[:2])
    for st, data in zip(fresh, datas):
        assert st.read_all(7)[lf.FILE_HEADER_SIZE :] == data


def test_a_ledger_being_written_folds_its_ranges_so_few_records_stay(place, monkeypatch):
    server, loc, meta = place
    monkeypatch.setattr(object_ledger_writer, "FOLD_RANGES", 4)
    _, (st,) = _storages(loc, meta, TOPICS[:1], interval_ms=0, solo=False)
    w = st.create(8)
    end, recs = lf.FILE_HEADER_SIZE, []
    for i in range(10):  # ten syncs, each its own group: folds after the 4th and the 8th
        rec = _record(i, b"entry-%d" % i)
        w.write(rec, end)
        end += len(rec)
        recs.append(rec)
        w.sync()
    # With a zero interval the background flusher races the syncs: a fold it made is released
    # (records dropped, then unnamed groups deleted) after the sync it overtook has returned.
    wait_until(
        lambda: len(meta.get_children(f"{RANGES_ROOT}/{st.topic_path}/000000000008")) == 2,
        what="only the range records of syncs 9 and 10 left (the others folded and dropped)",
    )
    own = [k.rsplit("/", 1)[1] for k in server.keys(BUCKET, f"{loc.prefix}/{st.prefix}/000000000008/")]
    assert len(own) == 3 and all(n.startswith("f-") for n in own)  # the header and two folds
    wait_until(
        lambda: len(server.keys(BUCKET, f"{loc.prefix}/{GROUPS_PREFIX}/")) == 2,
        what="the folded groups deleted, the two unfolded ones kept",
    )
    _, (fresh,) = _storages(loc, meta, TOPICS[:1])
    assert fresh.read_all(8) == lf.encode_file_header(8) + b"".join(recs)
    assert st.read_all(8) == fresh.read_all(8)
    lo = lf.FILE_HEADER_SIZE + sum(len(r) for r in recs[:3])
    assert fresh.read_range(8, lo, lo + len(recs[3]) + len(recs[4])) == recs[3] + recs[4]
    w.close()


def test_a_new_process_deletes_the_shared_object_once_its_merges_left_it_unnamed(place, monkeypatch):
    """After a failover the new owner merges ledgers another process wrote: the reference
    count lives in the metadata store, so the shared object still goes with the last range."""
    server, loc, meta = place
    group, storages = _storages(loc, meta, TOPICS[:2], interval_ms=100)
    _gather(group, 2)
    writers, datas, errors = _write_and_sync_all(storages, 9)
    errors.pop(-1)
    assert errors == {}
    assert meta.get_children(GROUPS_ROOT) != []
    _, fresh = _storages(loc, meta, TOPICS[:2])  # the writers' process is gone (never closed)
    for n, st in enumerate(fresh):
        buf = st.read_all(9)
        scan = lf.scan_records(buf, verify_crc=True)
        st.write_index(9, lf.encode_index(9, scan.offsets, scan.publish_times, scan.valid_end))
        assert st.wait_merged(timeout=30)
        assert len(server.keys(BUCKET, f"{loc.prefix}/{GROUPS_PREFIX}/")) == (1 if n == 0 else 0)
        assert st.read_all(9)[lf.FILE_HEADER_SIZE :] == datas[n]
    assert meta.get_children(GROUPS_ROOT) == []


def test_a_group_holds_at_most_max_group_members_the_rest_go_in_the_next(place, monkeypatch):
    """A group's commit must stay below the metadata store's size limit: more members than
    MAX_GROUP_MEMBERS wait for the next group (written at once), none is lost or refused."""
    server, loc, meta = place
    monkeypatch.setattr(object_group_flush, "MAX_GROUP_MEMBERS", 3)
    group, storages = _storages(loc, meta, TOPICS)
    _gather(group, len(TOPICS))  # all come at once
    writers, datas, errors = _write_and_sync_all(storages, 10)
    puts = errors.pop(-1)
    assert errors == {}
    assert puts == group.groups_written == 3  # 8 members: 3 + 3 + 2
    sizes = [len(meta.get_children(f"{GROUPS_ROOT}/{g}")) for g in meta.get_children(GROUPS_ROOT)]
    assert sum(sizes) == len(TOPICS) and max(sizes) == 3
    _, fresh = _storages(loc, meta, TOPICS)
    for st, data in zip(fresh, datas):
        assert st.read_all(10)[lf.FILE_HEADER_SIZE :] == data
    for w in writers:
        w.close()


def test_a_commit_lost_on_the_connection_keeps_the_object_its_records_may_name(place, monkeypatch):
    """ZooKeeper applied the group's commit, then the connection dropped before the answer
    (ConnectionLoss: outcome unknown). The flushes fail (nothing acknowledged), but the records
    are there and name the shared object, so it must stay: deleting it (as before) made the
    ledgers it holds unreadable and their topics unloadable on every broker (the chaos test,
    tests/broker/test_cluster_chaos.py, found it). A new process reads every topic's bytes."""
    from compactmq.storage.metadata_store import StoreUnavailable

    server, loc, meta = place
    group, storages = _storages(loc, meta, TOPICS[:2], interval_ms=100)
    real_commit = meta.commit

    def applied_then_lost(ops):
        real_commit(ops)
        if any(getattr(op, "path", "").startswith(GROUPS_ROOT) for op in ops):
            raise StoreUnavailable("ZooKeeper connection lost: ConnectionLoss")

    monkeypatch.setattr(meta, "commit", applied_then_lost)
    _gather(group, 2)
    writers, datas, errors = _write_and_sync_all(storages, 8)
    errors.pop(-1)
    assert set(errors) == {0, 1}, errors  # not acknowledged
    monkeypatch.setattr(meta, "commit", real_commit)
    assert len(server.keys(BUCKET, f"{loc.prefix}/{GROUPS_PREFIX}/")) == 1  # the object stayed
    _, fresh = _storages(loc, meta, TOPICS[:2])
    for st, data in zip(fresh, datas):
        assert st.read_all(8)[lf.FILE_HEADER_SIZE :] == data  # readable: its records name it
    for w in writers:
        w.abandon()


def test_a_group_commit_on_zookeeper_waits_a_few_round_trips_whatever_its_members(
    seaweedfs, object_location, zookeeper, tmp_path
):
    """The commit stage commits one group at a time, and the next PUT waits for it: its length
    bounds a broker's flushes. On ZooKeeper each member's two keys were asked one by one
    whether they exist, their parents too, and each new key read back for its stat -- about 5
    round trips a member in a row (~90 % of the commit stage's time with 30 topics publishing,
    bench/results/cluster_many_ab_*_clusterperf.json). Now the keys are created NEW, the
    parents the store has seen are not asked again and no stat is read back: a group of 8
    waits for ZooKeeper once, its multi (before: 42 times)."""
    meta = create_metadata_store(f"zk:{zookeeper.hosts}/gf{tmp_path.name[-12:]}", data_dir=tmp_path)
    try:
        loc = object_location(BUCKET)
        group, storages = _storages(loc, meta, TOPICS, solo=False, interval_ms=60_000)
        writers = [st.create(21) for st in storages]
        datas: list[list[bytes]] = [[] for _ in writers]

        def grouped_flush(entry_id: int) -> int:
            for i, w in enumerate(writers):
                datas[i].append(_record(entry_id, b"t%d-%d" % (i, entry_id)))
                w.write(datas[i][-1], w.written_end)
            _gather(group, len(writers))
            before = meta.round_trips
            threads = [threading.Thread(target=w.flush, args=(w.written_end,)) for w in writers]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            assert all(w.durable_end == w.written_end for w in writers)
            return meta.round_trips - before

        grouped_flush(0)  # the ledgers' range nodes are created
        written = group.groups_written
        waits = grouped_flush(1)
        assert group.groups_written == written + 1  # one group of all 8
        assert waits == 1, f"a group commit of {len(writers)} members waited {waits} times for ZooKeeper"
        _, fresh = _storages(loc, meta, TOPICS)
        for st, recs in zip(fresh, datas):
            assert st.read_all(21)[lf.FILE_HEADER_SIZE :] == b"".join(recs)
        for w in writers:
            w.close()
    finally:
        meta.close()


def test_a_sync_that_folds_does_not_wait_for_the_release_of_the_folded_records(place, monkeypatch):
    """The records a fold superseded are dropped by a background thread: a sync that folded
    returns (its entries acknowledged) while that release is still held up -- done in the sync,
    its round trips held the topic's receipts every FOLD_RANGES flushes, and with 30 topics
    some topic was always held (bench/results/cluster_many_ab_fix_nofold_clusterperf.json)."""
    server, loc, meta = place
    monkeypatch.setattr(object_ledger_writer, "FOLD_RANGES", 2)
    # flushes asked directly (a sync's, without its linger); the background flusher's are a minute away
    _, (st,) = _storages(loc, meta, TOPICS[:1], interval_ms=60_000, solo=False)
    release_held, released = threading.Event(), threading.Event()
    real_release = st.release_parts

    def held_release(ledger_id, parts):
        release_held.wait(60)
        real_release(ledger_id, parts)
        released.set()

    monkeypatch.setattr(st, "release_parts", held_release)
    w = st.create(9)
    recs = [_record(i, b"entry-%d" % i) for i in range(2)]
    try:
        w.write(recs[0], w.written_end)
        w.flush(w.written_end)
        w.write(recs[1], w.written_end)
        second = threading.Thread(target=w.flush, args=(w.written_end,))  # the second range: the fold
        second.start()
        second.join(30)
        assert not second.is_alive(), "the sync that folded waited for the release of the records"
        assert w.durable_end == w.written_end
        assert len(meta.get_children(f"{RANGES_ROOT}/{st.topic_path}/000000000009")) == 2  # not yet
    finally:
        release_held.set()
    assert released.wait(30)
    assert meta.get_children(f"{RANGES_ROOT}/{st.topic_path}/000000000009") == []
    _, (fresh,) = _storages(loc, meta, TOPICS[:1])
    assert fresh.read_all(9) == lf.encode_file_header(9) + b"".join(recs)
    w.close()
