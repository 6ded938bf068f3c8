"""The compacted ledger: surviving entries, each stored next to its original id.

File layout (all integers big-endian)::

    header   b"CMQCLED1"
    records  n x  [u32 length][i64 ledger_id][i64 entry_id][entry bytes (length)]
    index    n x  [i64 ledger_id][i64 entry_id][u64 record offset][u32 length]     (28 bytes each)
    trailer  [u64 index offset][u64 n][u32 crc32c of the index][u32 0][b"CMQCLEND"]  (32 bytes)

Records are in strictly increasing id order, so a reader binary-searches the index for the first
id >= a position. The id travels with every record as well, so the file can be rebuilt from its
records alone. A file is complete only once its trailer is written and flushed; a file without a
valid trailer was left by a crashed run and is never read (the metadata store never named it).

Files are read through ``pyarrow.fs`` so a Spark executor on another machine can read a compacted
ledger from shared storage. A local view is a *chain* of such files (``chain``): each phase-two
task writes its part as a complete file, a *segment* (``compacted_writer.PartWriter``), and the view
``<id>.compacted`` is a small manifest naming the segments of this run and of earlier runs it
still uses; ``CompactedLedgerReader`` opens both forms and reads a chain through one merged,
sorted index (so a read is a binary search either way). The writers are in ``compacted_writer``.

In the object store (tiered storage configured) the executors upload their parts themselves and
the driver writes only a small *manifest* object beside them, so no payload byte passes through
the driver::

    <prefix>/part-000000 ...   the records of each part, as a phase-two task wrote them
    <prefix>/ledger.compacted  b"CMQCLMN1" [u32 n] n x [u64 size][u16 name length][name]
                               then the index and trailer of the whole ledger, as above

The ledger's bytes are then ``header + part records in order + index + trailer``: exactly the
one-file layout, which ``CompactedLedgerReader`` maps onto the parts when it opens a manifest.

Reading from the object store is by ranges, never whole (``CompactedLedgerReader`` over
``storage.offload.RangedObject``, the ranged reads and read cache of offloaded ledgers): the
trailer says where the index is, the index where each entry is, so a reader seeking into the
middle of a large offloaded view fetches the index and the chunk holding its entries.
"""

from __future__ import annotations

import os
import re
import struct
from typing import Iterator, Optional

import numpy as np

from ..errors import StorageError
from . import chain, chain_index
from . import COMPACTED_DIR
from .compacted_sources import (  # noqa: F401  (HEADER, MANIFEST, is_remote, read_file_bytes: re-exported)
    HEADER,
    MANIFEST,
    PART_ENTRY,
    ChainObject,
    InMemory,
    _filesystem,
    is_remote,
    open_remote,
    read_file_bytes,
)

MANIFEST_NAME = "ledger.compacted"
TRAILER_MAGIC = b"CMQCLEND"
_PART_ENTRY = PART_ENTRY  # (its old name, which compacted_writer imports)
RECORD_HEADER = struct.Struct(">Iqq")  # length, ledger_id, entry_id
TRAILER = struct.Struct(">QQII8s")
INDEX_DTYPE = np.dtype([("ledger_id", ">i8"), ("entry_id", ">i8"), ("offset", ">u8"), ("length", ">u4")])
SUFFIX = ".compacted"
_NAME = re.compile(r"^(\d+)\.compacted$")
_KEYS = re.compile(r"^(\d+)\.keys$")  # a view's key sidecar (see ``view_keys``)


def _crc32c(data) -> int:
    import crc32c

    return crc32c.crc32c(data)


def _position(ledger_id: int, entry_id: int):
    try:
        from ..storage import Position
    except ImportError:  # storage not importable: positions are plain tuples
        return (ledger_id, entry_id)
    return Position(ledger_id, entry_id)


# --- where files live ------------------------------------------------------------------------


def topic_dir(data_dir, topic: str) -> str:
    """Directory of a topic's compacted ledgers (the storage layout:
    ``{data_dir}/compacted/<domain>/<tenant>/<namespace>/<topic>``)."""
    from ..naming import canonical
    from ..storage.topic_paths import topic_relpath

    return os.path.join(str(data_dir), COMPACTED_DIR, topic_relpath(canonical(topic)))


def compacted_ledger_path(data_dir, topic: str, ledger_id: int) -> str:
    """Path of compacted ledger ``ledger_id`` of ``topic`` (what the broker opens by id; the same
    as ``Storage.compacted_ledger_path``)."""
    return os.path.join(topic_dir(data_dir, topic), f"{ledger_id:012d}{SUFFIX}")


def list_compacted_ledgers(data_dir, topic: str) -> list[int]:
    d = topic_dir(data_dir, topic)
    try:
        names = os.listdir(d)
    except FileNotFoundError:
        return []
    return sorted(int(m.group(1)) for m in map(_NAME.match, names) if m)


# --- reading ----------------------------------------------------------------------------------


def entry_count(path: str) -> int:
    """Entries in a finished compacted ledger, from its trailer alone; 0 when unreadable or unfinished."""
    try:
        with open(path, "rb") as f:
            f.seek(-TRAILER.size, os.SEEK_END)
            _, n, _, _, magic = TRAILER.unpack(f.read(TRAILER.size))
    except (OSError, struct.error):
        return 0
    return int(n) if magic == TRAILER_MAGIC else 0


class CompactedLedgerReader:
    """Reads a finished compacted view: one compacted-ledger file, or a chain of them (``chain``).
    Thread-safe for reads (the bytes are immutable).

    A local file is memory-mapped; so is every segment of a chain, at open, so a handle stays
    readable after a newer run deleted files it no longer needs. A URI (an offloaded compacted
    ledger, or one stored as parts and a manifest) is read by ranges, never whole: opening it
    fetches the head, the trailer and the index (a few ranged reads, whatever its size); a read
    of entries then fetches only the chunks that hold them, through the process's read cache
    (``storage.offload.blocks``). ``buffer`` is the whole ledger of a one-file view (a Spark task
    that scans all of it downloads it once); a chain has one per segment (``segment_buffer``).

    Memory does not grow with the view: the index is read in place, in the file's own layout
    (``chain.SortedRows``: every ``chain.SAMPLE``-th position in memory, so ``find`` is two
    binary searches), and a view of several segments in order (a one-file view, a fresh chain)
    is their concatenation, with nothing merged. A chain whose runs drop, mask or store again
    some positions is merged once at open, range by range (``chain.merge_chunked``), into one
    stored row (and mask) per entry, kept in a temporary file, memory-mapped, when it is large.

    The view's entries are numbered ``0 .. len - 1`` in id order. ``columns(i, j)`` gives their
    ledger ids, entry ids, segment, data offset and length as arrays (what a task copying a
    range needs), ``ledger_range``/``ledger_runs`` where each ledger's entries are. The whole
    arrays ``ledger_ids``, ``entry_ids``, ``segment_ids``, ``offsets``, ``lengths`` are still
    there for tools and tests, built on first use (they are what would grow with the view).

    In a chain with masks, ``mask_ids`` names the mask of each entry (-1: none; None: no mask at
    all): offsets and lengths then address the stored *base* copy, and ``entry_at``,
    ``entries``, ``read`` and iteration return it rewritten through the mask (``masked_piece``),
    so a reader of the view never sees a mask. ``len`` counts entries, ``size_bytes`` stored
    bytes (see ``chain``).
    """

    def __init__(
        self,
        path: str,
        buffer=None,
        *,
        merge_chunk: int = chain_index.MERGE_CHUNK,
        spill: int = chain_index.SPILL_ENTRIES,
    ):
        self.path = path
        self.manifest = None  # a chain's manifest (``chain.Manifest``), None for one file
        self.mask_ids: Optional[np.ndarray] = None  # a chain's masks (see ``_open_chain``)
        self._merged: Optional[chain.MergedIndex] = None
        self._full: dict = {}  # whole-view arrays built on first use (``ledger_ids`` ...)
        self._whole = None
        if buffer is not None:
            src = InMemory(buffer)
        elif is_remote(path):
            src = open_remote(path)
        else:
            src = InMemory(read_file_bytes(path))
        if isinstance(src, InMemory) and src.size >= 8 and chain.is_chain(src.read(0, 8)):
            self._open_chain(src, merge_chunk, spill)
            return
        self._srcs = [src]
        self._segments = [chain.SortedRows(_index_rows(path, src))]
        self._starts = np.array([0, len(self._segments[0])], np.int64)
        self._n = len(self._segments[0])
        self._sample_l, self._sample_e = self._segments[0].sample_l, self._segments[0].sample_e
        self._size = src.size

    def _open_chain(self, src, merge_chunk: int, spill: int) -> None:
        manifest = chain.decode(src.read(0, src.size), self.path)
        base = os.path.dirname(self.path)
        srcs, segments, runs = [], [], []
        remote = isinstance(src, ChainObject)  # a chain in the object store (``object_chain``)
        for name, run, _, size in manifest.segments:
            seg_path = os.path.join(base, name) if not remote else f"{base}/{name}"
            seg = src.segment(name, size) if remote else InMemory(read_file_bytes(seg_path))
            if bytes(seg.read(0, len(HEADER))) != HEADER:
                raise StorageError(f"{seg_path}: not a compacted-ledger segment")
            srcs.append(seg)
            segments.append(chain.SortedRows(_index_rows(seg_path, seg)))
            runs.append(run)
        self._srcs = srcs
        self._segments = segments
        sizes = np.array([len(s) for s in segments], np.int64)
        self._starts = np.concatenate(([0], np.cumsum(sizes)))
        self.manifest = manifest
        self._size = src.size + sum(s.size for s in srcs)
        if not len(manifest.dropped) and not len(manifest.masks) and self._in_order():
            # a fresh chain: its segments are disjoint and in order, the view is their concatenation
            self._n = int(self._starts[-1])
            self._sample_l, self._sample_e = self._concatenated_sample()
            return
        merged = chain.merge_chunked(segments, runs, manifest.dropped, manifest.masks, merge_chunk, spill)
        self._merged = merged
        self._n = len(merged)
        self._sample_l, self._sample_e = merged.sample_l, merged.sample_e
        # entries read through a mask (``chain``): the row of ``manifest.masks``, -1 for none
        self.mask_ids = merged.mask

    def _in_order(self) -> bool:
        """Whether each segment starts after the one before it ends (each is sorted)."""
        last = None
        for s in self._segments:
            if not len(s):
                continue
            first = (int(s.sample_l[0]), int(s.sample_e[0]))
            if last is not None and first <= last:
                return False
            lids, eids = s.positions(len(s) - 1, len(s))
            last = (int(lids[0]), int(eids[0]))
        return True

    def _concatenated_sample(self) -> tuple:
        """Every ``chain.SAMPLE``-th position of a view that concatenates its segments."""
        idx = np.arange(0, self._n, chain_index.SAMPLE, dtype=np.int64)
        lids, eids, *_ = self._fetch(*self._stored(idx), fields=("ledger_id", "entry_id"))
        return lids, eids

    # --- where entries are -------------------------------------------------------------------------

    def _stored(self, idx: np.ndarray) -> tuple:
        """``(segment, row in it)`` of the stored copy (a masked entry: its base) of entries ``idx``."""
        rows = idx if self._merged is None else np.asarray(self._merged.row[idx], np.int64)
        seg = np.searchsorted(self._starts, rows, side="right") - 1
        return seg, rows - self._starts[seg]

    def _fetch(
        self, seg: np.ndarray, local: np.ndarray, fields=("ledger_id", "entry_id", "offset", "length")
    ):
        """The index fields (native int64; ``offset`` the data's, after the record header) of rows
        ``local`` of segments ``seg``, then the segments themselves."""
        out = [np.empty(len(seg), np.int64) for _ in fields]
        if len(seg):
            cuts = np.flatnonzero(seg[1:] != seg[:-1]) + 1
            for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), len(seg)]):
                rows = self._segments[int(seg[a])].rows
                lo, hi = int(local[a]), int(local[b - 1]) + 1
                part = rows[lo:hi] if hi - lo == b - a else rows[local[a:b]]
                for k, name in enumerate(fields):
                    out[k][a:b] = part[name]
            if "offset" in fields:
                out[fields.index("offset")] += RECORD_HEADER.size
        return (*out, seg.astype(np.int32))

    def columns(self, i: int, j: int) -> tuple:
        """``(ledger_ids, entry_ids, segment_ids, data offsets, lengths)`` of entries ``i .. j-1``
        (of a masked entry: where its base copy is)."""
        i, j = max(0, i), min(j, self._n)
        lids, eids, offs, lens, seg = self._fetch(*self._stored(np.arange(i, max(i, j), dtype=np.int64)))
        return lids, eids, seg, offs, lens

    def _positions(self, i: int, j: int) -> tuple:
        lids, eids, _ = self._fetch(
            *self._stored(np.arange(i, max(i, j), dtype=np.int64)), fields=("ledger_id", "entry_id")
        )
        return lids, eids

    def take(self, idx) -> tuple:
        """``columns`` of the entries ``idx`` (sorted view indexes)."""
        lids, eids, offs, lens, seg = self._fetch(*self._stored(np.asarray(idx, np.int64)))
        return lids, eids, seg, offs, lens

    def find(self, position) -> int:
        """Index of the first entry with id >= ``position`` (``len(self)`` when none)."""
        return chain.find_sampled(
            self._sample_l, self._sample_e, self._n, self._positions, int(position[0]), int(position[1])
        )

    def ledger_range(self, ledger_id: int) -> tuple[int, int]:
        """``(lo, hi)``: the view's entries of ledger ``ledger_id`` are ``lo .. hi - 1``."""
        lo = self.find((ledger_id, -(1 << 63)))
        return lo, self.find((ledger_id + 1, -(1 << 63)))

    def ledger_runs(self, start: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """``(ledger ids, count of each)`` of the entries from ``start`` on, in order (one lookup
        per ledger, nothing per entry)."""
        lids, counts = [], []
        i = max(0, start)
        while i < self._n:
            lid = int(self._positions(i, i + 1)[0][0])
            j = self.find((lid + 1, -(1 << 63)))
            lids.append(lid)
            counts.append(j - i)
            i = j
        return np.array(lids, np.int64), np.array(counts, np.int64)

    def distinct_ledger_ids(self) -> np.ndarray:
        return self.ledger_runs()[0]

    def __len__(self) -> int:
        return self._n

    # --- the whole index, for tools and tests ------------------------------------------------------

    def _whole_columns(self) -> dict:
        if not self._full:
            lids, eids, seg, offs, lens = self.columns(0, self._n)
            self._full.update(ledger_ids=lids, entry_ids=eids, segment_ids=seg, offsets=offs, lengths=lens)
        return self._full

    @property
    def ledger_ids(self) -> np.ndarray:
        return self._whole_columns()["ledger_ids"]

    @property
    def entry_ids(self) -> np.ndarray:
        return self._whole_columns()["entry_ids"]

    @property
    def offsets(self) -> np.ndarray:
        return self._whole_columns()["offsets"]

    @property
    def lengths(self) -> np.ndarray:
        return self._whole_columns()["lengths"]

    @property
    def segment_ids(self) -> np.ndarray:
        return self._whole_columns()["segment_ids"]

    # --- entries -----------------------------------------------------------------------------------

    @property
    def masked_count(self) -> int:
        """Entries of the view read through a mask (0 for a view with none)."""
        return 0 if self.mask_ids is None else int(np.count_nonzero(self.mask_ids >= 0))

    def masked_piece(self, sel: np.ndarray) -> tuple:
        """``(buf, offsets, lengths)`` of the bytes of entries ``sel`` (view indexes, each read
        through a mask) as the view serves them: each base copy rewritten so only its mask's
        batch indexes stay (``batch_rewrite.rebuild_ranges``, the rewrite phase two does)."""
        from .batch_rewrite import rebuild_ranges

        assert self.manifest is not None and self.mask_ids is not None
        sel = np.asarray(sel, np.int64)
        _, _, segs, offs, lens = self.take(sel)
        raw = [
            bytes(self._srcs[k].read(o, o + n))
            for k, o, n in zip(segs.tolist(), offs.tolist(), lens.tolist())
        ]
        offs = np.zeros(len(raw), np.int64)
        if len(raw):
            np.cumsum(lens[:-1], out=offs[1:])
        buf = np.frombuffer(b"".join(raw), np.uint8)
        rows = self.manifest.masks[np.asarray(self.mask_ids[sel], np.int64)]
        counts = rows["count"].astype(np.int64)
        starts = rows["offset"].astype(np.int64)
        kept = self.manifest.kept
        surv_entry = np.repeat(np.arange(len(sel), dtype=np.int64), counts)
        surv_batch = (
            kept[
                np.repeat(starts, counts)
                + np.arange(int(counts.sum()))
                - np.repeat(np.cumsum(counts) - counts, counts)
            ].astype(np.int64)
            if len(sel)
            else np.zeros(0, np.int64)
        )
        src, new_lens, extra, extra_off = rebuild_ranges(buf, offs, lens, surv_entry, surv_batch)
        if (new_lens < 0).any():
            raise StorageError(f"{self.path}: a mask keeps no message of its entry")
        out_lens = new_lens.astype(np.int64)
        out_offs = np.zeros(len(sel), np.int64)
        if len(sel):
            np.cumsum(out_lens[:-1], out=out_offs[1:])
        blob = b"".join(
            (extra[int(x) : int(x) + int(n)] if x >= 0 else buf[int(o) : int(o) + int(n)]).tobytes()
            for o, n, x in zip(src.tolist(), out_lens.tolist(), extra_off.tolist())
        )
        return np.frombuffer(blob, np.uint8), out_offs, out_lens

    @property
    def is_chain(self) -> bool:
        return self.manifest is not None

    @property
    def remote(self) -> bool:
        return not isinstance(self._srcs[0], InMemory) if self._srcs else False

    @property
    def size_bytes(self) -> int:
        """Size of the view (header, records, index, trailer; for a chain its manifest and every
        segment it names, live or not), without reading it."""
        return self._size

    @property
    def segment_count(self) -> int:
        return len(self._srcs)

    def segment_buffer(self, k: int):
        """The whole bytes of segment ``k`` (of a one-file view: ``buffer``)."""
        if self.manifest is None:
            return self.buffer
        return self._srcs[k].whole()

    @property
    def buffer(self):
        """The whole ledger's bytes (read once from the store when remote); one-file views only."""
        if self.manifest is not None:
            raise StorageError(f"{self.path}: a chained view has no single buffer (see segment_buffer)")
        src = self._srcs[0]
        if not self.remote:
            return src.whole()
        if self._whole is None:
            self._whole = src.whole()
        return self._whole

    def position_at(self, i: int):
        lids, eids = self._positions(i, i + 1)
        return _position(int(lids[0]), int(eids[0]))

    def entry_at(self, i: int) -> bytes:
        if self.mask_ids is not None and self.mask_ids[i] >= 0:
            buf, _, n = self.masked_piece(np.array([i]))
            return buf[: int(n[0])].tobytes()
        _, _, segs, offs, lens = self.columns(i, i + 1)
        o = int(offs[0])
        return bytes(self._srcs[int(segs[0])].read(o, o + int(lens[0])))

    def entries(self, i: int, j: int) -> list[bytes]:
        """The bytes of entries ``i .. j-1``, with ONE read of the range that holds them per
        segment they come from."""
        return [data for _, data in self._read_range(i, j)]

    def _read_range(self, i: int, j: int) -> list[tuple]:
        """``(Position, bytes)`` of entries ``i .. j-1`` (see ``entries``)."""
        j = min(j, len(self))
        if j <= i:
            return []
        lids, eids, segs, offs, lens = self.columns(i, j)
        cuts = np.flatnonzero(segs[1:] != segs[:-1]) + 1
        out: list[bytes] = []
        for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), j - i]):
            src = self._srcs[int(segs[a])]
            lo = int(offs[a])
            blob = memoryview(src.read(lo, int(offs[b - 1] + lens[b - 1])))
            out += [bytes(blob[o - lo : o - lo + n]) for o, n in zip(offs[a:b].tolist(), lens[a:b].tolist())]
        if self.mask_ids is not None:  # masked entries: rewritten on read, all at once
            masked = np.flatnonzero(np.asarray(self.mask_ids[i:j]) >= 0)
            if len(masked):
                buf, moffs, mlens = self.masked_piece(masked + i)
                for k, o, n in zip(masked.tolist(), moffs.tolist(), mlens.tolist()):
                    out[k] = buf[o : o + n].tobytes()
        return [(_position(lid, eid), data) for lid, eid, data in zip(lids.tolist(), eids.tolist(), out)]

    def read(self, start_position, n: int) -> list:
        """Up to ``n`` ``(Position, bytes)`` with id >= ``start_position`` (one ranged read)."""
        i = self.find(start_position)
        return self._read_range(i, min(i + max(n, 0), len(self)))

    def last(self):
        if not len(self):
            return None
        return (self.position_at(len(self) - 1), self.entry_at(len(self) - 1))

    def __iter__(self) -> Iterator[tuple]:
        step = 256
        for i in range(0, len(self), step):
            yield from self._read_range(i, i + step)


def _index_rows(path: str, src) -> np.ndarray:
    """The index of one compacted-ledger file, checked, as ``INDEX_DTYPE`` rows over its bytes
    (not copied: a memory-mapped file's index stays in the page cache)."""
    size = src.size
    if size < len(HEADER) + TRAILER.size:
        raise StorageError(f"{path}: not a compacted ledger")
    if isinstance(src, InMemory) and bytes(src.read(0, len(HEADER))) != HEADER:
        if bytes(src.read(0, len(MANIFEST))) == MANIFEST:
            raise StorageError(f"{path}: a compacted-ledger manifest is opened by its URI")
        raise StorageError(f"{path}: not a compacted ledger")
    index_offset, n, crc, _, magic = TRAILER.unpack(bytes(src.read_meta(size - TRAILER.size, size)))
    if magic != TRAILER_MAGIC or index_offset + n * INDEX_DTYPE.itemsize != size - TRAILER.size:
        raise StorageError(f"{path}: compacted ledger is incomplete (no valid trailer)")
    raw = src.read_meta(index_offset, index_offset + n * INDEX_DTYPE.itemsize)
    if _crc32c(raw) != crc:
        raise StorageError(f"{path}: compacted ledger index checksum mismatch")
    return np.frombuffer(raw, dtype=INDEX_DTYPE)


def remove_orphans(data_dir, topic: str, keep: Optional[int]) -> list[int]:
    """Delete this topic's compacted-ledger files, their key sidecars, segments and parts other
    than those of view ``keep`` (its file, its sidecar, every segment its chain names).

    Call it only while holding the topic's compaction lock: a file not named by the metadata store
    then belongs to no running compaction. Returns the ledger ids removed.
    """
    d = topic_dir(data_dir, topic)
    removed: list[int] = []
    try:
        names = os.listdir(d)
    except FileNotFoundError:
        return removed
    # a chained view in force keeps every segment it names, whichever run wrote it
    named: Optional[set] = set()
    if keep is not None:
        named = chain.named_segments(os.path.join(d, f"{keep:012d}{SUFFIX}"))
    for name in names:
        full = os.path.join(d, name)
        m = _NAME.match(name)
        sidecar = _KEYS.match(name)
        if (m or sidecar) and keep is not None and int((m or sidecar).group(1)) == keep:  # type: ignore[union-attr]
            continue
        segment = chain.SEGMENT_NAME.match(name)
        if segment and (named is None or name in named):
            continue
        if m or sidecar or segment or name.endswith(".tmp") or name.startswith("run-"):
            if os.path.isdir(full):
                import shutil

                shutil.rmtree(full, ignore_errors=True)
            else:
                try:
                    os.unlink(full)
                except FileNotFoundError:
                    pass
            if m:
                removed.append(int(m.group(1)))
    return sorted(removed)
