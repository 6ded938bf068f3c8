"""Regression tests for Pulsar's compaction-with-failover bugs, against a real broker process.

Each test is the scenario of one Pulsar issue, told in compactmq's terms (the official client, the
admin REST API, one broker that unloads, reloads, closes or restarts the topic, which is what an
ownership move does to the topic on the broker that loses it and on the one that loads it):

* apache/pulsar#21074 -- a topic unloaded while its compaction runs: Pulsar lost messages and
  looped redelivering others. Here the run either commits under the state it started from or is
  recorded as failed, a rerun commits, and nothing is lost or delivered twice.
* apache/pulsar#25118 -- the broker closes during phase two: Pulsar's ``__compaction`` cursor went
  back to a very old position. Here the interrupted run is recorded, the view and its horizon and
  the compaction hold stay where the last commit put them.
* apache/pulsar#12698 -- compaction properties lost on a cursor reset while a topic loads: Pulsar
  kept the horizon in the cursor's properties and a reset dropped them, so the next run skipped
  compacted data. Here the horizon is the compaction service's state: a reset of the
  ``__compaction`` cursor and a reload lose neither the horizon nor a compacted key.
* apache/pulsar#25294 -- a read-compacted reader stuck after an ownership move: its cumulative ack
  after the reconnect moved it past the compacted view. Here the reader resumes inside the view,
  reads the rest of it and then the new messages.
* apache/pulsar#26486 -- a compacted view that moves backwards across a reload: covered where the
  commit is made, ``test_state.test_a_late_run_and_a_reload_never_move_the_view_back`` (and on
  ZooKeeper, ``storage/test_compaction_state_zk.py``); not repeated here.

The broker runs the Arrow test factory (``broker.arrow_compaction``: no JVM) whose gate holds a
run after its first read, so a test acts while a run is certainly in progress.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

pulsar = pytest.importorskip("pulsar")

from admin.harness import Http, publish, start_broker, topic_path, wait_status, web_url  # noqa: E402
from broker.arrow_compaction import GATE_ENV  # noqa: E402
from broker.factories import ARROW_FACTORY  # noqa: E402
from harness.broker import drain_acked, make_client  # noqa: E402
from harness.http import wait_backlog  # noqa: E402
from harness.wait import wait_until  # noqa: E402

pytestmark = pytest.mark.integration

KEYS = 6


@pytest.fixture(scope="module")
def gate(tmp_path_factory) -> Path:
    """The file whose absence holds the broker's compaction runs (open: it exists)."""
    path = tmp_path_factory.mktemp("gate") / "open"
    path.touch()
    return path


@pytest.fixture(scope="module")
def broker(tmp_path_factory, gate):
    mp = pytest.MonkeyPatch()
    mp.setenv(GATE_ENV, str(gate))  # the broker subprocess (and its restarts) inherit it
    b = start_broker(
        tmp_path_factory.mktemp("failover") / "data",
        compactionServiceFactoryClassName=ARROW_FACTORY,
        brokerServiceCompactionMonitorIntervalInSeconds="0",  # only the runs a test triggers
    )
    yield b
    b.stop()
    mp.undo()


@pytest.fixture(scope="module")
def http(broker):
    return Http(web_url(broker))


@pytest.fixture
def topic(request):
    return f"persistent://public/default/{request.node.name}-{time.monotonic_ns() % 10**9}"


@pytest.fixture
def closed_gate(gate):
    """Hold every run after its first read until the test opens the gate again."""
    gate.unlink()
    yield gate
    gate.touch()


def expected_view(values: list[tuple[str, bytes]]) -> dict[str, bytes]:
    """Keep-latest per key (no tombstones in these tests)."""
    return dict(values)


def published(n: int, prefix: str = "v", keys: int = KEYS) -> list[tuple[str, bytes]]:
    """What ``admin.harness.publish(broker, topic, n, keys, prefix)`` sends, in order."""
    return [(f"k{i % keys}", f"{prefix}{i}".encode()) for i in range(n)]


def read_compacted(client, topic: str, timeout_ms: int = 3000) -> dict[str, bytes]:
    """A read-compacted reader from the earliest message to the end: key -> latest value."""
    reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
    out: dict[str, bytes] = {}
    try:
        while reader.has_message_available():
            msg = reader.read_next(timeout_ms)
            out[msg.partition_key()] = msg.data()
    finally:
        reader.close()
    return out


def compaction(http: Http, topic: str) -> dict:
    return http.ok("GET", topic_path(topic) + "/compaction")


def internal_stats(http: Http, topic: str) -> dict:
    return http.ok("GET", topic_path(topic) + "/internalStats")


def position(text) -> tuple[int, int]:
    assert text, f"no position: {text!r}"
    ledger, entry = text.split(":")[:2]
    return int(ledger), int(entry)


def start_held_run(http: Http, topic: str) -> None:
    """Trigger a run and wait until it is inside its work (the closed gate holds it there)."""
    http.ok("PUT", topic_path(topic) + "/compaction")

    def held() -> bool:
        body = compaction(http, topic)
        assert body["status"] == "RUNNING", body  # it must not end while the gate is closed
        return body.get("progress", {}).get("phase") == "phase-one"

    wait_until(held, 60, "the run to be held part-way")


def compact(http: Http, topic: str) -> dict:
    http.ok("PUT", topic_path(topic) + "/compaction")
    return wait_status(http, topic, "SUCCESS")


def unload(http: Http, topic: str) -> None:
    http.ok("PUT", topic_path(topic) + "/unload")


# --- apache/pulsar#21074 ------------------------------------------------------------------------


def test_topic_unloaded_during_compaction_loses_and_repeats_nothing(broker, http, closed_gate, topic):
    client = make_client(broker.url)
    try:
        consumer = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Exclusive)
        # more entries than the test service reads at once: the run is held with more to read
        publish(broker, topic, 600, KEYS, batching=False)
        assert drain_acked(consumer, 1500) == [v for _, v in published(600)]
        wait_backlog(broker, topic, "sub", 0)  # the broker has every acknowledgement
        start_held_run(http, topic)
        unload(http, topic)  # the topic closes under the run and loads again on the next request
        publish(broker, topic, 12, 3, prefix="after")  # k0..k2 only: k3..k5 keep their last v
        closed_gate.touch()  # the run goes on against a topic that moved under it
        wait_until(lambda: compaction(http, topic)["status"] != "RUNNING", 60, "the held run to end")
        compact(http, topic)  # a rerun on the reloaded topic reads everything after the horizon
        history = published(600) + published(12, "after", keys=3)
        assert read_compacted(client, topic) == expected_view(history)
        # the rest, once, in order: nothing acknowledged before the unload comes again, no loss
        assert drain_acked(consumer, 1500) == [v for _, v in published(12, "after", keys=3)]
    finally:
        client.close()


# --- apache/pulsar#25118 ------------------------------------------------------------------------


def test_broker_closing_mid_run_never_moves_the_view_or_the_hold_back(broker, http, gate, topic):
    publish(broker, topic, 24, KEYS)
    compact(http, topic)
    before = internal_stats(http, topic)
    horizon = position(before["compactionHorizon"])
    assert position(before["cursors"]["__compaction"]["markDeletePosition"]) == horizon
    publish(broker, topic, 12, KEYS, prefix="second")
    gate.unlink()
    try:
        start_held_run(http, topic)
        broker.proc.send_signal(signal.SIGTERM)  # a graceful close while the run is in its work
    finally:
        gate.touch()  # the run goes on while the broker closes: it commits or it is cut short
    assert broker.stop() == 0  # a clean exit, not the harness's kill after its timeout
    broker.start(timeout=60)
    body = compaction(http, topic)
    after = internal_stats(http, topic)
    now = position(after["compactionHorizon"])
    if body["status"] == "SUCCESS":  # it committed before the close: a newer view
        assert now > horizon and after["compactedLedger"]["ledgerId"] != before["compactedLedger"]["ledgerId"]
    else:  # cut short: recorded, and the view in force is the one before
        assert body["status"] == "ERROR", body
        assert (
            now == horizon and after["compactedLedger"]["ledgerId"] == before["compactedLedger"]["ledgerId"]
        )
    # the hold is where the last commit put it (durable on close): never reset to an older position
    assert position(after["cursors"]["__compaction"]["markDeletePosition"]) == now
    client = make_client(broker.url)
    try:
        assert read_compacted(client, topic) == expected_view(published(24) + published(12, "second"))
        publish(broker, topic, 2, 2, prefix="third")
        compact(http, topic)
        assert position(internal_stats(http, topic)["compactionHorizon"]) > now
        assert read_compacted(client, topic) == expected_view(
            published(24) + published(12, "second") + published(2, "third")
        )
    finally:
        client.close()


# --- apache/pulsar#12698 ------------------------------------------------------------------------


def test_cursor_reset_and_reload_keep_the_horizon_and_every_compacted_key(broker, http, topic):
    publish(broker, topic, 30, KEYS)
    compact(http, topic)
    horizon = position(internal_stats(http, topic)["compactionHorizon"])
    unload(http, topic)
    client = make_client(broker.url)
    try:
        # what Pulsar's compactor did on a freshly loaded topic: its consumer on ``__compaction``
        # seeks to the earliest position (a cursor reset, which dropped the cursor's properties)
        compactor = client.subscribe(topic, "__compaction", consumer_type=pulsar.ConsumerType.Exclusive)
        compactor.seek(pulsar.MessageId.earliest)
        compactor.close()
        unload(http, topic)
        assert position(internal_stats(http, topic)["compactionHorizon"]) == horizon
        publish(broker, topic, 3, 3, prefix="late")  # k0..k2 change; k3..k5 live only in the view
        compact(http, topic)
        assert read_compacted(client, topic) == expected_view(published(30) + published(3, "late"))
    finally:
        client.close()


# --- apache/pulsar#25294 ------------------------------------------------------------------------


def test_read_compacted_reader_resumes_after_the_topic_moves(broker, http, topic):
    publish(broker, topic, 60, 20, batching=False)  # 20 keys, three values each, an entry each
    client = make_client(broker.url)
    # a fourth value for every other key: the view is not a suffix of the topic (a reader that
    # left the view for the topic would read superseded values)
    fourth = [(f"k{i}", f"w{i}".encode()) for i in range(0, 20, 2)]
    producer = client.create_producer(topic, batching_enabled=False)
    for key, value in fourth:
        producer.send(value, partition_key=key)
    producer.close()
    compact(http, topic)
    try:
        # a small queue: the reader has not prefetched the view when the topic moves
        reader = client.create_reader(
            topic, pulsar.MessageId.earliest, is_read_compacted=True, receiver_queue_size=2
        )
        first = [reader.read_next(5000) for _ in range(8)]  # part-way through the compacted view
        unload(http, topic)  # the reader reconnects from its last message, as to a new owner
        publish(broker, topic, 5, 5, prefix="new")
        rest = []
        while reader.has_message_available():
            rest.append(reader.read_next(5000))
        reader.close()
        got = [(m.partition_key(), m.data()) for m in first + rest]
        history = [(f"k{i % 20}", f"v{i}".encode()) for i in range(60)] + fourth
        expected = expected_view(history)
        order = {value: i for i, (_, value) in enumerate(history)}
        # the rest of the view, then the new messages: nothing skipped, nothing read twice
        assert got[: len(expected)] == sorted(expected.items(), key=lambda kv: order[kv[1]])
        assert got[len(expected) :] == [(f"k{i}", f"new{i}".encode()) for i in range(5)]
    finally:
        client.close()
