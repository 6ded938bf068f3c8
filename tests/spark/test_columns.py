"""The columnar scan (``entry_columns`` + ``arrow_columns``) against the row path
(``messages.entry_messages`` + ``values.to_record_batch``): identical Arrow batches over random
entries (batched or not, every codec, keyless messages, tombstones, properties, event times,
markers, encrypted entries, compacted-out placeholders, every value schema kind), with the C
scanner and with its numpy reference (``COMPACTMQ_NATIVE=0``)."""

from __future__ import annotations

import json
import os
import struct
from contextlib import contextmanager

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from compactmq.protocol import pulsar_pb2 as pb
from compactmq.protocol.compression import compress
from compactmq.protocol.entry_format import build_entry
from compactmq.spark import values as V
from compactmq.spark.arrow_columns import record_batch
from compactmq.spark.entry_columns import parse_entries, repeated_fields
from compactmq.spark.messages import entry_messages
from compactmq.spark.values import TopicSchema, ValueDecoder, to_record_batch

AVRO_DEF = json.dumps(
    {
        "type": "record",
        "name": "R",
        "fields": [{"name": "a", "type": "int"}, {"name": "b", "type": ["null", "string"]}],
    }
)
CODECS = [pb.NONE, pb.LZ4, pb.ZLIB, pb.ZSTD, pb.SNAPPY]


@contextmanager
def native(flag: str):
    old = os.environ.get("COMPACTMQ_NATIVE")
    os.environ["COMPACTMQ_NATIVE"] = flag
    try:
        yield
    finally:
        if old is None:
            del os.environ["COMPACTMQ_NATIVE"]
        else:
            os.environ["COMPACTMQ_NATIVE"] = old


def arrow_schema_for(schema: TopicSchema):
    from pyspark.sql.types import (
        BinaryType,
        BooleanType,
        DoubleType,
        IntegerType,
        StringType,
        StructField,
        StructType,
    )

    from compactmq.spark.values import arrow_schema

    from .helpers import meta_fields

    value = {
        V.NONE: [StructField("value", BinaryType())],
        V.STRING: [StructField("value", StringType())],
        V.INT32: [StructField("value", IntegerType())],
        V.BOOL: [StructField("value", BooleanType())],
        V.DOUBLE: [StructField("value", DoubleType())],
        V.AVRO: [StructField("a", IntegerType()), StructField("b", StringType())],
        V.JSON: [StructField("a", IntegerType()), StructField("b", StringType())],
    }[schema.type]
    return arrow_schema(StructType(value + meta_fields())), [f.name for f in value]


# --- random entries ---------------------------------------------------------------------------

keys = st.one_of(st.none(), st.text(max_size=6))
# lists, not dicts: a producer may repeat a property key (the row path keeps it as a dict does)
props = st.lists(
    st.tuples(st.sampled_from(["a", "b", ""]) | st.text(max_size=3), st.text(max_size=5)), max_size=4
)


def payloads(kind: int):
    if kind == V.AVRO:
        import io

        import avro.io

        writer = avro.io.DatumWriter(TopicSchema(V.AVRO, AVRO_DEF).avro())

        def enc(a, b):
            out = io.BytesIO()
            writer.write({"a": a, "b": b}, avro.io.BinaryEncoder(out))
            return out.getvalue()

        good = st.builds(enc, st.integers(-(2**31), 2**31 - 1), st.one_of(st.none(), st.text(max_size=5)))
        return st.one_of(good, st.binary(max_size=3))
    if kind == V.JSON:
        good = st.builds(
            lambda a, b: json.dumps({"a": a, "b": b}).encode(), st.integers(-100, 100), st.text(max_size=4)
        )
        return st.one_of(good, st.just(b"[1]"), st.binary(max_size=3))
    if kind == V.STRING:
        return st.one_of(st.text(max_size=8).map(str.encode), st.binary(max_size=6))
    if kind in (V.INT32, V.BOOL, V.DOUBLE):
        return st.one_of(st.binary(min_size=0, max_size=9), st.binary(min_size=4, max_size=4))
    return st.binary(max_size=12)


def message(kind):
    return st.tuples(keys, payloads(kind), st.one_of(st.just(0), st.integers(1, 2**41)), props)


def entry(kind):
    single = st.tuples(st.just("single"), message(kind), st.sampled_from(CODECS))
    batch = st.tuples(
        st.just("batch"),
        st.lists(st.tuples(message(kind), st.booleans()), max_size=5),
        st.sampled_from(CODECS),
    )
    other = st.tuples(st.sampled_from(["marker", "encrypted"]), message(kind), st.just(pb.NONE))
    return st.one_of(single, single, batch, batch, other)


def build(spec, publish_time: int) -> bytes:
    shape, body, codec = spec
    md = pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=publish_time)
    if shape == "batch":
        raw = bytearray()
        for (key, value, et, kv), dropped in body:
            smm = pb.SingleMessageMetadata(payload_size=0 if dropped else len(value))
            if key is not None:
                smm.partition_key = key
            if et:
                smm.event_time = et
            for k, v in kv:
                smm.properties.add(key=k, value=v)
            if dropped:
                smm.compacted_out = True
            m = smm.SerializeToString()
            raw += struct.pack(">I", len(m)) + m + (b"" if dropped else value)
        md.num_messages_in_batch = len(body)
        payload = bytes(raw)
    else:
        key, payload, et, kv = body
        if key is not None:
            md.partition_key = key
        if et:
            md.event_time = et
        for k, v in kv:
            md.properties.add(key=k, value=v)
        if shape == "marker":
            md.marker_type = 1
        if shape == "encrypted":
            md.encryption_keys.add(key="k1", value=b"secret")
    if codec != pb.NONE:
        md.compression = codec
        md.uncompressed_size = len(payload)
        payload = compress(codec, payload)
    return build_entry(md, payload)


def both_paths(entries, schema: TopicSchema, partition: int, ledger: int = 7, first_entry: int = 3):
    """(row batch, columnar batch with C, columnar batch with numpy) of ``entries``."""
    pa_schema, names = arrow_schema_for(schema)
    topic = "persistent://public/default/t"
    decoder = ValueDecoder(schema, names)
    rows = [
        (m, False)
        for i, e in enumerate(entries)
        for m in entry_messages(ledger, first_entry + i, e, partition)
    ]
    expected = to_record_batch(rows, topic, decoder, pa_schema)
    lens = np.array([len(e) for e in entries], np.int64)
    offs = (np.cumsum(lens) - lens).astype(np.int64)
    buf = np.frombuffer(b"".join(entries), np.uint8)
    eids = np.arange(first_entry, first_entry + len(entries))
    got = []
    for flag in ("1", "0"):
        with native(flag):
            cols = parse_entries(buf, offs, lens, ledger, eids)
            got.append(record_batch(cols, topic, partition, decoder, pa_schema))
    return expected, got


SCHEMAS = [
    TopicSchema(),
    TopicSchema(V.STRING),
    TopicSchema(V.INT32),
    TopicSchema(V.BOOL),
    TopicSchema(V.DOUBLE),
    TopicSchema(V.AVRO, AVRO_DEF),
    TopicSchema(V.JSON, AVRO_DEF),
]


@pytest.mark.parametrize("schema", SCHEMAS, ids=lambda s: str(s.type))
def test_columns_equal_rows_over_random_entries(schema):
    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
    @given(
        st.lists(entry(schema.type), max_size=8),
        st.integers(-1, 3),
        st.integers(0, 2**41),
    )
    def check(specs, partition, publish):
        entries = [build(s, publish + i) for i, s in enumerate(specs)]
        expected, got = both_paths(entries, schema, partition)
        for batch in got:
            assert batch.schema == expected.schema
            assert batch.to_pylist() == expected.to_pylist()
            assert batch.equals(expected)

    check()


def test_a_big_ledger_id_and_batch_ids_serialize_as_the_client_does():
    entries = [build(("batch", [(("k", b"v", 0, {}), False)] * 200, pb.NONE), 5)]
    expected, got = both_paths(entries, TopicSchema(), 2, ledger=2**40 + 5, first_entry=300_000)
    assert got[0].equals(expected) and got[1].equals(expected)
    assert expected.num_rows == 200


def test_bounds_select_what_plan_bounded_selects():
    from compactmq.spark import plan as P

    entries = [build(("batch", [(("k", b"v", 0, {}), False)] * 4, pb.NONE), 100 + i) for i in range(5)]
    lens = np.array([len(e) for e in entries], np.int64)
    offs = (np.cumsum(lens) - lens).astype(np.int64)
    cols = parse_entries(np.frombuffer(b"".join(entries), np.uint8), offs, lens, 9, np.arange(5))
    msgs = [m for i, e in enumerate(entries) for m in entry_messages(9, i, e)]
    for start, end, t0, t1 in [
        ((9, 1, 2), (9, 3, 1), None, None),
        (P.MIN_ID, P.MAX_ID, 101, 103),
        ((9, 0, -1), (9, 4, -1), 102, None),
        ((8, 9, 9), (9, 2, -1), None, 101),
    ]:
        split = P.Split("t", -1, "live", start_id=start, end_id=end, start_time=t0, end_time=t1)
        want = [m.message_id for m in P.bounded(msgs, split)]
        kept = cols.take(cols.within(start, end, t0, t1))
        assert list(zip(kept.ledger_id.tolist(), kept.entry_id.tolist(), kept.batch_index.tolist())) == want


def test_repeated_fields_reads_every_occurrence_in_wire_order():
    md = pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=5)
    for i in range(3):
        md.properties.add(key=f"k{i}", value=f"v{i}")
    raw = md.SerializeToString()
    buf = np.frombuffer(raw * 2, np.uint8)
    rows, offs, lens = repeated_fields(
        buf, np.array([0, len(raw)]), np.array([len(raw), 2 * len(raw)]), [4, 4]
    )
    assert rows.tolist() == [0, 0, 0, 1, 1, 1]
    kv = pb.KeyValue()
    kv.ParseFromString(bytes(buf[offs[4] : offs[4] + lens[4]]))
    assert (kv.key, kv.value) == ("k1", "v1")


def test_a_truncated_batch_is_refused_as_the_row_path_refuses_it():
    from compactmq.errors import CompactMQError

    md = pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=5, num_messages_in_batch=3)
    smm = pb.SingleMessageMetadata(payload_size=1).SerializeToString()
    entry = build_entry(md, struct.pack(">I", len(smm)) + smm + b"x")
    with pytest.raises(CompactMQError):
        entry_messages(1, 0, entry)
    for flag in ("1", "0"):
        with native(flag), pytest.raises(CompactMQError):
            parse_entries(np.frombuffer(entry, np.uint8), [0], [len(entry)], 1, [0])


def test_keys_and_properties_that_are_not_utf8_get_replacement_characters():
    """The row path fails the task on such a key (protobuf hands it over as bytes, Arrow refuses
    them as a string); the columnar scan decodes it as a string value is decoded."""
    import pyarrow as pa

    from compactmq.protocol.entry_format import build_entry

    md = pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=5)
    kv = pb.KeyValue(key="p", value="v").SerializeToString().replace(b"\x12\x01v", b"\x12\x02\xc3(")
    raw_md = md.SerializeToString() + b"\x32\x02\xff\xfe" + b"\x22" + bytes([len(kv)]) + kv
    entry = build_entry(md, b"value")
    (size,) = struct.unpack_from(">I", entry, 6)
    body = struct.pack(">I", len(raw_md)) + raw_md + entry[10 + size :]
    import crc32c

    entry = entry[:2] + struct.pack(">I", crc32c.crc32c(body)) + body
    pa_schema, names = arrow_schema_for(TopicSchema(V.STRING))
    for flag in ("1", "0"):
        with native(flag):
            cols = parse_entries(np.frombuffer(entry, np.uint8), [0], [len(entry)], 1, [0])
            batch = record_batch(cols, "t", -1, ValueDecoder(TopicSchema(V.STRING), names), pa_schema)
    row = batch.to_pylist()[0]
    assert row["__key"] == "\ufffd\ufffd" and row["value"] == "value"
    assert row["__messageProperties"] == [("p", "\ufffd(")]
    with pytest.raises((pa.ArrowInvalid, UnicodeDecodeError)):
        to_record_batch(
            [(m, False) for m in entry_messages(1, 0, entry)],
            "t",
            ValueDecoder(TopicSchema(V.STRING), names),
            pa_schema,
        )


@pytest.mark.parametrize("schema", [TopicSchema(), TopicSchema(V.AVRO, AVRO_DEF)], ids=["bytes", "avro"])
def test_a_chosen_subset_of_columns_equals_those_columns_of_the_full_batch(schema):
    """``spark.read.schema(...)`` naming some columns: both paths build just those, in the
    order given, equal to the full batch's; without ``__messageProperties`` the columnar parse
    skips the properties (``properties=False``) and nothing else changes."""
    import pyarrow as pa

    full_schema, names = arrow_schema_for(schema)
    topic = "persistent://public/default/t"

    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
    @given(
        st.lists(entry(schema.type), max_size=6),
        st.lists(st.sampled_from(full_schema.names), min_size=1, unique=True),
    )
    def check(specs, chosen):
        entries = [build(s, 1_700_000_000_000 + i) for i, s in enumerate(specs)]
        expected, _ = both_paths(entries, schema, 2)
        sub = pa.schema([full_schema.field(n) for n in chosen])
        decoder = ValueDecoder(schema, [n for n in chosen if n in names])
        rows = [(m, False) for i, e in enumerate(entries) for m in entry_messages(7, 3 + i, e, 2)]
        lens = np.array([len(e) for e in entries], np.int64)
        offs = (np.cumsum(lens) - lens).astype(np.int64)
        buf = np.frombuffer(b"".join(entries), np.uint8)
        props = "__messageProperties" in chosen
        cols = parse_entries(buf, offs, lens, 7, np.arange(3, 3 + len(entries)), properties=props)
        want = expected.select(chosen)
        for got in (to_record_batch(rows, topic, decoder, sub), record_batch(cols, topic, 2, decoder, sub)):
            assert got.schema == sub
            assert got.equals(want)

    check()


def test_a_schema_that_names_an_unknown_column_or_another_type_is_refused():
    from pyspark.sql.types import BinaryType, StringType, StructField, StructType

    from compactmq.errors import InvalidConfiguration
    from compactmq.spark.values import check_columns

    check_columns(
        StructType([StructField("__key", StringType()), StructField("value", BinaryType())]), TopicSchema()
    )
    with pytest.raises(InvalidConfiguration, match="'nope' is not a column"):
        check_columns(StructType([StructField("nope", StringType())]), TopicSchema())
    with pytest.raises(InvalidConfiguration, match="'value' has type binary"):
        check_columns(StructType([StructField("value", StringType())]), TopicSchema())
    # an Avro topic's record fields, with their types
    check_columns(StructType([StructField("b", StringType())]), TopicSchema(V.AVRO, AVRO_DEF))
