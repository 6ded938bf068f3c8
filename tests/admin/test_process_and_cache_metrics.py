"""/metrics exports the standard process metrics and Pulsar's managed-ledger cache metrics, with
plausible values; the entry cache stays within ``managedLedgerCacheSizeMB`` under many topics
(official client, a real broker)."""

from __future__ import annotations

import os
import time

import pulsar
import urllib.request

import pytest

from broker.conftest import BrokerProcess, make_client

CACHE_MB = 1


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = BrokerProcess(
        tmp_path_factory.mktemp("metrics") / "data",
        {
            "managedLedgerCacheSizeMB": str(CACHE_MB),
            # no age limit: only the byte bound and the readers' positions empty the cache here
            "managedLedgerCacheEvictionTimeThresholdMillis": "0",
        },
    )
    b.start()
    yield b
    b.stop()


def scrape(b: BrokerProcess) -> dict[str, float]:
    """``name{labels}`` -> value, and ``name`` -> value of its first sample."""
    with urllib.request.urlopen(f"http://127.0.0.1:{b.web_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, value = line.rsplit(" ", 1)
        out[key] = float(value)
        out.setdefault(key.split("{", 1)[0], float(value))
    return out


def test_process_metrics_are_present_and_plausible(broker):
    m = scrape(broker)
    rss = m["process_resident_memory_bytes"]
    assert 10 * 2**20 < rss < 8 * 2**30
    assert m["process_virtual_memory_bytes"] >= rss
    assert 0 < m["process_cpu_seconds_total"] < 3600
    assert 3 <= m["process_open_fds"] <= m["process_max_fds"]
    assert time.time() - 600 < m["process_start_time_seconds"] <= time.time()
    # the broker's own figure, from /proc: the same order as what the kernel reports now
    with open(f"/proc/{broker.proc.pid}/status") as f:
        kernel_rss = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    assert 0.5 < rss / kernel_rss < 2


def test_the_entry_cache_respects_its_bound_under_many_topics(broker):
    """20 topics, each with a consumer that takes nothing yet: every entry published stays
    wanted, 10 MB of them against a 1 MiB cache. The bound holds; every message arrives."""
    client = make_client(broker.url)
    topics = [f"persistent://public/default/cache-bound-{i}-{time.monotonic_ns()}" for i in range(20)]
    payload = os.urandom(1000)
    try:
        consumers = [client.subscribe(t, "sub", receiver_queue_size=1) for t in topics]
        for t in topics:
            producer = client.create_producer(t, batching_enabled=False)
            for i in range(500):
                producer.send_async(payload + i.to_bytes(4, "big"), None)
            producer.flush()
            producer.close()
            m = scrape(broker)
            assert 0 <= m["pulsar_ml_cache_used_size"] <= CACHE_MB * 2**20
        m = scrape(broker)
        assert m["pulsar_ml_cache_inserted_entries_total"] > 0
        assert m["pulsar_ml_cache_evicted_entries_total"] > 0
        assert (
            m["pulsar_ml_cache_entries"]
            == m["pulsar_ml_cache_inserted_entries_total"] - m["pulsar_ml_cache_evicted_entries_total"]
        )
        assert m["pulsar_ml_count"] >= len(topics)
        # reads were served from storage and from the cache. The rates are sampled every 2 s
        # and say nothing of a window with no miss, so they are read while the consumers read
        # (the early topics' entries were evicted) as well as after: a busy machine can take
        # longer than a window between the last miss and the end of the reads.
        missed = []
        for c in consumers:
            got = [c.receive(timeout_millis=10_000) for _ in range(500)]
            assert [int.from_bytes(msg.data()[-4:], "big") for msg in got] == list(range(500))
            for msg in got:
                c.acknowledge(msg)
            m = scrape(broker)
            missed.append((m["pulsar_ml_cache_misses_rate"], m["pulsar_ml_cache_misses_throughput"]))
        deadline = time.monotonic() + 10
        while not any(rate > 0 for rate, _ in missed) and time.monotonic() < deadline:
            time.sleep(0.5)
            m = scrape(broker)
            missed.append((m["pulsar_ml_cache_misses_rate"], m["pulsar_ml_cache_misses_throughput"]))
        assert any(rate > 0 and throughput > 0 for rate, throughput in missed), missed
        assert m["pulsar_ml_cache_evictions"] > 0
        for c in consumers:
            c.close()
    finally:
        client.close()


def test_existing_broker_metrics_keep_their_names(broker):
    client = make_client(broker.url)
    topic = f"persistent://public/default/names-{time.monotonic_ns()}"
    try:
        producer = client.create_producer(topic)
        producer.send(b"x")
        m = scrape(broker)
        labels = f'cluster="standalone",namespace="public/default",topic="{topic}"'
        assert m[f"pulsar_producers_count{{{labels}}}"] == 1
        assert m[f"pulsar_in_messages_total{{{labels}}}"] == 1
        assert 'pulsar_topics_count{cluster="standalone",namespace="public/default"}' in m
        consumer = client.subscribe(topic, "names", initial_position=pulsar.InitialPosition.Earliest)
        consumer.acknowledge(consumer.receive(5000))
        m = scrape(broker)
        assert m[f"pulsar_out_messages_total{{{labels}}}"] == 1
        # the entry sent: the one-byte payload and its metadata (it was counted as 0 before)
        assert m[f"pulsar_out_bytes_total{{{labels}}}"] > 1
        consumer.close()
        producer.close()
    finally:
        client.close()
