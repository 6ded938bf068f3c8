"""Message columns (``entry_columns.MessageColumns``) to Arrow record batches, buffer by buffer.

Every column is built from flat numpy arrays wrapped with ``pyarrow.Array.from_buffers``: a
binary or string column is an int32 offsets buffer and one data buffer gathered from the byte
ranges (``entry_scan.gather_ranges``, the C copy loop when built), a timestamp column is the
int64 microseconds, ``__messageProperties`` a map over the key and value string columns, and
``__messageId`` the ``MessageIdData`` protobuf bytes ``pulsar.MessageId.serialize()`` writes,
encoded once per entry for what its messages share (ledger, entry, partition, batch size) and per
message for the batch index only, vectorised (a varint is at most 10 bytes: one step per byte).

Every string column is checked as UTF-8 (one vectorised pass); a batch holding bytes that are not
is decoded with replacement characters -- as the row path decodes a string value, and where it
would fail the task on a key or property (protobuf hands it such a field as bytes). The value
columns follow ``values.ValueDecoder``: bytes as they are, strings from the same bytes,
primitives read big-endian from values of exactly their width (null otherwise), and Avro / JSON
records decoded by the ``ValueDecoder`` itself from the value column (a library call
per record: the metadata columns cost nothing per row, the schema decoding remains).
The batches equal ``values.to_record_batch`` of the same messages (``tests/spark/test_columns.py``).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from ..compaction import entry_scan as es
from .entry_columns import MessageColumns
from .values import _PRIMITIVE_STRUCT, STRING, ValueDecoder

MAX_BINARY = (1 << 31) - 1  # int32 offsets of Arrow's binary/string


def _validity(valid: np.ndarray):
    import pyarrow as pa

    if valid.all():
        return None, 0
    return pa.py_buffer(np.packbits(valid, bitorder="little")), int(len(valid) - valid.sum())


def _offsets(lengths: np.ndarray) -> np.ndarray:
    out = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=out[1:])
    if out[-1] > MAX_BINARY:
        raise ValueError("more than 2 GiB of one column in one batch")
    return out.astype(np.int32)


def binary_array(buf: np.ndarray, off: np.ndarray, ln: np.ndarray, typ):
    """A binary/string array of ``buf[off[i] : off[i] + ln[i]]`` (null where ``ln[i] < 0``)."""
    import pyarrow as pa

    valid = ln >= 0
    lens = np.where(valid, ln, 0)
    data = es.gather_ranges(buf, off, lens)
    validity, nulls = _validity(valid)
    buffers = [validity, pa.py_buffer(_offsets(lens)), pa.py_buffer(data)]
    arr = pa.Array.from_buffers(typ, len(ln), buffers, null_count=nulls)
    if pa.types.is_string(typ):
        try:
            arr.validate(full=True)  # one vectorised UTF-8 check
        except pa.ArrowInvalid:  # a producer's bytes that are not UTF-8: replacement characters
            raw = pa.Array.from_buffers(pa.binary(), len(ln), buffers, null_count=nulls).to_pylist()
            arr = pa.array([None if b is None else b.decode("utf-8", "replace") for b in raw], typ)
    return arr


def _repeat_string(text: str, n: int, typ):
    import pyarrow as pa

    raw = text.encode()
    data = np.frombuffer(raw * n, np.uint8) if n and raw else np.zeros(0, np.uint8)
    offsets = (np.arange(n + 1, dtype=np.int64) * len(raw)).astype(np.int32)
    return pa.Array.from_buffers(typ, n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _timestamps(ms: np.ndarray, valid: np.ndarray | None, typ):
    import pyarrow as pa

    micros = np.ascontiguousarray(ms, np.int64) * 1000
    validity, nulls = _validity(valid) if valid is not None else (None, 0)
    return pa.Array.from_buffers(typ, len(ms), [validity, pa.py_buffer(micros)], null_count=nulls)


# --- __messageId ------------------------------------------------------------------------------


def _varints(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(n x w bytes, lengths) of the protobuf varints of non-negative ``values`` (w: the longest)."""
    x = np.asarray(values, np.int64).astype(np.uint64)
    out = np.zeros((len(x), 10), np.uint8)
    lens = np.ones(len(x), np.int64)
    width = 1
    for k in range(10):
        out[:, k] = (x & np.uint64(0x7F)).astype(np.uint8)
        x = x >> np.uint64(7)
        more = x != 0
        if not more.any():
            break
        out[more, k] |= 0x80
        lens += more
        width = k + 2
    return out[:, :width], lens


def _serialize(parts: list, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(bytes end to end, length per row) of ``n`` rows of protobuf varint fields ``parts`` =
    [(tag byte, values, present)]. Every row is laid out at full width (tag and longest varint
    of each field) beside a mask of the bytes it really has; the mask, read row by row, picks
    the serialized rows end to end."""
    if not n:
        return np.zeros(0, np.uint8), np.zeros(0, np.int64)
    blocks, masks = [], []
    for tag, values, present in parts:
        raw, lens = _varints(values)
        blocks += [np.full((n, 1), tag, np.uint8), raw]
        masks += [present[:, None], present[:, None] & (np.arange(raw.shape[1]) < lens[:, None])]
    laid, mask = np.hstack(blocks), np.hstack(masks)
    return np.ascontiguousarray(laid[mask]), mask.sum(axis=1).astype(np.int64)


def _starts(lens: np.ndarray) -> np.ndarray:
    out = np.zeros(len(lens), np.int64)
    np.cumsum(lens[:-1], out=out[1:])
    return out


def message_ids(cols: MessageColumns, partition: int, typ):
    """``__messageId``: fields 1 ledgerId, 2 entryId, 3 partition (when >= 0), 4 batch_index
    (when >= 0) and 6 batch_size (when in a batch of known size), in field order.

    All but the batch index are the same for every message of an entry, so they are serialized
    once per run of messages of one entry (a prefix: fields 1-3; a suffix: field 6), and only the
    batch index per message; the three pieces are then copied into place (``copy_ranges``)."""
    import pyarrow as pa

    n = len(cols)
    in_batch = cols.batch_index >= 0
    new_run = np.ones(n, bool)
    if n > 1:
        new_run[1:] = (
            (cols.ledger_id[1:] != cols.ledger_id[:-1])
            | (cols.entry_id[1:] != cols.entry_id[:-1])
            | (cols.batch_size[1:] != cols.batch_size[:-1])
            | (in_batch[1:] != in_batch[:-1])
        )
    first = np.flatnonzero(new_run)
    run = np.cumsum(new_run) - 1
    m = len(first)
    pre, pre_len = _serialize(
        [
            (0x08, cols.ledger_id[first], np.ones(m, bool)),
            (0x10, cols.entry_id[first], np.ones(m, bool)),
            (0x18, np.full(m, max(partition, 0), np.int64), np.full(m, partition >= 0)),
        ],
        m,
    )
    sized = in_batch[first] & (cols.batch_size[first] > 0)
    suf, suf_len = _serialize([(0x30, cols.batch_size[first], sized)], m)
    mid, mid_len = _serialize([(0x20, np.maximum(cols.batch_index, 0), in_batch)], n)
    p_len, s_len = pre_len[run], suf_len[run]
    lens = p_len + mid_len + s_len
    offsets = _offsets(lens)
    data = np.empty(int(lens.sum()), np.uint8)
    at = offsets[:-1].astype(np.int64)
    es.copy_ranges(data, at, pre, _starts(pre_len)[run], p_len)
    es.copy_ranges(data, at + p_len, mid, _starts(mid_len), mid_len)
    es.copy_ranges(data, at + p_len + mid_len, suf, _starts(suf_len)[run], s_len)
    return pa.Array.from_buffers(typ, n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


# --- properties and values --------------------------------------------------------------------


def properties(cols: MessageColumns, typ):
    """``__messageProperties``: a map per message over its key/value ranges."""
    import pyarrow as pa

    count = cols.prop_count
    total = int(count.sum())
    first = np.repeat(cols.prop_start - np.concatenate([[0], np.cumsum(count)[:-1]]), count)
    kv = first + np.arange(total, dtype=np.int64)
    keys = binary_array(cols.buf, cols.kv_key_off[kv], cols.kv_key_len[kv], pa.string())
    items = binary_array(cols.buf, cols.kv_value_off[kv], cols.kv_value_len[kv], pa.string())
    return pa.MapArray.from_arrays(pa.array(_offsets(count)), keys, items, type=typ)


def value_arrays(cols: MessageColumns, decoder: ValueDecoder, value_fields: list) -> list:
    """The value column(s), of the Arrow fields ``value_fields``."""
    import pyarrow as pa

    t = decoder.schema.type
    if decoder.schema.is_record:
        values = binary_array(cols.buf, cols.value_off, cols.value_len, pa.binary()).to_pylist()
        return [pa.array(col, type=f.type) for col, f in zip(decoder.columns(values), value_fields)]
    f = value_fields[0]
    if t == STRING:  # invalid UTF-8 decoded with replacement characters, as the row path does
        return [binary_array(cols.buf, cols.value_off, cols.value_len, f.type)]
    if t in _PRIMITIVE_STRUCT:
        return [_primitive(cols, _PRIMITIVE_STRUCT[t], f.type)]
    return [binary_array(cols.buf, cols.value_off, cols.value_len, f.type)]


def _primitive(cols: MessageColumns, fmt: str, typ):
    import pyarrow as pa

    width = np.dtype(fmt.replace("?", "u1")).itemsize
    valid = cols.value_len == width
    raw = es.gather_ranges(cols.buf, cols.value_off[valid], np.full(int(valid.sum()), width, np.int64))
    if fmt == ">?":
        got = raw != 0
    else:
        got = raw.view(fmt).astype(fmt[1:])
    values = np.zeros(len(cols), got.dtype)
    values[valid] = got
    return pa.array(values, type=typ, mask=~valid)


# --- record batches ---------------------------------------------------------------------------


_META = {
    "__key": lambda cols, topic, partition, typ: binary_array(cols.buf, cols.key_off, cols.key_len, typ),
    "__topic": lambda cols, topic, partition, typ: _repeat_string(topic, len(cols), typ),
    "__messageId": lambda cols, topic, partition, typ: message_ids(cols, partition, typ),
    "__publishTime": lambda cols, topic, partition, typ: _timestamps(cols.publish_time, None, typ),
    "__eventTime": lambda cols, topic, partition, typ: _timestamps(
        cols.event_time, cols.event_time != 0, typ
    ),
    "__messageProperties": lambda cols, topic, partition, typ: properties(cols, typ),
}


def record_batch(cols: MessageColumns, topic: str, partition: int, decoder: ValueDecoder, pa_schema):
    """The Arrow batch of ``cols`` for ``pa_schema``: the value column(s) and the metadata
    columns it names, in its order (only those are built)."""
    import pyarrow as pa

    value_fields = [f for f in pa_schema if f.name not in _META]
    values = iter(value_arrays(cols, decoder, value_fields) if value_fields else [])
    arrays = [
        _META[f.name](cols, topic, partition, f.type) if f.name in _META else next(values) for f in pa_schema
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=pa_schema)


def key_mask(cols: MessageColumns, keys: frozenset) -> np.ndarray:
    """Mask of the messages whose key is one of ``keys``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    key_array = binary_array(cols.buf, cols.key_off, cols.key_len, pa.binary())
    wanted = pa.array(sorted(k.encode() for k in keys), pa.binary())
    return pc.is_in(key_array, value_set=wanted).fill_null(False).to_numpy(zero_copy_only=False)


def record_batches(
    chunks, topic: str, partition: int, decoder: ValueDecoder, pa_schema, max_rows: int, keys=None
) -> Iterator:
    """Record batches of at most ``max_rows`` rows from an iterable of ``MessageColumns``
    (with ``keys``, of the messages with one of those keys only)."""
    for cols in chunks:
        if keys is not None:
            cols = cols.take(key_mask(cols, keys))
        for a in range(0, len(cols), max_rows):
            piece = cols if len(cols) <= max_rows else cols.take(slice(a, a + max_rows))
            if len(piece):
                yield record_batch(piece, topic, partition, decoder, pa_schema)
