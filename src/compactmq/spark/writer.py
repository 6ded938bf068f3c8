"""Writing a DataFrame to topics: ``df.write.format("compactmq")`` and ``writeStream``.

Each Spark task opens its own ``pulsar.Client`` (``service.url``, ``pulsar.client.*``) and one
producer per destination topic, and sends its rows asynchronously, flushing before it reports
success, so a task that succeeds has every row stored (at-least-once: a retried task sends its rows
again). A row becomes one message:

* the value from the ``value`` column (bytes, or a string encoded as UTF-8), or, when the topic has
  an Avro or JSON schema, from the columns named like the schema's fields, encoded with that schema
  (the producer declares the topic's schema, so consumers decode it as usual);
* ``__key`` is the partition key (it also routes the row to a partition of a partitioned topic),
  ``__eventTime`` the event time, ``__messageProperties`` the properties;
* ``__topic`` names the destination per row; without the column, the ``topic`` option does.

Exactly-once when the topic has deduplication on (``deduplicationEnabled``): every producer is named
after the write and the Spark task (``<producerName>-<partition id>``) and every message's sequence
id is its row's offset in the task's input (for ``writeStream``, ``batchId * 2**32 + offset``), so a
retried task resends the same (name, sequence id) pairs and the broker drops the ones it already
stored. ``producerName`` (option) names the write: a rerun of the same write with the same name
stores nothing twice; without it a batch write takes a fresh name (task retries are still deduplicated)
and a streaming write the query's id, which survives restarts from the checkpoint. Deterministic
input partitions are assumed, as for any idempotent Spark sink, and keyless rows sent to a
*partitioned* topic stay at-least-once (the client picks their partition itself). Without deduplication the names
and ids are ignored by the broker and the write is at-least-once.

Other metadata columns of a read (``__messageId``, ``__publishTime``) are ignored, so a DataFrame
read from one topic can be written to another as it is. The topic's schema is looked up on the
driver (``admin.url``, or the data directory in ``path``), once per write.
"""

from __future__ import annotations

import datetime as _dt
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from pyspark.sql.datasource import (
    DataSourceStreamWriter,
    DataSourceWriter,
    WriterCommitMessage,
)

from ..errors import InvalidConfiguration, TopicNotFound
from .options import normalize
from .values import AVRO, TopicSchema

SEND_TIMEOUT_S = 120


@dataclass(frozen=True)
class WriteOptions:
    service_url: str
    topic: str | None
    client: dict
    schema: TopicSchema
    producer_name: str | None = None


@dataclass
class WriteResult(WriterCommitMessage):
    rows: int


def parse_write_options(options, columns: list[str]) -> WriteOptions:
    from ..naming import canonical

    o = normalize(options)
    service_url = o.get("service.url")
    if not service_url:
        raise InvalidConfiguration("writing needs option service.url (the broker)")
    topic = o.get("topic")
    if not topic and "__topic" not in columns:
        raise InvalidConfiguration("set option topic, or give the DataFrame a __topic column")
    topic = canonical(str(topic)) if topic else None
    client = {k[len("pulsar.client.") :]: v for k, v in o.items() if k.startswith("pulsar.client.")}
    schema = TopicSchema()
    if topic and (o.get("admin.url") or o.get("path")):
        from .options import parse_read_options
        from .source import topic_schema

        read = {
            k: v
            for k, v in o.items()
            if k in ("service.url", "admin.url", "path") or k.startswith("pulsar.client.")
        }
        try:
            schema = topic_schema(parse_read_options({**read, "topic": topic}))
        except TopicNotFound:  # the first write creates the topic (auto topic creation): no schema yet
            schema = TopicSchema()
    value_columns = [c for c in columns if not c.startswith("__")]
    if not schema.is_record and value_columns != ["value"]:
        raise InvalidConfiguration(
            f"columns {value_columns}: a topic without an Avro/JSON schema takes one value column "
            "(set admin.url so that the topic's schema is used)"
        )
    name = o.get("producername")
    if name is not None and not str(name).strip():
        raise InvalidConfiguration("option producerName must not be empty")
    return WriteOptions(str(service_url), topic, client, schema, str(name).strip() if name else None)


class _RawSchema:
    """A ``pulsar.schema.Schema`` that declares the topic's schema but sends pre-encoded bytes."""

    def __new__(cls, schema: TopicSchema):
        import _pulsar
        from pulsar.schema import Schema

        class Raw(Schema):
            def __init__(self):
                kind = _pulsar.SchemaType.AVRO if schema.type == AVRO else _pulsar.SchemaType.JSON
                name = json.loads(schema.definition).get("name", "Record")
                super().__init__(bytes, kind, json.loads(schema.definition), name)

            def encode(self, obj):
                return obj

            def decode(self, data):
                return data

        return Raw()


class Encoder:
    """Row -> payload bytes with the topic's schema (built on the executor)."""

    def __init__(self, schema: TopicSchema):
        self.schema = schema
        self._writer = None
        self._fields: list = []
        if schema.is_record:
            self._fields = [f.name for f in schema.avro().fields]
            if schema.type == AVRO:
                import avro.io

                self._writer = avro.io.DatumWriter(schema.avro())

    def encode(self, row: dict) -> bytes:
        if self.schema.is_record:
            record = {name: _plain(row.get(name)) for name in self._fields}
            if self._writer is not None:
                import avro.io

                buf = io.BytesIO()
                self._writer.write(record, avro.io.BinaryEncoder(buf))
                return buf.getvalue()
            return json.dumps(record, default=str).encode()
        value = row.get("value")
        if value is None:
            return b""  # a null value is a tombstone
        if isinstance(value, str):
            return value.encode("utf-8")
        return bytes(value)


def _plain(v: Any) -> Any:
    if isinstance(v, (bytearray, memoryview)):
        return bytes(v)
    if hasattr(v, "asDict"):
        return {k: _plain(x) for k, x in v.asDict().items()}
    return v


def _millis(v) -> int | None:
    if v is None:
        return None
    if isinstance(v, _dt.datetime):
        if v.tzinfo is None:
            v = v.astimezone()
        return int(v.timestamp() * 1000)
    return int(v)


#: deterministic batches (see write_rows): size by count, a delay and a byte limit never reached first
BATCH_MESSAGES = 500
BATCH_DELAY_MS = 3_600_000
BATCH_BYTES = 1 << 30

#: a streaming micro-batch's sequence ids start at batchId * SEQUENCE_STRIDE (2**32 rows per task)
SEQUENCE_STRIDE = 1 << 32


def task_identity(default_name: str | None, streaming: bool) -> tuple[str, int]:
    """``(producer name, first sequence id)`` of the running Spark task (see the module notes)."""
    import uuid

    from pyspark import TaskContext

    ctx = TaskContext.get()
    partition = ctx.partitionId() if ctx is not None else 0
    base = 0
    name = default_name
    if streaming and ctx is not None:
        batch = ctx.getLocalProperty("streaming.sql.batchId")
        base = int(batch) * SEQUENCE_STRIDE if batch else 0
        if name is None and ctx.getLocalProperty("sql.streaming.queryId"):
            name = "spark-" + str(ctx.getLocalProperty("sql.streaming.queryId"))
    if name is None:
        name = "spark-" + uuid.uuid4().hex[:16]
    return f"{name}-{partition}", base


def write_rows(
    opts: WriteOptions, rows: Iterator, producer_name: str | None = None, first_sequence: int = 0
) -> int:
    """Send ``rows`` (pyspark Rows) as messages; returns how many, after all are stored. With
    ``producer_name``, the producers carry it and the n-th row (from 0) has sequence id
    ``first_sequence + n + 1``."""
    import pulsar

    from .broker import BrokerError, open_client, refused

    client = open_client(opts.service_url, opts.client)
    encoder = Encoder(opts.schema)
    producers: dict = {}
    errors: list = []
    sent = 0

    def done(res, _mid):
        if res != pulsar.Result.Ok:
            errors.append(res)

    try:
        for row in rows:
            d = row.asDict()
            topic = d.get("__topic") or opts.topic
            if not topic:
                raise InvalidConfiguration("a row has no __topic and no topic option is set")
            producer = producers.get(topic)
            if producer is None:
                kw: dict = {
                    "batching_enabled": True,
                    "block_if_queue_full": True,
                    "send_timeout_millis": SEND_TIMEOUT_S * 1000,
                }
                if producer_name is not None:
                    # batches cut by count only, so a retry cuts the same batches: the broker
                    # deduplicates a batch as a whole (by its highest sequence id), and a batch
                    # straddling the stored prefix would be stored again in full
                    kw.update(
                        batching_max_messages=BATCH_MESSAGES,
                        batching_max_publish_delay_ms=BATCH_DELAY_MS,
                        batching_max_allowed_size_in_bytes=BATCH_BYTES,
                    )
                if opts.schema.is_record:
                    kw["schema"] = _RawSchema(opts.schema)
                if producer_name is not None:
                    kw["producer_name"] = producer_name
                try:
                    producer = producers[topic] = client.create_producer(topic, **kw)
                except Exception as e:  # noqa: BLE001 - pulsar.Timeout, AuthenticationError, ...
                    raise BrokerError(
                        refused(opts.service_url, f"creating a producer on {topic}", e)
                    ) from None
            extra: dict = {}
            if d.get("__key") is not None:
                extra["partition_key"] = str(d["__key"])
            if d.get("__eventTime") is not None:
                extra["event_timestamp"] = _millis(d["__eventTime"])
            if d.get("__messageProperties"):
                extra["properties"] = {str(k): str(v) for k, v in d["__messageProperties"].items()}
            if producer_name is not None:  # from 1: the Python client ignores a sequence_id of 0
                extra["sequence_id"] = first_sequence + sent + 1
            producer.send_async(encoder.encode(d), done, **extra)
            sent += 1
            if errors:
                break
        for producer in producers.values():
            producer.flush()
        if errors:
            raise RuntimeError(f"compactmq: {len(errors)} message(s) were not stored: {errors[0]}")
    finally:
        for producer in producers.values():
            producer.close()
        client.close()
    return sent


class CompactMQWriter(DataSourceWriter):
    def __init__(self, options, schema, overwrite: bool):
        if overwrite:
            raise InvalidConfiguration("a topic is a log: use mode append, not overwrite")
        opts = parse_write_options(options, [f.name for f in schema.fields])
        if opts.producer_name is None:  # one name per write, chosen on the driver: retries share it
            import uuid

            opts = replace(opts, producer_name="spark-" + uuid.uuid4().hex[:16])
        self.opts = opts

    def write(self, iterator):
        name, base = task_identity(self.opts.producer_name, streaming=False)
        return WriteResult(write_rows(self.opts, iterator, name, base))


class CompactMQStreamWriter(DataSourceStreamWriter):
    """``writeStream``: every micro-batch's rows are sent like a batch write (exactly-once with
    deduplication on: the sequence ids carry the batch id, the producer name the query id)."""

    def __init__(self, options, schema, overwrite: bool):
        self.opts = parse_write_options(options, [f.name for f in schema.fields])

    def write(self, iterator):
        name, base = task_identity(self.opts.producer_name, streaming=True)
        return WriteResult(write_rows(self.opts, iterator, name, base))

    def commit(self, messages, batchId) -> None:
        pass

    def abort(self, messages, batchId) -> None:
        pass
