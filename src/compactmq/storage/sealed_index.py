"""A sealed ledger's index, read piece by piece from its index file instead of held whole.

A sealed ledger's index (``ledger_file``: a header, then ``n`` record offsets and ``n`` publish
times, 8 bytes each) used to be loaded whole the first time a reader touched the ledger: 16
bytes an entry. A ledger rolls over only after ``managedLedgerMinLedgerRolloverTimeMinutes``
(10 by default), so a busy topic's sealed ledger holds a million entries; a consumer a few
thousand entries behind at the rollover, or a stats call sizing its backlog, then made the
broker load ~15 MiB per topic to read the ledger's last few entries, and every busy topic did
so at each rollover (the 10-minute soak: RSS flat for 600 s, then +60 % at the first rollover).

``SealedColumn`` is one of those two columns, over the index file: ``col[i]`` and ``col[a:b]``
read the ``CHUNK``-value pieces they need (one ranged read each: ``LedgerStorage.
read_index_range``; the page cache usually has them) and keep the last ``CACHED_CHUNKS`` of
them, so a sealed ledger's index costs at most ``2 * CACHED_CHUNKS * CHUNK * 8`` bytes (128
KiB) however many entries it has, and a reader walking the ledger forward reads each piece
once. ``open_columns`` checks the index as ``ledger_file.decode_index`` does (header checksum,
ledger id, entry count, the body's checksum computed over ranged reads of ``VERIFY_PIECE``
bytes, never holding the body) and returns None for a missing or damaged one, which the
caller rebuilds as before.

Only storages whose ranged reads of an index are cheap use this (``LedgerStorage.
ranged_index_reads``: local files); the others still load an index whole. Nothing here is
written: a sealed ledger's index never changes while its ledger exists.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable

import numpy as np
from crc32c import crc32c

from ..errors import StorageError
from . import ledger_file as lf

# values per piece read (32 KiB of int64, as the open ledger's spilled chunks)
CHUNK = 4096
# pieces kept per column (a reader moves forward; two cover a read that straddles pieces)
CACHED_CHUNKS = 2
# bytes per ranged read while checking the body's checksum
VERIFY_PIECE = 1 << 20
_ITEM = 8

# ``read(offset, length) -> bytes``: a ranged read of one ledger's index (short at its end)
RangeRead = Callable[[int, int], bytes]


class SealedColumn:
    """``n`` big-endian int64 values at byte ``base`` of an index, read on demand (see the
    module docstring). Used like the ``np.ndarray`` it replaces: ``len``, ``col[i]``
    (negative too), ``col[a:b]`` (an int64 array), ``np.asarray(col)``. Not thread-safe: the
    ledger list's lock covers every use."""

    __slots__ = ("_read", "_base", "_n", "_dtype", "_cache", "_last")

    def __init__(self, read: RangeRead, base: int, n: int, dtype: str) -> None:
        self._read = read
        self._base = base
        self._n = n
        self._dtype = np.dtype(dtype)  # ">u8" offsets, ">i8" publish times
        self._cache: OrderedDict[int, np.ndarray] = OrderedDict()
        self._last = -1  # the piece used last (always in the cache)

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, key: Any) -> Any:
        if key.__class__ is int and 0 <= key < self._n:  # the common case first: one value
            return self._chunk(key // CHUNK).item(key % CHUNK)
        if isinstance(key, slice):
            start, stop, step = key.indices(self._n)
            if step != 1:
                raise ValueError("SealedColumn slices take no step")
            return self._range(start, max(start, stop))
        i = int(key)
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError("SealedColumn index out of range")
        return self._chunk(i // CHUNK).item(i % CHUNK)

    def _range(self, lo: int, hi: int) -> np.ndarray:
        """Values ``[lo, hi)`` as a new int64 array."""
        if lo >= hi:
            return np.zeros(0, np.int64)
        if lo // CHUNK == (hi - 1) // CHUNK:  # within one piece: no concatenation
            c = lo // CHUNK
            return self._chunk(c)[lo - c * CHUNK : hi - c * CHUNK].copy()
        if hi - lo > CACHED_CHUNKS * CHUNK:  # a long range: one read, nothing cached
            return self._fetch(lo, hi)
        parts = []
        i = lo
        while i < hi:
            c = i // CHUNK
            upto = min(hi, (c + 1) * CHUNK)
            parts.append(self._chunk(c)[i - c * CHUNK : upto - c * CHUNK])
            i = upto
        return np.concatenate(parts)

    def _fetch(self, lo: int, hi: int) -> np.ndarray:
        want = (hi - lo) * _ITEM
        raw = self._read(self._base + lo * _ITEM, want)
        if len(raw) != want:
            raise OSError(f"ledger index is short ({len(raw)} of {want} bytes at value {lo})")
        return np.frombuffer(raw, dtype=self._dtype).astype(np.int64)

    def _chunk(self, c: int) -> np.ndarray:
        cache = self._cache
        if self._last == c:  # the piece used last (a reader walking forward): no reordering
            return cache[c]
        chunk = cache.get(c)
        if chunk is not None:
            cache.move_to_end(c)
            self._last = c
            return chunk
        chunk = self._fetch(c * CHUNK, min(self._n, (c + 1) * CHUNK))
        cache[c] = chunk
        while len(cache) > CACHED_CHUNKS:
            cache.popitem(last=False)
        self._last = c
        return chunk

    @property
    def cached_bytes(self) -> int:
        """Bytes of index this column holds in memory now."""
        return sum(c.nbytes for c in self._cache.values())

    def to_numpy(self) -> np.ndarray:
        """Every value, as one int64 array (an offload copies the whole index)."""
        return self._fetch(0, self._n) if self._n else np.zeros(0, np.int64)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self.to_numpy()
        return out if dtype is None else out.astype(dtype, copy=False)


def open_columns(
    read: RangeRead, ledger_id: int, count: int
) -> tuple[SealedColumn, SealedColumn, int] | None:
    """(offsets, publish times, data end) of a sealed ledger whose index ``read`` reads, after
    checking it; None when the index is missing, damaged or not this ledger's with ``count``
    entries (the caller rebuilds it)."""
    try:
        head = read(0, lf.INDEX_HEADER_SIZE)
        index_ledger, n, data_end, body_crc = lf.decode_index_header(head)
    except (OSError, StorageError):
        return None
    if index_ledger != ledger_id or n != count:
        return None
    body = 16 * n
    crc = 0
    at = 0
    try:
        while at < body:
            piece = read(lf.INDEX_HEADER_SIZE + at, min(VERIFY_PIECE, body - at))
            if not piece:
                return None
            crc = crc32c(piece, crc)
            at += len(piece)
        if read(lf.INDEX_HEADER_SIZE + body, 1):  # bytes past the body: not an index we wrote
            return None
    except OSError:
        return None
    if crc != body_crc:
        return None
    base = lf.INDEX_HEADER_SIZE
    return SealedColumn(read, base, n, ">u8"), SealedColumn(read, base + 8 * n, n, ">i8"), data_end
