"""Through the broker: whole entries read over the binary protocol and parsed as columns
(``broker_entries``) give the DataFrames of the official client's row path (``columnar=false``):
every column, raw and compacted views (with and without ``includeTombstones``), a partitioned topic
with batches, compression, properties, event times, keyless messages and tombstones, splits cut
inside ledgers, and an Avro topic; and a client with options falls back to the official client."""

from __future__ import annotations

import pytest

from .helpers import compact, produce, produce_every_kind, produce_prices

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def collect(spark, broker, topic, columnar: bool, admin: bool = True, direct: bool = False, **options):
    """Rows of a read through the broker (``direct``: of the same read from the files)."""
    r = spark.read.format("compactmq").option("topic", topic).option("columnar", str(columnar).lower())
    if not direct:
        r = r.option("service.url", broker.url)
        if admin:
            r = r.option("admin.url", f"http://127.0.0.1:{broker.web_port}")
    for k, v in options.items():
        r = r.option(k, v)
    rows = [r.asDict() for r in (r.load(str(broker.data_dir)) if direct else r.load()).collect()]
    for row in rows:  # the map column arrives as a dict: make rows comparable
        row["__messageProperties"] = sorted((row["__messageProperties"] or {}).items())
    return sorted(rows, key=lambda row: (row["__topic"], id_of(row)))


def id_of(row) -> tuple:
    from compactmq.spark.messages import deserialize_message_id

    return deserialize_message_id(bytes(row["__messageId"]))


def without_batch_size(rows):
    """The rows with ids as the client's row path writes them: the official client's Python API
    does not tell a message's batch size, so that path leaves ``batch_size`` out of
    ``__messageId`` (the files and the entries give it, as ``MessageId.serialize()`` does)."""
    from compactmq.spark.messages import serialize_message_id

    out = []
    for row in rows:
        ledger, entry, batch, partition = id_of(row)
        out.append({**row, "__messageId": serialize_message_id(ledger, entry, batch, partition)})
    return out


def test_entries_as_columns_equal_the_client_rows_on_a_partitioned_topic(cmq_spark, broker, client, topic):
    from compactmq.spark import pushdown

    n = produce_every_kind(broker, client, topic, compact_between=True)
    for view in ("raw", "compacted"):
        for extra in ({}, {"minPartitions": "5"}, {"includeTombstones": "true"}):
            got = collect(cmq_spark, broker, topic, True, view=view, **extra)
            want = collect(cmq_spark, broker, topic, False, view=view, **extra)
            assert without_batch_size(got) == without_batch_size(want), (view, extra)
            # and what the files give; ids included on raw (the broker may rewrite a compacted
            # batch for delivery, changing the batch size the ids of its messages carry)
            if extra:
                continue
            files = collect(cmq_spark, broker, topic, True, direct=True, view=view)
            if view == "raw":
                assert got == files, extra
            else:
                assert without_batch_size(got) == without_batch_size(files), extra
            assert len(got) == (n if view == "raw" else len(got))
    # without admin.url a partition is one "view" split, read by the client as before
    assert collect(cmq_spark, broker, topic, True, admin=False) == collect(
        cmq_spark, broker, topic, False, admin=False
    )
    raw = collect(cmq_spark, broker, topic, True)
    assert any(r["__key"] is None for r in raw) and any(r["value"] == bytearray() for r in raw)
    assert any(r["__messageProperties"] for r in raw) and any(r["__eventTime"] is None for r in raw)
    assert pushdown.STATS is not None


def test_entries_as_columns_equal_the_client_rows_on_an_avro_topic(cmq_spark, broker, client, topic):
    produce_prices(client, topic)
    got = collect(cmq_spark, broker, topic, True)
    assert without_batch_size(got) == without_batch_size(collect(cmq_spark, broker, topic, False))
    assert got == collect(cmq_spark, broker, topic, True, direct=True)
    assert sorted(r["volume"] for r in got) == list(range(40))


def test_a_split_is_read_as_entries_unless_the_auth_plugin_needs_the_client(
    broker, client, topic, monkeypatch
):
    """In process: a raw and a compacted read go through ``broker_entries`` (counted, with a
    ``pulsar.client.*`` option it applies itself), and a read with an authentication plugin it
    does not speak is left to the official client."""
    from compactmq.spark import broker_entries
    from compactmq.spark.options import parse_read_options
    from compactmq.spark.source import CompactMQReader, topic_schema

    from .test_pushdown_topics import SCHEMA

    produce(client, topic, [(f"k{i % 7}", f"v{i}".encode()) for i in range(300)], batching=True)
    compact(broker, topic)
    produce(client, topic, [(f"k{i % 3}", f"w{i}".encode()) for i in range(10)])
    opened = []
    real = broker_entries.EntryReader

    def counting(*a, **kw):
        reader = real(*a, **kw)  # raises Unsupported when it cannot serve the read
        opened.append(a[3])
        return reader

    monkeypatch.setattr(broker_entries, "EntryReader", counting)
    # few permits: batches of many messages use them up quickly, and the read must hand them back
    # as the broker counts them (per message), or it waits for entries that never come
    monkeypatch.setattr(broker_entries, "PERMITS", 6)

    def rows(view, columnar=True, **client_opts):
        options = {
            "topic": topic,
            "view": view,
            "service.url": broker.url,
            "admin.url": f"http://127.0.0.1:{broker.web_port}",
            "columnar": str(columnar).lower(),
            "pulsar.client.operationTimeoutSeconds": "15",  # the socket's timeout: fail, not hang
            **{f"pulsar.client.{k}": v for k, v in client_opts.items()},
        }
        opts = parse_read_options(options)
        reader = CompactMQReader(opts, SCHEMA, topic_schema(opts))
        out = [r for p in reader.partitions() for b in reader.read(p) for r in b.to_pylist()]
        return sorted(out, key=id_of)

    for view, count in (("raw", 310), ("compacted", 7)):
        opened.clear()
        got = rows(view)
        assert without_batch_size(got) == without_batch_size(rows(view, columnar=False)) and len(got) >= count
        assert opened  # read as entries
    opened.clear()
    # an authentication plugin the entry reader does not speak: the official client reads
    with pytest.raises(Exception):  # noqa: B017 - whatever the client says of an unknown plugin
        rows("raw", authPluginClassName="org.example.NoSuchAuth", authParams="x")
    assert not opened
