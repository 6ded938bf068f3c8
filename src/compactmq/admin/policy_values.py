"""What the broker accepts as a policy's REST body, and what it answers: one validator and one
renderer per policy, used by the declarations in ``policies``.

A validator turns an untrusted JSON body into the metadata-store values of the policy's keys, or
raises ``InvalidInput`` (400: the wrong JSON type) or ``PreconditionFailed`` (412: a value out of
range, Pulsar's status for a refused policy). Which names a broker allows (compaction strategy
classes, export roots) is not decided here but by ``auth.policy_rules`` when the value is stored.
A renderer turns the stored values back into the body Pulsar answers, ``None`` when unset.

Stdlib only at import time (the CLI imports the declarations): the two validators that need the
broker's or the compaction service's rules import them when called.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from ..config import RETENTION_MODES, parse_bool
from ..errors import InvalidInput, PreconditionFailed

from ..config.policy_keys import (  # the metadata-store keys, declared once (stdlib only)
    COMPACTED_EXPORT,
    COMPACTION_RETENTION_MODE,
    COMPACTION_STRATEGY,
    COMPACTION_THRESHOLD,
    RETAIN_NULL_KEY,
    RETENTION_SIZE_MB,
    RETENTION_TIME_MINUTES,
    SCHEMA_COMPATIBILITY_STRATEGY,
)

Parse = Callable[[Any], dict[str, Any]]
Render = Callable[[Mapping[str, Any]], Any]


def _int_body(body: Any, what: str) -> int:
    if isinstance(body, bool) or not isinstance(body, int):
        if isinstance(body, str) and body.strip().lstrip("-").isdigit():
            return int(body)
        raise InvalidInput(f"{what} must be a JSON integer, not {body!r}")
    return body


def threshold(body: Any) -> dict[str, Any]:
    value = _int_body(body, COMPACTION_THRESHOLD)
    if value < 0:
        raise PreconditionFailed(
            f"{COMPACTION_THRESHOLD} must be 0 (disabled) or a number of bytes, not {value}"
        )
    return {COMPACTION_THRESHOLD: value}


def seconds(key: str) -> Parse:
    def parse(body: Any) -> dict[str, Any]:
        value = _int_body(body, key)
        if value < 0:
            raise PreconditionFailed(f"{key} must be 0 (disabled) or a number of seconds, not {value}")
        return {key: value}

    return parse


def retention(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise InvalidInput(
            'retention must be a JSON object {"retentionTimeInMinutes": int, "retentionSizeInMB": int}'
        )
    out = {}
    for field, key in (
        ("retentionTimeInMinutes", RETENTION_TIME_MINUTES),  # the body's field names are Pulsar's
        ("retentionSizeInMB", RETENTION_SIZE_MB),
    ):
        if field not in body:
            raise InvalidInput(f"retention: {field} is missing")
        value = _int_body(body[field], field)
        if value < -1:
            raise PreconditionFailed(f"retention: {field} must be -1 (unlimited), 0 or more, not {value}")
        out[key] = value
    return out


def render_retention(values: Mapping[str, Any]) -> Any:
    if RETENTION_TIME_MINUTES not in values and RETENTION_SIZE_MB not in values:
        return None
    return {
        "retentionTimeInMinutes": values.get(RETENTION_TIME_MINUTES, 0),
        "retentionSizeInMB": values.get(RETENTION_SIZE_MB, 0),
    }


def strategy(body: Any) -> dict[str, Any]:
    """The shape only: which names this broker allows is the registry's rule
    (``auth.policy_rules``); nothing is resolved or imported here."""
    if not isinstance(body, str) or not body.strip():
        raise InvalidInput(
            "compactionStrategy must be a JSON string: keep-latest, keep-first, event-time "
            "or a class the operator allowed (topicCompactionStrategyAllowedClasses)"
        )
    return {COMPACTION_STRATEGY: body.strip()}


def retain_null_key(body: Any) -> dict[str, Any]:
    if isinstance(body, str):
        try:
            body = parse_bool(body)
        except ValueError:
            pass  # refused below
    if not isinstance(body, bool):
        raise InvalidInput(f"compactionRetainNullKey must be a JSON boolean, not {body!r}")
    return {RETAIN_NULL_KEY: body}


def retention_mode(body: Any) -> dict[str, Any]:
    if body not in RETENTION_MODES:
        raise PreconditionFailed(
            f"compactionRetentionMode must be one of {', '.join(RETENTION_MODES)}, not {body!r}"
        )
    return {COMPACTION_RETENTION_MODE: body}


def boolean(key: str, what: str) -> Parse:
    def parse(body: Any) -> dict[str, Any]:
        if isinstance(body, str) and body.strip().lower() in ("true", "false"):
            body = body.strip().lower() == "true"
        if not isinstance(body, bool):
            raise InvalidInput(f"{what} must be a JSON boolean, not {body!r}")
        return {key: body}

    return parse


def schema_strategy(body: Any) -> dict[str, Any]:
    from ..broker.schema_compat import check_strategy

    try:
        return {SCHEMA_COMPATIBILITY_STRATEGY: check_strategy(body)}
    except ValueError as e:
        raise PreconditionFailed(str(e)) from None


def export(body: Any) -> dict[str, Any]:
    from ..compaction.hooks import parse_export_policy

    return {COMPACTED_EXPORT: parse_export_policy(body)}


def single(key: str) -> Render:
    return lambda values: values.get(key)
