"""How many times a ZooKeeper commit waits for the server, against a real ZooKeeper.

A commit is one ``multi``, but building it reads the server: a Put's parent (is it there, or
created in the multi?), an unversioned Put's own key (create, or set at which version?), and
after the multi each created key's stat. Read one key at a time, a commit of n puts waited for
up to 3n round trips in a row -- the group flush's commit of a cluster broker spent ~90 % of its
time there, and it bounded the cluster's throughput with many topics (bench/cluster_many_ab.py).
Those reads are now sent together: a commit waits a few round trips whatever its size. Counted
with the store's ``round_trips`` (each wait for the server, one call or calls sent together),
not timed.
"""

from __future__ import annotations

import uuid

import pytest

from compactmq.storage.metadata_store import NEW, BadVersion, Check, Put, create_metadata_store


@pytest.fixture
def zk_store(zookeeper, tmp_path):
    store = create_metadata_store(
        f"zk:{zookeeper.hosts}/rt{uuid.uuid4().hex[:12]}", data_dir=tmp_path, operation_timeout_s=10
    )
    yield store
    store.close()


def test_a_commit_of_many_puts_waits_for_a_few_round_trips_not_one_per_key(zk_store):
    for i in range(20):
        zk_store.put(f"/ledgers/l{i:02d}", b"")
    zk_store.put("/ledgers/l00/old", b"v0")
    ops = [Put(f"/ledgers/l{i:02d}/rec", b"r%d" % i) for i in range(20)]  # unversioned, parents there
    ops += [Put("/ledgers/l00/old", b"v1")]  # unversioned over an existing key: a set
    ops += [Put("/groups/g1", b"", NEW)] + [Put(f"/groups/g1/{i:06d}", b"", NEW) for i in range(20)]
    before = zk_store.round_trips
    stats = zk_store.commit([*ops, Check("/ledgers", 0)])
    waits = zk_store.round_trips - before
    # reads of the parents and unversioned keys (/groups is missing: one level more), the
    # multi, the created keys' stats: 4 (one key at a time, as before: 66)
    assert waits <= 4, f"a commit of {len(ops)} puts waited {waits} times for ZooKeeper"
    assert [zk_store.get(f"/ledgers/l{i:02d}/rec").value for i in range(20)] == [
        b"r%d" % i for i in range(20)
    ]
    assert zk_store.get("/ledgers/l00/old").value == b"v1"
    assert zk_store.get_children("/groups/g1") == [f"{i:06d}" for i in range(20)]
    # the stats are the keys' own: created at version 0, the set at 1, a Check none
    assert [s.version for s in stats[:20]] == [0] * 20
    assert stats[20].version == 1 and stats[-1] is None
    assert all(s.created_ms > 0 and s.path == op.path for s, op in zip(stats, ops))


def test_a_commit_creates_missing_parents_at_any_depth_and_still_fails_as_a_whole(zk_store):
    zk_store.commit([Put("/a/b/c/d/e", b"deep"), Put("/a/b/x", b"x", NEW)])
    assert zk_store.get("/a/b/c/d/e").value == b"deep"
    assert zk_store.get_children("/a/b") == ["c", "x"]
    with pytest.raises(BadVersion):  # a key expected new that exists: nothing of the commit lands
        zk_store.commit([Put("/p/q/r", b"r"), Put("/a/b/x", b"again", NEW)])
    assert not zk_store.exists("/p")
    assert zk_store.get("/a/b/x").value == b"x"


def test_parents_seen_are_not_asked_again_and_a_commit_without_stats_reads_nothing(zk_store):
    zk_store.commit([Put("/ranges/t1/l1/r0", b"0", NEW), Put("/ranges/t2/l1/r0", b"0", NEW)])
    before = zk_store.round_trips
    zk_store.commit_no_stats([Put("/ranges/t1/l1/r1", b"1", NEW), Put("/ranges/t2/l1/r1", b"1", NEW)])
    assert zk_store.round_trips - before == 1  # the multi alone
    assert zk_store.get_children("/ranges/t1/l1") == ["r0", "r1"]


def test_a_remembered_parent_another_client_deleted_is_created_again(zk_store, zookeeper, tmp_path):
    """The store remembers that ``/ranges/t1/l1`` exists; another client deletes it. The next
    commit's multi fails on it, forgets it, reads again and creates it: nothing is lost."""
    zk_store.commit([Put("/ranges/t1/l1/r0", b"0", NEW)])
    chroot = zk_store._chroot
    other = create_metadata_store(f"zk:{zookeeper.hosts}{chroot}", data_dir=tmp_path, operation_timeout_s=10)
    try:
        other.delete("/ranges/t1/l1/r0")
        other.delete("/ranges/t1/l1")
    finally:
        other.close()
    zk_store.commit_no_stats([Put("/ranges/t1/l1/r1", b"1", NEW), Check("/ranges", 0)])
    assert zk_store.get_children("/ranges/t1/l1") == ["r1"]
    with pytest.raises(BadVersion):  # a real failure under a remembered parent is still the caller's
        zk_store.commit_no_stats([Put("/ranges/t1/l1/r1", b"again", NEW)])
    assert zk_store.get("/ranges/t1/l1/r1").value == b"1"
