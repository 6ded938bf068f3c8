"""The keys of namespace and topic policies, and the name of the compaction cursor.

Policies are JSON values under these keys in the policy resources (``resources.policies``); the
names are the ones Pulsar's admin API uses where it has one. They lived in the old SQLite
metadata class; they are plain names, so they sit here, where every layer may import them.
"""

from __future__ import annotations

RETENTION_TIME_MINUTES = "retentionTimeInMinutes"
RETENTION_SIZE_MB = "retentionSizeInMB"
COMPACTION_THRESHOLD = "compactionThreshold"
COMPACTION_STRATEGY = "compactionStrategy"
RETAIN_NULL_KEY = "retainNullKey"
COMPACTION_RETENTION_MODE = "compactionRetentionMode"
# time-based compaction (ours: Pulsar has no such policy; Kafka's max/min.compaction.lag.ms)
COMPACTION_MAX_LAG = "compactionMaxLagSeconds"
COMPACTION_MIN_LAG = "compactionMinLagSeconds"
# ours: Kafka's delete.retention.ms, and PIP-252's per-key time-to-live of the compacted view
COMPACTION_TOMBSTONE_RETENTION = "compactionTombstoneRetentionSeconds"
COMPACTED_VIEW_KEY_TTL = "compactedViewKeyTtlSeconds"

#: the durable cursor compaction keeps on each topic (Pulsar's ``__compaction``)
COMPACTION_CURSOR = "__compaction"
