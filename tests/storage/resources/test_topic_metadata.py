"""``TopicMetadata`` (topics, ledger lists, rate-limited cursors) and ``PolicyResources`` on each
store implementation (memory:, sqlite:, and a real ZooKeeper): what a managed ledger and the
callers above storage ask of their metadata."""

from __future__ import annotations

import uuid

import pytest

from compactmq.errors import TopicNotFound
from compactmq.naming import TopicName
from compactmq.storage.metadata_store import create_metadata_store
from compactmq.storage.position import LEDGER_CLOSED, LEDGER_OPEN, LedgerInfo, Position
from compactmq.storage.resources import PulsarResources
from compactmq.storage.resources.topic_metadata import TopicMetadata

T = "persistent://acme/orders/t"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["memory", "sqlite", "zk"])
def url(request):
    if request.param == "memory":
        return f"memory:t{uuid.uuid4().hex[:12]}"
    if request.param == "sqlite":
        return "sqlite:meta.db"
    return f"zk:{request.getfixturevalue('zookeeper').hosts}/tm{uuid.uuid4().hex[:12]}"


@pytest.fixture
def open_tm(url, tmp_path):
    """``open_tm(**kw)`` -> (TopicMetadata, PulsarResources) on the test's data set (a new store
    each call: two processes on one store); everything closed at teardown."""
    opened = []

    def _open(**kw):
        store = create_metadata_store(url, data_dir=tmp_path, operation_timeout_s=10)
        res = PulsarResources(store)
        if res.tenants.get("acme") is None:
            res.tenants.create("acme", {})
            res.namespaces.create("acme/orders", {})
        tm = TopicMetadata(
            res.managed_ledgers, res.ledger_ids, res.tenants, res.namespaces, res.policies, **kw
        )
        opened.append((tm, store))
        return tm, res

    yield _open
    for tm, store in reversed(opened):
        tm.close()
        store.close()


def _info_version(res, topic=T):
    return res.managed_ledgers.get(TopicName.parse(topic))[1]


def test_topics_and_their_properties(open_tm):
    tm, res = open_tm()
    assert not tm.topic_exists(T) and tm.topics("acme/orders") == []
    assert tm.create_topic(T, {"a": 1}) and not tm.create_topic(T)
    assert tm.topics() == [T] and tm.topics("acme/orders") == [T]
    assert tm.topic_properties(T) == {"a": 1}
    tm.update_topic_properties(T, lambda p: {**p, "topicEpoch": 4})
    assert tm.topic_properties(T) == {"a": 1, "topicEpoch": 4}
    assert not tm.topic_exists("non-persistent://acme/orders/t")
    with pytest.raises(TopicNotFound):
        tm.topic_properties("persistent://acme/orders/none")


def test_recovery_changes_are_one_write_of_the_ledger_list(open_tm):
    tm, res = open_tm()
    tm.create_topic(T)
    first = tm.add_ledger(T, 1_000)
    second = tm.add_ledger(T, 2_000, close=LedgerInfo(first, 3, 30, 10, 20, LEDGER_OPEN, 1_000, 1_500))
    assert second > first
    assert [(i.ledger_id, i.state, i.entry_count) for i in tm.ledgers(T)] == [
        (first, LEDGER_CLOSED, 3),
        (second, LEDGER_OPEN, 0),
    ]
    before = _info_version(res)
    with tm.transaction():  # as recovery does: close one, delete one, open one
        tm.close_ledger(LedgerInfo(second, 2, 20, 30, 40, LEDGER_OPEN, 2_000, 2_500))
        tm.delete_ledgers(T, [first])
        third = tm.add_ledger(T, 3_000)
    assert _info_version(res) == before + 1  # ONE compare-and-set
    assert [(i.ledger_id, i.state) for i in tm.ledgers(T)] == [(second, LEDGER_CLOSED), (third, LEDGER_OPEN)]
    # a change made by another writer between two of ours is not undone (read-modify-write)
    tm.update_topic_properties(T, lambda p: {**p, "x": 1})
    tm.delete_ledgers(T, [second])
    assert tm.topic_properties(T) == {"x": 1} and [i.ledger_id for i in tm.ledgers(T)] == [third]
    assert tm.delete_topic(T) == [third]
    assert not tm.topic_exists(T)
    with pytest.raises(TopicNotFound):
        tm.delete_topic(T)


def test_a_failed_transaction_writes_nothing(open_tm):
    tm, res = open_tm()
    tm.create_topic(T)
    tm.add_ledger(T, 1)
    before = _info_version(res)
    with pytest.raises(RuntimeError):
        with tm.transaction():
            tm.add_ledger(T, 2)
            raise RuntimeError("crash mid-recovery")
    assert _info_version(res) == before and len(tm.ledgers(T)) == 1


def test_cursor_writes_are_bounded_by_the_rate_and_durable_after_close(open_tm):
    clock = Clock()
    tm, res = open_tm(mark_delete_rate=2.0, flush_interval_s=0, cursor_clock=clock)
    tm.create_topic(T)
    lid = tm.add_ledger(T, 1)
    tn = TopicName.parse(T)
    tm.save_cursor(T, "sub", Position(lid, -1), b"", {})  # a new subscription: written at once
    assert res.managed_ledgers.get_cursor(tn, "sub")[1] == 0
    for i in range(1000):  # a thousand acks in the same instant: none written
        tm.save_cursor(T, "sub", Position(lid, i), b"", {})
    assert res.managed_ledgers.get_cursor(tn, "sub")[1] == 0
    # the process reads its own newest position meanwhile
    assert tm.get_cursor(T, "sub").mark_delete == Position(lid, 999)
    for step in range(1, 21):  # 10 s of acks, 100 per second: at most 2 writes per second
        clock.now += 0.1
        for i in range(10):
            tm.save_cursor(T, "sub", Position(lid, 1000 + step * 10 + i), b"", {})
    version = res.managed_ledgers.get_cursor(tn, "sub")[1]
    assert 1 <= version <= 2 * 2 + 1
    # another process (a compact-topic job) sees the last written position, never a newer one
    other, _ = open_tm(read_only=True)
    written = other.get_cursor(T, "sub").mark_delete
    assert Position(lid, 999) <= written <= Position(lid, 1209)
    tm.flush_cursors(T)  # the managed ledger closed (unload, shutdown): the newest is written
    assert other.get_cursor(T, "sub").mark_delete == Position(lid, 1209)
    assert res.managed_ledgers.get_cursor(tn, "sub")[1] == version + 1
    tm.flush_cursors(T)  # nothing pending: no write
    assert res.managed_ledgers.get_cursor(tn, "sub")[1] == version + 1


def test_close_writes_what_the_rate_held_back_and_delete_is_immediate(open_tm):
    clock = Clock()
    tm, res = open_tm(mark_delete_rate=1.0, flush_interval_s=0, cursor_clock=clock)
    tm.create_topic(T)
    lid = tm.add_ledger(T, 1)
    tm.save_cursor(T, "a", Position(lid, 1), b"", {})
    tm.save_cursor(T, "a", Position(lid, 5), b"\x00" * 16, {"p": 1})  # held back
    tm.save_cursor(T, "gone", Position(lid, 1), b"", {})
    tm.save_cursor(T, "gone", Position(lid, 9), b"", {})  # held back, then deleted
    assert tm.delete_cursor(T, "gone") and not tm.delete_cursor(T, "gone")
    tm.close()
    again, _ = open_tm()
    [rec] = again.load_cursors(T)
    assert (rec.name, rec.mark_delete, rec.acked_ranges, rec.properties) == (
        "a",
        Position(lid, 5),
        b"\x00" * 16,
        {"p": 1},
    )


def test_a_cursor_moved_by_another_process_is_not_moved_back(open_tm):
    """A compaction commit (another process) moves ``__compaction`` ahead; this process's older
    pending position loses the race instead of overwriting it."""
    clock = Clock()
    tm, res = open_tm(mark_delete_rate=1.0, flush_interval_s=0, cursor_clock=clock)
    tm.create_topic(T)
    lid = tm.add_ledger(T, 1)
    tm.save_cursor(T, "__compaction", Position(lid, -1), b"", {})
    job, _ = open_tm(read_only=True)
    job.advance_cursor(T, "__compaction", Position(lid, 50))
    job.advance_cursor(T, "__compaction", Position(lid, 10))  # never backward
    tm.save_cursor(T, "__compaction", Position(lid, 3), b"", {})
    tm.flush_cursors()
    assert job.get_cursor(T, "__compaction").mark_delete == Position(lid, 50)
    tm.save_cursor(T, "__compaction", Position(lid, 60), b"", {})  # ahead of it: written
    tm.flush_cursors()
    assert job.get_cursor(T, "__compaction").mark_delete == Position(lid, 60)


def test_policies_of_namespaces_and_topics(open_tm):
    tm, res = open_tm()
    pol = res.policies
    assert pol.effective_policy(T, "retentionTimeInMinutes", 3) == 3
    pol.set_namespace_policy("acme/orders", "retentionTimeInMinutes", 10)
    assert pol.effective_policy(T, "retentionTimeInMinutes", 3) == 10
    pol.set_topic_policies([T, T + "-partition-0"], {"retentionTimeInMinutes": 0, "x": 1})
    assert pol.effective_policy(T, "retentionTimeInMinutes", 3) == 0  # 0 is a value, not "unset"
    assert pol.get_topic_policies(T + "-partition-0") == {"retentionTimeInMinutes": 0, "x": 1}
    pol.set_policies("topic", T, {"retentionTimeInMinutes": None})
    assert pol.get_topic_policies(T) == {"x": 1}
    assert res.namespaces.get_policies("acme/orders") == {"retentionTimeInMinutes": 10}  # Pulsar's place
    pol.remove_namespace_policy("acme/orders", "retentionTimeInMinutes")
    assert pol.get_namespace_policies("acme/orders") == {}
    tm.create_topic(T)
    tm.delete_topic(T)  # its policies go with it
    assert pol.get_topic_policies(T) == {}
