"""Fixtures of the metadata store tests: one real ZooKeeper per test session, and ``open_store``.

``open_store()`` opens a store of the test's implementation on the test's own data set: stores
opened twice in a test share data with separate sessions (two brokers on one store). ZooKeeper
tests get a chroot of their own on the one server, so they stay independent without a restart.

The ``zookeeper`` fixture itself is in ``zk_server.py`` (tests/storage/conftest.py makes it one
server for the whole session, shared with the resources tests).
"""

from __future__ import annotations

import uuid

import pytest

from compactmq.storage.metadata_store import create_metadata_store


IMPLEMENTATIONS = ["memory", "sqlite", "zk"]
#: short sessions, so expiry tests are quick (ZooKeeper's floor here is 2 ticks = 1 s)
SESSION_TIMEOUT_MS = 2_000


@pytest.fixture(params=IMPLEMENTATIONS)
def store_url(request, tmp_path):
    """The URL of a fresh data set of one implementation."""
    if request.param == "memory":
        return f"memory:t{uuid.uuid4().hex[:12]}"
    if request.param == "sqlite":
        return "sqlite:meta.db"
    server = request.getfixturevalue("zookeeper")
    return f"zk:{server.hosts}/t{uuid.uuid4().hex[:12]}"


@pytest.fixture
def open_store(store_url, tmp_path):
    """``open_store(**kw)`` -> a store on the test's data set; all closed at teardown."""
    opened = []

    def _open(**kw):
        kw.setdefault("session_timeout_ms", SESSION_TIMEOUT_MS)
        kw.setdefault("operation_timeout_s", 10)
        store = create_metadata_store(store_url, data_dir=tmp_path, **kw)
        opened.append(store)
        return store

    yield _open
    for store in opened:
        store.close()


@pytest.fixture
def store(open_store):
    return open_store()
