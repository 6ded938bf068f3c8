"""A topic's compaction settings (``compaction.settings.topic_settings``) come from one read of the
topic's policies and one of its namespace's -- the same values as reading each policy on its own
(topic, else namespace, else the broker config)."""

from __future__ import annotations

import pytest

from compactmq.compaction.settings import topic_settings
from compactmq.config import load_config, setting
from compactmq.storage import COMPACTION_MIN_LAG, COMPACTION_TOMBSTONE_RETENTION, Storage

TOPIC = "persistent://public/default/settings"


@pytest.fixture
def storage(tmp_path):
    s = Storage(tmp_path / "data", load_config(overrides={"dataDir": str(tmp_path / "data")}))
    yield s
    s.close()


def test_one_read_each_same_values(storage):
    config = load_config(overrides={"brokerServiceCompactionMinLagInSeconds": 7})
    storage.policies.set_namespace_policy("public/default", COMPACTION_TOMBSTONE_RETENTION, 30)
    storage.policies.set_namespace_policy("public/default", COMPACTION_MIN_LAG, 9)
    storage.policies.set_topic_policy(TOPIC, COMPACTION_MIN_LAG, 3)  # the topic's wins
    reads: list[str] = []
    store = storage.metadata_store
    get = store.get
    store.get = lambda path, *a, **kw: reads.append(path) or get(path, *a, **kw)
    try:
        got = topic_settings(storage, TOPIC, config)
    finally:
        store.get = get
    assert got["min_lag_seconds"] == 3
    assert got["tombstone_retention_seconds"] == 30  # the namespace's
    assert got["key_ttl_seconds"] == 0  # the broker default
    assert got["strategy"] == setting(config, "topicCompactionStrategy")  # neither has one
    assert len(reads) == 2, reads  # the topic's policies, the namespace's
