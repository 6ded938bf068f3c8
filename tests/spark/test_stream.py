"""``readStream``: a query to a file sink, stopped and restarted from its checkpoint, delivers every
message exactly once; ``maxOffsetsPerTrigger`` caps micro-batches."""

from __future__ import annotations

import pytest

from compactmq.spark.stream import advance

from .helpers import latest_of, produce, read_all

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def test_advance_counts_entries_over_ledgers():
    ledgers = ((3, 5), (7, 4))
    assert advance(ledgers, (-1, -1, -1), (7, 4, -1), 3) == (3, 3, -1)
    assert advance(ledgers, (3, 3, -1), (7, 4, -1), 3) == (7, 1, -1)
    assert advance(ledgers, (3, 3, -1), (7, 2, -1), 10) == (7, 2, -1)


def batches_to_parquet(df, out, checkpoint) -> list[int]:
    """Stream ``df`` into parquet files at ``out`` until the query has processed all the input
    available; the input rows of each micro-batch that had any."""
    q = df.writeStream.format("parquet").option("path", out).option("checkpointLocation", checkpoint).start()
    try:
        q.processAllAvailable()
        return [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]
    finally:
        q.stop()


def run_once(spark, broker, topic, out, checkpoint):
    df = (
        spark.readStream.format("compactmq")
        .option("topic", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "25")
        .load(str(broker.data_dir))
        .selectExpr("__key", "value", "__messageId")
    )
    return batches_to_parquet(df, out, checkpoint)


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
    """Two micro-batches into a deduplicating topic: the producers carry the query's id and each
    batch's sequence ids start above the last one's, so the second batch is not taken for a retry."""
    import pulsar

    from .test_write import enable_dedup

    target = topic + "-copy"
    enable_dedup(broker, target)
    items = [(f"k{i % 6}", f"c{i}".encode()) for i in range(40)]
    produce(client, topic, items)
    q = (
        cmq_spark.readStream.format("compactmq")
        .option("topic", topic)
        .option("startingOffsets", "earliest")
        .load(str(broker.data_dir))
        .select("value", "__key", "__messageProperties")
        .writeStream.format("compactmq")
        .option("service.url", broker.url)
        .option("topic", target)
        .option("checkpointLocation", str(tmp_path / "cp"))
        .start()
    )
    try:
        q.processAllAvailable()
        more = [(f"k{i % 6}", f"d{i}".encode()) for i in range(20)]
        produce(client, topic, more)
        q.processAllAvailable()
    finally:
        q.stop()
    assert sorted((k, v) for k, v, *_ in read_all(client, target)) == sorted(items + more)
    reader = client.create_reader(target, pulsar.MessageId.earliest)
    try:
        names = {reader.read_next(10000).producer_name() for _ in range(60)}
    finally:
        reader.close()
    assert names and all(n.startswith(f"spark-{q.id}-") for n in names), names


def test_latest_view_streams_the_state_then_changes(cmq_spark, broker, client, topic, tmp_path):
    first = [(f"k{i % 5}", f"s{i}".encode()) for i in range(25)] + [("k0", b"")]  # k0 deleted
    produce(client, topic, first)
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "cp")

    def run():
        df = (
            cmq_spark.readStream.format("compactmq")
            .option("topic", topic)
            .option("view", "latest")
            .option("maxOffsetsPerTrigger", "2")
            .load(str(broker.data_dir))
            .select("__key", "value")
        )
        return batches_to_parquet(df, out, checkpoint)

    assert run() == [4]  # the latest state in one micro-batch: k1..k4
    changes = [("k1", b"n1"), ("k9", b"n9"), ("k2", b"")]
    produce(client, topic, changes)
    run()  # restarted from the checkpoint: only the changes follow
    rows = sorted((r["__key"], bytes(r["value"])) for r in cmq_spark.read.parquet(out).collect())
    state = sorted((k, v) for k, v in latest_of(first).items())
    assert rows == sorted(state + changes)
