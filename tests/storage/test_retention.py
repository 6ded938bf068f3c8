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
    assert ml.hold_for_compaction()
    ml.get_cursor(COMPACTION_CURSOR).ack_cumulative(ml.positions[5])  # a hold in the second ledger
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


def test_a_retention_hold_keeps_ledgers_for_its_owner_until_released(ml):
    """Generic holds: an opaque owner keeps every ledger from a position on; a second hold by
    the same owner is refused (False); releasing it hands the ledgers back to retention."""
    before = ledger_ids(ml)
    ml.open_cursor("s").ack_cumulative(ml.positions[13])
    assert ml.hold_retention("backup-job", ml.positions[4]) is True  # first entry of ledger 2
    assert ml.hold_retention("backup-job") is False
    assert ml.trim_to_retention(retention_time_minutes=0, retention_size_mb=0) == before[:1]
    assert ml.read_entry(ml.positions[4]) == b"0004"
    ml.release_retention_hold("backup-job")
    assert ml.trim_to_retention(retention_time_minutes=0, retention_size_mb=0) == before[1:-1]


def test_a_watched_hold_placed_by_another_process_is_honoured(open_storage, ml):
    """A read-only process (another compactor, say) writes its hold to the metadata store only;
    the writer re-reads watched owners before it trims."""
    before = ledger_ids(ml)
    ml.open_cursor("s").ack_cumulative(ml.positions[13])
    ml.watch_retention_hold("offsite-copy")
    reader = open_storage(read_only=True).open_managed_ledger("t", create=False)
    assert reader.hold_retention("offsite-copy", ml.positions[8]) is True
    assert ml.trim_to_retention(retention_time_minutes=0, retention_size_mb=0) == before[:2]
    reader.release_retention_hold("offsite-copy")
    assert ml.trim_to_retention(retention_time_minutes=0, retention_size_mb=0) == before[2:-1]
