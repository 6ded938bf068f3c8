"""Small keep-latest runs without a Spark job (``compaction.jobs.inprocess``), against the
reference model: random topics with tombstones, keyless messages and per-topic policies (a key
TTL with tombstone retention, a minimum lag, or none), two incremental rounds (the second a
lookup run over the first's chain, with messages the minimum lag holds back). No JVM starts:
the runs' engine is the in-process one, chosen by ``compactionInProcessMaxBytes`` through the
default factory's own engine or handed in directly."""

from __future__ import annotations

import shutil
import tempfile
import time

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from compactmq.compaction.jobs import SparkEngine, local_parallelism
from compactmq.compaction.jobs.inprocess import InProcessEngine, plan_bytes, suits

from . import entries as E
from .policy_topics import append_parts, expected_view, open_store, set_policy, topic_spec, view_of
from .reference import ReferenceCompactor

BIG = 1 << 30


class Recording(InProcessEngine):
    """The in-process engine, remembering whether each run was a lookup run."""

    def __init__(self) -> None:
        super().__init__()
        self.deltas: list[bool] = []

    def run(self, plan, strategy, report):
        self.deltas.append(bool(plan.is_lookup_run))
        return super().run(plan, strategy, report)


@settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck))
@given(specs=st.lists(topic_spec, min_size=1, max_size=3))
def test_in_process_runs_match_the_reference(specs):
    topics = [f"persistent://public/default/small-{i}" for i in range(len(specs))]
    now = int(time.time() * 1000)
    times = [now - 3_000_000, now - 1_000_000, now]  # round one; round two old; round two young
    d = tempfile.mkdtemp(prefix="cmq-inprocess-")
    storage, factory = open_store(d)
    engine = Recording()
    try:
        models = [ReferenceCompactor("keep-latest") for _ in topics]
        appended: list = [[] for _ in topics]
        for topic, spec in zip(topics, specs):
            storage.open_managed_ledger(topic)
            set_policy(storage, topic, spec[0])
        for rnd, parts in ((0, (1,)), (1, (2, 3))):
            append_parts(storage, topics, specs, parts, times, appended)
            for i, topic in enumerate(topics):
                service = factory.new_service(topic)
                try:
                    result = service.compact(engine=engine)
                    ml = storage.open_managed_ledger(topic, create=False)
                    expected = expected_view(models[i], specs[i][0], ml, int(time.time() * 1000), appended[i])
                    assert view_of(service) == expected, (rnd, topic, specs[i][0])
                    h = service.get_last_compacted_position()
                    assert (tuple(h) if h else None) == models[i].horizon
                    assert result.job is None  # no Spark job group
                finally:
                    service.close()
    finally:
        factory.close()
        storage.close()
        shutil.rmtree(d, ignore_errors=True)


def test_second_run_extends_the_chain_as_a_delta_run(tmp_path):
    """A run after a run: the in-process engine takes the lookup-run shape (``lookup_job.fused_parts``)
    and the view stays the reference's."""
    storage, factory = open_store(str(tmp_path))
    topic = "persistent://public/default/delta"
    model = ReferenceCompactor("keep-latest")
    appended = []
    engine = Recording()
    try:
        ml = storage.open_managed_ledger(topic)
        for rnd in range(3):
            batch = [E.single(f"k{(rnd * 7 + j) % 5}", b"" if j == 3 else b"v%d" % rnd) for j in range(6)]
            batch.append(E.batch([("k1", b"b", 0), (None, b"n", 0), ("k9", b"x", 0)]))
            got = ml.append_many(batch, [int(time.time() * 1000)] * len(batch))
            appended.extend(zip(map(tuple, got), batch))
            service = factory.new_service(topic)
            try:
                service.compact(engine=engine)
                model.compact(appended, tuple(ml.first_position()))
                assert view_of(service) == [(tuple(p), m) for p, m in model.view(tuple(ml.first_position()))]
            finally:
                service.close()
        # the first writes a chain, the second extends it (the third may rewrite it: the merge policy)
        assert engine.deltas[:2] == [False, True]
    finally:
        factory.close()
        storage.close()


def test_the_default_engine_runs_small_plans_in_process_and_large_ones_on_spark(tmp_path):
    """``compactionInProcessMaxBytes`` routes a run by the bytes it reads; with a local master
    planning asks no SparkSession, so a small run starts no JVM."""
    storage, factory = open_store(str(tmp_path), compactionInProcessMaxBytes=BIG)
    topic = "persistent://public/default/routed"
    try:
        ml = storage.open_managed_ledger(topic)
        ml.append_many([E.single(f"k{i % 3}", b"v%d" % i) for i in range(10)], [1000] * 10)
        service = factory.new_service(topic)
        engine = service.engine()
        assert isinstance(engine, SparkEngine) and engine.in_process_max_bytes == BIG
        result = service.compact()
        assert result.job is None and result.messages_kept == 3
        split = result.engine_seconds()
        assert split["count"] == 0  # no Spark job
        assert engine._spark is None
        service.close()
    finally:
        factory.close()
        storage.close()


def test_what_suits_the_in_process_engine(tmp_path):
    storage, factory = open_store(str(tmp_path))
    topic = "persistent://public/default/suits"
    try:
        ml = storage.open_managed_ledger(topic)
        ml.append_many([E.single(f"k{i}", b"x" * 100) for i in range(20)], [1000] * 20)
        ml.rollover()
        seen = []

        class Probe(InProcessEngine):
            def run(self, plan, strategy, report):
                seen.append(plan)
                return super().run(plan, strategy, report)

        service = factory.new_service(topic)
        service.compact(engine=Probe())
        service.close()
        plan = seen[0]
        size = plan_bytes(plan)
        assert size is not None and size >= 20 * 100
        assert suits(plan, size) and not suits(plan, size - 1) and not suits(plan, 0)
        other = type(plan)(**{**plan.__dict__, "strategy": "keep-first"})
        assert not suits(other, BIG)
        with pytest.raises(Exception, match="keep-latest"):
            InProcessEngine().run(other, None, lambda p: None)
    finally:
        factory.close()
        storage.close()


def test_local_parallelism_reads_the_master():
    assert local_parallelism({"spark.master": "local[3]"}) == 3
    assert local_parallelism({"spark.master": "local[2]", "spark.default.parallelism": "5"}) == 5
    assert local_parallelism({"spark.master": "local[*]"}) >= 1
    assert local_parallelism({"spark.master": "spark://h:7077"}) is None


def test_a_joint_run_compacts_small_topics_in_process_each_failing_alone(tmp_path):
    """``compact_together`` (the monitor's joint job) with small topics: no Spark job, each
    topic's view the reference's, and a topic whose run fails (a stored policy the API would
    refuse) leaves the others committed."""
    from compactmq.storage import COMPACTION_RETENTION_MODE

    storage, factory = open_store(str(tmp_path), compactionInProcessMaxBytes=BIG)
    topics = [f"persistent://public/default/joint-small-{i}" for i in range(4)]
    bad = topics[2]
    models = {}
    try:
        for i, topic in enumerate(topics):
            ml = storage.open_managed_ledger(topic)
            batch = [E.single(f"k{j % 3}", b"" if j == 4 else b"t%d-%d" % (i, j)) for j in range(7)]
            got = ml.append_many(batch, [1000] * len(batch))
            models[topic] = (ReferenceCompactor("keep-latest"), list(zip(map(tuple, got), batch)))
        storage.policies.set_topic_policy(bad, COMPACTION_RETENTION_MODE, "bogus")
        services = [factory.new_service(t) for t in topics]
        outcomes = factory.compact_together(services)
        assert isinstance(outcomes[2], Exception) and "bogus" in str(outcomes[2])
        assert factory.joint_jobs == 0  # not one Spark job
        for topic, service, outcome in zip(topics, services, outcomes):
            if topic == bad:
                assert service.get_last_compacted_position() is None
                continue
            assert outcome.job is None
            model, appended = models[topic]
            ml = storage.open_managed_ledger(topic, create=False)
            model.compact(appended, tuple(ml.first_position()))
            assert view_of(service) == [(tuple(p), m) for p, m in model.view(tuple(ml.first_position()))]
            service.close()
    finally:
        factory.close()
        storage.close()
