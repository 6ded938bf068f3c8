"""The registry of policy values: one rule per policy key, and nothing stored without one.

A namespace or topic policy is set by a *tenant admin*, a role the operator trusts with its
tenant's topics but not with the broker's files, code, network identity or credentials. Some
policy values used to reach exactly those (a table path that was written and deleted, a class
name that was imported, an object-store endpoint the broker signed requests for). This module
makes that class of bug impossible rather than fixing its instances:

* every metadata key a policy route may store has a ``Rule`` here: what the value *reaches*
  (``nothing``: a number, flag or enum the broker only compares; ``path``; ``network``;
  ``import``) and a guard that returns the value to store or raises ``PreconditionFailed``
  (HTTP 412) with one clear reason;
* ``check_policy_values`` runs the guards of a request's values, and refuses a key that has no
  rule: a new policy cannot reach anything until someone writes down why it may;
* guards are pure checks against the broker's config (the operator's allowlists and roots) and
  the policy's target (tenant/namespace/topic): they import nothing and call no network.
  Realpath checks touch the filesystem, so the admin adapter runs the registry off its event loop.

The same rules hold where a stored value is *used* (a value stored before these rules, or written
to the metadata store by other means): the compaction runner resolves a strategy only through
``compaction.strategies.resolve_strategy`` with the operator's allowlist, the export hook derives
its location with ``compaction.hooks.export_location``, the offloader checks its location with
``storage.offload.blobstore.check_location_allowed``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ..compaction.hooks import export_location, export_namespace_location, parse_export_policy
from ..compaction.strategies import allowed_strategy_classes, check_strategy_name
from ..config import policy_keys as pk
from ..errors import InvalidConfiguration, InvalidInput, PreconditionFailed
from ..storage.offload.blobstore import check_location_allowed, location_from_settings

#: the longest string any policy value may hold (names, enums, paths)
MAX_STRING = 1024
NOTHING, PATH, NETWORK, IMPORT = "nothing", "path", "network", "import"
_REGION = re.compile(r"^[a-z0-9-]{1,64}$")


@dataclass(frozen=True)
class Target:
    """What a policy is set on: the broker config, the namespace (``tenant/ns``) and, for a topic
    policy, the topic (``persistent://tenant/ns/topic``)."""

    config: Mapping[str, Any]
    namespace: str
    topic: str | None = None


@dataclass(frozen=True)
class Rule:
    key: str
    reaches: str  # NOTHING, PATH, NETWORK or IMPORT
    guard: Callable[[Any, Target], Any]
    rule: str  # one line: what the value may be, and why (docs/security.md repeats it)


RULES: dict[str, Rule] = {}


def _register(key: str, reaches: str, rule: str, guard: Callable[[Any, Target], Any]) -> None:
    RULES[key] = Rule(key, reaches, guard, rule)


def check_policy_values(values: Mapping[str, Any], target: Target) -> dict[str, Any]:
    """The values to store for a request: each through its key's guard (``None``, a removal,
    passes). ``PreconditionFailed`` for a value its rule refuses, and for a key without a rule."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        rule = RULES.get(key)
        if rule is None:
            raise PreconditionFailed(f"policy {key}: no rule says what this value may reach; refused")
        out[key] = None if value is None else rule.guard(value, target)
    return out


# --- values that reach nothing: bounded scalars -------------------------------------------------


def _scalar(value: Any, target: Target) -> Any:
    if isinstance(value, (bool, int, float)) and not (isinstance(value, int) and abs(value) >= 1 << 63):
        return value
    if isinstance(value, str) and len(value) <= MAX_STRING:
        return value
    raise PreconditionFailed(
        f"policy value {str(value)[:80]!r}...: expected a 64-bit number, a flag or a name of at most "
        f"{MAX_STRING} characters"
    )


_SCALAR_KEYS = (
    pk.COMPACTION_THRESHOLD,
    pk.RETENTION_TIME_MINUTES,
    pk.RETENTION_SIZE_MB,
    pk.RETAIN_NULL_KEY,
    pk.COMPACTION_RETENTION_MODE,
    pk.COMPACTION_MAX_LAG,
    pk.COMPACTION_MIN_LAG,
    pk.COMPACTION_TOMBSTONE_RETENTION,
    pk.COMPACTED_VIEW_KEY_TTL,
    pk.DEDUPLICATION_ENABLED,
    pk.SCHEMA_COMPATIBILITY_STRATEGY,
    pk.SCHEMA_AUTO_UPDATE,
    pk.SCHEMA_VALIDATION_ENFORCED,
    pk.OFFLOAD_THRESHOLD,
    pk.OFFLOAD_THRESHOLD_SECONDS,
    pk.OFFLOAD_DELETION_LAG,
)
for _key in _SCALAR_KEYS:
    _register(
        _key, NOTHING, "a number, flag or enum the broker only compares (checked by its parser)", _scalar
    )


# --- partition counts: each partition is a directory and files -------------------------------


def check_partitions(n: int, config: Mapping[str, Any]) -> int:
    """``n`` when ``maxNumPartitionsPerPartitionedTopic`` (0: no limit) allows it."""
    limit = int(config.get("maxNumPartitionsPerPartitionedTopic") or 0)
    if limit > 0 and n > limit:
        raise PreconditionFailed(
            f"{n} partitions: this broker allows at most {limit} (maxNumPartitionsPerPartitionedTopic)"
        )
    return n


def _auto_topic_creation(value: Any, target: Target) -> Any:
    if isinstance(value, dict) and value.get("defaultNumPartitions") is not None:
        check_partitions(_scalar(value["defaultNumPartitions"], target), target.config)
    return value


_register(
    pk.AUTO_TOPIC_CREATION,
    NOTHING,
    "allow flag, topic type and a partition count bounded by maxNumPartitionsPerPartitionedTopic",
    _auto_topic_creation,
)


# --- compactionStrategy: an import --------------------------------------------------------------


def _strategy(value: Any, target: Target) -> str:
    try:
        return check_strategy_name(value, allowed_strategy_classes(target.config))
    except InvalidConfiguration as e:
        raise PreconditionFailed(str(e)) from None


_register(
    pk.COMPACTION_STRATEGY,
    IMPORT,
    "keep-latest, keep-first, event-time, or a class named in topicCompactionStrategyAllowedClasses "
    "(or the broker's own topicCompactionStrategy); checked as a string, nothing is imported",
    _strategy,
)


# --- compactedExport: a path (or an object-store URI) the broker writes -------------------------


def _export(value: Any, target: Target) -> dict[str, Any]:
    try:
        policy = parse_export_policy(value)
        if target.topic is None:
            where = export_namespace_location(target.config, target.namespace, policy)
        else:
            where = export_location(target.config, target.topic, policy)
    except InvalidInput as e:  # InvalidConfiguration too: no root, a root not allowed, outside it
        raise PreconditionFailed(str(e)) from None
    given = policy.pop("path", None)
    if given is not None and given.rstrip("/") != where.rstrip("/"):
        raise PreconditionFailed(
            f"compactedExport: the location is derived from the topic's name under the broker's "
            f"export root, not chosen: omit path (it would be {where})"
        )
    policy["path"] = where
    return policy


_register(
    pk.COMPACTED_EXPORT,
    PATH,
    "written only at <compactedExportRoot or an allowed object-store root>/<encoded domain/tenant/"
    "namespace/topic>, derived and realpath-checked; no root configured: refused",
    _export,
)


# --- offloadPolicies: a location the broker writes to and signs requests for --------------------


_DRIVER_FIELDS = {
    "s3": (
        "s3ManagedLedgerOffloadBucket",
        "s3ManagedLedgerOffloadRegion",
        "s3ManagedLedgerOffloadServiceEndpoint",
    ),
    "google-cloud-storage": ("gcsManagedLedgerOffloadBucket",),
    "gcs": ("gcsManagedLedgerOffloadBucket",),
    "filesystem": ("fileSystemURI",),
}
_LOCATION_FIELDS = tuple(sorted({f for fields in _DRIVER_FIELDS.values() for f in fields}))


def _offload(value: Any, target: Target) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise PreconditionFailed("offloadPolicies must be an object")
    for field in value.values():
        _scalar(field, target)  # short strings, 64-bit numbers
    driver = str(value.get("managedLedgerOffloadDriver") or "").strip().lower()
    own = _DRIVER_FIELDS.get("s3" if driver in ("aws-s3", "s3") else driver, ())
    stray = sorted(k for k in _LOCATION_FIELDS if value.get(k) not in (None, "") and k not in own)
    if stray:  # a location field the chosen driver would not use is not stored either
        raise PreconditionFailed(
            f"offloadPolicies: {', '.join(stray)} not used by driver {driver[:40] or '(none)'!r}; leave it out"
        )
    region = str(value.get("s3ManagedLedgerOffloadRegion") or "")
    if region and not _REGION.match(region):
        raise PreconditionFailed(
            f"offloadPolicies: s3ManagedLedgerOffloadRegion {region[:80]!r} is not a region name"
        )
    try:
        location = location_from_settings(value)
        if location is not None:
            check_location_allowed(location, target.config)
    except InvalidConfiguration as e:
        raise PreconditionFailed(f"offloadPolicies: {e}") from None
    return dict(value)


_register(
    pk.OFFLOAD_POLICIES,
    NETWORK,
    "driver, bucket or fileSystemURI and endpoint must be the broker's own offload location or one "
    "listed in managedLedgerOffloadAllowedLocations; credentials are never accepted",
    _offload,
)
