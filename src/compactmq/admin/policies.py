"""Topic and namespace policies: one declaration each, read by the REST API and the CLI alike.

A ``Policy`` says everything about one policy in one place:

* ``path``, ``namespace_path`` -- its REST path suffix (Pulsar's name where Pulsar has one), under
  ``/admin/v2/{persistent,non-persistent}/...`` and ``/admin/v2/namespaces/...``; ``scopes`` --
  where it can be set (topics, namespaces);
* ``keys`` -- the metadata-store keys it sets; ``parse`` turns the untrusted request body into
  those keys' values (or refuses it), ``render`` turns stored values back into the body Pulsar
  answers (``null`` when unset); both live in ``policy_values``;
* ``config_defaults`` -- the broker-config key ``?applied=true`` falls back to (topic policy, else
  namespace policy, else config), from ``config.policy_keys``, where the keys and their fallbacks
  are declared for every layer; ``body_type`` and ``summary`` -- for the OpenAPI document;
* ``cli`` -- pulsar-admin's verb and flags (``policy_forms.CliForm``): the CLI's
  ``set-|get-|remove-<verb>`` commands are built from it.

Adding a policy is adding one entry here, its key (and fallback setting) in
``config.policy_keys``, its validator in ``policy_values`` and the rule on what its value may reach
in ``auth.policy_rules`` (a key without a rule is refused when stored). This module
and the two it draws on import nothing beyond the standard library at import time, so the CLI
imports it without loading the broker.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ..config import policy_keys as pk
from ..config.policy_keys import DEFAULT_SETTINGS
from . import policy_forms as cli
from . import policy_values as v
from .policy_forms import CliForm

TOPIC, NAMESPACE = "topic", "namespace"


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
    cli: CliForm | None = None  # pulsar-admin's verb and flags; None: no CLI commands
    scopes: tuple[str, ...] = (TOPIC, NAMESPACE)

    def path_for(self, target: str) -> str:
        """The REST path suffix on ``target`` ("topic" or "namespace")."""
        return self.namespace_path if target == NAMESPACE and self.namespace_path else self.path


def fallbacks(*keys: str) -> Mapping[str, str]:
    """The broker-config fallbacks of ``keys`` (``config.policy_keys.DEFAULT_SETTINGS``)."""
    return {key: DEFAULT_SETTINGS[key] for key in keys}


def _lag(verb: str, what: str) -> CliForm:
    return CliForm(verb, cli.lag_args(what), cli.lag_seconds, cli.render_seconds, namespace_set_method="PUT")


def _toggle(verb: str, what: str, render: Callable[[Any], str] = cli.not_set_or) -> CliForm:
    return CliForm(verb, cli.enable_args(what), cli.enabled, render)


POLICIES: tuple[Policy, ...] = (
    Policy(
        "compactionThreshold",
        (pk.COMPACTION_THRESHOLD,),
        v.threshold,
        v.single(pk.COMPACTION_THRESHOLD),
        fallbacks(pk.COMPACTION_THRESHOLD),
        "integer",
        "backlog size in bytes that triggers automatic compaction (0 disables)",
        cli=CliForm(
            "compaction-threshold",
            cli.threshold_args,
            lambda a: cli.parse_size(a.threshold),
            cli.render_threshold,
            namespace_set_method="PUT",
        ),
    ),
    Policy(
        "retention",
        (pk.RETENTION_TIME_MINUTES, pk.RETENTION_SIZE_MB),
        v.retention,
        v.render_retention,
        fallbacks(pk.RETENTION_TIME_MINUTES, pk.RETENTION_SIZE_MB),
        "object",
        "retention of acknowledged messages: retentionTimeInMinutes, retentionSizeInMB",
        cli=CliForm("retention", cli.retention_args, cli.retention_body, cli.render_retention),
    ),
    Policy(
        "compactionStrategy",
        (pk.COMPACTION_STRATEGY,),
        v.strategy,
        v.single(pk.COMPACTION_STRATEGY),
        fallbacks(pk.COMPACTION_STRATEGY),
        "string",
        "compaction strategy: keep-latest, keep-first, event-time or a class the operator allowed",
        cli=CliForm(
            "compaction-strategy",
            cli.strategy_args,
            lambda a: a.strategy,
            lambda b: b if b else "no compaction strategy set",
        ),
    ),
    Policy(
        "compactionRetainNullKey",
        (pk.RETAIN_NULL_KEY,),
        v.retain_null_key,
        v.single(pk.RETAIN_NULL_KEY),
        fallbacks(pk.RETAIN_NULL_KEY),
        "boolean",
        "whether compaction keeps keyless messages",
        cli=CliForm("retain-null-key", cli.null_key_args, cli.retain_flag, cli.render_bool),
    ),
    Policy(
        "compactionRetentionMode",
        (pk.COMPACTION_RETENTION_MODE,),
        v.retention_mode,
        v.single(pk.COMPACTION_RETENTION_MODE),
        fallbacks(pk.COMPACTION_RETENTION_MODE),
        "string",
        "retention-bounded or keep-until-tombstone",
    ),
    # ours (Pulsar has no time-based compaction; see compaction.lag)
    Policy(
        pk.COMPACTION_MAX_LAG,
        (pk.COMPACTION_MAX_LAG,),
        v.seconds(pk.COMPACTION_MAX_LAG),
        v.single(pk.COMPACTION_MAX_LAG),
        fallbacks(pk.COMPACTION_MAX_LAG),
        "integer",
        "compact when the oldest uncompacted message is older than this many seconds (0 disables)",
        cli=_lag("compaction-max-lag", "compact once the oldest uncompacted message is this old"),
    ),
    Policy(
        pk.COMPACTION_MIN_LAG,
        (pk.COMPACTION_MIN_LAG,),
        v.seconds(pk.COMPACTION_MIN_LAG),
        v.single(pk.COMPACTION_MIN_LAG),
        fallbacks(pk.COMPACTION_MIN_LAG),
        "integer",
        "messages younger than this many seconds are not compacted yet (0: none held back)",
        cli=_lag("compaction-min-lag", "leave messages younger than this uncompacted"),
    ),
    # ours: Kafka's delete.retention.ms and PIP-252's key time-to-live (keep-latest only)
    Policy(
        pk.COMPACTION_TOMBSTONE_RETENTION,
        (pk.COMPACTION_TOMBSTONE_RETENTION,),
        v.seconds(pk.COMPACTION_TOMBSTONE_RETENTION),
        v.single(pk.COMPACTION_TOMBSTONE_RETENTION),
        fallbacks(pk.COMPACTION_TOMBSTONE_RETENTION),
        "integer",
        "keep tombstones in the compacted view until they are this many seconds old (0: drop at once)",
        cli=_lag(
            "compaction-tombstone-retention", "keep tombstones in the compacted view until they are this old"
        ),
    ),
    Policy(
        pk.COMPACTED_VIEW_KEY_TTL,
        (pk.COMPACTED_VIEW_KEY_TTL,),
        v.seconds(pk.COMPACTED_VIEW_KEY_TTL),
        v.single(pk.COMPACTED_VIEW_KEY_TTL),
        fallbacks(pk.COMPACTED_VIEW_KEY_TTL),
        "integer",
        "drop a key from the compacted view once its latest message is this many seconds old (0: never)",
        cli=_lag(
            "compacted-view-key-ttl", "drop a key from the compacted view once its latest message is this old"
        ),
    ),
    Policy(
        "deduplicationEnabled",
        (pk.DEDUPLICATION_ENABLED,),
        v.boolean(pk.DEDUPLICATION_ENABLED, "deduplication"),
        v.single(pk.DEDUPLICATION_ENABLED),
        fallbacks(pk.DEDUPLICATION_ENABLED),
        "boolean",
        "message deduplication by producer name and sequence id",
        namespace_path="deduplication",
        cli=_toggle("deduplication", "message deduplication", cli.render_bool),
    ),
    Policy(
        pk.SCHEMA_COMPATIBILITY_STRATEGY,
        (pk.SCHEMA_COMPATIBILITY_STRATEGY,),
        v.schema_strategy,
        v.single(pk.SCHEMA_COMPATIBILITY_STRATEGY),
        fallbacks(pk.SCHEMA_COMPATIBILITY_STRATEGY),
        "string",
        "schema compatibility strategy: ALWAYS_COMPATIBLE, ALWAYS_INCOMPATIBLE, BACKWARD, FORWARD, FULL, "
        "BACKWARD_TRANSITIVE, FORWARD_TRANSITIVE, FULL_TRANSITIVE",
        cli=CliForm(
            "schema-compatibility-strategy",
            cli.schema_strategy_args,
            lambda a: a.compatibility.upper(),
            cli.not_set_or,
            topic_set_method="PUT",
            namespace_set_method="PUT",
        ),
    ),
    Policy(
        pk.SCHEMA_AUTO_UPDATE,
        (pk.SCHEMA_AUTO_UPDATE,),
        v.boolean(pk.SCHEMA_AUTO_UPDATE, pk.SCHEMA_AUTO_UPDATE),
        v.single(pk.SCHEMA_AUTO_UPDATE),
        fallbacks(pk.SCHEMA_AUTO_UPDATE),
        "boolean",
        "whether producers may register new schema versions",
        cli=_toggle("is-allow-auto-update-schema", "schema auto update"),
    ),
    # ours (Pulsar has none): the table the compacted view is re-exported to after each compaction
    Policy(
        pk.COMPACTED_EXPORT,
        (pk.COMPACTED_EXPORT,),
        v.export,
        v.single(pk.COMPACTED_EXPORT),
        {},
        "object",
        "re-export the compacted view after every compaction, under the broker's compactedExportRoot: "
        "{format: parquet|delta|iceberg, view: compacted|latest, partitionBy: [...], root: an allowed "
        "object-store root}",
        cli=CliForm("compacted-export", cli.export_args, cli.export_body, cli.render_export),
    ),
    Policy(
        pk.SCHEMA_VALIDATION_ENFORCED,
        (pk.SCHEMA_VALIDATION_ENFORCED,),
        v.boolean(pk.SCHEMA_VALIDATION_ENFORCED, pk.SCHEMA_VALIDATION_ENFORCED),
        v.single(pk.SCHEMA_VALIDATION_ENFORCED),
        fallbacks(pk.SCHEMA_VALIDATION_ENFORCED),
        "boolean",
        "whether producers without a schema are refused on topics that have one",
        cli=_toggle("schema-validation-enforce", "schema validation"),
    ),
)


def rest_path(key: str, policies: tuple[Policy, ...] = POLICIES) -> str:
    """The REST path suffix of the policy that stores ``key`` (a ``config.policy_keys`` name):
    for a client of the admin API that reads a policy by its key (``spark.broker``)."""
    for p in policies:
        if key in p.keys:
            return p.path
    raise KeyError(f"no policy stores {key!r}")


def cli_forms(target: str, policies: tuple[Policy, ...] = POLICIES) -> list[tuple[str, CliForm]]:
    """(REST path suffix, CLI form) of each policy settable on ``target`` that has CLI verbs."""
    return [(p.path_for(target), p.cli) for p in policies if p.cli is not None and target in p.scopes]


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
