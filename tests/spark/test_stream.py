"""``readStream``: a query to a file sink, stopped and restarted from its checkpoint, delivers every
message exactly once; ``maxOffsetsPerTrigger`` caps micro-batches."""

from __future__ import annotations

import pytest

from compactmq.spark.stream import advance

from .helpers import produce, read_all

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def test_advance_counts_entries_over_ledgers():
    ledgers = ((3, 5), (7, 4))
    assert advance(ledgers, (-1, -1, -1), (7, 4, -1), 3) == (3, 3, -1)
    assert advance(ledgers, (3, 3, -1), (7, 4, -1), 3) == (7, 1, -1)
    assert advance(ledgers, (3, 3, -1), (7, 2, -1), 10) == (7, 2, -1)


def run_once(spark, broker, topic, out, checkpoint):
    q = (spark.readStream.format("compactmq").option("topic", topic).option("startingOffsets", "earliest")
         .option("maxOffsetsPerTrigger", "25").load(str(broker.data_dir))
         .selectExpr("__key", "value", "__messageId")
         .writeStream.format("parquet").option("path", out).option("checkpointLocation", checkpoint)
         .start())
    try:
        q.processAllAvailable()
        return [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]
    finally:
        q.stop()


def test_restart_from_checkpoint_is_exactly_once(cmq_spark, broker, client, topic, tmp_path):
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")
    produce(client, topic, [(f"k{i % 4}", f"a{i}".encode()) for i in range(60)])
    batches = run_once(cmq_spark, broker, topic, out, checkpoint)
    assert sum(batches) == 60 and max(batches) <= 25 and len(batches) >= 3
    produce(client, topic, [(f"k{i % 4}", f"b{i}".encode()) for i in range(30)], batching=True)
    run_once(cmq_spark, broker, topic, out, checkpoint)
    rows = cmq_spark.read.parquet(out).collect()
    got = sorted((r["__key"], bytes(r["value"])) for r in rows)
    assert got == sorted((k, v) for k, v, *_ in read_all(client, topic))
    assert len({bytes(r["__messageId"]) for r in rows}) == 90


def test_write_stream_copies_a_topic(cmq_spark, broker, client, topic, tmp_path):
    target = topic + "-copy"
    items = [(f"k{i % 6}", f"c{i}".encode()) for i in range(40)]
    produce(client, topic, items)
    q = (cmq_spark.readStream.format("compactmq").option("topic", topic).option("startingOffsets", "earliest")
         .load(str(broker.data_dir)).select("value", "__key", "__messageProperties")
         .writeStream.format("compactmq").option("service.url", broker.url).option("topic", target)
         .option("checkpointLocation", str(tmp_path / "cp")).start())
    try:
        q.processAllAvailable()
    finally:
        q.stop()
    assert sorted((k, v) for k, v, *_ in read_all(client, target)) == sorted(items)
