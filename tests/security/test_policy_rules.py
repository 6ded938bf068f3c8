"""The rules of ``auth.policy_rules`` and the places that apply them at use, without a broker:
every policy key has a rule and docs/security.md names it; the export location is derived and
stays under its root; a Parquet re-export deletes only what an export made; offload locations
and strategy names are checked before anything is written, signed or imported."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from compactmq.auth.policy_rules import RULES, Target, check_policy_values
from compactmq.config import SETTINGS, load_config
from compactmq.errors import InvalidConfiguration, PreconditionFailed
from compactmq.compaction.state import states_of

DOC = Path(__file__).resolve().parents[2] / "docs" / "security.md"
#: broker settings that widen what a tenant-set value may reach
WIDENING = (
    "compactedExportRoot",
    "compactedExportObjectStoreRoots",
    "topicCompactionStrategyAllowedClasses",
    "topicCompactionStrategy",
    "managedLedgerOffloadAllowedLocations",
    "maxNumPartitionsPerPartitionedTopic",
)


def target(topic: str | None = "persistent://acme/ops/t", **config) -> Target:
    return Target(load_config(overrides=config), "acme/ops", topic)


def test_every_policy_key_has_a_rule_and_unknown_keys_are_refused():
    from compactmq.admin.offload import POLICIES as OFFLOAD
    from compactmq.admin.policies import POLICIES
    from compactmq.broker.namespaces import POLICY_KEY as AUTO_TOPIC_CREATION

    keys = {k for p in (*POLICIES, *OFFLOAD) for k in p.keys} | {AUTO_TOPIC_CREATION}
    assert keys - set(RULES) == set()
    with pytest.raises(PreconditionFailed, match="no rule"):
        check_policy_values({"somethingNew": "/etc"}, target())
    assert check_policy_values({"compactionStrategy": None}, target()) == {"compactionStrategy": None}


def test_security_doc_names_every_rule_and_widening_setting():
    text = DOC.read_text()
    missing = [k for k in (*RULES, *WIDENING) if f"`{k}`" not in text]
    assert not missing, f"docs/security.md does not name: {missing}"
    assert all(k in SETTINGS for k in WIDENING)


def test_strategy_names_only_built_ins_and_the_operators_list():
    assert (
        check_policy_values({"compactionStrategy": "event-time"}, target())["compactionStrategy"]
        == "event-time"
    )
    with pytest.raises(PreconditionFailed, match="not allowed"):
        check_policy_values(
            {"compactionStrategy": "tests.compaction.user_strategy.LongestPayloadWins"}, target()
        )
    allowed = target(
        topicCompactionStrategyAllowedClasses="tests.compaction.user_strategy.LongestPayloadWins"
    )
    name = "tests.compaction.user_strategy.LongestPayloadWins"
    assert check_policy_values({"compactionStrategy": name}, allowed)["compactionStrategy"] == name
    own = target(topicCompactionStrategy="a.b.Mine")  # the operator's own default counts as allowed
    assert check_policy_values({"compactionStrategy": "a.b.Mine"}, own)["compactionStrategy"] == "a.b.Mine"
    assert "a" not in sys.modules


def test_spark_latest_read_checks_the_strategy_against_its_own_option():
    from compactmq.spark.compacted_view import checked_strategy
    from compactmq.spark.options import parse_read_options

    assert checked_strategy(None, ()) == "keep-latest"
    assert checked_strategy("keep-first", ()) == "keep-first"
    with pytest.raises(InvalidConfiguration, match="not allowed"):
        checked_strategy("multiprocessing.pool.Pool", ())
    opts = parse_read_options({"topic": "t", "path": "/x", "compactionStrategyClasses": " a.B , c.D "})
    assert opts.strategy_classes == ("a.B", "c.D")
    assert checked_strategy("c.D", opts.strategy_classes) == "c.D"


def test_export_needs_a_root_and_derives_the_location(tmp_path):
    with pytest.raises(PreconditionFailed, match="compactedExportRoot"):
        check_policy_values({"compactedExport": {"format": "parquet"}}, target())
    root = tmp_path / "exports"
    root.mkdir()
    got = check_policy_values({"compactedExport": {}}, target(compactedExportRoot=str(root)))
    assert got["compactedExport"]["path"] == os.path.join(
        os.path.realpath(root), "persistent", "acme", "ops", "t"
    )
    ns = check_policy_values({"compactedExport": {}}, target(None, compactedExportRoot=str(root)))
    assert ns["compactedExport"]["path"] == os.path.join(os.path.realpath(root), "persistent", "acme", "ops")


def test_export_location_never_leaves_the_root_through_a_symlink(tmp_path):
    from compactmq.compaction.hooks import export_location

    root = tmp_path / "exports"
    outside = tmp_path / "outside"
    (root / "persistent").mkdir(parents=True)
    outside.mkdir()
    os.symlink(outside, root / "persistent" / "acme")  # planted by someone with a shell
    config = load_config(overrides={"compactedExportRoot": str(root)})
    with pytest.raises(InvalidConfiguration, match="outside the export root"):
        export_location(config, "persistent://acme/ops/t", {})
    assert export_location(config, "persistent://other/ops/t", {}).startswith(os.path.realpath(root))


def test_parquet_re_export_deletes_only_what_an_export_made(tmp_path):
    pa = pytest.importorskip("pyarrow")
    from compactmq.spark.export import VERSION_MARKER, read_back, versions_dir, write_table

    path = str(tmp_path / "t")
    rows = pa.table({"__key": ["a", "b"], "value": [b"1", b"2"]})
    write_table(rows, path, "parquet")
    first = os.path.realpath(path)
    foreign = Path(versions_dir(path)) / "not-mine"  # a directory the export did not create
    foreign.mkdir()
    (foreign / "data").write_text("keep")
    write_table(rows.slice(0, 1), path, "parquet", ["__key"])
    assert read_back(path, "parquet").to_pydict()["__key"] == ["a"]
    assert not os.path.exists(first) and os.path.exists(os.path.join(os.path.realpath(path), VERSION_MARKER))
    assert (foreign / "data").read_text() == "keep"
    # a real directory at the table's place was not made by an export: refused, untouched
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "precious").write_text("x")
    with pytest.raises(InvalidConfiguration, match="was not written by a compacted export"):
        write_table(rows, str(taken), "parquet")
    assert (taken / "precious").read_text() == "x"


def test_offload_locations_are_the_brokers_own_or_listed():
    from compactmq.storage.offload.blobstore import OffloadLocation, allowed_locations, check_location_allowed

    own = {"managedLedgerOffloadDriver": "aws-s3", "s3ManagedLedgerOffloadBucket": "prod"}
    config = load_config(
        overrides={
            **own,
            "managedLedgerOffloadAllowedLocations": "filesystem=file:///mnt/o, S3=team@http://minio:9000",
        }
    )
    assert allowed_locations(config) == [
        ("s3", "prod", ""),
        ("filesystem", "file:///mnt/o", ""),
        ("s3", "team", "http://minio:9000"),
    ]
    check_location_allowed(OffloadLocation("aws-s3", "prod"), config)
    check_location_allowed(OffloadLocation("s3", "team", endpoint="http://minio:9000/"), config)
    for loc in (
        OffloadLocation("s3", "prod", endpoint="http://attacker:9000"),  # the bucket name, elsewhere
        OffloadLocation("s3", "team"),  # the listed bucket, but on AWS rather than the listed endpoint
        OffloadLocation("filesystem", "file:///mnt/o/../../etc"),
    ):
        with pytest.raises(InvalidConfiguration, match="not allowed"):
            check_location_allowed(loc, config)
    with pytest.raises(InvalidConfiguration, match="driver=bucket-or-URI"):
        allowed_locations(load_config(overrides={"managedLedgerOffloadAllowedLocations": "just-a-bucket"}))
    t = Target(config, "acme/ops")
    for bad in (
        {
            "managedLedgerOffloadDriver": "S3",
            "s3ManagedLedgerOffloadBucket": "prod",
            "s3ManagedLedgerOffloadRegion": "x.evil/",
        },
        {
            "managedLedgerOffloadDriver": "S3",
            "s3ManagedLedgerOffloadBucket": "prod",
            "fileSystemURI": "file:///",
        },
    ):
        with pytest.raises(PreconditionFailed):
            check_policy_values({"offloadPolicies": bad}, t)


def test_offloader_refuses_a_stored_location_it_was_never_allowed(tmp_path):
    """A namespace policy written before the allowlist (or straight into the metadata store) is
    checked again where the offloader uses it."""
    from compactmq.storage import Storage

    config = load_config(overrides={"dataDir": str(tmp_path / "data")})
    storage = Storage(tmp_path / "data", config)
    try:
        storage.resources.tenants.create("acme", {"adminRoles": []})
        storage.resources.namespaces.create("acme/ops", {})
        storage.policies.set_policies(
            "namespace",
            "acme/ops",
            {
                "offloadPolicies": {
                    "managedLedgerOffloadDriver": "filesystem",
                    "fileSystemURI": f"file://{tmp_path}",
                }
            },
        )
        with pytest.raises(InvalidConfiguration, match="not allowed"):
            storage.offloader.location_for("persistent://acme/ops/t")
    finally:
        storage.close()


def test_partition_counts_follow_the_operators_limit():
    limited = target(maxNumPartitionsPerPartitionedTopic="4")
    body = {"allowAutoTopicCreation": True, "topicType": "partitioned", "defaultNumPartitions": 5}
    with pytest.raises(PreconditionFailed, match="maxNumPartitionsPerPartitionedTopic"):
        check_policy_values({"autoTopicCreation": body}, limited)
    assert check_policy_values({"autoTopicCreation": {**body, "defaultNumPartitions": 4}}, limited)


def test_compaction_run_refuses_a_stored_strategy_it_was_never_allowed(tmp_path):
    """A policy stored before the rule (or straight into the metadata store) naming a class: the
    run fails with the rule's reason, having imported nothing."""
    from compactmq.compaction.runner import CompactionRunner
    from compactmq.errors import CompactMQError
    from compactmq.storage import COMPACTION_STRATEGY, Storage

    topic = "persistent://public/default/stored"
    config = load_config(overrides={"dataDir": str(tmp_path / "data")})
    storage = Storage(tmp_path / "data", config)
    plans: list = []

    class Engine:  # records plans; the run must stop before it plans anything
        parallelism = 1
        last_stats: dict = {}

        def run(self, plan, strategy, report):
            plans.append(plan)
            return []

    try:
        storage.open_managed_ledger(topic).append_many([b"e", b"e"], [1, 2])
        storage.policies.set_topic_policy(topic, COMPACTION_STRATEGY, "cmq_never_imported_mod.Evil")
        with pytest.raises(CompactMQError, match="not allowed on this broker"):
            CompactionRunner(storage, topic, config, Engine()).run()
        assert not plans and states_of(storage).get(topic).status == "ERROR"
        assert "cmq_never_imported_mod" not in sys.modules
    finally:
        storage.close()


def test_spark_latest_plan_refuses_a_policy_class_before_reading(tmp_path):
    """A data directory whose topic policy names a class (stored by any means): a ``view=latest``
    read plans nothing and imports nothing unless its own option lists the class."""
    from compactmq.spark.options import parse_read_options
    from compactmq.spark.source import plan_read
    from compactmq.storage import COMPACTION_STRATEGY, Storage

    topic = "persistent://public/default/latest"
    data = tmp_path / "data"
    storage = Storage(data, load_config(overrides={"dataDir": str(data)}))
    try:
        storage.open_managed_ledger(topic).append_many([b"e"], [1])
        storage.policies.set_topic_policy(topic, COMPACTION_STRATEGY, "cmq_never_imported_mod2.Evil")
    finally:
        storage.close()
    opts = {"topic": topic, "path": str(data), "view": "latest"}
    with pytest.raises(InvalidConfiguration, match="not allowed"):
        plan_read(parse_read_options(opts))
    assert "cmq_never_imported_mod2" not in sys.modules
    assert plan_read(parse_read_options({**opts, "view": "compacted"})) is not None  # the rule is latest's
