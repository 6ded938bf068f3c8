import pytest

from compactmq.storage import Position
from compactmq.storage.cursor import RangeSet
from compactmq.storage.position import pack


def test_rangeset_merges_and_splits():
    rs = RangeSet()
    for k in (5, 7, 6, 1, 2, 10):
        rs.add_range(k, k)
    assert rs.pairs() == [(1, 2), (5, 7), (10, 10)]
    rs.add_range(3, 9)
    assert rs.pairs() == [(1, 10)]
    rs.remove_through(4)
    assert rs.pairs() == [(5, 10)] and rs.count() == 6
    assert rs.contains(5) and not rs.contains(4) and not rs.contains(11)
    assert RangeSet.from_bytes(rs.to_bytes()).pairs() == rs.pairs()


def test_rangeset_add_many_sorted_runs():
    rs = RangeSet()
    rs.add_many([9, 3, 4, 5, 20, 8])
    assert rs.pairs() == [(3, 5), (8, 9), (20, 20)]


@pytest.fixture
def ml(open_storage):
    ml = open_storage(managedLedgerMaxEntriesPerLedger=5).open_managed_ledger("t")
    ml.positions = [ml.append(b"%d" % i) for i in range(12)]  # ledgers of 5, 5, 2
    return ml


def test_new_cursor_starts_before_the_first_entry(ml):
    c = ml.open_cursor("s")
    assert c.read_position == ml.positions[0]
    assert c.backlog() == 12
    latest = ml.open_cursor("l", initial_position="latest")
    assert latest.mark_delete_position == ml.positions[-1] and latest.backlog() == 0
    at = ml.open_cursor("at", initial_position=ml.positions[6])
    assert at.read_position == ml.positions[6] and at.backlog() == 6


def test_individual_acks_become_ranges_and_slide_mark_delete(ml):
    p = ml.positions
    c = ml.open_cursor("s")
    c.ack_individual([p[1], p[2], p[7]])
    assert c.mark_delete_position < p[0]
    assert c.individually_acked_ranges() == [(p[1], p[2]), (p[7], p[7])]
    assert c.is_acknowledged(p[2]) and not c.is_acknowledged(p[3])
    c.ack_individual([p[0]])
    assert c.mark_delete_position == p[2]
    # crossing a ledger boundary: p[4] is the last entry of the first ledger, p[5] the first of the next
    c.ack_individual([p[3], p[4], p[5], p[6]])
    assert c.mark_delete_position == p[7] and c.individually_acked_ranges() == []
    assert c.backlog() == 4


def test_cumulative_ack(ml):
    p = ml.positions
    c = ml.open_cursor("s")
    c.ack_individual([p[8], p[10]])
    c.ack_cumulative(p[7])
    assert c.mark_delete_position == p[8] and c.individually_acked_ranges() == [(p[10], p[10])]
    c.ack_cumulative(p[2])  # behind: ignored
    assert c.mark_delete_position == p[8]


def test_cursor_state_persists_across_restart(open_storage):
    st = open_storage(managedLedgerMaxEntriesPerLedger=5)
    ml = st.open_managed_ledger("t")
    p = [ml.append(b"%d" % i) for i in range(12)]
    c = ml.open_cursor("s")
    c.ack_individual([p[0], p[3], p[4], p[9]])
    c.set_property("owner", "me")
    ml.open_cursor("reader", durable=False)
    st.close()
    ml = open_storage(managedLedgerMaxEntriesPerLedger=5).open_managed_ledger("t")
    assert [c.name for c in ml.cursors()] == ["s"]  # non-durable cursors are not kept
    c = ml.open_cursor("s")
    assert c.mark_delete_position == p[0]
    assert c.individually_acked_ranges() == [(p[3], p[4]), (p[9], p[9])]
    assert c.properties == {"owner": "me"}


def test_million_acks_stay_small(ml, open_storage):
    """Acknowledging a million positions one by one (a hole left at the start) is one range."""
    c = ml.open_cursor("s")
    lid = ml.positions[0].ledger_id + 100  # a ledger id far ahead: positions need not exist
    step = 10_000
    for start in range(1, 1_000_001, step):
        c.ack_individual([Position(lid, e) for e in range(start, start + step)])
    ranges = c.individually_acked_ranges()
    assert ranges == [(Position(lid, 1), Position(lid, 1_000_000))]
    stored = ml._store.get_cursor(ml.topic, "s")
    assert len(stored.acked_ranges) == 16
    # every other entry acked: one range per ack, still only 16 bytes each
    c2 = ml.open_cursor("sparse")
    c2.ack_individual([Position(lid, e) for e in range(0, 20_000, 2)])
    assert len(c2.individually_acked_ranges()) == 10_000
    assert len(ml._store.get_cursor(ml.topic, "sparse").acked_ranges) == 160_000


def test_read_entries_skips_acked_and_moves_read_position(ml):
    p = ml.positions
    c = ml.open_cursor("s")
    c.ack_individual([p[1], p[2], p[6]])
    got = c.read_entries(4)
    assert [pos for pos, _ in got] == [p[0], p[3], p[4], p[5]]
    assert c.read_position == p[6]
    got = c.read_entries(100)
    assert [pos for pos, _ in got] == [p[7], p[8], p[9], p[10], p[11]]
    assert c.read_entries(10) == [] and not c.has_more_entries()
    c.rewind()
    assert c.read_position == p[0]
    c.seek(p[9])
    assert c.read_position == p[9]


def test_reset_forgets_acks_after_the_position(ml):
    p = ml.positions
    c = ml.open_cursor("s")
    c.ack_cumulative(p[8])
    c.ack_individual([p[10]])
    c.reset(p[3])
    assert c.read_position == p[3] and c.individually_acked_ranges() == [] and c.backlog() == 9


def test_delete_cursor(ml):
    ml.open_cursor("s")
    ml.delete_cursor("s")
    assert ml.cursors() == [] and ml._store.get_cursor(ml.topic, "s") is None


def test_new_appends_become_readable_to_a_caught_up_cursor(ml):
    c = ml.open_cursor("s", initial_position="latest")
    assert c.read_entries(10) == []
    p = ml.append(b"new")
    assert c.read_entries(10) == [(p, b"new")]


def test_rangeset_matches_a_set_model():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    @settings(max_examples=200, deadline=None)
    @given(
        st.lists(
            st.tuples(st.sampled_from(["add", "range", "drop"]), st.integers(0, 60), st.integers(0, 8)),
            max_size=40,
        )
    )
    def check(ops):
        rs, model = RangeSet(), set()
        for op, a, w in ops:
            if op == "add":
                rs.add_many([a])
                model.add(a)
            elif op == "range":
                rs.add_range(a, a + w)
                model.update(range(a, a + w + 1))
            else:
                rs.remove_through(a)
                model = {k for k in model if k > a}
            pairs = rs.pairs()
            assert all(b >= a for a, b in pairs)
            assert all(pairs[i][1] + 1 < pairs[i + 1][0] for i in range(len(pairs) - 1))  # merged
            assert {k for a, b in pairs for k in range(a, b + 1)} == model
            assert rs.count() == len(model)
            assert all(rs.contains(k) == (k in model) for k in range(-1, 72))

    check()


def test_pack_orders_like_positions():
    from compactmq.storage.position import unpack

    ps = [Position(1, -1), Position(1, 0), Position(1, 5), Position(2, -1), Position(2, 0)]
    keys = [pack(p) for p in ps]
    assert keys == sorted(keys) and pack(Position(1, 0)) == pack(Position(1, -1)) + 1
    assert unpack(pack(Position(7, 9))) == Position(7, 9)
