"""Topics, subscriptions with their cursors, and policies across a broker restart, on the
embedded store and on a real ZooKeeper (started by the tests, one server for the session).

The official client publishes and acknowledges (with a hole); the broker stops cleanly (which
writes the cursor positions its rate limit held back) and starts again on the same store: the
topic, its subscription and exactly the unacknowledged messages are there, and so are the
policies. On ZooKeeper the keys are read back through a store of our own, and the data
directory's old tables never saw the topic."""

from __future__ import annotations

import uuid

import pytest

pulsar = pytest.importorskip("pulsar")

from storage.metadata_store.zk_server import zookeeper  # noqa: E402,F401  (tests/ is on sys.path)

from compactmq.naming import TopicName  # noqa: E402
from compactmq.storage.metadata_store.legacy_tables import open_legacy_tables  # noqa: E402
from compactmq.storage.metadata_store import create_metadata_store  # noqa: E402
from compactmq.storage.resources import PulsarResources  # noqa: E402

from .harness import Http, make_client, start_broker, topic_path, web_url  # noqa: E402

pytestmark = pytest.mark.integration

TOPIC = "persistent://public/default/kept"
NS_POLICY = "/admin/v2/namespaces/public/default/retention"
THRESHOLD = 10**12  # set, and never reached: no compaction runs


@pytest.fixture(params=["embedded", "zk"])
def store_url(request):
    if request.param == "embedded":
        return ""
    return f"zk:{request.getfixturevalue('zookeeper').hosts}/m{uuid.uuid4().hex[:12]}"


def _publish_and_ack(broker) -> None:
    client = make_client(broker.url)
    try:
        consumer = client.subscribe(TOPIC, "sub")
        producer = client.create_producer(TOPIC, batching_enabled=False)
        for i in range(10):
            producer.send(b"m%d" % i)
        for i in range(10):
            msg = consumer.receive(timeout_millis=10_000)
            if i < 5 or i == 7:  # the first five, and a hole at 7
                consumer.acknowledge(msg)
        producer.close()
        consumer.close()
    finally:
        client.close()


def _unacked_after_restart(broker) -> list[bytes]:
    client = make_client(broker.url)
    try:
        consumer = client.subscribe(TOPIC, "sub")
        got = []
        while True:
            try:
                msg = consumer.receive(timeout_millis=2_000)
            except pulsar.Timeout:
                return got
            got.append(msg.data())
            consumer.acknowledge(msg)
    finally:
        client.close()


def test_topics_subscriptions_cursors_and_policies_across_a_restart(tmp_path, store_url):
    data = tmp_path / "data"
    broker = start_broker(data, metadataStoreUrl=store_url, in_process=True)
    try:
        http = Http(web_url(broker))
        _publish_and_ack(broker)
        http.ok("POST", topic_path(TOPIC) + "/compactionThreshold", THRESHOLD)
        http.ok("POST", NS_POLICY, {"retentionTimeInMinutes": 60, "retentionSizeInMB": 5})
    finally:
        broker.stop()  # SIGTERM: a clean stop writes the cursor positions held back
    broker = start_broker(data, metadataStoreUrl=store_url, in_process=True)
    try:
        http = Http(web_url(broker))
        assert TOPIC in http.ok("GET", "/admin/v2/persistent/public/default")
        assert "sub" in http.ok("GET", topic_path(TOPIC) + "/stats")["subscriptions"]
        assert _unacked_after_restart(broker) == [b"m5", b"m6", b"m8", b"m9"]
        assert http.ok("GET", topic_path(TOPIC) + "/compactionThreshold") == THRESHOLD
        assert http.ok("GET", NS_POLICY) == {"retentionTimeInMinutes": 60, "retentionSizeInMB": 5}
        http.ok("DELETE", topic_path(TOPIC) + "?force=true")
        assert TOPIC not in http.ok("GET", "/admin/v2/persistent/public/default")
    finally:
        broker.stop()
    if not store_url:
        return
    # ZooKeeper held them: read back through a store of our own; the old tables never had them
    kv = create_metadata_store(store_url, data_dir=data, operation_timeout_s=10)
    try:
        res = PulsarResources(kv)
        assert not res.managed_ledgers.exists(TopicName.parse(TOPIC))
        stored = res.policies.get_namespace_policies("public/default")
        stored.pop("bundles", None)  # the cluster's bundle split of the namespace (broker.cluster)
        assert stored == {
            "retentionTimeInMinutes": 60,
            "retentionSizeInMB": 5,
        }
    finally:
        kv.close()
    assert open_legacy_tables(data / "metadata.db") is None  # no old tables in a fresh directory


def test_the_store_holds_the_ledger_list_and_cursor_a_broker_wrote(tmp_path, store_url):
    """What a second process (a compact-topic job) reads while the broker runs: the ledger list
    and the subscription's cursor, from the store the URL names."""
    data = tmp_path / "data"
    broker = start_broker(data, metadataStoreUrl=store_url, in_process=True)
    try:
        _publish_and_ack(broker)
        broker.stop()
        kv = create_metadata_store(store_url, data_dir=data, operation_timeout_s=10)
        try:
            res = PulsarResources(kv)
            tn = TopicName.parse(TOPIC)
            info, _ = res.managed_ledgers.get(tn)
            assert sum(led["entries"] for led in info["ledgerInfo"]) == 10
            assert res.managed_ledgers.list_cursors(tn) == ["sub"]
            cursor, _ = res.managed_ledgers.get_cursor(tn, "sub")
            assert cursor["markDeleteEntryId"] == 4  # 0..4 acknowledged; 7 is in the acked ranges
            assert cursor["individualDeletedMessages"]
        finally:
            kv.close()
    finally:
        broker.stop()
