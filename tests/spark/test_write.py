"""``df.write.format("compactmq")``: rows become messages that read back equal, by the official client
and by the source; Avro-schema topics are encoded with the topic's schema; ``__topic`` routes rows."""

from __future__ import annotations

import datetime as dt

import pulsar
import pytest

from .helpers import read_all

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def admin_url(broker):
    return f"http://127.0.0.1:{broker.web_port}"


def test_write_rows_read_back_equal(cmq_spark, broker, client, topic):
    other = topic + "-routed"
    t0 = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    rows = [
        (
            f"v{i}".encode(),
            f"k{i % 5}",
            t0 + dt.timedelta(seconds=i),
            {"n": str(i)},
            topic if i % 3 else other,
        )
        for i in range(30)
    ]
    df = cmq_spark.createDataFrame(
        rows,
        "value binary, __key string, __eventTime timestamp, "
        "__messageProperties map<string,string>, __topic string",
    )
    df.write.format("compactmq").option("service.url", broker.url).mode("append").save()

    got = read_all(client, topic) + read_all(client, other)
    assert sorted((k, v) for k, v, *_ in got) == sorted((r[1], r[0]) for r in rows)
    back = cmq_spark.read.format("compactmq").option("topics", f"{topic},{other}").load(str(broker.data_dir))
    out = sorted(
        (
            bytes(r["value"]),
            r["__key"],
            r["__eventTime"].astimezone(dt.UTC),
            dict(r["__messageProperties"]),
            r["__topic"],
        )
        for r in back.collect()
    )
    assert out == sorted(rows)


def test_write_avro_topic_with_typed_columns(cmq_spark, broker, client, topic):
    from pulsar.schema import AvroSchema, Float, Record, String

    class Quote(Record):
        symbol = String()
        price = Float()

    p = client.create_producer(topic, schema=AvroSchema(Quote))  # registers the schema
    p.send(Quote(symbol="SEED", price=1.0), partition_key="SEED")
    p.close()
    df = cmq_spark.createDataFrame(
        [("A", 1.5, "A"), ("B", 2.5, "B")], "symbol string, price float, __key string"
    )
    (
        df.write.format("compactmq")
        .option("service.url", broker.url)
        .option("admin.url", admin_url(broker))
        .option("topic", topic)
        .mode("append")
        .save()
    )
    consumer = client.subscribe(
        topic, "check", schema=AvroSchema(Quote), initial_position=pulsar.InitialPosition.Earliest
    )
    got = []
    for _ in range(3):
        m = consumer.receive(10000)
        got.append((m.value().symbol, m.value().price))
    consumer.close()
    assert sorted(got) == [("A", 1.5), ("B", 2.5), ("SEED", 1.0)]
    back = (
        cmq_spark.read.format("compactmq")
        .option("topic", topic)
        .option("view", "latest")
        .load(str(broker.data_dir))
    )
    assert sorted((r["symbol"], r["price"]) for r in back.collect()) == sorted(got)


def test_write_needs_a_destination(cmq_spark, broker):
    df = cmq_spark.createDataFrame([(b"x",)], "value binary")
    with pytest.raises(Exception, match="__topic column"):
        df.write.format("compactmq").option("service.url", broker.url).mode("append").save()


def enable_dedup(broker, topic):
    import json
    import urllib.request

    rest = f"{admin_url(broker)}/admin/v2/{topic.replace('://', '/', 1)}"
    urllib.request.urlopen(urllib.request.Request(rest, method="PUT"), timeout=10).close()  # create it
    req = urllib.request.Request(
        rest + "/deduplicationEnabled",
        method="POST",
        data=json.dumps(True).encode(),
        headers={"Content-Type": "application/json"},
    )
    urllib.request.urlopen(req, timeout=10).close()


def test_exactly_once_with_deduplication_on(cmq_spark, broker, client, topic):
    """A rerun of a named write stores nothing twice; an unnamed rerun is a new write (at-least-once)."""
    enable_dedup(broker, topic)
    rows = [(f"v{i}".encode(), f"k{i}") for i in range(60)]
    df = cmq_spark.createDataFrame(rows, "value binary, __key string").repartition(3)
    for _ in range(2):
        (
            df.write.format("compactmq")
            .option("service.url", broker.url)
            .option("topic", topic)
            .option("producerName", "nightly-load")
            .mode("append")
            .save()
        )
    got = read_all(client, topic)
    assert sorted((k, v) for k, v, *_ in got) == sorted((k, v) for v, k in rows)  # each row once
    df.write.format("compactmq").option("service.url", broker.url).option("topic", topic).mode(
        "append"
    ).save()
    assert len(read_all(client, topic)) == 2 * len(rows)


def test_a_retried_task_is_deduplicated(broker, client, topic):
    """A task that dies after sending part of its rows and is retried (same producer name, same
    row offsets) leaves each row once: the broker drops the resent sequence ids."""
    from pyspark.sql import Row

    from compactmq.spark.values import TopicSchema
    from compactmq.spark.writer import WriteOptions, write_rows

    enable_dedup(broker, topic)
    opts = WriteOptions(broker.url, topic, {}, TopicSchema(), "job-1")
    rows = [Row(value=f"v{i}".encode(), __key=f"k{i % 50}") for i in range(1200)]

    def crash_after(n):
        yield from rows[:n]
        raise RuntimeError("executor lost")

    # the first attempt fails after 1100 rows: the full batches it sent are stored
    with pytest.raises(RuntimeError, match="executor lost"):
        write_rows(opts, crash_after(1100), "job-1-0", 0)
    assert 0 < len(read_all(client, topic)) < 1200
    assert write_rows(opts, iter(rows), "job-1-0", 0) == 1200  # the retry starts over
    got = read_all(client, topic)
    assert [(k, v) for k, v, *_ in got] == [(r["__key"], r["value"]) for r in rows]
