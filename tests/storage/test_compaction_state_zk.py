"""Compaction trigger, status, commit and restart with the metadata store on a real ZooKeeper
(the session's server, a chroot per test) and on the embedded store, through the broker's
compaction monitor and the Arrow test factory (a real, Spark-free compaction service).

The compaction state lives in the metadata store (``compaction.state``): on ZooKeeper a second
process, or a restarted broker, reads the same status, pointer and horizon; a commit by a run
that no longer holds the state is refused there too."""

from __future__ import annotations

import asyncio
import functools
from types import SimpleNamespace
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from compactmq.broker.compaction_monitor import CompactionMonitor
from compactmq.compaction import CompactionServiceFactory
from compactmq.compaction.service import LedgerCompactionService
from compactmq.compaction.state import RUNNING, SUCCESS, StaleCompaction, states_of
from compactmq.config import load_config
from compactmq.storage import COMPACTION_CURSOR, Storage

from tests.compaction import entries as E

T = "persistent://public/default/zk-compacted"
ARROW = "tests.broker.arrow_compaction.ArrowCompactionServiceFactory"


class BrokerShim:
    """What the compaction monitor needs of a broker: storage, config, a worker pool."""

    def __init__(self, storage, config):
        self.storage = storage
        self.config = config
        self.shutting_down = False
        # the broker's topics as the monitor sees them (who hears of appends and policy
        # changes) and the adapters' hooks after a commit: none here
        self.topics = SimpleNamespace(appended_listeners=[], policy_listeners=[])
        self.post_compaction_hooks: tuple = ()
        self.executor = ThreadPoolExecutor(2)

    def run_blocking(self, fn, *args):
        return asyncio.get_running_loop().run_in_executor(self.executor, functools.partial(fn, *args))


@pytest.fixture(params=["sqlite", "zk"])
def config(request, tmp_path):
    url = ""
    if request.param == "zk":
        url = f"zk:{request.getfixturevalue('zookeeper').hosts}/c{uuid.uuid4().hex[:12]}"
    return load_config(
        overrides={
            "dataDir": str(tmp_path / "data"),
            "metadataStoreUrl": url,
            "metadataStoreOperationTimeoutSeconds": 10,
            "compactionServiceFactoryClassName": ARROW,
            "brokerServiceCompactionMonitorIntervalInSeconds": 0,
            "managedLedgerSyncData": False,
        }
    )


def _publish(storage, pairs):
    ml = storage.open_managed_ledger(T)
    ml.append_many([E.single(k, v) for k, v in pairs])
    return ml


def _compact(storage, config, factory=None):
    """Trigger one compaction through the monitor (``factory``: instead of the configured one),
    wait for it; the status body after it and the view in force."""
    broker = BrokerShim(storage, config)
    monitor = CompactionMonitor(broker)
    if factory is not None:
        factory.initialize(storage, config)
        monitor._factory = factory

    async def run():
        await monitor.start()
        await monitor.trigger(T)
        for _ in range(1000):
            if not monitor.is_running(T):
                break
            await asyncio.sleep(0.01)
        body = await broker.run_blocking(monitor.status_blocking, T)
        view = await broker.run_blocking(lambda: monitor.service_of(T).open_view())
        await monitor.close()
        return body, view

    try:
        return asyncio.run(run())
    finally:
        broker.executor.shutdown(wait=True)


def _keys(view):
    from tests.broker.arrow_compaction import messages

    return sorted((k, p) for _, e in view.read((0, 0), 100) for _, k, p, out in messages(e)[1] if not out)


def test_trigger_status_commit_restart(config, tmp_path):
    data = tmp_path / "data"
    with Storage(data, config) as storage:
        ml = _publish(storage, [("a", b"1"), ("b", b"1"), ("a", b"2")])
        body, view = _compact(storage, config)
        assert body == {"status": SUCCESS, "lastError": ""}
        first = states_of(storage).get(T)
        assert first.horizon == ml.last_position() and view.view_id == first.compacted_ledger_id
        assert ml.get_cursor(COMPACTION_CURSOR).mark_delete_position == first.horizon
    # a restart: a new store session (ZooKeeper) or connection (embedded) reads the same state
    with Storage(data, config) as storage:
        state = states_of(storage).get(T)
        assert (state.status, state.compacted_ledger_id, state.horizon) == (
            SUCCESS,
            first.compacted_ledger_id,
            first.horizon,
        )
        ml = _publish(storage, [("b", b"2"), ("c", b"1")])
        body, view = _compact(storage, config)  # incremental: the view plus what came after it
        assert body["status"] == SUCCESS
        second = states_of(storage).get(T)
        assert second.horizon == ml.last_position() > first.horizon
        assert second.compacted_ledger_id != first.compacted_ledger_id
        assert view.view_id == second.compacted_ledger_id


def test_a_stale_commit_is_refused_by_the_store(config, tmp_path):
    """Two processes share the store (a compact-topic job is a read-only Storage beside the
    broker): a run that marked RUNNING and was overtaken cannot commit, on ZooKeeper too."""
    data = tmp_path / "data"
    with Storage(data, config) as broker:
        ml = _publish(broker, [("a", b"1")])
        job = Storage(data, config, read_only=True)
        try:
            jobs = states_of(job)
            stale = jobs.mark_running(T, jobs.get(T).version)
            assert states_of(broker).get(T).status == RUNNING  # the broker sees the job's run
            owner = states_of(broker)
            owner.record_failure(T, "interrupted", expected_version=stale.version)
            mine = owner.mark_running(T, owner.get(T).version)
            owner.commit(
                T, broker.resources.ledger_ids.allocate(), ml.last_position(), expected_version=mine.version
            )
            with pytest.raises(StaleCompaction):
                jobs.commit(
                    T, job.resources.ledger_ids.allocate(), ml.last_position(), expected_version=stale.version
                )
            assert jobs.get(T) == owner.get(T)
        finally:
            job.close()


class NoSparkService(LedgerCompactionService):
    """The default service (runner, compacted ledgers, read side) with an engine that writes no
    segment: an empty chain is a valid view, and no JVM starts."""

    def engine(self):
        from tests.compaction.test_state import DeposingEngine

        return DeposingEngine()


class NoSparkFactory(CompactionServiceFactory):
    def new_service(self, topic: str) -> NoSparkService:
        return NoSparkService(self.storage, topic, self.config)


KILLED_JOB = """
import json, os, signal, sys
sys.path.insert(0, sys.argv[1])
from compactmq.compaction.runner import CompactionRunner
from compactmq.config import load_config
from compactmq.storage import Storage
from tests.compaction.test_state import DeposingEngine

data, topic, conf, point = sys.argv[2], sys.argv[3], json.loads(sys.argv[4]), sys.argv[5]

def die(at):
    if at == point:
        os.kill(os.getpid(), signal.SIGKILL)

cfg = load_config(overrides=conf)
st = Storage(data, cfg, read_only=True)  # a compact-topic job beside the broker
CompactionRunner(st, topic, cfg, DeposingEngine(), abort_hook=die).run()
"""


@pytest.mark.parametrize("point", ["planned", "before-commit", "after-commit"])
def test_sigkill_around_the_commit_never_moves_the_view_back(config, tmp_path, point):
    """A compact-topic job SIGKILLed before or after its commit: the view is the old one or the
    new one, never an older one; the broker records the interrupted run, a rerun lands, and no
    view file is left that the state does not name."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from compactmq.compaction import compacted_ledger as cl
    from compactmq.compaction.runner import CompactionRunner
    from tests.compaction.test_state import DeposingEngine

    data = tmp_path / "data"
    conf = {k: config[k] for k in ("dataDir", "metadataStoreUrl", "managedLedgerSyncData")}
    conf["compactionDirectIO"] = False
    with Storage(data, config) as broker:
        _publish(broker, [("a", b"1")])
        broker.seal_current_ledger(T)
        first = CompactionRunner(broker, T, config, DeposingEngine()).run()
        _publish(broker, [("b", b"1")])
        broker.seal_current_ledger(T)
        root = str(Path(__file__).resolve().parents[2])
        proc = subprocess.run(
            [sys.executable, "-c", KILLED_JOB, root, str(data), T, json.dumps(conf), point],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == -9, proc.stderr[-3000:]
        state = states_of(broker).get(T)
        assert state.horizon >= first.horizon  # never backwards
        if point == "after-commit":
            assert state.status == SUCCESS and state.compacted_ledger_id != first.compacted_ledger_id
        else:
            assert (state.status, state.compacted_ledger_id) == (RUNNING, first.compacted_ledger_id)
        # the broker at start: a RUNNING nobody holds the lock of was interrupted (recorded as
        # ERROR), then a run through the monitor with the default runner
        body, _ = _compact(broker, config, NoSparkFactory())
        assert body["status"] == SUCCESS
        after = states_of(broker).get(T)
        assert after.horizon >= state.horizon
        assert cl.list_compacted_ledgers(data, T) == [after.compacted_ledger_id]
