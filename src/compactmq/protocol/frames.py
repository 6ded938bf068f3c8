"""Pulsar frames: bytes in, frames out; commands in, bytes out. No I/O.

Wire layout (all integers big-endian)::

    simple command    [total_size u32][command_size u32][BaseCommand]
    with an entry     [total_size u32][command_size u32][BaseCommand][entry]

``total_size`` counts every byte after itself. Only SEND (client to broker) and MESSAGE (broker
to client) carry an entry; what an entry holds and how its checksum is checked is
:mod:`compactmq.protocol.entry_format`.

Who checks what:

* :class:`FrameDecoder` checks the framing: sizes within the limit, a BaseCommand that parses,
  a known type with its command set and complete, an entry exactly where one belongs. Any
  failure is a :class:`~compactmq.errors.ProtocolError` (the stream can no longer be trusted,
  the connection closes) and the decoder stays failed.
* With ``send_runs`` (the broker's connections) consecutive plain SENDs of one producer come
  out as one :class:`SendRun` (:func:`wire.split_sends`), whose entries' checksums are already
  verified; a frame the run cannot take is decoded alone, as below.
* It does not verify entry checksums by default: the broker calls
  ``entry_format.ensure_checksummed`` on each SEND entry, so a corrupt message gets a SEND_ERROR
  (ChecksumError) while the connection stays up, which is how Pulsar brokers answer it and how
  the client expects it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from google.protobuf.message import DecodeError, EncodeError

from compactmq.errors import ProtocolError, ServerError
from compactmq.protocol import pulsar_pb2 as pb
from compactmq.protocol import wire
from compactmq.protocol.entry_format import verify_if_checksummed

BaseCommand = pb.BaseCommand
MessageMetadata = pb.MessageMetadata

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
    def idle(self) -> bool:
        """Nothing buffered and not failed: the next ``feed`` starts at a frame boundary."""
        return not self._buffer and self._error is None

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
        except ProtocolError as err:
            self._fail(err)
            raise
        return self._feed_from(buf, pos, frames)

    def feed_after_run(self, data: bytes, run: tuple) -> list["Frame | SendFrame | SendRun"]:
        """``feed(data)`` when the caller already read the run of SENDs ``data`` starts with
        (``run``: what ``split_sends(data, 0, len(data), max_frame_size)`` returned, not None)
        and nothing is buffered: the run is not read twice. ``data`` must be ``bytes``."""
        if self._error is not None:
            raise self._error
        assert not self._buffer, "feed_after_run with a partial frame buffered"
        return self._feed_from(data, run[0], [SendRun(data, 0, run)])

    def _feed_from(self, buf: bytes, pos: int, frames: list) -> list:
        try:
            pos = self._split(buf, pos, frames)
        except ProtocolError as err:
            self._fail(err)
            raise
        if pos < len(buf):
            self._buffer = bytearray(memoryview(buf)[pos:])
        return frames

    def _fail(self, err: ProtocolError) -> None:
        # Frames decoded before the bad one are dropped with the stream: the connection is
        # closing and nothing after a framing error can be trusted.
        self._error = err
        self._buffer = bytearray()

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
                    verify_if_checksummed(entry, command)
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
        "end",
        "producer_id",
        "entries",
        "publish_times",
        "receipts",
        "messages",
        "size",
        "last_sequence_id",
        "buf",
        "start",
        "run",
    )
    type = BaseCommand.SEND
    type_name = "SEND"

    def __init__(self, buf: bytes, start: int, run: tuple) -> None:
        self.buf = buf  # the bytes the run was read from, from ``start``
        self.start = start
        self.run = run  # what split_sends returned
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
        pos, buf = self.start, self.buf
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
