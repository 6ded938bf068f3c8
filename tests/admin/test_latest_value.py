"""``GET/POST .../latest`` and ``compactmq topics get-latest`` against a broker subprocess, with the
official client publishing and a TableView as the reference: every key's answer is what the
TableView holds (compacted view + tail, tombstones meaning absent), batches resolve to the single
message's batch index, a partitioned topic finds a key in whichever partition the client routed
it to, bad keys get a 400 with a reason, and topic stats report the indexes.

Each test runs on each compaction factory (``broker.factories``): the Spark one (its views have
a key sidecar) and the Arrow test one (its views are parsed into the index)."""

from __future__ import annotations

import base64
import json
import urllib.parse

import pytest

pulsar = pytest.importorskip("pulsar")

from compactmq.compaction import DEFAULT_FACTORY  # noqa: E402

from broker.factories import compaction_factory, compactor  # noqa: E402,F401 - parametrizes the module
from broker.test_read_compacted import BATCHING, compact, latest, produce  # noqa: E402
from harness.cli import admin_cli  # noqa: E402
from harness.fixtures import broker, client, topic  # noqa: E402,F401 - a broker per module and factory
from harness.http import rest  # noqa: E402
from harness.wait import wait_until  # noqa: E402

pytestmark = pytest.mark.integration


def path_of(topic: str) -> str:
    local = topic.split("://", 1)[1]
    tenant, ns, name = local.split("/", 2)
    return f"/admin/v2/persistent/{tenant}/{ns}/{urllib.parse.quote(name, safe='')}"


def get_key(broker, topic: str, key: str):
    return rest(broker, "GET", f"{path_of(topic)}/latest/{urllib.parse.quote(key, safe='')}")


def values(answers) -> dict:
    return {a["key"]: base64.b64decode(a["value"]) for a in answers if a["found"]}


def table_view(client, topic) -> dict:
    view = client.create_table_view(topic)
    try:
        out: dict = {}
        view.for_each(lambda k, v: out.__setitem__(k, v))
        return out
    finally:
        view.close()


@BATCHING
def test_answers_equal_a_table_view(broker, client, topic, compactor, batching, compaction_factory):  # noqa: F811
    before = [(f"k{i % 30}", f"v{i}".encode()) for i in range(90)] + [(None, b"keyless")]
    before += [(f"k{i}", b"") for i in range(0, 30, 7)]  # tombstones compaction removes
    produce(client, topic, before, batching)
    compact(broker, topic)
    tail = [("k1", b"tail-1"), ("k7", b"back"), ("k2", b""), ("new", b"n"), ("k3", b"x"), ("k3", b"")]
    produce(client, topic, tail, batching)
    want = latest(before + tail)
    keys = sorted({k for k, _ in before + tail if k is not None}) + ["never"]
    status, answers = rest(broker, "POST", f"{path_of(topic)}/latest", keys)
    assert status == 200, answers
    assert [a["key"] for a in answers] == keys
    assert values(answers) == want
    assert wait_until(lambda: table_view(client, topic) == want, 10, "the table view to hold the same")
    status, one = get_key(broker, topic, "k1")
    assert status == 200 and base64.b64decode(one["value"]) == b"tail-1"
    assert one["messageId"]["partitionIndex"] == -1
    assert (one["messageId"]["batchIndex"] >= 0) == batching
    for gone in ("k2", "k3", "never", "k0"):
        status, body = get_key(broker, topic, gone)
        assert status == 404 and "no value" in body["reason"], (gone, status, body)
    # the Spark factory's views answer from their key sidecar, the Arrow one's are parsed
    index = rest(broker, "GET", f"{path_of(topic)}/stats")[1]["latestValue"]["compactedKeyIndex"]
    assert index["source"] == ("sidecar" if compaction_factory == DEFAULT_FACTORY else "parsed")
    # a second (incremental) compaction moves the horizon under the tail index
    compact(broker, topic)
    more = [("k4", b""), ("k5", b"after-2nd"), ("k2", b"revived")]
    produce(client, topic, more, batching)
    want = latest(before + tail + more)
    assert values(rest(broker, "POST", f"{path_of(topic)}/latest", keys)[1]) == want
    assert wait_until(lambda: table_view(client, topic) == want, 10, "the table view to hold the same")


def test_a_batched_key_answers_with_its_own_message(broker, client, topic, compactor):
    producer = client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=100)
    ids = {}
    for i, key in enumerate(["a", "b", "c"]):
        producer.send_async(
            f"value-{key}".encode(),
            (lambda k: lambda res, mid: ids.__setitem__(k, mid))(key),
            partition_key=key,
            properties={"n": str(i)},
            event_timestamp=1000 + i,
        )
    producer.flush()
    producer.close()
    for key in ("a", "b", "c"):
        status, body = get_key(broker, topic, key)
        assert status == 200, body
        mid = ids[key]
        got = body["messageId"]
        assert (got["ledgerId"], got["entryId"], got["batchIndex"]) == (
            mid.ledger_id(),
            mid.entry_id(),
            mid.batch_index(),
        )
        assert body["properties"] == {"n": str("abc".index(key))}
        assert body["eventTime"] == 1000 + "abc".index(key)
        assert body["publishTime"] > 0
    compact(broker, topic)  # the same answers from the compacted view
    status, body = get_key(broker, topic, "b")
    assert status == 200 and body["messageId"]["batchIndex"] == ids["b"].batch_index()


def test_a_partitioned_topic_finds_the_partition_the_client_chose(broker, client, topic):
    assert rest(broker, "PUT", f"{path_of(topic)}/partitions", 3)[0] in (200, 204)
    producer = client.create_producer(topic)
    sent = {f"p{i}": producer.send(f"v{i}".encode(), partition_key=f"p{i}") for i in range(12)}
    producer.close()
    status, answers = rest(broker, "POST", f"{path_of(topic)}/latest", sorted(sent))
    assert status == 200, answers
    for a in answers:
        assert a["found"] and a["messageId"]["partitionIndex"] == sent[a["key"]].partition(), a
        assert a["topic"].endswith(f"-partition-{sent[a['key']].partition()}")


def test_keys_are_untrusted_input(broker, client, topic):
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"slash", partition_key="a/../b")
    producer.send(b"pct", partition_key="100%")
    producer.close()
    assert base64.b64decode(get_key(broker, topic, "a/../b")[1]["value"]) == b"slash"
    assert base64.b64decode(get_key(broker, topic, "100%")[1]["value"]) == b"pct"
    status, body = get_key(broker, topic, "x" * 5000)
    assert status == 400 and "at most" in body["reason"]
    for bad in ({"keys": "k"}, [1, 2], "k"):
        status, body = rest(broker, "POST", f"{path_of(topic)}/latest", bad)
        assert status == 400 and body["reason"], (bad, body)
    status, body = rest(broker, "POST", f"{path_of(topic)}/latest", ["k"] * 1001)
    assert status == 400 and "at most 1000" in body["reason"]
    status, body = get_key(broker, topic + "-missing", "k")
    assert status == 404 and "does not exist" in body["reason"]


def test_stats_report_the_indexes_and_the_cli_prints_values(broker, client, topic):
    produce(client, topic, [("k1", b"one"), ("k2", "dos".encode())], batching=False)
    stats = rest(broker, "GET", f"{path_of(topic)}/stats")[1]
    assert stats["latestValue"] is None  # not asked yet: no index
    cli = admin_cli(broker)
    result = cli("topics", "get-latest", topic, "--key", "k1", "--key", "k3")
    assert result.returncode == 1, result  # k3 has no value
    lines = result.stdout.splitlines()
    assert lines[0].startswith("k1  value=one  id=") and lines[1] == "k3  (no value)"
    result = cli("topics", "get-latest", topic, "-k", "k2", output="json")
    assert result.returncode == 0 and json.loads(result.stdout)["value"] == base64.b64encode(b"dos").decode()
    stats = rest(broker, "GET", f"{path_of(topic)}/stats")[1]["latestValue"]
    assert stats["keys"] == 2 and stats["overflowed"] is False and stats["lookups"] == 3
    assert stats["maxSizeBytes"] == 64 * 1024 * 1024
