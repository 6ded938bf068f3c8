"""The monitor gathering due topics into joint jobs (fake compaction factory: no Spark, no
sockets): the topics due at one check share one job in priority order, within the job's
bounds; a topic that fails in a joint job does not stop the others committing; triggers that
arrive while a job runs are compacted together by the next job, manual ones first -- also while
the running job is a joint one (Arrow test compaction: real views, no Spark)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from compactmq.compaction.state import ERROR, SUCCESS, states_of
from compactmq.errors import Conflict
from compactmq.storage import COMPACTION_MAX_LAG, COMPACTION_THRESHOLD
from tests.broker.arrow_compaction import ArrowCompactionServiceFactory

from .test_compaction_monitor import publish, wait_idle, env  # noqa: F401 - env: a fixture
from .test_compaction_together import RecordingFactory

TOPICS = [f"persistent://public/default/due-{i}" for i in range(5)]


def _setup(env, **overrides):  # noqa: F811
    service, monitor, _ = env(brokerServiceCompactionThresholdInBytes=0, **overrides)
    factory = RecordingFactory(service.storage)
    monitor._factory = factory
    # 1000 B more backlog per topic: over the threshold from the second on, and the last topic is
    # the most overdue
    for i, topic in enumerate(TOPICS):
        publish(service.storage, topic, 10 * (i + 1), size=100)
        service.storage.policies.set_topic_policy(topic, COMPACTION_THRESHOLD, 1500)
    return service, monitor, factory


def test_due_topics_share_one_job_and_a_failure_stays_its_own(env):  # noqa: F811
    service, monitor, factory = _setup(env)
    factory.fail.add(TOPICS[2])
    factory.release.set()

    async def run():
        due = await monitor.check_once()
        assert sorted(due) == sorted(TOPICS[1:])  # 1000 B is not over 1500 B
        for topic in TOPICS:
            await wait_idle(monitor, topic)
        await monitor.close()

    asyncio.run(run())
    # one job, the most overdue first
    assert factory.together == [list(reversed(TOPICS[1:]))]
    status = {t: states_of(service.storage).get(t).status for t in TOPICS[1:]}
    assert status == {TOPICS[1]: SUCCESS, TOPICS[2]: ERROR, TOPICS[3]: SUCCESS, TOPICS[4]: SUCCESS}
    assert monitor.stats[TOPICS[2]].failed_count == 1 and monitor.stats[TOPICS[3]].succeed_count == 1
    last = monitor.last_run(TOPICS[3])
    assert last["jobTopics"] == list(reversed(TOPICS[1:])) and last["status"] == SUCCESS
    assert monitor.last_run(TOPICS[2])["status"] == ERROR


def test_bounds_split_the_due_topics_into_jobs_by_priority(env):  # noqa: F811
    _, monitor, factory = _setup(env, compactionJointMaxTopics=2)
    factory.release.set()

    async def run():
        await monitor.check_once()
        for topic in TOPICS:
            await wait_idle(monitor, topic)
        await monitor.close()

    asyncio.run(run())
    assert factory.together == [[TOPICS[4], TOPICS[3]], [TOPICS[2], TOPICS[1]]]


def test_byte_bound_and_the_first_unit_always_goes(env):  # noqa: F811
    # backlogs of 5000, 4000, 3000 and 2000 B within 5500 B a job: 5000 alone, 4000 alone (with
    # 3000 or 2000 it would be over), then 3000 + 2000
    _, monitor, factory = _setup(env, compactionJointMaxBytes=5500)
    factory.release.set()

    async def run():
        await monitor.check_once()
        for topic in TOPICS:
            await wait_idle(monitor, topic)
        await monitor.close()

    asyncio.run(run())
    # jobs of one topic go through compact(), not compact_together
    assert factory.together == [[TOPICS[2], TOPICS[1]]]
    assert factory.started[:2] == [TOPICS[4], TOPICS[3]]


def test_triggers_during_a_job_are_honoured_together_by_the_next_manual_first(env):  # noqa: F811
    service, monitor, factory = _setup(env)
    late = "persistent://public/default/late"
    publish(service.storage, late, 100, size=100)
    service.storage.policies.set_topic_policy(late, COMPACTION_MAX_LAG, 1)

    async def run():
        await monitor.trigger(TOPICS[0])  # a free worker: starts at once, alone
        while not factory.started:
            await asyncio.sleep(0.01)
        # while it runs: a check finds the others due, then two manual triggers arrive
        monitor.clock = lambda: time.time() + 3600  # everything is an hour old
        due = await monitor.check_once()
        assert set(due) == {*TOPICS[1:], late}
        manual = "persistent://public/default/manual"
        publish(service.storage, manual, 1)
        await monitor.trigger(manual)
        assert monitor.status_blocking(manual)["progress"]["phase"] == "queued"
        factory.release.set()
        for topic in [*TOPICS, late, manual]:
            await wait_idle(monitor, topic)
        await monitor.close()
        return manual

    manual = asyncio.run(run())
    assert factory.started[0] == TOPICS[0]
    # the next job took every waiting run: the manual trigger first, then the most overdue
    assert len(factory.together) == 1
    job = factory.together[0]
    assert job[0] == manual and set(job[1:]) == {*TOPICS[1:], late}
    assert job[1] == late  # an hour old against a max lag of 1 s: by far the most overdue
    assert all(states_of(service.storage).get(t).status == SUCCESS for t in job)


def test_a_topic_whose_last_run_failed_gets_a_job_of_its_own(env):  # noqa: F811
    """A failure of a joint Spark job fails every topic in it: the topic that failed last time
    runs alone at the next check, so it cannot take the healthy topics down at every check."""
    service, monitor, factory = _setup(env)
    factory.fail.add(TOPICS[3])
    factory.release.set()

    async def run():
        await monitor.check_once()
        for topic in TOPICS:
            await wait_idle(monitor, topic)
        for i, topic in enumerate(TOPICS):  # all due again
            publish(service.storage, topic, 10 * (i + 1), size=100)
        await monitor.check_once()
        for topic in TOPICS:
            await wait_idle(monitor, topic)
        await monitor.close()

    asyncio.run(run())
    first = list(reversed(TOPICS[1:]))
    # the second check: the failed topic (8000 B uncompacted, the most overdue) in a job of its
    # own, then the others together in priority order (due-0 is due now too: 2000 B)
    assert factory.together == [first, [TOPICS[4], TOPICS[2], TOPICS[0], TOPICS[1]]]
    assert factory.started[len(first)] == TOPICS[3]


class HeldArrowFactory(ArrowCompactionServiceFactory):
    """The Arrow test compaction (real views, no Spark), recording each joint job's topics; the
    first joint job waits for ``release`` before it compacts anything."""

    def __init__(self) -> None:
        self.together: list[list[str]] = []
        self.release = threading.Event()

    def compact_together(self, services, progress=None):
        self.together.append([s.topic for s in services])
        if len(self.together) == 1:
            self.release.wait(30)
        return super().compact_together(services, progress)


def test_triggers_during_a_joint_job_are_honoured_by_the_next(env):  # noqa: F811
    """A joint job of two due topics is running; meanwhile a check finds a lag topic due and a
    manual trigger arrives (and a trigger of a topic of the running job is refused): the next
    job takes both, the manual one first, and every topic's view holds its latest values."""
    service, monitor, _ = env(compactionMonitorFullScanIntervalInSeconds=0)
    factory = HeldArrowFactory()
    factory.initialize(service.storage, service.config)
    monitor._factory = factory
    first = [f"persistent://public/default/first-{i}" for i in range(2)]
    lagged, manual = "persistent://public/default/lagged", "persistent://public/default/manual"
    old = int(time.time() * 1000) - 3_600_000
    for topic in first:
        _keyed(service.storage, topic, old, 3)
        service.storage.policies.set_topic_policy(topic, COMPACTION_THRESHOLD, 1)
    service.storage.policies.set_topic_policy(lagged, COMPACTION_MAX_LAG, 60)

    async def run():
        assert sorted(await monitor.check_once()) == first  # one joint job of the two
        while not factory.together:
            await asyncio.sleep(0.01)
        # while it runs: a lag topic falls due, a manual trigger comes in
        _keyed(service.storage, lagged, old, 2)  # an hour old against a 60 s lag
        _keyed(service.storage, manual, int(time.time() * 1000), 2)
        assert await monitor.check_once() == [lagged]
        await monitor.trigger(manual)
        with pytest.raises(Conflict):
            await monitor.trigger(first[0])  # in the running job
        assert monitor.status_blocking(manual)["progress"]["phase"] == "queued"
        factory.release.set()
        for topic in [*first, lagged, manual]:
            await wait_idle(monitor, topic)
        await monitor.close()

    asyncio.run(run())
    assert factory.together == [first, [manual, lagged]]  # the next job: both, the manual one first
    for topic, n in [(first[0], 3), (first[1], 3), (lagged, 2), (manual, 2)]:
        assert states_of(service.storage).get(topic).status == SUCCESS, topic
        assert monitor.last_run(topic)["jobTopics"] == (first if topic in first else [manual, lagged])
        view = monitor.service_of(topic).read_compacted_entries((-1, -1), 100)
        assert len(view) == n, (topic, view)  # one entry per key: its latest value


def _keyed(storage, topic, published_ms, keys):
    """Two values of each of ``keys`` keys, published at ``published_ms``."""
    from compactmq.protocol import pulsar_pb2 as pb
    from compactmq.protocol.entry_format import build_entry

    entries = []
    for round_ in range(2):
        for k in range(keys):
            md = pb.MessageMetadata(
                producer_name="p",
                sequence_id=round_ * keys + k,
                publish_time=published_ms,
                partition_key=f"k{k}",
            )
            entries.append(build_entry(md, f"v{round_}".encode()))
    storage.open_managed_ledger(topic).append_many(entries, [published_ms] * len(entries))
