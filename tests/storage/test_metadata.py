import sqlite3
import threading

import pytest

from compactmq.errors import AlreadyExists, Conflict, MetadataError, NotFound, TopicNotFound
from compactmq.storage import (
    COMPACTION_CURSOR,
    COMPACTION_THRESHOLD,
    ERROR,
    NOT_RUN,
    RETENTION_TIME_MINUTES,
    RUNNING,
    SUCCESS,
    MetadataStore,
    Position,
)

T = "persistent://public/default/t"


@pytest.fixture
def store(tmp_path, clock):
    s = MetadataStore(tmp_path / "metadata.db", clock=clock)
    yield s
    s.close()


def test_wal_mode_and_default_tenant(store, tmp_path):
    assert store._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store.tenants() == ["public"] and store.namespaces() == ["public/default"]


def test_ledger_ids_are_unique_and_survive_reopen(tmp_path, clock):
    s = MetadataStore(tmp_path / "m.db", clock=clock)
    ids = [s.allocate_ledger_id() for _ in range(5)]
    s.close()
    s = MetadataStore(tmp_path / "m.db", clock=clock)
    assert s.allocate_ledger_id() == ids[-1] + 1 and ids == sorted(set(ids))
    s.close()


def test_ledger_ids_unique_across_threads(store):
    got = []

    def grab():
        got.extend(store.allocate_ledger_id() for _ in range(50))

    ts = [threading.Thread(target=grab) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(set(got)) == 200


def test_a_failed_transaction_leaves_nothing(store):
    with pytest.raises(RuntimeError):
        with store.transaction():
            store.create_topic(T)
            store.set_topic_policy(T, COMPACTION_THRESHOLD, 100)
            raise RuntimeError("crash in the middle")
    assert not store.topic_exists(T) and store.get_topic_policies(T) == {}


def test_rollover_is_one_transaction(store):
    from compactmq.storage import LedgerInfo

    store.create_topic(T)
    first = store.add_ledger(T, 1)
    with pytest.raises(MetadataError):  # closing an unknown ledger fails: nothing is added
        store.add_ledger(T, 2, close=LedgerInfo(9999, 1, 1, 1, 1, "CLOSED", 0, 2))
    assert [l.ledger_id for l in store.ledgers(T)] == [first]
    second = store.add_ledger(T, 2, close=LedgerInfo(first, 10, 100, 5, 6, "CLOSED", 1, 2))
    infos = store.ledgers(T)
    assert [(l.ledger_id, l.state, l.entry_count) for l in infos] == [
        (first, "CLOSED", 10),
        (second, "OPEN", 0),
    ]


def test_tenants_and_namespaces(store):
    store.create_tenant("acme", {"allowedClusters": ["standalone"]})
    with pytest.raises(AlreadyExists):
        store.create_tenant("acme")
    assert store.get_tenant("acme") == {"allowedClusters": ["standalone"]}
    with pytest.raises(NotFound):
        store.create_namespace("nobody/ns")
    store.create_namespace("acme/orders")
    assert store.namespaces("acme") == ["acme/orders"]
    with pytest.raises(Conflict):
        store.delete_tenant("acme")
    store.create_topic("persistent://acme/orders/o1")
    with pytest.raises(Conflict):
        store.delete_namespace("acme/orders")
    store.delete_topic("persistent://acme/orders/o1")
    store.delete_namespace("acme/orders")
    store.delete_tenant("acme")
    assert store.tenants() == ["public"]


def test_topic_creation_makes_its_namespace(store):
    assert store.create_topic("persistent://new/ns/t")
    assert not store.create_topic("persistent://new/ns/t")
    assert "new/ns" in store.namespaces() and store.topics("new/ns") == ["persistent://new/ns/t"]


def test_partitioned_topics(store):
    store.create_partitioned_topic(T, 3)
    with pytest.raises(AlreadyExists):
        store.create_partitioned_topic(T, 3)
    assert store.get_partitions(T) == 3 and store.get_partitions(T + "x") is None
    store.update_partitioned_topic(T, 5)
    with pytest.raises(Conflict):
        store.update_partitioned_topic(T, 2)
    assert store.partitioned_topics("public/default") == {T: 5}
    store.delete_partitioned_topic(T)
    with pytest.raises(TopicNotFound):
        store.delete_partitioned_topic(T)


def test_policies_topic_over_namespace_over_default(store):
    assert store.effective_policy(T, RETENTION_TIME_MINUTES, 7) == 7
    store.set_namespace_policy("public/default", RETENTION_TIME_MINUTES, 60)
    assert store.effective_policy(T, RETENTION_TIME_MINUTES, 7) == 60
    store.set_topic_policy(T, RETENTION_TIME_MINUTES, -1)
    assert store.effective_policy(T, RETENTION_TIME_MINUTES, 7) == -1
    store.remove_topic_policy(T, RETENTION_TIME_MINUTES)
    assert store.effective_policy(T, RETENTION_TIME_MINUTES, 7) == 60
    store.set_policies("topic", T, {"compactionStrategy": "keep-first", "retainNullKey": True})
    assert store.get_topic_policies(T) == {"compactionStrategy": "keep-first", "retainNullKey": True}
    store.set_policies("topic", T, {"retainNullKey": None})
    assert store.get_topic_policies(T) == {"compactionStrategy": "keep-first"}


def test_compaction_state_lifecycle(store, clock):
    assert store.get_compaction_state(T).status == NOT_RUN
    st = store.mark_compaction_running(T)
    assert st.status == RUNNING and st.version == 1
    prev = store.commit_compaction(T, 41, Position(3, 9), {"duration_ms": 1200, "removed_event_count": 17})
    assert prev is None
    st = store.get_compaction_state(T)
    assert (
        st.status,
        st.compacted_ledger_id,
        st.horizon,
        st.last_duration_ms,
        st.removed_event_count,
        st.last_success_ms,
        st.version,
    ) == (SUCCESS, 41, Position(3, 9), 1200, 17, clock.now, 2)
    cur = store.get_cursor(T, COMPACTION_CURSOR)
    assert cur is not None and cur.mark_delete == Position(3, 9)
    store.mark_compaction_running(T)
    st = store.record_compaction_failure(T, "spark exploded", duration_ms=5)
    assert st.status == ERROR and st.last_error == "spark exploded" and st.compacted_ledger_id == 41
    assert st.horizon == Position(3, 9)  # the previous view stays in force
    assert store.commit_compaction(T, 50, Position(4, 0)) == 41
    assert store.get_compaction_state(T).last_error is None


def test_commit_compaction_checks_version_and_is_atomic(store):
    store.commit_compaction(T, 10, Position(1, 1))
    v = store.get_compaction_state(T).version
    with pytest.raises(Conflict):
        store.commit_compaction(T, 11, Position(2, 2), expected_version=v - 1)
    st = store.get_compaction_state(T)
    assert st.compacted_ledger_id == 10 and st.horizon == Position(1, 1)
    assert store.get_cursor(T, COMPACTION_CURSOR).mark_delete == Position(1, 1)
    assert store.commit_compaction(T, 11, Position(2, 2), expected_version=v) == 10


def test_compaction_cursor_never_moves_back(store):
    store.commit_compaction(T, 10, Position(5, 5))
    store.commit_compaction(T, 11, Position(4, 0))
    assert store.get_cursor(T, COMPACTION_CURSOR).mark_delete == Position(5, 5)


def test_commit_is_seen_by_another_connection(store, tmp_path):
    other = MetadataStore(tmp_path / "metadata.db")
    try:
        store.commit_compaction(T, 77, Position(8, 1))
        assert other.get_compaction_state(T).compacted_ledger_id == 77
    finally:
        other.close()


def test_listeners_hear_compaction_commits(store):
    heard = []
    store.add_listener(lambda event, topic: heard.append((event, topic)))
    store.commit_compaction(T, 1, Position(1, 0))
    assert heard == [("compaction_committed", T)]
    with pytest.raises(Conflict):
        store.commit_compaction(T, 2, Position(1, 0), expected_version=0)
    assert len(heard) == 1


def test_delete_topic_removes_everything_at_once(store):
    store.create_topic(T)
    lid = store.add_ledger(T, 1)
    store.save_cursor(T, "sub", Position(lid, 3), b"", {"a": 1})
    store.set_topic_policy(T, COMPACTION_THRESHOLD, 5)
    store.commit_compaction(T, 99, Position(lid, 3), details={"keys": 4})
    ledgers, compacted = store.delete_topic(T)
    assert ledgers == [lid] and compacted == 99
    assert store.ledgers(T) == [] and store.load_cursors(T) == [] and store.get_topic_policies(T) == {}
    assert store.get_compaction_state(T).status == NOT_RUN
    assert store.get_compaction_details(T) == (None, {})
    # whether a topic exists is the resources' to say now: a second delete here is no error
    assert store.delete_topic(T) == ([], None)


def test_compaction_details_come_with_the_commit_that_made_the_view(store, tmp_path):
    assert store.get_compaction_details(T) == (None, {})
    store.commit_compaction(T, 10, Position(1, 1), details={"keys": 3, "phaseSeconds": {"plan": 0.5}})
    v = store.get_compaction_state(T).version
    with pytest.raises(Conflict):  # a refused commit leaves the details of the view in force
        store.commit_compaction(T, 11, Position(2, 2), expected_version=v - 1, details={"keys": 9})
    other = MetadataStore(tmp_path / "metadata.db")  # survives a restart, seen by other processes
    try:
        assert other.get_compaction_details(T) == (10, {"keys": 3, "phaseSeconds": {"plan": 0.5}})
    finally:
        other.close()
    store.commit_compaction(T, 12, Position(3, 0))  # a service that records none keeps the old ones
    assert store.get_compaction_details(T)[0] == 10


def test_newer_schema_is_refused(tmp_path):
    db = sqlite3.connect(tmp_path / "m.db")
    db.execute("PRAGMA user_version=99")
    db.close()
    with pytest.raises(MetadataError):
        MetadataStore(tmp_path / "m.db")
