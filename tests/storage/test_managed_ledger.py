import threading

import pytest

from compactmq.errors import NotFound, TopicNotFound
from compactmq.storage import LEDGER_CLOSED, LEDGER_OPEN, Position


def test_append_then_read_back(open_storage):
    ml = open_storage().open_managed_ledger("t")
    p0 = ml.append(b"hello")
    p1 = ml.append(b"")
    p2 = ml.append(b"x" * 100_000)
    assert p0 < p1 < p2 and p0.ledger_id == p2.ledger_id and [p0.entry_id, p1.entry_id, p2.entry_id] == [0, 1, 2]
    assert ml.read_entry(p0) == b"hello"
    assert ml.read_entry(p1) == b""
    assert ml.read_entry(p2) == b"x" * 100_000
    assert ml.first_position() == p0 and ml.last_position() == p2
    assert [d for _, d in ml.read_entries(Position(0, 0), 10)] == [b"hello", b"", b"x" * 100_000]


def test_empty_topic_positions(open_storage):
    ml = open_storage().open_managed_ledger("t")
    assert ml.first_position() is None and ml.last_position() is None
    assert ml.read_entries(Position(0, 0), 10) == []
    nxt = ml.next_position(Position(-1, -1))
    assert nxt.entry_id == 0  # where the first append goes
    assert ml.append(b"a") == nxt


def test_read_missing_entry_is_not_found(open_storage):
    ml = open_storage().open_managed_ledger("t")
    p = ml.append(b"a")
    with pytest.raises(NotFound):
        ml.read_entry(Position(p.ledger_id, 1))
    with pytest.raises(NotFound):
        ml.read_entry(Position(999, 0))


def test_rollover_by_entry_count(open_storage):
    ml = open_storage(managedLedgerMaxEntriesPerLedger=3).open_managed_ledger("t")
    ps = [ml.append(b"%d" % i) for i in range(8)]
    assert [p.entry_id for p in ps] == [0, 1, 2, 0, 1, 2, 0, 1]
    infos = ml.ledgers()
    assert [i.entry_count for i in infos] == [3, 3, 2]
    assert [i.state for i in infos] == [LEDGER_CLOSED, LEDGER_CLOSED, LEDGER_OPEN]
    assert [d for _, d in ml.read_entries(ps[0], 100)] == [b"%d" % i for i in range(8)]


def test_rollover_by_size(open_storage):
    ml = open_storage(managedLedgerMaxSizePerLedgerMbytes=1).open_managed_ledger("t")
    for _ in range(5):
        ml.append(b"z" * 400_000)
    assert [i.entry_count for i in ml.ledgers()] == [3, 2]


def test_rollover_by_age(open_storage, clock):
    ml = open_storage(managedLedgerMaxLedgerRolloverTimeMinutes=10).open_managed_ledger("t")
    a = ml.append(b"a")
    clock.advance(9 * 60_000)
    b = ml.append(b"b")
    clock.advance(2 * 60_000)
    c = ml.append(b"c")
    assert a.ledger_id == b.ledger_id != c.ledger_id
    assert not ml.maybe_rollover()
    clock.advance(11 * 60_000)
    assert ml.maybe_rollover()


def test_append_many_is_one_ledger_in_order(open_storage):
    ml = open_storage().open_managed_ledger("t")
    ps = ml.append_many([b"a", b"b", b"c"], [10, 20, 30])
    assert [p.entry_id for p in ps] == [0, 1, 2]
    assert [d for _, d in ml.read_entries(ps[0], 10)] == [b"a", b"b", b"c"]
    assert ml.ledgers()[0].first_publish_ms == 10 and ml.ledgers()[0].last_publish_ms == 30


def test_reopen_after_close_keeps_everything(open_storage, tmp_path):
    st = open_storage(managedLedgerMaxEntriesPerLedger=4)
    ml = st.open_managed_ledger("t")
    ps = [ml.append(b"%d" % i) for i in range(10)]
    st.close()
    ml = open_storage(managedLedgerMaxEntriesPerLedger=4).open_managed_ledger("t")
    assert [d for _, d in ml.read_entries(ps[0], 100)] == [b"%d" % i for i in range(10)]
    new = ml.append(b"new")
    assert new > ps[-1]


def test_open_without_create(open_storage):
    st = open_storage()
    with pytest.raises(TopicNotFound):
        st.open_managed_ledger("nope", create=False)
    st.open_managed_ledger("yes")
    assert st.open_managed_ledger("persistent://public/default/yes", create=False) is st.open_managed_ledger("yes")
    assert st.topics() == ["persistent://public/default/yes"]


def test_concurrent_appenders_all_land(open_storage):
    ml = open_storage(managedLedgerMaxEntriesPerLedger=50).open_managed_ledger("t")
    results: dict[int, list] = {}

    def writer(k):
        results[k] = [ml.append(b"%d-%d" % (k, i)) for i in range(100)]

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    everything = ml.read_entries(Position(0, 0), 10_000)
    assert len(everything) == 400
    by_pos = dict(everything)
    for k, ps in results.items():
        assert ps == sorted(ps)
        assert [by_pos[p] for p in ps] == [b"%d-%d" % (k, i) for i in range(100)]
