"""A topic load that fails because the metadata store went away answers a retriable error.

The official client retries a producer or consumer create answered ``ServiceNotReady`` (with a
lookup first) but fails a first create answered ``PersistenceError``. A load reads the ledger's
layout from the metadata store; when that read fails because the store is away (kazoo's
``SessionExpiredError`` or connection loss: ``StoreUnavailable``), a storage layer wrapped it in
a ``StorageError`` -- PersistenceError on the wire, so a client creating a producer on a broker
whose session just expired got an error instead of a retry. Here one broker in the test process
on a real ZooKeeper, ledgers in a ``file://`` object store, the official client; the store is
made to fail once, exactly where the load reads a ledger's ranges (``GroupFlush.ranges``).

A real persistence failure (a damaged ledger) on a broker that still owns the topic must stay
PersistenceError: retrying it would only hide it.
"""

from __future__ import annotations

import uuid

import pytest

pulsar = pytest.importorskip("pulsar")

from compactmq.errors import ServerError, StorageError  # noqa: E402
from compactmq.storage import object_group_flush  # noqa: E402
from compactmq.storage.metadata_store import StoreUnavailable  # noqa: E402
from compactmq.storage.metadata_store.zookeeper import ZKMetadataStore  # noqa: E402
from compactmq.storage.object_ledger_upkeep import wait_merges  # noqa: E402
from harness.broker import InProcessBroker, make_client, zk_in_process_broker  # noqa: E402
from storage.metadata_store.zk_server import zookeeper  # noqa: E402,F401  (tests/ is on sys.path)

pytestmark = pytest.mark.integration


@pytest.fixture
def broker(tmp_path, zookeeper):  # noqa: F811
    with zk_in_process_broker(
        tmp_path / "data", zookeeper.hosts, "l", {"objectLedgerStorageUrl": f"file://{tmp_path / 'objects'}"}
    ) as b:
        yield b


def written_and_unloaded(b: InProcessBroker) -> str:
    """A topic with a few entries, unloaded (its ledger sealed): its next load reads the ranges."""
    topic = f"persistent://public/default/load-{uuid.uuid4().hex[:6]}"
    client = make_client(b.url)
    try:
        producer = client.create_producer(topic)
        for i in range(3):
            producer.send(b"m%d" % i)
        producer.close()
    finally:
        client.close()
    b.on_loop(b.server.service.topics.unload(topic, close_ledger=True))
    wait_merges()  # none running: the next read of the ranges is the load's (its recovery)
    return topic


def fail_range_reads(monkeypatch, times: int) -> list[str]:
    """The metadata store fails the next ``times`` reads under the ranges root, as kazoo does
    when its session expired; returns the paths failed."""
    real = ZKMetadataStore._call
    failed: list[str] = []

    def call(self, async_result, path):
        if path.startswith(object_group_flush.RANGES_ROOT) and len(failed) < times:
            failed.append(path)
            try:  # the real call ran; its answer (a NoNodeError too) is lost
                async_result.get(timeout=10)
            except Exception:  # noqa: BLE001
                pass
            raise StoreUnavailable(f"ZooKeeper connection lost ({path}): SessionExpiredError")
        return real(self, async_result, path)

    monkeypatch.setattr(ZKMetadataStore, "_call", call)
    return failed


def test_a_load_failing_on_the_store_is_retried_by_the_client(broker, monkeypatch):
    """End to end: the producer is created (the client of today retries a producer create
    answered either way; the wire code is checked below) and nothing is lost."""
    topic = written_and_unloaded(broker)
    failed = fail_range_reads(monkeypatch, 1)
    client = make_client(broker.url, operation_timeout_seconds=20)
    try:
        producer = client.create_producer(topic)  # its first load fails once
        assert failed, "the load never read the ledger's ranges: the test proves nothing"
        producer.send(b"after")
        producer.close()
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        got = [reader.read_next(timeout_millis=10000).data() for _ in range(4)]
        assert got == [b"m0", b"m1", b"m2", b"after"]
        reader.close()
    finally:
        client.close()


def test_the_failed_load_is_answered_service_not_ready(broker, monkeypatch):
    topic = written_and_unloaded(broker)
    failed = fail_range_reads(monkeypatch, 1)
    with pytest.raises(Exception) as info:
        broker.on_loop(broker.server.service.topics.get_topic(topic, create=False))
    assert failed, "the load never read the ledger's ranges: the test proves nothing"
    assert getattr(info.value, "server_error", None) is ServerError.ServiceNotReady, repr(info.value)


def test_a_damaged_ledger_stays_a_persistence_error(broker, monkeypatch):
    topic = written_and_unloaded(broker)

    def damaged(self, topic_path, ledger_id):
        raise StorageError(f"ledger {ledger_id}: range record is damaged")

    monkeypatch.setattr(object_group_flush.GroupFlush, "ranges", damaged)
    with pytest.raises(StorageError) as info:
        broker.on_loop(broker.server.service.topics.get_topic(topic, create=False))
    assert info.value.server_error is ServerError.PersistenceError
