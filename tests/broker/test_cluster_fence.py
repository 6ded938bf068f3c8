"""The ownership fence (``storage.resources.fence``) between two brokers' sessions on one store.

The embedded memory store (shared by name) and the real ZooKeeper: a commit under a fence goes
through while the ownership holds, and fails with ``Fenced`` (writing nothing) once the owner
released the bundle, its session ended, or another session took the bundle -- including when the
new owner's key is at the same version the old one's was.
"""

from __future__ import annotations

import uuid

import pytest

from compactmq.naming import TopicName
from compactmq.storage.metadata_store import Put, create_metadata_store
from compactmq.storage.resources import PulsarResources
from compactmq.storage.resources.fence import NO_FENCE, FenceLease, Fenced, fenced_update, lost_fence

from storage.metadata_store.zk_server import zookeeper  # noqa: F401  (tests/ is on sys.path)

RANGE = "0x00000000_0x40000000"
NS = "public/default"
DATA = {"nativeUrl": "pulsar://a:6650", "httpUrl": "http://a:8080", "disabled": False}


@pytest.fixture(params=["memory", "zk"])
def stores(request, tmp_path):
    if request.param == "memory":
        url = f"memory:f{uuid.uuid4().hex[:8]}"
    else:
        url = f"zk:{request.getfixturevalue('zookeeper').hosts}/f{uuid.uuid4().hex[:12]}"
    made = [create_metadata_store(url, data_dir=tmp_path, operation_timeout_s=10) for _ in range(2)]
    yield made
    for s in made:
        s.close()


def _put(store, fence, value: bytes) -> None:
    fence.commit(store, [Put("/fenced/value", value)])


def test_a_commit_passes_while_owned_and_fails_after(stores):
    a, b = stores
    ra, rb = PulsarResources(a), PulsarResources(b)
    assert ra.ownership.try_acquire(NS, RANGE, DATA)[1]
    fa = ra.ownership.fence(NS, RANGE)
    assert fa is not None and fa.epoch == 1 and fa.holds(a)
    assert rb.ownership.fence(NS, RANGE) is None  # not b's
    _put(a, fa, b"a1")
    assert ra.ownership.release(NS, RANGE)
    with pytest.raises(Fenced):
        _put(a, fa, b"a2")
    # b takes the bundle: its key is at version 0 again, but the epoch moved on
    assert rb.ownership.try_acquire(NS, RANGE, DATA)[1]
    fb = rb.ownership.fence(NS, RANGE)
    assert fb is not None and fb.epoch == 2
    with pytest.raises(Fenced):
        _put(a, fa, b"a3")
    _put(b, fb, b"b1")
    assert a.get("/fenced/value").value == b"b1"


def test_the_session_end_fences(stores, tmp_path):
    a, b = stores
    ra = PulsarResources(a)
    ra.ownership.try_acquire(NS, RANGE, DATA)
    fa = ra.ownership.fence(NS, RANGE)
    a.close()  # the session ends: the owner key goes with it
    with pytest.raises(Fenced):
        _put(b, fa, b"zombie")  # checked through another session: the keys tell, not the client
    assert b.get("/fenced/value") is None


def test_fenced_update_and_the_trivial_fences(stores):
    a, _ = stores
    a.put("/fenced/json", b'{"n": 1}')
    ra = PulsarResources(a)
    ra.ownership.try_acquire(NS, RANGE, DATA)
    fa = ra.ownership.fence(NS, RANGE)
    assert fenced_update(a, "/fenced/json", lambda v: {"n": v["n"] + 1}, "json", fa) == {"n": 2}
    assert fenced_update(a, "/fenced/json", lambda v: {"n": v["n"] + 1}, "json", NO_FENCE) == {"n": 3}
    with pytest.raises(Fenced):
        fenced_update(a, "/fenced/json", lambda v: v, "json", lost_fence("t"))
    assert a.get("/fenced/json").value == b'{"n":3}'


def test_a_lease_asks_the_store_once_per_term_and_a_revoke_ends_it(stores):
    a, _ = stores
    ra = PulsarResources(a)
    ra.ownership.try_acquire(NS, RANGE, DATA)
    fence = ra.ownership.fence(NS, RANGE)
    now = [100.0]
    lease = FenceLease(fence, a, 1.5, clock=lambda: now[0])
    for _ in range(5):
        lease.check()
    assert lease.store_checks == 1
    now[0] += 1.6  # the term is over (a frozen process wakes up): the store is asked again
    lease.check()
    assert lease.store_checks == 2
    ra.ownership.release(NS, RANGE)
    lease.check()  # within the term: trusted (releasing goes through revoke first, below)
    now[0] += 1.6
    with pytest.raises(Fenced):
        lease.check()  # the term is over and the key is gone
    ra.ownership.try_acquire(NS, RANGE, DATA)
    again = ra.ownership.fence(NS, RANGE)
    lease = FenceLease(again, a, 1000.0, clock=lambda: now[0])
    lease.check()
    again.revoke()
    with pytest.raises(Fenced):
        lease.check()  # at once, whatever the term
    with pytest.raises(Fenced):
        _put(a, again, b"after revoke")
    assert lease.store_checks == 1


@pytest.mark.parametrize(
    "group_flush, shared",
    [(False, False), (True, False), (True, True)],
    ids=["per-ledger", "group-flush", "group-flush-shared"],
)
def test_a_zombie_owner_writes_nothing_visible_and_its_objects_are_swept(tmp_path, group_flush, shared):
    """Storage level, two 'brokers' (two ``Storage`` over one memory store and one object store):
    A owns the topic and writes; its session ends without it noticing; B takes the bundle and
    recovers the topic; A appends on (nothing acknowledged, no ledger-list commit); a third
    opener sees exactly A's acknowledged entries and B's, and A's late objects are gone. With
    the group flush, A's lone appends are its ledger's own flush objects, as without it; with
    even a lone flush in a shared object (``shared``), A's late bytes go to a shared object whose
    range commit its fence refuses (the object is deleted at once)."""
    from compactmq.config import load_config
    from compactmq.errors import CompactMQError
    from compactmq.storage.engine import Storage
    from compactmq.storage.object_ledger_upkeep import wait_merges

    topic = "persistent://public/default/zombie"
    url = f"memory:z{uuid.uuid4().hex[:8]}"
    objects = tmp_path / "objects"
    config = load_config(
        overrides={
            "metadataStoreUrl": url,
            "objectLedgerStorageUrl": f"file://{objects}",
            "metadataStoreSessionTimeoutMillis": 1,  # lease of ~0: every flush asks the store
            "objectLedgerGroupFlushEnabled": group_flush,
        }
    )
    sessions = [create_metadata_store(url, data_dir=tmp_path) for _ in range(2)]
    try:
        fence_a, fence_b = _take_in_turn(sessions)
        a = Storage(tmp_path / "a", config)
        a.fence_provider = lambda t: fence_a[0]
        if shared:
            a._group().solo = False
        ml_a = a.open_managed_ledger(topic)
        sub_a = ml_a.open_cursor("sub", True, "earliest")  # created: stored at once
        acked = [ml_a.append(b"a%d" % i) for i in range(5)]
        sessions[0].close()  # A's session ends; A does not know
        b = Storage(tmp_path / "b", config)
        b.fence_provider = lambda t: fence_b()
        if shared:
            b._group().solo = False
        ml_b = b.open_managed_ledger(topic)  # recovery: A's ledger sealed at 5 entries
        b_pos = [ml_b.append(b"b%d" % i) for i in range(3)]
        wait_merges()
        with pytest.raises(CompactMQError):
            ml_a.append(b"zombie")  # written to an object, refused before it counts
        with pytest.raises(CompactMQError):
            ml_a.rollover()  # a ledger-list commit: fenced
        sub_a.ack_cumulative(acked[-1])
        a.topic_metadata.flush_cursors(topic)  # the zombie's ack: refused (logged), not written
        first = objects / "ledgers" / "persistent" / "public" / "default" / "zombie" / f"{acked[0][0]:012d}"
        if shared:  # A's late group object: its commit refused, so deleted at once; A's
            # earlier ones: deleted by B once B's merge of A's ledger left them unnamed
            assert a._group_flush is not None and a._group_flush.groups_written >= 2
            mine = objects / "groups" / f"{a._group_flush.incarnation:019d}"
            assert not mine.exists() or [p for p in mine.iterdir() if p.is_file()] == []
        else:
            assert "f" in {p.name[:1] for p in first.iterdir()}  # A's late flush object is there...
        b.close()
        c = Storage(tmp_path / "c", config)  # a third owner: recovery + sweep
        c.fence_provider = lambda t: fence_b()
        ml_c = c.open_managed_ledger(topic)
        got = [d for li in ml_c.ledgers() for _, d in ml_c.read_entries((li.ledger_id, 0), li.entry_count)]
        assert got == [b"a%d" % i for i in range(5)] + [b"b%d" % i for i in range(3)]
        assert acked[0][0] != b_pos[0][0]  # B wrote a new ledger: ids not reused
        assert ml_c.get_cursor("sub").mark_delete_position < acked[0]  # A's late ack is nowhere
        assert sorted(p.name[:1] for p in first.iterdir()) == ["i", "m"]  # ...and swept
        c.close()
        a.close()
    finally:
        for s in sessions:
            s.close()


def _take_in_turn(sessions):
    """Session 0 takes the bundle now; session 1 takes it when asked (after 0's session ended)."""
    r0, r1 = PulsarResources(sessions[0]), PulsarResources(sessions[1])
    assert r0.ownership.try_acquire(NS, RANGE, DATA)[1]
    fence_a = [r0.ownership.fence(NS, RANGE)]
    held: list = []

    def fence_b():
        if not held:
            assert r1.ownership.try_acquire(NS, RANGE, DATA)[1]
            held.append(r1.ownership.fence(NS, RANGE))
        return held[0]

    return fence_a, fence_b


def test_an_unload_writes_held_back_acks_under_the_fence_the_ledger_was_opened_with(tmp_path):
    """An unload marks the bundle not owned before it closes the topics (so nothing loads them
    meanwhile); the closing ledger's held-back cursor position must still be written."""
    from compactmq.config import load_config
    from compactmq.storage.engine import Storage
    from compactmq.storage.resources.fence import lost_fence

    topic = "persistent://public/default/unload-acks"
    url = f"memory:u{uuid.uuid4().hex[:8]}"
    config = load_config(
        overrides={"metadataStoreUrl": url, "managedLedgerDefaultMarkDeleteRateLimit": 0.001}
    )
    owner = create_metadata_store(url, data_dir=tmp_path)
    try:
        res = PulsarResources(owner)
        res.ownership.try_acquire(NS, RANGE, DATA)
        fence = res.ownership.fence(NS, RANGE)
        with Storage(tmp_path / "a", config) as storage:
            owned = [True]
            storage.fence_provider = lambda t: fence if owned[0] else lost_fence(t)
            ml = storage.open_managed_ledger(topic)
            cursor = ml.open_cursor("sub", True, "earliest")  # written at once
            positions = [ml.append(b"%d" % i) for i in range(3)]
            cursor.ack_cumulative(positions[-1])  # held back by the rate
            owned[0] = False  # the unload: not owned any more, then its topics close
            ml.close()
            assert storage.topic_metadata.get_cursor(topic, "sub").mark_delete == positions[-1]
            stored = storage.resources.managed_ledgers.get_cursor(TopicName.parse(topic), "sub")
            assert (stored[0]["markDeleteLedgerId"], stored[0]["markDeleteEntryId"]) == tuple(positions[-1])
    finally:
        owner.close()


def test_a_ledger_left_open_under_an_ownership_that_ended_is_not_served_under_the_next(tmp_path):
    """A broker lost a bundle (session expired) and its topics' unload failed, so a managed
    ledger stayed open, bound to that ownership's fence; the broker takes the bundle again under
    a new epoch. Opening the topic must not hand back the old ledger -- every commit of it fails
    on the old fence ('ownership epoch N is over', for minutes in the chaos test, producers
    stalled) -- but recover the topic anew under the new fence."""
    from compactmq.config import load_config
    from compactmq.storage.engine import Storage

    topic = "persistent://public/default/reowned"
    url = f"memory:r{uuid.uuid4().hex[:8]}"
    config = load_config(overrides={"metadataStoreUrl": url})
    sessions = [create_metadata_store(url, data_dir=tmp_path) for _ in range(2)]
    try:
        fence_a, fence_b = _take_in_turn(sessions)
        with Storage(tmp_path / "a", config) as storage:
            current = [fence_a[0]]
            storage.fence_provider = lambda t: current[0]
            old = storage.open_managed_ledger(topic)
            acked = [old.append(b"a%d" % i) for i in range(3)]
            sessions[0].close()  # the first ownership ends; its ledger is never closed
            current[0] = fence_b()  # the same broker owns the bundle again, a newer epoch
            ml = storage.open_managed_ledger(topic)
            assert ml is not old
            more = ml.append(b"b0")  # commits (a new ledger) under the new fence
            got = [d for li in ml.ledgers() for _, d in ml.read_entries((li.ledger_id, 0), li.entry_count)]
            assert got == [b"a0", b"a1", b"a2", b"b0"]
            assert more > acked[-1]
    finally:
        for s in sessions:
            s.close()


def test_a_fence_read_across_a_session_expiry_never_holds_under_the_next_owner(zookeeper, tmp_path):  # noqa: F811
    """``OwnershipResources.fence`` makes two reads (the owner key, the epoch counter). If the
    owner's session expires between them and another broker takes the bundle, the owner's store
    reads on under a new session: the fence it returns must not be one that holds under the new
    owner (the old key's check is 'version 0', which the new owner's key has too)."""
    import threading

    from kazoo.client import KazooClient

    from compactmq.storage.metadata_store import SessionEvent

    url = f"zk:{zookeeper.hosts}/f{uuid.uuid4().hex[:12]}"
    a, b = (create_metadata_store(url, data_dir=tmp_path, operation_timeout_s=10) for _ in range(2))
    try:
        ra, rb = PulsarResources(a), PulsarResources(b)
        assert ra.ownership.try_acquire(NS, RANGE, DATA)[1]
        renewed = threading.Event()
        a.register_session_listener(lambda e: e is SessionEvent.SESSION_REESTABLISHED and renewed.set())
        get, reads = a.get, []

        def get_then_lose_the_bundle(path):
            got = get(path)
            reads.append(path)
            if len(reads) == 1:  # between fence()'s reads: a's session ends, b takes the bundle
                session_id, password = a._zk.client_id
                thief = KazooClient(hosts=zookeeper.hosts, client_id=(session_id, password))
                thief.start(timeout=10)
                thief.stop()
                thief.close()
                assert renewed.wait(20), "a's store got no new session"
                assert rb.ownership.try_acquire(NS, RANGE, DATA)[1]
            return got

        a.get = get_then_lose_the_bundle
        try:
            fence = ra.ownership.fence(NS, RANGE)
        finally:
            a.get = get
        assert len(reads) == 2
        fb = rb.ownership.fence(NS, RANGE)
        assert fb is not None and fb.holds(b)
        assert fence is None or not fence.holds(b), "a zombie's fence holds under the new owner"
    finally:
        a.close()
        b.close()


def test_a_broker_not_yet_in_its_cluster_serves_no_topic(zookeeper, tmp_path):  # noqa: F811
    """A broker binds its ports before it joins the cluster (its id is the web URL it bound):
    in between, a client reaching it first (a restart; a multi-host service URL) must not have a
    topic loaded here -- the storage's default fence, NO_FENCE, served it with unfenced
    ledger-list commits while its owner wrote it too (the chaos test lost acknowledged
    messages so). Until the cluster service runs, every topic's fence is lost."""
    from compactmq.broker.server import BrokerService
    from compactmq.config import load_config
    from compactmq.storage import Storage

    url = f"zk:{zookeeper.hosts}/j{uuid.uuid4().hex[:12]}"
    cfg = load_config(overrides={"metadataStoreUrl": url, "clusterName": "c1"})
    storage = Storage(str(tmp_path / "b"), cfg)
    service = BrokerService(cfg, storage, "pulsar://127.0.0.1:1")
    try:
        topic = "persistent://public/default/early"
        assert storage.fence_for(topic).lost
        with pytest.raises(Fenced):
            storage.open_managed_ledger(topic)
    finally:
        service.executor.shutdown()
        storage.close()
