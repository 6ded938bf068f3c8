"""Property: the partitions of a partitioned topic compacted together in ONE Spark job
(``SparkCompactionServiceFactory.compact_together``) each give the view the reference model gives
for that partition alone. The partitions share key names (the same key in two partitions must
never merge), get different histories (one may be empty or have nothing new), are trimmed apart,
and may follow different strategies by topic policy; runs are incremental."""

from __future__ import annotations

import shutil
import tempfile
import time

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from compactmq.config import load_config
from compactmq.protocol import pulsar_pb2 as pb
from compactmq.storage import (
    COMPACTED_VIEW_KEY_TTL,
    COMPACTION_STRATEGY,
    COMPACTION_TOMBSTONE_RETENTION,
    Storage,
)
from compactmq.compaction.state import SUCCESS, states_of

from . import entries as E
from . import user_strategy
from .policy_topics import view_of
from .reference import ReferenceCompactor

pytestmark = pytest.mark.spark

BASE = "persistent://public/default/joint-parity"
PARTITIONS = 3
USER = "tests.compaction.user_strategy.LongestPayloadWins"
CODECS = [pb.NONE, pb.LZ4, pb.ZSTD]

keys = st.sampled_from(["a", "b", "c", "a", None])
payloads = st.one_of(st.just(b""), st.binary(min_size=1, max_size=4), st.binary(min_size=1, max_size=4))
message = st.tuples(keys, payloads, st.integers(0, 3))
entry = st.one_of(
    st.builds(lambda m: E.single(m[0], m[1], event_time=m[2]), message),
    st.builds(lambda m: E.single(m[0], m[1], event_time=m[2]), message),
    st.builds(
        lambda ms, c: E.batch(ms, codec=c), st.lists(message, min_size=1, max_size=4), st.sampled_from(CODECS)
    ),
    st.builds(lambda k: E.single(k, b"", marker=True), keys),
)
part = st.integers(0, PARTITIONS - 1)
step = st.one_of(
    st.tuples(st.just("append"), part, st.lists(entry, min_size=1, max_size=6)),
    st.tuples(st.just("append"), part, st.lists(entry, min_size=1, max_size=6)),
    st.tuples(st.just("compact"), st.just(0), st.just([])),
    st.tuples(st.just("trim"), part, st.just([])),
)


def _partition(i: int) -> str:
    return f"{BASE}-partition-{i}"


def _expected(model, first):
    return [(tuple(p), m) for p, m in model.view(first)]


@pytest.fixture(scope="module", autouse=True)
def _user_strategy_by_value():
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(user_strategy)
    yield
    cloudpickle.unregister_pickle_by_value(user_strategy)


def _open(overrides: dict):
    from compactmq.compaction import load_factory

    cfg = load_config(overrides={"managedLedgerSyncData": False, **overrides})
    data_dir = tempfile.mkdtemp(prefix="cmq-joint-parity-")
    storage = Storage(data_dir, cfg)
    return data_dir, storage, load_factory(cfg, storage)


def _compact_all(factory, services, ledgers, models):
    """Compact every partition together and the models one by one; each view must match."""
    for ml, model in zip(ledgers, models):
        first = ml.first_position()
        everything = ml.read_entries(first, 10**6) if first else []
        model.compact([(tuple(p), b) for p, b in everything], first and tuple(first))
    jobs = factory.joint_jobs
    outcomes = factory.compact_together(services)
    for outcome in outcomes:
        assert not isinstance(outcome, Exception), outcome
    for service, ml, model in zip(services, ledgers, models):
        first = ml.first_position()
        assert view_of(service) == _expected(model, first and tuple(first))
        h = service.get_last_compacted_position()
        assert (tuple(h) if h else None) == model.horizon
    return factory.joint_jobs - jobs


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    strategy=st.sampled_from(["keep-latest", "keep-first", "event-time", "longest"]),
    other=st.one_of(st.none(), st.sampled_from(["keep-latest", "keep-first"])),
    retain=st.booleans(),
    mode=st.sampled_from(["retention-bounded", "keep-until-tombstone"]),
    per_ledger=st.integers(2, 4),
    steps=st.lists(step, min_size=2, max_size=7),
)
def test_partitions_in_one_job_match_the_reference_each(
    spark, strategy, other, retain, mode, per_ledger, steps
):
    """``other``: partition 1's own strategy by topic policy (None: the same as the others)."""
    name = {"longest": USER}.get(strategy, strategy)
    data_dir, storage, factory = _open(
        {
            "managedLedgerMaxEntriesPerLedger": per_ledger,
            "topicCompactionRetainNullKey": retain,
            "topicCompactionRetentionMode": mode,
            "topicCompactionStrategy": name,
        }
    )
    try:
        ledgers = [storage.open_managed_ledger(_partition(i)) for i in range(PARTITIONS)]
        strategies = [strategy] * PARTITIONS
        if other is not None:
            storage.policies.set_topic_policy(_partition(1), COMPACTION_STRATEGY, other)
            strategies[1] = other
        models = [ReferenceCompactor(s, retain, mode) for s in strategies]
        services = [factory.new_service(_partition(i)) for i in range(PARTITIONS)]
        for kind, i, batch in [*steps, ("compact", 0, [])]:
            if kind == "append":
                ledgers[i].append_many(batch)
            elif kind == "trim":
                ledgers[i].trim_to_retention(retention_time_minutes=0, retention_size_mb=0)
            else:
                jobs = _compact_all(factory, services, ledgers, models)
                # one Spark job for all of them, two when a policy gives partition 1 its own
                # strategy (an aggregation per strategy); none when no partition has anything
                assert jobs <= len(set(strategies))
    finally:
        factory.close()
        storage.close()
        shutil.rmtree(data_dir, ignore_errors=True)


def test_one_job_group_with_per_partition_ttl_and_tombstone_retention(spark):
    """keep-latest with a key TTL and tombstone retention on partition 0 only (topic policies):
    partition 0 drops its old keys and keeps its young tombstones, partition 1 with the same keys
    and times keeps its old keys and drops its tombstones, partition 2 has nothing. One Spark
    job group ran all of them (the status tracker knows its jobs); each partition records it."""
    data_dir, storage, factory = _open(
        {"managedLedgerMaxEntriesPerLedger": 3, "topicCompactionRetainNullKey": True}
    )
    try:
        storage.policies.set_topic_policy(_partition(0), COMPACTED_VIEW_KEY_TTL, 500)
        storage.policies.set_topic_policy(_partition(0), COMPACTION_TOMBSTONE_RETENTION, 500)
        ledgers = [storage.open_managed_ledger(_partition(i)) for i in range(PARTITIONS)]
        services = [factory.new_service(_partition(i)) for i in range(PARTITIONS)]
        models = [ReferenceCompactor("keep-latest", True, "retention-bounded") for _ in range(PARTITIONS)]
        now = int(time.time() * 1000)
        old, young = now - 1_000_000, now  # far from the 500 s TTL: a slow run cannot move the cut
        history = [
            (E.single("a", b"a1"), old),
            (E.single("b", b"b1"), old),
            (E.single("c", b"c1"), old),
            (E.batch([("e", b"e1", 0), ("f", b"f1", 0), (None, b"n", 0)]), old),
            (E.single("c", b""), old),
            (E.single("a", b"a2"), young),
            (E.single("b", b""), young),
            (E.batch([("g", b"g1", 0), ("e", b"", 0), ("h", b"h1", 0)]), young),
        ]
        for ml in ledgers[:2]:
            ml.append_many([e for e, _ in history], [t for _, t in history])
        cut = tuple(ledgers[0].find_position_by_publish_time(now - 500_000))
        models[0].drop_before = models[0].tombstones_from = cut
        assert _compact_all(factory, services, ledgers, models) == 1
        views = [{m[1] for _, msgs in view_of(s) for m in msgs if not m[4]} for s in services]
        assert views == [{"a", "b", "e", "g", "h"}, {"a", "f", "g", "h", None}, set()]
        groups = {s.stats().last_run_job for s in services[:2]}
        assert len(groups) == 1 and None not in groups
        (group,) = groups
        assert group.startswith("compactmq-joint-")
        assert spark.sparkContext.statusTracker().getJobIdsForGroup(group)
        # a second run with nothing new: every partition keeps its view, still one job at most
        assert _compact_all(factory, services, ledgers, models) <= 1
        assert all(states_of(storage).get(_partition(i)).status == SUCCESS for i in range(2))
        # the joint job extended each partition's own chain of segments (compaction.chain)
        assert [s.compacted_ledger().manifest.runs for s in services[:2]] == [2, 2]
    finally:
        factory.close()
        storage.close()
        shutil.rmtree(data_dir, ignore_errors=True)


def test_a_partition_whose_commit_fails_keeps_its_view_and_the_others_commit(spark):
    """One Spark job; partition 1's run dies just before its commit: it keeps its previous view
    and records ERROR, partitions 0 and 2 commit theirs (commits are per partition)."""
    from compactmq.compaction.jobs import SparkCompactionService
    from compactmq.errors import CompactionError
    from compactmq.compaction.state import ERROR

    data_dir, storage, factory = _open({"managedLedgerMaxEntriesPerLedger": 4})
    fail = {"on": False}

    def abort_hook(point: str) -> None:
        if fail["on"] and point == "before-commit":
            raise CompactionError("the disk is full")

    try:
        ledgers = [storage.open_managed_ledger(_partition(i)) for i in range(PARTITIONS)]
        services = [
            SparkCompactionService(
                storage, _partition(i), storage.config, abort_hook=abort_hook if i == 1 else None
            )
            for i in range(PARTITIONS)
        ]
        models = [ReferenceCompactor() for _ in range(PARTITIONS)]
        for ml in ledgers:
            ml.append_many([E.single(k, b"1" + k.encode()) for k in "abc"])
        assert _compact_all(factory, services, ledgers, models) == 1
        before = [view_of(s) for s in services]
        for ml in ledgers:
            ml.append_many([E.single("a", b"2a"), E.single("b", b"")])
        fail["on"] = True
        jobs = factory.joint_jobs
        outcomes = factory.compact_together(services)
        assert factory.joint_jobs == jobs + 1
        assert isinstance(outcomes[1], CompactionError) and "the disk is full" in str(outcomes[1])
        assert not isinstance(outcomes[0], Exception) and not isinstance(outcomes[2], Exception)
        assert view_of(services[1]) == before[1]  # its previous view stays in force
        state = states_of(storage).get(_partition(1))
        assert state.status == ERROR and "the disk is full" in (state.last_error or "")
        for i in (0, 2):
            keys = [(m[1], m[2]) for _, msgs in view_of(services[i]) for m in msgs if not m[4]]
            assert keys == [("c", b"1c"), ("a", b"2a")]
        # the next run of partition 1 alone catches up
        fail["on"] = False
        services[1].compact()
        assert [(m[1], m[2]) for _, msgs in view_of(services[1]) for m in msgs if not m[4]] == [
            ("c", b"1c"),
            ("a", b"2a"),
        ]
    finally:
        factory.close()
        storage.close()
        shutil.rmtree(data_dir, ignore_errors=True)
