"""Topic names, following Pulsar's rules.

A full name is ``{domain}://{tenant}/{namespace}/{local}`` with domain ``persistent`` or
``non-persistent``. Shorter forms expand the way Pulsar's clients expand them::

    my-topic                 -> persistent://public/default/my-topic
    tenant/ns/my-topic       -> persistent://tenant/ns/my-topic

Partition ``i`` of a partitioned topic ``T`` is the topic ``T-partition-i``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import InvalidTopicName

DEFAULT_TENANT = "public"
DEFAULT_NAMESPACE = "default"
PARTITION_SUFFIX = "-partition-"
DOMAINS = ("persistent", "non-persistent")

# Pulsar's NamedEntity rule for tenants and namespaces: word characters and - = : .
_NAMED_ENTITY = re.compile(r"^[-=:.\w]+$")
_PARTITION = re.compile(r"^(?P<base>.+)-partition-(?P<index>\d+)$")


@dataclass(frozen=True, order=True)
class TopicName:
    domain: str
    tenant: str
    namespace: str
    local_name: str

    @classmethod
    def parse(cls, name: str) -> "TopicName":
        if not isinstance(name, str) or not name.strip():
            raise InvalidTopicName("topic name is empty")
        if name != name.strip():
            raise InvalidTopicName(f"topic name {name!r} has leading or trailing whitespace")
        domain = "persistent"
        rest = name
        if "://" in name:
            domain, rest = name.split("://", 1)
            if domain not in DOMAINS:
                raise InvalidTopicName(
                    f"invalid topic domain {domain!r} in {name!r}: use persistent:// or non-persistent://"
                )
            parts = rest.split("/")
            if len(parts) != 3:
                raise InvalidTopicName(
                    f"invalid topic name {name!r}: expected {domain}://tenant/namespace/topic"
                )
        else:
            parts = rest.split("/")
            if len(parts) == 1:
                parts = [DEFAULT_TENANT, DEFAULT_NAMESPACE, parts[0]]
            elif len(parts) != 3:
                raise InvalidTopicName(
                    f"invalid short topic name {name!r}: use 'topic' or 'tenant/namespace/topic'"
                )
        tenant, namespace, local = parts
        for what, value in (("tenant", tenant), ("namespace", namespace)):
            if not _NAMED_ENTITY.match(value):
                raise InvalidTopicName(
                    f"invalid {what} {value!r} in topic {name!r}: "
                    "only letters, digits and - _ = : . are allowed"
                )
        if not local:
            raise InvalidTopicName(f"invalid topic name {name!r}: the topic part is empty")
        for what, value in (("tenant", tenant), ("namespace", namespace), ("topic", local)):
            if value in (".", ".."):
                # a path segment, not a name: in a REST path or a directory it means another place
                raise InvalidTopicName(f"invalid topic name {name!r}: the {what} cannot be {value!r}")
        if any(c in local for c in "\x00\n\r"):
            raise InvalidTopicName(f"invalid topic name {name!r}: control characters")
        return cls(domain, tenant, namespace, local)

    @property
    def persistent(self) -> bool:
        return self.domain == "persistent"

    @property
    def namespace_name(self) -> str:
        return f"{self.tenant}/{self.namespace}"

    @property
    def partition_index(self) -> int:
        """Index of this partition, or -1 when the name is not a partition."""
        m = _PARTITION.match(self.local_name)
        return int(m.group("index")) if m else -1

    @property
    def partitioned_base(self) -> "TopicName":
        """The partitioned topic this partition belongs to (itself when not a partition)."""
        m = _PARTITION.match(self.local_name)
        if not m:
            return self
        return TopicName(self.domain, self.tenant, self.namespace, m.group("base"))

    def partition(self, index: int) -> "TopicName":
        return TopicName(
            self.domain, self.tenant, self.namespace, f"{self.local_name}{PARTITION_SUFFIX}{index}"
        )

    def __str__(self) -> str:
        return f"{self.domain}://{self.tenant}/{self.namespace}/{self.local_name}"


def canonical(name: str) -> str:
    """The full ``persistent://tenant/ns/topic`` spelling of ``name``."""
    return str(TopicName.parse(name))
