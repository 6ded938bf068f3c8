"""Read compacted with compaction run by the broker itself (admin REST ``PUT .../compaction``).

Here the compactor and the readers share one process: the broker deletes the previous
compacted ledger right after committing the next one while a reader still has it pinned. The
broker runs in the test process (``BROKER_IN_PROCESS``): its compaction, run by the broker as
ever, uses the worker's warm SparkSession rather than a cold JVM of a broker subprocess.
"""

from __future__ import annotations

import pytest

pulsar = pytest.importorskip("pulsar")

from .test_read_compacted import (  # noqa: E402
    apply,
    as_records,
    assert_increasing,
    compacted_reader,
    drain,
    kv,
    latest,
    produce,
    read_available,
)

from harness.http import rest as admin  # noqa: E402
from harness.wait import wait_until  # noqa: E402

from .factories import compaction_factory  # noqa: E402,F401 - the broker runs each factory

pytestmark = pytest.mark.integration

BROKER_IN_PROCESS = True  # see the module docstring


def rest_path(topic: str) -> str:
    return "/admin/v2/" + topic.replace("://", "/")


def compaction_status(broker, topic: str, fail_on_error: bool = True) -> dict | None:
    """The topic's compaction status body when it is SUCCESS, else None (an ERROR fails)."""
    status, body = admin(broker, "GET", rest_path(topic) + "/compaction")
    assert status == 200, (status, body)
    assert body["status"] != "ERROR" or not fail_on_error, body
    return body if body["status"] == "SUCCESS" else None


def compact_in_broker(broker, topic: str, timeout: float = 180.0) -> dict:
    status, _ = admin(broker, "PUT", rest_path(topic) + "/compaction")
    assert status == 204
    return wait_until(lambda: compaction_status(broker, topic), timeout, f"compaction of {topic}", 0.1)


def test_compaction_in_the_broker_between_two_reads(broker, client, topic):
    items = kv(150, 2)
    produce(client, topic, items, batching=False)
    compact_in_broker(broker, topic)
    reader = compacted_reader(client, topic, receiver_queue_size=5)
    seen = [reader.read_next(5000) for _ in range(50)]
    more = [(f"k{i}", b"") for i in range(0, 50, 2)] + [("k120", b"changed"), ("k149", b"")]
    produce(client, topic, more, batching=False)
    compact_in_broker(broker, topic)  # commits the new view, deletes the old file in the broker
    rest = read_available(reader)
    assert_increasing(as_records(seen + rest))
    assert apply(apply({}, seen), rest) == latest(items + more)
    fresh = read_available(compacted_reader(client, topic))
    assert apply({}, fresh) == latest(items + more) and len(fresh) == len(latest(items + more))


def test_partitioned_topic_read_compacted(broker, client, topic):
    status, _ = admin(broker, "PUT", rest_path(topic) + "/partitions", 3)
    assert status == 204
    items = kv(60, 3) + [(f"k{i}", b"") for i in range(0, 60, 6)]
    produce(client, topic, items, batching=True)
    compact_in_broker(broker, topic)  # fans out to the partitions
    for i in range(3):
        partition = f"{topic}-partition-{i}"
        wait_until(
            lambda: compaction_status(broker, partition, False), 180, f"compaction of {partition}", 0.1
        )
    c = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest, is_read_compacted=True)
    got = drain(c, 1000)
    assert {m.partition_key(): m.data() for m in got} == latest(items)
    assert len(got) == len(latest(items))
