"""``resources``: a PulsarResources on a fresh store of each implementation (memory:, sqlite:, and
zk: on the session's real ZooKeeper, in a chroot of its own)."""

from __future__ import annotations

import uuid

import pytest

from compactmq.storage.metadata_store import create_metadata_store
from compactmq.storage.resources import PulsarResources


@pytest.fixture(params=["memory", "sqlite", "zk"])
def store(request, tmp_path):
    if request.param == "memory":
        url = "memory:"
    elif request.param == "sqlite":
        url = "sqlite:meta.db"
    else:
        url = f"zk:{request.getfixturevalue('zookeeper').hosts}/r{uuid.uuid4().hex[:12]}"
    store = create_metadata_store(url, data_dir=tmp_path, operation_timeout_s=10)
    yield store
    store.close()


@pytest.fixture
def resources(store):
    return PulsarResources(store)
