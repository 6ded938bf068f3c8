"""Closing a storage with many topics: the ledger-list changes go in a few multi-key commits
(not one metadata-store transaction per topic), and a reopen finds every ledger recorded
CLOSED with its entries (nothing to recover)."""

import uuid

import pytest

from compactmq.config import load_config
from compactmq.storage import Storage
from compactmq.storage.position import LEDGER_CLOSED, Position

TOPICS = 60


@pytest.fixture(params=["sqlite", "zk"])
def config(request):
    """The embedded store, and a real ZooKeeper (a commit is one multi request there)."""
    url = ""
    if request.param == "zk":
        url = f"zk:{request.getfixturevalue('zookeeper').hosts}/c{uuid.uuid4().hex[:12]}"
    return load_config(overrides={"metadataStoreUrl": url, "metadataStoreOperationTimeoutSeconds": 10})


def _count_writes(store):
    """Count the store's write transactions (the real store still does every write)."""
    counts = {"put": 0, "commit": 0, "delete": 0}
    for name in counts:
        real = getattr(store, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            counts[_name] += 1
            return _real(*args, **kwargs)

        setattr(store, name, counted)
    return counts


def _fill(st, topics):
    """Half the topics get entries; the other half only their (empty) current ledger."""
    written = {}
    for i, topic in enumerate(topics):
        ml = st.open_managed_ledger(topic)
        written[topic] = [b"%s-%d" % (topic.encode(), j) for j in range(i % 2 * 3)]
        for data in written[topic]:
            ml.append(data)
    return written


def test_closing_many_topics_makes_a_constant_number_of_transactions(tmp_path, clock, config):
    topics = [f"persistent://public/default/close-{i}" for i in range(TOPICS)]
    st = Storage(tmp_path / "data", config, clock=clock)
    written = _fill(st, topics)
    counts = _count_writes(st.metadata_store)
    st.close()
    # one commit carries every topic's change (60 small values are far below a chunk's bound)
    assert counts == {"put": 0, "commit": 1, "delete": 0}
    assert st.topic_metadata.last_batch_commits == 1

    again = Storage(tmp_path / "data", config, clock=clock)
    try:
        for topic in topics:
            ledgers = again.topic_metadata.ledgers(topic)
            assert all(li.state == LEDGER_CLOSED for li in ledgers), (topic, ledgers)
            assert sum(li.entry_count for li in ledgers) == len(written[topic])
            ml = again.open_managed_ledger(topic)
            assert [d for _, d in ml.read_entries(Position(0, 0), 10)] == written[topic]
    finally:
        again.close()


def test_a_topic_whose_change_cannot_be_batched_is_written_alone(tmp_path, clock, config):
    """A topic whose value moved under the batch (another writer) loses nothing: the chunk
    fails as a whole and every topic of it is written on its own, by compare-and-set."""
    topics = [f"persistent://public/default/moved-{i}" for i in range(8)]
    st = Storage(tmp_path / "data", config, clock=clock)
    written = _fill(st, topics)
    store = st.metadata_store
    real_commit = store.commit
    moved = []

    def commit_after_a_move(ops):
        if not moved:  # another writer touches the first topic's value between read and commit
            path = ops[0].path
            got = store.get(path)
            store.put(path, got.value, got.stat.version)
            moved.append(path)
        return real_commit(ops)

    store.commit = commit_after_a_move
    st.close()
    assert moved

    again = Storage(tmp_path / "data", config, clock=clock)
    try:
        for topic in topics:
            ledgers = again.topic_metadata.ledgers(topic)
            assert all(li.state == LEDGER_CLOSED for li in ledgers), (topic, ledgers)
            assert sum(li.entry_count for li in ledgers) == len(written[topic])
    finally:
        again.close()


def test_pending_cursor_positions_join_the_close_commit(tmp_path, clock, config):
    """Positions held back by the mark-delete rate limit are written at close, in the same
    commit as the ledgers, and a reopen finds every cursor where it was acknowledged."""
    topics = [f"persistent://public/default/acked-{i}" for i in range(20)]
    st = Storage(tmp_path / "data", config, clock=clock)  # the default rate: 1 write/s
    acked = {}
    for topic in topics:
        ml = st.open_managed_ledger(topic)
        positions = [ml.append(b"m%d" % j) for j in range(4)]
        cursor = ml.open_cursor("sub")
        cursor.ack_cumulative(positions[0])  # written at once (the rate allows it)
        cursor.ack_cumulative(positions[2])  # held back: pending until the close
        acked[topic] = positions[2]
    counts = _count_writes(st.metadata_store)
    st.close()
    assert counts == {"put": 0, "commit": 1, "delete": 0}

    again = Storage(tmp_path / "data", config, clock=clock)
    try:
        for topic in topics:
            ml = again.open_managed_ledger(topic)
            assert ml.open_cursor("sub").mark_delete_position == acked[topic]
    finally:
        again.close()
