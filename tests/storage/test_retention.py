"""Retention, Pulsar's rules: unacknowledged entries stay; acknowledged ones stay while within
both the time and the size limit; whole ledgers past them are deleted; never the current one."""

import os

import pytest

from compactmq.storage import COMPACTION_CURSOR, RETENTION_SIZE_MB, RETENTION_TIME_MINUTES, Position

MIN = 60_000


@pytest.fixture
def ml(open_storage, clock):
    storage = open_storage(managedLedgerMaxEntriesPerLedger=4)
    ml = storage.open_managed_ledger("t")
    ml.storage = storage
    ml.positions = []
    for i in range(14):  # ledgers of 4, 4, 4, and the current one with 2
        ml.positions.append(ml.append(b"%04d" % i))
        clock.advance(MIN)
    return ml


def ledger_ids(ml):
    return [i.ledger_id for i in ml.ledgers()]


def test_unacknowledged_entries_stay(ml):
    c = ml.open_cursor("s")
    c.ack_cumulative(ml.positions[2])  # first ledger not fully acknowledged
    assert ml.trim_to_retention(retention_time_minutes=0, retention_size_mb=0) == []
    assert len(ml.ledgers()) == 4


def test_fully_acknowledged_ledgers_go_with_no_retention(ml):
    before = ledger_ids(ml)
    c = ml.open_cursor("s")
    c.ack_cumulative(ml.positions[8])  # ledgers 1 and 2 acknowledged, entry 8 is first of ledger 3
    assert ml.trim_to_retention(retention_time_minutes=0, retention_size_mb=0) == before[:2]
    assert ledger_ids(ml) == before[2:]
    assert ml.first_position() == ml.positions[8]
    assert not os.path.exists(ml.ledger_path(before[0]))
    # the cursor still reads on from where it was
    assert c.read_entries(1)[0][0] == ml.positions[9]


def test_slowest_durable_cursor_decides(ml):
    before = ledger_ids(ml)
    ml.open_cursor("fast").ack_cumulative(ml.positions[13])
    ml.open_cursor("slow").ack_cumulative(ml.positions[3])  # last entry of the first ledger
    assert ml.trim_to_retention(retention_time_minutes=0, retention_size_mb=0) == before[:1]


def test_a_reader_holds_data_only_beside_a_durable_cursor(ml):
    """Pulsar's internalTrimLedgers: with durable cursors the slowest of *all* cursors (readers'
    non-durable ones are in the same container) decides; with none, every ledger but the one
    being written counts as consumed, readers or not."""
    before = ledger_ids(ml)
    reader = ml.open_cursor("reader", durable=False)
    reader.ack_cumulative(ml.positions[5])  # part-way through the second ledger
    ml.open_cursor("fast").ack_cumulative(ml.positions[13])
    assert ml.trim_to_retention(retention_time_minutes=0, retention_size_mb=0) == before[:1]
    ml.delete_cursor("fast")
    assert ml.trim_to_retention(retention_time_minutes=0, retention_size_mb=0) == before[1:-1]
    assert ledger_ids(ml) == before[-1:]


def test_compaction_cursor_counts_like_any_durable_cursor(ml):
    before = ledger_ids(ml)
    ml.open_cursor("s").ack_cumulative(ml.positions[13])
    # horizon in the second ledger; the commit moves ``__compaction`` in the resources too
    ml.storage.metadata.commit_compaction(ml.topic, 999, ml.positions[5])
    assert ml.get_cursor(COMPACTION_CURSOR).mark_delete_position == ml.positions[5]
    assert ml.trim_to_retention(retention_time_minutes=0, retention_size_mb=0) == before[:1]


def test_no_cursors_means_everything_but_the_current_ledger_is_acknowledged(ml):
    before = ledger_ids(ml)
    assert ml.trim_to_retention(retention_time_minutes=0, retention_size_mb=0) == before[:3]
    assert ledger_ids(ml) == before[3:]


def test_time_retention_keeps_recent_acknowledged_ledgers(ml, clock):
    before = ledger_ids(ml)
    ml.open_cursor("s").ack_cumulative(ml.positions[13])
    # ledgers closed at minutes 4, 8, 12 (rolled by the appends at those minutes); now is minute 14
    assert ml.trim_to_retention(retention_time_minutes=5, retention_size_mb=-1) == before[:2]
    clock.advance(3 * MIN)
    assert ml.trim_to_retention(retention_time_minutes=5, retention_size_mb=-1) == before[2:3]


def test_size_retention_keeps_the_newest_bytes(ml):
    before = ledger_ids(ml)
    ml.open_cursor("s").ack_cumulative(ml.positions[13])
    # 14 entries of 4 bytes = 56 bytes; a 0 MB limit deletes all acknowledged ledgers but the current
    assert ml.trim_to_retention(retention_time_minutes=-1, retention_size_mb=0) == before[:3]


def test_within_both_limits_nothing_goes(ml):
    ml.open_cursor("s").ack_cumulative(ml.positions[13])
    assert ml.trim_to_retention(retention_time_minutes=60, retention_size_mb=1) == []
    assert ml.trim_to_retention(retention_time_minutes=-1, retention_size_mb=-1) == []


def test_retention_policy_comes_from_topic_then_namespace(ml):
    before = ledger_ids(ml)
    ml.storage.policies.set_namespace_policy("public/default", RETENTION_TIME_MINUTES, -1)
    ml.storage.policies.set_namespace_policy("public/default", RETENTION_SIZE_MB, -1)
    assert ml.retention_policy() == (-1, -1)
    assert ml.trim_to_retention() == []
    ml.storage.policies.set_topic_policy(ml.topic, RETENTION_TIME_MINUTES, 0)
    assert ml.retention_policy() == (0, -1)
    assert ml.trim_to_retention() == before[:3]


def test_trimmed_ledgers_stay_gone_after_restart(open_storage, clock):
    st = open_storage(managedLedgerMaxEntriesPerLedger=2)
    ml = st.open_managed_ledger("t")
    ps = [ml.append(b"x") for _ in range(6)]
    ml.trim_to_retention(retention_time_minutes=0, retention_size_mb=0)
    st.close()
    ml = open_storage(managedLedgerMaxEntriesPerLedger=2).open_managed_ledger("t")
    assert [p for p, _ in ml.read_entries(Position(0, 0), 10)] == ps[4:]
