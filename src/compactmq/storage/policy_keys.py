"""The keys of namespace and topic policies, and the name of the compaction cursor.

The policy keys are declared once, in ``compactmq.config.policy_keys`` (with the broker setting
each falls back to); they are re-exported here for the storage code that reads them.
"""

from __future__ import annotations

from ..config.policy_keys import (
    COMPACTED_VIEW_KEY_TTL,
    COMPACTION_MAX_LAG,
    COMPACTION_MIN_LAG,
    COMPACTION_RETENTION_MODE,
    COMPACTION_STRATEGY,
    COMPACTION_THRESHOLD,
    COMPACTION_TOMBSTONE_RETENTION,
    RETAIN_NULL_KEY,
    RETENTION_SIZE_MB,
    RETENTION_TIME_MINUTES,
)

__all__ = [
    "COMPACTED_VIEW_KEY_TTL",
    "COMPACTION_CURSOR",
    "COMPACTION_MAX_LAG",
    "COMPACTION_MIN_LAG",
    "COMPACTION_RETENTION_MODE",
    "COMPACTION_STRATEGY",
    "COMPACTION_THRESHOLD",
    "COMPACTION_TOMBSTONE_RETENTION",
    "RETAIN_NULL_KEY",
    "RETENTION_SIZE_MB",
    "RETENTION_TIME_MINUTES",
]

#: the durable cursor compaction keeps on each topic (Pulsar's ``__compaction``)
COMPACTION_CURSOR = "__compaction"
