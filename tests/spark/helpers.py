"""Oracle helpers: produce with the official client, compact, read back with readers."""

from __future__ import annotations

import urllib.request

import pulsar
from pulsar.schema import Float, Integer, Record, String


class Price(Record):
    """The Avro record of the schema tests' topics."""

    symbol = String()
    price = Float()
    volume = Integer()


def produce(client, topic, items, *, batching=False, compression=None, event_times=None, properties=None):
    """Send ``items`` = [(key or None, value bytes)] in order; returns the message ids."""
    kw = {
        "batching_enabled": batching,
        "batching_max_publish_delay_ms": 50,
        "batching_max_messages": 50,
        "block_if_queue_full": True,
    }
    if compression is not None:
        kw["compression_type"] = compression
    producer = client.create_producer(topic, **kw)
    ids = []

    def done(res, mid):
        assert res == pulsar.Result.Ok, res
        ids.append(mid)

    for i, (key, value) in enumerate(items):
        extra = {}
        if key is not None:
            extra["partition_key"] = key
        if event_times is not None:
            extra["event_timestamp"] = event_times[i]
        if properties is not None:
            extra["properties"] = properties[i]
        producer.send_async(value, done, **extra)
    producer.flush()
    producer.close()
    return ids


def read_all(client, topic, *, compacted=False):
    """Every message a reader from earliest receives: (key, value, ledger, entry, batch)."""
    reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=compacted)
    out = []
    try:
        while reader.has_message_available():
            m = reader.read_next(10000)
            mid = m.message_id()
            out.append(
                (m.partition_key() or None, m.data(), mid.ledger_id(), mid.entry_id(), mid.batch_index())
            )
    finally:
        reader.close()
    return out


def latest_of(records, include_tombstones=False):
    """keep-latest fold of (key, value, ...) records in id order: {key: value} (None = deleted)."""
    state = {}
    for r in records:
        if r[0] is None:
            continue
        state[r[0]] = r[1] if r[1] else None
    if include_tombstones:
        return state
    return {k: v for k, v in state.items() if v is not None}


def compact(broker, topic):
    """One compaction run here (the test's SparkSession), committed through the broker's store;
    the broker first seals the topic's current ledger, as for ``compact-topic``."""
    from compactmq.compaction.jobs import SparkCompactionService
    from compactmq.config import load_config
    from compactmq.storage import Storage
    from compactmq.storage.seal import NOT_SEALED, seal_before_compaction

    config = load_config()
    assert seal_before_compaction(broker.data_dir, config, topic) != NOT_SEALED
    storage = Storage(broker.data_dir, config, read_only=True)
    try:
        return SparkCompactionService(storage, topic, config).compact()
    finally:
        storage.close()


def rows_of(df):
    """(key, value, ledger, entry, batch) of a DataFrame read from the source."""
    from compactmq.spark.messages import deserialize_message_id

    out = []
    for r in df.select("__key", "value", "__messageId").collect():
        ledger, entry, batch, _ = deserialize_message_id(bytes(r["__messageId"]))
        out.append((r["__key"], bytes(r["value"]) if r["value"] is not None else None, ledger, entry, batch))
    return sorted(out, key=lambda x: x[2:])


def create_partitioned(broker, topic, partitions: int) -> None:
    """Create ``topic`` as a partitioned topic of ``partitions`` partitions (the admin REST API)."""
    req = urllib.request.Request(
        f"http://127.0.0.1:{broker.web_port}/admin/v2/persistent/{topic.split('://', 1)[1]}/partitions",
        data=str(partitions).encode(),
        method="PUT",
        headers={"Content-Type": "application/json"},
    )
    urllib.request.urlopen(req).close()


def produce_every_kind(broker, client, topic, *, compact_between: bool) -> int:
    """``topic`` made a 2-partition topic of 300 messages with every kind a column can hold:
    keyless messages, tombstones, properties (some none), event times (some 0); the first 150
    batched and ZSTD-compressed, the rest unbatched and LZ4. Both partitions are compacted after
    the first 150 (``compact_between``: the rest is a tail past the horizon) or after all 300.
    Answers the number of messages."""
    create_partitioned(broker, topic, 2)
    n = 300
    items = [
        (None if i % 13 == 4 else f"k{i % 37}", b"" if i % 9 == 2 else f"value-{i}".encode())
        for i in range(n)
    ]
    props = [{"i": str(i), "even": str(i % 2 == 0)} if i % 5 else {} for i in range(n)]
    event_times = [0 if i % 4 == 0 else 1_700_000_000_000 + i for i in range(n)]
    halves = (
        (slice(0, 150), True, pulsar.CompressionType.ZSTD),
        (slice(150, n), False, pulsar.CompressionType.LZ4),
    )
    for half, batching, compression in halves:
        produce(
            client,
            topic,
            items[half],
            batching=batching,
            compression=compression,
            properties=props[half],
            event_times=event_times[half],
        )
        if (half.stop == n) != compact_between:  # after the first half, or after both
            for i in range(2):
                compact(broker, f"{topic}-partition-{i}")
    return n


def produce_prices(client, topic, n: int = 40) -> None:
    """``n`` ``Price`` records on an Avro topic, batched, keyed by symbol (four of them)."""
    producer = client.create_producer(topic, schema=pulsar.schema.AvroSchema(Price), batching_enabled=True)
    for i in range(n):
        producer.send_async(
            Price(symbol=f"S{i % 4}", price=10.0 + i, volume=i), None, partition_key=f"S{i % 4}"
        )
    producer.flush()
    producer.close()


def meta_fields() -> list:
    """The source's metadata columns, as Spark fields, in their order after the value's."""
    from pyspark.sql.types import BinaryType, MapType, StringType, StructField, TimestampType

    return [
        StructField("__key", StringType()),
        StructField("__topic", StringType()),
        StructField("__messageId", BinaryType()),
        StructField("__publishTime", TimestampType()),
        StructField("__eventTime", TimestampType()),
        StructField("__messageProperties", MapType(StringType(), StringType())),
    ]


def source_schema():
    """The source's Spark schema of a topic without a schema: the value as bytes, then the
    metadata columns."""
    from pyspark.sql.types import BinaryType, StructField, StructType

    return StructType([StructField("value", BinaryType()), *meta_fields()])
