"""Time in compaction (``compaction.lag``): the age of the oldest uncompacted message, the last
entry a run may compact under a minimum lag, and the runner's horizon honouring it -- with
publish times written into the ledger and the runner's clock passed in (no Spark: the engine
here only records the plan it is given)."""

from __future__ import annotations

import pytest

from compactmq.compaction.lag import compaction_lag_ms, entry_before, first_uncompacted, last_compactable
from compactmq.compaction.runner import CompactionRunner
from compactmq.config import load_config
from compactmq.storage import COMPACTION_MIN_LAG, Position, Storage
from compactmq.compaction.state import states_of

T = "persistent://public/default/lag"
NOW = 5_000_000_000  # ms


@pytest.fixture
def storage(tmp_path):
    s = Storage(tmp_path / "data", load_config(overrides={"dataDir": str(tmp_path / "data")}))
    yield s
    s.close()


def _three_ledgers(storage):
    """Ledger A: entries at NOW-50 s, -40 s; ledger B: -30 s, -20 s; ledger C: -10 s, now."""
    ml = storage.open_managed_ledger(T)
    ids = []
    for times in ([NOW - 50_000, NOW - 40_000], [NOW - 30_000, NOW - 20_000], [NOW - 10_000, NOW]):
        ids.append(ml.append_many([b"e"] * len(times), times)[0].ledger_id)
        ml.rollover()
    return ml, ids


def test_oldest_uncompacted_and_lag(storage):
    ml, (a, b, c) = _three_ledgers(storage)
    assert first_uncompacted(ml, None) == Position(a, 0)
    assert compaction_lag_ms(ml, None, NOW) == 50_000
    assert first_uncompacted(ml, Position(a, 1)) == Position(b, 0)  # across a ledger boundary
    assert compaction_lag_ms(ml, Position(a, 1), NOW) == 30_000
    assert compaction_lag_ms(ml, Position(b, 0), NOW) == 20_000  # inside a ledger: from its index
    assert first_uncompacted(ml, Position(c, 1)) is None
    assert compaction_lag_ms(ml, Position(c, 1), NOW) == 0


def test_last_compactable_under_a_minimum_lag(storage):
    ml, (a, b, c) = _three_ledgers(storage)
    assert last_compactable(ml, 0, NOW) == Position(c, 1)
    assert last_compactable(ml, 15, NOW) == Position(b, 1)  # -10 s and now are too young
    assert last_compactable(ml, 20, NOW) == Position(b, 1)  # exactly 20 s old: compactable
    assert last_compactable(ml, 21, NOW) == Position(b, 0)
    assert last_compactable(ml, 45, NOW) == Position(a, 0)
    assert last_compactable(ml, 51, NOW) is None
    assert entry_before(ml, Position(b, 0)) == Position(a, 1)
    assert entry_before(ml, Position(a, 0)) is None


class RecordingEngine:
    """An engine that writes nothing and keeps the plan (the horizon is the runner's choice)."""

    parallelism = 1

    def __init__(self):
        self.last_stats = {}
        self.plans = []

    def run(self, plan, strategy, report):
        self.plans.append(plan)
        return []


def test_runner_horizon_stops_before_messages_younger_than_the_minimum_lag(storage):
    ml, (a, b, c) = _three_ledgers(storage)
    storage.policies.set_topic_policy(T, COMPACTION_MIN_LAG, 60)
    engine = RecordingEngine()
    clock = [NOW / 1000]

    def run():
        return CompactionRunner(storage, T, load_config(), engine, clock=lambda: clock[0]).run()

    result = run()  # everything is younger than 60 s: an empty run, no view, no horizon
    assert result.horizon is None and not engine.plans
    assert states_of(storage).get(T).status == "SUCCESS" and states_of(storage).get(T).horizon is None
    storage.policies.set_topic_policy(T, COMPACTION_MIN_LAG, 25)
    result = run()
    assert result.horizon == Position(b, 0)  # -30 s is old enough, -20 s is not
    assert [(s.ledger_id, s.entry_lo) for s in engine.plans[-1].segments] == [(a, 0), (b, 0)]
    assert states_of(storage).get(T).horizon == Position(b, 0)
    clock[0] += 100  # all old enough now
    result = run()
    assert result.horizon == Position(c, 1)


def test_key_ttl_and_tombstone_retention_need_keep_latest(storage):
    from compactmq.errors import CompactionError
    from compactmq.storage import COMPACTED_VIEW_KEY_TTL, COMPACTION_STRATEGY

    _three_ledgers(storage)
    storage.policies.set_topic_policy(T, COMPACTION_STRATEGY, "keep-first")
    storage.policies.set_topic_policy(T, COMPACTED_VIEW_KEY_TTL, 60)
    engine = RecordingEngine()
    with pytest.raises(CompactionError, match="keep-latest"):
        CompactionRunner(storage, T, load_config(), engine, clock=lambda: NOW / 1000).run()
    assert not engine.plans and states_of(storage).get(T).status == "ERROR"


def test_packed_cut_orders_like_message_ids():
    from compactmq.compaction import entry_scan as es
    from compactmq.compaction.plan import build_segments, packed_cut

    # ledger 5: compacted part (ids <= 5:3) then live part; ledger 7 live
    segs = build_segments(
        {"path": "c", "ledgers": {5: (2, 0)}},
        [
            {"ledger_id": 5, "path": "l5", "lo": 4, "hi": 1 << 40, "count": 3},
            {"ledger_id": 7, "path": "l7", "lo": 0, "hi": 9, "count": 10},
        ],
    )
    packed = {
        (5, 1): es.pack_positions(0, [1], [0])[0],
        (5, 3): es.pack_positions(0, [3], [2])[0],
        (5, 4): es.pack_positions(1, [4], [0])[0],
        (7, 0): es.pack_positions(2, [0], [0])[0],
        (7, 9): es.pack_positions(2, [9], [1])[0],
    }
    for cut in [(5, 0), (5, 2), (5, 4), (5, 5), (6, 0), (7, 0), (7, 5), (8, 0)]:
        c = packed_cut(segs, cut)
        assert {pos: p >= c for pos, p in packed.items()} == {pos: pos >= cut for pos in packed}, cut
