"""The monitor's joint run of several topics (the partitions of a partitioned topic) with a fake
compaction factory (no Spark, no sockets), and the aggregate status of a partitioned topic."""

from __future__ import annotations

import asyncio

import pytest

from compactmq.admin.topics import aggregate_compaction_status
from compactmq.errors import Conflict
from compactmq.compaction.state import ERROR, RUNNING, SUCCESS

from .test_compaction_monitor import FakeFactory, env, publish, wait_idle  # noqa: F401 - env: a fixture

BASE = "persistent://public/default/parted"
PARTS = [f"{BASE}-partition-{i}" for i in range(3)]


class RecordingFactory(FakeFactory):
    """The default (one after another) ``compact_together``, recording each call's topics."""

    def __init__(self, storage):
        super().__init__(storage)
        self.together: list[list[str]] = []

    def compact_together(self, services, progress=None):
        self.together.append([s.topic for s in services])
        return super().compact_together(services, progress)


def test_partitions_run_as_one_job_each_with_its_own_outcome(env):  # noqa: F811
    service, monitor, _ = env(compactionMaxConcurrentRuns=2)
    factory = RecordingFactory(service.storage)
    monitor._factory = factory
    for name in PARTS:
        publish(service.storage, name, 5)
    factory.fail.add(PARTS[2])

    async def run():
        await monitor.trigger(PARTS[1])  # already running: left out of the joint run
        conflicts = await monitor.trigger_together([*PARTS, f"{BASE}-partition-7"])  # 7: no such topic
        assert conflicts == [PARTS[1]]
        with pytest.raises(Conflict):
            await monitor.trigger(PARTS[0])
        while len(factory.started) < 2:  # both runs are in their services (blocked on release)
            await asyncio.sleep(0.01)
        per = {name: monitor.status_blocking(name) for name in PARTS}
        assert all(s["status"] == RUNNING for s in per.values()), per
        body = aggregate_compaction_status(per)
        assert body["status"] == RUNNING and body["partitionCounts"] == {RUNNING: 3}
        # the default compact_together runs them in turn: one is in phase one, the next waits
        assert body["progress"]["phase"] == "phase-one/start"
        factory.release.set()
        for name in PARTS:
            await wait_idle(monitor, name)
        # each topic's last run: its own outcome, the topics of its job, where its time went
        last = {name: monitor.last_run(name) for name in (PARTS[0], PARTS[2])}
        assert last[PARTS[0]]["status"] == "SUCCESS" and last[PARTS[2]]["status"] == "ERROR"
        assert all(v["jobTopics"] == [PARTS[0], PARTS[2]] for v in last.values())
        assert {"queue", "begin", "after"} <= set(last[PARTS[0]]["phasesMs"])
        await monitor.close()

    asyncio.run(run())
    assert factory.together == [[PARTS[0], PARTS[2]]]  # one joint call, without the busy partition
    per = {name: monitor.status_blocking(name) for name in PARTS}
    assert [s["status"] for s in per.values()] == [SUCCESS, SUCCESS, ERROR]
    assert monitor.stats[PARTS[2]].failed_count == 1 and monitor.stats[PARTS[0]].succeed_count == 1
    body = aggregate_compaction_status(per)
    assert body["status"] == ERROR
    assert body["lastError"] == f"{PARTS[2]}: boom"
    assert body["partitionCounts"] == {SUCCESS: 2, ERROR: 1}


def test_aggregate_status_rules():
    def st(status, error="", progress=None):
        return {"status": status, "lastError": error, **({"progress": progress} if progress else {})}

    prog = {"phase": "phase-two", "entriesProcessed": 30, "entriesTotal": 60, "etaSeconds": 2.0}
    prog2 = {"phase": "phase-two", "entriesProcessed": 10, "entriesTotal": 20, "etaSeconds": 3.0}
    # RUNNING wins over ERROR; one progress for the whole topic
    body = aggregate_compaction_status(
        {"a": st(RUNNING, progress=prog), "b": st(ERROR, "x"), "c": st(RUNNING, progress=prog2)}
    )
    assert body["status"] == RUNNING and body["lastError"] == "b: x"
    assert body["progress"] == {
        "phase": "phase-two",
        "entriesProcessed": 40,
        "entriesTotal": 80,
        "etaSeconds": 3.0,
    }
    # ERROR lists every failed partition
    body = aggregate_compaction_status({"a": st(ERROR, "x"), "b": st(SUCCESS), "c": st(ERROR, "y")})
    assert body == {"status": ERROR, "lastError": "a: x; c: y", "partitionCounts": {ERROR: 2, SUCCESS: 1}}
    # a partition never compacted does not hold the topic back; none at all: NOT_RUN
    assert aggregate_compaction_status({"a": st(SUCCESS), "b": st("NOT_RUN")})["status"] == SUCCESS
    assert aggregate_compaction_status({"a": st("NOT_RUN")})["status"] == "NOT_RUN"
    assert aggregate_compaction_status({})["status"] == "NOT_RUN"
