"""The one declaration per policy (admin.policies, over the keys and fallbacks of
config.policy_keys): every layer reads the same keys and defaults, each key has a rule on its
value, and importing the declarations (as the CLI does) loads no broker, storage or web code."""

from __future__ import annotations

import subprocess
import sys
import pytest

from compactmq.admin.policies import NAMESPACE, POLICIES, TOPIC, cli_forms, rest_path
from compactmq.auth.policy_rules import RULES
from compactmq.config import policy_keys as pk
from compactmq.config.keys import SETTINGS
from compactmq.broker import dedup, schema_compat
from compactmq.compaction import hooks
from compactmq.storage import policy_keys


def test_every_layer_reads_the_one_declaration_of_each_key():
    assert (
        policy_keys.COMPACTION_THRESHOLD,
        policy_keys.RETENTION_TIME_MINUTES,
        policy_keys.RETENTION_SIZE_MB,
        policy_keys.COMPACTION_STRATEGY,
        policy_keys.RETAIN_NULL_KEY,
        policy_keys.COMPACTION_RETENTION_MODE,
        policy_keys.COMPACTION_MAX_LAG,
        policy_keys.COMPACTION_MIN_LAG,
        policy_keys.COMPACTION_TOMBSTONE_RETENTION,
        policy_keys.COMPACTED_VIEW_KEY_TTL,
    ) == (
        pk.COMPACTION_THRESHOLD,
        pk.RETENTION_TIME_MINUTES,
        pk.RETENTION_SIZE_MB,
        pk.COMPACTION_STRATEGY,
        pk.RETAIN_NULL_KEY,
        pk.COMPACTION_RETENTION_MODE,
        pk.COMPACTION_MAX_LAG,
        pk.COMPACTION_MIN_LAG,
        pk.COMPACTION_TOMBSTONE_RETENTION,
        pk.COMPACTED_VIEW_KEY_TTL,
    )
    assert dedup.POLICY_KEY == pk.DEDUPLICATION_ENABLED
    assert (schema_compat.STRATEGY_KEY, schema_compat.AUTO_UPDATE_KEY, schema_compat.VALIDATION_KEY) == (
        pk.SCHEMA_COMPATIBILITY_STRATEGY,
        pk.SCHEMA_AUTO_UPDATE,
        pk.SCHEMA_VALIDATION_ENFORCED,
    )
    assert hooks.POLICY_KEY == pk.COMPACTED_EXPORT


def test_each_policy_falls_back_to_its_declared_setting():
    from compactmq.admin.offload import POLICIES as OFFLOAD_POLICIES  # loads storage: not at import

    for policy in POLICIES + OFFLOAD_POLICIES:
        assert dict(policy.config_defaults) == {
            key: pk.DEFAULT_SETTINGS[key] for key in policy.keys if key in pk.DEFAULT_SETTINGS
        }
    for key, setting in pk.DEFAULT_SETTINGS.items():
        assert setting in SETTINGS, f"{key} falls back to {setting}, which is not a declared setting"


def test_every_declared_policy_key_has_a_rule_on_its_value():
    declared = {key for policy in POLICIES for key in policy.keys}
    assert declared <= set(RULES)


def test_schema_defaults_are_the_brokers_config_keys():
    by_key = {p.keys[0]: p for p in POLICIES}
    for key, config_key in schema_compat.CONFIG_KEYS.items():
        assert by_key[key].config_defaults == {key: config_key}


def test_each_cli_verb_is_declared_once_per_target():
    for target in (TOPIC, NAMESPACE):
        verbs = [form.verb for _, form in cli_forms(target)]
        assert len(verbs) == len(set(verbs)) > 10
    dedup_paths = {
        target: dict((f.verb, s) for s, f in cli_forms(target))["deduplication"]
        for target in (TOPIC, NAMESPACE)
    }
    assert dedup_paths == {TOPIC: "deduplicationEnabled", NAMESPACE: "deduplication"}


def test_importing_the_declarations_loads_no_broker_code():
    code = (
        "import sys, compactmq.admin.policies\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('aiohttp', 'numpy') "
        "or m.startswith(('compactmq.broker', 'compactmq.storage', 'compactmq.compaction'))]\n"
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_rest_path_names_the_policy_that_stores_a_key():
    """What the Spark data source asks the admin API for (``spark.broker``): Pulsar's REST names,
    which differ from the stored key where Pulsar's do."""
    assert rest_path(pk.COMPACTION_STRATEGY) == "compactionStrategy"
    assert rest_path(pk.RETAIN_NULL_KEY) == "compactionRetainNullKey"
    assert rest_path(pk.RETENTION_SIZE_MB) == "retention"
    with pytest.raises(KeyError):
        rest_path("noSuchPolicyKey")
