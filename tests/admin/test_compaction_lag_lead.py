"""A maximum lag is a bound on when a message is in a committed view, not on when its run starts:
the monitor makes a lag topic due ``lag_lead_seconds`` early (the check's latency, the wait for a
busy worker, the longest recent job, a margin: ``compaction_lagbound``; at most the whole lag),
and its check loop wakes at the watch's lag
timers -- an append to a lag topic starts one -- instead of waiting for the interval. Fake
compaction factory: no Spark, no sockets."""

from __future__ import annotations

import asyncio

from compactmq.broker.compaction_due import lag_lead_ms
from compactmq.broker.compaction_lagbound import MARGIN_SECONDS, MARGIN_SHARE
from compactmq.storage import COMPACTION_MAX_LAG

from .test_compaction_monitor import env, wait_idle  # noqa: F401 - env: a fixture

TOPIC = "persistent://public/default/lead"


def _lead(terms: float) -> float:
    return terms * (1 + MARGIN_SHARE) + MARGIN_SECONDS


def test_lead_is_capped_at_the_lag():
    assert lag_lead_ms(10, 4_250) == 4_250
    assert lag_lead_ms(10, 100_000) == 10_000  # a run slower than the lag: due whenever anything waits
    assert lag_lead_ms(0, 4_250) == 0  # no max lag, no lead
    assert lag_lead_ms(10, -5) == 0


def test_a_lag_topic_is_due_a_run_s_length_before_its_max_lag(env):  # noqa: F811
    service, monitor, factory = env(compactionMonitorFullScanIntervalInSeconds=3600)
    now = [3_000_000.0]
    monitor.clock = lambda: now[0]
    service.storage.policies.set_topic_policy(TOPIC, COMPACTION_MAX_LAG, 10)
    service.storage.open_managed_ledger(TOPIC).append_many([b"x" * 10] * 3, [int(now[0] * 1000)] * 3)
    monitor._job_seconds.append(4.0)  # the last jobs took up to 4 s
    assert monitor.lag_lead_seconds() == _lead(4.0) == 4.65
    factory.release.set()

    async def run():
        now[0] += 5.3  # 5.3 + 4.65 < 10: a run started now would commit before the bound
        assert await monitor.check_once() == []
        assert monitor.watch.waiting == 1  # woken when it is due, not at the 10 s bound
        now[0] += 0.1  # 5.4 + 4.65 > 10
        assert await monitor.check_once() == [TOPIC]
        await wait_idle(monitor, TOPIC)
        status = monitor.last_run(TOPIC)
        assert status is not None and "max lag 10 s" in status["reason"]
        await monitor.close()

    asyncio.run(run())


def test_an_append_to_a_lag_topic_wakes_the_check_loop_before_the_interval(env):  # noqa: F811
    service, monitor, factory = env(
        brokerServiceCompactionMonitorIntervalInSeconds=3600,
        compactionMonitorFullScanIntervalInSeconds=3600,
    )
    service.storage.policies.set_topic_policy(TOPIC, COMPACTION_MAX_LAG, 1)
    service.storage.open_managed_ledger(TOPIC)
    factory.release.set()

    async def run():
        await monitor.start()
        assert await monitor.check_once() == []  # the first, full check: empty, no timer
        assert monitor.watch.has_lag(TOPIC) and monitor.watch.waiting == 0
        service.storage.open_managed_ledger(TOPIC).append_many([b"x" * 10])
        monitor.watch.touch(TOPIC)  # what the broker's append listener calls
        assert monitor.watch.waiting == 1
        for _ in range(150):
            if factory.started:
                break
            await asyncio.sleep(0.02)
        assert factory.started == [TOPIC]  # within 3 s, not the hour of the interval
        await wait_idle(monitor, TOPIC)
        await monitor.close()

    asyncio.run(run())


def test_a_topic_without_a_max_lag_starts_no_timer_on_append(env):  # noqa: F811
    service, monitor, factory = env(compactionMonitorFullScanIntervalInSeconds=3600)
    service.storage.open_managed_ledger(TOPIC).append_many([b"x" * 10])

    async def run():
        await monitor.check_once()
        assert not monitor.watch.has_lag(TOPIC)
        monitor.watch.touch(TOPIC)
        assert monitor.watch.waiting == 0 and monitor.watch.next_timer() is None
        await monitor.close()

    asyncio.run(run())


def test_lag_topics_about_to_fall_due_join_the_job_of_a_due_one(env):  # noqa: F811
    service, monitor, factory = env(compactionMonitorFullScanIntervalInSeconds=3600)
    now = [4_000_000.0]
    monitor.clock = lambda: now[0]
    early, late = "persistent://public/default/early", "persistent://public/default/late"
    for topic in (early, late):
        service.storage.policies.set_topic_policy(topic, COMPACTION_MAX_LAG, 10)
    service.storage.open_managed_ledger(early).append_many([b"x" * 10], [int(now[0] * 1000)])
    service.storage.open_managed_ledger(late).append_many([b"x" * 10], [int(now[0] * 1000) + 2000])
    monitor._job_seconds.append(4.0)  # lead 4.65 s; a topic due within one more job joins
    factory.release.set()

    async def run():
        now[0] += 5.3  # early: 5.3 + 4.65 < 10; late would join, but nothing is due
        assert await monitor.check_once() == []
        now[0] += 0.1  # early is due; late (3.4 s old) would be due within 4 s: it comes along
        assert await monitor.check_once() == [early, late]
        await wait_idle(monitor, early)
        await wait_idle(monitor, late)
        assert monitor.last_run(late)["jobTopics"] == [early, late]  # one job
        # it comes along as the rest of the due topic's job's worth in deadline order
        # (``compaction_lagqueue``), before it would join by its own lead plus a job's length
        assert "max lag 10 s" in monitor.last_run(late)["reason"]
        await monitor.close()

    asyncio.run(run())


def test_take_ahead_hands_timers_about_to_fall_due_and_the_check_rearms_them():
    from compactmq.broker.compaction_watch import DueWatch

    watch = DueWatch(full_scan_seconds=100, clock=lambda: 0.0)
    assert watch.take(0.0) is None  # the first check reads everything
    watch.wake_at("persistent://t/n/soon", 12.0)
    watch.wake_at("persistent://t/n/later", 30.0)
    assert watch.next_timer() == 12.0
    assert watch.take(10.0) == []
    assert watch.take(10.0, ahead=5.0) == ["persistent://t/n/soon"]  # within a job's length
    assert watch.next_timer() == 30.0
    watch.lag_policy("persistent://t/n/lagged", 4.0)
    watch.touch("persistent://t/n/lagged")  # an append: looked at now (its message may be older)
    assert watch.next_timer() == 0.0
    watch.lag_policy("persistent://t/n/lagged", None)
    assert not watch.has_lag("persistent://t/n/lagged")


def test_the_lead_counts_the_jobs_already_waiting(env):  # noqa: F811
    from compactmq.broker.compaction_runs import RunProgress

    service, monitor, factory = env(compactionJointMaxTopics=2)
    monitor._job_seconds.append(2.0)
    assert monitor.lag_lead_seconds() == _lead(2.0)
    # five runs waiting for the one worker: two jobs of two go first, the third has room for it
    monitor._pending = [[RunProgress(f"persistent://public/default/w{i}", "manual", 0.0)] for i in range(5)]
    assert monitor.lag_lead_seconds() == _lead(2 * 2.0 + 2.0)
    # six: three full jobs go first
    monitor._pending.append([RunProgress("persistent://public/default/w5", "manual", 0.0)])
    assert monitor.lag_lead_seconds() == _lead(3 * 2.0 + 2.0)
    monitor._pending = []
