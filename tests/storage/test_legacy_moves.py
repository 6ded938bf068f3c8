"""The one-time import of the old tables of grants, schemas and offload records.

Each old data directory is written in the test with the old API (what main wrote before the
move), then opened by today's ``Storage``."""

from __future__ import annotations

from compactmq.auth.authorization import AuthorizationService
from compactmq.config import load_config
from compactmq.storage.engine import Storage
from compactmq.storage.metadata import MetadataStore as OldMetadata
from compactmq.storage.resources.legacy_import import marker_path

T = "persistent://acme/orders/events"
OLD_GRANTS = {
    "namespace_auth": {"alice": ["consume", "produce"]},
    "destination_auth": {T: {"bob": ["consume"]}},
    "subscription_auth_roles": {"billing": ["carol"]},
}


def test_grants_are_imported_once_into_the_namespace_value(tmp_path):
    old = OldMetadata(tmp_path / "metadata.db", bootstrap=True)
    old.create_tenant("acme", {"adminRoles": ["ops"]})
    old.create_namespace("acme/orders")
    old.create_namespace("acme/empty")
    old.set_namespace_policy("acme/orders", "auth_policies", OLD_GRANTS)
    old.set_namespace_policy("acme/orders", "retentionTimeInMinutes", 5)
    old.close()
    cfg = load_config(overrides={"authorizationEnabled": "true"})
    with Storage(tmp_path) as storage:
        assert storage.metadata_store.exists(marker_path("grants"))
        assert storage.resources.namespaces.get_policies("acme/orders")["auth_policies"] == OLD_GRANTS
        assert "auth_policies" not in storage.resources.namespaces.get_policies("acme/empty")
        authz = AuthorizationService(cfg, None, storage.resources)
        assert authz.can_produce("alice", T) and authz.can_consume("bob", T)
        assert not authz.can_consume("bob", T, "billing")
        authz.revoke_namespace_permission("acme/orders", "alice")
    # once: the revoked grant does not come back from the old table at the next start
    with Storage(tmp_path) as storage:
        authz = AuthorizationService(cfg, None, storage.resources)
        assert not authz.can_produce("alice", T)
        assert authz.topic_permissions(T) == {"bob": ["consume"]}
