"""A run whose view went to the object store and whose commit was refused leaves nothing behind.

``view_store.ObjectPartsStore``: the tasks upload parts under a fresh prefix, the driver writes
the manifest, ``publish`` adds the view's catalog row just before the commit; when the commit is
refused (``Fenced`` after an ownership move, ``StaleCompaction``) ``discard`` removes the row and
every object under the prefix. It once removed the row by key instead of by record: the
AttributeError cut the discard short and the row and the parts stayed (found by the two-broker
``tests/broker/test_cluster_compaction_regressions.py``). Here without Spark: the filesystem
offload driver, a real Storage, the parts written as a task writes them.
"""

from __future__ import annotations

from compactmq.compaction import tiered, view_store
from compactmq.config import load_config
from compactmq.storage import Storage
from compactmq.storage.offload import COMPACTED, open_store

TOPIC = "persistent://public/default/discard-after-refusal"


def test_a_refused_object_store_view_leaves_no_row_and_no_object(tmp_path):
    conf = {"managedLedgerOffloadDriver": "filesystem", "fileSystemURI": f"file://{tmp_path}/offload"}
    conf["compactionObjectStoreChains"] = False  # the parts layout (chains: ``test_object_chain``)
    st = Storage(tmp_path / "data", load_config(overrides=conf))
    try:
        st.open_managed_ledger(TOPIC)
        views = view_store.for_run(st, TOPIC)
        assert isinstance(views, view_store.ObjectPartsStore)
        new_id = st.resources.ledger_ids.allocate()
        views.prefix = tiered.new_view_prefix(TOPIC, new_id)  # what ``prepare`` picks
        store = open_store(views.location)
        store.put(f"{views.prefix}/part-000000", [b"records of one part"])
        views.record, _ = tiered.write_view_manifest(st, TOPIC, views.location, views.prefix, new_id, [])
        views.publish()
        assert new_id in st.offloader.catalog.for_topic(TOPIC, COMPACTED)
        assert store.list(views.prefix)

        views.discard(None, new_id)  # the commit was refused

        assert new_id not in st.offloader.catalog.for_topic(TOPIC, COMPACTED)
        assert store.list(views.prefix) == []
    finally:
        st.close()
