"""Writing compacted ledgers: the one-file writer, the parts and segments phase-two tasks write,
and the object-store manifest of a view written as parts.

The byte layout they produce is described in ``compacted_ledger`` (the format's home, with its
reader); this module only writes it:

* ``PartWriter`` -- what a phase-two task writes: a *part* (records, with the index beside them
  as ``<path>.idx``) or, ``complete=True``, a *segment* of a chain (a whole file with header,
  index and trailer). Records are built in place in ``storage.direct_file.DirectWriter``'s
  aligned buffer, which writes them with direct I/O when asked (chain segments, unless
  ``compactionDirectIO`` is false);
* ``CompactedLedgerWriter`` -- a whole file, entry by entry or part by part
  (``concatenate_parts``, the old one-file build on the driver, kept for tools and tests);
* ``write_manifest`` -- the small object that makes parts uploaded to an object store one ledger.

A file is complete only once its trailer is written and the file fsynced (``_finish_file``).
"""

from __future__ import annotations

import os
import struct
from typing import Iterable, Optional

import numpy as np

from ..errors import StorageError
from ..storage.direct_file import DirectWriter
from ..storage.managed_ledger import fsync_dir
from ..storage.modes import open_private
from .compacted_ledger import (
    _PART_ENTRY,
    HEADER,
    INDEX_DTYPE,
    MANIFEST,
    MANIFEST_NAME,
    RECORD_HEADER,
    TRAILER,
    TRAILER_MAGIC,
    _crc32c,
)


class CompactedLedgerWriter:
    """Writes one compacted ledger file. ``finish()`` writes index and trailer, then fsyncs.

    Local paths only for writing (``fsync`` is what makes the commit that follows safe).
    """

    def __init__(self, path: str):
        self.path = path
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        self._f = open_private(path)
        self._f.write(HEADER)
        self._offset = len(HEADER)
        self._index: list[np.ndarray] = []
        self._pending: list[tuple] = []
        self._last: Optional[tuple] = None
        self.count = 0

    def append(self, ledger_id: int, entry_id: int, data: bytes) -> None:
        pos = (ledger_id, entry_id)
        if self._last is not None and pos <= self._last:
            raise StorageError(f"compacted ledger ids must increase: {pos} after {self._last}")
        self._last = pos
        self._f.write(RECORD_HEADER.pack(len(data), ledger_id, entry_id))
        self._f.write(data)
        self._pending.append((ledger_id, entry_id, self._offset, len(data)))
        self._offset += RECORD_HEADER.size + len(data)
        self.count += 1

    def append_part(self, records_path: str, index: np.ndarray) -> None:
        """Append a part written by ``PartWriter``: its records are copied as they are, its index
        (offsets relative to the part) is shifted to this file."""
        if len(index) == 0:
            return
        self._flush_pending()
        first = (int(index["ledger_id"][0]), int(index["entry_id"][0]))
        if self._last is not None and first <= self._last:
            raise StorageError(f"compacted ledger ids must increase: {first} after {self._last}")
        self._f.flush()
        with open(records_path, "rb") as src:
            size = os.fstat(src.fileno()).st_size
            _copy_range(src.fileno(), self._f.fileno(), size)
        shifted = index.copy()
        shifted["offset"] = shifted["offset"].astype(np.uint64) + np.uint64(self._offset)
        self._index.append(shifted)
        self._offset += size
        self._f.seek(self._offset)
        self.count += len(index)
        self._last = (int(index["ledger_id"][-1]), int(index["entry_id"][-1]))

    def _flush_pending(self) -> None:
        if self._pending:
            self._index.append(np.array(self._pending, dtype=INDEX_DTYPE))
            self._pending = []

    def finish(self) -> None:
        """Write index and trailer and make the file durable (flush, fsync file and directory)."""
        self._flush_pending()
        _finish_file(self._f, self._offset, _joined_index(self._index))
        fsync_dir(os.path.dirname(self.path) or ".")

    def abort(self) -> None:
        self._f.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def _joined_index(blocks: list) -> np.ndarray:
    """Index blocks as one index array in the file's big-endian layout, copied once into place
    (``np.concatenate`` would return native byte order, and converting back is a second copy)."""
    out = np.empty(sum(len(b) for b in blocks), INDEX_DTYPE)
    at = 0
    for block in blocks:
        out[at : at + len(block)] = block
        at += len(block)
    return out


def _index_tail(index_offset: int, index: np.ndarray) -> bytes:
    """What follows the records (which end at ``index_offset``): the index, then the trailer."""
    raw = index.tobytes()
    return raw + _trailer(index_offset, len(index), raw)


def _trailer(index_offset: int, count: int, raw_index) -> bytes:
    return TRAILER.pack(index_offset, count, _crc32c(raw_index), 0, TRAILER_MAGIC)


def _finish_file(f, index_offset: int, index: np.ndarray) -> None:
    """Write ``index`` and the trailer after the records, make the file durable and close it:
    from then on it is a complete compacted ledger. The index is written from its own memory
    (the bytes ``_index_tail`` gives, without copying them twice)."""
    raw = memoryview(np.ascontiguousarray(index)).cast("B")
    f.write(raw)
    f.write(_trailer(index_offset, len(index), raw))
    if isinstance(f, DirectWriter):
        f.close()  # fsyncs
        return
    f.flush()
    os.fsync(f.fileno())
    f.close()


def _copy_range(src_fd: int, dst_fd: int, size: int) -> None:
    copied = 0
    while copied < size:
        try:
            n = os.copy_file_range(src_fd, dst_fd, size - copied)
        except (AttributeError, OSError):
            n = 0
        if n == 0:  # fall back to a plain copy
            os.lseek(src_fd, copied, os.SEEK_SET)
            while True:
                chunk = os.read(src_fd, 1 << 22)
                if not chunk:
                    return
                os.write(dst_fd, chunk)
        copied += n


class PartWriter:
    """Records of a contiguous id range, written by one phase-two task.

    By default a *part* of a manifest-of-parts ledger (no header, no trailer): the index goes next
    to the records as ``<path>.idx`` (raw ``INDEX_DTYPE`` rows, offsets relative to the part).
    With ``complete=True`` a *segment* of a chain (``chain``): a whole compacted-ledger file
    (header, records, index, trailer), flushed and fsynced by ``close``."""

    def __init__(self, path: str, complete: bool = False, direct: bool = False):
        self.path = path
        self.complete = complete
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        # the records are built in the writer's own aligned buffer and written from there
        # (``storage.direct_file``; with ``direct``, bypassing the page cache where allowed)
        self._f = DirectWriter(path, direct=direct)
        self._offset = 0
        if complete:
            self._f.write(HEADER)
            self._offset = len(HEADER)
        self._blocks: list[np.ndarray] = []

    def append(self, ledger_id: int, entry_id: int, data) -> None:
        n = len(data)
        self._f.write(RECORD_HEADER.pack(n, ledger_id, entry_id))
        self._f.write(data)
        self._blocks.append(np.array([(ledger_id, entry_id, self._offset, n)], dtype=INDEX_DTYPE))
        self._offset += RECORD_HEADER.size + n

    def append_many(self, ledger_ids, entry_ids, blobs: list) -> None:
        for lid, eid, data in zip(ledger_ids, entry_ids, blobs):
            self.append(int(lid), int(eid), data)

    def append_ranges(
        self, ledger_id: int, entry_ids, buf: np.ndarray, src, lens, extra: np.ndarray, extra_off
    ) -> int:
        """Append, in one write, the entries whose bytes are ``buf[src[i]:+lens[i]]`` or (when
        ``extra_off[i] >= 0``) ``extra[extra_off[i]:+lens[i]]``; entries with ``lens[i] < 0`` are
        skipped. Returns how many were written."""
        from .entry_scan import copy_ranges

        keep = np.flatnonzero(np.asarray(lens) >= 0)
        if not keep.size:
            return 0
        eids = np.asarray(entry_ids, np.int64)[keep]
        ln = np.asarray(lens, np.int64)[keep]
        src = np.asarray(src, np.int64)[keep]
        xo = np.asarray(extra_off, np.int64)[keep]
        hsize = RECORD_HEADER.size
        rec = hsize + ln
        starts = np.zeros(len(keep), np.int64)
        np.cumsum(rec[:-1], out=starts[1:])
        size = int(rec.sum())
        out = self._f.reserve(size)
        hdr = np.empty(len(keep), dtype=[("length", ">u4"), ("ledger_id", ">i8"), ("entry_id", ">i8")])
        hdr["length"], hdr["ledger_id"], hdr["entry_id"] = ln, ledger_id, eids
        copy_ranges(out, starts, hdr.view(np.uint8), np.arange(len(keep)) * hsize, np.full(len(keep), hsize))
        in_buf = xo < 0
        copy_ranges(out, starts[in_buf] + hsize, buf, src[in_buf], ln[in_buf])
        copy_ranges(out, starts[~in_buf] + hsize, extra, xo[~in_buf], ln[~in_buf])
        del out
        self._f.commit()
        rows = np.empty(len(keep), INDEX_DTYPE)
        rows["ledger_id"], rows["entry_id"] = ledger_id, eids
        rows["offset"], rows["length"] = starts + self._offset, ln
        self._blocks.append(rows)
        self._offset += size
        return len(keep)

    def close(self) -> int:
        index = _joined_index(self._blocks)  # blocks in file order
        if self.complete:
            _finish_file(self._f, self._offset, index)
            return len(index)
        self._f.close(sync=False)
        with open_private(self.path + ".idx") as f:
            f.write(index.tobytes())
        return len(index)


def write_manifest(store, prefix: str, parts: list[dict]) -> tuple[str, int, int]:
    """Commit-ready manifest of a compacted ledger whose parts (``{"path": object key, ...}``
    in id order, uploaded by phase-two tasks, with their ``.idx`` objects) live in ``store``
    under ``prefix``. Returns ``(manifest key, ledger size in bytes, entry count)``."""
    names, sizes, index = [], [], []
    offset = len(HEADER)
    last = None
    for part in parts:
        key = part["path"]
        raw_idx = bytes(store.read_all(key + ".idx"))
        if len(raw_idx) % INDEX_DTYPE.itemsize:
            raise StorageError(
                f"part index {key}.idx has {len(raw_idx)} bytes, not whole rows "
                f"(objects: {store.list(key.rsplit('/', 1)[0])}; {raw_idx[:64]!r})"
            )
        idx = np.frombuffer(raw_idx, dtype=INDEX_DTYPE)
        if len(idx) == 0:
            continue
        first = (int(idx["ledger_id"][0]), int(idx["entry_id"][0]))
        if last is not None and first <= last:
            raise StorageError(f"compacted ledger ids must increase: {first} after {last}")
        last = (int(idx["ledger_id"][-1]), int(idx["entry_id"][-1]))
        size = store.size(key)
        shifted = idx.copy()
        shifted["offset"] = shifted["offset"].astype(np.uint64) + np.uint64(offset)
        index.append(shifted)
        names.append(key.rsplit("/", 1)[-1])
        sizes.append(size)
        offset += size
    rows = _joined_index(index)
    tail = _index_tail(offset, rows)
    out = [MANIFEST, struct.pack(">I", len(names))]
    for name, size in zip(names, sizes):
        enc = name.encode()
        out += [_PART_ENTRY.pack(size, len(enc)), enc]
    out.append(tail)
    key = f"{prefix}/{MANIFEST_NAME}"
    store.put(key, out)
    return key, offset + len(tail), len(rows)


def read_part_index(path: str) -> np.ndarray:
    with open(path + ".idx", "rb") as f:
        return np.frombuffer(f.read(), dtype=INDEX_DTYPE)


def concatenate_parts(path: str, parts: Iterable[str]) -> int:
    """Build compacted ledger ``path`` from part files given in id order; returns the entry count."""
    writer = CompactedLedgerWriter(path)
    try:
        for part in parts:
            writer.append_part(part, read_part_index(part))
        writer.finish()
    except BaseException:
        writer.abort()
        raise
    return writer.count
