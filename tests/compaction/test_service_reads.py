"""The read side of the service over a committed compacted ledger (no Spark needed)."""

from __future__ import annotations

from compactmq.compaction import compacted_ledger as cl
from compactmq.compaction import compacted_writer as cw
from compactmq.compaction.service import LedgerCompactionService
from compactmq.config import load_config
from compactmq.storage import COMPACTION_RETENTION_MODE, Position, Storage
from compactmq.compaction.state import states_of

from . import entries as E

TOPIC = "persistent://public/default/reads"


def test_reads_follow_the_metadata_store_and_the_retention_floor(tmp_path):
    cfg = load_config(overrides={"managedLedgerMaxEntriesPerLedger": 2, "managedLedgerSyncData": False})
    storage = Storage(str(tmp_path), cfg)
    try:
        ml = storage.open_managed_ledger(TOPIC)
        positions = [ml.append(E.single(f"k{i}", b"v")) for i in range(6)]  # ledgers of 2 entries
        service = LedgerCompactionService(storage, TOPIC, cfg)
        assert service.read_compacted_entries(Position(0, 0), 10) == []
        assert service.read_last_compacted_entry() is None and service.get_last_compacted_position() is None
        lid = storage.resources.ledger_ids.allocate()
        w = cw.CompactedLedgerWriter(cl.compacted_ledger_path(tmp_path, TOPIC, lid))
        for p in positions[:5]:
            w.append(p.ledger_id, p.entry_id, b"entry-%d-%d" % p)
        w.finish()
        states = states_of(storage)
        running = states.mark_running(TOPIC, states.get(TOPIC).version)
        states.commit(TOPIC, lid, positions[4], expected_version=running.version)
        assert service.get_last_compacted_position() == positions[4]
        got = service.read_compacted_entries(positions[1], 2)
        assert [p for p, _ in got] == positions[1:3] and got[0][1] == b"entry-%d-%d" % positions[1]
        assert service.read_last_compacted_entry()[0] == positions[4]
        # retention trims the first ledger: retention-bounded readers skip it, the other mode does not
        assert ml.trim_to_retention(retention_time_minutes=0, retention_size_mb=0)
        first = ml.first_position()
        assert [p for p, _ in service.read_compacted_entries(Position(0, 0), 10)] == [
            p for p in positions[:5] if p >= first
        ]
        storage.policies.set_topic_policy(TOPIC, COMPACTION_RETENTION_MODE, "keep-until-tombstone")
        assert len(service.read_compacted_entries(Position(0, 0), 10)) == 5
    finally:
        storage.close()


def test_compacting_an_empty_topic_records_success_without_a_view(tmp_path):
    """Pulsar leaves this at NOT_RUN; an operator who triggered it should see that it ran, and
    the run goes through RUNNING like any other: NOT_RUN -> RUNNING -> SUCCESS."""
    from compactmq.compaction.jobs import SparkCompactionService
    from compactmq.compaction.state import NOT_RUN, RUNNING, SUCCESS

    cfg = load_config(overrides={"managedLedgerSyncData": False})
    storage = Storage(str(tmp_path), cfg)
    try:
        storage.open_managed_ledger(TOPIC)
        assert states_of(storage).get(TOPIC).status == NOT_RUN
        written = []  # every status the run writes to the metadata store, in order
        resources = storage.resources.compaction
        put = resources.put
        resources.put = lambda topic, state, version: (
            written.append(state["status"]) or put(topic, state, version)
        )
        result = SparkCompactionService(storage, TOPIC, cfg).compact()  # returns before Spark starts
        assert result.compacted_ledger_id is None and result.horizon is None
        assert written == [RUNNING, SUCCESS]
        state = states_of(storage).get(TOPIC)
        assert state.status == SUCCESS and state.compacted_ledger_id is None and state.horizon is None
    finally:
        storage.close()
