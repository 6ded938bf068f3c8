"""The lag bound with many topics: the job-size model (``compaction_jobsize``), the order of the
waiting runs by deadline (``compaction_due.unit_order``), the monitor taking capped jobs while lag
topics wait, and each run's timeline (due, checked, queued, started, committed; the lag of its
oldest message at the commit). Fake and timed compaction factories: no Spark, no sockets."""

from __future__ import annotations

import asyncio
import time

import pytest

from compactmq.broker.compaction_due import take_job, unit_order
from compactmq.broker.compaction_jobsize import JobSizer, wait_seconds
from compactmq.broker.compaction_runs import RunProgress
from compactmq.compaction.state import SUCCESS, states_of
from compactmq.storage import COMPACTION_MAX_LAG

from .test_compaction_monitor import env, publish, wait_idle  # noqa: F401 - env: a fixture
from .timed_engine import TimedFactory

NS = "public/default"


def test_the_model_tells_fixed_cost_from_per_topic_cost():
    sizer = JobSizer(bound=100)
    assert sizer.model() is None and sizer.cap(100, 5) == 100  # nothing known: the bound
    for n in (10, 50, 100, 10, 50):
        sizer.observe(n, 0.3 + 0.02 * n)
    fixed, per_topic = sizer.model()
    assert fixed == pytest.approx(0.3) and per_topic == pytest.approx(0.02)
    assert sizer.seconds(200) == pytest.approx(4.3)


def test_one_size_seen_counts_everything_per_topic():
    sizer = JobSizer(bound=100)
    sizer.observe(100, 2.5)
    sizer.observe(100, 3.0)
    assert sizer.model() == (0.0, pytest.approx(0.03))  # the slowest: a lag bound is a promise


def test_one_job_of_all_while_twice_its_length_fits_the_lag():
    sizer = JobSizer(bound=100)
    for n in (10, 100):
        sizer.observe(n, 0.1 + 0.01 * n)  # 100 topics: 1.1 s, 2.2 s twice: within 80 % of 5 s
    assert sizer.cap(100, 5) == 100 and sizer.last_cap is None


def test_jobs_back_to_back_are_split_round_robin_when_it_pays():
    sizer = JobSizer(bound=100)
    for n in (10, 100):
        sizer.observe(n, 0.1 + 0.02 * n)  # one job of 100: 2.1 s; back to back a message waits 4.2 s
    one = wait_seconds(sizer.model(), 100, 1)
    assert one == pytest.approx(4.2)
    cap = sizer.cap(100, 5)
    assert cap < 100 and sizer.last_cap == cap
    jobs = -(-100 // cap)
    assert wait_seconds(sizer.model(), 100, jobs) < 0.85 * one
    # the best split: no other number of jobs waits less
    assert all(
        wait_seconds(sizer.model(), 100, jobs) <= wait_seconds(sizer.model(), 100, k) for k in range(1, 101)
    )


def test_a_large_fixed_cost_keeps_one_job():
    sizer = JobSizer(bound=100)
    for n in (10, 100):
        sizer.observe(n, 2.0 + 0.005 * n)  # a Spark-like fixed cost: more jobs cost more than they save
    assert sizer.cap(100, 5) == 100


def test_more_lag_topics_than_the_bound_take_at_least_the_bound_s_jobs():
    sizer = JobSizer(bound=50)
    for n in (10, 50):
        sizer.observe(n, 0.01 * n)
    assert sizer.cap(200, 60) == 50  # four jobs of 50 keep a 60 s lag: the bound


def _run(
    topic, *, reason="max lag", priority=1.0, oldest_ms=None, max_lag=0, due_at=None, seq=0, queued_at=0.0
):
    run = RunProgress(topic, reason, queued_at=queued_at, priority=priority, seq=seq)
    run.oldest_ms, run.max_lag, run.due_at = oldest_ms, max_lag, due_at
    return run


def test_waiting_runs_go_by_deadline_not_by_the_priority_of_their_check():
    # "early" was queued barely due (priority 1.0) by one check; "later" by a later check, when it
    # was further past its policy -- but its oldest message is younger: early's deadline is first
    early = _run("early", priority=1.0, oldest_ms=1_000_000, max_lag=5, due_at=1_001.0, seq=1)
    later = _run("later", priority=1.6, oldest_ms=1_002_000, max_lag=5, due_at=1_003.0, seq=2)
    size = _run("size", reason="backlog", priority=9.0, due_at=1_010.0, seq=3)  # due by size after both
    manual = _run("manual", reason="manual", seq=4, queued_at=2_000.0)
    order = sorted([[size], [later], [manual], [early]], key=unit_order)
    assert [u[0].topic for u in order] == ["manual", "early", "later", "size"]
    job, rest = take_job([[size], [later], [early]], max_topics=2, max_bytes=1 << 30)
    assert [r.topic for r in job] == ["early", "later"] and rest == [[size]]


def test_the_monitor_caps_a_job_while_lag_topics_wait(env):  # noqa: F811
    _, monitor, _ = env(compactionJointMaxTopics=100, compactionJointLagSplit=True)
    for n in (10, 100):
        monitor.sizer.observe(n, 0.1 + 0.02 * n)

    def wait_all():
        monitor._pending = [
            [_run(f"persistent://{NS}/w{i}", oldest_ms=1_000_000 + i, max_lag=5, seq=i)] for i in range(100)
        ]
        monitor._runs = {u[0].topic: u[0] for u in monitor._pending}

    wait_all()
    job = monitor._take_job()
    assert len(job) == monitor._job_cap < 100
    assert [r.topic for r in job] == [f"persistent://{NS}/w{i}" for i in range(len(job))]  # oldest first
    # jobs of topics without a maximum lag keep the configured bound
    monitor._pending = [[_run(f"persistent://{NS}/s{i}", reason="backlog", seq=i)] for i in range(100)]
    monitor._runs = {u[0].topic: u[0] for u in monitor._pending}
    assert len(monitor._take_job()) == 100
    monitor.lag_split = False  # compactionJointLagSplit off (the default): the configured bound
    wait_all()
    assert len(monitor._take_job()) == 100
    monitor._pending, monitor._runs = [], {}


def test_the_lag_split_is_off_by_default(env):  # noqa: F811
    _, monitor, _ = env()
    assert monitor.lag_split is False


def test_a_lag_run_records_its_timeline_and_its_lag_at_commit(env):  # noqa: F811
    service, monitor, factory = env(compactionMonitorFullScanIntervalInSeconds=3600)
    topic = f"persistent://{NS}/timeline"
    service.storage.policies.set_topic_policy(topic, COMPACTION_MAX_LAG, 2)
    published = int(time.time() * 1000) - 3_000  # 3 s old: past its 2 s lag
    service.storage.open_managed_ledger(topic).append_many([b"x" * 10], [published])
    factory.release.set()

    async def run():
        assert await monitor.check_once() == [topic]
        await wait_idle(monitor, topic)
        await monitor.close()

    asyncio.run(run())
    last = monitor.last_run(topic)
    tl = last["timelineMs"]
    assert tl["oldestPublished"] == published
    assert tl["due"] <= tl["checked"] <= tl["queued"] <= tl["started"] <= tl["committed"]
    assert tl["due"] < published + 2_000  # due a lead before its lag
    assert last["lagAtCommitMs"] == tl["committed"] - published >= 3_000
    assert monitor.records.lag_runs == 1 and monitor.records.lag_runs_over_policy == 1


@pytest.mark.slow
def test_many_lag_topics_under_a_timed_engine_split_jobs_and_fail_alone(env):  # noqa: F811
    """40 lag topics whose one joint job (1.3 s with the bookkeeping) run back to back would keep a
    message about 2.6 s under a 2 s lag: the monitor learns the jobs' lengths and splits them; a
    topic that fails does so alone, the others keep committing."""
    service, monitor, _ = env(
        brokerServiceCompactionMonitorIntervalInSeconds=1,
        compactionMonitorFullScanIntervalInSeconds=3600,
        compactionJointMaxTopics=100,
        compactionJointLagSplit=True,
    )
    timed = TimedFactory(service.storage, fixed=0.02, per_topic=0.03)
    monitor._factory = timed
    topics = [f"persistent://{NS}/many-{i:03d}" for i in range(40)]
    service.storage.policies.set_namespace_policy(NS, COMPACTION_MAX_LAG, 2)
    timed.fail.add(topics[7])

    async def run():
        await monitor.start()
        end = time.time() + 8
        while time.time() < end:
            now = int(time.time() * 1000)
            for t in topics:
                service.storage.open_managed_ledger(t).append_many([b"x" * 10], [now])
                monitor.watch.touch(t)
            await asyncio.sleep(0.2)
        await monitor.close()

    asyncio.run(run())
    assert min(timed.jobs[3:]) < 39, timed.jobs  # learned: later jobs hold fewer than every topic
    assert monitor.sizer.model() is not None
    states = states_of(service.storage)
    assert all(states.get(t).status == SUCCESS for t in topics if t != topics[7])
    assert monitor.records.stats[topics[7]].failed_count >= 1


def test_a_check_of_many_topics_reads_each_topic_s_policies_once(env):  # noqa: F811
    """The check's metadata reads grow with the topics it looks at, a few each -- its namespace's
    policies are read once per check, not once per topic and policy key."""
    service, monitor, _ = env(compactionMonitorFullScanIntervalInSeconds=3600)
    store = service.storage.metadata_store
    topics = [f"persistent://{NS}/check-{i:03d}" for i in range(200)]
    service.storage.policies.set_namespace_policy(NS, COMPACTION_MAX_LAG, 3600)
    for t in topics:
        service.storage.topic_metadata.create_topic(t)
        service.storage.open_managed_ledger(t).append_many([b"x" * 10])
    monitor.service_of(topics[0])  # the factory's own first reads are not the check's
    reads: list[str] = []
    get = store.get
    store.get = lambda path, *a, **kw: reads.append(path) or get(path, *a, **kw)
    try:
        assert monitor._due_topics(set(), topics) == []  # an hour's lag: nothing due
    finally:
        store.get = get
    namespace_reads = [p for p in reads if p.endswith("/public/default")]
    assert namespace_reads, sorted(set(reads))[:5]  # the path this test takes for a namespace
    assert len(namespace_reads) <= 1, namespace_reads
    assert len(reads) <= 3 * len(topics) + 5, len(reads)
    monitor.watch.full_scan_soon()


def test_an_append_to_a_topic_only_time_makes_due_is_left_to_its_timer():
    from compactmq.broker.compaction_watch import DueWatch

    watch = DueWatch(full_scan_seconds=100, clock=lambda: 0.0)
    assert watch.take(0.0) is None  # the first check reads everything
    lag_only, sized = "persistent://t/n/lag-only", "persistent://t/n/sized"
    watch.lag_policy(lag_only, 4.0, time_only=True)
    watch.lag_policy(sized, 4.0, time_only=False)  # a threshold too: an append may make it due
    watch.touch(lag_only)
    watch.touch(sized)
    # a first append: looked at at once -- its message may be older than the append; the check
    # reads its publish time and sets the exact timer
    assert watch.next_timer() == 0.0
    assert watch.take(0.0) == [lag_only, sized]
    watch.wake_at(lag_only, 4.0)  # what the check sets
    watch.wake_at(sized, 4.0)
    watch.touch(lag_only)  # more appends: nothing to look at before the timer
    watch.touch(sized)
    assert watch.take(1.0) == [sized]
    assert watch.take(2.0) == []
    watch.run_ended(lag_only)  # the end of a run is always looked at
    assert watch.take(3.0) == [lag_only]
    assert watch.take(4.0) == [lag_only, sized]  # the timers
    watch.lag_policy(lag_only, 4.0, time_only=False)  # a threshold was set since
    watch.touch(lag_only)
    assert watch.take(5.0) == [lag_only]
