"""The open ledger's index, with memory that does not grow with the entries written.

While a ledger is written, the broker keeps each entry's record offset and publish time (8
bytes each) so that reads of the ledger need no scan. Held in memory as a growing array, that
is 16 bytes per entry until the ledger rolls over -- and a ledger rolls only once it is older
than ``managedLedgerMinLedgerRolloverTimeMinutes`` (10 minutes by default), so at 20 k msg/s a
topic would hold ~190 MB of index, and every busy topic that stays loaded keeps its share:
resident memory grew round after round.

``SpillingColumn`` is one such column (offsets, or publish times). Values are appended to an
in-memory tail; each time the tail holds ``CHUNK`` values, that chunk is written (one
``pwrite``, native int64) to an anonymous temporary file beside the ledgers and dropped from
memory. Reading a value or a range finds it in the tail or reads its chunk back (``pread``; the
page cache usually has it), keeping the last few chunks read in a small cache. So a column
costs at most the tail plus ``CACHED_CHUNKS`` chunks of memory however long the ledger grows,
and appending costs one write per ``CHUNK`` entries. A ledger's two columns share one file
(``column_pair``, ``SpillFile``): one file descriptor per open ledger that has spilled.

Nothing here is durable, nor needs to be: the file has no name (``tempfile.TemporaryFile``),
disappears with the process, and a ledger left open by a crash is recovered by scanning its
records (``recovery``), exactly as before. When the ledger is sealed the appender turns the
column into one numpy array (``to_numpy``) to write the ledger's index file, then closes it.

Callers use a column like the ``array('q')`` it replaces, under the ledger list's lock:
``len``, ``append``, ``frombytes`` (native int64 bytes), ``col[i]`` (negative too),
``col[a:b]`` (an int64 numpy array), ``del col[k:]`` (cut back after a failed write), and
``np.asarray(col)``.
"""

from __future__ import annotations

import os
import tempfile
from array import array
from collections import OrderedDict
from typing import Any

import numpy as np

# values per spilled chunk (32 KiB of int64); the tail never holds more than this
CHUNK = 4096
# chunks read back that stay in memory (readers of a ledger mostly move forward)
CACHED_CHUNKS = 2
_ITEM = 8


class SpillFile:
    """The anonymous file the columns of one ledger share (one file descriptor per spilled
    ledger, not one per column): column ``lane`` of ``lanes`` keeps its chunk ``c`` at chunk
    slot ``c * lanes + lane``. Opened at the first spill, closed when every column let go."""

    __slots__ = ("_dir", "fd", "_users")

    def __init__(self, spill_dir: str | None = None, users: int = 1) -> None:
        self._dir = spill_dir
        self.fd = -1
        self._users = users

    def open(self) -> int:
        if self.fd < 0:
            f = tempfile.TemporaryFile(dir=self._dir)
            self.fd = os.dup(f.fileno())  # an fd for pread/pwrite, no Python buffering
            f.close()
        return self.fd

    def release(self) -> None:
        self._users -= 1
        if self._users <= 0 and self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)

    def __del__(self) -> None:
        if getattr(self, "fd", -1) >= 0:
            try:
                os.close(self.fd)
            except OSError:
                pass


def column_pair(spill_dir: str | None = None) -> tuple["SpillingColumn", "SpillingColumn"]:
    """Two columns (a ledger's offsets and publish times) sharing one spill file."""
    f = SpillFile(spill_dir, users=2)
    return SpillingColumn(file=f, lane=0, lanes=2), SpillingColumn(file=f, lane=1, lanes=2)


class SpillingColumn:
    """An append-only int64 column whose full chunks live in an anonymous file (see the
    module docstring). Not thread-safe: the ledger list's lock covers every use."""

    __slots__ = ("_file", "_lane", "_lanes", "_spilled", "_tail", "_cache", "_closed")

    def __init__(
        self, spill_dir: str | None = None, *, file: SpillFile | None = None, lane: int = 0, lanes: int = 1
    ) -> None:
        self._file = file if file is not None else SpillFile(spill_dir)
        self._lane, self._lanes = lane, lanes
        self._closed = False
        self._spilled = 0  # values in the file (a multiple of CHUNK)
        self._tail = array("q")
        self._cache: OrderedDict[int, np.ndarray] = OrderedDict()

    def __len__(self) -> int:
        return self._spilled + len(self._tail)

    @property
    def spilled(self) -> int:
        """Values held in the file rather than in memory."""
        return self._spilled

    # --- appending -------------------------------------------------------------------------

    def append(self, value: int) -> None:
        tail = self._tail
        tail.append(value)
        if len(tail) >= CHUNK:
            self._spill()

    def frombytes(self, data: bytes) -> None:
        """Append native int64 values given as bytes (``array.frombytes``)."""
        self._tail.frombytes(data)
        if len(self._tail) >= CHUNK:
            self._spill()

    def _spill(self) -> None:
        tail = self._tail
        full = len(tail) // CHUNK * CHUNK
        fd = self._file.open()
        raw = memoryview(tail)[:full].tobytes()
        for k in range(0, full, CHUNK):  # each chunk to its slot
            data = raw[k * _ITEM : (k + CHUNK) * _ITEM]
            offset = self._slot(self._spilled // CHUNK)
            while data:
                n = os.pwrite(fd, data, offset)
                data, offset = data[n:], offset + n
            self._spilled += CHUNK
        del tail[:full]

    def _slot(self, c: int) -> int:
        """File offset of this column's chunk ``c``."""
        return (c * self._lanes + self._lane) * CHUNK * _ITEM

    # --- reading ---------------------------------------------------------------------------

    def __getitem__(self, key: Any) -> Any:
        if key.__class__ is int and key >= 0:  # the common case first: one value
            s = self._spilled
            if key >= s:
                return self._tail[key - s]  # IndexError past the end, like an array
            return self._chunk(key // CHUNK).item(key % CHUNK)
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self))
            if step != 1:
                raise ValueError("SpillingColumn slices take no step")
            return self._range(start, max(start, stop))
        n = len(self)
        i = int(key)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("SpillingColumn index out of range")
        if i >= self._spilled:
            return self._tail[i - self._spilled]
        return int(self._chunk(i // CHUNK)[i % CHUNK])

    def _range(self, lo: int, hi: int) -> np.ndarray:
        """Values ``[lo, hi)`` as a new int64 array."""
        parts = []
        i = lo
        while i < hi and i < self._spilled:
            c = i // CHUNK
            upto = min(hi, (c + 1) * CHUNK)
            parts.append(self._chunk(c)[i - c * CHUNK : upto - c * CHUNK])
            i = upto
        if i < hi:
            t = self._spilled
            parts.append(np.frombuffer(self._tail, dtype=np.int64)[i - t : hi - t])
        if not parts:
            return np.zeros(0, np.int64)
        return np.concatenate(parts) if len(parts) > 1 else parts[0].copy()

    def _chunk(self, c: int) -> np.ndarray:
        cache = self._cache
        chunk = cache.get(c)
        if chunk is not None:
            cache.move_to_end(c)
            return chunk
        want = CHUNK * _ITEM
        raw = b""
        while len(raw) < want:
            got = os.pread(self._file.fd, want - len(raw), self._slot(c) + len(raw))
            if not got:
                raise OSError(f"spilled index chunk {c} is short ({len(raw)} of {want} bytes)")
            raw += got
        chunk = np.frombuffer(raw, dtype=np.int64)
        cache[c] = chunk
        while len(cache) > CACHED_CHUNKS:
            cache.popitem(last=False)
        return chunk

    def to_numpy(self) -> np.ndarray:
        """Every value, as one int64 array (sealing writes the ledger's index from it)."""
        return self._range(0, len(self))

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self.to_numpy()
        return out if dtype is None else out.astype(dtype, copy=False)

    # --- cutting back and closing ----------------------------------------------------------

    def __delitem__(self, key: Any) -> None:
        """Only ``del col[k:]``: drop the values from ``k`` on (a write that failed)."""
        if not isinstance(key, slice) or key.stop is not None or key.step is not None:
            raise TypeError("SpillingColumn supports only del col[k:]")
        k = key.indices(len(self))[0]
        if k >= self._spilled:
            del self._tail[k - self._spilled :]
            return
        c = k // CHUNK  # bring chunk c back into the tail, then cut
        kept = self._chunk(c)[: k - c * CHUNK]
        self._tail = array("q", kept.tobytes())
        self._spilled = c * CHUNK
        self._cache.clear()  # the file keeps the old chunks' bytes: overwritten by the next spill

    def close(self) -> None:
        """Release the spill file (once every column sharing it did) and the cached chunks;
        read what you need (``to_numpy``) first."""
        self._cache.clear()
        if not self._closed:
            self._closed = True
            self._file.release()
