"""From a topic's registered schema to DataFrame columns, and messages to Arrow record batches.

Columns follow pulsar-spark: first the value, then the metadata columns ``__key`` (string: Pulsar
keys are strings), ``__topic``, ``__messageId`` (binary: the id as the client serializes it),
``__publishTime``, ``__eventTime`` (timestamps; null when the producer set no event time) and
``__messageProperties`` (map of strings).

The value is one ``value`` column for the bytes schema (or no schema), string and the primitive
schemas (decoded as Pulsar's schemas encode them: big-endian numbers, 1-byte booleans); an Avro or
JSON schema (Pulsar describes both with an Avro record definition) becomes one column per field of
the record, decoded with the topic's latest schema. A tombstone or a message that does not decode
leaves the fields null. Other schema types come back as bytes in ``value``.

``TopicSchema`` is a small picklable value (what executors get); ``to_record_batch`` builds the
Arrow batch with the exact Arrow schema PySpark expects for the Spark schema (its own
``to_arrow_schema``), so the rows leave the Python worker without a per-row conversion by Spark.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

META_COLUMNS = ("__key", "__topic", "__messageId", "__publishTime", "__eventTime", "__messageProperties")

# pulsar Schema.Type numbers (protocol/pulsar.proto)
NONE, STRING, JSON, PROTOBUF, AVRO = 0, 1, 2, 3, 4
BOOL, INT8, INT16, INT32, INT64, FLOAT, DOUBLE = 5, 6, 7, 8, 9, 10, 11
_TYPE_NAMES = {
    "NONE": NONE,
    "BYTES": NONE,
    "STRING": STRING,
    "JSON": JSON,
    "PROTOBUF": PROTOBUF,
    "AVRO": AVRO,
    "BOOLEAN": BOOL,
    "INT8": INT8,
    "INT16": INT16,
    "INT32": INT32,
    "INT64": INT64,
    "FLOAT": FLOAT,
    "DOUBLE": DOUBLE,
}

_PRIMITIVE_DDL = {
    STRING: "string",
    BOOL: "boolean",
    INT8: "tinyint",
    INT16: "smallint",
    INT32: "int",
    INT64: "bigint",
    FLOAT: "float",
    DOUBLE: "double",
}
_PRIMITIVE_STRUCT = {BOOL: ">?", INT8: ">b", INT16: ">h", INT32: ">i", INT64: ">q", FLOAT: ">f", DOUBLE: ">d"}


@dataclass(frozen=True)
class TopicSchema:
    """A topic's value schema: Pulsar type number and definition (Avro JSON for Avro/JSON)."""

    type: int = NONE
    definition: str = ""

    @classmethod
    def from_record(cls, record: dict | None) -> TopicSchema:
        """From the broker's stored record (``broker.schema_registry``: ``{"type": int, "data": b64}``) or a
        Pulsar REST ``GetSchemaResponse`` (``{"type": "AVRO", "data": "..."}``)."""
        import base64

        if not record:
            return cls()
        t = record.get("type", NONE)
        if isinstance(t, str):
            t = _TYPE_NAMES.get(t.upper(), PROTOBUF)
            return cls(int(t), record.get("data") or "")
        data = base64.b64decode(record.get("data") or "").decode("utf-8", "replace")
        return cls(int(t), data)

    @property
    def is_record(self) -> bool:
        return self.type in (AVRO, JSON) and bool(self.definition)

    def avro(self):
        import avro.schema

        return avro.schema.parse(self.definition)


# --- Spark types ------------------------------------------------------------------------------


def _avro_ddl(schema) -> tuple[str, bool]:
    """(Spark DDL type, nullable) of an Avro schema node."""
    t = schema.type
    if t == "union":
        branches = [s for s in schema.schemas if s.type != "null"]
        if len(branches) == 1:
            return _avro_ddl(branches[0])[0], True
        return "binary", True  # a real union has no Spark counterpart: keep the encoded bytes
    logical = getattr(schema, "logical_type", None) or schema.props.get("logicalType")
    if logical in ("timestamp-millis", "timestamp-micros"):
        return "timestamp", False
    if logical == "date":
        return "date", False
    simple = {
        "boolean": "boolean",
        "int": "int",
        "long": "bigint",
        "float": "float",
        "double": "double",
        "bytes": "binary",
        "string": "string",
        "enum": "string",
        "fixed": "binary",
        "null": "string",
    }
    if t in simple:
        return simple[t], t == "null"
    if t == "array":
        return f"array<{_avro_ddl(schema.items)[0]}>", False
    if t == "map":
        return f"map<string,{_avro_ddl(schema.values)[0]}>", False
    if t in ("record", "error"):
        inner = ",".join(f"`{f.name}`:{_avro_ddl(f.type)[0]}" for f in schema.fields)
        return f"struct<{inner}>", False
    return "binary", True


def schema_fields(schema: TopicSchema) -> list[tuple[str, str]]:
    """``(column name, DDL type)`` of every column of a read of a topic with this value schema."""
    if schema.is_record:
        parts = [(f.name, _avro_ddl(f.type)[0]) for f in schema.avro().fields]
    elif schema.type in _PRIMITIVE_DDL:
        parts = [("value", _PRIMITIVE_DDL[schema.type])]
    else:
        parts = [("value", "binary")]
    return parts + [
        ("__key", "string"),
        ("__topic", "string"),
        ("__messageId", "binary"),
        ("__publishTime", "timestamp"),
        ("__eventTime", "timestamp"),
        ("__messageProperties", "map<string,string>"),
    ]


def spark_schema(schema: TopicSchema) -> str:
    """The schema (a DDL string: Python workers have no SparkContext to parse it) of a read of a
    topic with this value schema."""
    return ", ".join(f"`{name}` {ddl}" for name, ddl in schema_fields(schema))


def _ddl_key(ddl: str) -> str:
    return ddl.replace("`", "").replace(" ", "").lower()


def check_columns(struct_type, schema: TopicSchema) -> None:
    """A schema the user gave (``spark.read.schema(...)``) must pick columns of the topic's, each
    with its type: the read then builds only those (the Python Data Source API of Spark 4.3 tells
    a reader no pruned columns, so this is how a query asks for fewer)."""
    from ..errors import InvalidConfiguration

    known = {name: _ddl_key(ddl) for name, ddl in schema_fields(schema)}
    for f in struct_type.fields:
        if f.name not in known:
            raise InvalidConfiguration(
                f"column {f.name!r} is not a column of this topic (columns: {', '.join(known)})"
            )
        if _ddl_key(f.dataType.simpleString()) != known[f.name]:
            raise InvalidConfiguration(
                f"column {f.name!r} has type {known[f.name]} in this topic, not {f.dataType.simpleString()}"
            )


def arrow_schema(struct_type):
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(struct_type, timezone="UTC")


# --- decoding ---------------------------------------------------------------------------------


class ValueDecoder:
    """Turns payload bytes into the value column(s). Built on the executor (holds Avro readers)."""

    def __init__(self, schema: TopicSchema, field_names: list[str]):
        self.schema = schema
        self.fields = field_names
        self._reader = None
        self._fast = None
        if schema.is_record and schema.type == AVRO:
            self._fast = _fastavro_schema(schema.definition)
            if self._fast is None:
                import avro.io

                self._reader = avro.io.DatumReader(schema.avro())

    def columns(self, values: list[bytes | None]) -> list[list[Any]]:
        """One list per value column, ``None`` where a value is absent (tombstone, null, bad)."""
        t = self.schema.type
        if self.schema.is_record:
            records = [self._record(v) for v in values]
            return [[r.get(name) if r is not None else None for r in records] for name in self.fields]
        if t == STRING:
            return [[v.decode("utf-8", "replace") if v else (None if v is None else "") for v in values]]
        if t in _PRIMITIVE_STRUCT:
            fmt = struct.Struct(_PRIMITIVE_STRUCT[t])
            return [[fmt.unpack(v)[0] if v is not None and len(v) == fmt.size else None for v in values]]
        return [values]

    def _record(self, value: bytes | None) -> dict | None:
        if not value:
            return None
        try:
            if self._fast is not None:
                import io

                import fastavro

                return fastavro.schemaless_reader(io.BytesIO(value), self._fast)
            if self._reader is not None:
                import io

                import avro.io

                return _normalize(self._reader.read(avro.io.BinaryDecoder(io.BytesIO(value))))
            decoded = json.loads(value)
            return decoded if isinstance(decoded, dict) else None
        except Exception:  # a payload that does not match the schema: null fields, not a failed job  # noqa: BLE001
            return None


def _fastavro_schema(definition: str):
    """The schema parsed by fastavro (the C decoder of the Avro spec, several times faster than
    the ``avro`` package's pure Python reader and equal to it: ``tests/spark/test_columns.py``),
    or None when fastavro is not installed or does not take the definition (``avro`` reads)."""
    try:
        import fastavro
    except ImportError:
        return None
    try:
        return fastavro.parse_schema(json.loads(definition))
    except Exception:  # a definition only the avro package accepts: it decodes  # noqa: BLE001
        return None


def _normalize(value):
    if isinstance(value, dict):
        return {k: _normalize(v) for k, v in value.items()}
    return value


def to_record_batch(rows: list, topic: str, decoder: ValueDecoder, pa_schema):
    """An Arrow ``RecordBatch`` for the given Arrow schema (the value column(s) and metadata
    columns it names) from ``rows`` of ``(Message, deleted)``; a deleted key's row (``latest``
    with includeTombstones) has a null value."""
    import pyarrow as pa

    from .messages import serialize_message_id

    msgs = [m for m, _ in rows]
    meta = {
        "__key": lambda: [m.key for m in msgs],
        "__topic": lambda: [topic] * len(msgs),
        "__messageId": lambda: [
            serialize_message_id(m.ledger_id, m.entry_id, m.batch_index, m.partition, m.batch_size)
            for m in msgs
        ],
        "__publishTime": lambda: [m.publish_time * 1000 for m in msgs],
        "__eventTime": lambda: [m.event_time * 1000 if m.event_time else None for m in msgs],
        "__messageProperties": lambda: [list(m.properties.items()) for m in msgs],
    }
    value_fields = [f for f in pa_schema if f.name not in meta]
    values = iter(
        decoder.columns([None if deleted else m.value for m, deleted in rows]) if value_fields else []
    )
    arrays = []
    for f in pa_schema:
        col = meta[f.name]() if f.name in meta else next(values)
        if pa.types.is_timestamp(f.type):
            arrays.append(pa.array(col, type=pa.int64()).cast(f.type))
        else:
            arrays.append(pa.array(col, type=f.type))
    return pa.RecordBatch.from_arrays(arrays, schema=pa_schema)
