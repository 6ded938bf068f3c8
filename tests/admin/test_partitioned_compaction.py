"""A partitioned topic compacted as ONE Spark job, over REST and the CLI, read back with the
official client: every partition keeps its own view (the same keys in every partition, never
merged), the aggregate status (Pulsar's LongRunningProcessStatus shape) and the per-partition
one, one job group for all partitions, and a failing partition that does not undo the others.

One broker (one JVM) for the module; the tests run in file order."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("pulsar")

from harness.broker import make_client  # noqa: E402
from harness.cli import CliResult, run_cli  # noqa: E402

from .harness import (  # noqa: E402
    http,  # noqa: F401 - a fixture
    poke_policy,
    start_broker,
    topic,  # noqa: F401 - a fixture
    topic_path,
    wait_status,
    web_url,
)

pytestmark = pytest.mark.integration

PARTITIONS = 3
KEYS = 20


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = start_broker(tmp_path_factory.mktemp("partitioned") / "data", in_process=True)
    yield b
    b.stop()


def _produce_per_partition(broker, topic: str, rounds: int, tag: str) -> dict:
    """The same KEYS keys into every partition (producers on the partitions themselves, so a key
    lives in all of them), ``rounds`` values each, and a tombstone for k0 in partition 1. Returns
    the latest value of each (partition, key) as a read-compacted consumer must see it."""
    import pulsar

    latest: dict = {}
    c = make_client(broker.url)
    try:
        for i in range(PARTITIONS):
            name = f"{topic}-partition-{i}"
            p = c.create_producer(name, batching_enabled=True, batching_max_publish_delay_ms=5)
            for r in range(rounds):
                for k in range(KEYS):
                    value = f"{tag}-p{i}-k{k}-r{r}".encode()
                    p.send_async(value, None, partition_key=f"k{k}")
                    latest[(i, f"k{k}")] = value
            if i == 1:
                p.send_async(b"", None, partition_key="k0")  # a tombstone: k0 leaves partition 1 only
                latest.pop((1, "k0"))
            p.flush()
            p.close()
    finally:
        c.close()
    assert pulsar  # the official client made every message
    return latest


def _read_partition(broker, name: str) -> dict:
    """Everything a read-compacted reader of one partition sees: key -> [values]."""
    import pulsar

    seen: dict = {}
    c = make_client(broker.url)
    try:
        reader = c.create_reader(name, pulsar.MessageId.earliest, is_read_compacted=True)
        deadline = time.monotonic() + 60
        while reader.has_message_available() and time.monotonic() < deadline:
            msg = reader.read_next(timeout_millis=10_000)
            seen.setdefault(msg.partition_key(), []).append(msg.data())
        reader.close()
    finally:
        c.close()
    return seen


def _consume_partitioned(broker, topic: str, expected: int) -> list:
    """``(partition, key, value)`` of the first ``expected`` messages a read-compacted consumer of
    the partitioned topic receives (a Failover subscription from the earliest position)."""
    import pulsar

    got = []
    c = make_client(broker.url)
    try:
        consumer = c.subscribe(
            topic,
            f"sub-{time.monotonic_ns()}",
            consumer_type=pulsar.ConsumerType.Failover,
            initial_position=pulsar.InitialPosition.Earliest,
            is_read_compacted=True,
        )
        deadline = time.monotonic() + 60
        while len(got) < expected and time.monotonic() < deadline:
            try:
                msg = consumer.receive(timeout_millis=5_000)
            except pulsar.Timeout:
                continue
            part = int(msg.topic_name().rsplit("-partition-", 1)[1])
            got.append((part, msg.partition_key(), msg.data()))
            consumer.acknowledge(msg)
        consumer.close()
    finally:
        c.close()
    return got


def test_partitioned_topic_compacts_in_one_job_with_aggregate_status(spark_in_broker, broker, http, topic):
    path = topic_path(topic)
    http.ok("PUT", path + "/partitions", PARTITIONS)
    assert http.ok("GET", path + "/compaction") == {
        "status": "NOT_RUN",
        "lastError": "",
        "partitionCounts": {"NOT_RUN": PARTITIONS},
    }
    latest = _produce_per_partition(broker, topic, rounds=5, tag="a")
    http.ok("PUT", path + "/compaction")
    body = wait_status(http, topic, "SUCCESS")
    assert body == {"status": "SUCCESS", "lastError": "", "partitionCounts": {"SUCCESS": PARTITIONS}}
    per = http.ok("GET", path + "/compaction?perPartition=true")["partitions"]
    assert sorted(per) == [f"{topic}-partition-{i}" for i in range(PARTITIONS)]
    assert all(s == {"status": "SUCCESS", "lastError": ""} for s in per.values())

    # ONE Spark job group compacted every partition (each partition's stats name the job)
    jobs = {http.ok("GET", topic_path(name) + "/stats")["compaction"]["lastCompactionJob"] for name in per}
    assert len(jobs) == 1, jobs
    (job,) = jobs
    assert job and job.startswith("compactmq-joint-")
    stats = http.ok("GET", path + "/partitioned-stats")["compaction"]
    assert stats["lastCompactionRemovedEventCount"] == PARTITIONS * KEYS * 5 + 1 - (PARTITIONS * KEYS - 1)
    assert stats["compactedKeys"] == PARTITIONS * KEYS - 1

    # each partition's own view: every key of its own, with its own latest value, once
    for i in range(PARTITIONS):
        seen = _read_partition(broker, f"{topic}-partition-{i}")
        want = {k: [v] for (p, k), v in latest.items() if p == i}
        assert seen == want, i
    # and through the partitioned consumer: all partitions' views together
    got = _consume_partitioned(broker, topic, expected=len(latest))
    assert sorted(got) == sorted((p, k, v) for (p, k), v in latest.items())

    # a second round: incremental, again one job for all partitions
    latest.update(_produce_per_partition(broker, topic, rounds=1, tag="b"))
    latest.pop((1, "k0"), None)
    http.ok("PUT", path + "/compaction")
    wait_status(http, topic, "SUCCESS")
    jobs2 = {
        http.ok("GET", topic_path(f"{topic}-partition-{i}") + "/stats")["compaction"]["lastCompactionJob"]
        for i in range(PARTITIONS)
    }
    assert len(jobs2) == 1 and jobs2 != jobs
    for i in range(PARTITIONS):
        seen = _read_partition(broker, f"{topic}-partition-{i}")
        assert seen == {k: [v] for (p, k), v in latest.items() if p == i}, i


def test_a_failing_partition_is_an_aggregate_error_and_the_others_commit(
    spark_in_broker, broker, http, topic
):
    path = topic_path(topic)
    http.ok("PUT", path + "/partitions", PARTITIONS)
    latest = _produce_per_partition(broker, topic, rounds=2, tag="a")
    bad = f"{topic}-partition-2"
    # a retention mode the API would refuse makes partition 2's run fail
    poke_policy(broker.data_dir, "topic", bad, "compactionRetentionMode", "bogus")
    http.ok("PUT", path + "/compaction")
    body = wait_status(http, topic, "ERROR", timeout=120)
    assert body["partitionCounts"] == {"SUCCESS": PARTITIONS - 1, "ERROR": 1}
    assert body["lastError"].startswith(f"{bad}: ") and "bogus" in body["lastError"]
    per = http.ok("GET", path + "/compaction?perPartition=true")["partitions"]
    assert per[bad]["status"] == "ERROR"
    assert [per[f"{topic}-partition-{i}"]["status"] for i in range(PARTITIONS - 1)] == ["SUCCESS"] * 2
    for i in range(PARTITIONS - 1):  # the others committed their views
        assert _read_partition(broker, f"{topic}-partition-{i}") == {
            k: [v] for (p, k), v in latest.items() if p == i
        }
    internal = http.ok("GET", topic_path(bad) + "/internalStats")
    assert internal["compactedLedger"]["ledgerId"] == -1

    # the CLI: one progress bar for the whole topic, the aggregate, and per partition on request
    http.ok("DELETE", topic_path(bad) + "/compactionRetentionMode")
    proc = _cli(broker, "topics", "compact", "--wait", topic)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert proc.stdout.strip() == f"SUCCESS ({PARTITIONS} partitions: SUCCESS {PARTITIONS})"
    bars = [line for line in proc.stderr.splitlines() if line.startswith("RUNNING")]
    assert all(line.endswith(f"({PARTITIONS} partitions)") for line in bars if "[" in line), bars
    proc = _cli(broker, "topics", "compaction-status", "--per-partition", topic)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[0].startswith("SUCCESS") and len(lines) == 1 + PARTITIONS
    assert all(line.strip().endswith(": SUCCESS") for line in lines[1:])


def _cli(broker, *args: str) -> CliResult:
    return run_cli("--admin-url", web_url(broker), *args)
