"""What a role may do: Pulsar's authorization model (``PulsarAuthorizationProvider``).

Who may do what, from the top:

- **Superusers** (``superUserRoles``) may do everything: clusters, tenants, any namespace or
  topic.
- **Tenant admins** -- the roles in a tenant's ``adminRoles`` -- administer that tenant's
  namespaces and topics (policies, compaction, grants) and may produce and consume on them.
- **Other roles** need a grant. A namespace grants a role a set of *actions* (``produce``,
  ``consume``; ``functions``, ``packages``, ``sinks``, ``sources`` are accepted and stored for
  compatibility). A topic may carry grants of its own, added to its namespace's. A partition
  (``t-partition-3``) has the grants of its partitioned topic ``t``.
- A **subscription** may be reserved for some roles (``subscription_auth_roles``): then only
  they may consume through it, whatever their topic grants say.

Grants live in the namespace policy ``auth_policies``, in Pulsar's JSON shape::

    {"namespace_auth": {"alice": ["consume", "produce"]},
     "destination_auth": {"persistent://t/ns/orders": {"bob": ["consume"]}},
     "subscription_auth_roles": {"billing": ["carol"]}}

so that a namespace's policies read back over REST look as they do in Pulsar, and deleting a
namespace deletes its grants with its other policies. Granting replaces the role's actions (as
Pulsar does); each change is one compare-and-set of the namespace's Policies value
(``storage.resources.GrantResources``), re-applied to the newer value when another broker won.

Every check reads the metadata store, so callers on the event loop go through ``run_blocking``. With
``authorizationEnabled=false`` every check passes; with it on, an unauthenticated client (role
None) is refused everything.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..config import PULSAR_AUTHORIZATION_PROVIDER, bool_setting, config_list, setting
from ..errors import AuthorizationFailed, InvalidConfiguration, InvalidInput
from ..naming import TopicName
from ..storage.resources.grants import AUTH_POLICIES as AUTH_POLICIES  # re-exported: the policy's name
from ..storage.resources.grants import DESTINATION_AUTH, NAMESPACE_AUTH, SUBSCRIPTION_AUTH

PRODUCE, CONSUME = "produce", "consume"
ACTIONS = (PRODUCE, CONSUME, "functions", "packages", "sinks", "sources")


def normalize_actions(actions: Iterable[str] | str) -> list[str]:
    """A sorted list of known actions (``"produce,consume"`` or an iterable)."""
    items = actions.split(",") if isinstance(actions, str) else list(actions)
    cleaned = sorted({str(a).strip() for a in items if str(a).strip()})
    unknown = [a for a in cleaned if a not in ACTIONS]
    if unknown:
        raise InvalidInput(f"unknown action(s) {', '.join(unknown)}: expected {', '.join(ACTIONS)}")
    return cleaned


def empty_auth_policies() -> dict[str, Any]:
    return {NAMESPACE_AUTH: {}, DESTINATION_AUTH: {}, SUBSCRIPTION_AUTH: {}}


class AuthorizationService:
    """Checks and grants over the metadata store's resources."""

    def __init__(self, config: Mapping[str, Any], resources: Any):
        """``resources``: ``storage.resources.PulsarResources`` (tenants; grants inside the namespace
        Policies values)."""
        self.enabled = bool_setting(config, "authorizationEnabled")
        provider = setting(config, "authorizationProvider")
        if provider != PULSAR_AUTHORIZATION_PROVIDER:
            raise InvalidConfiguration(
                f"authorizationProvider={provider!r}: only {PULSAR_AUTHORIZATION_PROVIDER} is implemented"
            )
        roles = config_list(config, "superUserRoles") if "superUserRoles" in config else []
        self.superusers = frozenset(roles)
        self.resources = resources

    # --- questions ---------------------------------------------------------------------------

    def is_superuser(self, role: str | None) -> bool:
        if not self.enabled:
            return True
        return role is not None and role in self.superusers

    def is_tenant_admin(self, role: str | None, tenant: str) -> bool:
        if not self.enabled or self.is_superuser(role):
            return True
        if role is None:
            return False
        info = self.resources.tenants.get(tenant) or {}
        return role in (info.get("adminRoles") or ())

    def can_produce(self, role: str | None, topic: str) -> bool:
        return self._can(role, topic, PRODUCE)

    def can_consume(self, role: str | None, topic: str, subscription: str | None = None) -> bool:
        if not self._can(role, topic, CONSUME):
            return False
        if subscription is None or not self.enabled or self.is_superuser(role):
            return True
        name = TopicName.parse(topic)
        if self.is_tenant_admin(role, name.tenant):
            return True
        reserved = self._policies(name.namespace_name)[SUBSCRIPTION_AUTH].get(subscription) or []
        return not reserved or role in reserved

    def can_lookup(self, role: str | None, topic: str) -> bool:
        """A lookup (and partitioned metadata, schema reads) leads to producing or consuming."""
        if not self.enabled:
            return True
        return bool(self._actions_or_admin(role, topic) & {PRODUCE, CONSUME})

    def can_lookup_namespace(self, role: str | None, namespace: str) -> bool:
        """Listing a namespace's topics: tenant admin, or a namespace grant to produce/consume."""
        if not self.enabled:
            return True
        if role is None:
            return False
        tenant = namespace.partition("/")[0]
        if self.is_tenant_admin(role, tenant):
            return True
        granted = self._policies(namespace)[NAMESPACE_AUTH].get(role) or []
        return bool({PRODUCE, CONSUME} & set(granted))

    # --- checks (raise AuthorizationFailed with the reason) ----------------------------------

    def check_superuser(self, role: str | None) -> None:
        if not self.is_superuser(role):
            raise AuthorizationFailed(f"{_who(role)} is not a superuser (superUserRoles)")

    def check_tenant_admin(self, role: str | None, tenant: str) -> None:
        if not self.is_tenant_admin(role, tenant):
            raise AuthorizationFailed(
                f"{_who(role)} is not an admin of tenant {tenant!r} (its adminRoles) nor a superuser"
            )

    def check_produce(self, role: str | None, topic: str) -> None:
        if not self.can_produce(role, topic):
            raise AuthorizationFailed(_refusal(role, PRODUCE, topic))

    def check_consume(self, role: str | None, topic: str, subscription: str | None = None) -> None:
        if not self.can_consume(role, topic, subscription):
            if subscription is not None and self.can_consume(role, topic):
                raise AuthorizationFailed(
                    f"{_who(role)} may not consume through subscription {subscription!r} on {topic} "
                    "(the subscription is reserved for other roles)"
                )
            raise AuthorizationFailed(_refusal(role, CONSUME, topic))

    def check_lookup(self, role: str | None, topic: str) -> None:
        if not self.can_lookup(role, topic):
            raise AuthorizationFailed(_refusal(role, "produce or consume", topic))

    def check_namespace_lookup(self, role: str | None, namespace: str) -> None:
        if not self.can_lookup_namespace(role, namespace):
            raise AuthorizationFailed(
                f"{_who(role)} has no produce or consume permission on namespace {namespace}"
            )

    # --- grants ------------------------------------------------------------------------------

    def namespace_permissions(self, namespace: str) -> dict[str, list[str]]:
        return {r: sorted(a) for r, a in sorted(self._policies(namespace)[NAMESPACE_AUTH].items())}

    def grant_namespace_permission(self, namespace: str, role: str, actions: Iterable[str] | str) -> None:
        actions = normalize_actions(actions)
        role = _valid_role(role)

        def grant(policies: dict[str, Any]) -> dict[str, Any]:
            policies[NAMESPACE_AUTH][role] = actions
            return policies

        self.resources.grants.update(namespace, grant)

    def revoke_namespace_permission(self, namespace: str, role: str) -> None:
        def revoke(policies: dict[str, Any]) -> dict[str, Any] | None:
            return policies if policies[NAMESPACE_AUTH].pop(role, None) is not None else None

        self.resources.grants.update(namespace, revoke)

    def topic_permissions(self, topic: str, include_namespace: bool = True) -> dict[str, list[str]]:
        """The roles' actions on ``topic``: its own grants, merged with its namespace's (and
        with its partitioned topic's, for a partition) unless ``include_namespace`` is False."""
        name = TopicName.parse(topic)
        policies = self._policies(name.namespace_name)
        merged: dict[str, set[str]] = {}
        sources = [policies[DESTINATION_AUTH].get(str(name), {})]
        if name.partition_index >= 0:
            sources.append(policies[DESTINATION_AUTH].get(str(name.partitioned_base), {}))
        if include_namespace:
            sources.append(policies[NAMESPACE_AUTH])
        for grants in sources:
            for role, actions in grants.items():
                merged.setdefault(role, set()).update(actions)
        return {role: sorted(actions) for role, actions in sorted(merged.items())}

    def grant_topic_permission(self, topic: str, role: str, actions: Iterable[str] | str) -> None:
        name = TopicName.parse(topic)
        actions = normalize_actions(actions)
        role = _valid_role(role)

        def grant(policies: dict[str, Any]) -> dict[str, Any]:
            policies[DESTINATION_AUTH].setdefault(str(name), {})[role] = actions
            return policies

        self.resources.grants.update(name.namespace_name, grant)

    def revoke_topic_permission(self, topic: str, role: str) -> None:
        name = TopicName.parse(topic)

        def revoke(policies: dict[str, Any]) -> dict[str, Any] | None:
            grants = policies[DESTINATION_AUTH].get(str(name))
            if grants is None or grants.pop(role, None) is None:
                return None
            if not grants:
                del policies[DESTINATION_AUTH][str(name)]
            return policies

        if role in self._policies(name.namespace_name)[DESTINATION_AUTH].get(str(name), {}):
            self.resources.grants.update(name.namespace_name, revoke)

    def set_subscription_roles(self, namespace: str, subscription: str, roles: Iterable[str]) -> None:
        """Reserve ``subscription`` for ``roles`` (an empty list lifts the reservation)."""
        cleaned = sorted({r.strip() for r in roles if r.strip()})

        def reserve(policies: dict[str, Any]) -> dict[str, Any]:
            if cleaned:
                policies[SUBSCRIPTION_AUTH][subscription] = cleaned
            else:
                policies[SUBSCRIPTION_AUTH].pop(subscription, None)
            return policies

        self.resources.grants.update(namespace, reserve)

    # --- internals ---------------------------------------------------------------------------

    def _can(self, role: str | None, topic: str, action: str) -> bool:
        if not self.enabled:
            return True
        return action in self._actions_or_admin(role, topic)

    def _actions_or_admin(self, role: str | None, topic: str) -> set[str]:
        """The actions ``role`` holds on ``topic``; everything for superusers and tenant admins."""
        if role is None:
            return set()
        name = TopicName.parse(topic)
        if self.is_superuser(role) or self.is_tenant_admin(role, name.tenant):
            return set(ACTIONS)
        return set(self.topic_permissions(str(name)).get(role, ()))

    def _policies(self, namespace: str) -> dict[str, Any]:
        return self.resources.grants.get(namespace)


def _valid_role(role: str) -> str:
    role = (role or "").strip()
    if not role:
        raise InvalidInput("the role is empty")
    return role


def _who(role: str | None) -> str:
    return "an unauthenticated client" if role is None else f"role {role!r}"


def _refusal(role: str | None, action: str, topic: str) -> str:
    if role is None:
        return f"authorization is enabled and the client is not authenticated: it may not {action} on {topic}"
    return (
        f"role {role!r} is not allowed to {action} on {topic} "
        f"(needs the permission on the topic or its namespace, or tenant admin)"
    )
