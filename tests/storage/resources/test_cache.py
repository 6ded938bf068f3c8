"""MetadataCache: hits without reads, invalidation by watches (changes from another store too),
no stale value from a change racing a read, bounded size."""

from __future__ import annotations

import time

from compactmq.storage.resources import MetadataCache


def wait_until(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.02)


def test_hits_and_invalidation_by_another_writer(store, tmp_path):
    cache = MetadataCache(store)
    assert cache.get("/admin/policies/t") is None  # absence is cached too
    store.put("/admin/policies/t", b"v1")
    wait_until(lambda: cache.get("/admin/policies/t") is not None)
    assert cache.get("/admin/policies/t").value == b"v1"
    hits = cache.hits
    for _ in range(5):
        assert cache.get("/admin/policies/t").value == b"v1"
    assert cache.hits == hits + 5
    store.put("/admin/policies/t", b"v2")
    wait_until(lambda: cache.get("/admin/policies/t").value == b"v2")
    store.delete("/admin/policies/t")
    wait_until(lambda: cache.get("/admin/policies/t") is None)


def test_invalidate_gives_read_your_writes(store):
    cache = MetadataCache(store)
    store.put("/k", b"1")
    assert cache.get("/k").value == b"1"
    store.put("/k", b"2")
    cache.invalidate("/k")
    assert cache.get("/k").value == b"2"


def test_a_change_during_a_read_never_sticks(store):
    """The read that raced a change is dropped (its generation moved), never cached."""
    cache = MetadataCache(store)
    store.put("/r", b"old")
    real_get = store.get

    def get_then_change(path):
        got = real_get(path)
        store.put(path, b"new")  # lands after the read, before it is cached
        wait_until(lambda: cache._generation.get(path, 0) > 0)  # its notification arrived
        return got

    store.get = get_then_change
    try:
        assert cache.get("/r").value == b"old"
    finally:
        store.get = real_get
    assert cache.get("/r").value == b"new"


def test_bounded(store):
    cache = MetadataCache(store, max_entries=3)
    for i in range(6):
        store.put(f"/b/{i}", b"x")
        cache.get(f"/b/{i}")
    assert len(cache) == 3 and len(cache._watches) == 3
