"""The MESSAGE frames of one consumer, received in bulk and handed on as chunks of whole entries.

After its handshake the entry reader (``broker_entries``) receives nothing but MESSAGE frames
(and the odd PING or AUTH_CHALLENGE). Decoding them one by one into frame objects and entry
``bytes`` -- then joining those bytes again for the columnar parser -- cost the read a copy and a
few Python objects per entry on top of the parse itself. Here the socket is read with
``recv_into`` into one growing buffer, frames are walked in place (two ``unpack_from`` and the
small MESSAGE command per frame: its message id), and a *chunk* is handed on as the buffer region
holding its entries, copied once, with numpy arrays of the entries' offsets, lengths and ids:
exactly what ``entry_columns.parse_entries`` takes. No object is made per message, and per entry
only the command.

Flow control is sized for throughput: the consumer grants ``permits`` messages (a large window:
the broker stops dispatching when its connection's write buffer is full, so the window costs no
memory, and the broker reads long runs of entries per dispatch instead of a few). Permits are
counted as the broker counts them, per message (a batch entry's ``num_messages_in_batch``, read
off the wire without parsing the metadata), and topped back up once half are used.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator

import numpy as np
from google.protobuf.message import DecodeError

from ..errors import CompactMQError
from ..protocol import wire
from ..protocol import pulsar_pb2 as pb
from ..protocol.frames import decode_command
from ..protocol.entry_format import metadata_fields

_U32 = struct.Struct(">I")
_SIGN, _WRAP = 1 << 63, 1 << 64
_scan_metadata = wire.IMPLEMENTATION.scan_metadata  # the C scanner when built: no object
MESSAGE = pb.BaseCommand.MESSAGE
RECV_BYTES = 8 << 20  # the receive buffer's starting size (it grows for a larger frame)
MAX_FRAME = 256 << 20  # a larger frame is a broken stream (the broker's limit is ~5 MB)


def messages_in(buf, start: int, end: int) -> int:
    """Messages of the entry ``buf[start:end]`` as the broker counts permits (a batch: its
    ``num_messages_in_batch``), read off the wire; an entry that does not parse counts 1
    (``parse_entries`` says what is wrong with it)."""
    at = start + 6 if end - start >= 6 and buf[start] == 0x0E and buf[start + 1] == 0x01 else start
    if end - at >= 4:
        (size,) = _U32.unpack_from(buf, at)
        if size <= end - at - 4:
            fields = _scan_metadata(buf, at + 4, at + 4 + size)  # a tuple, in MetadataFields' order
            if fields is not None:
                return max(1, int(fields[1]))  # num_messages_in_batch
    try:
        return max(1, int(metadata_fields(bytes(buf[start:end])).num_messages_in_batch))
    except CompactMQError:
        return 1


class Chunk:
    """Entries of one chunk: ``data`` (uint8) and per entry its offset, length, ledger and entry id."""

    __slots__ = ("data", "offsets", "lengths", "ledger_ids", "entry_ids")

    def __init__(self, data, offsets, lengths, ledger_ids, entry_ids) -> None:
        self.data, self.offsets, self.lengths = data, offsets, lengths
        self.ledger_ids, self.entry_ids = ledger_ids, entry_ids

    def __len__(self) -> int:
        return len(self.offsets)


class EntryStream:
    """MESSAGE frames of ``sock`` as ``Chunk`` s, up to an end position.

    ``control(command) -> bool`` answers a frame without an entry (PING, AUTH_CHALLENGE, ...);
    False makes the read fail with ``fail(command)``'s exception. ``flow(n)`` grants permits."""

    def __init__(self, sock, leftover: bytes, control: Callable, fail: Callable, flow: Callable[[int], None]):
        self.sock = sock
        self.control, self.fail, self.flow = control, fail, flow
        self.buf = bytearray(max(RECV_BYTES, len(leftover)))
        self.buf[: len(leftover)] = leftover
        self.filled = len(leftover)
        self.pos = 0  # the first byte not yet walked
        self.cmd = pb.BaseCommand()  # reused for every MESSAGE command
        self.permits = self.granted = 0
        self.done = False

    def _receive(self, compact: bool) -> None:
        """More bytes at ``filled``; with ``compact``, the walked ones dropped first (and the
        buffer grown if still full)."""
        if compact and self.pos:
            rest = self.filled - self.pos
            self.buf[:rest] = self.buf[self.pos : self.filled]
            self.filled, self.pos = rest, 0
        if self.filled == len(self.buf):
            self.buf.extend(bytes(len(self.buf)))
        with memoryview(self.buf) as view:
            n = self.sock.recv_into(view[self.filled :])
        if not n:
            raise ConnectionError("the broker closed the connection")
        self.filled += n

    def chunks(self, end: tuple, permits: int, chunk_entries: int, chunk_bytes: int) -> Iterator[Chunk]:
        """Chunks of the entries before ``end`` (``(ledger, entry)``, exclusive), the last one
        included; permits granted ``permits`` at a time."""
        self.permits = self.granted = permits
        self.flow(permits)
        self.done = False
        while not self.done:
            chunk = self._collect((int(end[0]), int(end[1])), chunk_entries, chunk_bytes)
            if chunk is not None:
                yield chunk

    def _collect(self, end: tuple[int, int], chunk_entries: int, chunk_bytes: int) -> Chunk | None:
        """The next chunk (None: none before ``end``); sets ``done`` at the end. The hot loop:
        per entry, a parse of the small MESSAGE command into one reused object, its permits off
        the wire, four appends."""
        starts: list = []
        lens: list = []
        lids: list = []
        eids: list = []
        first = -1  # where the chunk's bytes start in ``buf``
        buf, cmd = self.buf, self.cmd
        end_l, end_e = end
        while len(starts) < chunk_entries and (first < 0 or self.pos - first < chunk_bytes):
            frame = self._frame()
            if frame is None:
                # more bytes after the chunk's own; a full buffer is compacted (which moves
                # them) only once they are handed on
                if first >= 0 and self.filled == len(buf):
                    break
                self._receive(compact=first < 0)
                continue
            cmd_start, cmd_end, frame_end = frame
            try:
                cmd.ParseFromString(buf[cmd_start:cmd_end])
            except DecodeError:
                raise ConnectionError("an undecodable command from the broker") from None
            if cmd.type != MESSAGE or cmd_end == frame_end or not cmd.message.HasField("message_id"):
                full = decode_command(bytes(buf[cmd_start:cmd_end]))  # validated, as any other frame
                if not self.control(full):
                    raise self.fail(full)
                continue
            mid = cmd.message.message_id
            lid, eid = mid.ledgerId, mid.entryId
            if lid >= _SIGN:  # unsigned on the wire
                lid -= _WRAP
            if eid >= _SIGN:
                eid -= _WRAP
            if lid > end_l or (lid == end_l and eid >= end_e):
                self.done = True
                break
            if first < 0:
                first = cmd_end
            starts.append(cmd_end)
            lens.append(frame_end - cmd_end)
            lids.append(lid)
            eids.append(eid)
            self.granted -= messages_in(buf, cmd_end, frame_end)
            if self.granted < self.permits // 2:  # top the window back up (it may be negative)
                self.flow(self.permits - self.granted)
                self.granted = self.permits
            if lid > end_l or (lid == end_l and eid + 1 >= end_e):
                self.done = True
                break
        return self._chunk(first, starts, lens, lids, eids) if starts else None

    def _frame(self) -> tuple[int, int, int] | None:
        """``(command start, command end, frame end)`` of the next complete frame, walked past;
        None when it is not all here yet."""
        pos, filled = self.pos, self.filled
        if filled - pos < 8:
            return None
        (total,) = _U32.unpack_from(self.buf, pos)
        if total > MAX_FRAME:
            raise ConnectionError(f"a frame of {total} bytes: the stream is broken")
        if filled - pos - 4 < total:
            return None
        (cmd_size,) = _U32.unpack_from(self.buf, pos + 4)
        frame_end = pos + 4 + total
        if cmd_size > total - 4:
            raise ConnectionError(f"a frame's command size {cmd_size} exceeds its frame")
        self.pos = frame_end
        return pos + 8, pos + 8 + cmd_size, frame_end

    def _chunk(self, first: int, starts: list, lens: list, lids: list, eids: list) -> Chunk:
        last = starts[-1] + lens[-1]
        data = np.frombuffer(bytes(self.buf[first:last]), np.uint8)  # the one copy of the bytes
        offsets = np.array(starts, np.int64) - first
        return Chunk(
            data, offsets, np.array(lens, np.int64), np.array(lids, np.int64), np.array(eids, np.int64)
        )
