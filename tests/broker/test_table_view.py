"""TableView (``client.create_table_view``) over the compacted view, with the official client.

A TableView reads the topic compacted from the earliest position until
``has_message_available()`` is false, then keeps listening; its key -> value map must be the
latest value per key, deletes (tombstones) included, whatever part of the topic is compacted.
"""

from __future__ import annotations

import pytest

pulsar = pytest.importorskip("pulsar")

from harness.wait import wait_until  # noqa: E402

from .factories import compaction_factory, compactor  # noqa: E402,F401 - every test runs on each factory
from .test_read_compacted import BATCHING, compact, kv, latest, produce  # noqa: E402

pytestmark = pytest.mark.integration


def snapshot(view) -> dict:
    out = {}
    view.for_each(lambda k, v: out.__setitem__(k, v))
    return out


def holds(view, want: dict, timeout: float = 5.0) -> bool:
    """Wait until the view's map is ``want`` (it applies what the topic gets asynchronously)."""
    return wait_until(lambda: snapshot(view) == want, timeout, f"the table view to hold {want}")


def test_table_view_on_an_empty_topic(client, topic):
    client.create_producer(topic).close()
    view = client.create_table_view(topic)
    try:
        assert snapshot(view) == {}
        produce(client, topic, [("a", b"1"), ("b", b"2"), ("a", b"")], batching=False)
        assert holds(view, {"b": b"2"})
    finally:
        view.close()


def test_table_view_on_an_empty_compacted_topic(broker, client, topic, compactor):
    items = kv(5, 2) + [(f"k{i}", b"") for i in range(5)]
    produce(client, topic, items, batching=False)
    compact(broker, topic)
    view = client.create_table_view(topic)
    try:
        assert snapshot(view) == {}
    finally:
        view.close()


@BATCHING
def test_table_view_on_a_compacted_topic(broker, client, topic, compactor, batching):
    items = kv(50, 4) + [(f"k{i}", b"") for i in range(0, 50, 5)] + [(None, b"keyless")]
    produce(client, topic, items, batching)
    compact(broker, topic)
    view = client.create_table_view(topic)
    try:
        # the initial read ends when has_message_available() is false: no waiting needed
        assert snapshot(view) == latest(items)
        assert view.get("k1") == latest(items)["k1"]
        assert view.get("k0") is None
    finally:
        view.close()


@BATCHING
def test_table_view_on_a_compacted_topic_with_a_tail_and_deletes(broker, client, topic, compactor, batching):
    before = kv(40, 3)
    produce(client, topic, before, batching)
    compact(broker, topic)
    # after the horizon: deletes of compacted keys, updates, new keys, a tail tombstone
    tail = [(f"k{i}", b"") for i in range(0, 40, 4)] + [("k1", b"updated"), ("new", b"n")] + [("k3", b"")]
    produce(client, topic, tail, batching)
    view = client.create_table_view(topic)
    try:
        want = latest(before + tail)
        assert snapshot(view) == want
        # and it keeps listening: a delete after creation removes the key
        produce(client, topic, [("k1", b""), ("later", b"l")], batching)
        want = latest(before + tail + [("k1", b""), ("later", b"l")])
        assert holds(view, want)
    finally:
        view.close()


def test_table_view_after_a_second_compaction(broker, client, topic, compactor):
    first = kv(30, 2)
    produce(client, topic, first, batching=False)
    compact(broker, topic)
    second = [(f"k{i}", b"") for i in range(10)] + [("k20", b"z")]
    produce(client, topic, second, batching=False)
    compact(broker, topic)
    view = client.create_table_view(topic)
    try:
        assert snapshot(view) == latest(first + second)
    finally:
        view.close()
