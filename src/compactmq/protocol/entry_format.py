"""Pulsar entries: the bytes a producer's message is stored and delivered as. No I/O.

An *entry* is::

    [magic 0x0e01 u16][crc32c u32][metadata_size u32][MessageMetadata][payload]

where the CRC32C covers everything after the crc field. A client may omit magic and crc
(``[metadata_size][MessageMetadata][payload]``); :func:`ensure_checksummed` adds them, so every
stored entry starts with the magic. A broker may put ``[magic 0x0e02 u16][size u32]
[BrokerEntryMetadata]`` in front of an entry for clients that asked for it; compactmq never
stores that prefix, and :func:`parse_entry` skips it when present.

The framing around an entry (sizes, commands) is :mod:`compactmq.protocol.frames`; this module
only knows the entry itself:

* building one (:func:`build_entry`) and checking or adding its checksum
  (:func:`ensure_checksummed`, :func:`verify_checksum`);
* reading it back: the whole MessageMetadata (:func:`parse_entry`, :func:`parse_metadata`) or,
  on the hot paths, just the routing fields read off the wire by :mod:`wire`
  (:func:`metadata_fields`, :func:`checksummed_with_publish_time`).

Errors are about one entry (ChecksumError, MalformedEntry): the connection that carried it
stays up, and the broker answers that SEND alone.
"""

from __future__ import annotations

import struct

import crc32c as _crc32c
from google.protobuf.message import DecodeError

from compactmq.errors import ChecksumError, MalformedEntry
from compactmq.protocol import pulsar_pb2 as pb
from compactmq.protocol import wire

MAGIC = 0x0E01
"""First two bytes of a checksummed entry."""

BROKER_ENTRY_METADATA_MAGIC = 0x0E02
"""First two bytes of the optional broker-entry-metadata prefix of a delivered entry."""

_U32 = struct.Struct(">I")
_MAGIC_CRC = struct.Struct(">HI")


def crc32c(data: bytes | memoryview) -> int:
    """CRC32C (Castagnoli), the checksum Pulsar entries carry."""
    return _crc32c.crc32c(data)


def build_entry(metadata: pb.MessageMetadata, payload: bytes) -> bytes:
    """``[magic][crc32c][metadata_size][metadata][payload]`` for ``metadata`` and ``payload``."""
    md = metadata.SerializeToString()
    body = b"".join((_U32.pack(len(md)), md, payload))
    return _MAGIC_CRC.pack(MAGIC, _crc32c.crc32c(body)) + body


def is_checksummed(entry: bytes) -> bool:
    # Without the magic an entry starts with metadata_size; a size starting 0x0e01 would be
    # over 235 MB, far above any frame limit, so the two layouts cannot be confused.
    return len(entry) >= 2 and entry[0] == 0x0E and entry[1] == 0x01


def ensure_checksummed(entry: bytes) -> bytes:
    """Return ``entry`` with magic and CRC: verified when present, added when absent.

    Raises:
        ChecksumError: the entry carries a CRC that does not match its bytes.
        MalformedEntry: the entry is too short to hold its header.
    """
    if is_checksummed(entry):
        _verify(entry)
        return entry
    if len(entry) < 4:
        raise MalformedEntry(f"entry of {len(entry)} bytes is too short for a metadata size")
    return _MAGIC_CRC.pack(MAGIC, _crc32c.crc32c(entry)) + bytes(entry)


def verify_checksum(entry: bytes) -> bool:
    """True if the entry carries magic and a matching CRC; False if it carries no checksum.

    Raises:
        ChecksumError: the CRC does not match.
    """
    if not is_checksummed(entry):
        return False
    _verify(entry)
    return True


def _verify(entry: bytes) -> None:
    if len(entry) < 6:
        raise MalformedEntry(f"checksummed entry of {len(entry)} bytes is too short")
    (expected,) = _U32.unpack_from(entry, 2)
    actual = _crc32c.crc32c(memoryview(entry)[6:])
    if actual != expected:
        raise ChecksumError(f"entry checksum mismatch: carried {expected:#010x}, computed {actual:#010x}")


def verify_if_checksummed(entry: bytes, command: pb.BaseCommand) -> None:
    try:
        if is_checksummed(entry):
            _verify(entry)
    except (ChecksumError, MalformedEntry) as err:
        err.command = command
        err.command_type = command.type
        raise


def strip_broker_entry_metadata(entry: bytes) -> tuple[pb.BrokerEntryMetadata | None, bytes]:
    """Split off a ``0x0e02`` broker-entry-metadata prefix, if the entry has one."""
    if len(entry) >= 2 and entry[0] == 0x0E and entry[1] == 0x02:
        if len(entry) < 6:
            raise MalformedEntry("truncated broker entry metadata")
        (size,) = _U32.unpack_from(entry, 2)
        if size > len(entry) - 6:
            raise MalformedEntry(f"broker entry metadata of {size} bytes exceeds the entry")
        bem = pb.BrokerEntryMetadata()
        try:
            bem.ParseFromString(memoryview(entry)[6 : 6 + size])
        except (DecodeError, RuntimeError, ValueError) as exc:
            raise MalformedEntry(f"undecodable broker entry metadata: {exc}") from exc
        return bem, bytes(memoryview(entry)[6 + size :])
    return None, entry


def _split_entry(entry: bytes, verify_checksum: bool) -> tuple[pb.MessageMetadata, memoryview, int]:
    """The MessageMetadata of an entry, a view of the entry and where its payload starts."""
    _, entry = strip_broker_entry_metadata(entry)
    view = memoryview(entry)
    offset = 0
    if is_checksummed(entry):
        if verify_checksum:
            _verify(entry)
        offset = 6
    if len(view) - offset < 4:
        raise MalformedEntry("entry too short for its metadata size")
    (md_size,) = _U32.unpack_from(view, offset)
    offset += 4
    if md_size > len(view) - offset:
        raise MalformedEntry(f"metadata size {md_size} exceeds the entry ({len(view) - offset} bytes left)")
    metadata = pb.MessageMetadata()
    try:
        metadata.ParseFromString(view[offset : offset + md_size])
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise MalformedEntry(f"undecodable message metadata: {exc}") from exc
    if not metadata.IsInitialized():
        missing = ", ".join(metadata.FindInitializationErrors())
        raise MalformedEntry(f"message metadata lacks required fields: {missing}")
    return metadata, view, offset + md_size


def parse_entry(entry: bytes, verify_checksum: bool = True) -> tuple[pb.MessageMetadata, bytes]:
    """Split an entry into its MessageMetadata and its (still compressed) payload.

    Accepts checksummed and unchecksummed entries, and skips a broker-entry-metadata prefix.
    Pass ``verify_checksum=False`` when the CRC was already checked (e.g. right after
    :func:`ensure_checksummed`), to spare a second pass over the bytes.

    Raises:
        ChecksumError: ``verify_checksum`` and the CRC does not match.
        MalformedEntry: truncated, sizes out of range, or metadata that does not decode or
            lacks required fields.
    """
    metadata, view, payload_at = _split_entry(entry, verify_checksum)
    return metadata, bytes(view[payload_at:])


def metadata_fields(entry: bytes) -> wire.MetadataFields:
    """The routing fields of an entry's MessageMetadata (``publish_time``,
    ``num_messages_in_batch``, keys, ``deliver_at_time``), read off the wire when the metadata
    has a shape :func:`wire.scan_metadata` accepts, else from the parsed MessageMetadata.

    Raises:
        MalformedEntry: as :func:`parse_metadata` (the same entries, the same errors).
    """
    fields = wire.scan_entry(entry)
    return fields if fields is not None else wire.fields_of(parse_metadata(entry))


def checksummed_with_publish_time(entry: bytes) -> tuple[bytes, int]:
    """:func:`ensure_checksummed` and :func:`publish_time_of` of a SEND's entry, in one pass
    over it when it carries a matching checksum and plain metadata (the usual case).

    Raises:
        ChecksumError, MalformedEntry: as those two functions.
    """
    publish_time = wire.checked_publish_time(entry)
    if publish_time is not None:
        return entry, publish_time
    entry = ensure_checksummed(entry)
    return entry, publish_time_of(entry)


def publish_time_of(entry: bytes) -> int:
    """The producer's publish time of an entry (0 when it set none).

    Raises:
        MalformedEntry: as :func:`parse_metadata`.
    """
    return metadata_fields(entry).publish_time


def parse_metadata(entry: bytes) -> pb.MessageMetadata:
    """Just the MessageMetadata of an entry, read in place (no payload copy, no CRC check).

    The broker calls this for every entry published and dispatched, so it copies nothing; the
    CRC is checked once, on SEND (:func:`ensure_checksummed`).
    """
    return _split_entry(entry, verify_checksum=False)[0]
