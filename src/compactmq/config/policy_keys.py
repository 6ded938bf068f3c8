"""The metadata-store keys of namespace and topic policies, and the broker setting each falls back to.

A policy (``admin.policies`` declares each one: REST path, CLI verb, parse/render, scopes) stores
its value under one or more of these keys, in the namespace's policies and the topic's. When
neither sets a key, the broker-config key in ``DEFAULT_SETTINGS`` is in force (Pulsar's rule:
topic policy, else namespace policy, else broker.conf). The names are the ones Pulsar's admin API
uses where it has one.

Every layer reads a policy's key and its fallback from here -- the storage (retention), the
compaction runner's settings, the broker's compaction monitor, deduplication and schema checks,
the admin API and the CLI -- so a policy's name and its default are written down once. This
module sits in the ground layer and imports nothing, so the CLI loads it without the broker.
"""

from __future__ import annotations

from collections.abc import Mapping

COMPACTION_THRESHOLD = "compactionThreshold"
RETENTION_TIME_MINUTES = "retentionTimeInMinutes"
RETENTION_SIZE_MB = "retentionSizeInMB"
COMPACTION_STRATEGY = "compactionStrategy"
RETAIN_NULL_KEY = "retainNullKey"  # the compactionRetainNullKey policy
COMPACTION_RETENTION_MODE = "compactionRetentionMode"
# time-based compaction (ours: Pulsar has no such policy; Kafka's max/min.compaction.lag.ms)
COMPACTION_MAX_LAG = "compactionMaxLagSeconds"
COMPACTION_MIN_LAG = "compactionMinLagSeconds"
# ours: Kafka's delete.retention.ms, and PIP-252's per-key time-to-live of the compacted view
COMPACTION_TOMBSTONE_RETENTION = "compactionTombstoneRetentionSeconds"
COMPACTED_VIEW_KEY_TTL = "compactedViewKeyTtlSeconds"
DEDUPLICATION_ENABLED = "deduplicationEnabled"
SCHEMA_COMPATIBILITY_STRATEGY = "schemaCompatibilityStrategy"
SCHEMA_AUTO_UPDATE = "isAllowAutoUpdateSchema"
SCHEMA_VALIDATION_ENFORCED = "schemaValidationEnforced"
# ours: the table the compacted view is re-exported to after each compaction (compaction.hooks)
COMPACTED_EXPORT = "compactedExport"
AUTO_TOPIC_CREATION = "autoTopicCreation"  # a namespace policy
# tiered storage (storage.offload)
OFFLOAD_THRESHOLD = "offloadThreshold"
OFFLOAD_THRESHOLD_SECONDS = "offloadThresholdInSeconds"
OFFLOAD_DELETION_LAG = "offloadDeletionLagMs"
OFFLOAD_POLICIES = "offloadPolicies"

#: policy key -> the broker-config key in force when neither the topic nor its namespace sets it
#: (read it with ``config.setting``/``int_setting``/``bool_setting``, which know its type)
DEFAULT_SETTINGS: Mapping[str, str] = {
    COMPACTION_THRESHOLD: "brokerServiceCompactionThresholdInBytes",
    RETENTION_TIME_MINUTES: "defaultRetentionTimeInMinutes",
    RETENTION_SIZE_MB: "defaultRetentionSizeInMB",
    COMPACTION_STRATEGY: "topicCompactionStrategy",
    RETAIN_NULL_KEY: "topicCompactionRetainNullKey",
    COMPACTION_RETENTION_MODE: "topicCompactionRetentionMode",
    COMPACTION_MAX_LAG: "brokerServiceCompactionMaxLagInSeconds",
    COMPACTION_MIN_LAG: "brokerServiceCompactionMinLagInSeconds",
    COMPACTION_TOMBSTONE_RETENTION: "topicCompactionTombstoneRetentionSeconds",
    COMPACTED_VIEW_KEY_TTL: "topicCompactedViewKeyTtlSeconds",
    DEDUPLICATION_ENABLED: "brokerDeduplicationEnabled",
    SCHEMA_COMPATIBILITY_STRATEGY: "schemaCompatibilityStrategy",
    SCHEMA_AUTO_UPDATE: "isAllowAutoUpdateSchemaEnabled",
    SCHEMA_VALIDATION_ENFORCED: "isSchemaValidationEnforced",
    OFFLOAD_THRESHOLD: "managedLedgerOffloadAutoTriggerSizeThresholdBytes",
    OFFLOAD_THRESHOLD_SECONDS: "managedLedgerOffloadThresholdInSeconds",
    OFFLOAD_DELETION_LAG: "managedLedgerOffloadDeletionLagMs",
    OFFLOAD_POLICIES: "managedLedgerOffloadDriver",  # no namespace policy: the broker's driver
}
