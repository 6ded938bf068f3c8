"""Oracle helpers: produce with the official client, compact, read back with readers."""

from __future__ import annotations

import pulsar


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
