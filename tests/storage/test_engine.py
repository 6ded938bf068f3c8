from compactmq.storage import Position


def test_run_maintenance_rolls_by_age_and_trims(open_storage, clock):
    st = open_storage(managedLedgerMaxLedgerRolloverTimeMinutes=10)
    ml = st.open_managed_ledger("t")
    ps = [ml.append(b"a"), ml.append(b"b")]
    clock.advance(11 * 60_000)
    deleted = st.run_maintenance()  # rolls the idle ledger; no cursor, 0/0 retention: trims it
    assert deleted == {ml.topic: [ps[0].ledger_id]}
    assert ml.read_entries(Position(0, 0), 10) == []
    assert st.run_maintenance() == {}


def test_backlog_size(open_storage):
    ml = open_storage().open_managed_ledger("t")
    ps = [ml.append(b"x" * 10) for _ in range(5)]
    c = ml.open_cursor("s")
    assert c.backlog_size() == 50
    c.ack_cumulative(ps[1])
    assert c.backlog_size() == 30 and c.backlog() == 3
