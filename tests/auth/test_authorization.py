"""AuthorizationService over a real SQLite metadata store: Pulsar's model of superusers, tenant
admins, namespace and topic grants, partitions and reserved subscriptions."""

from __future__ import annotations

import pytest

from compactmq.auth.authorization import AUTH_POLICIES, AuthorizationService
from compactmq.config import load_config
from compactmq.errors import (
    AuthorizationFailed,
    InvalidConfiguration,
    InvalidInput,
    NotFound,
)
from compactmq.storage.metadata_store import create_metadata_store
from compactmq.storage.resources import PulsarResources

T = "persistent://acme/orders/events"


@pytest.fixture
def resources(tmp_path):
    """Tenants and namespaces, in the embedded store (metadata.db in the data directory)."""
    kv = create_metadata_store("", data_dir=tmp_path)
    res = PulsarResources(kv)
    res.tenants.create("acme", {"adminRoles": ["acme-admin"], "allowedClusters": ["standalone"]})
    res.namespaces.create("acme/orders", {})
    res.namespaces.create("acme/other", {})
    yield res
    kv.close()


@pytest.fixture
def authz(resources):
    cfg = load_config(overrides={"authorizationEnabled": "true", "superUserRoles": "root, ops"})
    return AuthorizationService(cfg, resources)


def test_disabled_lets_everything_through(resources):
    off = AuthorizationService(load_config(), resources)
    assert not off.enabled
    assert off.can_produce(None, T) and off.can_consume(None, T, "s") and off.is_superuser(None)
    off.check_superuser(None)
    off.check_tenant_admin("anyone", "acme")
    # grants are still stored while authorization is off (the REST paths work either way)
    off.grant_namespace_permission("acme/orders", "alice", ["produce"])
    assert off.namespace_permissions("acme/orders") == {"alice": ["produce"]}


def test_superusers_and_tenant_admins(authz):
    assert authz.is_superuser("root") and authz.is_superuser("ops") and not authz.is_superuser("acme-admin")
    assert authz.is_tenant_admin("acme-admin", "acme") and authz.is_tenant_admin("root", "acme")
    assert not authz.is_tenant_admin("acme-admin", "globex") and not authz.is_tenant_admin("alice", "acme")
    for role in ("root", "acme-admin"):
        assert authz.can_produce(role, T) and authz.can_consume(role, T, "any") and authz.can_lookup(role, T)
    with pytest.raises(AuthorizationFailed, match="role 'acme-admin' is not a superuser"):
        authz.check_superuser("acme-admin")
    with pytest.raises(AuthorizationFailed, match="role 'alice' is not an admin of tenant 'acme'"):
        authz.check_tenant_admin("alice", "acme")
    with pytest.raises(AuthorizationFailed, match="unauthenticated client"):
        authz.check_tenant_admin(None, "acme")


def test_namespace_grants(authz):
    assert not authz.can_produce("alice", T) and not authz.can_lookup("alice", T)
    with pytest.raises(AuthorizationFailed, match="role 'alice' is not allowed to produce on " + T):
        authz.check_produce("alice", T)
    authz.grant_namespace_permission("acme/orders", "alice", ["consume"])
    assert authz.can_consume("alice", T) and authz.can_lookup("alice", T)
    assert not authz.can_produce("alice", T)
    authz.check_consume("alice", T)
    authz.check_namespace_lookup("alice", "acme/orders")
    with pytest.raises(AuthorizationFailed, match="no produce or consume permission on namespace acme/other"):
        authz.check_namespace_lookup("alice", "acme/other")
    assert not authz.can_consume("alice", "persistent://acme/other/events")
    # granting replaces the role's actions, as Pulsar does
    authz.grant_namespace_permission("acme/orders", "alice", "produce, functions")
    assert authz.namespace_permissions("acme/orders") == {"alice": ["functions", "produce"]}
    assert authz.can_produce("alice", T) and not authz.can_consume("alice", T)
    authz.revoke_namespace_permission("acme/orders", "alice")
    assert authz.namespace_permissions("acme/orders") == {} and not authz.can_produce("alice", T)


def test_stored_in_pulsars_shape(authz, resources):
    authz.grant_namespace_permission("acme/orders", "alice", ["produce", "consume"])
    authz.grant_topic_permission(T, "bob", ["consume"])
    authz.set_subscription_roles("acme/orders", "billing", ["carol"])
    # inside the namespace's Policies value, as Pulsar keeps them
    assert resources.namespaces.get_policies("acme/orders")[AUTH_POLICIES] == {
        "namespace_auth": {"alice": ["consume", "produce"]},
        "destination_auth": {T: {"bob": ["consume"]}},
        "subscription_auth_roles": {"billing": ["carol"]},
    }


def test_topic_grants_and_partitions(authz):
    authz.grant_namespace_permission("acme/orders", "alice", ["produce"])
    authz.grant_topic_permission(T, "bob", ["consume"])
    authz.grant_topic_permission(T, "alice", ["consume"])
    assert authz.topic_permissions(T) == {"alice": ["consume", "produce"], "bob": ["consume"]}
    assert authz.topic_permissions(T, include_namespace=False) == {"alice": ["consume"], "bob": ["consume"]}
    assert authz.can_consume("bob", T) and not authz.can_produce("bob", T)
    assert not authz.can_consume("bob", "persistent://acme/orders/other-topic")
    # a partition has the grants of its partitioned topic
    assert authz.can_consume("bob", T + "-partition-3")
    assert authz.topic_permissions(T + "-partition-3")["bob"] == ["consume"]
    authz.revoke_topic_permission(T, "bob")
    authz.revoke_topic_permission(T, "nobody")  # nothing to revoke: no error
    assert not authz.can_consume("bob", T + "-partition-3")
    assert authz.topic_permissions(T, include_namespace=False) == {"alice": ["consume"]}


def test_reserved_subscriptions(authz):
    authz.grant_namespace_permission("acme/orders", "alice", ["consume"])
    authz.grant_namespace_permission("acme/orders", "carol", ["consume"])
    authz.set_subscription_roles("acme/orders", "billing", ["carol"])
    assert authz.can_consume("carol", T, "billing") and authz.can_consume("alice", T, "audit")
    assert not authz.can_consume("alice", T, "billing")
    with pytest.raises(AuthorizationFailed, match="subscription 'billing' .* reserved"):
        authz.check_consume("alice", T, "billing")
    assert authz.can_consume("acme-admin", T, "billing")
    authz.set_subscription_roles("acme/orders", "billing", [])
    assert authz.can_consume("alice", T, "billing")


def test_unauthenticated_is_refused_when_enabled(authz):
    authz.grant_namespace_permission("acme/orders", "alice", ["produce", "consume"])
    for check in (authz.check_produce, authz.check_consume, authz.check_lookup):
        with pytest.raises(AuthorizationFailed, match="not authenticated"):
            check(None, T)
    assert not authz.is_superuser(None) and not authz.can_lookup_namespace(None, "acme/orders")


def test_grant_errors(authz):
    with pytest.raises(NotFound, match="namespace 'acme/nope' does not exist"):
        authz.grant_namespace_permission("acme/nope", "alice", ["produce"])
    with pytest.raises(NotFound):
        authz.grant_topic_permission("persistent://acme/nope/t", "alice", ["produce"])
    with pytest.raises(InvalidInput, match="unknown action.*write"):
        authz.grant_namespace_permission("acme/orders", "alice", ["produce", "write"])
    with pytest.raises(InvalidInput, match="role is empty"):
        authz.grant_namespace_permission("acme/orders", " ", ["produce"])
    assert authz.namespace_permissions("acme/orders") == {}


def test_only_pulsars_authorization_provider(resources):
    cfg = load_config(overrides={"authorizationProvider": "com.example.MyAuthz"})
    with pytest.raises(InvalidConfiguration, match="only org.apache.pulsar.broker.authorization"):
        AuthorizationService(cfg, resources)
