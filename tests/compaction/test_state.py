"""The compaction state the compaction service owns (``compaction.state``): its transitions, and
the compare-and-set that makes a compacted view that moves backwards impossible by construction
(apache/pulsar#26486) -- on every metadata store implementation but ZooKeeper here (memory and
the embedded SQLite; ``tests/storage/test_compaction_state_zk.py`` runs the same on ZooKeeper).

No Spark: the runner's engine here writes no segment (an empty chain is a valid view)."""

from __future__ import annotations

import os

import pytest

from compactmq.compaction import compacted_ledger as cl
from compactmq.compaction.runner import CompactionRunner
from compactmq.compaction.service import LedgerCompactionService
from compactmq.compaction.state import (
    ERROR,
    NOT_RUN,
    RUNNING,
    SUCCESS,
    CompactionState,
    CompactionStates,
    StaleCompaction,
    states_of,
)
from compactmq.config import load_config
from compactmq.errors import Conflict
from compactmq.storage import COMPACTION_CURSOR, Position, Storage
from compactmq.storage.metadata_store import create_metadata_store
from compactmq.storage.resources import CompactionStateResources

from . import entries as E

T = "persistent://public/default/state"


@pytest.fixture(params=["memory", "sqlite"])
def states(request, tmp_path):
    url = "memory:" if request.param == "memory" else "sqlite:meta.db"
    store = create_metadata_store(url, data_dir=tmp_path)
    clock = iter(range(1000, 10**6, 10))
    yield CompactionStates(CompactionStateResources(store), clock=lambda: next(clock))
    store.close()


def test_lifecycle_not_run_running_success_error(states):
    assert states.get(T) == CompactionState(T)  # never compacted: NOT_RUN, version -1
    running = states.mark_running(T, expected_version=-1)
    assert running.status == RUNNING and running.version == 0 and running.started_ms is not None
    previous, done = states.commit(
        T,
        41,
        Position(3, 9),
        expected_version=running.version,
        stats={"duration_ms": 1200, "removed_event_count": 17},
        details={"keys": 4},
    )
    assert previous is None
    got = states.get(T)
    assert got == done
    assert (got.status, got.compacted_ledger_id, got.horizon, got.last_duration_ms) == (
        SUCCESS,
        41,
        Position(3, 9),
        1200,
    )
    assert (got.removed_event_count, got.details_of, got.details) == (17, 41, {"keys": 4})
    running = states.mark_running(T, got.version)
    failed = states.record_failure(T, "spark exploded", expected_version=running.version, duration_ms=5)
    assert failed is not None and failed.status == ERROR and failed.last_error == "spark exploded"
    assert (failed.compacted_ledger_id, failed.horizon) == (41, Position(3, 9))  # the view stays
    running = states.mark_running(T, failed.version)
    previous, done = states.commit(T, 50, Position(4, 0), expected_version=running.version)
    assert previous == 41 and done.last_error is None
    assert done.details_of == 41  # a run that records no details keeps the previous ones


def test_only_the_written_transitions_are_made(states):
    with pytest.raises(Conflict, match="no transition from NOT_RUN to SUCCESS"):
        CompactionState(T).moved(status=SUCCESS)
    running = states.mark_running(T, -1)
    states.record_empty(T, running.version, duration_ms=3)
    assert states.get(T).status == SUCCESS and states.get(T).compacted_ledger_id is None
    # a RUNNING left by a crashed process is restartable
    assert states.mark_running(T, states.mark_running(T, states.get(T).version).version).status == RUNNING


def test_a_stale_job_cannot_commit_over_a_newer_view(states):
    """apache/pulsar#26486: job A starts, a newer job B (another owner) commits a newer view while
    A still runs; A's late commit must fail and leave B's view in force."""
    a = states.mark_running(T, -1)
    # B: the new owner records A's run as interrupted, starts its own, commits
    states.record_failure(T, "interrupted: the owner changed", expected_version=a.version)
    b = states.mark_running(T, states.get(T).version)
    states.commit(T, 20, Position(5, 0), expected_version=b.version)
    with pytest.raises(StaleCompaction, match="not committed|moved it on"):
        states.commit(T, 10, Position(4, 0), expected_version=a.version)
    with pytest.raises(StaleCompaction):  # whatever its horizon: the version decides
        states.commit(T, 11, Position(9, 0), expected_version=a.version)
    # A's failure is not recorded over B's success either
    assert states.record_failure(T, "A noticed", expected_version=a.version) is None
    got = states.get(T)
    assert (got.status, got.compacted_ledger_id, got.horizon) == (SUCCESS, 20, Position(5, 0))
    with pytest.raises(Conflict):  # nor can A start again on what it read
        states.mark_running(T, a.version)


def test_the_horizon_never_moves_back_even_with_the_right_version(states):
    running = states.mark_running(T, -1)
    _, done = states.commit(T, 1, Position(5, 5), expected_version=running.version)
    running = states.mark_running(T, done.version)
    with pytest.raises(StaleCompaction, match="move back"):
        states.commit(T, 2, Position(5, 4), expected_version=running.version)
    assert states.get(T).horizon == Position(5, 5) and states.get(T).compacted_ledger_id == 1


class DeposingEngine:
    """An engine that writes nothing; while its run is between its RUNNING mark and its commit,
    ``during(plan)`` runs: there another owner takes the topic over and commits a newer view."""

    parallelism = 1

    def __init__(self, during=None):
        self.last_stats: dict = {}
        self.during = during

    def run(self, plan, strategy, report):
        if self.during is not None:
            self.during(plan)
        return []


def _publish(ml, keys):
    ml.append_many([E.single(k, b"v-" + k.encode()) for k in keys])
    ml.rollover()


def test_a_late_run_and_a_reload_never_move_the_view_back(tmp_path):
    """The runner's own path: run A plans, a new owner commits a newer view, A's commit is
    refused (its files are swept, its hold does not move), and a reload -- a new Storage on the
    same data, as after a restart -- reads the newer view's pointer and horizon together."""
    cfg = load_config(overrides={"managedLedgerSyncData": False, "compactionDirectIO": False})
    storage = Storage(tmp_path / "data", cfg)
    try:
        ml = storage.open_managed_ledger(T)
        _publish(ml, ["a", "b"])
        first = CompactionRunner(storage, T, cfg, DeposingEngine()).run()
        assert states_of(storage).get(T).horizon == first.horizon
        _publish(ml, ["c"])
        newer = {}

        def take_over(plan):
            states = states_of(storage)
            running = states.get(T)
            assert running.status == RUNNING
            states.record_failure(T, "interrupted: the owner changed", expected_version=running.version)
            _publish(ml, ["d"])  # the new owner's run reads further than A
            mine = states.mark_running(T, states.get(T).version)
            newer["id"], newer["horizon"] = storage.resources.ledger_ids.allocate(), ml.last_position()
            states.commit(T, newer["id"], newer["horizon"], expected_version=mine.version)

        with pytest.raises(StaleCompaction):
            CompactionRunner(storage, T, cfg, DeposingEngine(take_over)).run()
        state = states_of(storage).get(T)
        assert (state.compacted_ledger_id, state.horizon, state.status) == (
            newer["id"],
            newer["horizon"],
            SUCCESS,
        )
        assert first.horizon < newer["horizon"]
        # the refused run left no view file of its own, and did not move the retention hold
        assert cl.list_compacted_ledgers(tmp_path / "data", T) == [first.compacted_ledger_id]
        assert ml.get_cursor(COMPACTION_CURSOR).mark_delete_position == first.horizon
    finally:
        storage.close()
    with Storage(tmp_path / "data", cfg) as reloaded:
        state = states_of(reloaded).get(T)
        assert (state.compacted_ledger_id, state.horizon) == (newer["id"], newer["horizon"])
        assert LedgerCompactionService(reloaded, T, cfg).get_last_compacted_position() == newer["horizon"]


def test_a_committed_run_moves_the_hold_and_states_survive_a_restart(tmp_path):
    cfg = load_config(overrides={"managedLedgerSyncData": False, "compactionDirectIO": False})
    with Storage(tmp_path / "data", cfg) as storage:
        ml = storage.open_managed_ledger(T)
        assert states_of(storage).get(T).status == NOT_RUN
        _publish(ml, ["a", "b", "a"])
        result = CompactionRunner(storage, T, cfg, DeposingEngine()).run()
        assert ml.get_cursor(COMPACTION_CURSOR).mark_delete_position == result.horizon
        assert states_of(storage).all() == {T: states_of(storage).get(T)}
    with Storage(tmp_path / "data", cfg) as storage:
        state = states_of(storage).get(T)
        assert (state.status, state.compacted_ledger_id, state.horizon) == (
            SUCCESS,
            result.compacted_ledger_id,
            result.horizon,
        )
        assert os.path.isdir(cl.topic_dir(storage.data_dir, T))
        storage.delete_managed_ledger(T)  # the topic's compaction state goes with it
        assert states_of(storage).get(T) == CompactionState(T)
        # and its directory in the compaction layer's area (storage.engine.TOPIC_AREAS)
        assert not os.path.exists(cl.topic_dir(storage.data_dir, T))


def test_a_run_that_straddles_an_ownership_change_commits_nothing(tmp_path):
    """Cluster mode: the run's commit carries the ownership fence the run started under. The
    owner gives the topic's bundle up and takes it again (a new epoch, as after a move and back)
    while the run works: its commit fails with ``Fenced`` and writes nothing -- not even a
    failure (the new epoch's owner records the interrupted run) -- and leaves no view file."""
    from compactmq.storage.resources.fence import Fenced

    ns, bundle = "public/default", "0x00000000_0xffffffff"
    data = {"nativeUrl": "pulsar://a:6650", "httpUrl": "http://a:8080", "disabled": False}
    cfg = load_config(overrides={"managedLedgerSyncData": False, "compactionDirectIO": False})
    storage = Storage(tmp_path / "data", cfg)
    try:
        owners = storage.resources.ownership
        assert owners.try_acquire(ns, bundle, data)[1]
        storage.fence_provider = lambda topic: owners.fence(ns, bundle)
        ml = storage.open_managed_ledger(T)
        _publish(ml, ["a", "b"])
        first = CompactionRunner(storage, T, cfg, DeposingEngine()).run()
        _publish(ml, ["c"])
        version = states_of(storage).get(T).version

        def move_and_back(plan):
            assert owners.release(ns, bundle) and owners.try_acquire(ns, bundle, data)[1]

        with pytest.raises(Fenced):
            CompactionRunner(storage, T, cfg, DeposingEngine(move_and_back)).run()
        state = states_of(storage).get(T)
        assert (state.compacted_ledger_id, state.horizon, state.status) == (
            first.compacted_ledger_id,
            first.horizon,
            RUNNING,
        )
        assert state.version == version + 1  # its RUNNING mark only: no view, no failure
        assert cl.list_compacted_ledgers(tmp_path / "data", T) == [first.compacted_ledger_id]
        assert ml.get_cursor(COMPACTION_CURSOR).mark_delete_position == first.horizon
    finally:
        # a deposed owner cannot seal its ledger either (the ledger list commit is fenced too),
        # yet its close still ends the store session and frees the data directory's lock
        storage.close()
    with Storage(tmp_path / "data", cfg):
        pass


def test_an_empty_topic_run_goes_through_running_to_success(tmp_path, monkeypatch):
    """Nothing to compact on a topic never compacted: the run still writes RUNNING before
    SUCCESS (NOT_RUN -> RUNNING -> SUCCESS, not NOT_RUN -> SUCCESS), and commits no view."""
    cfg = load_config(overrides={"managedLedgerSyncData": False, "compactionDirectIO": False})
    written = []
    put = CompactionStates._put

    def recording_put(self, state, expected_version):
        written.append(state.status)
        return put(self, state, expected_version)

    monkeypatch.setattr(CompactionStates, "_put", recording_put)
    with Storage(tmp_path / "data", cfg) as storage:
        storage.open_managed_ledger(T)
        result = CompactionRunner(storage, T, cfg, DeposingEngine()).run()
        state = states_of(storage).get(T)
    assert written == [RUNNING, SUCCESS]
    assert (result.compacted_ledger_id, state.status, state.compacted_ledger_id) == (None, SUCCESS, None)
