"""A maximum lag as a bound the monitor keeps (``compaction_lagbound``): a lag topic is queued early
enough that its run commits before its oldest uncompacted message is ``compactionMaxLagSeconds``
old -- the check's latency, the wait for a worker and the longest recent job, with a margin --
and not earlier; a policy shorter than that is reported once per topic (a WARN line, the topic's
``maxLag`` status, the metrics) and its topic's runs go back to back. Compaction by the Arrow
test factory (real views in Parquet files, no Spark), in the monitor's process."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from compactmq.admin.metrics import _lag_families
from compactmq.broker.compaction_lagbound import MARGIN_SECONDS, MARGIN_SHARE, LagBound
from compactmq.broker.compaction_watch import DueWatch
from compactmq.storage import COMPACTION_MAX_LAG
from tests.broker.arrow_compaction import ArrowCompactionServiceFactory

from .test_compaction_monitor import env, wait_idle  # noqa: F401 - env: a fixture

NS = "public/default"
TOPIC = f"persistent://{NS}/bound"


def _lead(terms: float) -> float:
    return terms * (1 + MARGIN_SHARE) + MARGIN_SECONDS


class SlowArrowFactory(ArrowCompactionServiceFactory):
    """The Arrow test compaction, every job ``seconds`` longer: a job of known duration."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.jobs = 0

    def new_service(self, topic):
        service = super().new_service(topic)
        compact = service.compact

        def slow(progress=None):
            self.jobs += 1
            time.sleep(self.seconds)
            return compact(progress)

        service.compact = slow
        return service


def _arrow(service, monitor, seconds: float = 0.0) -> SlowArrowFactory:
    factory = SlowArrowFactory(seconds)
    factory.initialize(service.storage, service.config)
    monitor._factory = factory
    return factory


def _append(storage, topic, published_ms: int, key: str = "k") -> None:
    from compactmq.protocol import pulsar_pb2 as pb
    from compactmq.protocol.entry_format import build_entry

    md = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=published_ms, partition_key=key)
    storage.open_managed_ledger(topic).append_many([build_entry(md, b"v")], [published_ms])


def test_the_model_lead_and_floor():
    bound = LagBound()
    assert bound.lead(0.0) == MARGIN_SECONDS and bound.floor(0.0) == MARGIN_SECONDS  # nothing known
    for s in (1.0, 3.0, 2.0):
        bound.job_ended(s)
    bound.check_ended(0.2)
    assert bound.run() == 3.0 and bound.check() == 0.2  # the longest of the last ones
    # the margin: the jobs' measured spread, (3 - 1) / 3 of the longest (at least MARGIN_SHARE)
    share = 2.0 / 3.0
    assert bound.share() == pytest.approx(share)
    assert bound.lead(1.0) == pytest.approx((0.2 + 1.0 + 3.0) * (1 + share) + MARGIN_SECONDS)
    # a message published just after a run read the topic waits for that run, then the lead
    assert bound.floor(0.0) == pytest.approx(3.0 + 3.2 * (1 + share) + MARGIN_SECONDS)
    # split lag jobs: the model's round holds the missed run already
    assert bound.floor(0.0, split_wait=20.0) == pytest.approx(20.2 * (1 + share) + MARGIN_SECONDS)
    for _ in range(5):
        bound.job_ended(0.5)
    assert bound.run() == 0.5  # a slow job is forgotten after KEPT faster ones


def test_a_lag_topic_is_triggered_a_known_job_s_length_before_its_policy(env):  # noqa: F811
    service, monitor, _ = env(compactionMonitorFullScanIntervalInSeconds=3600)
    factory = _arrow(service, monitor)
    now = [5_000_000.0]
    monitor.clock = lambda: now[0]
    service.storage.policies.set_topic_policy(TOPIC, COMPACTION_MAX_LAG, 10)
    t0 = int(now[0] * 1000)
    _append(service.storage, TOPIC, t0)
    monitor.lag_bound.job_ended(3.0)  # jobs take 3 s: a run queued at age a commits at a + 3 s
    lead = _lead(3.0)  # 3.55 s

    async def run():
        now[0] += 6.0  # 6 + 3.55 < 10: not yet -- a run now would be wasted on a view the next replaces
        assert await monitor.check_once() == []
        assert monitor.watch.next_timer() == pytest.approx(t0 / 1000 + 10 - lead, abs=0.002)
        assert monitor.max_lag_status(TOPIC) == {"policySeconds": 10, "floorSeconds": 6.55, "keepable": True}
        now[0] += 0.5  # 6.5 + 3.55 > 10: triggered 3.5 s before the policy, so the commit is within it
        assert await monitor.check_once() == [TOPIC]
        await wait_idle(monitor, TOPIC)
        await monitor.close()

    asyncio.run(run())
    assert factory.jobs == 1
    last = monitor.last_run(TOPIC)
    assert last["status"] == "SUCCESS"
    tl = last["timelineMs"]
    assert tl["oldestPublished"] == t0 and tl["due"] == t0 + 10_000 - int(lead * 1000)
    assert tl["checked"] - t0 == 6_500 < 10_000 - 3_000  # queued with a whole job's time to spare
    view = monitor.service_of(TOPIC)
    assert tuple(view.get_last_compacted_position()) == tuple(
        service.storage.open_managed_ledger(TOPIC).last_position()
    )


@pytest.mark.slow  # about 15 s of wall time
def test_a_known_job_keeps_the_policy_while_producers_publish(env):  # noqa: F811
    """Real time: two topics appended to every 0.1 s for 5 s under a 5 s policy, compacted by
    joint jobs whose length the monitor learned first (each topic's run sleeps 0.5 s): every run
    is queued before its oldest message is 5 s old, and commits before it is."""
    service, monitor, _ = env(
        brokerServiceCompactionMonitorIntervalInSeconds=3600,  # the lag timers drive the checks
        compactionMonitorFullScanIntervalInSeconds=3600,
    )
    _arrow(service, monitor, seconds=0.5)
    topics = [f"persistent://{NS}/kept-{i}" for i in range(2)]

    async def learn():
        for t in topics:
            _append(service.storage, t, int(time.time() * 1000))
        for i in range(3):  # the first job also pays for the factory's first use: forgotten
            if i == 1:
                monitor.lag_bound.job_seconds.clear()
                monitor.lag_bound.job_sizes.clear()
            await monitor.trigger_together(topics)
            for t in topics:
                await wait_idle(monitor, t)

    async def run():
        await monitor.start()
        await learn()
        assert monitor.lag_bound.run() >= 1.0  # a job of the two: 2 x 0.5 s and the compaction
        service.storage.policies.set_namespace_policy(NS, COMPACTION_MAX_LAG, 5)
        monitor.watch.full_scan_soon()  # the topics are new to the watch: look at every topic
        monitor._policies_changed(NS)  # what the broker's policy listener calls: check now
        end = time.time() + 5
        i = 0
        while time.time() < end:
            i += 1
            for t in topics:
                _append(service.storage, t, int(time.time() * 1000), key=f"k{i % 3}")
                monitor.watch.touch(t)  # what the broker's append listener calls
            await asyncio.sleep(0.1)
        await monitor.close()

    asyncio.run(run())
    assert monitor.records.lag_runs >= 2
    for t in topics:
        last = monitor.last_run(t)
        assert last is not None and last["status"] == "SUCCESS", last
        tl = last["timelineMs"]
        assert tl["checked"] - tl["oldestPublished"] < 5_000, tl  # triggered before the policy
    assert monitor.records.lag_runs_over_policy == 0, monitor.records.lag_at_commit_max
    assert 0 < monitor.records.lag_at_commit_max <= 5.0
    assert all(monitor.max_lag_status(t)["keepable"] for t in topics), monitor.max_lag_status(topics[0])


def test_a_policy_shorter_than_the_floor_is_reported_once_and_runs_back_to_back(env, caplog):  # noqa: F811
    service, monitor, _ = env()  # every check looks at every topic
    factory = _arrow(service, monitor)
    now = [6_000_000.0]
    monitor.clock = lambda: now[0]
    service.storage.policies.set_topic_policy(TOPIC, COMPACTION_MAX_LAG, 5)
    monitor.lag_bound.job_ended(3.0)  # floor: 3 s (the run that missed a message) + 3.55 s lead
    caplog.set_level(logging.INFO, logger="compactmq.broker.compaction_monitor")

    def warnings():
        return [r for r in caplog.records if r.levelno == logging.WARNING and "cannot keep" in r.message]

    async def run():
        _append(service.storage, TOPIC, int(now[0] * 1000))
        now[0] += 1.0  # 1 s old: 1 + 3.55 < 5, not due yet
        assert await monitor.check_once() == []
        status = monitor.max_lag_status(TOPIC)
        assert status == {"policySeconds": 5, "floorSeconds": 6.55, "keepable": False}
        assert monitor.lag_bound.unkeepable() == [TOPIC]
        assert len(warnings()) == 1 and TOPIC in warnings()[0].message and "5 s" in warnings()[0].message
        families = {f.name: f for f in _lag_families("c", monitor)}
        assert (
            families["compactmq_compaction_max_lag_floor_seconds"].render().splitlines()[-1].endswith(" 6.55")
        )
        assert await monitor.check_once() == []  # checked again: no second WARN line
        assert len(warnings()) == 1
        # jobs slower than the policy: the lead is the whole lag, due whenever a message waits
        monitor.lag_bound.job_ended(6.0)
        now[0] += 0.01
        assert await monitor.check_once() == [TOPIC]
        await wait_idle(monitor, TOPIC)
        assert len(warnings()) == 1
        # a policy the monitor can keep: said once at INFO; a new short policy is warned again
        monitor.lag_bound.job_seconds.clear()
        monitor.lag_bound.job_sizes.clear()  # the job that ran here: forgotten too
        monitor.lag_bound.job_ended(0.0)  # jobs known to be quick
        service.storage.policies.set_topic_policy(TOPIC, COMPACTION_MAX_LAG, 60)
        _append(service.storage, TOPIC, int(now[0] * 1000))
        assert await monitor.check_once() == []
        assert monitor.max_lag_status(TOPIC)["keepable"] is True
        assert any("keeps its max lag of 60 s again" in r.message for r in caplog.records)
        monitor.lag_bound.job_ended(60.0)
        now[0] += 0.01
        assert await monitor.check_once() == [TOPIC]  # jobs as long as the lag: due at once
        assert len(warnings()) == 2 and "60 s" in warnings()[1].message
        await wait_idle(monitor, TOPIC)
        monitor.forget(TOPIC)
        assert monitor.max_lag_status(TOPIC) is None and monitor.lag_bound.unkeepable() == []
        await monitor.close()

    asyncio.run(run())
    assert factory.jobs == 2


def test_an_append_to_a_busy_topic_starts_no_lag_timer():
    watch = DueWatch(full_scan_seconds=100, clock=lambda: 0.0)
    assert watch.take(0.0) is None
    topic = "persistent://t/n/busy"
    watch.lag_policy(topic, 0.0, time_only=True)  # a lead as long as the lag: due at once
    watch.busy(topic)
    watch.touch(topic)  # appended while its run is queued or running: the run's end is looked at
    assert watch.next_timer() is None
    watch.run_ended(topic)
    assert watch.take(0.0) == [topic]
    watch.touch(topic)  # not busy: the append starts its timer
    assert watch.next_timer() == 0.0


def test_a_floor_that_moves_around_the_policy_warns_once(caplog):
    bound = LagBound()
    caplog.set_level(logging.INFO, logger="compactmq.broker.compaction_monitor")
    topic = "persistent://t/n/edge"
    for floor in (6.0, 4.0, 6.5, 4.5, 7.0):  # the wait for a worker comes and goes
        bound.judge({topic: 5}, floor)
    lines = [(r.levelno, r.message.split(":")[0]) for r in caplog.records]
    assert [level for level, _ in lines] == [logging.WARNING, logging.INFO]
    assert bound.unkeepable() == [topic]  # the status follows the last check
    bound.judge({topic: 4}, 7.0)  # a new policy, still too short: told again
    assert [r.levelno for r in caplog.records][-1] == logging.WARNING
    bound.judge({topic: 0}, 7.0)  # the policy removed: nothing kept of the topic
    assert bound.bound_of(topic) is None and bound.unkeepable() == []


def test_hundreds_of_topics_becoming_unkeepable_at_once_log_a_few_lines_and_a_sum(caplog):
    """A namespace policy shared by 200 topics falls below the floor at one check: five topics are
    named, one line counts the other 195, and every one of them is still reported unkeepable."""
    from compactmq.broker.compaction_lagbound import LOG_LINES_PER_CHECK

    bound = LagBound()
    caplog.set_level(logging.INFO, logger="compactmq.broker.compaction_monitor")
    topics = {f"persistent://t/n/many-{i}": 30 for i in range(200)}
    assert len(bound.judge(topics, 45.0)) == 200
    warnings = [r.message for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == LOG_LINES_PER_CHECK + 1
    assert warnings[-1].startswith(f"{200 - LOG_LINES_PER_CHECK} more topics cannot keep their max lag")
    assert sorted(bound.unkeepable()) == sorted(topics)
    caplog.clear()
    assert bound.judge(topics, 45.0) == []  # told once: the next check logs nothing
    assert caplog.records == []
    bound.judge(topics, 20.0)  # kept again, all of them: the same few lines and a sum
    infos = [r.message for r in caplog.records if r.levelno == logging.INFO]
    assert len(infos) == LOG_LINES_PER_CHECK + 1 and infos[-1].startswith("195 more topics keep")
    assert bound.unkeepable() == []
