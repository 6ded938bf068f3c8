"""The MetadataStore contract, run against every implementation (memory:, sqlite:, zk: on a real
ZooKeeper): compare-and-set, ephemeral keys and sessions, sequential keys, watches, multi-key
commits, children, paths and value limits."""

from __future__ import annotations

import threading
import time

import pytest

from compactmq.storage.metadata_store import (
    MAX_VALUE_SIZE,
    NEW,
    BadVersion,
    Check,
    Delete,
    InvalidPath,
    KeyNotFound,
    NotEmpty,
    Notification,
    NotificationType,
    Put,
    ValueTooLarge,
)

CREATED, MODIFIED = NotificationType.CREATED, NotificationType.MODIFIED
DELETED, CHILDREN = NotificationType.DELETED, NotificationType.CHILDREN_CHANGED


class Recorder:
    """Collects notifications from the store's thread; ``wait_for`` blocks until one matches."""

    def __init__(self):
        self.seen: list[Notification] = []
        self._cond = threading.Condition()

    def __call__(self, notification):
        with self._cond:
            self.seen.append(notification)
            self._cond.notify_all()

    def wait_for(self, type_, path, timeout=10.0) -> None:
        want = Notification(type_, path)
        with self._cond:
            if not self._cond.wait_for(lambda: want in self.seen, timeout):
                raise AssertionError(f"no {want} within {timeout} s; saw {self.seen}")


def wait_until(predicate, timeout=15.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.05)


# --- get / put / delete with versions ---------------------------------------------------------


def test_put_get_versions_and_stat(store):
    assert store.get("/a") is None and not store.exists("/a")
    st = store.put("/a", b"one")
    assert (st.path, st.version, st.ephemeral) == ("/a", 0, False)
    assert st.created_ms == st.modified_ms > 0
    st2 = store.put("/a", b"two")
    got = store.get("/a")
    assert got.value == b"two" and got.stat.version == st2.version == 1
    assert got.stat.created_ms == st.created_ms and got.stat.modified_ms >= st.modified_ms


def test_compare_and_set(store):
    store.put("/k", b"v0", NEW)
    with pytest.raises(BadVersion):
        store.put("/k", b"again", NEW)  # -1: must not exist
    store.put("/k", b"v1", 0)
    with pytest.raises(BadVersion):
        store.put("/k", b"stale", 0)  # a writer that read version 0 lost
    with pytest.raises(BadVersion):
        store.put("/missing", b"x", 0)  # a version of a key that does not exist
    assert store.get("/k").value == b"v1" and not store.exists("/missing")


def test_delete_with_versions(store):
    store.put("/d", b"x")
    store.put("/d", b"y")
    with pytest.raises(BadVersion):
        store.delete("/d", 0)
    store.delete("/d", 1)
    assert not store.exists("/d")
    with pytest.raises(KeyNotFound):
        store.delete("/d")


def test_cas_race_one_winner(open_store):
    """Two stores (two brokers) increment one counter with CAS: no update is lost."""
    a, b = open_store(), open_store()
    a.put("/counter", b"0", NEW)

    def bump(s, n):
        for _ in range(n):
            while True:
                got = s.get("/counter")
                try:
                    s.put("/counter", str(int(got.value) + 1).encode(), got.stat.version)
                    break
                except BadVersion:
                    continue

    threads = [threading.Thread(target=bump, args=(s, 15)) for s in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert a.get("/counter").value == b"30" and b.get("/counter").stat.version == 30


# --- hierarchy ---------------------------------------------------------------------------------


def test_parents_children_sorted_and_not_empty(store):
    for name in ["b", "a", "c", "a0", "B"]:
        store.put(f"/deep/x/y/{name}", name.encode())
    assert store.exists("/deep") and store.exists("/deep/x/y")
    assert store.get("/deep/x").value == b""  # created parents are empty persistent keys
    assert store.get_children("/deep/x/y") == ["B", "a", "a0", "b", "c"]
    assert store.get_children("/deep") == ["x"]
    assert store.get_children("/nothing/here") == []
    assert "deep" in store.get_children("/")
    with pytest.raises(NotEmpty):
        store.delete("/deep/x/y")
    deep = "/" + "/".join(f"l{i}" for i in range(40))
    store.put(deep, b"bottom")
    assert store.get(deep).value == b"bottom"


@pytest.mark.parametrize(
    "segment", ["caf\u00e9", "\u4e3b\u9898", "a%2Fb", "persistent%3A%2F%2Ft", "sp ace", "x.y", "..."]
)
def test_unicode_and_escaped_segments(store, segment):
    path = f"/names/{segment}"
    store.put(path, segment.encode())
    assert store.get(path).value == segment.encode()
    assert store.get_children("/names") == [segment]


@pytest.mark.parametrize(
    "path",
    ["", "a", "/a/", "//a", "/a//b", "/./a", "/a/..", "/a\x00b", "/a\nb", "/\ud83d\ude00", "/\U0001f600"],
)
def test_invalid_paths(store, path):
    with pytest.raises(InvalidPath):
        store.put(path, b"x")
    with pytest.raises(InvalidPath):
        store.get(path)


def test_root_has_no_value(store):
    assert store.exists("/")
    with pytest.raises(InvalidPath):
        store.put("/", b"x")


def test_value_size_limit(store):
    big = bytes(range(256)) * (MAX_VALUE_SIZE // 256) + b"\x00" * (MAX_VALUE_SIZE % 256)
    assert len(big) == MAX_VALUE_SIZE
    store.put("/big", big)
    assert store.get("/big").value == big
    with pytest.raises(ValueTooLarge):
        store.put("/big", big + b"!")
    assert store.get("/big").stat.version == 0


# --- sequential and ephemeral keys -------------------------------------------------------------


def test_sequential_keys_sort_in_creation_order(store):
    paths = [store.put("/queue/item-", str(i).encode(), sequential=True).path for i in range(12)]
    names = [p.rsplit("/", 1)[1] for p in paths]
    assert all(n.startswith("item-") and len(n) == len("item-") + 10 for n in names)
    assert store.get_children("/queue") == names == sorted(names)
    assert [store.get(p).value for p in paths] == [str(i).encode() for i in range(12)]


def test_ephemeral_keys_end_with_their_session(open_store):
    owner, other = open_store(), open_store()
    st = owner.put("/owners/topic-1", b"broker-1", NEW, ephemeral=True)
    assert st.ephemeral and st.created_by_self
    seen = other.get("/owners/topic-1").stat
    assert seen.ephemeral and not seen.created_by_self
    with pytest.raises(BadVersion):
        other.put("/owners/topic-1", b"broker-2", NEW, ephemeral=True)  # owned: someone else won
    with pytest.raises(InvalidPath):
        owner.put("/owners/topic-1/child", b"x")  # ephemeral keys cannot have children
    owner.put("/owners/topic-1", b"broker-1 again")
    assert other.get("/owners/topic-1").stat.ephemeral  # an update keeps the key ephemeral
    owner.put("/owners/persistent", b"stays")
    recorder = Recorder()
    other.watch("/owners/topic-1", recorder)
    owner.close()
    recorder.wait_for(DELETED, "/owners/topic-1")
    assert not other.exists("/owners/topic-1")
    assert other.get("/owners/persistent").value == b"stays"
    other.put("/owners/topic-1", b"broker-2", NEW, ephemeral=True)  # now the other may take over


# --- watches -----------------------------------------------------------------------------------


def test_watch_reports_created_modified_deleted_and_children(open_store):
    watcher, writer = open_store(), open_store()
    on_key, on_parent = Recorder(), Recorder()
    watcher.watch("/w/key", on_key)
    watcher.watch("/w", on_parent)
    writer.put("/w/key", b"1")
    on_key.wait_for(CREATED, "/w/key")
    on_parent.wait_for(CHILDREN, "/w")
    writer.put("/w/key", b"2")
    on_key.wait_for(MODIFIED, "/w/key")
    writer.put("/w/other", b"x")
    writer.delete("/w/key")
    on_key.wait_for(DELETED, "/w/key")
    wait_until(lambda: on_parent.seen.count(Notification(CHILDREN, "/w")) >= 2)
    assert all(n.path == "/w/key" for n in on_key.seen)


def test_own_changes_are_reported_and_cancel_stops(store):
    recorder = Recorder()
    watch = store.watch("/self", recorder)
    store.put("/self", b"1")
    recorder.wait_for(CREATED, "/self")
    watch.cancel()
    later = Recorder()
    store.watch("/self", later)
    store.put("/self", b"2")
    store.put("/self/child", b"c")
    later.wait_for(CHILDREN, "/self")  # delivered after everything the cancelled watch could see
    assert recorder.seen == [Notification(CREATED, "/self")]


def test_callback_may_call_the_store(store):
    values = []
    done = threading.Event()

    def callback(notification):
        got = store.get(notification.path)  # the notification thread is not the store's lock holder
        values.append(None if got is None else got.value)
        done.set()

    store.watch("/re", callback)
    store.put("/re", b"read me")
    assert done.wait(10) and values[0] == b"read me"


# --- multi-key commits -------------------------------------------------------------------------


def test_commit_applies_all(store):
    store.put("/m/a", b"a0")
    store.put("/m/gone", b"x")
    stats = store.commit(
        [Check("/m/a", 0), Put("/m/a", b"a1", 0), Put("/m/new/b", b"b0", NEW), Delete("/m/gone")]
    )
    assert stats[0] is None and stats[1].version == 1 and stats[2].version == 0 and stats[3] is None
    assert store.get("/m/a").value == b"a1" and store.get("/m/new/b").value == b"b0"
    assert not store.exists("/m/gone")


@pytest.mark.parametrize(
    "failing, error",
    [
        (Put("/m/a", b"x", 5), BadVersion),
        (Put("/m/a", b"x", NEW), BadVersion),
        (Check("/m/a", 3), BadVersion),
        (Check("/m/none", 0), BadVersion),
        (Delete("/m/none"), KeyNotFound),
        (Delete("/m/a", 7), BadVersion),
        (Delete("/m"), NotEmpty),
    ],
)
def test_commit_all_or_nothing(store, failing, error):
    store.put("/m/a", b"a0")
    recorder = Recorder()
    store.watch("/m/b", recorder)
    with pytest.raises(error):
        store.commit([Put("/m/b", b"b0"), Put("/m/a", b"a1", 0), Put("/m/c", b"c", NEW), failing])
    assert store.get("/m/a").value == b"a0" and store.get("/m/a").stat.version == 0
    assert not store.exists("/m/b") and not store.exists("/m/c")
    store.put("/m/b", b"sentinel")
    recorder.wait_for(CREATED, "/m/b")
    assert recorder.seen == [Notification(CREATED, "/m/b")]  # the rolled-back commit notified nobody


def test_commit_values_total_limited(store):
    half = b"x" * (MAX_VALUE_SIZE // 2 + 1)
    with pytest.raises(ValueTooLarge):
        store.commit([Put("/t/a", half), Put("/t/b", half)])
    assert not store.exists("/t/a")


def test_commit_ephemeral_put(open_store):
    a, b = open_store(), open_store()
    a.put("/lock-holder", b"")
    a.commit([Put("/lock-holder/owner", b"a", NEW, ephemeral=True), Check("/lock-holder", 0)])
    assert b.get("/lock-holder/owner").stat.ephemeral
    a.close()
    wait_until(lambda: not b.exists("/lock-holder/owner"))


def test_commit_creates_a_key_and_its_children_and_parents_roll_back(store):
    store.commit([Put("/p/locator", b"1", NEW), Put("/p/locator/0001", b"v", NEW), Put("/p/x/y/z", b"z")])
    assert store.get("/p/locator").value == b"1" and store.get_children("/p/locator") == ["0001"]
    assert store.get("/p/x/y").value == b""
    with pytest.raises(BadVersion):  # the failing op comes after puts that need new parents
        store.commit([Put("/q/a/b", b"x"), Put("/q/c", b"y", NEW), Check("/p/locator", 5)])
    assert not store.exists("/q")  # the parents went with the rest


def test_ephemeral_sequential_keys_queue_and_vanish(open_store):
    """A lock or election queue: ephemeral sequential children, in order, gone with their session."""
    a, b = open_store(), open_store()
    first = a.put("/election/n-", b"a", ephemeral=True, sequential=True)
    second = b.put("/election/n-", b"b", ephemeral=True, sequential=True)
    assert first.ephemeral and second.ephemeral
    assert b.get_children("/election") == [first.path.rsplit("/", 1)[1], second.path.rsplit("/", 1)[1]]
    a.close()
    wait_until(lambda: b.get_children("/election") == [second.path.rsplit("/", 1)[1]])
