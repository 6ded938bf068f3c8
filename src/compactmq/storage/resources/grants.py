"""Grants: who may produce and consume, kept inside each namespace's Policies value.

Pulsar's ``PulsarAuthorizationProvider`` keeps permissions in the namespace ``Policies`` (the value
at ``/admin/policies/{tenant}/{namespace}``, in the configuration store), field ``auth_policies``::

    {"namespace_auth": {"alice": ["consume", "produce"]},
     "destination_auth": {"persistent://t/ns/orders": {"bob": ["consume"]}},
     "subscription_auth_roles": {"billing": ["carol"]}}

so do we: a namespace's grants are read with it and deleted with it, and a change is one
compare-and-set of the namespace value (``BaseResources._update``: when another writer won, the
change is applied again to the winner's value, so two grants made at once by two brokers both
stay). Only the ``auth_policies`` field is touched here; the other fields of the value belong to
the namespace's other policies and are kept as they are.

What the grants *mean* (who may do what) is ``compactmq.auth.authorization``'s business; this
module only stores the three maps.
"""

from __future__ import annotations

from collections.abc import Callable

from ...errors import NotFound
from .base import BaseResources, Json
from .tenants import namespace_path

AUTH_POLICIES = "auth_policies"
NAMESPACE_AUTH = "namespace_auth"
DESTINATION_AUTH = "destination_auth"
SUBSCRIPTION_AUTH = "subscription_auth_roles"


def normalized(stored: object) -> Json:
    """The three maps of an ``auth_policies`` value, each a dict (missing or malformed: empty)."""
    source = stored if isinstance(stored, dict) else {}
    out: Json = {}
    for key in (NAMESPACE_AUTH, DESTINATION_AUTH, SUBSCRIPTION_AUTH):
        value = source.get(key)
        out[key] = value if isinstance(value, dict) else {}
    return out


class GrantResources(BaseResources):
    """The ``auth_policies`` field of namespace Policies values (the configuration store)."""

    def get(self, namespace: str) -> Json:
        """The namespace's grants (three maps, empty when it has none or does not exist)."""
        got = self._read(namespace_path(namespace))
        return normalized(None if got is None else got[0].get(AUTH_POLICIES))

    def update(self, namespace: str, fn: Callable[[Json], Json | None]) -> Json:
        """Read-modify-write of the namespace's grants: ``fn`` gets the three maps (a copy) and
        returns them changed, or None to leave the value untouched. ``NotFound`` when the namespace
        does not exist. Returns the grants now in force."""
        result: Json = {}

        def apply(policies: Json) -> Json:
            nonlocal result
            current = normalized(policies.get(AUTH_POLICIES))
            changed = fn(current)
            result = current if changed is None else normalized(changed)
            if changed is not None:
                policies[AUTH_POLICIES] = result
            return policies

        try:
            self._update(namespace_path(namespace), apply, f"namespace {namespace}")
        except NotFound:
            raise NotFound(f"namespace {namespace!r} does not exist") from None
        return result
