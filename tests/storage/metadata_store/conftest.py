"""Fixtures of the metadata store tests: one real ZooKeeper per test session, and ``open_store``.

``open_store()`` opens a store of the test's implementation on the test's own data set: stores
opened twice in a test share data with separate sessions (two brokers on one store). ZooKeeper
tests get a chroot of their own on the one server, so they stay independent without a restart.

ZooKeeper missing fails the ZooKeeper tests (CI installs it through scripts/setup.sh); on a
machine without it, ``COMPACTMQ_SKIP_ZOOKEEPER=1`` skips them instead, never in CI.
"""

from __future__ import annotations

import os
import uuid

import pytest

from compactmq.storage.metadata_store import create_metadata_store

from .zk_server import ZooKeeperServer, find_classpath

IMPLEMENTATIONS = ["memory", "sqlite", "zk"]
#: short sessions, so expiry tests are quick (ZooKeeper's floor here is 2 ticks = 1 s)
SESSION_TIMEOUT_MS = 2_000


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory):
    classpath = find_classpath()
    if classpath is None:
        if os.environ.get("COMPACTMQ_SKIP_ZOOKEEPER") == "1" and not os.environ.get("CI"):
            pytest.skip("ZooKeeper not installed and COMPACTMQ_SKIP_ZOOKEEPER=1")
        pytest.fail(
            "ZooKeeper is not installed: run scripts/setup.sh (apt-get install zookeeper), or set "
            "ZOOKEEPER_JAR; COMPACTMQ_SKIP_ZOOKEEPER=1 skips these tests outside CI"
        )
    server = ZooKeeperServer(tmp_path_factory.mktemp("zookeeper"), classpath).start()
    yield server
    server.stop()


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
