"""Grants inside the namespace Policies value (Pulsar's ``auth_policies``), on every store (the
real ZooKeeper included), through the AuthorizationService that reads them."""

from __future__ import annotations

import threading

import pytest

from compactmq.auth.authorization import AuthorizationService
from compactmq.config import load_config
from compactmq.errors import NotFound

T = "persistent://acme/orders/events"


@pytest.fixture
def authz(resources):
    resources.tenants.create("acme", {"adminRoles": ["acme-admin"]})
    resources.namespaces.create("acme/orders", {"retentionTimeInMinutes": 5})
    cfg = load_config(overrides={"authorizationEnabled": "true", "superUserRoles": "root"})
    return AuthorizationService(cfg, resources)


def test_grants_live_in_the_namespace_value_beside_its_other_policies(authz, resources, store):
    authz.grant_namespace_permission("acme/orders", "alice", "produce,consume")
    authz.grant_topic_permission(T, "bob", ["consume"])
    authz.set_subscription_roles("acme/orders", "billing", ["carol"])
    assert resources.namespaces.get_policies("acme/orders") == {
        "retentionTimeInMinutes": 5,
        "auth_policies": {
            "namespace_auth": {"alice": ["consume", "produce"]},
            "destination_auth": {T: {"bob": ["consume"]}},
            "subscription_auth_roles": {"billing": ["carol"]},
        },
    }
    assert store.exists("/admin/policies/acme/orders")
    assert authz.can_produce("alice", T) and authz.can_consume("bob", T)
    assert not authz.can_consume("bob", T, "billing") and authz.can_consume("carol", T, "other") is False
    authz.revoke_topic_permission(T, "bob")
    authz.revoke_namespace_permission("acme/orders", "alice")
    assert authz.topic_permissions(T) == {}
    assert resources.namespaces.get_policies("acme/orders")["retentionTimeInMinutes"] == 5


def test_grants_of_a_missing_namespace(authz, resources):
    with pytest.raises(NotFound, match="acme/nope"):
        authz.grant_namespace_permission("acme/nope", "alice", "produce")
    assert authz.namespace_permissions("acme/nope") == {}
    # a deleted namespace takes its grants with it: created again, it has none
    authz.grant_namespace_permission("acme/orders", "alice", "produce")
    resources.namespaces.delete("acme/orders")
    resources.namespaces.create("acme/orders", {})
    assert authz.namespace_permissions("acme/orders") == {}


def test_concurrent_grants_are_all_kept(authz, resources):
    """Grants made at once (compare-and-set re-applied to the winner's value) lose nothing,
    and neither does a policy written beside them."""
    roles = [f"role-{i}" for i in range(8)]
    threads = [
        threading.Thread(target=authz.grant_namespace_permission, args=("acme/orders", r, "consume"))
        for r in roles
    ]
    threads.append(
        threading.Thread(
            target=resources.namespaces.set_policies,
            args=("acme/orders", lambda p: {**p, "retentionTimeInMinutes": 9}),
        )
    )
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(authz.namespace_permissions("acme/orders")) == roles
    assert resources.namespaces.get_policies("acme/orders")["retentionTimeInMinutes"] == 9
