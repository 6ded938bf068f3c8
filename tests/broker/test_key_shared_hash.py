"""Key_Shared routes keys with Pulsar's hash, seen by the official client: a key's slot is
Murmur3 32-bit (seed 0) of the sticky key, sign bit cleared, modulo 65,536 (0 becomes 1), so a
STICKY consumer owning a slot range gets exactly the keys Pulsar would give it, and AUTO_SPLIT
places consumers on Pulsar's consistent-hash ring (100 points of ``name\\0index\\0i``).

The reference hash below is written out independently of the broker (and checked against
published Murmur3 vectors) so the test does not merely repeat the broker's own code."""

from __future__ import annotations

import bisect
import time

import pytest

pulsar = pytest.importorskip("pulsar")

pytestmark = pytest.mark.integration
KeyShared = pulsar.ConsumerType.KeyShared


def murmur3_32(data: bytes, seed: int = 0) -> int:
    c1, c2, mask = 0xCC9E2D51, 0x1B873593, 0xFFFFFFFF
    h = seed
    rotl = lambda x, r: ((x << r) | (x >> (32 - r))) & mask  # noqa: E731
    full = len(data) // 4 * 4
    for i in range(0, full, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = rotl((k * c1) & mask, 15) * c2 & mask
        h = (rotl(h ^ k, 13) * 5 + 0xE6546B64) & mask
    tail = data[full:]
    if tail:
        k = int.from_bytes(tail, "little")
        h ^= rotl((k * c1) & mask, 15) * c2 & mask
    h ^= len(data)
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & mask
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & mask
    return h ^ (h >> 16)


def slot(key: bytes) -> int:
    return ((murmur3_32(key) & 0x7FFFFFFF) % 65536) or 1


def test_reference_hash_matches_published_vectors():
    assert murmur3_32(b"") == 0
    assert murmur3_32(b"hello") == 0x248BFA47
    assert murmur3_32(b"The quick brown fox jumps over the lazy dog") == 0x2E4FF723


def receive_all(consumers, expected, timeout=15.0):
    got = {c: [] for c in consumers}
    deadline = time.monotonic() + timeout
    while sum(len(v) for v in got.values()) < expected and time.monotonic() < deadline:
        for c in consumers:
            try:
                msg = c.receive(100)
            except pulsar.Timeout:
                continue
            got[c].append(msg)
            c.acknowledge(msg)
    return got


def test_sticky_ranges_get_the_keys_of_their_pulsar_slots(client, topic):
    low = client.subscribe(
        topic,
        "s",
        consumer_type=KeyShared,
        consumer_name="low",
        key_shared_policy=pulsar.ConsumerKeySharedPolicy(
            pulsar.KeySharedMode.Sticky, sticky_ranges=[(0, 20000)]
        ),
    )
    high = client.subscribe(
        topic,
        "s",
        consumer_type=KeyShared,
        consumer_name="high",
        key_shared_policy=pulsar.ConsumerKeySharedPolicy(
            pulsar.KeySharedMode.Sticky, sticky_ranges=[(20001, 65535)]
        ),
    )
    producer = client.create_producer(topic, batching_enabled=False)
    keys = [f"key-{i}" for i in range(200)]
    for k in keys:
        producer.send(k.encode(), partition_key=k)
    producer.send(b"keyless")  # Pulsar routes it as the key "NONE_KEY"
    got = receive_all([low, high], len(keys) + 1)
    assert sum(len(v) for v in got.values()) == len(keys) + 1
    for consumer, lo, hi in ((low, 0, 20000), (high, 20001, 65535)):
        for msg in got[consumer]:
            key = msg.partition_key().encode() if msg.partition_key() else b"NONE_KEY"
            assert lo <= slot(key) <= hi, (msg.data(), slot(key))
    # the split is not trivially all-to-one: both ranges own some of these keys
    assert got[low] and got[high]


def pulsar_ring(names, points=100):
    ring = {}
    for name in names:  # consumers join in this order; a colliding point goes to the newcomer
        for i in range(points):
            ring[slot(f"{name}\0{0}\0{i}".encode())] = name
    return sorted(ring), ring


def test_auto_split_places_consumers_on_pulsars_ring(client, topic):
    names = ["alpha", "beta", "gamma"]
    consumers = [client.subscribe(topic, "s", consumer_type=KeyShared, consumer_name=n) for n in names]
    points, owner = pulsar_ring(names)
    producer = client.create_producer(topic, batching_enabled=False)
    keys = [f"user-{i}" for i in range(300)]
    for k in keys:
        producer.send(k.encode(), partition_key=k)
    got = receive_all(consumers, len(keys))
    assert sum(len(v) for v in got.values()) == len(keys)
    for name, consumer in zip(names, consumers):
        for msg in got[consumer]:
            s = slot(msg.partition_key().encode())
            expected = owner[points[bisect.bisect_left(points, s) % len(points)]]
            assert expected == name, (msg.partition_key(), s)
    assert all(got[c] for c in consumers)
