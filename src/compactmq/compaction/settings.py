"""The compaction settings of one topic: its policy (or its namespace's), else the broker config.

A run reads them once when it starts (``runner``); the service reads the retention mode to
filter what readers see (``service``). The six settings come from ONE read of the topic's
policies and at most one of its namespace's (``_OneRead``): a joint job of many topics reads
them for every topic, one after another. Minimum lag, tombstone retention and key TTL are seconds
(``lag.lag_seconds_setting`` parses a policy's value).
"""

from __future__ import annotations

from ..config import bool_setting, int_setting, parse_bool, setting
from ..config.policy_keys import DEFAULT_SETTINGS as FALLBACK
from . import retention_mode
from .lag import lag_seconds_setting


def topic_settings(storage, topic: str, config) -> dict:
    """Strategy, retain-null-key, retention mode and minimum lag (seconds, see ``lag``) of a topic:
    its policy (or its namespace's), else the broker setting ``config.policy_keys`` names."""
    from ..storage import (
        COMPACTED_VIEW_KEY_TTL,
        COMPACTION_MIN_LAG,
        COMPACTION_RETENTION_MODE,
        COMPACTION_STRATEGY,
        COMPACTION_TOMBSTONE_RETENTION,
        RETAIN_NULL_KEY,
    )

    meta = _OneRead(storage.policies, topic)
    mode = retention_mode(
        meta.effective_policy(
            topic, COMPACTION_RETENTION_MODE, setting(config, FALLBACK[COMPACTION_RETENTION_MODE])
        )
    )
    retain = meta.effective_policy(topic, RETAIN_NULL_KEY, bool_setting(config, FALLBACK[RETAIN_NULL_KEY]))
    return {
        "strategy": meta.effective_policy(
            topic, COMPACTION_STRATEGY, setting(config, FALLBACK[COMPACTION_STRATEGY])
        ),
        "retain_null_key": parse_bool(retain or False, default=False),
        "retention_mode": mode,
        "min_lag_seconds": lag_seconds_setting(
            meta, topic, COMPACTION_MIN_LAG, int_setting(config, FALLBACK[COMPACTION_MIN_LAG])
        ),
        "tombstone_retention_seconds": lag_seconds_setting(
            meta,
            topic,
            COMPACTION_TOMBSTONE_RETENTION,
            int_setting(config, FALLBACK[COMPACTION_TOMBSTONE_RETENTION]),
        ),
        "key_ttl_seconds": lag_seconds_setting(
            meta, topic, COMPACTED_VIEW_KEY_TTL, int_setting(config, FALLBACK[COMPACTED_VIEW_KEY_TTL])
        ),
    }


class _OneRead:
    """``effective_policy`` of one topic (the topic's policy, else its namespace's, else the
    default: ``PolicyResources.effective_policy``'s rule) over one read of each, made on first use."""

    def __init__(self, policies, topic: str) -> None:
        self.policies = policies
        self.topic = topic
        self._own: dict | None = None
        self._namespace: dict | None = None

    def effective_policy(self, topic: str, key: str, default=None):
        if topic != self.topic or not hasattr(self.policies, "get_topic_policies"):
            return self.policies.effective_policy(topic, key, default)
        if self._own is None:
            self._own = self.policies.get_topic_policies(topic)
        if key in self._own:
            return self._own[key]
        if self._namespace is None:
            from ..errors import NotFound
            from ..naming import TopicName

            try:
                self._namespace = self.policies.get_namespace_policies(TopicName.parse(topic).namespace_name)
            except NotFound:
                self._namespace = {}
        return self._namespace.get(key, default)
