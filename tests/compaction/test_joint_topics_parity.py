"""Property: unrelated topics compacted together in ONE Spark job (what the compaction monitor
does with the topics due at a check: ``SparkCompactionServiceFactory.compact_together``) give
each topic the view it gets compacted alone, and both give the reference model's. The topics
share key names, histories with tombstones and keyless messages, and have per-topic policies:
a key TTL with tombstone retention (keep-latest), a minimum lag, or none. Runs are incremental:
two rounds, the second with messages young enough for the minimum lag to hold back."""

from __future__ import annotations

import shutil
import tempfile
import time

import pytest
from hypothesis import HealthCheck, Phase, given, settings, strategies as st

from .policy_topics import append_parts, expected_view, open_store, set_policy, topic_spec, view_of
from .reference import ReferenceCompactor

pytestmark = pytest.mark.spark


# no shrinking: every step of it would be Spark jobs
@settings(
    max_examples=5,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
@given(specs=st.lists(topic_spec, min_size=2, max_size=4))
def test_joint_and_single_runs_match_each_other_and_the_reference(spark, specs):
    topics = [f"persistent://public/default/joint-{i}" for i in range(len(specs))]
    now = int(time.time() * 1000)
    times = [now - 3_000_000, now - 1_000_000, now]  # round one; round two old; round two young
    dirs = [tempfile.mkdtemp(prefix="cmq-joint-topics-") for _ in range(2)]
    opened = [open_store(d) for d in dirs]
    try:
        for storage, _ in opened:
            for topic in topics:
                storage.open_managed_ledger(topic)  # created, even when nothing is appended
            for topic, spec in zip(topics, specs):
                set_policy(storage, topic, spec[0])
        # per store (ledger ids differ between the two: compacted ledgers take ids from the
        # same counter, in the order the runs allocate them): a model and what was appended
        models = [[ReferenceCompactor("keep-latest") for _ in topics] for _ in opened]
        appended: list = [[[] for _ in topics] for _ in opened]  # (position, bytes, publish time)
        for rnd, parts in ((0, (1,)), (1, (2, 3))):
            for k, (storage, _) in enumerate(opened):
                append_parts(storage, topics, specs, parts, times, appended[k])
            (_, joint_factory), (_, single_factory) = opened
            joint = [joint_factory.new_service(t) for t in topics]
            single = [single_factory.new_service(t) for t in topics]
            jobs = joint_factory.joint_jobs
            outcomes = joint_factory.compact_together(joint)
            assert not [o for o in outcomes if isinstance(o, Exception)], outcomes
            assert joint_factory.joint_jobs - jobs <= 1  # every topic in one Spark job
            for service in single:
                service.compact()
            run_ms = int(time.time() * 1000)
            for k, ((storage, _), services) in enumerate(zip(opened, (joint, single))):
                for i, topic in enumerate(topics):
                    ml = storage.open_managed_ledger(topic, create=False)
                    model = models[k][i]
                    expected = expected_view(model, specs[i][0], ml, run_ms, appended[k][i])
                    assert view_of(services[i]) == expected, (rnd, ("joint", "single")[k], topic, specs[i][0])
                    h = services[i].get_last_compacted_position()
                    assert (tuple(h) if h else None) == model.horizon
            for s in [*joint, *single]:
                s.close()
    finally:
        for (storage, factory), d in zip(opened, dirs):
            factory.close()
            storage.close()
            shutil.rmtree(d, ignore_errors=True)
