"""A run holds the ledgers it planned to read against retention, and lets go when it fails.

A topic nobody subscribes to has no durable cursor, so retention (0/0 by default) may delete its
sealed ledgers at any check. A run plans its input, then may wait seconds for Spark to start; a
retention check in that window used to delete a planned ledger and the run died of
FileNotFoundError. The ``planned`` hook point is exactly that window: the tests run retention
there.
"""

from __future__ import annotations

import pytest

from compactmq.compaction.jobs import SparkCompactionService
from compactmq.compaction.jobs.session import TEST_CONF
from compactmq.config import load_config
from compactmq.errors import CompactionError
from compactmq.storage import COMPACTION_CURSOR, Storage

from . import entries as E

TOPIC = "persistent://public/default/run-retention"


def _storage(path, **kw) -> Storage:
    cfg = load_config(overrides={"managedLedgerMaxEntriesPerLedger": 4, "managedLedgerSyncData": False})
    return Storage(str(path), cfg, **kw)


def _fill(ml, n=12) -> None:
    """n messages over 3 keys in sealed ledgers of 4 entries."""
    for c in range(0, n, 4):
        ml.append_many([E.single(f"k{i % 3}", b"v%d" % i) for i in range(c, c + 4)])
        ml.rollover()


def test_retention_during_the_run_deletes_nothing_it_planned_to_read(tmp_path, spark):
    st = _storage(tmp_path)
    try:
        ml = st.open_managed_ledger(TOPIC)
        _fill(ml)
        assert ml.get_cursor(COMPACTION_CURSOR) is None and len(ml.ledgers()) >= 3
        trimmed: list = []

        def hook(point):
            if point == "planned":  # the run waits for Spark here; retention runs meanwhile
                trimmed.extend(ml.trim_to_retention())

        result = SparkCompactionService(st, TOPIC, st.config, spark_conf=TEST_CONF, abort_hook=hook).compact()
        assert trimmed == []
        assert result.messages_read == 12 and result.messages_kept == 3
        # from now on the cursor sits at the horizon: what the view covers may go, nothing after it
        cursor = ml.get_cursor(COMPACTION_CURSOR)
        assert cursor is not None and cursor.mark_delete_position == result.horizon
    finally:
        st.close()


def test_a_failed_run_releases_the_hold_it_took(tmp_path):
    st = _storage(tmp_path)
    try:
        ml = st.open_managed_ledger(TOPIC)
        _fill(ml)
        seen = []

        def hook(point):
            if point == "planned":
                seen.append(ml.get_cursor(COMPACTION_CURSOR) is not None)
                raise RuntimeError("the engine could not start")

        with pytest.raises(CompactionError, match="could not start"):
            SparkCompactionService(st, TOPIC, st.config, abort_hook=hook).compact()
        assert seen == [True]  # held while the run was planned
        assert ml.get_cursor(COMPACTION_CURSOR) is None
        assert st.topic_metadata.get_cursor(TOPIC, COMPACTION_CURSOR) is None
        assert ml.trim_to_retention()  # retention works as it did before the run
    finally:
        st.close()


def test_a_failed_run_keeps_a_cursor_it_did_not_create(tmp_path):
    st = _storage(tmp_path)
    try:
        ml = st.open_managed_ledger(TOPIC)
        _fill(ml)
        ml.open_cursor(COMPACTION_CURSOR, True, "earliest")  # what a compaction threshold sets up

        def hook(point):
            if point == "planned":
                raise RuntimeError("no")

        with pytest.raises(CompactionError):
            SparkCompactionService(st, TOPIC, st.config, abort_hook=hook).compact()
        assert ml.get_cursor(COMPACTION_CURSOR) is not None
        assert ml.trim_to_retention() == []
    finally:
        st.close()


def test_a_hold_taken_by_another_process_protects_the_brokers_ledgers(tmp_path):
    """A compact-topic job opens the directory read-only; the broker's retention must see its
    hold, which lives in the metadata store."""
    broker = _storage(tmp_path)
    try:
        ml = broker.open_managed_ledger(TOPIC)
        _fill(ml)
        job = _storage(tmp_path, read_only=True)
        try:
            job_ml = job.open_managed_ledger(TOPIC, create=False)
            assert job_ml.hold_for_compaction() is True
            assert job_ml.hold_for_compaction() is False  # held already
            assert ml.trim_to_retention() == []
            job_ml.release_compaction_hold()
        finally:
            job.close()
        assert ml.trim_to_retention()
    finally:
        broker.close()
