"""Pulsar frames and entries: bytes in, frames out; commands in, bytes out. No I/O.

Wire layout (all integers big-endian)::

    simple command    [total_size u32][command_size u32][BaseCommand]
    with an entry     [total_size u32][command_size u32][BaseCommand][entry]

``total_size`` counts every byte after itself. Only SEND (client to broker) and MESSAGE (broker
to client) carry an entry. An *entry* is::

    [magic 0x0e01 u16][crc32c u32][metadata_size u32][MessageMetadata][payload]

where the CRC32C covers everything after the crc field. A client may omit magic and crc
(``[metadata_size][MessageMetadata][payload]``); :func:`ensure_checksummed` adds them, so every
stored entry starts with the magic. A broker may put ``[magic 0x0e02 u16][size u32]
[BrokerEntryMetadata]`` in front of an entry for clients that asked for it; compactmq never
stores that prefix, and :func:`parse_entry` skips it when present.

Who checks what:

* :class:`FrameDecoder` checks the framing: sizes within the limit, a BaseCommand that parses,
  a known type with its command set and complete, an entry exactly where one belongs. Any
  failure is a :class:`~compactmq.errors.ProtocolError` (the stream can no longer be trusted,
  the connection closes) and the decoder stays failed.
* With ``send_runs`` (the broker's connections) consecutive plain SENDs of one producer come
  out as one :class:`SendRun` (:func:`wire.split_sends`), whose entries' checksums are already
  verified; a frame the run cannot take is decoded alone, as below.
* It does not verify entry checksums by default: the broker calls :func:`ensure_checksummed` on
  each SEND entry, so a corrupt message gets a SEND_ERROR (ChecksumError) while the connection
  stays up, which is how Pulsar brokers answer it and how the client expects it.
* :func:`parse_entry`, :func:`ensure_checksummed` raise ChecksumError / MalformedEntry about one
  entry.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import crc32c as _crc32c
from google.protobuf.message import DecodeError, EncodeError

from compactmq.errors import ChecksumError, MalformedEntry, ProtocolError, ServerError
from compactmq.protocol import pulsar_pb2 as pb
from compactmq.protocol import wire

BaseCommand = pb.BaseCommand
MessageMetadata = pb.MessageMetadata

MAGIC = 0x0E01
"""First two bytes of a checksummed entry."""

BROKER_ENTRY_METADATA_MAGIC = 0x0E02
"""First two bytes of the optional broker-entry-metadata prefix of a delivered entry."""

DEFAULT_MAX_MESSAGE_SIZE = 5 * 1024 * 1024
"""Pulsar's default ``maxMessageSize``: the largest payload a producer may send."""

FRAME_HEADROOM = 64 * 1024
"""Bytes allowed on top of ``maxMessageSize`` for the command, checksum and MessageMetadata.

Clients bound the *payload* by the ``max_message_size`` the broker announces in CONNECTED, but
the metadata (properties, keys, encryption keys) travels in the same frame; 64 KiB of headroom
admits any reasonable metadata while a frame still cannot grow without bound.
"""

DEFAULT_MAX_FRAME_SIZE = DEFAULT_MAX_MESSAGE_SIZE + FRAME_HEADROOM
"""Largest ``total_size`` accepted by default. A hostile peer announcing a larger frame is
refused before any of it is buffered."""

_U32 = struct.Struct(">I")
_SIZES = struct.Struct(">II")
_MAGIC_CRC = struct.Struct(">HI")
_MAGIC_SIZE = struct.Struct(">HI")

_HEADER_SIZE = 4  # the total_size field itself
_split_sends = wire.split_sends
_MIN_TOTAL_SIZE = 4  # a frame holds at least command_size

# BaseCommand.Type value -> name of the BaseCommand field holding that command (the field
# number equals the type value).
_FIELD_FOR_TYPE: dict[int, str] = {
    f.number: f.name for f in BaseCommand.DESCRIPTOR.fields if f.name != "type"
}

# Commands followed by an entry.
_TYPES_WITH_ENTRY = frozenset({BaseCommand.SEND, BaseCommand.MESSAGE})


def max_frame_size_for(max_message_size: int) -> int:
    """Frame limit that goes with a ``maxMessageSize`` setting (config key of that name)."""
    return max_message_size + FRAME_HEADROOM


@dataclass(frozen=True, slots=True)
class Frame:
    """One decoded frame.

    ``entry`` holds the bytes after the command for SEND and MESSAGE (starting at the magic
    when the sender checksummed them), and is None for every other command.
    """

    command: pb.BaseCommand
    entry: bytes | None = None

    @property
    def type(self) -> int:
        return self.command.type

    @property
    def type_name(self) -> str:
        return BaseCommand.Type.Name(self.command.type)

    def body(self):
        """The command message inside the envelope (e.g. the CommandSend of a SEND)."""
        return getattr(self.command, _FIELD_FOR_TYPE[self.command.type])


def _protocol_error(
    message: str,
    *,
    command: pb.BaseCommand | None = None,
    command_type: int | None = None,
    cls: type[ProtocolError] = ProtocolError,
    server_error: ServerError | None = None,
    peer_fault: bool = True,
) -> ProtocolError:
    err = cls(message)
    err.command = command  # the parsed command when there was one (its request_id helps answer)
    err.command_type = command_type
    err.peer_fault = peer_fault
    if server_error is not None:
        err.server_error = server_error
    return err


class FrameDecoder:
    """Split a byte stream into :class:`Frame` objects.

    ``feed(data)`` appends bytes and returns every frame they complete, in order; a partial
    frame waits for more bytes. After a ProtocolError the decoder is broken: every further
    ``feed`` raises the same error, so a caller cannot accidentally carry on mid-stream.

    Args:
        max_frame_size: largest ``total_size`` accepted; see :data:`DEFAULT_MAX_FRAME_SIZE` and
            :func:`max_frame_size_for`.
        verify_checksums: also verify the CRC of every checksummed entry and raise
            ChecksumError (fatal, like any decoder error). Off by default; see the module notes.
        send_runs: hand consecutive plain SENDs of one producer over as one :class:`SendRun`
            (read by :func:`wire.split_sends`) instead of a :class:`SendFrame` each; the frames
            a run stops before are decoded one by one as usual. Ignored with
            ``verify_checksums``.
    """

    def __init__(
        self,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        *,
        verify_checksums: bool = False,
        send_runs: bool = False,
    ):
        if max_frame_size < 8:
            raise ValueError("max_frame_size must leave room for the size fields")
        self.max_frame_size = max_frame_size
        self.verify_checksums = verify_checksums
        self.send_runs = send_runs
        self._buffer = bytearray()
        self._error: ProtocolError | None = None

    @property
    def buffered(self) -> int:
        """Bytes received but not yet part of a complete frame."""
        return len(self._buffer)

    def take_unread(self) -> bytes:
        """The bytes received but not yet part of a complete frame, handed over and forgotten:
        for a reader that goes on decoding the stream by other means (``spark.broker_entries``
        reads entries straight off the socket once the handshake is done) and must start from
        where this decoder stopped. The decoder is left empty, as if new."""
        unread = bytes(self._buffer)
        self._buffer = bytearray()
        return unread

    def feed(self, data: bytes) -> list["Frame | SendFrame | SendRun"]:
        if self._error is not None:
            raise self._error
        # Frames are cut straight out of ``data``: a frame left partial by the previous call is
        # completed with just the bytes it lacks, so the rest of ``data`` is never copied into a
        # buffer (and a SendRun may keep ``data`` itself, which nothing mutates).
        frames: list[Frame | SendFrame | SendRun] = []
        buf = data if data.__class__ is bytes else bytes(data)
        try:
            pos = self._complete_pending(buf, frames) if self._buffer else 0
            if pos is None:
                return frames  # all of ``data`` went into the partial frame
            pos = self._split(buf, pos, frames)
        except ProtocolError as err:
            # Frames decoded before the bad one are dropped with the stream: the connection
            # is closing and nothing after a framing error can be trusted.
            self._error = err
            self._buffer = bytearray()
            raise
        if pos < len(buf):
            self._buffer = bytearray(memoryview(buf)[pos:])
        return frames

    def _complete_pending(self, data: bytes, frames: list) -> int | None:
        """Add to the partial frame held back the bytes of ``data`` it lacks; decode it once
        whole. Returns where the rest of ``data`` starts, or None when all of it was taken."""
        pending = self._buffer
        at = 0
        if len(pending) < _HEADER_SIZE:
            at = min(len(data), _HEADER_SIZE - len(pending))
            pending += data[:at]
            if len(pending) < _HEADER_SIZE:
                return None
        (total,) = _U32.unpack_from(pending, 0)
        self._check_total(total)
        missing = _HEADER_SIZE + total - len(pending)
        take = min(missing, len(data) - at)
        pending += data[at : at + take]
        if take < missing:
            return None
        self._buffer = bytearray()
        frame = bytes(pending)
        self._split(frame, 0, frames)  # exactly this one frame
        return at + take

    def _check_total(self, total: int) -> None:
        if total > self.max_frame_size:
            raise _protocol_error(
                f"frame of {total} bytes exceeds the limit of {self.max_frame_size} bytes",
                server_error=ServerError.NotAllowedError,
            )
        if total < _MIN_TOTAL_SIZE:
            raise _protocol_error(f"frame size {total} is too small to hold a command")

    def _split(self, buf: bytes, pos: int, frames: list) -> int:
        """Decode the complete frames of ``buf`` from ``pos`` into ``frames``; returns where the
        first incomplete one starts (``len(buf)`` when none is)."""
        end = len(buf)
        runs = self.send_runs and not self.verify_checksums
        max_frame_size = self.max_frame_size
        while end - pos >= _HEADER_SIZE:
            if runs:
                run = _split_sends(buf, pos, end, max_frame_size)
                if run is not None:
                    frames.append(SendRun(buf, pos, run))
                    pos = run[0]
                    continue
            (total,) = _U32.unpack_from(buf, pos)
            self._check_total(total)
            if end - pos - _HEADER_SIZE < total:
                break  # wait for the rest of the frame
            start = pos + _HEADER_SIZE
            pos = start + total
            frames.append(self._decode_frame(buf, start, pos))
        return pos

    def _decode_frame(self, buf: bytes | bytearray, start: int, end: int) -> "Frame | SendFrame":
        (cmd_size,) = _U32.unpack_from(buf, start)
        cmd_start = start + 4
        cmd_end = cmd_start + cmd_size
        if cmd_end > end:
            raise _protocol_error(f"command size {cmd_size} exceeds its frame ({end - cmd_start} bytes left)")
        if cmd_end < end and not self.verify_checksums:
            # the hot command: a plain SEND is read off the wire without a protobuf object
            send = wire.decode_send(buf, cmd_start, cmd_end)
            if send is not None:
                if buf.__class__ is bytes:
                    entry = buf[cmd_end:end]
                else:
                    entry = bytes(memoryview(buf)[cmd_end:end])
                return SendFrame(send, entry, bytes(buf[cmd_start:cmd_end]))
        frame = memoryview(buf)[start:end]
        try:
            command = decode_command(frame[4 : 4 + cmd_size])
            rest = frame[4 + cmd_size :]
            if command.type in _TYPES_WITH_ENTRY:
                if not len(rest):
                    raise _protocol_error(
                        f"{BaseCommand.Type.Name(command.type)} frame without an entry",
                        command=command,
                        command_type=command.type,
                    )
                entry = bytes(rest)
                if self.verify_checksums:
                    _verify_if_checksummed(entry, command)
                return Frame(command, entry)
            if len(rest):
                raise _protocol_error(
                    f"{BaseCommand.Type.Name(command.type)} frame carries {len(rest)} unexpected "
                    "bytes after the command",
                    command=command,
                    command_type=command.type,
                )
            return Frame(command, None)
        finally:
            frame.release()


class SendFrame:
    """A SEND decoded by the wire fast path (:func:`wire.decode_send`): what :class:`Frame`
    offers, plus ``send``, the plain :class:`~compactmq.protocol.wire.SendCommand` the broker
    handles. ``command`` (the protobuf BaseCommand) is decoded from the kept command bytes
    only when asked for: by error paths and tests, never per message."""

    __slots__ = ("send", "entry", "_raw")
    type = BaseCommand.SEND
    type_name = "SEND"

    def __init__(self, send: wire.SendCommand, entry: bytes, raw: bytes) -> None:
        self.send = send
        self.entry = entry
        self._raw = raw

    @property
    def command(self) -> pb.BaseCommand:
        return decode_command(self._raw)

    def body(self) -> pb.CommandSend:
        return self.command.send


class SendRun:
    """Consecutive plain SENDs of one producer, read in one call (:func:`wire.split_sends`):
    the per-message work of the hot path done once per run. ``entries`` and ``publish_times``
    (0 when the producer set none) in order; ``receipts`` for :func:`wire.send_receipt_frames`;
    ``messages`` the sum of the SENDs' ``num_messages``; ``size`` the entries' bytes;
    ``last_sequence_id`` the largest last sequence id among them. Every entry carries a
    matching checksum. ``frames()`` gives the same SENDs as the :class:`SendFrame` objects the
    decoder would have made one by one, for the paths that take them one at a time."""

    __slots__ = (
        "_buf",
        "_start",
        "end",
        "producer_id",
        "entries",
        "publish_times",
        "receipts",
        "messages",
        "size",
        "last_sequence_id",
    )
    type = BaseCommand.SEND
    type_name = "SEND"

    def __init__(self, buf: bytes, start: int, run: tuple) -> None:
        self._buf = buf
        self._start = start
        (
            self.end,
            self.producer_id,
            self.entries,
            self.publish_times,
            self.receipts,
            self.messages,
            self.size,
            self.last_sequence_id,
        ) = run

    def __len__(self) -> int:
        return len(self.entries)

    def frames(self) -> list["SendFrame"]:
        out: list[SendFrame] = []
        pos, buf = self._start, self._buf
        while pos < self.end:
            (total,) = _U32.unpack_from(buf, pos)
            (cmd_size,) = _U32.unpack_from(buf, pos + 4)
            cmd_start = pos + 8
            cmd_end = cmd_start + cmd_size
            pos += _HEADER_SIZE + total
            send = wire.decode_send(buf, cmd_start, cmd_end)
            assert send is not None  # split_sends accepted it
            out.append(SendFrame(send, buf[cmd_end:pos], buf[cmd_start:cmd_end]))
        return out

    @property
    def command(self) -> pb.BaseCommand:
        """The first SEND's command (a run refused as a whole is answered about it)."""
        return self.frames()[0].command


def decode_command(data: bytes | memoryview) -> pb.BaseCommand:
    """Parse and validate one BaseCommand (without the size prefixes).

    Raises:
        ProtocolError: undecodable protobuf, a missing or unknown type, the command for the type
            absent, or required fields missing. ``err.command_type`` carries the type number
            when one was read (also for types we do not know); ``err.command`` the parsed
            command when there was one.
    """
    command = BaseCommand()
    try:
        command.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise _protocol_error(f"undecodable command: {exc}") from exc
    if not command.HasField("type"):
        unknown = _unknown_type_number(command)
        if unknown is not None:
            raise _protocol_error(
                f"unknown command type {unknown}",
                command_type=unknown,
                server_error=ServerError.UnsupportedVersionError,
            )
        raise _protocol_error("command without a type")
    ctype = command.type
    field = _FIELD_FOR_TYPE.get(ctype)
    if field is None:  # a Type value declared without its field: a bug in our .proto
        raise _protocol_error(f"command type {ctype} has no field", command_type=ctype, peer_fault=False)
    if not command.HasField(field):
        body = getattr(command, field)
        if not body.IsInitialized():
            raise _protocol_error(
                f"{BaseCommand.Type.Name(ctype)} without its command",
                command=command,
                command_type=ctype,
            )
        # PING and PONG have empty commands; a sender may leave them out entirely.
        body.SetInParent()
    if not command.IsInitialized():
        missing = ", ".join(command.FindInitializationErrors())
        raise _protocol_error(
            f"{BaseCommand.Type.Name(ctype)} lacks required fields: {missing}",
            command=command,
            command_type=ctype,
        )
    return command


def _unknown_type_number(command: pb.BaseCommand) -> int | None:
    """The value of field 1 when it held a Type we do not know (kept as an unknown field)."""
    try:
        from google.protobuf import unknown_fields
    except ImportError:  # pragma: no cover - older protobuf runtimes
        return None
    for field in unknown_fields.UnknownFieldSet(command):
        if field.field_number == 1 and field.wire_type == 0:
            return field.data
    return None


def encode_command(command: pb.BaseCommand) -> bytes:
    """Frame a command that carries no entry."""
    data = _serialize(command)
    return _SIZES.pack(len(data) + 4, len(data)) + data


def encode_with_entry(command: pb.BaseCommand, entry: bytes) -> bytes:
    """Frame a SEND or MESSAGE command followed by ``entry`` (sent as it is)."""
    data = _serialize(command)
    return b"".join((_SIZES.pack(len(data) + 4 + len(entry), len(data)), data, entry))


def _serialize(command: pb.BaseCommand) -> bytes:
    try:
        return command.SerializeToString()
    except EncodeError as exc:
        # We built an incomplete command: our bug, not the peer's.
        raise _protocol_error(
            f"cannot encode command: {exc}", peer_fault=False, server_error=ServerError.UnknownError
        ) from exc


# ---------------------------------------------------------------------------------------------
# Entries
# ---------------------------------------------------------------------------------------------


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


def _verify_if_checksummed(entry: bytes, command: pb.BaseCommand) -> None:
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
