"""What a read-compacted reader sees once retention has deleted ledgers under the compacted view.

``topicCompactionRetentionMode``: ``retention-bounded`` (default) hides compacted entries below
the topic's first retained entry; ``keep-until-tombstone`` keeps serving every key of the
compacted ledger until a tombstone deletes it. The broker here rolls a ledger every 4 entries
and applies retention (0: acknowledged data goes) every second.
"""

from __future__ import annotations

import pytest

pulsar = pytest.importorskip("pulsar")

from harness.broker import BrokerProcess, make_client  # noqa: E402
from harness.wait import wait_until  # noqa: E402

from .factories import compaction_factory, compactor  # noqa: E402,F401 - every test runs on each factory
from .test_read_compacted import compact, compacted_reader, kv, latest, produce, read_available  # noqa: E402

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def broker(tmp_path_factory, compaction_factory):
    b = BrokerProcess(
        tmp_path_factory.mktemp("broker-retention") / "data",
        {
            "compactionServiceFactoryClassName": compaction_factory,
            "managedLedgerMaxEntriesPerLedger": "4",
            "retentionCheckIntervalInSeconds": "1",
            "defaultRetentionTimeInMinutes": "0",
            "defaultRetentionSizeInMB": "0",
        },
    )
    b.start()
    yield b
    b.stop()


def ledgers_of(broker, topic: str) -> list:
    """The topic's ledger list as the broker (another process) wrote it in the metadata store."""
    from compactmq.naming import TopicName
    from compactmq.storage.metadata_store import create_metadata_store
    from compactmq.storage.resources import ManagedLedgerResources

    store = create_metadata_store("", data_dir=broker.data_dir)
    try:
        got = ManagedLedgerResources(store).get(TopicName.parse(topic))
        return [] if got is None else [j["ledgerId"] for j in got[0]["ledgerInfo"]]
    finally:
        store.close()


def set_mode(broker, topic: str, mode: str) -> None:
    """Set the topic's policy in the broker's metadata store (another process, as an admin tool)."""
    from compactmq.storage import COMPACTION_RETENTION_MODE
    from compactmq.storage.metadata_store import create_metadata_store
    from compactmq.storage.resources import PulsarResources

    store = create_metadata_store("", data_dir=broker.data_dir)
    try:
        PulsarResources(store).policies.set_topic_policy(topic, COMPACTION_RETENTION_MODE, mode)
    finally:
        store.close()


def trimmed_compacted_topic(broker, client, topic):
    """10 keys written twice over 5 ledgers, compacted, then everything acknowledged and the
    closed ledgers deleted by retention. Returns the items."""
    hold = client.subscribe(topic, "hold", initial_position=pulsar.InitialPosition.Earliest)
    items = kv(10, 2)
    produce(client, topic, items, batching=False)
    # read before the acknowledgements: retention may delete the ledgers as soon as they are acked
    before = ledgers_of(broker, topic)
    assert len(before) >= 4
    compact(broker, topic)
    for _ in items:
        hold.acknowledge_cumulative(hold.receive(5000))
    hold.close()
    # every closed ledger is acknowledged: retention deletes them all, the current one stays
    wait_until(
        lambda: len(ledgers_of(broker, topic)) <= 1, 15, f"retention to delete the ledgers {before}", 0.2
    )
    after = ledgers_of(broker, topic)
    assert len(after) < len(before), f"retention deleted no ledger in 15 s ({before} -> {after})"
    return items


def test_retention_bounded_hides_compacted_entries_retention_removed(broker, topic, compactor):
    client = make_client(broker.url)
    try:
        trimmed_compacted_topic(broker, client, topic)
        got = read_available(compacted_reader(client, topic))
        # whatever the reader gets lies in ledgers retention kept
        kept = set(ledgers_of(broker, topic))
        assert all(m.message_id().ledger_id() in kept for m in got)
        assert len(got) < 10
        # new messages after the horizon still arrive
        produce(client, topic, [("z", b"new")], batching=False)
        assert compacted_reader(client, topic).read_next(5000).data() in {m.data() for m in got} | {b"new"}
    finally:
        client.close()


def test_keep_until_tombstone_serves_every_key_retention_removed(broker, topic, compactor):
    set_mode(broker, topic, "keep-until-tombstone")
    client = make_client(broker.url)
    try:
        items = trimmed_compacted_topic(broker, client, topic)
        reader = compacted_reader(client, topic)
        got = read_available(reader)
        assert {m.partition_key(): m.data() for m in got} == latest(items)
        assert len(got) == 10
    finally:
        client.close()
