"""Where the bytes of a compacted ledger come from: memory, a local file, one object, or parts.

``compacted_ledger.CompactedLedgerReader`` reads a view through one small interface whatever
holds its bytes -- ``size``, ``read(lo, hi)``, ``read_meta(lo, hi)`` (the index and trailer, which
an object store caches apart) and ``whole()``:

* ``InMemory``: bytes in memory or memory-mapped (a local file, read with ``read_file_bytes``
  through ``pyarrow.fs``, so a Spark executor reads shared storage the same way);
* ``OneObject``: a compacted ledger offloaded as one object, read by ranges through the object
  store's read cache (``storage.offload.RangedObject``);
* ``Parts``: a ledger written straight to the object store by phase-two tasks, as parts and a
  manifest object (layout in ``compacted_ledger``'s docstring). Its one-file bytes are
  ``HEADER + the parts in order + the manifest's index and trailer``; a read maps its range
  onto the parts, so no part is fetched until a read needs it.

``open_remote(uri)`` tells the last two apart by the object's first bytes. The magic numbers
(``HEADER``, ``MANIFEST``) and the manifest's part entry live here, where the bytes are
recognised; ``compacted_ledger`` re-exports them.
"""

from __future__ import annotations

import struct

import numpy as np

from ..errors import StorageError

HEADER = b"CMQCLED1"
MANIFEST = b"CMQCLMN1"
PART_ENTRY = struct.Struct(">QH")  # a manifest's part: [u64 size][u16 name length]


def _filesystem(path: str):
    """``(pyarrow FileSystem, path inside it)``; plain paths use the local filesystem."""
    from pyarrow import fs

    if "://" in path:
        return fs.FileSystem.from_uri(path)
    return fs.LocalFileSystem(use_mmap=True), path


def read_file_bytes(path: str):
    """Whole file as a ``pyarrow.Buffer`` read through ``pyarrow.fs`` (memory-mapped locally)."""
    filesystem, p = _filesystem(path)
    with filesystem.open_input_file(p) as f:
        return f.read_buffer()


def is_remote(path: str) -> bool:
    """True for a URI (an offloaded compacted ledger, or one written straight to the object
    store): read by ranges. A plain path is a local file, memory-mapped whole."""
    return "://" in str(path)


class InMemory:
    """The bytes of a compacted ledger held in memory or memory-mapped (a local file)."""

    def __init__(self, buf):
        self.buffer = buf
        self._data = memoryview(buf)
        self.size = len(self._data)

    def read(self, lo: int, hi: int):
        return self._data[lo:hi]

    read_meta = read

    def whole(self):
        return self.buffer


class OneObject:
    """A compacted ledger stored as one object (offloaded after it was written locally), read by
    ranges through the object store's read cache (``storage.offload.RangedObject``)."""

    def __init__(self, obj):
        self.obj = obj
        self.size = obj.size

    def read(self, lo: int, hi: int):
        return self.obj.read(lo, hi)

    def read_meta(self, lo: int, hi: int):
        return self.obj.read_meta(lo, hi)

    def whole(self):
        return self.obj.whole()


class Parts:
    """A compacted ledger stored as parts and a manifest (phase-two tasks wrote it straight to the
    object store). Its one-file bytes are ``HEADER + the parts in order + the manifest's index and
    trailer``; a read maps its range onto the parts, each read by ranges like any object."""

    def __init__(self, manifest_obj, manifest) -> None:
        data = memoryview(manifest)
        (n,) = struct.unpack_from(">I", data, len(MANIFEST))
        at = len(MANIFEST) + 4
        self.pieces = []
        for _ in range(n):
            size, length = PART_ENTRY.unpack_from(data, at)
            at += PART_ENTRY.size
            name = bytes(data[at : at + length]).decode()
            at += length
            # sizes come from the manifest: no request per part until it is read
            self.pieces.append(manifest_obj.sibling(name, size))
        sizes = np.array([p.size for p in self.pieces], np.int64)
        self.starts = len(HEADER) + np.concatenate(([0], np.cumsum(sizes)))
        self.tail_start = int(self.starts[-1])
        self.tail = bytes(data[at:])
        self.size = self.tail_start + len(self.tail)

    def read(self, lo: int, hi: int):
        out = []
        pos, hi = lo, min(hi, self.size)
        while pos < hi:
            if pos < len(HEADER):
                got = HEADER[pos : min(hi, len(HEADER))]
            elif pos >= self.tail_start:
                got = self.tail[pos - self.tail_start : hi - self.tail_start]
            else:
                k = int(np.searchsorted(self.starts, pos, side="right")) - 1
                base = int(self.starts[k])
                piece = self.pieces[k]
                got = piece.read(pos - base, min(hi - base, piece.size))
            if not got:
                raise StorageError(f"compacted ledger part ended early at byte {pos}")
            out.append(got)
            pos += len(got)
        return out[0] if len(out) == 1 else b"".join(out)

    read_meta = read

    def whole(self) -> bytes:
        out = bytearray(HEADER)
        for piece in self.pieces:
            chunk = piece.whole()
            if len(chunk) != piece.size:
                raise StorageError(f"part {piece.key} has {len(chunk)} bytes, the manifest says {piece.size}")
            out += memoryview(chunk)
        out += self.tail
        return bytes(out)


class ChainObject(InMemory):
    """A chain manifest in the object store (``object_chain``), held in memory whole (it is
    small); ``segment(name, size)`` opens a segment it names, an object beside it."""

    def __init__(self, obj, data) -> None:
        super().__init__(data)
        self.obj = obj

    def segment(self, name: str, size: int) -> OneObject:
        return OneObject(self.obj.sibling(name, size))


#: the first bytes of a chain manifest (``chain.MAGIC``, ``chain.MAGIC_MASKS``)
CHAIN_MAGICS = (b"CMQCHAN1", b"CMQCHAN2")


def open_remote(path: str):
    """The bytes of the compacted ledger at URI ``path``, read by ranges: the object itself, or the
    parts its manifest names; a chain manifest (``ChainObject``) is read whole."""
    from ..storage.offload import open_url

    obj = open_url(path)
    head = bytes(obj.read(0, min(obj.size, len(MANIFEST))))
    if head == MANIFEST:
        return Parts(obj, obj.read_meta(0, obj.size))
    if head in CHAIN_MAGICS:
        return ChainObject(obj, obj.whole())
    if head != HEADER:
        raise StorageError(f"{path}: not a compacted ledger")
    return OneObject(obj)
