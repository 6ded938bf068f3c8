"""Random topics with per-topic compaction policies, and what the reference model expects of a
run over them: what the property tests of the in-process engine, the fused Spark job and joint
runs share (``test_inprocess_engine``, ``test_fused_job``, ``test_joint_topics_parity``).

A ``topic_spec`` is (policy, round one, round two's old part, round two's young part): the
policy is "none", "ttl" (a key TTL with tombstone retention) or "min-lag"; each part is a list of
entries (single messages or batches) over a few shared keys, with tombstones and keyless
messages. A test appends the parts with publish times far from every cut (``TTL_S``,
``MIN_LAG_S``), runs its compactions, and compares each view with ``expect``'s model.
"""

from __future__ import annotations

from hypothesis import strategies as st

from compactmq.config import load_config
from compactmq.storage import (
    COMPACTED_VIEW_KEY_TTL,
    COMPACTION_MIN_LAG,
    COMPACTION_TOMBSTONE_RETENTION,
    Storage,
)

from . import entries as E

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


def open_store(data_dir: str, **overrides):
    """A store whose ledgers roll every 3 entries, and the configured compaction factory."""
    from compactmq.compaction import load_factory

    cfg = load_config(
        overrides={"managedLedgerSyncData": False, "managedLedgerMaxEntriesPerLedger": 3, **overrides}
    )
    storage = Storage(data_dir, cfg)
    return storage, load_factory(cfg, storage)


def view_of(service) -> list:
    """The service's compacted view: (position, payload) of every entry."""
    return [(tuple(p), E.decode(b)[1]) for p, b in service.read_compacted_entries((-1, -1), 10**9)]


def set_policy(storage, topic: str, policy: str) -> None:
    if policy == "ttl":
        storage.policies.set_topic_policy(topic, COMPACTED_VIEW_KEY_TTL, TTL_S)
        storage.policies.set_topic_policy(topic, COMPACTION_TOMBSTONE_RETENTION, TTL_S)
    elif policy == "min-lag":
        storage.policies.set_topic_policy(topic, COMPACTION_MIN_LAG, MIN_LAG_S)


def expect(model, policy: str, ml, now_ms: int, appended) -> None:
    """Compact the model over what a run may read now: with a minimum lag, only the messages
    older than it; with a TTL, the cuts the run takes from the publish times."""
    readable = [(p, b) for p, b, t in appended if policy != "min-lag" or t < now_ms - MIN_LAG_S * 1000]
    if policy == "ttl":
        cut = tuple(ml.find_position_by_publish_time(now_ms - TTL_S * 1000))
        model.drop_before = model.tombstones_from = cut
    first = ml.first_position()
    model.compact(readable, first and tuple(first))


def append_parts(storage, topics: list[str], specs, parts, times: list[int], appended: list[list]) -> None:
    """Append the ``parts`` (1, 2, 3) of each topic's spec, topic after topic, part ``n`` at
    publish time ``times[n - 1]``; each appended entry is recorded as (position, bytes, publish
    time) in ``appended[i]`` for topic ``i``."""
    for i, (topic, spec) in enumerate(zip(topics, specs)):
        for part in parts:
            batch, t = spec[part], times[part - 1]
            got = storage.open_managed_ledger(topic).append_many(batch, [t] * len(batch))
            appended[i].extend((tuple(p), b, t) for p, b in zip(got, batch))


def expected_view(model, policy: str, ml, now_ms: int, appended) -> list:
    """``expect`` the model over ``appended``, then the view it holds from the ledger's first
    position: what the compacted view must be."""
    expect(model, policy, ml, now_ms, appended)
    first = ml.first_position()
    return [(tuple(p), m) for p, m in model.view(first and tuple(first))]
