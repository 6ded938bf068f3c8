"""A small full keep-latest run is ONE Spark job of one task (``compaction.jobs.fused``).

The number of Spark jobs, stages and tasks a run launches is pinned (a count, robust on a loaded
machine, where a time is not): a change that brings back a second job, a shuffle or a
count-before-write fails here. The views match the three-stage pipeline's and the reference
model's, with tombstones, keyless messages, a key TTL with tombstone retention and a minimum lag.
"""

from __future__ import annotations

import shutil
import tempfile
import time

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from compactmq.compaction.jobs import fused, pipeline
from harness.wait import wait_until

from . import entries as E
from .reference import ReferenceCompactor
from compactmq.compaction.jobs.inprocess import InProcessEngine, plan_bytes
from .policy_topics import append_parts, expected_view, open_store, set_policy, topic_spec, view_of
from .test_inprocess_engine import BIG


def _counts(sc, group: str) -> dict:
    """Jobs, stages that ran and their tasks of a job group (from Spark's status tracker, which a
    listener fills asynchronously: read once every job of the group reads as ended)."""
    tracker = sc.statusTracker()

    def ended():
        jobs = [tracker.getJobInfo(j) for j in tracker.getJobIdsForGroup(group)]
        return all(j is not None and j.status == "SUCCEEDED" for j in jobs)

    wait_until(ended, timeout=30, what=f"the jobs of {group} to read as ended")
    jobs = list(tracker.getJobIdsForGroup(group))
    stages = [tracker.getStageInfo(s) for j in jobs for s in tracker.getJobInfo(j).stageIds]
    ran = [s for s in stages if s is not None and s.numCompletedTasks > 0]
    return {"jobs": len(jobs), "stages": len(ran), "tasks": sum(s.numTasks for s in ran)}


def _small_topic(ml) -> None:
    """2,000 messages over 200 keys in batches of 100, some keys deleted, a keyless message."""
    entries = []
    for b in range(20):
        msgs = [(f"key-{(b * 100 + i) % 200:04d}", b"x" * 20, 0) for i in range(100)]
        entries.append(E.batch(msgs))
    entries += [E.single("key-0007", b""), E.single(None, b"keyless"), E.single("key-0008", b"")]
    ml.append_many(entries)


@pytest.mark.spark
def test_a_small_run_is_one_spark_job_of_one_task_and_writes_the_pipelines_view(spark, tmp_path):
    storage, factory = open_store(str(tmp_path), managedLedgerMaxEntriesPerLedger=50000)
    pipeline.partition_keys(spark, 1)  # the pipeline's first run would otherwise ask Spark once
    model = ReferenceCompactor("keep-latest")
    views, counts = {}, {}
    try:
        for shape in ("fused", "pipeline"):
            topic = f"persistent://public/default/{shape}"
            ml = storage.open_managed_ledger(topic)
            _small_topic(ml)
            service = factory.new_service(topic)
            engine = service.engine()
            assert engine.fused_max_bytes == fused.FUSED_MAX_BYTES  # the default
            if shape == "pipeline":
                engine.fused_max_bytes = 0
            result = service.compact(engine=engine)
            counts[shape] = _counts(spark.sparkContext, result.job)
            views[shape] = [m for _, m in view_of(service)]
            if shape == "fused":
                everything = ml.read_entries(ml.first_position(), 10**6)
                model.compact([(tuple(p), b) for p, b in everything], tuple(ml.first_position()))
                assert view_of(service) == [(tuple(p), m) for p, m in model.view(tuple(ml.first_position()))]
            service.close()
    finally:
        factory.close()
        storage.close()
    assert views["fused"] == views["pipeline"]
    live = {m[1] for entry in views["fused"] for m in entry if not m[4]}
    assert len(live) == 198 and "key-0007" not in live  # two of 200 keys deleted
    assert counts["fused"] == {"jobs": 1, "stages": 1, "tasks": 1}
    # what the one task saves: the pipeline's parsing stage, then (adaptive execution having
    # coalesced the shuffle to one partition) the aggregate and phase two, in a second job
    assert counts["pipeline"] == {"jobs": 2, "stages": 2, "tasks": 2}


@pytest.mark.spark
@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(specs=st.lists(topic_spec, min_size=1, max_size=2))
def test_fused_runs_match_the_reference(spark, specs):
    """Two rounds per topic: a full run (one task) then a lookup run; policies as the in-process
    engine's property (``test_inprocess_engine``)."""
    topics = [f"persistent://public/default/fused-{i}" for i in range(len(specs))]
    now = int(time.time() * 1000)
    times = [now - 3_000_000, now - 1_000_000, now]
    d = tempfile.mkdtemp(prefix="cmq-fused-")
    storage, factory = open_store(d)
    try:
        models = [ReferenceCompactor("keep-latest") for _ in topics]
        appended: list = [[] for _ in topics]
        for topic, spec in zip(topics, specs):
            storage.open_managed_ledger(topic)
            set_policy(storage, topic, spec[0])
        for parts in ((1,), (2, 3)):
            append_parts(storage, topics, specs, parts, times, appended)
            for i, topic in enumerate(topics):
                service = factory.new_service(topic)
                try:
                    result = service.compact()
                    if result.job is not None:  # a run that had work: one job of one task
                        assert _counts(spark.sparkContext, result.job)["jobs"] == 1
                    ml = storage.open_managed_ledger(topic, create=False)
                    expected = expected_view(models[i], specs[i][0], ml, int(time.time() * 1000), appended[i])
                    assert view_of(service) == expected, (topic, specs[i][0])
                finally:
                    service.close()
    finally:
        factory.close()
        storage.close()
        shutil.rmtree(d, ignore_errors=True)


def test_what_runs_as_one_task(tmp_path):
    """One group of a combining keep-latest full run within the bound; not another strategy, not
    two groups, not a lookup run, not over the bound, never with the bound 0. No Spark starts:
    the plan is the one the in-process engine is handed."""
    storage, factory = open_store(str(tmp_path))
    topic = "persistent://public/default/one-task"
    seen = []

    class Probe(InProcessEngine):
        def run(self, plan, strategy, report):
            seen.append(plan)
            return super().run(plan, strategy, report)

    try:
        ml = storage.open_managed_ledger(topic)
        ml.append_many([E.single(f"k{i}", b"x" * 100) for i in range(20)], [1000] * 20)
        service = factory.new_service(topic)
        service.compact(engine=Probe())
        ml.append_many([E.single("k1", b"y")], [2000])
        service.compact(engine=Probe())  # the second run: a lookup run
        service.close()
    finally:
        factory.close()
        storage.close()
    plan, lookup = seen
    assert len(plan.groups) == 1 and not plan.is_lookup_run and lookup.is_lookup_run
    size = plan_bytes(plan)
    assert size is not None and size >= 20 * 100
    assert fused.suits(plan) and fused.suits(plan, size) and not fused.suits(plan, size - 1)
    assert not fused.suits(plan, 0) and not fused.suits(lookup, BIG)
    assert not fused.suits(type(plan)(**{**plan.__dict__, "strategy": "keep-first"}), BIG)
    assert not fused.suits(type(plan)(**{**plan.__dict__, "groups": [[0], [1]]}), BIG)
