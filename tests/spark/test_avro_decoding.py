"""``values.ValueDecoder`` decodes Avro values with fastavro when it is installed: for valid datums
of a schema using every Avro type Spark columns take, and for bytes that are not such datums,
it returns what the ``avro`` package's reader returns (``None`` where that one fails)."""

from __future__ import annotations

import datetime as dt
import io
import json

import avro.io
from hypothesis import given, settings, strategies as st

from compactmq.spark import values as V
from compactmq.spark.values import TopicSchema, ValueDecoder

DEFINITION = json.dumps(
    {
        "type": "record",
        "name": "All",
        "namespace": "t.ns",
        "fields": [
            {"name": "i", "type": "int"},
            {"name": "l", "type": "long"},
            {"name": "s", "type": "string"},
            {"name": "o", "type": ["null", "string"]},
            {"name": "d", "type": "double"},
            {"name": "f", "type": "float"},
            {"name": "b", "type": "boolean"},
            {"name": "y", "type": "bytes"},
            {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B", "C"]}},
            {"name": "a", "type": {"type": "array", "items": "int"}},
            {"name": "m", "type": {"type": "map", "values": "long"}},
            {"name": "x", "type": {"type": "fixed", "name": "F", "size": 3}},
            {
                "name": "r",
                "type": {"type": "record", "name": "In", "fields": [{"name": "z", "type": "string"}]},
            },
            {"name": "t", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        ],
    }
)
SCHEMA = TopicSchema(V.AVRO, DEFINITION)
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
FIELDS = [f["name"] for f in json.loads(DEFINITION)["fields"]]

i32 = st.integers(-(2**31), 2**31 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
datum = st.fixed_dictionaries(
    {
        "i": i32,
        "l": i64,
        "s": st.text(max_size=5),
        "o": st.none() | st.text(max_size=3),
        "d": st.floats(allow_nan=False),
        "f": st.floats(width=32, allow_nan=False),
        "b": st.booleans(),
        "y": st.binary(max_size=4),
        "e": st.sampled_from(["A", "B", "C"]),
        "a": st.lists(i32, max_size=3),
        "m": st.dictionaries(st.text(max_size=3), i64, max_size=3),
        "x": st.binary(min_size=3, max_size=3),
        "r": st.fixed_dictionaries({"z": st.text(max_size=3)}),
        "t": st.integers(-(2**40), 2**40).map(lambda ms: EPOCH + dt.timedelta(milliseconds=ms)),
    }
)


def encode(d: dict) -> bytes:
    out = io.BytesIO()
    avro.io.DatumWriter(SCHEMA.avro()).write(d, avro.io.BinaryEncoder(out))
    return out.getvalue()


def slow_decoder() -> ValueDecoder:
    decoder = ValueDecoder(SCHEMA, FIELDS)
    decoder._fast = None  # the avro package's reader, as without fastavro
    decoder._reader = avro.io.DatumReader(SCHEMA.avro())
    return decoder


@settings(max_examples=150, deadline=None)
@given(st.lists(datum.map(encode) | st.binary(max_size=40), min_size=1, max_size=5))
def test_fastavro_decodes_what_the_avro_package_decodes(values):
    fast = ValueDecoder(SCHEMA, FIELDS)
    assert fast._fast is not None
    assert fast.columns(values) == slow_decoder().columns(values)


def test_a_definition_fastavro_refuses_falls_back_to_the_avro_package():
    from compactmq.spark.values import _fastavro_schema

    assert _fastavro_schema("{not json") is None
