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

from compactmq.config import load_config
from compactmq.storage import (
    COMPACTED_VIEW_KEY_TTL,
    COMPACTION_MIN_LAG,
    COMPACTION_TOMBSTONE_RETENTION,
    Storage,
)

from . import entries as E
from .reference import ReferenceCompactor

pytestmark = pytest.mark.spark

keys = st.sampled_from(["a", "b", "c", "d", "a", None])
payloads = st.one_of(st.just(b""), st.binary(min_size=1, max_size=4))
message = st.tuples(keys, payloads, st.just(0))
entry = st.one_of(
    st.builds(lambda m: E.single(m[0], m[1]), message),
    st.builds(lambda ms: E.batch(ms), st.lists(message, min_size=1, max_size=4)),
)
entries = st.lists(entry, min_size=0, max_size=6)
# per topic: its policy, round one (old), round two's old part, round two's young part
topic_spec = st.tuples(st.sampled_from(["none", "ttl", "min-lag"]), entries, entries, entries)

# Publish times sit far from every cut: a young message stays younger than the minimum lag for
# 500 s after the test starts (at 50 s, a loaded CI machine reached the second round after the
# young messages had come of age, so the runs and the model, which look at the clock a few
# seconds apart, disagreed about them).
TTL_S, MIN_LAG_S = 2000, 500


def _view(service):
    return [(tuple(p), E.decode(b)[1]) for p, b in service.read_compacted_entries((-1, -1), 10**9)]


def _open(data_dir: str):
    from compactmq.compaction import load_factory

    cfg = load_config(overrides={"managedLedgerSyncData": False, "managedLedgerMaxEntriesPerLedger": 3})
    storage = Storage(data_dir, cfg)
    return storage, load_factory(cfg, storage)


def _set_policies(storage, topics, specs):
    for topic, (policy, *_rest) in zip(topics, specs):
        if policy == "ttl":
            storage.policies.set_topic_policy(topic, COMPACTED_VIEW_KEY_TTL, TTL_S)
            storage.policies.set_topic_policy(topic, COMPACTION_TOMBSTONE_RETENTION, TTL_S)
        elif policy == "min-lag":
            storage.policies.set_topic_policy(topic, COMPACTION_MIN_LAG, MIN_LAG_S)


def _expect(model, policy, ml, now_ms, appended):
    """Compact the model over what a run may read now: with a minimum lag, only the messages
    older than it; with a TTL, the cuts the run takes from the publish times."""
    readable = [(p, b) for p, b, t in appended if policy != "min-lag" or t < now_ms - MIN_LAG_S * 1000]
    if policy == "ttl":
        cut = tuple(ml.find_position_by_publish_time(now_ms - TTL_S * 1000))
        model.drop_before = model.tombstones_from = cut
    first = ml.first_position()
    model.compact(readable, first and tuple(first))


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
    opened = [_open(d) for d in dirs]
    try:
        for storage, _ in opened:
            for topic in topics:
                storage.open_managed_ledger(topic)  # created, even when nothing is appended
            _set_policies(storage, topics, specs)
        # per store (ledger ids differ between the two: compacted ledgers take ids from the
        # same counter, in the order the runs allocate them): a model and what was appended
        models = [[ReferenceCompactor("keep-latest") for _ in topics] for _ in opened]
        appended: list = [[[] for _ in topics] for _ in opened]  # (position, bytes, publish time)
        for rnd, parts in ((0, (1,)), (1, (2, 3))):
            for i, (topic, spec) in enumerate(zip(topics, specs)):
                for part in parts:
                    batch, t = spec[part], times[part - 1]
                    for k, (storage, _) in enumerate(opened):
                        got = storage.open_managed_ledger(topic).append_many(batch, [t] * len(batch))
                        appended[k][i].extend((tuple(p), b, t) for p, b in zip(got, batch))
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
                    _expect(model, specs[i][0], ml, run_ms, appended[k][i])
                    first = ml.first_position()
                    expected = [(tuple(p), m) for p, m in model.view(first and tuple(first))]
                    assert _view(services[i]) == expected, (rnd, ("joint", "single")[k], topic, specs[i][0])
                    h = services[i].get_last_compacted_position()
                    assert (tuple(h) if h else None) == model.horizon
            for s in [*joint, *single]:
                s.close()
    finally:
        for (storage, factory), d in zip(opened, dirs):
            factory.close()
            storage.close()
            shutil.rmtree(d, ignore_errors=True)
