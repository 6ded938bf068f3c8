"""The hot commands read and written straight on the protobuf wire format. No I/O.

Every published message costs the broker a SEND to decode, a MessageMetadata to look into, a
SEND_RECEIPT to encode, and later a MESSAGE to encode per delivery. Going through the generated
protobuf classes for these costs an object per command (and one per nested message), a parse
of every field, required-field checks and a serialisation, several microseconds each, when the
broker needs three integers out of a SEND and writes five into a receipt. This module does just
that work, on the bytes:

* :func:`decode_send` reads a CommandSend's fields into a :class:`SendCommand`;
* :func:`scan_metadata` reads the MessageMetadata fields the broker routes on (publish time,
  batch size, keys, deliver-at time) into a :class:`MetadataFields`;
* :func:`send_receipt_frame` and :func:`message_frame_header` encode a framed SEND_RECEIPT and
  the framed head of a MESSAGE (its entry is written after it as it is: no join, no copy);
* :func:`split_sends` reads a whole run of plain SENDs of one producer (framing, send fields,
  checksum and publish time of each entry) in one call, and :func:`send_receipt_frames` writes
  the run's receipts in one call: a socket read of a hundred SENDs costs the broker a handful
  of Python calls instead of a few dozen per message.

The rule that keeps this safe: **a reader only accepts the shapes it fully understands.** Any
field it does not know, a wire type that is not the declared one, a nested message it does not
check, a varint longer than ten bytes: it returns ``None`` and the caller falls back to the
protobuf classes, which then accept or reject the bytes exactly as before (same errors, same
``ServerError`` codes). Within the accepted shapes the results equal what protobuf reads (last
value wins for a repeated scalar, unknown-free, required fields present), and the encoders
produce the bytes ``SerializeToString`` produces (fields in number order); tests compare both
ways, on real client captures and on random values.

Two implementations with one behaviour: the pure-Python functions here (:data:`PYTHON`), and
their C twins in the optional extension ``compactmq.protocol._wire`` (:data:`NATIVE`, source
``_wire.c``, compiled at install time by setup.py), used when present; ``COMPACTMQ_NATIVE=0``
turns it off, and a build whose ``ABI`` differs from :data:`ABI` is ignored. The tests run every
comparison on both. In pure Python the varint work costs about what protobuf's C parser does
(the gain is the objects not made); the C twin is what makes the per-message work small.
"""

from __future__ import annotations

import os
import struct
from types import SimpleNamespace

import crc32c as _crc32c

_MASK64 = (1 << 64) - 1
_SIZES = struct.Struct(">II")
_U32 = struct.Struct(">I")
_RECEIPT = struct.Struct("<QQ")  # a run's receipt fields per message: sequence id, highest (0: none)

# BaseCommand.Type values and their field numbers (equal; see pulsar.proto)
SEND = 6
SEND_RECEIPT = 7
MESSAGE = 9

_VARINT, _LEN = 0, 2

ABI = 4  # WIRE_ABI in _wire.c


def read_varint(buf, pos: int, end: int) -> tuple[int, int]:
    """(value, next position) of the varint at ``pos``; ValueError past ``end`` or over 10
    bytes. Values are truncated to 64 bits, as protobuf does."""
    if pos >= end:
        raise ValueError("truncated varint")
    b = buf[pos]
    if b < 0x80:
        return b, pos + 1
    result = b & 0x7F
    shift = 7
    pos += 1
    while True:
        if pos >= end or shift > 63:
            raise ValueError("truncated or overlong varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result & _MASK64, pos
        shift += 7


def encode_varint(value: int) -> bytes:
    """The varint of ``value``; a negative one as its 64-bit two's complement (10 bytes), which
    is how protobuf writes negative int32/int64 fields."""
    if 0 <= value < 0x80:
        return _SMALL[value]
    value &= _MASK64
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_SMALL = [bytes((i,)) for i in range(0x80)]


# ---------------------------------------------------------------------------------------------
# SEND
# ---------------------------------------------------------------------------------------------


class SendCommand:
    """The fields of a CommandSend the broker uses, with protobuf's defaults.

    Only plain sends come this way (no transaction, chunk, marker or message id: those fields
    make :func:`decode_send` return None and the protobuf class handle the command).
    """

    __slots__ = ("producer_id", "sequence_id", "num_messages", "highest_sequence_id")

    def __init__(self, producer_id: int, sequence_id: int, num_messages: int, highest_sequence_id: int):
        self.producer_id = producer_id
        self.sequence_id = sequence_id
        self.num_messages = num_messages
        self.highest_sequence_id = highest_sequence_id

    def HasField(self, name: str) -> bool:  # noqa: N802 - the protobuf method's name
        return name in ("producer_id", "sequence_id") or (
            name == "highest_sequence_id" and self.highest_sequence_id != 0
        )


def _py_decode_send(buf, start: int, end: int) -> tuple[int, int, int, int] | None:
    """(producer_id, sequence_id, num_messages, highest_sequence_id) of a plain SEND, or None
    (see :func:`decode_send`)."""
    try:
        # BaseCommand: field 1 (type) = 6, then field 6 (send), length-delimited
        if end - start < 4 or buf[start] != 0x08 or buf[start + 1] != SEND or buf[start + 2] != 0x32:
            return None
        size, pos = read_varint(buf, start + 3, end)
        if pos + size != end:
            return None  # more BaseCommand fields after the send: not the plain shape
        producer_id = sequence_id = None
        num_messages, highest = 1, 0
        while pos < end:
            tag = buf[pos]
            value, pos = read_varint(buf, pos + 1, end)
            if tag == 0x08:
                producer_id = value
            elif tag == 0x10:
                sequence_id = value
            elif tag == 0x18:
                num_messages = _int32(value)
            elif tag == 0x30:
                highest = value
            else:
                return None  # txn ids, chunk, marker, message id, or unknown: protobuf decides
    except (ValueError, IndexError):
        return None
    if producer_id is None or sequence_id is None:
        return None  # protobuf reports the missing required field
    return producer_id, sequence_id, num_messages, highest


# ---------------------------------------------------------------------------------------------
# MessageMetadata
# ---------------------------------------------------------------------------------------------


class MetadataFields:
    """The MessageMetadata fields the broker routes on, as protobuf would read them.

    ``partition_key`` / ``ordering_key`` are None when absent (protobuf: not HasField).
    """

    __slots__ = (
        "publish_time",
        "num_messages_in_batch",
        "has_num_messages_in_batch",
        "partition_key",
        "partition_key_b64_encoded",
        "ordering_key",
        "deliver_at_time",
        "has_deliver_at_time",
    )

    def __init__(
        self,
        publish_time: int = 0,
        num_messages_in_batch: int = 1,
        has_num_messages_in_batch: bool = False,
        partition_key: str | None = None,
        partition_key_b64_encoded: bool = False,
        ordering_key: bytes | None = None,
        deliver_at_time: int = 0,
        has_deliver_at_time: bool = False,
    ) -> None:
        self.publish_time = publish_time
        self.num_messages_in_batch = num_messages_in_batch
        self.has_num_messages_in_batch = has_num_messages_in_batch
        self.partition_key = partition_key
        self.partition_key_b64_encoded = partition_key_b64_encoded
        self.ordering_key = ordering_key
        self.deliver_at_time = deliver_at_time
        self.has_deliver_at_time = has_deliver_at_time


def fields_of(md) -> MetadataFields:
    """The same fields out of a parsed ``pb.MessageMetadata`` (the fallback path)."""
    out = MetadataFields()
    out.publish_time = md.publish_time
    out.num_messages_in_batch = md.num_messages_in_batch
    out.has_num_messages_in_batch = md.HasField("num_messages_in_batch")
    out.partition_key = md.partition_key if md.HasField("partition_key") else None
    out.partition_key_b64_encoded = md.partition_key_b64_encoded
    out.ordering_key = md.ordering_key if md.HasField("ordering_key") else None
    out.deliver_at_time = md.deliver_at_time
    out.has_deliver_at_time = md.HasField("deliver_at_time")
    return out


# MessageMetadata fields the scanner accepts: field number -> wire type. Fields absent here
# (properties with their required key/value are checked apart; encryption keys, whose nested
# required fields are not, and any unknown field) send the entry to the protobuf parser.
_METADATA_WIRE_TYPES = {
    1: _LEN,  # producer_name
    2: _VARINT,  # sequence_id
    3: _VARINT,  # publish_time
    4: _LEN,  # properties (KeyValue: checked by _plain_key_value)
    5: _LEN,  # replicated_from
    6: _LEN,  # partition_key
    7: _LEN,  # replicate_to
    8: _VARINT,  # compression (an enum; a value protobuf does not know is kept aside, no error)
    9: _VARINT,  # uncompressed_size
    11: _VARINT,  # num_messages_in_batch
    12: _VARINT,  # event_time
    14: _LEN,  # encryption_algo
    15: _LEN,  # encryption_param
    16: _LEN,  # schema_version
    17: _VARINT,  # partition_key_b64_encoded
    18: _LEN,  # ordering_key
    19: _VARINT,  # deliver_at_time
    20: _VARINT,  # marker_type
    22: _VARINT,  # txnid_least_bits
    23: _VARINT,  # txnid_most_bits
    24: _VARINT,  # highest_sequence_id
    25: _VARINT,  # null_value
    26: _LEN,  # uuid
    27: _VARINT,  # num_chunks_from_msg
    28: _VARINT,  # total_chunk_msg_size
    29: _VARINT,  # chunk_id
    30: _VARINT,  # null_partition_key
}


def _signed(value: int) -> int:
    """An int64 field: the two's complement reading of the 64-bit varint."""
    return value - (1 << 64) if value >> 63 else value


def _int32(value: int) -> int:
    """An int32 field: protobuf keeps the low 32 bits of the varint, signed."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >> 31 else value


def _plain_key_value(buf, pos: int, end: int) -> bool:
    """A KeyValue made of its two required strings (and nothing else)."""
    seen = 0
    while pos < end:
        tag = buf[pos]
        if tag not in (0x0A, 0x12):
            return False
        size, pos = read_varint(buf, pos + 1, end)
        pos += size
        seen |= 1 if tag == 0x0A else 2
    return pos == end and seen == 3


def _py_scan_metadata(buf, start: int, end: int) -> tuple | None:
    """The routing fields of the MessageMetadata at ``buf[start:end]`` in the order of
    :class:`MetadataFields`, or None when it is not of a shape this scanner accepts."""
    publish_time = deliver_at = 0
    num, has_num, has_deliver, b64 = 1, False, False, False
    partition_key: str | None = None
    ordering_key: bytes | None = None
    required = 0
    pos = start
    try:
        while pos < end:
            key, pos = read_varint(buf, pos, end)
            field, wire = key >> 3, key & 7
            if _METADATA_WIRE_TYPES.get(field) != wire:
                return None
            if wire == _VARINT:
                value, pos = read_varint(buf, pos, end)
                if field == 3:
                    publish_time = value
                    required |= 4
                elif field == 2:
                    required |= 2
                elif field == 11:
                    num, has_num = _int32(value), True
                elif field == 19:
                    deliver_at, has_deliver = _signed(value), True
                elif field == 17:
                    b64 = value != 0
                continue
            size, pos = read_varint(buf, pos, end)
            nxt = pos + size
            if nxt > end:
                return None
            if field == 1:
                required |= 1
            elif field == 6:
                partition_key = bytes(buf[pos:nxt]).decode()  # not UTF-8: protobuf decides
            elif field == 18:
                ordering_key = bytes(buf[pos:nxt])
            elif field == 4 and not _plain_key_value(buf, pos, nxt):
                return None
            pos = nxt
    except (ValueError, IndexError):
        return None
    if required != 7 or pos != end:
        return None
    return publish_time, num, has_num, partition_key, b64, ordering_key, deliver_at, has_deliver


def _py_scan_entry(entry) -> tuple | None:
    """:func:`_py_scan_metadata` of a stored entry's metadata (found by :func:`metadata_bounds`);
    None for an entry with a broker-entry-metadata prefix too."""
    if len(entry) >= 2 and entry[0] == 0x0E and entry[1] == 0x02:
        return None
    bounds = metadata_bounds(entry)
    return None if bounds is None else _py_scan_metadata(entry, bounds[0], bounds[1])


def _py_checked_publish_time(entry) -> int | None:
    """The publish time of a SEND's entry that carries magic and a matching CRC and whose
    metadata the scanner accepts; None otherwise (the caller takes the general path)."""
    if len(entry) < 10 or entry[0] != 0x0E or entry[1] != 0x01:
        return None
    if _crc32c.crc32c(memoryview(entry)[6:]) != _U32.unpack_from(entry, 2)[0]:
        return None
    fields = _py_scan_entry(entry)
    return None if fields is None else fields[0]


# ---------------------------------------------------------------------------------------------
# SEND_RECEIPT and MESSAGE
# ---------------------------------------------------------------------------------------------


def _message_id(ledger_id: int, entry_id: int, partition: int, batch_index: int | None = None) -> bytes:
    parts = [b"\x08", encode_varint(ledger_id & _MASK64), b"\x10", encode_varint(entry_id & _MASK64)]
    parts += (b"\x18", encode_varint(partition))
    if batch_index is not None and batch_index >= 0:
        parts += (b"\x20", encode_varint(batch_index))
    return b"".join(parts)


def _py_send_receipt_frame(
    producer_id: int,
    sequence_id: int,
    ledger_id: int,
    entry_id: int,
    partition: int = -1,
    highest_sequence_id: int | None = None,
) -> bytes:
    """A framed SEND_RECEIPT, byte for byte what ``encode_command(commands.send_receipt(...))``
    writes."""
    mid = _message_id(ledger_id, entry_id, partition)
    body = [b"\x08", encode_varint(producer_id), b"\x10", encode_varint(sequence_id)]
    body += (b"\x1a", encode_varint(len(mid)), mid)
    if highest_sequence_id is not None:
        body += (b"\x20", encode_varint(highest_sequence_id))
    inner = b"".join(body)
    command = b"".join((b"\x08\x07\x3a", encode_varint(len(inner)), inner))
    return _SIZES.pack(len(command) + 4, len(command)) + command


def _py_message_frame_header(
    consumer_id: int,
    ledger_id: int,
    entry_id: int,
    partition: int,
    redelivery_count: int,
    ack_set,
    entry_size: int,
    batch_index: int | None = None,
) -> bytes:
    """The framed head of a MESSAGE whose entry of ``entry_size`` bytes follows it on the wire:
    ``head + entry`` is byte for byte ``encode_with_entry(commands.message(...), entry)``."""
    mid = _message_id(ledger_id, entry_id, partition, batch_index)
    body = [b"\x08", encode_varint(consumer_id), b"\x12", encode_varint(len(mid)), mid]
    body += (b"\x18", encode_varint(redelivery_count))
    if ack_set:
        for word in ack_set:
            body += (b"\x20", encode_varint(word))
    inner = b"".join(body)
    command = b"".join((b"\x08\x09\x4a", encode_varint(len(inner)), inner))
    return _SIZES.pack(len(command) + 4 + entry_size, len(command)) + command


def metadata_bounds(entry, offset: int = 0) -> tuple[int, int] | None:
    """(start, end) of the MessageMetadata in a stored entry (``[magic][crc]`` optional,
    ``[size][metadata]``), or None when the sizes do not fit (protobuf path reports it)."""
    n = len(entry)
    if n - offset >= 2 and entry[offset] == 0x0E and entry[offset + 1] == 0x01:
        offset += 6
    if n - offset < 4:
        return None
    (size,) = _U32.unpack_from(entry, offset)
    start = offset + 4
    if size > n - start:
        return None
    return start, start + size


# ---------------------------------------------------------------------------------------------
# Runs of SENDs: many frames in one call, their receipts in one call
# ---------------------------------------------------------------------------------------------


def _py_split_sends(buf, pos: int, end: int, max_frame_size: int) -> tuple | None:
    """The run of plain SENDs of one producer at ``buf[pos:end]`` (see :func:`split_sends`)."""
    entries: list[bytes] = []
    times: list[int] = []
    receipts: list[bytes] = []
    producer_id = last_seq = 0
    messages = size = 0
    while end - pos >= 4:
        (total,) = _U32.unpack_from(buf, pos)
        if total > max_frame_size or total < 4 or total > end - pos - 4:
            break  # the general path raises, or waits for the rest of the frame
        start = pos + 4
        frame_end = start + total
        (cmd_size,) = _U32.unpack_from(buf, start)
        cmd_start = start + 4
        if cmd_size >= frame_end - cmd_start:
            break  # no entry after the command (or a command longer than its frame)
        cmd_end = cmd_start + cmd_size
        fields = _py_decode_send(buf, cmd_start, cmd_end)
        if fields is None or (entries and fields[0] != producer_id):
            break
        entry = bytes(buf[cmd_end:frame_end])
        publish_time = _py_checked_publish_time(entry)
        if publish_time is None:
            break
        pid, seq, num, highest = fields
        last = highest if highest else seq + max(num, 1) - 1
        if last > _MASK64:
            break  # past 64 bits: the general path keeps Python's ints
        if not entries or last > last_seq:
            last_seq = last
        producer_id = pid
        entries.append(entry)
        times.append(publish_time)
        receipts.append(_RECEIPT.pack(seq, highest))
        messages += num
        size += len(entry)
        pos = frame_end
    if not entries:
        return None
    return pos, producer_id, entries, times, b"".join(receipts), messages, size, last_seq


def _py_send_receipt_frames(
    producer_id: int, partition: int, ledger_id: int, first_entry_id: int, receipts
) -> bytes:
    """The SEND_RECEIPTs of a run, one after the other (see :func:`send_receipt_frames`)."""
    return b"".join(
        _py_send_receipt_frame(producer_id, seq, ledger_id, first_entry_id + i, partition, highest or None)
        for i, (seq, highest) in enumerate(_RECEIPT.iter_unpack(receipts))
    )


def pack_receipt(sequence_id: int, highest_sequence_id: int | None) -> bytes:
    """The ``receipts`` of one SEND (see :func:`send_receipt_frames`): its sequence id and
    highest sequence id (None or 0: not sent)."""
    return _RECEIPT.pack(sequence_id, highest_sequence_id or 0)


def receipt_fields(receipts: bytes) -> list[tuple[int, int | None]]:
    """(sequence_id, highest_sequence_id or None) of each message of a run's ``receipts``."""
    return [(seq, highest or None) for seq, highest in _RECEIPT.iter_unpack(receipts)]


# ---------------------------------------------------------------------------------------------
# The two implementations, and the one in use
# ---------------------------------------------------------------------------------------------

PYTHON = SimpleNamespace(
    name="python",
    decode_send=_py_decode_send,
    scan_metadata=_py_scan_metadata,
    scan_entry=_py_scan_entry,
    checked_publish_time=_py_checked_publish_time,
    send_receipt_frame=_py_send_receipt_frame,
    message_frame_header=_py_message_frame_header,
    split_sends=_py_split_sends,
    send_receipt_frames=_py_send_receipt_frames,
)


def _load_native() -> SimpleNamespace | None:
    if os.environ.get("COMPACTMQ_NATIVE") == "0":
        return None
    try:
        from compactmq.protocol import _wire  # type: ignore[attr-defined]
    except ImportError:
        return None
    if getattr(_wire, "ABI", None) != ABI:
        return None  # a stale build of an older _wire.c
    return SimpleNamespace(
        name="native",
        decode_send=_wire.decode_send,
        scan_metadata=_wire.scan_metadata,
        scan_entry=_wire.scan_entry,
        checked_publish_time=_wire.checked_publish_time,
        crc32c=_wire.crc32c,
        send_receipt_frame=_wire.send_receipt_frame,
        message_frame_header=_wire.message_frame_header,
        split_sends=_wire.split_sends,
        send_receipt_frames=_wire.send_receipt_frames,
        # ledger records (storage.ledger_file holds their format and the Python twins)
        record_header=_wire.record_header,
        frame_records=_wire.frame_records,
    )


NATIVE = _load_native()
"""The C twin, or None when the extension is not built (or turned off)."""

IMPLEMENTATION = NATIVE or PYTHON
_decode_send = IMPLEMENTATION.decode_send
_scan_metadata = IMPLEMENTATION.scan_metadata
_scan_entry = IMPLEMENTATION.scan_entry

checked_publish_time = IMPLEMENTATION.checked_publish_time
"""``checked_publish_time(entry)``: the publish time of a SEND's entry when it carries magic
and a matching CRC and its metadata is of a plain shape, in one pass; None otherwise, and the
caller takes the general path (``entry_format.ensure_checksummed``, ``entry_format.publish_time_of``),
which adds the checksum or raises the exact error."""

send_receipt_frame = IMPLEMENTATION.send_receipt_frame
"""``send_receipt_frame(producer_id, sequence_id, ledger_id, entry_id, partition=-1,
highest_sequence_id=None)``: a framed SEND_RECEIPT, byte for byte what
``encode_command(commands.send_receipt(...))`` writes."""

split_sends = IMPLEMENTATION.split_sends
"""``split_sends(buf, pos, end, max_frame_size)``: the run of complete frames from ``buf[pos:end]``
that are plain SENDs (what :func:`decode_send` accepts) of one producer, each entry carrying
magic, a matching CRC and metadata of a plain shape (what :func:`checked_publish_time`
accepts), as ``(next_pos, producer_id, entries, publish_times, receipts, messages, size,
last_sequence_id)``; None when the first frame is not such a SEND. The run stops before the
first frame that is not (another command, another producer, a partial frame, a frame over
``max_frame_size``, a checksum that does not match): the general path reads that one, and
raises or answers exactly as it would have. ``entries`` are copies (bytes), ``publish_times``
the metadata's (0 when the producer set none); ``receipts`` 16 bytes per message for
:func:`send_receipt_frames`; ``messages`` the sum of ``num_messages``; ``size`` the entries'
bytes; ``last_sequence_id`` the largest last sequence id of the run (``highest_sequence_id``
when sent, else ``sequence_id + max(num_messages, 1) - 1``)."""

send_receipt_frames = IMPLEMENTATION.send_receipt_frames
"""``send_receipt_frames(producer_id, partition, ledger_id, first_entry_id, receipts)``: the
framed SEND_RECEIPTs of a run whose entries have the ids ``first_entry_id, +1, ...``, one after
the other; byte for byte the ``send_receipt_frame`` of each."""

message_frame_header = IMPLEMENTATION.message_frame_header
"""``message_frame_header(consumer_id, ledger_id, entry_id, partition, redelivery_count, ack_set,
entry_size, batch_index=None)``: the framed head of a MESSAGE whose entry follows it on the
wire; ``head + entry`` is byte for byte ``encode_with_entry(commands.message(...), entry)``."""


def decode_send(buf, start: int, end: int) -> SendCommand | None:
    """The CommandSend in the BaseCommand at ``buf[start:end]``, or None when the command is
    not a SEND of the plain shape (the caller decodes it with protobuf then).

    Accepted: ``type = SEND`` then ``send = {producer_id, sequence_id[, num_messages]
    [, highest_sequence_id]}`` and nothing else, each once or more (last wins).
    """
    fields = _decode_send(buf, start, end)
    return None if fields is None else SendCommand(*fields)


def scan_metadata(buf, start: int, end: int) -> MetadataFields | None:
    """The routing fields of the MessageMetadata at ``buf[start:end]``, or None when it is not
    of a shape the scanner accepts (the caller parses it with protobuf, which accepts or rejects
    it as before). Required fields (producer name, sequence id, publish time) must be present.
    """
    fields = _scan_metadata(buf, start, end)
    return None if fields is None else MetadataFields(*fields)


def scan_entry(entry) -> MetadataFields | None:
    """:func:`scan_metadata` of a stored entry's MessageMetadata, found in the entry."""
    fields = _scan_entry(entry)
    return None if fields is None else MetadataFields(*fields)
