"""Tenants and namespaces over the admin REST on a broker started with each ``metadataStoreUrl``:
the embedded default and a real ZooKeeper (started by the tests, one server for the session).

What moved to the metadata store must behave the same on both, survive a broker restart, and
live where the URL says: on ZooKeeper the keys are read back through a store of our own, and the
old SQLite tables of the data directory never see them."""

from __future__ import annotations

import uuid

import pytest

pytest.importorskip("pulsar")

from storage.metadata_store.zk_server import zookeeper  # noqa: E402,F401  (tests/ is on sys.path)

from compactmq.naming import TopicName  # noqa: E402
from compactmq.storage.metadata_store.legacy_tables import open_legacy_tables  # noqa: E402
from storage.old_metadata import MetadataStore as OldMetadata  # noqa: E402
from compactmq.storage.metadata_store import create_metadata_store  # noqa: E402
from compactmq.storage.resources import PulsarResources  # noqa: E402

from .harness import Http, publish, start_broker, topic_path, wait_status, web_url  # noqa: E402

pytestmark = pytest.mark.integration

NS = "/admin/v2/namespaces"
TENANTS = "/admin/v2/tenants"


@pytest.fixture(params=["embedded", "zk"])
def store_url(request):
    if request.param == "embedded":
        return ""
    return f"zk:{request.getfixturevalue('zookeeper').hosts}/b{uuid.uuid4().hex[:12]}"


def _lifecycle(http: Http) -> None:
    assert "public" in http.ok("GET", TENANTS)  # created at start, in this store
    assert http.ok("GET", f"{NS}/public") == ["public/default"]
    http.ok("PUT", f"{TENANTS}/acme", {"adminRoles": ["ops"]})
    assert http.error("PUT", f"{TENANTS}/acme", 409, {})
    http.ok("POST", f"{TENANTS}/acme", {"adminRoles": ["dev", "ops"]})
    assert http.ok("GET", f"{TENANTS}/acme")["adminRoles"] == ["dev", "ops"]
    http.error("POST", f"{TENANTS}/nobody", 404, {})
    http.ok("PUT", f"{NS}/acme/orders")
    http.ok("PUT", f"{NS}/acme/billing")
    http.error("PUT", f"{NS}/acme/orders", 409)
    http.error("PUT", f"{NS}/nobody/orders", 404)
    assert http.ok("GET", f"{NS}/acme") == ["acme/billing", "acme/orders"]
    http.error("DELETE", f"{TENANTS}/acme", 409)  # still has namespaces
    # a namespace with a topic cannot be deleted; policies set on one go with it
    http.ok("PUT", topic_path("persistent://acme/billing/t"))
    http.error("DELETE", f"{NS}/acme/billing", 409)
    http.ok("DELETE", topic_path("persistent://acme/billing/t"))
    http.ok("PUT", f"{NS}/acme/billing/compactionThreshold", 1024)
    http.ok("DELETE", f"{NS}/acme/billing")
    http.error("DELETE", f"{NS}/acme/billing", 404)
    http.ok("PUT", f"{NS}/acme/billing")
    assert http.ok("GET", f"{NS}/acme/billing/compactionThreshold") is None
    http.ok("DELETE", f"{NS}/acme/billing")
    # partitioned topics: their metadata lives in the same store
    parted = topic_path("persistent://acme/orders/parted")
    http.ok("PUT", parted + "/partitions", 2)
    http.error("PUT", parted + "/partitions", 409, 2)
    assert http.ok("GET", parted + "/partitions") == {"partitions": 2}
    http.ok("POST", parted + "/partitions", 3)
    http.error("POST", parted + "/partitions", 412, 1)
    assert http.ok("GET", "/admin/v2/persistent/acme/orders/partitioned") == [
        "persistent://acme/orders/parted"
    ]
    http.error("DELETE", f"{NS}/acme/orders", 409)  # still has a partitioned topic
    http.ok("PUT", topic_path("persistent://acme/orders/gone") + "/partitions", 1)
    http.ok("DELETE", topic_path("persistent://acme/orders/gone") + "/partitions")
    http.error("DELETE", topic_path("persistent://acme/orders/gone") + "/partitions", 404)


def test_tenants_and_namespaces_on_each_store(tmp_path, store_url):
    data = tmp_path / "data"
    broker = start_broker(data, metadataStoreUrl=store_url, in_process=True)
    try:
        _lifecycle(Http(web_url(broker)))
    finally:
        broker.stop()
    broker = start_broker(data, metadataStoreUrl=store_url, in_process=True)  # the same store after a restart
    try:
        http = Http(web_url(broker))
        assert http.ok("GET", f"{TENANTS}/acme")["adminRoles"] == ["dev", "ops"]
        assert http.ok("GET", f"{NS}/acme") == ["acme/orders"]
        assert http.ok("GET", topic_path("persistent://acme/orders/parted") + "/partitions") == {
            "partitions": 3
        }
    finally:
        broker.stop()
    if store_url:  # ZooKeeper holds them; the data directory's old tables never did
        kv = create_metadata_store(store_url, data_dir=data, operation_timeout_s=10)
        try:
            res = PulsarResources(kv)
            assert res.tenants.get("acme") == {
                "adminRoles": ["dev", "ops"],
                "allowedClusters": ["standalone"],
            }
            assert res.namespaces.list_namespaces("acme") == ["acme/orders"]
            assert res.partitioned_topics.list_topics("acme/orders") == [
                TopicName.parse("acme/orders/parted")
            ]
        finally:
            kv.close()
        # a fresh data directory has no old tables at all (the tenant's info never went there)
        assert open_legacy_tables(data / "metadata.db") is None


def test_an_old_data_directory_opens_with_its_tenants_and_namespaces(tmp_path, store_url):
    """A data directory written by the old code (tenants and namespaces in the old tables) keeps
    them when a broker opens it, whichever store the broker is told to use."""
    data = tmp_path / "data"
    data.mkdir()
    old = OldMetadata(data / "metadata.db", bootstrap=True)
    old.create_tenant("legacy", {"adminRoles": ["ops"], "allowedClusters": ["standalone"]})
    old.create_namespace("legacy/ns")
    old.create_partitioned_topic("persistent://legacy/ns/parted", 2)
    old.close()
    broker = start_broker(data, metadataStoreUrl=store_url, in_process=True)
    try:
        http = Http(web_url(broker))
        assert http.ok("GET", f"{TENANTS}/legacy") == {
            "adminRoles": ["ops"],
            "allowedClusters": ["standalone"],
        }
        assert http.ok("GET", f"{NS}/legacy") == ["legacy/ns"]
        http.ok("PUT", topic_path("persistent://legacy/ns/t"))  # the namespace is usable
        assert http.ok("GET", topic_path("persistent://legacy/ns/parted") + "/partitions") == {
            "partitions": 2
        }
        assert http.ok("GET", f"{NS}/public") == ["public/default"]
    finally:
        broker.stop()


ARROW = "tests.broker.arrow_compaction.ArrowCompactionServiceFactory"  # Spark is not the subject here


def test_compaction_trigger_status_and_restart_on_each_store(tmp_path, store_url):
    """Compaction's state (status, horizon, view pointer) lives in the metadata store the URL
    names: it is what the admin status and internalStats report, and it survives a restart."""
    data = tmp_path / "data"
    topic = "persistent://public/default/compacted-on-store"
    tp = topic_path(topic)
    conf = {"metadataStoreUrl": store_url, "compactionServiceFactoryClassName": ARROW}
    broker = start_broker(data, **conf, in_process=True)
    try:
        http = Http(web_url(broker))
        publish(broker, topic, 30, keys=4)
        assert http.ok("GET", tp + "/compaction")["status"] == "NOT_RUN"
        http.ok("PUT", tp + "/compaction")
        wait_status(http, topic, "SUCCESS", timeout=60)
        stats = http.ok("GET", tp + "/internalStats")
        horizon, status = stats["compactionHorizon"], stats["compactionStatus"]
        view = stats["compactedLedger"]["ledgerId"]
        assert horizon is not None and status == "SUCCESS" and view >= 0
    finally:
        broker.stop()
    broker = start_broker(data, **conf, in_process=True)  # the same store after a restart
    try:
        http = Http(web_url(broker))
        assert http.ok("GET", tp + "/compaction") == {"status": "SUCCESS", "lastError": ""}
        stats = http.ok("GET", tp + "/internalStats")
        assert (stats["compactionHorizon"], stats["compactedLedger"]["ledgerId"]) == (horizon, view)
        publish(broker, topic, 10, keys=4, prefix="w")
        http.ok("PUT", tp + "/compaction")
        wait_status(http, topic, "SUCCESS", timeout=60)
        after = http.ok("GET", tp + "/internalStats")
        assert after["compactedLedger"]["ledgerId"] != view and after["compactionHorizon"] != horizon
    finally:
        broker.stop()
    if store_url:  # ZooKeeper holds the state; the data directory's old tables have none
        kv = create_metadata_store(store_url, data_dir=data, operation_timeout_s=10)
        try:
            state, _ = PulsarResources(kv).compaction.get(TopicName.parse(topic))
            assert (
                state["status"] == "SUCCESS"
                and state["compactedLedgerId"] == after["compactedLedger"]["ledgerId"]
            )
        finally:
            kv.close()
        assert open_legacy_tables(data / "metadata.db") is None  # no old tables were made
