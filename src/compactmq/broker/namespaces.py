"""The namespace a client's topic lives in, and automatic topic creation, as Pulsar rules them.

A topic belongs to ``tenant/namespace``, and that namespace must exist: a producer, consumer,
lookup or partitioned-metadata request for a topic of an unknown namespace fails with
``TopicNotFound`` ("Namespace not found", Pulsar's answer) instead of creating the tenant.
``public/default`` and the ``standalone`` cluster exist from the start; other tenants and
namespaces are created through the admin API (``PUT /admin/v2/tenants/{t}``,
``PUT /admin/v2/namespaces/{t}/{ns}``).

Whether a client may create a topic by using it, and of which type, comes from the namespace
policy ``autoTopicCreation`` when it is set (Pulsar's ``AutoTopicCreationOverride``: the body
``{"allowAutoTopicCreation": bool, "topicType": "partitioned"|"non-partitioned",
"defaultNumPartitions": int}``), else from the broker settings ``allowAutoTopicCreation``,
``allowAutoTopicCreationType`` and ``defaultNumPartitions``. The override replaces the three
settings as a whole, as on Pulsar.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

from ..config import policy_keys
from ..errors import InvalidInput, TopicNotFound
from ..naming import TopicName

if TYPE_CHECKING:  # pragma: no cover
    from .server import BrokerService

POLICY_KEY = policy_keys.AUTO_TOPIC_CREATION  # metadata-store key of the namespace policy
PARTITIONED, NON_PARTITIONED = "partitioned", "non-partitioned"
TOPIC_TYPES = (NON_PARTITIONED, PARTITIONED)


class NamespaceNotFound(TopicNotFound):
    """The topic's namespace does not exist (Pulsar answers TopicNotFound, "Namespace not found")."""


@dataclass(frozen=True)
class AutoTopicCreation:
    allowed: bool
    topic_type: str  # NON_PARTITIONED | PARTITIONED
    partitions: int  # partitions of an auto-created partitioned topic

    @property
    def partitioned(self) -> bool:
        return self.topic_type == PARTITIONED


def validate_override(body: Any) -> dict[str, Any]:
    """The stored form of an ``autoTopicCreation`` body; ``InvalidInput`` when it is not one.

    Pulsar's rules: when creation is allowed the type must be known; ``partitioned`` needs
    ``defaultNumPartitions`` >= 1 and ``non-partitioned`` must not carry it.
    """
    if not isinstance(body, dict):
        raise InvalidInput(
            'autoTopicCreation must be a JSON object {"allowAutoTopicCreation": bool, '
            '"topicType": "partitioned"|"non-partitioned", "defaultNumPartitions": int}'
        )
    allow = body.get("allowAutoTopicCreation")
    if not isinstance(allow, bool):
        raise InvalidInput("autoTopicCreation: allowAutoTopicCreation must be a JSON boolean")
    topic_type = body.get("topicType")
    partitions = body.get("defaultNumPartitions")
    if partitions is not None and (isinstance(partitions, bool) or not isinstance(partitions, int)):
        raise InvalidInput("autoTopicCreation: defaultNumPartitions must be a JSON integer")
    if allow:
        if topic_type not in TOPIC_TYPES:
            raise InvalidOverride(f"Unknown topic type [{topic_type}]")
        if topic_type == PARTITIONED:
            if partitions is None:
                raise InvalidOverride("[defaultNumPartitions] cannot be null when the type is partitioned.")
            if partitions <= 0:
                raise InvalidOverride("[defaultNumPartitions] cannot be less than 1 for partition type.")
        elif partitions is not None:
            raise InvalidOverride(
                "[defaultNumPartitions] is not allowed to be set when the type is non-partition."
            )
    out: dict[str, Any] = {"allowAutoTopicCreation": allow}
    if topic_type is not None:
        out["topicType"] = topic_type
    if partitions is not None:
        out["defaultNumPartitions"] = partitions
    return out


class InvalidOverride(InvalidInput):
    """An autoTopicCreation body Pulsar refuses (412 Precondition Failed)."""

    http_status = 412

    def __init__(self, detail: str) -> None:
        super().__init__(f"Invalid configuration for autoTopicCreationOverride. the detail is {detail}")


def resolve(override: Mapping[str, Any] | None, config: Mapping[str, Any]) -> AutoTopicCreation:
    """The auto-creation rule in force: the namespace override, else the broker settings."""
    if override:
        return AutoTopicCreation(
            bool(override.get("allowAutoTopicCreation")),
            override.get("topicType") or NON_PARTITIONED,
            int(override.get("defaultNumPartitions") or config["defaultNumPartitions"]),
        )
    return AutoTopicCreation(
        bool(config["allowAutoTopicCreation"]),
        config["allowAutoTopicCreationType"],
        int(config["defaultNumPartitions"]),
    )


def _namespace_facts(storage: Any, namespace: str) -> tuple[bool, Any]:
    if not storage.resources.namespaces.exists(namespace):
        return False, None
    return True, storage.policies.get_namespace_policies(namespace).get(POLICY_KEY)


async def check_namespace(service: "BrokerService", tn: TopicName) -> AutoTopicCreation:
    """Raise ``NamespaceNotFound`` unless ``tn``'s namespace exists; return the auto-creation
    rule in force there (one metadata read, in the thread pool)."""
    exists, override = await service.run_blocking(_namespace_facts, service.storage, tn.namespace_name)
    if not exists:
        raise NamespaceNotFound(f"Namespace not found: {tn.namespace_name} (topic {tn})")
    return resolve(override, service.config)
