"""Batch reads of the ``compactmq`` format against a running broker, with the official client as the
oracle: ``raw`` and ``compacted`` equal what a (read-compacted) reader receives, ``latest`` equals
the keep-latest fold of the whole log; through the data directory (direct) and the broker alike."""

from __future__ import annotations

import json

import pulsar
import pytest

from .helpers import Price, compact, create_partitioned, latest_of, produce, read_all, rows_of

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def reader(spark, broker, topic, *, direct, **options):
    r = spark.read.format("compactmq").option("topic", topic)
    for k, v in options.items():
        r = r.option(k, v)
    if direct:
        return r.load(str(broker.data_dir))
    return (
        r.option("service.url", broker.url).option("admin.url", f"http://127.0.0.1:{broker.web_port}").load()
    )


def latest_rows(df):
    return {
        r["__key"]: (bytes(r["value"]) if r["value"] is not None else None)
        for r in df.select("__key", "value").collect()
    }


def workload(n, keys, salt):
    """Keyed messages over ``keys`` keys, every 7th a tombstone, every 11th keyless."""
    items = []
    for i in range(n):
        if i % 11 == 5:
            items.append((None, f"nokey-{salt}-{i}".encode()))
        elif i % 7 == 3:
            items.append((f"k{i % keys}", b""))
        else:
            items.append((f"k{i % keys}", f"v-{salt}-{i}".encode()))
    return items


@pytest.mark.parametrize("batching,compression", [(False, None), (True, pulsar.CompressionType.LZ4)])
def test_views_equal_the_client(cmq_spark, broker, client, topic, batching, compression):
    produce(client, topic, workload(120, 17, "a"), batching=batching, compression=compression)
    log = read_all(client, topic)
    expected_raw = sorted(log, key=lambda x: x[2:])
    for direct in (True, False):
        assert rows_of(reader(cmq_spark, broker, topic, direct=direct)) == expected_raw, direct
        # latest before compaction ever ran: the whole log is tail
        assert latest_rows(reader(cmq_spark, broker, topic, direct=direct, view="latest")) == latest_of(log)

    compact(broker, topic)
    produce(client, topic, workload(40, 23, "b"), batching=batching, compression=compression)
    log = read_all(client, topic)
    compacted = sorted(read_all(client, topic, compacted=True), key=lambda x: x[2:])
    assert len(compacted) < len(log)
    for direct in (True, False):
        assert rows_of(reader(cmq_spark, broker, topic, direct=direct, view="compacted")) == compacted, direct
        assert rows_of(reader(cmq_spark, broker, topic, direct=direct)) == sorted(log, key=lambda x: x[2:])
        assert latest_rows(reader(cmq_spark, broker, topic, direct=direct, view="latest")) == latest_of(log)
        with_deleted = reader(
            cmq_spark, broker, topic, direct=direct, view="latest", includeTombstones="true"
        )
        assert latest_rows(with_deleted) == latest_of(log, include_tombstones=True)
        # cut into tasks: the compacted part by entry ids of its source ledger (broker) or by
        # slices of the compacted ledger (direct); every piece starts and stops at its bounds
        split = reader(cmq_spark, broker, topic, direct=direct, view="compacted", minPartitions="5")
        assert rows_of(split) == compacted, direct
        if not batching:
            assert split.rdd.getNumPartitions() >= 5, direct
        split = reader(cmq_spark, broker, topic, direct=direct, view="latest", minPartitions="5")
        assert latest_rows(split) == latest_of(log)


def test_metadata_columns_and_options(cmq_spark, broker, client, topic):
    n = 60
    items = [(f"k{i}" if i % 2 else None, f"v{i}".encode()) for i in range(n)]
    props = [{"i": str(i)} for i in range(n)]
    ids = produce(
        client, topic, items, event_times=[1_700_000_000_000 + i for i in range(n)], properties=props
    )
    df = reader(cmq_spark, broker, topic, direct=True)
    assert df.columns == [
        "value",
        "__key",
        "__topic",
        "__messageId",
        "__publishTime",
        "__eventTime",
        "__messageProperties",
    ]
    rows = sorted(df.collect(), key=lambda r: int(r["__messageProperties"]["i"]))
    assert [bytes(r["value"]) for r in rows] == [v for _, v in items]
    assert [r["__key"] for r in rows] == [k for k, _ in items]
    assert {r["__topic"] for r in rows} == {topic}
    assert [int(r["__eventTime"].timestamp() * 1000) for r in rows] == [
        1_700_000_000_000 + i for i in range(n)
    ]
    # __messageId is what the client deserializes and seeks to
    mid = pulsar.MessageId.deserialize(bytes(rows[10]["__messageId"]))
    assert (mid.ledger_id(), mid.entry_id()) == (ids[10].ledger_id(), ids[10].entry_id())

    # offsets: JSON of message ids, start inclusive, end exclusive; Kafka alias subscribe
    lo, hi = ids[10], ids[20]
    offs = {
        "startingOffsets": json.dumps({topic: f"{lo.ledger_id()}:{lo.entry_id()}"}),
        "endingOffsets": json.dumps({topic: {"ledgerId": hi.ledger_id(), "entryId": hi.entry_id()}}),
    }
    for direct in (True, False):
        got = reader(cmq_spark, broker, topic, direct=direct, **offs).collect()
        assert sorted(bytes(r["value"]) for r in got) == sorted(v for _, v in items[10:20])
    # times: startingTime inclusive, endingTime exclusive, on publish time
    publish = sorted(int(r["__publishTime"].timestamp() * 1000) for r in rows)
    t0 = publish[30]
    got = reader(cmq_spark, broker, topic, direct=True, startingTimestamp=str(t0)).collect()
    assert len(got) == sum(1 for p in publish if p >= t0)
    got = reader(cmq_spark, broker, topic, direct=True, endingTime=str(t0)).collect()
    assert len(got) == sum(1 for p in publish if p < t0)
    # splitting: minPartitions and maxRecordsPerPartition cut one ledger into several tasks
    df = reader(cmq_spark, broker, topic, direct=True, minPartitions="4")
    assert df.rdd.getNumPartitions() >= 4
    assert df.count() == n
    df = reader(cmq_spark, broker, topic, direct=True, maxRecordsPerPartition="10")
    assert df.rdd.getNumPartitions() >= 6
    assert df.count() == n


def test_avro_schema_topic_is_typed_columns(cmq_spark, broker, client, topic):
    from pulsar.schema import AvroSchema

    producer = client.create_producer(topic, schema=AvroSchema(Price), batching_enabled=False)
    for i in range(12):
        producer.send(Price(symbol=f"S{i % 4}", price=10.0 + i, volume=i), partition_key=f"S{i % 4}")
    producer.close()
    for direct in (True, False):
        df = reader(cmq_spark, broker, topic, direct=direct, view="latest")
        types = dict(df.dtypes)
        assert types["symbol"] == "string" and types["price"] == "float" and types["volume"] == "int"
        got = {r["symbol"]: (r["price"], r["volume"]) for r in df.collect()}
        assert got == {f"S{j}": (10.0 + 8 + j, 8 + j) for j in range(4)}


def test_partitioned_topic_and_pattern(cmq_spark, broker, client, topic):
    create_partitioned(broker, topic, 3)
    base = topic.replace("persistent://", "")
    items = [(f"k{i % 9}", f"v{i}".encode()) for i in range(90)]
    produce(client, topic, items)
    expected = sorted(read_all(client, topic), key=lambda x: (x[0], x[1]))
    for direct in (True, False):
        df = reader(cmq_spark, broker, topic, direct=direct)
        rows = df.select("__key", "value", "__topic").collect()
        assert sorted((r["__key"], bytes(r["value"])) for r in rows) == [(k, v) for k, v, *_ in expected]
        assert {r["__topic"] for r in rows} == {f"{topic}-partition-{i}" for i in range(3)}
        latest = latest_rows(reader(cmq_spark, broker, topic, direct=direct, view="latest"))
        assert latest == latest_of(items)
    name = base.rsplit("/", 1)[1]
    df = (
        cmq_spark.read.format("compactmq")
        .option("subscribePattern", f"persistent://public/default/{name}.*")
        .load(str(broker.data_dir))
    )
    assert df.count() == len(items)


def test_broker_without_admin_url_and_fail_on_data_loss(cmq_spark, broker, client, topic):
    items = [(f"k{i % 4}", f"v{i}".encode()) for i in range(30)] + [("k3", b"")]
    ids = produce(client, topic, items, batching=True)
    log = read_all(client, topic)
    plain = cmq_spark.read.format("compactmq").option("topic", topic).option("service.url", broker.url)
    assert rows_of(plain.load()) == sorted(log, key=lambda x: x[2:])
    assert latest_rows(plain.option("view", "latest").load()) == latest_of(log)

    # a start before the first retained message: an error by default, the earliest with failOnDataLoss=false
    gone = json.dumps({topic: f"{ids[0].ledger_id() - 1}:0"})
    with pytest.raises(Exception, match="failOnDataLoss"):
        reader(cmq_spark, broker, topic, direct=True, startingOffsets=gone).collect()
    df = reader(cmq_spark, broker, topic, direct=True, startingOffsets=gone, failOnDataLoss="false")
    assert df.count() == len(items)


def reference_latest(records, strategy):
    """The reference model of the compaction tests, folded over (key, value, event_time) in id order."""
    from compaction.reference import keep_left

    state: dict = {}
    for key, value, et in records:
        if key is None:
            continue
        if value == b"":
            state.pop(key, None)
        elif key not in state or not keep_left(
            strategy, (None, key, state[key][0], state[key][1]), (None, key, value, et)
        ):
            state[key] = (value, et)
    return {k: v for k, (v, _) in state.items()}


@pytest.mark.parametrize("strategy", ["keep-first", "event-time"])
def test_latest_folds_with_the_topic_strategy(cmq_spark, broker, client, topic, strategy):
    import urllib.request

    client.create_producer(topic).close()  # the topic exists, so it can have a policy
    local = topic.replace("persistent://", "")
    req = urllib.request.Request(
        f"http://127.0.0.1:{broker.web_port}/admin/v2/persistent/{local}/compactionStrategy",
        data=json.dumps(strategy).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    urllib.request.urlopen(req).close()
    records = [
        (f"k{i % 6}", f"v{i}".encode() if i % 8 != 7 else b"", 1_000 + (i * 7919) % 97) for i in range(60)
    ]
    produce(client, topic, [(k, v) for k, v, _ in records[:40]], event_times=[et for *_, et in records[:40]])
    compact(broker, topic)
    produce(client, topic, [(k, v) for k, v, _ in records[40:]], event_times=[et for *_, et in records[40:]])
    expected = reference_latest(records, strategy)
    assert expected != reference_latest(records, "keep-latest")  # the strategy matters here
    for direct in (True, False):
        assert latest_rows(reader(cmq_spark, broker, topic, direct=direct, view="latest")) == expected, direct
