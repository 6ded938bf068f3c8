"""After the inactive-topic sweep unloads topics, the broker gives freed C heap back to the system.

glibc keeps freed memory resident when a live allocation sits above it in the heap, so a broker
that serves a stream of new topics kept each round's high-water mark (issue 28: RSS 98 -> 121
MiB over eight rounds with Python's objects and the C heap's live bytes flat). The sweep now
calls ``malloc_policy.trim`` (``malloc_trim(0)``) when it unloaded or deleted something.

In-process broker, a one-second sweep, the official client. The test makes freed-but-resident
memory of its own in this process (40 MiB of heap blocks freed under a live one) and checks
that the process's resident memory falls by most of it once the sweep has unloaded a topic,
and not before: without the trim it stays resident."""

from __future__ import annotations

import ctypes
import platform

import pulsar
import pytest

from compactmq.broker import malloc_policy
from harness.broker import InProcessBroker, make_client
from harness.wait import wait_until

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc_trim")

SWEEP = {
    "brokerDeleteInactiveTopicsFrequencySeconds": "1",
    "brokerDeleteInactiveTopicsMaxInactiveDurationSeconds": "1",
}
BLOCK = 2000  # bytes: above pymalloc's 512, so each comes from the C heap (malloc)
GARBAGE_MIB = 40


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.fixture
def broker(tmp_path, monkeypatch):
    monkeypatch.setattr(malloc_policy, "TRIM_ENABLED", True)
    b = InProcessBroker(tmp_path / "data", SWEEP)
    b.start()
    yield b
    b.stop()


def _pinned_garbage() -> bytes:
    """Free ``GARBAGE_MIB`` of heap blocks under one live block (returned): resident until a
    trim, since the heap's top cannot shrink past the live block."""
    blocks = [b"x" * BLOCK for _ in range(GARBAGE_MIB * 2**20 // BLOCK)]
    pin = b"y" * BLOCK
    del blocks
    return pin


def test_the_sweep_gives_freed_memory_back_after_unloading(broker):
    service = broker.server.service
    topic = "persistent://public/default/trim-after-unload"
    client = make_client(broker.url)
    try:
        consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer(topic, batching_enabled=False)
        producer.send(b"m")
        consumer.acknowledge(consumer.receive(10_000))
        trims = malloc_policy.trims
        unloaded = service.inactive_topics.unloaded
        # this process's own freed memory from earlier tests goes first, so the garbage below
        # takes fresh pages (resident) rather than resident holes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        before = _rss_mib()
        pin = _pinned_garbage()
        freed_but_resident = _rss_mib()
        assert freed_but_resident - before > GARBAGE_MIB / 2  # the garbage is resident
        producer.close()
        consumer.close()
        wait_until(
            lambda: service.inactive_topics.unloaded > unloaded and malloc_policy.trims > trims,
            timeout=20,
            what="the sweep to unload the topic and trim",
        )
    finally:
        client.close()
    after = _rss_mib()
    assert freed_but_resident - after > GARBAGE_MIB / 2, (before, freed_but_resident, after)
    assert pin


def test_no_trim_where_the_process_did_not_ask_for_it(monkeypatch):
    """An embedded broker leaves its host process's allocator alone (``apply`` not called)."""
    monkeypatch.setattr(malloc_policy, "TRIM_ENABLED", False)
    trims = malloc_policy.trims
    assert malloc_policy.trim() is False
    assert malloc_policy.trims == trims
