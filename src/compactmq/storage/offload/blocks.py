"""How a sealed ledger lies in the object store, and how its entries are read back.

An offloaded ledger is two immutable objects, named with a fresh uuid per offload attempt::

    ledgers/<topic path>/<ledger id>-<uuid>.data    the ledger file, byte for byte (header + records)
    ledgers/<topic path>/<ledger id>-<uuid>.index   the block index (below)

The data object keeps the ledger file format of ``ledger_file`` -- every record keeps its CRC32C,
so a read from the object store is checked exactly like a read from disk, and a Spark task scans
a downloaded ledger with the same functions.

It is written in *blocks* of at most ``s3ManagedLedgerOffloadMaxBlockSizeInBytes``, each ending
on a record boundary (a record larger than a block gets a block of its own); a block is one part
of the multipart upload. The index object (all integers big-endian)::

    header (48 bytes)
        magic        8 bytes  b"CMQOIDX1"
        version      u16      1
        reserved     u16      0
        ledger_id    u64
        block_count  u32
        data_size    u64      size of the data object
        body_size    u64
        body_crc     u32      CRC32C of the body
    body
        blocks       block_count x (first_entry u64, offset u64, length u64)
        ledger index the ledger's ``.idx`` bytes (``ledger_file.encode_index``): entry offsets
                     and publish times

Reading: the index says where every entry's record starts, so a read of entries [a, b) is the
byte range [offset(a), offset(b)) of the data object: ONE ranged GET, never the whole object.
Ranges are fetched and cached in aligned chunks of ``s3ManagedLedgerOffloadReadBufferSizeInBytes``
(``ReadCache``, least recently used out first), so a sequential reader costs one request per
chunk and a reader that re-reads (a consumer redelivery, a second subscription) none.

The same ranged reads serve any other immutable object whose reader knows where its records are:
``RangedObject`` is one object read this way, opened from the URI ``OffloadLocation.url`` gives
(``open_url``), through the process's one ``ReadCache`` (``shared_cache``). An offloaded compacted
ledger is read so (``compaction.compacted_ledger`` finds its index from its trailer), so a reader
seeking into the middle of a large compacted view fetches a chunk or two, never the object.
"""

from __future__ import annotations

import struct
import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
from crc32c import crc32c

from ...errors import StorageError
from .. import ledger_file as lf
from .blobstore import location_from_url, open_store

INDEX_MAGIC = b"CMQOIDX1"
VERSION = 1
_HEADER = struct.Struct(">8sHHQIQQI")
_BLOCK = np.dtype([("first_entry", ">u8"), ("offset", ">u8"), ("length", ">u8")])


@dataclass(frozen=True)
class OffloadedIndex:
    ledger_id: int
    data_size: int
    blocks: np.ndarray  # _BLOCK rows
    ledger_index: lf.LedgerIndex


def plan_blocks(offsets: np.ndarray, data_end: int, max_block: int) -> np.ndarray:
    """Block table of a ledger whose records start at ``offsets`` and end at ``data_end``: every
    block ends on a record boundary and holds at most ``max_block`` bytes unless one record is
    larger. Block 0 starts at 0 (the file header)."""
    n = len(offsets)
    rows = []
    start, first = 0, 0
    bounds = np.append(np.asarray(offsets, np.int64), data_end)
    k = 0
    while k < n:
        # the furthest record end within max_block of the block start (at least one record)
        stop = int(np.searchsorted(bounds, start + max_block, side="right")) - 1
        stop = max(stop, k + 1)
        end = int(bounds[min(stop, n)])
        rows.append((first, start, end - start))
        start, first, k = end, min(stop, n), min(stop, n)
    if not rows:
        rows.append((0, 0, data_end))
    return np.array(rows, dtype=_BLOCK)


def encode_index(ledger_id: int, blocks: np.ndarray, ledger_index_bytes: bytes, data_size: int) -> bytes:
    body = blocks.astype(_BLOCK).tobytes() + ledger_index_bytes
    return (
        _HEADER.pack(INDEX_MAGIC, VERSION, 0, ledger_id, len(blocks), data_size, len(body), crc32c(body))
        + body
    )


def decode_index(buf) -> OffloadedIndex:
    mv = memoryview(buf).cast("B")
    if len(mv) < _HEADER.size:
        raise StorageError("offloaded ledger index is too short")
    magic, version, _, ledger_id, nblocks, data_size, body_size, crc = _HEADER.unpack_from(mv)
    body = mv[_HEADER.size :]
    if magic != INDEX_MAGIC or version != VERSION or len(body) != body_size or crc32c(body) != crc:
        raise StorageError(f"offloaded index of ledger {ledger_id} is damaged or not ours")
    blocks = np.frombuffer(body, dtype=_BLOCK, count=nblocks)
    idx = lf.decode_index(body[nblocks * _BLOCK.itemsize :])
    if idx.ledger_id != ledger_id:
        raise StorageError(f"offloaded index names ledger {idx.ledger_id}, expected {ledger_id}")
    return OffloadedIndex(ledger_id, int(data_size), blocks, idx)


def iter_blocks(src_fd: int, blocks: np.ndarray):
    """The bytes of each block of a local ledger file, in order (read with ``pread``)."""
    for b in blocks:
        off, length = int(b["offset"]), int(b["length"])
        data = lf.read_records(src_fd, off, off + length)
        if len(data) != length:
            raise StorageError(f"ledger file ended at {off + len(data)}, expected {off + length}")
        yield data


class ReadCache:
    """Recently read chunks of offloaded objects, bounded in bytes (one per process, see
    ``shared_cache``). Keys are ``(object id, chunk number)``; an object id is
    ``(OffloadLocation, key)``, so objects of two stores never share an entry."""

    def __init__(self, capacity_bytes: int):
        self.capacity = max(0, int(capacity_bytes))
        self._lock = threading.Lock()
        self._chunks: OrderedDict[tuple, bytes] = OrderedDict()
        self.size = 0
        self.hits = self.misses = 0

    def resize(self, capacity_bytes: int) -> None:
        with self._lock:
            self.capacity = max(0, int(capacity_bytes))
            self._evict()

    def clear(self) -> None:
        """Drop every chunk and zero the counters (benchmarks measure cold reads)."""
        with self._lock:
            self._chunks.clear()
            self.size = 0
            self.hits = self.misses = 0

    def _evict(self) -> None:
        while self.size > self.capacity and self._chunks:
            _, dropped = self._chunks.popitem(last=False)
            self.size -= len(dropped)

    def get(self, key: tuple) -> bytes | None:
        with self._lock:
            data = self._chunks.get(key)
            if data is not None:
                self._chunks.move_to_end(key)
                self.hits += 1
            else:
                self.misses += 1
            return data

    def put(self, key: tuple, data: bytes) -> None:
        if len(data) > self.capacity:
            return
        with self._lock:
            old = self._chunks.pop(key, None)
            if old is not None:
                self.size -= len(old)
            self._chunks[key] = data
            self.size += len(data)
            self._evict()

    def drop_object(self, object_id: tuple) -> None:
        with self._lock:
            for k in [k for k in self._chunks if k[0] == object_id]:
                self.size -= len(self._chunks.pop(k))


# the process's read cache and chunk size: the broker's offloader sets them from its config
# (``configure_reads``); a process without one (a Spark executor, a tool) keeps these defaults,
# which are the config's
_shared = ReadCache(64 * 1024 * 1024)
_chunk = 1024 * 1024


def configure_reads(cache_bytes: int, chunk: int) -> None:
    """Size the process's read cache and its chunks (``managedLedgerOffloadReadCacheSizeInBytes``,
    ``s3ManagedLedgerOffloadReadBufferSizeInBytes``)."""
    global _chunk
    _shared.resize(cache_bytes)
    _chunk = max(4096, int(chunk))


def shared_cache() -> ReadCache:
    return _shared


def read_buffer_size() -> int:
    return _chunk


def object_id(store, key: str) -> tuple:
    """The cache's name for object ``key`` of ``store``."""
    return (store.location, key)


def read_range(store, cache: ReadCache, key: str, size: int, lo: int, hi: int, chunk: int) -> bytes:
    """Bytes ``[lo, hi)`` of object ``key`` (``size`` bytes long) through ``cache``: the chunks
    missing from the cache are fetched with ONE ranged read covering them all."""
    if hi <= lo:
        return b""
    chunk = max(4096, int(chunk))
    oid = object_id(store, key)
    c0, c1 = lo // chunk, (hi - 1) // chunk
    parts: dict[int, bytes] = {}
    missing = []
    for c in range(c0, c1 + 1):
        data = cache.get((oid, c))
        if data is None:
            missing.append(c)
        else:
            parts[c] = data
    if missing:
        f0, f1 = missing[0] * chunk, min(size, (missing[-1] + 1) * chunk)
        blob = store.read_range(key, f0, f1 - f0, size)
        for c in range(missing[0], missing[-1] + 1):
            piece = blob[(c - missing[0]) * chunk : (c - missing[0] + 1) * chunk]
            parts[c] = piece
            cache.put((oid, c), piece)
    if c0 == c1:
        start = lo - c0 * chunk
        return parts[c0][start : start + (hi - lo)]
    joined = b"".join(parts[c] for c in range(c0, c1 + 1))
    start = lo - c0 * chunk
    return joined[start : start + (hi - lo)]


class RangedObject:
    """One immutable object of a store, read by ranges through the process's ``ReadCache``
    (``read``), or with one uncached ranged read (``read_direct``: metadata the caller keeps
    decoded, which would only push data out of the cache)."""

    def __init__(self, store, key: str, size: int | None = None, chunk: int | None = None):
        self.store = store
        self.key = key
        self.size = store.size(key) if size is None else int(size)
        self.chunk = read_buffer_size() if chunk is None else max(4096, int(chunk))

    def __len__(self) -> int:
        return self.size

    def read(self, lo: int, hi: int) -> bytes:
        hi = min(hi, self.size)
        return read_range(self.store, shared_cache(), self.key, self.size, lo, hi, self.chunk)

    def read_direct(self, lo: int, hi: int) -> bytes:
        hi = min(hi, self.size)
        return self.store.read_range(self.key, lo, hi - lo, self.size) if hi > lo else b""

    def read_meta(self, lo: int, hi: int) -> bytes:
        """Metadata bytes: through the cache when they fit in a chunk (the chunk is likely
        read for the data next to them anyway), else one direct read."""
        return self.read(lo, hi) if hi - lo <= self.chunk else self.read_direct(lo, hi)

    def sibling(self, name: str, size: int | None = None) -> "RangedObject":
        """The object ``name`` beside this one (same store and directory)."""
        base = self.key.rsplit("/", 1)[0] + "/" if "/" in self.key else ""
        return RangedObject(self.store, base + name, size, self.chunk)

    def whole(self):
        """The whole object (one read, uncached), as a ``pyarrow.Buffer``."""
        return self.store.read_all(self.key)


def open_url(url: str, size: int | None = None) -> RangedObject:
    """The object named by ``url`` (what ``OffloadLocation.url`` gives), read by ranges. The
    size comes from one metadata request unless given."""
    location, key = location_from_url(url)
    return RangedObject(open_store(location), key, size)
