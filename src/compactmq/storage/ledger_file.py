"""The ledger file format, as pure functions over bytes and file objects.

Nothing here needs a ``Storage``: a Spark task on another machine can open a ledger file through
``pyarrow.fs`` (or any file object), read its bytes and call ``scan_entries`` / ``read_entry_at``.

Ledger file ``<ledger_id>.log``
-------------------------------
All integers are big-endian, like the Pulsar wire format::

    file header (24 bytes)
        magic        8 bytes  b"CMQLEDG1"
        version      u16      1
        reserved     u16      0
        ledger_id    u64
        header_crc   u32      CRC32C of the 20 bytes before it

    record, once per entry, entry ids 0, 1, 2 ... with no gaps
        length       u32      number of entry bytes (``data``)
        crc          u32      CRC32C of entry_id + publish_time_ms + data
        entry_id     u64
        publish_ms   i64      publish time in ms since the epoch (-1 when unknown)
        data         length bytes, exactly what the producer sent (see contract: magic, crc,
                              metadata size, MessageMetadata, payload) -- never touched

The CRC covers the record's id and time as well as its bytes, so a torn or zero-filled tail
(an append cut short by a crash, or blocks the filesystem extended but never wrote) fails
the check. A reader walks records from the header and stops at the first record that is
short, fails its CRC or carries an unexpected entry id: that is the torn tail. The writer
truncates the file there when it reopens the ledger; a reader of a file that is still being
written simply sees the entries that are complete.

Index file ``<ledger_id>.idx`` (written once, when the ledger is closed)
-------------------------------------------------------------------------
::

    header (44 bytes)
        magic        8 bytes  b"CMQLIDX1"
        version      u16      1
        reserved     u16      0
        ledger_id    u64
        entry_count  u64      n
        data_end     u64      file offset just past the last record
        body_crc     u32      CRC32C of the body
        header_crc   u32      CRC32C of the 40 bytes before it
    body
        offsets      n x u64  file offset of each record (its length field)
        publish_ms   n x i64  publish time of each entry

With the index a whole ledger is scanned with a handful of numpy operations (no per-entry
Python); without it (the ledger still open, or the index lost) ``scan_entries`` walks the
records one by one. An index that does not match its ledger file is ignored and rebuilt.
"""

from __future__ import annotations

import io
import os
import struct
from array import array
from typing import BinaryIO, NamedTuple, Union

import numpy as np
from crc32c import crc32c

from ..errors import StorageError

FILE_MAGIC = b"CMQLEDG1"
INDEX_MAGIC = b"CMQLIDX1"
FORMAT_VERSION = 1

_FILE_HEADER = struct.Struct(">8sHHQ")  # + crc u32
FILE_HEADER_SIZE = _FILE_HEADER.size + 4  # 24

_RECORD_HEADER = struct.Struct(">IIQq")
RECORD_HEADER_SIZE = _RECORD_HEADER.size  # 24
# the CRC covers the record from entry_id on: skip length and crc
_CRC_START = 8

_INDEX_HEADER = struct.Struct(">8sHHQQQI")  # + header crc u32
INDEX_HEADER_SIZE = _INDEX_HEADER.size + 4  # 44

# A record longer than this is certainly garbage (a torn length field): Pulsar's largest frame
# is a few MiB; we allow generous headroom rather than trusting 4 GiB from a torn header.
MAX_ENTRY_SIZE = 256 * 1024 * 1024

Source = Union[bytes, bytearray, memoryview, BinaryIO, int]


class LedgerScan(NamedTuple):
    """Everything a scan learns. Offsets point at records; an entry's bytes start at
    ``offset + RECORD_HEADER_SIZE`` and are ``length`` long."""

    entry_ids: np.ndarray  # int64
    offsets: np.ndarray  # int64, record start
    lengths: np.ndarray  # int64, entry bytes
    publish_times: np.ndarray  # int64
    valid_end: int  # offset just past the last good record
    torn: bool  # bytes after valid_end (a torn tail, or a file still being written)


class LedgerIndex(NamedTuple):
    ledger_id: int
    offsets: np.ndarray  # int64
    publish_times: np.ndarray  # int64
    data_end: int


# --- file header ---------------------------------------------------------------------------


def encode_file_header(ledger_id: int) -> bytes:
    head = _FILE_HEADER.pack(FILE_MAGIC, FORMAT_VERSION, 0, ledger_id)
    return head + struct.pack(">I", crc32c(head))


def decode_file_header(buf: bytes | memoryview) -> int:
    """The ledger id in a file header; ``StorageError`` when the header is not ours or damaged."""
    if len(buf) < FILE_HEADER_SIZE:
        raise StorageError(f"ledger file too short for a header ({len(buf)} bytes)")
    head = bytes(buf[: _FILE_HEADER.size])
    magic, version, _, ledger_id = _FILE_HEADER.unpack(head)
    (crc,) = struct.unpack_from(">I", buf, _FILE_HEADER.size)
    if magic != FILE_MAGIC or crc != crc32c(head):
        raise StorageError("not a compactmq ledger file (bad magic or header checksum)")
    if version != FORMAT_VERSION:
        raise StorageError(f"ledger file format version {version} is not supported")
    return ledger_id


# --- records -------------------------------------------------------------------------------


def encode_record(entry_id: int, publish_time_ms: int, data: bytes | memoryview) -> bytes:
    tail = struct.pack(">Qq", entry_id, publish_time_ms)
    crc = crc32c(data, crc32c(tail))
    return struct.pack(">II", len(data), crc) + tail + bytes(data)


_TAIL = struct.Struct(">Qq")


def _py_record_header(entry_id: int, publish_time_ms: int, data: bytes | memoryview) -> bytes:
    """The 24 bytes that go before ``data`` in its record."""
    crc = crc32c(data, crc32c(_TAIL.pack(entry_id, publish_time_ms)))
    return _RECORD_HEADER.pack(len(data), crc, entry_id, publish_time_ms)


def _py_frame_records(
    datas: list, publish_times: list, now: int, first_entry_id: int, start: int, max_size: int
) -> tuple[list, bytes, bytes, int] | None:
    """The records of a run of entries, ready for one vectored or joined write.

    ``(parts, offsets, times, end)``: ``parts`` is ``[header0, data0, header1, data1, ...]``
    (the entries themselves, not copies), ``offsets``/``times`` the native int64 bytes of
    each record's file offset and publish time (a publish time of None means ``now``), ``end``
    the offset past the last record; None when an entry is longer than ``max_size``. One call
    per batch, so the appender runs no Python per entry when the C twin
    (``_wire.frame_records``, hardware CRC32C) is built."""
    pack, tail, hs = _RECORD_HEADER.pack, _TAIL.pack, RECORD_HEADER_SIZE
    parts: list = []
    offs = array("q")
    times = array("q", [now if p is None else int(p) for p in publish_times])
    off = start
    for eid, data, pt in zip(range(first_entry_id, first_entry_id + len(datas)), datas, times):
        n = len(data)
        if n > max_size:
            return None
        parts.append(pack(n, crc32c(data, crc32c(tail(eid, pt))), eid, pt))
        parts.append(data)
        offs.append(off)
        off += hs + n
    return parts, offs.tobytes(), times.tobytes(), off


def _implementation():
    """The C twins from ``compactmq.protocol._wire`` when built (and ``COMPACTMQ_NATIVE`` is
    not 0), else the Python functions above; both write the same bytes."""
    from ..protocol import wire

    native = wire.NATIVE
    if native is not None:
        return "native", native.record_header, native.frame_records
    return "python", _py_record_header, _py_frame_records


RECORD_IMPLEMENTATION, encode_record_header, frame_records = _implementation()
"""``encode_record_header(entry_id, publish_time_ms, data)``: the 24 bytes before ``data``;
``frame_records(datas, publish_times, now, first_entry_id, start, max_size)``: see
``_py_frame_records``."""


def record_size(data_length: int) -> int:
    return RECORD_HEADER_SIZE + data_length


def _empty_scan(valid_end: int, torn: bool) -> LedgerScan:
    z = np.zeros(0, dtype=np.int64)
    return LedgerScan(z, z.copy(), z.copy(), z.copy(), valid_end, torn)


def scan_records(
    buf: bytes | bytearray | memoryview,
    *,
    index: bytes | memoryview | LedgerIndex | None = None,
    verify_crc: bool = True,
    start_offset: int = FILE_HEADER_SIZE,
    first_entry_id: int = 0,
) -> LedgerScan:
    """Scan the records of a whole ledger file held in ``buf``.

    ``buf`` starts at the file header (checked when ``start_offset`` is the header size).
    With ``index`` (the ``.idx`` bytes or a decoded ``LedgerIndex``) the scan is vectorised;
    an index that disagrees with ``buf`` is ignored. Stops at the torn tail, never raises for it.
    """
    mv = memoryview(buf).cast("B") if not isinstance(buf, memoryview) else buf.cast("B")
    if start_offset == FILE_HEADER_SIZE and first_entry_id == 0:
        decode_file_header(mv)
    if index is not None:
        scan = _scan_with_index(mv, index, verify_crc)
        if scan is not None:
            return scan
    return _walk(mv, verify_crc, start_offset, first_entry_id)


def scan_entries(
    buf: bytes | bytearray | memoryview,
    *,
    index: bytes | memoryview | LedgerIndex | None = None,
    verify_crc: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(entry_ids, offsets, lengths)`` of every complete entry in a ledger file's bytes.

    Offsets point at records; the entry bytes are ``buf[o + RECORD_HEADER_SIZE : ... + length]``
    (``entry_bytes`` does the slicing).
    """
    scan = scan_records(buf, index=index, verify_crc=verify_crc)
    return scan.entry_ids, scan.offsets, scan.lengths


def entry_bytes(buf: bytes | memoryview, offset: int, length: int) -> bytes:
    start = int(offset) + RECORD_HEADER_SIZE
    return bytes(buf[start : start + int(length)])


def _walk(mv: memoryview, verify_crc: bool, offset: int, entry_id: int) -> LedgerScan:
    # Pass one follows the length fields (the only sequential part); pass two checks CRCs in a
    # comprehension and cuts the scan at the first record that fails, like a torn tail.
    end = len(mv)
    start_offset, first_id = offset, entry_id
    unpack = _RECORD_HEADER.unpack_from
    hs = RECORD_HEADER_SIZE
    recs: list[tuple[int, int, int, int]] = []  # (offset, length, crc, publish_ms)
    append = recs.append
    while offset + hs <= end:
        length, crc, eid, pt = unpack(mv, offset)
        stop = offset + hs + length
        if eid != entry_id or length > MAX_ENTRY_SIZE or stop > end:
            break
        append((offset, length, crc, pt))
        entry_id += 1
        offset = stop
    if verify_crc and recs:
        good = [crc32c(mv[o + _CRC_START : o + hs + n]) == c for o, n, c, _ in recs]
        if not all(good):
            recs = recs[: good.index(False)]
            offset = recs[-1][0] + hs + recs[-1][1] if recs else start_offset
    if not recs:
        return _empty_scan(offset, offset != end)
    arr = np.asarray(recs, dtype=np.int64)
    return LedgerScan(
        np.arange(first_id, first_id + len(arr), dtype=np.int64),
        arr[:, 0].copy(),
        arr[:, 1].copy(),
        arr[:, 3].copy(),
        offset,
        offset != end,
    )


def _gather_be(arr: np.ndarray, positions: np.ndarray, width: int) -> np.ndarray:
    """Big-endian unsigned integers of ``width`` bytes at each position of a uint8 array."""
    idx = positions[:, None] + np.arange(width, dtype=np.int64)
    raw = np.ascontiguousarray(arr[idx])
    return raw.view(f">u{width}").reshape(-1).astype(np.int64)


def _scan_with_index(mv: memoryview, index, verify_crc: bool) -> LedgerScan | None:
    try:
        idx = index if isinstance(index, LedgerIndex) else decode_index(index)
    except StorageError:
        return None
    n = len(idx.offsets)
    if idx.data_end > len(mv):
        return None
    if n == 0:
        return _empty_scan(idx.data_end, idx.data_end != len(mv))
    arr = np.frombuffer(mv, dtype=np.uint8)
    offsets = idx.offsets
    ends = np.empty(n, dtype=np.int64)
    ends[:-1] = offsets[1:]
    ends[-1] = idx.data_end
    lengths = ends - offsets - RECORD_HEADER_SIZE
    if offsets[0] != FILE_HEADER_SIZE or (lengths < 0).any():
        return None
    # the index must agree with the length and entry-id fields of every record
    if not np.array_equal(_gather_be(arr, offsets, 4), lengths):
        return None
    ids = np.arange(n, dtype=np.int64)
    if not np.array_equal(_gather_be(arr, offsets + 8, 8), ids):
        return None
    if verify_crc:
        crcs = _gather_be(arr, offsets + 4, 4).tolist()
        checked = [crc32c(mv[a:b]) for a, b in zip((offsets + _CRC_START).tolist(), ends.tolist())]
        if checked != crcs:
            bad = next(i for i, (x, y) in enumerate(zip(checked, crcs)) if x != y)
            raise StorageError(f"ledger {idx.ledger_id}: entry {bad} fails its CRC32C")
    return LedgerScan(
        ids, offsets.copy(), lengths, idx.publish_times.copy(), idx.data_end, idx.data_end != len(mv)
    )


def read_entry_at(src: Source, offset: int, verify_crc: bool = True) -> tuple[int, int, bytes]:
    """``(entry_id, publish_time_ms, data)`` of the record at ``offset``.

    ``src`` is the file's bytes, a seekable binary file object (e.g. a ``pyarrow`` input
    file) or an OS file descriptor (read with ``pread``, safe from many threads).
    ``StorageError`` when the record is incomplete or fails its CRC.
    """
    head = _read(src, offset, RECORD_HEADER_SIZE)
    if len(head) < RECORD_HEADER_SIZE:
        raise StorageError(f"no complete record at offset {offset}")
    length, crc, eid, pt = _RECORD_HEADER.unpack(head)
    if length > MAX_ENTRY_SIZE:
        raise StorageError(f"record at offset {offset} has an impossible length {length}")
    data = _read(src, offset + RECORD_HEADER_SIZE, length)
    if len(data) < length:
        raise StorageError(f"record at offset {offset} is truncated")
    if verify_crc and crc32c(data, crc32c(head[_CRC_START:])) != crc:
        raise StorageError(f"entry {eid} at offset {offset} fails its CRC32C")
    return eid, pt, data


def read_records(src: Source, start: int, end: int) -> bytes:
    """The raw bytes ``[start, end)`` of a ledger file (a run of whole records)."""
    return _read(src, start, end - start)


def parse_records(
    blob: bytes | memoryview, base_offset: int, offsets, first_entry_id: int, verify_crc: bool = True
) -> list[tuple[int, int, bytes]]:
    """Split a run of records read in one go (``read_records``) into ``(entry_id, publish_ms,
    data)``; ``offsets`` are the file offsets of those records."""
    mv = memoryview(blob)
    out = []
    unpack = _RECORD_HEADER.unpack_from
    for i, off in enumerate(offsets):
        o = int(off) - base_offset
        if o + RECORD_HEADER_SIZE > len(mv):
            raise StorageError(f"record at offset {off} is truncated")
        length, crc, eid, pt = unpack(mv, o)
        stop = o + RECORD_HEADER_SIZE + length
        if stop > len(mv) or eid != first_entry_id + i:
            raise StorageError(f"record at offset {off} is truncated or out of place")
        if verify_crc and crc32c(mv[o + _CRC_START : stop]) != crc:
            raise StorageError(f"entry {eid} at offset {off} fails its CRC32C")
        out.append((eid, pt, bytes(mv[o + RECORD_HEADER_SIZE : stop])))
    return out


def split_records(
    blob: bytes, base_offset: int, offsets, end_offset: int, first_entry_id: int, verify_crc: bool = True
) -> list[bytes]:
    """The entry bytes of a run of consecutive records read in one go (``read_records``),
    given their file ``offsets`` (from the index) and the file offset where the run ends.
    Checks each record's length, entry id and (``verify_crc``) CRC32C; ``StorageError`` if
    any disagrees. The fast path of a managed-ledger read: the header fields are checked with
    numpy, leaving one CRC call and one slice per entry in Python."""
    n = len(offsets)
    if n == 0:
        return []
    rel = np.asarray(offsets, dtype=np.int64) - base_offset
    stops = np.empty(n, dtype=np.int64)
    stops[:-1] = rel[1:]
    stops[-1] = end_offset - base_offset
    if rel[0] < 0 or stops[-1] > len(blob) or (stops - rel < RECORD_HEADER_SIZE).any():
        raise StorageError(f"records from offset {base_offset} are truncated")
    arr = np.frombuffer(blob, dtype=np.uint8)
    if not np.array_equal(_gather_be(arr, rel, 4), stops - rel - RECORD_HEADER_SIZE) or not np.array_equal(
        _gather_be(arr, rel + 8, 8), np.arange(first_entry_id, first_entry_id + n, dtype=np.int64)
    ):
        raise StorageError(f"records from offset {base_offset} do not match the index")
    starts = (rel + RECORD_HEADER_SIZE).tolist()
    ends = stops.tolist()
    if verify_crc:
        mv = memoryview(blob)
        crcs = _gather_be(arr, rel + 4, 4).tolist()
        back = RECORD_HEADER_SIZE - _CRC_START  # the CRC covers entry_id, publish_ms, data
        checked = [crc32c(mv[a - back : b]) for a, b in zip(starts, ends)]
        if checked != crcs:
            bad = next(i for i, (x, y) in enumerate(zip(checked, crcs)) if x != y)
            raise StorageError(f"entry {first_entry_id + bad} at offset {int(offsets[bad])} fails its CRC32C")
    return [blob[a:b] for a, b in zip(starts, ends)]


def _read(src: Source, offset: int, n: int) -> bytes:
    if isinstance(src, int):
        chunks = []
        while n > 0:
            chunk = os.pread(src, n, offset)
            if not chunk:
                break
            chunks.append(chunk)
            n -= len(chunk)
            offset += len(chunk)
        return b"".join(chunks)
    if isinstance(src, (bytes, bytearray, memoryview)):
        return bytes(src[offset : offset + n])
    src.seek(offset)
    return src.read(n)


def read_file(src: BinaryIO) -> bytes:
    """All bytes of an open file object (e.g. ``pyarrow.fs.FileSystem.open_input_file``)."""
    src.seek(0, io.SEEK_SET)
    return src.read()


# --- index ---------------------------------------------------------------------------------


# values converted per step when an index is encoded
_ENCODE_STEP = 1 << 16


def encode_index(ledger_id: int, offsets, publish_times, data_end: int) -> bytearray:
    """The index bytes of a ledger. ``offsets`` and ``publish_times`` are anything sliced into
    int64 values (an array, a ``tail_index.SpillingColumn``); they are converted ``_ENCODE_STEP``
    values at a time straight into the one buffer returned, so sealing a ledger of ``n``
    entries costs ``16 n`` bytes, not five copies of them."""
    n = len(offsets)
    if len(publish_times) != n:
        raise ValueError("offsets and publish_times differ in length")
    out = bytearray(INDEX_HEADER_SIZE + 16 * n)
    body = memoryview(out)[INDEX_HEADER_SIZE:]
    offs = np.frombuffer(body, dtype=">u8", count=n)
    pts = np.frombuffer(body, dtype=">i8", count=n, offset=8 * n)
    for lo in range(0, n, _ENCODE_STEP):
        hi = min(n, lo + _ENCODE_STEP)
        offs[lo:hi] = np.asarray(offsets[lo:hi], dtype=np.int64)
        pts[lo:hi] = np.asarray(publish_times[lo:hi], dtype=np.int64)
    head = _INDEX_HEADER.pack(INDEX_MAGIC, FORMAT_VERSION, 0, ledger_id, n, data_end, crc32c(body))
    del offs, pts, body  # no view may outlive the buffer's export
    out[: _INDEX_HEADER.size] = head
    out[_INDEX_HEADER.size : INDEX_HEADER_SIZE] = struct.pack(">I", crc32c(head))
    return out


def index_pieces(ledger_id: int, offsets, publish_times, data_end: int):
    """A ledger's index as ``(file offset, bytes)`` pieces to write into an empty file: the
    same bytes as ``encode_index``, but no piece larger than ``_ENCODE_STEP`` values is ever in
    memory, so a seal adds nothing of the ledger's size to the process (the body's checksum is
    carried from piece to piece, and the header that holds it comes last, for offset 0)."""
    n = len(offsets)
    if len(publish_times) != n:
        raise ValueError("offsets and publish_times differ in length")
    body_crc = 0
    pos = INDEX_HEADER_SIZE
    for column, dtype in ((offsets, ">u8"), (publish_times, ">i8")):
        for lo in range(0, n, _ENCODE_STEP):
            piece = np.asarray(column[lo : min(n, lo + _ENCODE_STEP)], dtype=np.int64).astype(dtype).tobytes()
            body_crc = crc32c(piece, body_crc)
            yield pos, piece
            pos += len(piece)
    head = _INDEX_HEADER.pack(INDEX_MAGIC, FORMAT_VERSION, 0, ledger_id, n, data_end, body_crc)
    yield 0, head + struct.pack(">I", crc32c(head))


def decode_index_header(buf: bytes | memoryview) -> tuple[int, int, int, int]:
    """(ledger_id, entry_count, data_end, body_crc) of an index's header (its first
    ``INDEX_HEADER_SIZE`` bytes); ``StorageError`` when they are not an intact header."""
    mv = memoryview(buf).cast("B")
    if len(mv) < INDEX_HEADER_SIZE:
        raise StorageError("index file too short")
    head = bytes(mv[: _INDEX_HEADER.size])
    magic, version, _, ledger_id, n, data_end, body_crc = _INDEX_HEADER.unpack(head)
    (head_crc,) = struct.unpack_from(">I", mv, _INDEX_HEADER.size)
    if magic != INDEX_MAGIC or head_crc != crc32c(head) or version != FORMAT_VERSION:
        raise StorageError("not a compactmq ledger index (bad magic, version or checksum)")
    return ledger_id, n, data_end, body_crc


def decode_index(buf: bytes | memoryview) -> LedgerIndex:
    """``StorageError`` when the bytes are not a complete, intact index."""
    mv = memoryview(buf).cast("B")
    ledger_id, n, data_end, body_crc = decode_index_header(mv)
    body = mv[INDEX_HEADER_SIZE:]
    if len(body) != 16 * n or crc32c(body) != body_crc:
        raise StorageError(f"index of ledger {ledger_id} is damaged")
    offsets = np.frombuffer(body, dtype=">u8", count=n).astype(np.int64)
    pts = np.frombuffer(body, dtype=">i8", count=n, offset=8 * n).astype(np.int64)
    return LedgerIndex(ledger_id, offsets, pts, data_end)


def index_path_for(ledger_path: str) -> str:
    """``.../000000000042.log`` -> ``.../000000000042.idx``."""
    root, _ = os.path.splitext(ledger_path)
    return root + ".idx"
