"""Namespace and topic policies over the resources (retention, compaction threshold, ...).

::

    /admin/policies/{tenant}/{namespace}                            the namespace's Policies (Pulsar's)
    /compactmq/topic-policies/{tenant}/{namespace}/{domain}/{topic} the topic's policies (ours)

A namespace's policies are fields of its Policies value, as Pulsar keeps them: the value
``NamespaceResources`` created with the namespace, so they go with it when it is deleted and a
namespace created again starts with none. Pulsar keeps topic-level policies in a system topic
(``__change_events``); we keep them as one JSON object per topic at a path of our own, written
with compare-and-set like every other resource. A topic's policies outlive nothing: deleting the
topic deletes them (``delete_topic``), and a partitioned topic's policies sit at its own name.

Values are JSON; keys are the names Pulsar's admin API uses (``storage.policy_keys`` lists them).
``effective_policy`` answers "topic, else namespace, else the broker's default", the rule every
caller applies (retention, compaction threshold, deduplication...). Each read goes to the store
(one key each: the namespace's, the topic's); callers read policies when they decide, not per
message.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...errors import NotFound
from ...naming import TopicName
from ..metadata_store import NEW, BadVersion, KeyNotFound, Put
from .base import UPDATE_ATTEMPTS, BaseResources, Json, dumps, encode_segment
from .tenants import NamespaceResources

TOPIC_POLICIES_ROOT = "/compactmq/topic-policies"

TOPIC, NAMESPACE = "topic", "namespace"


def topic_policies_path(topic: TopicName) -> str:
    return "/".join(
        (TOPIC_POLICIES_ROOT, encode_segment(topic.tenant), encode_segment(topic.namespace), topic.domain,
         encode_segment(topic.local_name))
    )  # fmt: skip


def _apply(current: Json, values: Mapping[str, Any]) -> Json:
    for key, value in values.items():
        if value is None:
            current.pop(key, None)
        else:
            current[key] = value
    return current


class TopicPolicyResources(BaseResources):
    def get(self, topic: TopicName) -> Json:
        got = self._read(topic_policies_path(topic))
        return {} if got is None else got[0]

    def update(self, topic: TopicName, values: Mapping[str, Any]) -> None:
        """Set (or, with ``None``, remove) keys in one compare-and-set; creates the value if needed."""
        self.update_many([topic], values)

    def update_many(self, topics: list[TopicName], values: Mapping[str, Any]) -> None:
        """The same change to several topics (a partitioned topic and its partitions) in one commit."""
        for _ in range(UPDATE_ATTEMPTS):
            puts = []
            for topic in topics:
                path = topic_policies_path(topic)
                got = self._read(path)
                current, version = ({}, NEW) if got is None else got
                puts.append(Put(path, dumps(_apply(dict(current), values)), version))
            try:
                self.store.commit(puts)
                return
            except BadVersion:
                continue
        raise BadVersion(f"policies of {topics[0]}...: still contended")

    def delete(self, topic: TopicName) -> None:
        try:
            self.store.delete(topic_policies_path(topic))
        except KeyNotFound:
            pass


class PolicyResources:
    """The policies API callers use (the old ``MetadataStore``'s policy methods, same names)."""

    def __init__(self, namespaces: NamespaceResources, topics: TopicPolicyResources):
        self.namespaces = namespaces
        self.topics = topics

    # --- topics ------------------------------------------------------------------------------

    def get_topic_policies(self, topic: str) -> dict[str, Any]:
        return dict(self.topics.get(TopicName.parse(topic)))

    def set_topic_policy(self, topic: str, key: str, value: Any) -> None:
        self.topics.update(TopicName.parse(topic), {key: value})

    def remove_topic_policy(self, topic: str, key: str) -> None:
        self.topics.update(TopicName.parse(topic), {key: None})

    def set_topic_policies(self, topics: list[str], values: Mapping[str, Any]) -> None:
        """``values`` (``None`` removes) on every topic of ``topics`` in one commit."""
        self.topics.update_many([TopicName.parse(t) for t in topics], values)

    def delete_topic_policies(self, topic: str) -> None:
        self.topics.delete(TopicName.parse(topic))

    # --- namespaces --------------------------------------------------------------------------

    def get_namespace_policies(self, namespace: str) -> dict[str, Any]:
        """The namespace's policies ({} when it has none or does not exist)."""
        return dict(self.namespaces.get_policies(namespace) or {})

    def set_namespace_policy(self, namespace: str, key: str, value: Any) -> None:
        self.set_policies(NAMESPACE, namespace, {key: value})

    def remove_namespace_policy(self, namespace: str, key: str) -> None:
        self.set_policies(NAMESPACE, namespace, {key: None})

    # --- both --------------------------------------------------------------------------------

    def set_policies(self, scope: str, name: str, values: Mapping[str, Any]) -> None:
        """Set several policies of one topic or namespace in one write (``None`` removes).
        ``NotFound`` for a namespace that does not exist."""
        if scope == TOPIC:
            self.topics.update(TopicName.parse(name), values)
        elif scope == NAMESPACE:
            self.namespaces.set_policies(name, lambda current: _apply(current, values))
        else:
            raise ValueError(f"policy scope is 'topic' or 'namespace', not {scope!r}")

    def effective_policy(self, topic: str, key: str, default: Any = None) -> Any:
        """The topic's policy, else its namespace's, else ``default`` (the broker config)."""
        tn = TopicName.parse(topic)
        own = self.topics.get(tn)
        if key in own:
            return own[key]
        try:
            ns = self.namespaces.get_policies(tn.namespace_name) or {}
        except NotFound:
            ns = {}
        return ns.get(key, default)
