"""The broker's compaction monitor with a fake compaction service (no Spark, no sockets):
one run per topic, the concurrency limit, live progress, failures and retries, the threshold
check (topic, namespace, broker default; never-compacted topics by total size), the summary log
line, and RUNNING states left by a dead process."""

from __future__ import annotations

import asyncio
import functools
from types import SimpleNamespace
import logging
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from compactmq.broker.compaction_monitor import CompactionMonitor, RunProgress
from compactmq.compaction import (
    CompactionProgress,
    CompactionResult,
    CompactionServiceFactory,
    TopicCompactionService,
)
from compactmq.config import load_config
from compactmq.errors import CompactionError, Conflict, NotAllowed, TopicNotFound
from compactmq.compaction.state import ERROR, NOT_RUN, RUNNING, SUCCESS, states_of
from compactmq.storage import COMPACTION_CURSOR, COMPACTION_THRESHOLD, Storage

T1 = "persistent://public/default/t1"
T2 = "persistent://public/default/t2"


class FakeService:
    def __init__(self, storage, config):
        self.storage = storage
        self.config = config
        self.shutting_down = False
        # the broker's topics as the monitor sees them (who hears of appends and policy
        # changes) and the adapters' hooks after a commit: none here
        self.topics = SimpleNamespace(appended_listeners=[], policy_listeners=[])
        self.post_compaction_hooks: tuple = ()
        self.executor = ThreadPoolExecutor(4)

    def run_blocking(self, fn, *args):
        return asyncio.get_running_loop().run_in_executor(self.executor, functools.partial(fn, *args))


def _mark_running(storage, topic):
    states = states_of(storage)
    return states.mark_running(topic, states.get(topic).version)


class FakeCompaction(TopicCompactionService):
    """Marks RUNNING, reports progress, waits for ``release`` (or fails), commits."""

    def __init__(self, factory, topic):
        self.factory = factory
        self.topic = topic

    def state(self):
        return states_of(self.factory.storage).get(self.topic)

    def compact(self, progress=None):
        states = states_of(self.factory.storage)
        st = states.mark_running(self.topic, self.state().version)
        self.factory.started.append(self.topic)
        progress(CompactionProgress("phase-one", 5, 10))
        self.factory.release.wait(10)
        if self.topic in self.factory.fail:
            states.record_failure(self.topic, "boom", expected_version=st.version)
            raise CompactionError(f"compaction of {self.topic} failed: boom")
        ml = self.factory.storage.open_managed_ledger(self.topic, create=False)
        horizon = ml.last_position()
        states.commit(
            self.topic,
            self.factory.storage.resources.ledger_ids.allocate(),
            horizon,
            expected_version=st.version,
            stats={"duration_ms": 7, "removed_event_count": 3},
        )
        return CompactionResult(self.topic, 99, horizon, 10, 12, 4, 9, 3, 7)

    def read_compacted_entries(self, start_position, n):
        return []

    def read_last_compacted_entry(self):
        return None

    def get_last_compacted_position(self):
        return None

    def try_lock(self):
        """The real per-topic lock (a compact-topic job in another process takes the same one)."""
        from compactmq.compaction.compacted_ledger import topic_dir
        from compactmq.compaction.service import TopicLock

        try:
            return TopicLock(topic_dir(str(self.factory.storage.data_dir), self.topic))
        except Conflict:
            return None


class FakeFactory(CompactionServiceFactory):
    def __init__(self, storage):
        self.storage = storage
        self.release = threading.Event()
        self.started: list[str] = []
        self.fail: set[str] = set()

    def new_service(self, topic):
        return FakeCompaction(self, topic)


@pytest.fixture
def env(tmp_path):
    def make(**overrides):
        # the due rules over every topic at every check: these tests change topics and policies
        # behind the broker's back (test_compaction_watch checks the looking at changed topics)
        overrides.setdefault("compactionMonitorFullScanIntervalInSeconds", 0)
        config = load_config(overrides={"dataDir": str(tmp_path / "data"), **overrides})
        storage = Storage(tmp_path / "data", config)
        service = FakeService(storage, config)
        monitor = CompactionMonitor(service)
        factory = FakeFactory(storage)
        monitor._factory = factory
        made.append((storage, service))
        return service, monitor, factory

    made = []
    yield make
    for storage, service in made:
        service.executor.shutdown(wait=True)
        storage.close()


def publish(storage, topic, n, size=100):
    ml = storage.open_managed_ledger(topic)
    ml.append_many([b"x" * size for _ in range(n)])
    return ml


async def wait_idle(monitor, topic, timeout=10.0):
    for _ in range(int(timeout / 0.02)):
        if not monitor.is_running(topic):
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{topic} still running")


def test_one_run_per_topic_conflict_and_live_progress(env):
    service, monitor, factory = env()
    publish(service.storage, T1, 5)

    async def run():
        await monitor.trigger(T1)
        with pytest.raises(Conflict):
            await monitor.trigger(T1)
        for _ in range(200):
            if factory.started:
                break
            await asyncio.sleep(0.01)
        body = monitor.status_blocking(T1)
        assert body["status"] == RUNNING
        assert body["progress"]["phase"] == "phase-one"
        assert body["progress"]["entriesProcessed"] == 5 and body["progress"]["entriesTotal"] == 10
        factory.release.set()
        await wait_idle(monitor, T1)
        body = monitor.status_blocking(T1)
        assert body == {"status": SUCCESS, "lastError": ""}
        last = monitor.last_run(T1)  # ours: the last run in this process (topic stats)
        assert last["status"] == SUCCESS and last["reason"] == "manual" and last["jobTopics"] == [T1]
        assert monitor.stats[T1].succeed_count == 1 and monitor.stats[T1].removed_event_count == 3
        await monitor.close()

    asyncio.run(run())


def test_unknown_and_non_persistent_topics_are_refused(env):
    service, monitor, factory = env()

    async def run():
        with pytest.raises(TopicNotFound):
            await monitor.trigger("persistent://public/default/nope")
        with pytest.raises(NotAllowed):
            await monitor.trigger("non-persistent://public/default/x")
        await monitor.close()

    asyncio.run(run())
    assert monitor.status_blocking("persistent://public/default/nope")["status"] == NOT_RUN


def test_concurrency_limit_queues_the_extra_run(env):
    service, monitor, factory = env(compactionMaxConcurrentRuns=1)
    publish(service.storage, T1, 3)
    publish(service.storage, T2, 3)

    async def run():
        await monitor.trigger(T1)
        await monitor.trigger(T2)
        for _ in range(500):  # until the one worker runs T1 (it then blocks on factory.release)
            if factory.started:
                break
            await asyncio.sleep(0.02)
        assert factory.started == [T1]  # the second waits for a free worker
        assert monitor.status_blocking(T2)["progress"]["phase"] == "queued"
        factory.release.set()
        await wait_idle(monitor, T1)
        await wait_idle(monitor, T2)
        assert factory.started == [T1, T2]
        await monitor.close()

    asyncio.run(run())


def test_failure_is_recorded_as_error_and_counted(env, caplog):
    service, monitor, factory = env()
    publish(service.storage, T1, 3)
    factory.fail.add(T1)
    factory.release.set()

    async def run():
        await monitor.trigger(T1)
        await wait_idle(monitor, T1)
        await monitor.close()

    with caplog.at_level(logging.ERROR, logger="compactmq.broker.compaction_monitor"):
        asyncio.run(run())
    body = monitor.status_blocking(T1)
    assert body["status"] == ERROR and "boom" in body["lastError"]
    assert monitor.stats[T1].failed_count == 1
    assert any("failed" in r.getMessage() and "boom" in r.getMessage() for r in caplog.records)


def test_summary_log_line(env, caplog):
    service, monitor, factory = env()
    publish(service.storage, T1, 3)
    factory.release.set()

    async def run():
        await monitor.trigger(T1)
        await wait_idle(monitor, T1)
        await monitor.close()

    with caplog.at_level(logging.INFO, logger="compactmq.broker.compaction_monitor"):
        asyncio.run(run())
    lines = [r.getMessage() for r in caplog.records if "done" in r.getMessage()]
    assert len(lines) == 1
    line = lines[0]
    for part in ("entries read 10", "kept 4", "removed 3 messages", "bytes in", "bytes out", "duration"):
        assert part in line, line


def test_threshold_check_topic_namespace_default_and_retry(env):
    service, monitor, factory = env(brokerServiceCompactionThresholdInBytes=0)
    publish(service.storage, T1, 20, size=100)  # ~2 KB
    publish(service.storage, T2, 20, size=100)
    factory.release.set()

    async def run():
        assert await monitor.check_once() == []  # no threshold anywhere: nothing to do
        service.storage.policies.set_namespace_policy("public/default", COMPACTION_THRESHOLD, 1000)
        service.storage.policies.set_topic_policy(
            T2, COMPACTION_THRESHOLD, 0
        )  # the topic policy wins: disabled
        factory.fail.add(T1)
        assert await monitor.check_once() == [T1]
        await wait_idle(monitor, T1)
        assert monitor.status_blocking(T1)["status"] == ERROR
        # the cursor that holds retention back until compaction has read the entries
        assert service.storage.open_managed_ledger(T1).get_cursor(COMPACTION_CURSOR) is not None
        factory.fail.clear()
        assert await monitor.check_once() == [T1]  # retried on the next check
        await wait_idle(monitor, T1)
        assert monitor.status_blocking(T1)["status"] == SUCCESS
        # backlog since the new horizon is 0 now: not due
        assert await monitor.check_once() == []
        publish(service.storage, T1, 20, size=100)
        assert await monitor.check_once() == [T1]
        await wait_idle(monitor, T1)
        await monitor.close()

    asyncio.run(run())


def test_broker_default_threshold_applies_to_topics_without_policy(env):
    service, monitor, factory = env(brokerServiceCompactionThresholdInBytes=500)
    publish(service.storage, T1, 10, size=100)
    publish(service.storage, T2, 2, size=100)
    factory.release.set()

    async def run():
        assert await monitor.check_once() == [T1]  # T2 (200 B) is under the threshold
        await wait_idle(monitor, T1)
        await monitor.close()

    asyncio.run(run())


def test_running_state_left_by_a_dead_process_becomes_error_at_start(env):
    service, monitor, factory = env()
    publish(service.storage, T1, 1)
    _mark_running(service.storage, T1)

    async def run():
        await monitor.start()
        await monitor.close()

    asyncio.run(run())
    body = monitor.status_blocking(T1)
    assert body["status"] == ERROR and "interrupted" in body["lastError"]


def test_progress_eta():
    run = RunProgress("t", "manual", queued_at=0.0)
    run.started_at = 0.0
    run.update("phase-one", 25, 100, now=10.0)
    body = run.as_json(now=10.0)
    assert body["etaSeconds"] == pytest.approx(30.0)
    assert RunProgress("t", "manual", 0.0).as_json(1.0)["etaSeconds"] is None


def test_a_run_in_another_process_is_a_conflict(env):
    """A compact-topic job holds the topic's lock and has marked it RUNNING: 409 here."""
    from compactmq.compaction.compacted_ledger import topic_dir
    from compactmq.compaction.service import TopicLock

    service, monitor, factory = env()
    publish(service.storage, T1, 1)
    lock = TopicLock(topic_dir(str(service.storage.data_dir), T1))
    _mark_running(service.storage, T1)

    async def run():
        await monitor.start()  # the lock is held: the RUNNING state is left alone
        with pytest.raises(Conflict, match="another process"):
            await monitor.trigger(T1)
        await monitor.close()

    try:
        asyncio.run(run())
        body = monitor.status_blocking(T1)
        assert body["status"] == RUNNING and body["progress"]["phase"] == "external"
    finally:
        lock.release()


def publish_at(storage, topic, times_ms, size=100):
    """Entries with the given publish times (what the producers stamped), one per time."""
    ml = storage.open_managed_ledger(topic)
    ml.append_many([b"x" * size for _ in times_ms], list(times_ms))
    return ml


def test_max_lag_compacts_an_old_backlog_whatever_its_size(env):
    from compactmq.storage import COMPACTION_MAX_LAG

    service, monitor, factory = env(brokerServiceCompactionMaxLagInSeconds=60)
    now = [1_000_000.0]  # seconds; the monitor's clock
    monitor.clock = lambda: now[0]
    t0 = int(now[0] * 1000)
    publish_at(service.storage, T1, [t0 - 30_000, t0 - 20_000])  # 30 s old: under the broker's 60 s
    publish_at(service.storage, T2, [t0 - 30_000])
    service.storage.policies.set_topic_policy(
        T2, COMPACTION_MAX_LAG, 0
    )  # the topic policy wins over the default: off
    monitor.lag_bound.job_ended(0.0)  # jobs known to be quick (none known: due at once)
    factory.release.set()

    async def run():
        assert await monitor.check_once() == []
        now[0] += 31  # T1's oldest uncompacted message is 61 s old now
        assert await monitor.check_once() == [T1]  # a few hundred bytes: no threshold would have
        await wait_idle(monitor, T1)
        assert monitor.status_blocking(T1)["status"] == SUCCESS
        assert service.storage.open_managed_ledger(T1).get_cursor(COMPACTION_CURSOR) is not None
        assert await monitor.check_once() == []  # nothing uncompacted left
        publish_at(service.storage, T1, [int(now[0] * 1000)])
        assert await monitor.check_once() == []  # new, but young
        service.storage.policies.set_namespace_policy("public/default", COMPACTION_MAX_LAG, 10)
        now[0] += 11
        assert await monitor.check_once() == [T1]  # the namespace's 10 s apply (T2: its own 0)
        await wait_idle(monitor, T1)
        await monitor.close()

    asyncio.run(run())


def test_min_lag_holds_back_young_messages_from_both_triggers(env):
    from compactmq.storage import COMPACTION_MAX_LAG, COMPACTION_MIN_LAG

    service, monitor, factory = env(brokerServiceCompactionThresholdInBytes=500)
    now = [2_000_000.0]
    monitor.clock = lambda: now[0]
    t0 = int(now[0] * 1000)
    publish_at(service.storage, T1, [t0 - 5_000] * 3 + [t0] * 10)  # 300 B at 5 s old, 1000 B new
    service.storage.policies.set_topic_policy(T1, COMPACTION_MIN_LAG, 60)
    service.storage.policies.set_topic_policy(T1, COMPACTION_MAX_LAG, 1)
    factory.release.set()

    async def run():
        # over the threshold and over the max lag, but every message is younger than 60 s
        assert await monitor.check_once() == []
        now[0] += 56  # the 3 old ones are 61 s old: 300 B compactable, under the threshold, but
        assert await monitor.check_once() == [T1]  # over the max lag
        await wait_idle(monitor, T1)
        service.storage.policies.set_topic_policy(T1, COMPACTION_MAX_LAG, 0)
        await monitor.close()

    asyncio.run(run())
    assert monitor._why_due(service.storage.open_managed_ledger(T1), None, 500, 0, 60) is None  # 300 B
    now[0] += 5  # all 13 older than 60 s: 1300 B > 500 B
    assert "threshold" in monitor._why_due(service.storage.open_managed_ledger(T1), None, 500, 0, 60)
