"""Messages as the Spark source sees them: stored entries turned into one record per message.

An entry holds one message or a batch (``protocol.batch``); a message is addressed
``(ledger_id, entry_id, batch_index)``. ``entry_messages`` decodes an entry the way the official
client does before handing messages to an application: a batch is decompressed and split, the
``compacted_out`` placeholders a compaction leaves in a batch are skipped (the client never sees
them: the broker clears their bits in ``ack_set``), and broker-internal marker entries are skipped.

``__messageId`` is the id serialized exactly as ``pulsar.MessageId.serialize()`` does (a
``MessageIdData`` protobuf: ledger, entry, then partition and batch index only when set), so
``pulsar.MessageId.deserialize`` accepts it and a reader can ``seek`` to it.
"""

from __future__ import annotations

from typing import NamedTuple

from ..protocol import pulsar_pb2 as pb
from ..protocol.batch import decode_batch, is_batch
from ..protocol.entry_format import parse_entry


class Message(NamedTuple):
    """One message. ``key`` is None for a keyless message; ``value`` is the payload bytes (empty for
    a tombstone); ``batch_index`` is -1 for a message that is not in a batch."""

    key: str | None
    value: bytes
    ledger_id: int
    entry_id: int
    batch_index: int
    batch_size: int
    publish_time: int  # ms since the epoch
    event_time: int  # ms, 0 when the producer set none
    properties: dict
    partition: int = -1

    @property
    def message_id(self) -> tuple:
        return (self.ledger_id, self.entry_id, self.batch_index)

    @property
    def is_tombstone(self) -> bool:
        return self.key is not None and len(self.value) == 0


def entry_messages(ledger_id: int, entry_id: int, data: bytes, partition: int = -1) -> list[Message]:
    """The messages of one stored entry, as a consumer would receive them.

    Raises:
        MalformedEntry / ChecksumError: the entry does not decode.
    """
    meta, payload = parse_entry(data, verify_checksum=False)
    if meta.HasField("marker_type"):
        return []
    publish = int(meta.publish_time)
    if meta.encryption_keys:
        # an encrypted entry cannot be opened here: it is one opaque message, as compaction treats it
        key = meta.partition_key if meta.HasField("partition_key") else None
        props = {kv.key: kv.value for kv in meta.properties}
        return [
            Message(key, payload, ledger_id, entry_id, -1, 0, publish, int(meta.event_time), props, partition)
        ]
    items = decode_batch(meta, payload)
    batched = is_batch(meta)
    size = len(items) if batched else 0
    out = []
    for index, (single, value) in enumerate(items):
        if single.compacted_out:
            continue
        key = single.partition_key if single.HasField("partition_key") else None
        props = {kv.key: kv.value for kv in single.properties} if single.properties else {}
        out.append(
            Message(
                key,
                value,
                ledger_id,
                entry_id,
                index if batched else -1,
                size,
                publish,
                int(single.event_time),
                props,
                partition,
            )
        )
    return out


def serialize_message_id(
    ledger_id: int, entry_id: int, batch_index: int = -1, partition: int = -1, batch_size: int = 0
) -> bytes:
    """The bytes ``pulsar.MessageId.serialize()`` produces for this id."""
    data = pb.MessageIdData(ledgerId=ledger_id, entryId=entry_id)
    if partition >= 0:
        data.partition = partition
    if batch_index >= 0:
        data.batch_index = batch_index
        if batch_size > 0:
            data.batch_size = batch_size
    return data.SerializeToString()


def deserialize_message_id(raw: bytes) -> tuple[int, int, int, int]:
    """``(ledger, entry, batch_index, partition)`` of serialized id bytes; ValueError when invalid."""
    data = pb.MessageIdData()
    try:
        data.ParseFromString(raw)
    except Exception as e:  # protobuf raises DecodeError, a plain Exception subclass  # noqa: BLE001
        raise ValueError(f"not a serialized message id: {e}") from None
    if not data.IsInitialized():
        raise ValueError("not a serialized message id: ledgerId/entryId missing")
    return int(data.ledgerId), int(data.entryId), int(data.batch_index), int(data.partition)
