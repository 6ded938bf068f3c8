"""Time-based compaction through the public interfaces (the official client, the admin REST API,
the CLI) against a broker subprocess, with each compaction service factory (PIP-278: the lag
policies are honoured by the default Spark service and by the test's own service alike).

* ``compactionMaxLagSeconds`` on a namespace: its topics are compacted automatically once their
  oldest uncompacted message is older than the lag, however small their backlog; a topic policy
  of 0 turns it off for one topic.
* ``compactionMinLagSeconds``: a run leaves younger messages uncompacted (here: all of them),
  and compacts them once the policy is removed.

The lags are small (1 s) or large (an hour), so no test waits for the wall clock beyond one
monitor interval; everything is awaited with deadline-bound helpers.
"""

from __future__ import annotations

import time
import uuid

import pytest

from broker.conftest import make_client

# parametrizes the module; the runs happen in the broker subprocess only, so no test here asks for
# ``compactor`` (the test process's own SparkSession, a JVM this module never used)
from broker.factories import compaction_factory  # noqa: F401
from harness.cli import CliResult, run_cli

from .harness import (
    Http,
    http,  # noqa: F401 - a fixture
    publish,
    start_broker,
    topic_path,
    wait_monitor_checks,
    wait_status,
    web_url,
)

KEYS = 5
N = 40


@pytest.fixture(scope="module")
def broker(tmp_path_factory, compaction_factory):  # noqa: F811
    b = start_broker(
        tmp_path_factory.mktemp("lag") / "data",
        in_process=True,
        compactionServiceFactoryClassName=compaction_factory,
        brokerServiceCompactionMonitorIntervalInSeconds="1",
    )
    yield b
    b.stop()


def cli(broker, *args: str) -> CliResult:
    """The ``compactmq`` admin command against the broker, run in this process."""
    return run_cli("--admin-url", web_url(broker), *args)


def read_compacted(broker, topic: str) -> list[tuple[str, bytes]]:
    c = make_client(broker.url)
    try:
        import pulsar

        r = c.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
        out = []
        while r.has_message_available():
            m = r.read_next(timeout_millis=10_000)
            out.append((m.partition_key(), m.data()))
        r.close()
        return out
    finally:
        c.close()


def wait_horizon(http: Http, topic: str, timeout: float = 120.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        horizon = http.ok("GET", topic_path(topic) + "/stats")["compactionHorizon"]
        if horizon is not None:
            return horizon
        status = http.ok("GET", topic_path(topic) + "/compaction")
        assert status["status"] != "ERROR", status
        assert time.monotonic() < deadline, f"{topic} was never compacted"
        time.sleep(0.2)


def test_max_lag_compacts_small_old_topics_automatically(broker, http):
    ns = f"public/lag-{uuid.uuid4().hex[:6]}"
    http.ok("PUT", f"/admin/v2/namespaces/{ns}")
    proc = cli(broker, "namespaces", "set-compaction-max-lag", ns, "--lag", "1s")
    assert proc.returncode == 0, proc.stderr
    assert http.ok("GET", f"/admin/v2/namespaces/{ns}/compactionMaxLagSeconds") == 1
    got = cli(broker, "namespaces", "get-compaction-max-lag", ns)
    assert got.returncode == 0 and got.stdout.strip() == "1 s", got
    lagged, exempt = f"persistent://{ns}/lagged", f"persistent://{ns}/exempt"
    http.ok("PUT", topic_path(exempt))
    http.ok("PUT", topic_path(lagged))
    http.ok("POST", topic_path(exempt) + "/compactionMaxLagSeconds", 0)
    assert http.ok("GET", topic_path(exempt) + "/compactionMaxLagSeconds?applied=true") == 0
    assert http.ok("GET", topic_path(lagged) + "/compactionMaxLagSeconds?applied=true") == 1

    publish(broker, lagged, N, KEYS)  # a few hundred bytes: no size threshold would fire
    publish(broker, exempt, N, KEYS)
    wait_status(http, lagged, "SUCCESS")  # nobody asked: the monitor did, by age
    assert sorted(k for k, _ in read_compacted(broker, lagged)) == [f"k{i}" for i in range(KEYS)]
    wait_monitor_checks(http, 2)
    assert http.ok("GET", topic_path(exempt) + "/compaction")["status"] == "NOT_RUN"
    assert len(read_compacted(broker, exempt)) == N


def test_min_lag_leaves_young_messages_uncompacted(broker, http):
    topic = f"persistent://public/default/minlag-{uuid.uuid4().hex[:6]}"
    http.ok("PUT", topic_path(topic))
    http.ok("POST", topic_path(topic) + "/compactionMinLagSeconds", 3600)
    publish(broker, topic, N, KEYS)
    http.ok("PUT", topic_path(topic) + "/compaction")
    wait_status(http, topic, "SUCCESS")
    assert http.ok("GET", topic_path(topic) + "/stats")["compactionHorizon"] is None
    assert len(read_compacted(broker, topic)) == N  # every message younger than an hour: all kept
    http.ok("DELETE", topic_path(topic) + "/compactionMinLagSeconds")
    assert http.ok("GET", topic_path(topic) + "/compactionMinLagSeconds") is None
    http.ok("PUT", topic_path(topic) + "/compaction")
    wait_horizon(http, topic)
    wait_status(http, topic, "SUCCESS")
    latest = dict(read_compacted(broker, topic))
    assert latest == {f"k{i}": f"v{N - KEYS + i}".encode() for i in range(KEYS)}


def test_lag_policies_refuse_bad_values(broker, http):
    topic = f"persistent://public/default/badlag-{uuid.uuid4().hex[:6]}"
    http.ok("PUT", topic_path(topic))
    assert "compactionMaxLagSeconds" in http.error(
        "POST", topic_path(topic) + "/compactionMaxLagSeconds", 412, -5
    )
    http.error("POST", topic_path(topic) + "/compactionMinLagSeconds", 400, "soon")
    http.error("POST", "/admin/v2/namespaces/public/default/compactionMaxLagSeconds", 400, True)
    proc = cli(broker, "topics", "set-compaction-min-lag", topic, "--lag", "later")
    assert (
        proc.returncode == 1
        and "invalid duration" in proc.stderr
        and len(proc.stderr.strip().splitlines()) == 1
    )


def metric(http: Http, name: str, topic: str, **labels: str) -> float | None:
    """The sample of ``name`` for ``topic`` (and ``labels``) in /metrics, or None."""
    text = http.ok("GET", "/metrics")
    want = [f'topic="{topic}"'] + [f'{k}="{v}"' for k, v in labels.items()]
    for line in text.splitlines():
        if line.startswith(name + "{") and all(w in line for w in want):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_view_keys_size_lag_and_phase_times_in_stats_and_metrics(broker, http, compaction_factory):
    topic = f"persistent://public/default/viewstats-{uuid.uuid4().hex[:6]}"
    http.ok("PUT", topic_path(topic))
    http.ok("POST", topic_path(topic) + "/compactionRetainNullKey", True)
    publish(broker, topic, N, KEYS)
    c = make_client(broker.url)
    try:
        p = c.create_producer(topic, batching_enabled=False)
        for i in range(3):  # keyless and retained: they survive, but they are no keys
            p.send(f"nokey{i}".encode())
        p.close()
    finally:
        c.close()
    http.ok("PUT", topic_path(topic) + "/compaction")
    wait_horizon(http, topic)
    wait_status(http, topic, "SUCCESS")
    stats = http.ok("GET", topic_path(topic) + "/stats")["compaction"]
    assert stats["compactedKeys"] == KEYS
    assert stats["compactedEntries"] >= 1 and stats["compactedSize"] > 0
    assert stats["compactionLagInMillis"] == 0  # everything is compacted
    assert metric(http, "pulsar_compaction_compacted_keys", topic) == KEYS
    assert metric(http, "pulsar_compaction_compacted_entries_size", topic) == stats["compactedSize"]
    assert metric(http, "pulsar_compaction_lag_seconds", topic) == 0
    if compaction_factory.endswith("SparkCompactionServiceFactory"):  # the default runner's phases
        phases = stats["lastCompactionPhaseTimesInMillis"]
        assert {"plan", "spark", "build"} <= set(phases) and all(v >= 0 for v in phases.values())
        assert metric(http, "pulsar_compaction_last_phase_seconds", topic, phase="spark") is not None

    publish(broker, topic, 3, KEYS, prefix="late")  # uncompacted now, and ageing
    deadline = time.monotonic() + 30
    while (lag := http.ok("GET", topic_path(topic) + "/stats")["compaction"]["compactionLagInMillis"]) <= 0:
        assert time.monotonic() < deadline, "the compaction lag never grew"
        time.sleep(0.05)
    assert lag < 600_000
    assert metric(http, "pulsar_compaction_lag_seconds", topic) > 0


def test_key_ttl_and_tombstone_retention_through_the_client(broker, http, compaction_factory):
    if not compaction_factory.endswith("SparkCompactionServiceFactory"):
        pytest.skip("the arrow test service does not implement the key TTL and tombstone retention")
    topic = f"persistent://public/default/ttl-{uuid.uuid4().hex[:6]}"
    http.ok("PUT", topic_path(topic))
    http.ok("POST", topic_path(topic) + "/compactionTombstoneRetentionSeconds", 3600)
    # a topic with no cursor loses its sealed ledgers at the next retention check, even to a run
    # that planned to read them (seen with a slow first Spark start): keep everything here
    http.ok("POST", topic_path(topic) + "/retention", {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1})
    publish(broker, topic, N, KEYS)
    c = make_client(broker.url)
    try:
        p = c.create_producer(topic, batching_enabled=False)
        p.send(b"", partition_key="k0")  # delete k0: a young tombstone, kept for an hour
        p.close()
    finally:
        c.close()
    http.ok("PUT", topic_path(topic) + "/compaction")
    wait_horizon(http, topic)
    wait_status(http, topic, "SUCCESS")
    view = dict(read_compacted(broker, topic))
    assert view["k0"] == b"" and len(view) == KEYS  # the reader sees the delete

    # every message is older than 2 s once the lag says so: a 2 s key TTL empties the view
    publish(broker, topic, 1, 1, prefix="marker")  # k0 again: the oldest uncompacted message
    deadline = time.monotonic() + 60
    while http.ok("GET", topic_path(topic) + "/stats")["compaction"]["compactionLagInMillis"] < 3000:
        assert time.monotonic() < deadline, "the compaction lag never reached 3 s"
        time.sleep(0.1)
    http.ok("POST", topic_path(topic) + "/compactedViewKeyTtlSeconds", 2)
    http.ok("PUT", topic_path(topic) + "/compaction")
    deadline = time.monotonic() + 120
    while (stats := http.ok("GET", topic_path(topic) + "/stats")["compaction"])["compactedEntries"] != 0:
        assert time.monotonic() < deadline, f"the key TTL never emptied the view: {stats}"
        time.sleep(0.2)
    wait_status(http, topic, "SUCCESS")
    assert read_compacted(broker, topic) == []
