"""Tenants, namespaces and their policies, and partitioned-topic metadata (Pulsar's paths).

::

    /admin/policies/{tenant}                          TenantInfo: adminRoles, allowedClusters
    /admin/policies/{tenant}/{namespace}              the namespace's Policies
    /admin/partitioned-topics/{tenant}/{namespace}/{domain}/{topic}   {"partitions": n}

Pulsar keeps these in the configuration store (``configurationMetadataStoreUrl``); so do we.
Names are path segments through ``encode_segment``.
"""

from __future__ import annotations

from collections.abc import Callable

from ...errors import Conflict, InvalidInput, NotFound
from ...naming import TopicName
from ..metadata_store import NotEmpty
from .base import BaseResources, Json, encode_segment

POLICIES_ROOT = "/admin/policies"
PARTITIONED_TOPICS_ROOT = "/admin/partitioned-topics"


def tenant_path(tenant: str) -> str:
    return f"{POLICIES_ROOT}/{encode_segment(tenant)}"


def namespace_path(namespace: str) -> str:
    tenant, sep, name = namespace.partition("/")
    if not sep or not tenant or not name or "/" in name:
        raise InvalidInput(f"namespace {namespace!r} is not tenant/namespace")
    return f"{POLICIES_ROOT}/{encode_segment(tenant)}/{encode_segment(name)}"


class TenantResources(BaseResources):
    def _path(self, tenant: str) -> str:
        return tenant_path(tenant)

    def create(self, tenant: str, info: Json) -> None:
        self._create(self._path(tenant), info, f"tenant {tenant}")

    def get(self, tenant: str) -> Json | None:
        got = self._read(self._path(tenant))
        return None if got is None else got[0]

    def update(self, tenant: str, fn: Callable[[Json], Json]) -> Json:
        return self._update(self._path(tenant), fn, f"tenant {tenant}")

    def delete(self, tenant: str) -> None:
        try:
            self._delete(self._path(tenant), f"tenant {tenant}")
        except NotEmpty:
            raise Conflict(f"tenant {tenant} still has namespaces") from None

    def list_tenants(self) -> list[str]:
        return self._children(POLICIES_ROOT)


class NamespaceResources(BaseResources):
    def create(self, namespace: str, policies: Json) -> None:
        tenant = namespace.partition("/")[0]
        if not self.store.exists(f"{POLICIES_ROOT}/{encode_segment(tenant)}"):
            raise NotFound(f"tenant {tenant} does not exist")
        self._create(namespace_path(namespace), policies, f"namespace {namespace}")

    def exists(self, namespace: str) -> bool:
        return self.store.exists(namespace_path(namespace))

    def get_policies(self, namespace: str) -> Json | None:
        got = self._read(namespace_path(namespace))
        return None if got is None else got[0]

    def set_policies(self, namespace: str, fn: Callable[[Json], Json]) -> Json:
        """Read-modify-write of the namespace's policies (``fn`` is re-applied if another won)."""
        return self._update(namespace_path(namespace), fn, f"namespace {namespace}")

    def delete(self, namespace: str) -> None:
        self._delete(namespace_path(namespace), f"namespace {namespace}")

    def list_namespaces(self, tenant: str) -> list[str]:
        return [f"{tenant}/{ns}" for ns in self._children(f"{POLICIES_ROOT}/{encode_segment(tenant)}")]


def partitioned_topic_path(topic: TopicName) -> str:
    return "/".join(
        (PARTITIONED_TOPICS_ROOT, encode_segment(topic.tenant), encode_segment(topic.namespace),
         topic.domain, encode_segment(topic.local_name))
    )  # fmt: skip


class PartitionedTopicResources(BaseResources):
    def _path(self, topic: TopicName) -> str:
        return partitioned_topic_path(topic)

    def create(self, topic: TopicName, partitions: int) -> None:
        if partitions < 1:
            raise InvalidInput(f"a partitioned topic has at least 1 partition, not {partitions}")
        self._create(self._path(topic), {"partitions": partitions}, f"partitioned topic {topic}")

    def get(self, topic: TopicName) -> Json | None:
        got = self._read(self._path(topic))
        return None if got is None else got[0]

    def partitions(self, topic: TopicName) -> int | None:
        """The number of partitions of ``topic``; None when it is not a partitioned topic."""
        meta = self.get(topic)
        return None if meta is None else int(meta["partitions"])

    def update_partitions(self, topic: TopicName, partitions: int) -> Json:
        def grow(meta: Json) -> Json:
            if partitions <= meta["partitions"]:
                raise InvalidInput(f"{topic} has {meta['partitions']} partitions: only more can be asked for")
            return {**meta, "partitions": partitions}

        return self._update(self._path(topic), grow, f"partitioned topic {topic}")

    def delete(self, topic: TopicName) -> None:
        self._delete(self._path(topic), f"partitioned topic {topic}")

    def list_topics(self, namespace: str, domain: str = "persistent") -> list[TopicName]:
        tenant, _, ns = namespace.partition("/")
        root = f"{PARTITIONED_TOPICS_ROOT}/{encode_segment(tenant)}/{encode_segment(ns)}/{domain}"
        return [TopicName(domain, tenant, ns, name) for name in self._children(root)]
