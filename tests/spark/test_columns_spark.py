"""Through Spark: the direct path's columnar scan returns the DataFrames of the row path
(``columnar=false``), every column, raw and compacted views, a partitioned topic with batches,
compression, properties, event times, keyless messages and tombstones, and an Avro topic."""

from __future__ import annotations

import pulsar
import pytest

from .helpers import compact, produce, produce_every_kind, produce_prices

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def collect(spark, broker, topic, columnar: bool, **options):
    r = spark.read.format("compactmq").option("topic", topic).option("columnar", str(columnar).lower())
    for k, v in options.items():
        r = r.option(k, v)
    rows = [r.asDict() for r in r.load(str(broker.data_dir)).collect()]
    for row in rows:  # the map column arrives as a dict: make rows comparable
        row["__messageProperties"] = sorted((row["__messageProperties"] or {}).items())
    return sorted(rows, key=lambda row: (row["__topic"], bytes(row["__messageId"])))


def test_columnar_equals_rows_on_a_partitioned_batched_topic(cmq_spark, broker, client, topic):
    n = produce_every_kind(broker, client, topic, compact_between=False)
    for view in ("raw", "compacted"):
        for extra in ({}, {"minPartitions": "5"}, {"includeTombstones": "true"}):
            got = collect(cmq_spark, broker, topic, True, view=view, **extra)
            want = collect(cmq_spark, broker, topic, False, view=view, **extra)
            assert got == want, (view, extra)
            assert len(got) == (n if view == "raw" else len(got))
    raw = collect(cmq_spark, broker, topic, True)
    assert any(r["__key"] is None for r in raw) and any(r["value"] == bytearray() for r in raw)
    assert any(r["__messageProperties"] for r in raw) and any(r["__eventTime"] is None for r in raw)


def test_columnar_equals_rows_on_an_avro_topic(cmq_spark, broker, client, topic):
    produce_prices(client, topic)
    got = collect(cmq_spark, broker, topic, True)
    assert got == collect(cmq_spark, broker, topic, False)
    assert sorted(r["volume"] for r in got) == list(range(40))


def test_chunks_cut_anywhere_give_the_rows_of_the_row_path(broker, client, topic, monkeypatch):
    from compactmq.spark import direct

    from .test_pushdown import source_rows

    items = [(f"k{i % 11}", b"x" * (i % 50)) for i in range(200)]
    produce(client, topic, items[:120], batching=True, compression=pulsar.CompressionType.LZ4)
    produce(client, topic, items[120:])
    compact(broker, topic)
    produce(client, topic, items[:30], batching=True)
    want = {view: source_rows(broker, topic, view, [], columnar=False) for view in ("raw", "compacted")}
    assert len(want["raw"]) == 230
    for entries, size in ((1, 1), (3, 10_000), (1000, 700)):
        monkeypatch.setattr(direct, "CHUNK_ENTRIES", entries)
        monkeypatch.setattr(direct, "CHUNK_BYTES", size)
        for view in ("raw", "compacted"):
            assert source_rows(broker, topic, view, []) == want[view], (entries, size, view)


def test_a_schema_naming_some_columns_reads_just_those(cmq_spark, broker, client, topic):
    """``spark.read.schema(...)``: the columns named, in that order, on every path and view,
    equal to those columns of the full read (the way to prune on Spark 4.3, whose Python Data
    Source API gives the reader no required columns); a column the topic has not is refused."""
    items = [(f"k{i % 7}", f"value-{i}".encode()) for i in range(60)]
    produce(client, topic, items, batching=True, properties=[{"i": str(i)} for i in range(60)])
    compact(broker, topic)
    for view in ("raw", "compacted", "latest"):
        full = collect(cmq_spark, broker, topic, True, view=view)
        for columnar in (True, False):
            df = (
                cmq_spark.read.format("compactmq")
                .schema("__messageId binary, value binary, __key string")
                .option("topic", topic)
                .option("view", view)
                .option("columnar", str(columnar).lower())
                .load(str(broker.data_dir))
            )
            assert df.columns == ["__messageId", "value", "__key"]
            got = sorted((bytes(r[0]), r[1], r[2]) for r in df.collect())
            want = sorted((bytes(r["__messageId"]), r["value"], r["__key"]) for r in full)
            assert got == want, (view, columnar)
    bad = cmq_spark.read.format("compactmq").schema("nope string").option("topic", topic)
    with pytest.raises(Exception, match="'nope' is not a column of this topic"):
        bad.load(str(broker.data_dir)).collect()


def test_columnar_equals_rows_for_zlib_snappy_and_a_json_schema(cmq_spark, broker, client, topic):
    """The codecs and the schema kind the Spark-level tests above do not use (the parse-level
    tests in ``test_columns`` cover every codec and schema over random entries)."""
    from pulsar.schema import Integer, JsonSchema, Record, String

    class Quote(Record):
        symbol = String()
        volume = Integer()

    for i, (codec, batching) in enumerate(
        ((pulsar.CompressionType.ZLib, True), (pulsar.CompressionType.SNAPPY, False))
    ):
        producer = client.create_producer(
            topic,
            schema=JsonSchema(Quote),
            compression_type=codec,
            batching_enabled=batching,
            batching_max_publish_delay_ms=50,
        )
        for j in range(30):
            n = 30 * i + j
            producer.send_async(Quote(symbol=f"S{n % 5}", volume=n), None, partition_key=f"S{n % 5}")
        producer.flush()
        producer.close()
    compact(broker, topic)
    for view in ("raw", "compacted"):
        got = collect(cmq_spark, broker, topic, True, view=view)
        assert got == collect(cmq_spark, broker, topic, False, view=view), view
    assert sorted(r["volume"] for r in collect(cmq_spark, broker, topic, True)) == list(range(60))
