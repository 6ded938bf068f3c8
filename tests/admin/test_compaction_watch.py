"""The monitor's check looks only at the topics that changed (``broker.compaction_watch``): the
first check reads every topic, later ones only those appended to, whose policies changed, whose
lag came due or whose run ended; a full check comes back every
``compactionMonitorFullScanIntervalInSeconds``. Fake compaction factory: no Spark, no sockets."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings, strategies as st

from compactmq.broker.compaction_watch import DueWatch
from compactmq.storage import COMPACTION_MAX_LAG, COMPACTION_MIN_LAG, COMPACTION_THRESHOLD

from .test_compaction_monitor import env, publish, wait_idle  # noqa: F401 - env: a fixture

IDLE = [f"persistent://public/default/idle-{i}" for i in range(30)]
HOT = "persistent://public/default/hot"


def test_take_hands_each_changed_topic_once_and_timers_when_due():
    watch = DueWatch(full_scan_seconds=100)
    assert watch.take(0.0) is None  # the first check reads every topic
    assert watch.take(1.0) == []
    watch.touch("persistent://t/n/a")
    watch.touch("persistent://t/n/a")
    watch.wake_at("persistent://t/n/b", 5.0)
    watch.wake_at("persistent://t/n/b", 9.0)  # a later timer does not delay the earlier one
    assert watch.take(2.0) == ["persistent://t/n/a"]
    assert watch.take(4.9) == []
    assert watch.take(5.0) == ["persistent://t/n/b"] and watch.waiting == 0
    assert watch.take(50.0) == []
    assert watch.take(100.0) is None  # the full-scan interval passed
    assert watch.full_checks == 2


def test_a_read_drops_the_timer_guessed_at_a_run_end_so_the_next_append_looks_at_once():
    now = [10.0]
    watch = DueWatch(full_scan_seconds=100, clock=lambda: now[0])
    topic = "persistent://t/n/lagged"
    watch.take(0.0)
    watch.lag_policy(topic, 29.75, time_only=True)  # what a check of it said: only time makes it due
    watch.busy(topic)
    watch.run_ended(topic)  # a guess: a message published from now on is due 29.75 s on
    assert watch.next_timer() == 39.75
    assert watch.take(11.0) == [topic]  # the end of its run is looked at
    watch.reading(topic)  # ... and the check found nothing uncompacted: it sets no timer
    assert watch.next_timer() is None and watch.waiting == 0
    now[0] = 11.0
    watch.touch(topic)  # a message published before the run ended may be due before 39.75
    assert watch.next_timer() == 11.0 and watch.take(11.0) == [topic]


def test_policy_changes_reach_the_namespace_topics_and_partitions():
    watch = DueWatch(full_scan_seconds=100)
    watch.take(0.0)
    seen = ["persistent://t/n/a", "persistent://t/n/p-partition-0", "persistent://t/n/p-partition-1"]
    for topic in seen + ["persistent://t/other/c"]:
        watch.looked_at(topic)
    watch.policies_changed("t/n")
    assert watch.take(1.0) == sorted(seen)
    watch.policies_changed("persistent://t/n/p")
    assert watch.take(2.0) == ["persistent://t/n/p", *seen[1:]]
    watch.forget("persistent://t/n/a")
    watch.policies_changed("t/n")
    assert watch.take(3.0) == seen[1:]


def test_zero_full_scan_interval_reads_every_topic_at_every_check():
    watch = DueWatch(full_scan_seconds=0)
    assert [watch.take(t) for t in (0.0, 1.0, 2.0)] == [None, None, None]


def test_a_check_reads_only_the_topics_that_changed(env):  # noqa: F811
    service, monitor, factory = env(
        brokerServiceCompactionThresholdInBytes=500, compactionMonitorFullScanIntervalInSeconds=3600
    )
    for topic in IDLE:
        publish(service.storage, topic, 2, size=100)  # 200 B: under the threshold
    publish(service.storage, HOT, 2, size=100)
    factory.release.set()
    read = []
    settings_of = monitor._due.settings_of  # one read of a topic's policies per check
    monitor._due.settings_of = lambda topic, ns: read.append(topic) or settings_of(topic, ns)

    async def run():
        assert await monitor.check_once() == []
        assert len(read) == len(IDLE) + 1  # the first check reads every topic
        read.clear()
        publish(service.storage, HOT, 10, size=100)
        assert await monitor.check_once() == []  # nobody said HOT changed: not read
        assert read == []
        monitor.watch.touch(HOT)  # what the broker's topic does after an append
        assert await monitor.check_once() == [HOT]
        assert read == [HOT]
        await wait_idle(monitor, HOT)
        read.clear()
        assert await monitor.check_once() == []  # the end of its run: HOT is read once more
        assert read == [HOT]
        read.clear()
        # a namespace policy set through the admin API: every topic of it is read again
        service.storage.policies.set_namespace_policy("public/default", COMPACTION_THRESHOLD, 100)
        monitor.watch.policies_changed("public/default")
        due = await monitor.check_once()
        assert sorted(due) == sorted(IDLE) and len(read) == len(IDLE) + 1
        for topic in IDLE:
            await wait_idle(monitor, topic)
        await monitor.close()

    asyncio.run(run())


def test_lags_wake_a_topic_when_time_makes_it_due(env):  # noqa: F811
    service, monitor, factory = env(compactionMonitorFullScanIntervalInSeconds=3600)
    now = [1_000_000.0]
    monitor.clock = lambda: now[0]
    lagged, held = "persistent://public/default/lagged", "persistent://public/default/held"
    service.storage.policies.set_topic_policy(lagged, COMPACTION_MAX_LAG, 30)
    service.storage.policies.set_topic_policy(held, COMPACTION_THRESHOLD, 500)
    service.storage.policies.set_topic_policy(held, COMPACTION_MIN_LAG, 60)
    published = int(now[0] * 1000)
    service.storage.open_managed_ledger(lagged).append_many([b"x" * 10] * 3, [published] * 3)
    service.storage.open_managed_ledger(held).append_many([b"x" * 100] * 10, [published] * 10)
    monitor.lag_bound.job_ended(0.0)  # jobs known to be quick (none known: due at once)
    factory.release.set()

    async def run():
        now[0] += 10
        assert await monitor.check_once() == []  # 10 s old: under both lags
        assert monitor.watch.waiting == 2
        now[0] += 15
        assert await monitor.check_once() == []  # nothing is read: no timer is due yet
        assert monitor.watch.topics_checked == 0
        now[0] += 6  # 31 s: past the maximum lag of 30 s
        assert await monitor.check_once() == [lagged]
        await wait_idle(monitor, lagged)
        now[0] += 30  # 61 s: the messages the minimum lag held back count now, over 500 B
        assert held in await monitor.check_once()
        await wait_idle(monitor, held)
        await monitor.close()

    asyncio.run(run())


def test_a_topic_past_its_max_lag_but_held_by_its_min_lag_waits_for_the_min_lag(env):  # noqa: F811
    service, monitor, factory = env(compactionMonitorFullScanIntervalInSeconds=3600)
    now = [2_000_000.0]
    monitor.clock = lambda: now[0]
    topic = "persistent://public/default/both-lags"
    service.storage.policies.set_topic_policy(topic, COMPACTION_MAX_LAG, 30)
    service.storage.policies.set_topic_policy(topic, COMPACTION_MIN_LAG, 60)
    published = int(now[0] * 1000)
    service.storage.open_managed_ledger(topic).append_many([b"x" * 10] * 3, [published] * 3)
    factory.release.set()

    async def run():
        now[0] += 40  # past the max lag, but every message is younger than the min lag
        assert await monitor.check_once() == []
        for _ in range(3):  # not read again at every check until the min lag passes
            now[0] += 5
            assert await monitor.check_once() == []
        assert monitor.watch.topics_checked == 0
        now[0] += 6  # 61 s
        assert await monitor.check_once() == [topic]
        await wait_idle(monitor, topic)
        await monitor.close()

    asyncio.run(run())


def test_a_policy_change_checks_at_once_not_at_the_next_interval(env):  # noqa: F811
    service, monitor, factory = env(
        brokerServiceCompactionMonitorIntervalInSeconds=3600, compactionMonitorFullScanIntervalInSeconds=3600
    )
    publish(service.storage, HOT, 10, size=100)
    factory.release.set()

    async def run():
        await monitor.start()
        await monitor.check_once()  # the first, full check: nothing has a threshold yet
        service.storage.policies.set_namespace_policy("public/default", COMPACTION_THRESHOLD, 100)
        monitor._policies_changed("public/default")  # what the admin API's policy change calls
        for _ in range(100):
            if factory.started:
                break
            await asyncio.sleep(0.02)
        assert factory.started == [HOT]  # within 2 s, not the hour of the interval
        await wait_idle(monitor, HOT)
        await monitor.close()

    asyncio.run(run())


# --- property: the checks of changed topics find what checks of every topic find -------------

NS_NAME = "public/default"
PROP_TOPICS = [f"persistent://{NS_NAME}/prop-{i}" for i in range(3)]
POLICY_KEYS = {
    "threshold": COMPACTION_THRESHOLD,
    "max-lag": COMPACTION_MAX_LAG,
    "min-lag": COMPACTION_MIN_LAG,
}

append_op = st.tuples(st.just("append"), st.integers(0, 2), st.integers(1, 4), st.integers(0, 90))
policy_op = st.tuples(
    st.just("policy"),
    st.sampled_from([None, 0, 1, 2]),  # None: the namespace
    st.sampled_from(list(POLICY_KEYS)),
    st.sampled_from([None, 0, 250, 30, 60]),
)
# a round: some appends and policy changes, time passing, a check (and another after more time)
round_op = st.tuples(
    st.lists(append_op, max_size=2),
    st.lists(policy_op, max_size=2),
    st.tuples(st.just("tick"), st.integers(0, 45)),
    st.just(("check",)),
    st.tuples(st.just("tick"), st.integers(1, 45)),
    st.just(("check",)),
).map(lambda r: [*r[0], *r[1], *r[2:]])


def _AGAIN(first: int, second: int) -> list:
    """A round's end: time passes, a check, more time, another check."""
    return [("tick", first), ("check",), ("tick", second), ("check",)]


def _monitor(data_dir, full_scan: int, now: list):
    from compactmq.broker.compaction_monitor import CompactionMonitor
    from compactmq.config import load_config
    from compactmq.storage import Storage

    from .test_compaction_monitor import FakeFactory, FakeService

    config = load_config(
        overrides={"dataDir": str(data_dir), "compactionMonitorFullScanIntervalInSeconds": full_scan}
    )
    storage = Storage(data_dir, config)
    service = FakeService(storage, config)
    monitor = CompactionMonitor(service, clock=lambda: now[0])
    monitor._factory = FakeFactory(storage)
    monitor._factory.release.set()
    return storage, service, monitor


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(rounds=st.lists(round_op, min_size=1, max_size=4))
# time alone makes these due: the max-lag and the min-lag timers (random rounds rarely hit them)
@example(rounds=[[("policy", 0, "max-lag", 30), ("append", 0, 2, 0), *_AGAIN(0, 40)]])
@example(
    rounds=[
        [
            ("policy", None, "threshold", 250),
            ("policy", 1, "min-lag", 60),
            ("append", 1, 4, 0),
            *_AGAIN(0, 45),
        ],
        _AGAIN(0, 15),  # at exactly 60 s the messages count
    ]
)
# a run ends (its timer guessed from the end: 29.75 s on), the next check finds nothing
# uncompacted; then a message published 2 s before the append: due 1 s before that timer
@example(
    rounds=[
        [("append", 0, 1, 30), ("policy", None, "max-lag", 30), *_AGAIN(0, 1)],
        [("append", 0, 1, 2), *_AGAIN(0, 28)],
    ]
)
def test_checks_of_changed_topics_find_what_full_checks_find(rounds):
    """Two brokers' monitors over the same history (fake compaction: a run commits the topic's
    last entry): one told of appends and policy changes as the broker tells it, checking only
    what changed; one reading every topic at every check. Every check triggers the same topics."""
    now = [1_000_000.0]
    dirs = [tempfile.mkdtemp(prefix="cmq-watch-") for _ in range(2)]
    made = [_monitor(Path(d) / "data", full, now) for d, full in zip(dirs, (3600, 0))]
    (_, _, watched), (_, _, scanned) = made

    async def run():
        for op in [op for r in rounds for op in r]:
            if op[0] == "append":
                _, i, n, age = op
                for storage, _, monitor in made:
                    at = int((now[0] - age) * 1000)
                    storage.open_managed_ledger(PROP_TOPICS[i]).append_many([b"x" * 100] * n, [at] * n)
                watched.watch.touch(PROP_TOPICS[i])
            elif op[0] == "policy":
                _, i, key, value = op
                for storage, _, monitor in made:
                    if i is None:
                        storage.policies.set_namespace_policy(NS_NAME, POLICY_KEYS[key], value)
                    else:
                        storage.policies.set_topic_policy(PROP_TOPICS[i], POLICY_KEYS[key], value)
                watched.watch.policies_changed(NS_NAME if i is None else PROP_TOPICS[i])
            elif op[0] == "tick":
                now[0] += op[1]
            else:
                found = [sorted(await monitor.check_once()) for _, _, monitor in made]
                assert found[0] == found[1], (op, found)
                for _, _, monitor in made:
                    for topic in PROP_TOPICS:
                        await wait_idle(monitor, topic)
        for _, _, monitor in made:
            await monitor.close()

    try:
        asyncio.run(run())
    finally:
        for storage, service, _ in made:
            service.executor.shutdown(wait=True)
            storage.close()
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
