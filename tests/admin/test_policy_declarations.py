"""The one declaration per policy (admin.policies): its spelled-out metadata keys are the broker's
own constants, and importing it (as the CLI does) loads no broker, storage or web code."""

from __future__ import annotations

import subprocess
import sys

from compactmq.admin import policy_values as v
from compactmq.admin.policies import NAMESPACE, POLICIES, TOPIC, cli_forms
from compactmq.broker import dedup, schema_compat
from compactmq.compaction import hooks
from compactmq.storage import policy_keys


def test_spelled_out_keys_are_the_brokers_constants():
    assert (v.COMPACTION_THRESHOLD, v.RETENTION_TIME_MINUTES, v.RETENTION_SIZE_MB) == (
        policy_keys.COMPACTION_THRESHOLD,
        policy_keys.RETENTION_TIME_MINUTES,
        policy_keys.RETENTION_SIZE_MB,
    )
    assert (v.COMPACTION_STRATEGY, v.RETAIN_NULL_KEY, v.COMPACTION_RETENTION_MODE) == (
        policy_keys.COMPACTION_STRATEGY,
        policy_keys.RETAIN_NULL_KEY,
        policy_keys.COMPACTION_RETENTION_MODE,
    )
    assert (v.COMPACTION_MAX_LAG, v.COMPACTION_MIN_LAG) == (
        policy_keys.COMPACTION_MAX_LAG,
        policy_keys.COMPACTION_MIN_LAG,
    )
    assert (v.COMPACTION_TOMBSTONE_RETENTION, v.COMPACTED_VIEW_KEY_TTL) == (
        policy_keys.COMPACTION_TOMBSTONE_RETENTION,
        policy_keys.COMPACTED_VIEW_KEY_TTL,
    )
    assert v.DEDUP_KEY == dedup.POLICY_KEY
    assert (v.STRATEGY_KEY, v.AUTO_UPDATE_KEY, v.VALIDATION_KEY) == (
        schema_compat.STRATEGY_KEY,
        schema_compat.AUTO_UPDATE_KEY,
        schema_compat.VALIDATION_KEY,
    )
    assert v.EXPORT_KEY == hooks.POLICY_KEY


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
