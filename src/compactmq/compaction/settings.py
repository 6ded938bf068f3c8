"""The compaction settings of one topic: its policy (or its namespace's), else the broker config.

A run reads them once when it starts (``runner``); the service reads the retention mode to
filter what readers see (``service``). Minimum lag, tombstone retention and key TTL are seconds
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

    meta = storage.policies
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
