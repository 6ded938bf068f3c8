"""Cluster resources between two brokers' sessions on one store (memory: shared by name, and the
real ZooKeeper): one owner per bundle, one leader, registrations that go with their session."""

from __future__ import annotations

import uuid

import pytest

from compactmq.storage.metadata_store import create_metadata_store
from compactmq.storage.resources import PulsarResources

RANGE = "0x00000000_0x40000000"


@pytest.fixture(params=["memory", "zk"])
def two(request, tmp_path):
    """Two PulsarResources on the same data, each with its own session (two brokers)."""
    if request.param == "memory":
        url = f"memory:c{uuid.uuid4().hex[:8]}"
    else:
        url = f"zk:{request.getfixturevalue('zookeeper').hosts}/c{uuid.uuid4().hex[:12]}"
    stores = [create_metadata_store(url, data_dir=tmp_path, operation_timeout_s=10) for _ in range(2)]
    yield [PulsarResources(s) for s in stores], stores
    for s in stores:
        s.close()


def test_one_owner_per_bundle_and_it_goes_with_its_session(two):
    (a, b), (store_a, _) = two
    data_a = {"nativeUrl": "pulsar://a:6650", "httpUrl": "http://a:8080", "disabled": False}
    data_b = {"nativeUrl": "pulsar://b:6650", "httpUrl": "http://b:8080", "disabled": False}
    assert a.ownership.try_acquire("public/default", RANGE, data_a) == (data_a, True)
    assert b.ownership.try_acquire("public/default", RANGE, data_b) == (data_a, False)
    assert b.ownership.owner("public/default", RANGE) == (data_a, False)
    assert b.ownership.release("public/default", RANGE) is False  # not b's to release
    assert set(b.ownership.owned_ranges("public/default")) == {RANGE}
    store_a.close()  # broker a ends: its ephemeral keys go
    assert b.ownership.owner("public/default", RANGE) is None
    assert b.ownership.try_acquire("public/default", RANGE, data_b) == (data_b, True)
    assert b.ownership.release("public/default", RANGE) is True
    assert b.ownership.owner("public/default", RANGE) is None


def test_registration_leader_and_unload_hints(two):
    (a, b), _ = two
    version = a.brokers.register("a:8080", {"webServiceUrl": "http://a:8080", "numBundles": 0})
    b.brokers.register("b:8080", {"webServiceUrl": "http://b:8080", "numBundles": 0})
    assert (
        a.brokers.report("a:8080", {"webServiceUrl": "http://a:8080", "numBundles": 2}, version) is not None
    )
    assert a.brokers.report("a:8080", {"numBundles": 3}, version) is None  # a stale version: not written
    assert {k: v["numBundles"] for k, v in b.brokers.brokers().items()} == {"a:8080": 2, "b:8080": 0}
    assert a.leader.try_lead({"brokerId": "a:8080"}) == ({"brokerId": "a:8080"}, True)
    assert b.leader.try_lead({"brokerId": "b:8080"}) == ({"brokerId": "a:8080"}, False)
    a.leader.resign()
    assert b.leader.try_lead({"brokerId": "b:8080"})[1] is True
    a.brokers.unregister("a:8080")
    assert set(b.brokers.brokers()) == {"b:8080"}
    a.unload_hints.put("public/default", RANGE, {"destinationBroker": "b:8080"})
    assert b.unload_hints.take("public/default", RANGE) == {"destinationBroker": "b:8080"}
    assert a.unload_hints.take("public/default", RANGE) is None  # taken once
