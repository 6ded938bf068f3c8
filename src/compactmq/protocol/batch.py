"""Batch payloads: several messages in one entry.

A producer with batching on sends one entry whose MessageMetadata has
``num_messages_in_batch`` set (to N >= 1) and whose payload, once decompressed, is N records::

    [size u32][SingleMessageMetadata (size bytes)][payload (payload_size bytes)] x N

Each message of the batch is addressed as (ledger, entry, batch_index) with batch_index 0..N-1.
Compaction keeps a batch's layout: a dropped message stays as a record with ``compacted_out``
set and an empty payload, so the batch indexes of the survivors do not change. The official
C++-based client delivers such records as empty messages unless the MESSAGE command's
``ack_set`` clears their bits: see :func:`delivery_ack_set`.

An entry without ``num_messages_in_batch`` is a single message; :func:`decode_batch` presents it
as a one-item list (its SingleMessageMetadata derived from the MessageMetadata) so that callers
can treat both shapes alike. Use :func:`is_batch` to tell them apart.
"""

from __future__ import annotations

import struct
from typing import Iterable, NamedTuple

from google.protobuf.message import DecodeError

from compactmq.errors import MalformedEntry
from compactmq.protocol import compression
from compactmq.protocol import pulsar_pb2 as pb
from compactmq.protocol.commands import ack_set_from_indexes

_U32 = struct.Struct(">I")

# Fields a single message carries both in MessageMetadata and in SingleMessageMetadata.
_SHARED_FIELDS = (
    "partition_key",
    "event_time",
    "partition_key_b64_encoded",
    "ordering_key",
    "sequence_id",
    "null_value",
    "null_partition_key",
)


class BatchItem(NamedTuple):
    """One message of an entry: its per-message metadata and its payload."""

    meta: pb.SingleMessageMetadata
    payload: bytes


def is_batch(metadata: pb.MessageMetadata) -> bool:
    """True when the entry's payload is a batch (the producer set ``num_messages_in_batch``)."""
    return metadata.HasField("num_messages_in_batch")


def message_count(metadata: pb.MessageMetadata) -> int:
    """Messages an entry holds: its batch's records (placeholders included), else 1."""
    return metadata.num_messages_in_batch if is_batch(metadata) else 1


def decode_batch(
    metadata: pb.MessageMetadata,
    payload: bytes,
    *,
    max_uncompressed_size: int = compression.DEFAULT_MAX_UNCOMPRESSED_SIZE,
) -> list[BatchItem]:
    """The messages of an entry, after decompressing its payload.

    Raises:
        MalformedEntry: corrupt compressed data, truncated or extra bytes, a record whose
            metadata does not decode, or a record count that differs from the metadata.
    """
    data = compression.decompress(
        metadata.compression, payload, metadata.uncompressed_size, max_size=max_uncompressed_size
    )
    if not is_batch(metadata):
        return [BatchItem(single_metadata_of(metadata, len(data)), data)]
    return decode_records(data, metadata.num_messages_in_batch)


def decode_records(data: bytes, count: int) -> list[BatchItem]:
    """Parse ``count`` uncompressed batch records; the bytes must hold exactly that many."""
    if count < 0:
        raise MalformedEntry(f"negative message count {count} in batch")
    view = memoryview(data)
    items: list[BatchItem] = []
    pos = 0
    end = len(view)
    for index in range(count):
        if end - pos < 4:
            raise MalformedEntry(f"batch truncated before record {index} of {count}")
        (size,) = _U32.unpack_from(view, pos)
        pos += 4
        if size > end - pos:
            raise MalformedEntry(f"record {index}: metadata size {size} exceeds the batch")
        meta = pb.SingleMessageMetadata()
        try:
            meta.ParseFromString(view[pos : pos + size])
        except (DecodeError, RuntimeError, ValueError) as exc:
            raise MalformedEntry(f"record {index}: undecodable metadata: {exc}") from exc
        if not meta.IsInitialized():
            raise MalformedEntry(f"record {index}: metadata lacks payload_size")
        pos += size
        payload_size = meta.payload_size
        if payload_size < 0 or payload_size > end - pos:
            raise MalformedEntry(f"record {index}: payload size {payload_size} exceeds the batch")
        items.append(BatchItem(meta, bytes(view[pos : pos + payload_size])))
        pos += payload_size
    if pos != end:
        raise MalformedEntry(f"{end - pos} bytes after the last of {count} batch records")
    return items


def encode_batch(items: Iterable[BatchItem | tuple[pb.SingleMessageMetadata, bytes]]) -> bytes:
    """Uncompressed batch records for ``items``, in order.

    Each record's ``payload_size`` is written as the length of its payload (the caller's
    metadata objects are not modified).
    """
    parts: list[bytes] = []
    for meta, payload in items:
        if not meta.HasField("payload_size") or meta.payload_size != len(payload):
            fixed = pb.SingleMessageMetadata()
            fixed.CopyFrom(meta)
            fixed.payload_size = len(payload)
            meta = fixed
        md = meta.SerializeToString()
        parts.append(_U32.pack(len(md)))
        parts.append(md)
        parts.append(bytes(payload))
    return b"".join(parts)


def encode_batch_payload(metadata: pb.MessageMetadata, items: list[BatchItem]) -> bytes:
    """Encode and compress ``items`` as the payload of a batch entry described by ``metadata``.

    Compresses with ``metadata.compression`` and sets ``num_messages_in_batch`` and
    ``uncompressed_size`` on ``metadata`` (modified in place), ready for
    :func:`compactmq.protocol.frames.build_entry`.
    """
    raw = encode_batch(items)
    metadata.num_messages_in_batch = len(items)
    if metadata.compression == compression.NONE:
        # As the C++ client does: uncompressed_size only accompanies a compressed payload.
        metadata.ClearField("uncompressed_size")
        return raw
    metadata.uncompressed_size = len(raw)
    return compression.compress(metadata.compression, raw)


def delivery_ack_set(items: list[BatchItem]) -> list[int] | None:
    """The CommandMessage ``ack_set`` that hides a batch's ``compacted_out`` records.

    pulsar-client 3.13 (C++ 4.2) does not skip ``compacted_out`` records by itself: it hands
    them to the application as empty messages. It does skip records whose bit is clear in the
    MESSAGE command's ``ack_set``, so the broker sends this with every rewritten batch.
    Returns None when no record is compacted out (send no ack_set). A batch with no survivor at
    all gives ``[0]`` (skip everything); better not to dispatch such an entry.
    """
    if not any(item.meta.compacted_out for item in items):
        return None
    live = [i for i, item in enumerate(items) if not item.meta.compacted_out]
    return ack_set_from_indexes(live, len(items))


def single_metadata_of(metadata: pb.MessageMetadata, payload_size: int) -> pb.SingleMessageMetadata:
    """The SingleMessageMetadata equivalent of a non-batched message's MessageMetadata."""
    single = pb.SingleMessageMetadata(payload_size=payload_size)
    single.properties.extend(metadata.properties)
    for name in _SHARED_FIELDS:
        if metadata.HasField(name):
            setattr(single, name, getattr(metadata, name))
    return single


def compacted_out(meta: pb.SingleMessageMetadata) -> BatchItem:
    """The placeholder compaction leaves for a dropped message: same metadata, no payload."""
    placeholder = pb.SingleMessageMetadata()
    placeholder.CopyFrom(meta)
    placeholder.compacted_out = True
    placeholder.payload_size = 0
    return BatchItem(placeholder, b"")
