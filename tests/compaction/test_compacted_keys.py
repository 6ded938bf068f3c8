"""``compactedKeys`` counts the live keys of the compacted view: a tombstone kept there by
``compactionTombstoneRetentionSeconds`` is a deleted key, not a key (it is counted apart)."""

from __future__ import annotations

import time

import pytest

from compactmq.compaction.jobs import SparkCompactionService
from compactmq.compaction.jobs.session import TEST_CONF
from compactmq.config import load_config
from compactmq.storage import Storage

from . import entries as E

TOPIC = "persistent://public/default/compacted-keys"


@pytest.mark.parametrize("retention", [0, 3600])
def test_compacted_keys_are_live_keys_only(tmp_path, spark, retention):
    cfg = load_config(
        overrides={"managedLedgerSyncData": False, "topicCompactionTombstoneRetentionSeconds": retention}
    )
    st = Storage(str(tmp_path), cfg)
    try:
        ml = st.open_managed_ledger(TOPIC)
        now = int(time.time() * 1000)
        ml.append_many([E.single(f"k{i % 5}", b"v%d" % i, publish_time=now) for i in range(20)])
        ml.append_many([E.single(k, b"", publish_time=now) for k in ("k0", "k1")])  # deletes
        ml.rollover()
        service = SparkCompactionService(st, TOPIC, cfg, spark_conf=TEST_CONF)
        result = service.compact()
        kept_tombstones = 2 if retention else 0
        assert result.messages_kept == 3 + kept_tombstones  # the view holds the young tombstones
        stats = service.stats()
        assert stats.keys == 3 and stats.entries == 3 + kept_tombstones
        assert stats.tombstones == kept_tombstones
    finally:
        st.close()
