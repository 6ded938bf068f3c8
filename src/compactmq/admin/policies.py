"""Topic and namespace policies: one table, used by both the topic and the namespace paths.

Each policy is a path suffix (Pulsar's name where Pulsar has one), the metadata-store keys it
sets, a validator that turns the request body into those keys' values, a renderer that turns
stored values back into the body Pulsar answers (``null`` when unset), and the broker-config
default that ``?applied=true`` falls back to (topic policy, else namespace policy, else config).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ..broker.dedup import POLICY_KEY as DEDUP_KEY
from ..broker.schema_compat import AUTO_UPDATE_KEY, CONFIG_KEYS, STRATEGY_KEY, VALIDATION_KEY, check_strategy
from ..compaction.hooks import POLICY_KEY as EXPORT_KEY
from ..compaction.hooks import parse_export_policy
from ..errors import InvalidInput
from ..config import RETENTION_MODES, parse_bool
from ..storage import (
    COMPACTED_VIEW_KEY_TTL,
    COMPACTION_MAX_LAG,
    COMPACTION_MIN_LAG,
    COMPACTION_RETENTION_MODE,
    COMPACTION_TOMBSTONE_RETENTION,
    COMPACTION_STRATEGY,
    COMPACTION_THRESHOLD,
    RETAIN_NULL_KEY,
    RETENTION_SIZE_MB,
    RETENTION_TIME_MINUTES,
)
from .common import PreconditionFailed


@dataclass(frozen=True)
class Policy:
    path: str
    keys: tuple[str, ...]
    parse: Callable[[Any], dict[str, Any]]
    render: Callable[[Mapping[str, Any]], Any]
    config_defaults: Mapping[str, str]  # metadata key -> broker config key (for ?applied=true)
    body_type: str  # JSON schema type, for the OpenAPI document
    summary: str
    namespace_path: str | None = None  # where Pulsar names the namespace path differently


def _int_body(body: Any, what: str) -> int:
    if isinstance(body, bool) or not isinstance(body, int):
        if isinstance(body, str) and body.strip().lstrip("-").isdigit():
            return int(body)
        raise InvalidInput(f"{what} must be a JSON integer, not {body!r}")
    return body


def _threshold(body: Any) -> dict[str, Any]:
    value = _int_body(body, "compactionThreshold")
    if value < 0:
        raise PreconditionFailed(
            f"compactionThreshold must be 0 (disabled) or a number of bytes, not {value}"
        )
    return {COMPACTION_THRESHOLD: value}


def _seconds(key: str) -> Callable[[Any], dict[str, Any]]:
    def parse(body: Any) -> dict[str, Any]:
        value = _int_body(body, key)
        if value < 0:
            raise PreconditionFailed(f"{key} must be 0 (disabled) or a number of seconds, not {value}")
        return {key: value}

    return parse


def _retention(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise InvalidInput(
            'retention must be a JSON object {"retentionTimeInMinutes": int, "retentionSizeInMB": int}'
        )
    out = {}
    for field, key in (
        ("retentionTimeInMinutes", RETENTION_TIME_MINUTES),
        ("retentionSizeInMB", RETENTION_SIZE_MB),
    ):
        if field not in body:
            raise InvalidInput(f"retention: {field} is missing")
        value = _int_body(body[field], field)
        if value < -1:
            raise PreconditionFailed(f"retention: {field} must be -1 (unlimited), 0 or more, not {value}")
        out[key] = value
    return out


def _render_retention(values: Mapping[str, Any]) -> Any:
    if RETENTION_TIME_MINUTES not in values and RETENTION_SIZE_MB not in values:
        return None
    return {
        "retentionTimeInMinutes": values.get(RETENTION_TIME_MINUTES, 0),
        "retentionSizeInMB": values.get(RETENTION_SIZE_MB, 0),
    }


def _strategy(body: Any) -> dict[str, Any]:
    """The shape only: which names this broker allows is the registry's rule
    (``auth.policy_values``); nothing is resolved or imported here."""
    if not isinstance(body, str) or not body.strip():
        raise InvalidInput(
            "compactionStrategy must be a JSON string: keep-latest, keep-first, event-time "
            "or a class the operator allowed (topicCompactionStrategyAllowedClasses)"
        )
    return {COMPACTION_STRATEGY: body.strip()}


def _retain_null_key(body: Any) -> dict[str, Any]:
    if isinstance(body, str):
        try:
            body = parse_bool(body)
        except ValueError:
            pass  # refused below
    if not isinstance(body, bool):
        raise InvalidInput(f"compactionRetainNullKey must be a JSON boolean, not {body!r}")
    return {RETAIN_NULL_KEY: body}


def _retention_mode(body: Any) -> dict[str, Any]:
    if body not in RETENTION_MODES:
        raise PreconditionFailed(
            f"compactionRetentionMode must be one of {', '.join(RETENTION_MODES)}, not {body!r}"
        )
    return {COMPACTION_RETENTION_MODE: body}


def _bool_body(key: str, what: str) -> Callable[[Any], dict[str, Any]]:
    def parse(body: Any) -> dict[str, Any]:
        if isinstance(body, str) and body.strip().lower() in ("true", "false"):
            body = body.strip().lower() == "true"
        if not isinstance(body, bool):
            raise InvalidInput(f"{what} must be a JSON boolean, not {body!r}")
        return {key: body}

    return parse


def _schema_strategy(body: Any) -> dict[str, Any]:
    try:
        return {STRATEGY_KEY: check_strategy(body)}
    except ValueError as e:
        raise PreconditionFailed(str(e)) from None


def _single(key: str) -> Callable[[Mapping[str, Any]], Any]:
    return lambda values: values.get(key)


POLICIES: tuple[Policy, ...] = (
    Policy(
        "compactionThreshold",
        (COMPACTION_THRESHOLD,),
        _threshold,
        _single(COMPACTION_THRESHOLD),
        {COMPACTION_THRESHOLD: "brokerServiceCompactionThresholdInBytes"},
        "integer",
        "backlog size in bytes that triggers automatic compaction (0 disables)",
    ),
    Policy(
        "retention",
        (RETENTION_TIME_MINUTES, RETENTION_SIZE_MB),
        _retention,
        _render_retention,
        {
            RETENTION_TIME_MINUTES: "defaultRetentionTimeInMinutes",
            RETENTION_SIZE_MB: "defaultRetentionSizeInMB",
        },
        "object",
        "retention of acknowledged messages: retentionTimeInMinutes, retentionSizeInMB",
    ),
    Policy(
        "compactionStrategy",
        (COMPACTION_STRATEGY,),
        _strategy,
        _single(COMPACTION_STRATEGY),
        {COMPACTION_STRATEGY: "topicCompactionStrategy"},
        "string",
        "compaction strategy: keep-latest, keep-first, event-time or a class the operator allowed",
    ),
    Policy(
        "compactionRetainNullKey",
        (RETAIN_NULL_KEY,),
        _retain_null_key,
        _single(RETAIN_NULL_KEY),
        {RETAIN_NULL_KEY: "topicCompactionRetainNullKey"},
        "boolean",
        "whether compaction keeps keyless messages",
    ),
    Policy(
        "compactionRetentionMode",
        (COMPACTION_RETENTION_MODE,),
        _retention_mode,
        _single(COMPACTION_RETENTION_MODE),
        {COMPACTION_RETENTION_MODE: "topicCompactionRetentionMode"},
        "string",
        "retention-bounded or keep-until-tombstone",
    ),
    # ours (Pulsar has no time-based compaction; see compaction.lag)
    Policy(
        COMPACTION_MAX_LAG,
        (COMPACTION_MAX_LAG,),
        _seconds(COMPACTION_MAX_LAG),
        _single(COMPACTION_MAX_LAG),
        {COMPACTION_MAX_LAG: "brokerServiceCompactionMaxLagInSeconds"},
        "integer",
        "compact when the oldest uncompacted message is older than this many seconds (0 disables)",
    ),
    Policy(
        COMPACTION_MIN_LAG,
        (COMPACTION_MIN_LAG,),
        _seconds(COMPACTION_MIN_LAG),
        _single(COMPACTION_MIN_LAG),
        {COMPACTION_MIN_LAG: "brokerServiceCompactionMinLagInSeconds"},
        "integer",
        "messages younger than this many seconds are not compacted yet (0: none held back)",
    ),
    # ours: Kafka's delete.retention.ms and PIP-252's key time-to-live (keep-latest only)
    Policy(
        COMPACTION_TOMBSTONE_RETENTION,
        (COMPACTION_TOMBSTONE_RETENTION,),
        _seconds(COMPACTION_TOMBSTONE_RETENTION),
        _single(COMPACTION_TOMBSTONE_RETENTION),
        {COMPACTION_TOMBSTONE_RETENTION: "topicCompactionTombstoneRetentionSeconds"},
        "integer",
        "keep tombstones in the compacted view until they are this many seconds old (0: drop at once)",
    ),
    Policy(
        COMPACTED_VIEW_KEY_TTL,
        (COMPACTED_VIEW_KEY_TTL,),
        _seconds(COMPACTED_VIEW_KEY_TTL),
        _single(COMPACTED_VIEW_KEY_TTL),
        {COMPACTED_VIEW_KEY_TTL: "topicCompactedViewKeyTtlSeconds"},
        "integer",
        "drop a key from the compacted view once its latest message is this many seconds old (0: never)",
    ),
    Policy(
        "deduplicationEnabled",
        (DEDUP_KEY,),
        _bool_body(DEDUP_KEY, "deduplication"),
        _single(DEDUP_KEY),
        {DEDUP_KEY: "brokerDeduplicationEnabled"},
        "boolean",
        "message deduplication by producer name and sequence id",
        namespace_path="deduplication",
    ),
    Policy(
        STRATEGY_KEY,
        (STRATEGY_KEY,),
        _schema_strategy,
        _single(STRATEGY_KEY),
        {STRATEGY_KEY: CONFIG_KEYS[STRATEGY_KEY]},
        "string",
        "schema compatibility strategy: ALWAYS_COMPATIBLE, ALWAYS_INCOMPATIBLE, BACKWARD, FORWARD, FULL, "
        "BACKWARD_TRANSITIVE, FORWARD_TRANSITIVE, FULL_TRANSITIVE",
    ),
    Policy(
        AUTO_UPDATE_KEY,
        (AUTO_UPDATE_KEY,),
        _bool_body(AUTO_UPDATE_KEY, AUTO_UPDATE_KEY),
        _single(AUTO_UPDATE_KEY),
        {AUTO_UPDATE_KEY: CONFIG_KEYS[AUTO_UPDATE_KEY]},
        "boolean",
        "whether producers may register new schema versions",
    ),
    Policy(
        VALIDATION_KEY,
        (VALIDATION_KEY,),
        _bool_body(VALIDATION_KEY, VALIDATION_KEY),
        _single(VALIDATION_KEY),
        {VALIDATION_KEY: CONFIG_KEYS[VALIDATION_KEY]},
        "boolean",
        "whether producers without a schema are refused on topics that have one",
    ),
    # ours (Pulsar has none): the table the compacted view is re-exported to after each compaction
    Policy(
        EXPORT_KEY,
        (EXPORT_KEY,),
        lambda body: {EXPORT_KEY: parse_export_policy(body)},
        _single(EXPORT_KEY),
        {},
        "object",
        "re-export the compacted view after every compaction, under the broker's compactedExportRoot: "
        "{format: parquet|delta|iceberg, view: compacted|latest, partitionBy: [...], root: an allowed "
        "object-store root}",
    ),
)


def applied_values(
    policy: Policy, own: Mapping[str, Any], namespace: Mapping[str, Any] | None, config: Mapping[str, Any]
) -> dict[str, Any]:
    """The values in force for ``policy``: own, else the namespace's, else the broker config."""
    out = {}
    for key in policy.keys:
        if key in own:
            out[key] = own[key]
        elif namespace is not None and key in namespace:
            out[key] = namespace[key]
        else:
            out[key] = config[policy.config_defaults[key]] if key in policy.config_defaults else None
    return out
