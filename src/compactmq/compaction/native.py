"""The C accelerator of ``entry_scan``: a compiled extension, with numpy as the reference.

Phase one of a run parses every stored entry: the outer ``MessageMetadata``, each sub-message
of a batch, two hashes per key, and the map-side keep-latest combiner. The numpy code in
``entry_scan`` does this in lockstep rounds over all records and always works; the extension
``compactmq.compaction._scan`` (C source in ``_scan.c`` next to this file) walks one record at a
time and is several times faster (``bench/native_scan_bench.py``). Results are identical: the
tests run both paths on the same inputs.

The extension is an ordinary CPython extension module declared in ``setup.py``, so
``pip install .`` (a wheel) and ``pip install -e .`` compile it at install time with the
platform's compiler, once; nothing is compiled or written at run time. A Spark executor imports
compactmq from its own installation (the one its Python runs), so an executor on another machine
uses the extension exactly when compactmq was installed there with it -- the same code path as
the driver. The build is optional: without a compiler the install still succeeds, and the first
use in a process logs once that numpy is used. ``COMPACTMQ_NATIVE=0`` turns the extension off
(the tests use it to compare both paths); an extension built from an older ``_scan.c`` (its
``ABI`` number differs from ``ABI`` here) is refused the same way, so a stale in-place build
never runs.

The functions below convert arguments to the contiguous int64/uint8 arrays the extension
expects, allocate its outputs, and turn its error codes into ``CompactionError``.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
from types import ModuleType
from typing import Optional

import numpy as np

from ..errors import CompactionError

ABI = 3  # SCAN_ABI in _scan.c
MD_COLS = 12  # md_start, md_end, key_off, key_len, bits, num_messages, compression, uncompressed_size,
#              event_time, publish_time, uncompressed span start, span end
SM_COLS = 13  # batch, index, seg_start, smm_start, smm_end, payload_end, key_off, key_len, payload_size,
#              compacted_out, event_time, size span start, size span end

log = logging.getLogger(__name__)

_lock = threading.Lock()
_ext: Optional[ModuleType] = None
_why_not = ""
_tried = False


def _load() -> Optional[ModuleType]:
    global _ext, _why_not, _tried
    with _lock:
        if _tried:
            return _ext
        try:
            _scan = importlib.import_module(f"{__package__}._scan")  # sys.modules first, as tests need
        except ImportError as e:
            _why_not = f"the compiled extension compactmq.compaction._scan is not installed ({e})"
        else:
            if getattr(_scan, "ABI", None) != ABI:
                _why_not = (
                    f"the compiled extension {_scan.__file__} is stale (ABI {getattr(_scan, 'ABI', None)}, "
                    f"{ABI} expected): reinstall compactmq to rebuild it"
                )
            else:
                _ext = _scan
        if _ext is None:
            log.warning("native scan accelerator unavailable, using numpy: %s", _why_not)
        _tried = True
        return _ext


def library() -> Optional[ModuleType]:
    """The extension module, or None (``COMPACTMQ_NATIVE=0``, not built, or stale): callers then
    use numpy. The first call decides for the whole process and logs why when it is None."""
    if os.environ.get("COMPACTMQ_NATIVE", "1") == "0":
        return None
    return _ext if _tried else _load()


def describe() -> str:
    """Which path a run in this process takes, for benchmarks and diagnostics."""
    if os.environ.get("COMPACTMQ_NATIVE", "1") == "0":
        return "numpy (COMPACTMQ_NATIVE=0)"
    lib = library()
    return f"extension {os.path.basename(lib.__file__ or '_scan')}" if lib else f"numpy ({_why_not})"


def _i64(a) -> np.ndarray:
    return np.ascontiguousarray(a, np.int64)


def _u8(buf) -> np.ndarray:
    return buf if buf.dtype == np.uint8 and buf.flags.c_contiguous else np.ascontiguousarray(buf, np.uint8)


def scan_md(lib, buf: np.ndarray, offsets, lengths) -> np.ndarray:
    off, ln = _i64(offsets), _i64(lengths)
    out = np.empty((len(off), MD_COLS), np.int64)
    rc = lib.scan_md(_u8(buf), off, ln, out)
    if rc < 0:
        raise CompactionError(f"malformed entry metadata (entry {-rc - 1} of the batch)")
    return out


def scan_batches(lib, buf: np.ndarray, starts, ends, counts) -> np.ndarray:
    s, e = _i64(starts), _i64(ends)
    c = _i64(np.maximum(counts, 0))
    out = np.empty((int(c.sum()), SM_COLS), np.int64)
    rc = lib.scan_batches(_u8(buf), s, e, c, out)
    if rc < 0:
        raise CompactionError(f"malformed batch (batch {-rc - 1} of the selection)")
    return out[:rc]


def hash_keys(lib, buf: np.ndarray, off, ln, seeds: np.ndarray):
    off, ln = _i64(off), _i64(ln)
    h1 = np.empty(len(off), np.uint64)
    h2 = np.empty(len(off), np.uint64)
    lib.hash_keys(_u8(buf), off, ln, np.ascontiguousarray(seeds, np.uint64), h1, h2)
    return h1.view(np.int64), h2.view(np.int64)


def copy_ranges(lib, dst: np.ndarray, dst_starts, src: np.ndarray, src_starts, lens) -> None:
    if not (dst.flags.c_contiguous and dst.dtype == np.uint8 and dst.flags.writeable):
        raise ValueError("dst must be a writable contiguous uint8 array")
    try:
        lib.copy_ranges(dst, _i64(dst_starts), _u8(src), _i64(src_starts), _i64(lens))
    except ValueError as e:
        raise CompactionError(str(e)) from None


def check_records(lib, buf: np.ndarray, offsets, lengths, ids) -> bool:
    """Whether the ledger records at ``offsets`` of ``buf`` carry ``lengths`` and entry ``ids``
    in their headers (a ledger index checked against its file; see ``tasks.load_live``)."""
    return lib.check_records(_u8(buf), _i64(offsets), _i64(lengths), _i64(ids)) < 0


def rebuild_subs(lib, buf: np.ndarray, sub, fs, fe, keep: np.ndarray, tail: bytes, size: int) -> np.ndarray:
    """The new bodies of batches losing messages (``batch_rewrite.rebuild_ranges``): the
    sub-messages ``sub`` (``entry_scan.SubMessages``) of ``buf``, those not ``keep`` as
    placeholders (their payload_size field, ``fs``..``fe`` per dropped one, cut, ``tail``
    appended), laid end to end in ``size`` bytes."""
    out = np.empty(size, np.uint8)
    keep8 = np.ascontiguousarray(keep, np.uint8)
    rc = lib.rebuild_subs(
        _u8(buf),
        _i64(sub.seg_start),
        _i64(sub.smm_start),
        _i64(sub.smm_end),
        _i64(sub.payload_end),
        _i64(fs),
        _i64(fe),
        keep8,
        tail,
        out,
    )
    if rc != size:
        raise CompactionError(f"malformed batch while rewriting it ({rc} of {size} bytes)")
    return out


def single_rows(lib, buf: np.ndarray, offsets, lengths, seeds: np.ndarray):
    """``(h1, h2, flags, event_time)`` of entries that each hold one message (the phase-one rows
    of ``message_rows.entry_rows`` but their positions and the keyless rows' stand-in hashes), or
    None when some entry is a batch or a marker."""
    off, ln = _i64(offsets), _i64(lengths)
    n = len(off)
    h1, h2 = np.empty(n, np.uint64), np.empty(n, np.uint64)
    flags, et = np.empty(n, np.int8), np.empty(n, np.int64)
    rc = lib.single_rows(_u8(buf), off, ln, np.ascontiguousarray(seeds, np.uint64), h1, h2, flags, et)
    if rc < 0:
        raise CompactionError(f"malformed entry metadata (entry {-rc - 1} of the batch)")
    return None if rc else (h1.view(np.int64), h2.view(np.int64), flags, et)


def last_per_key(lib, h1: np.ndarray, h2: np.ndarray) -> np.ndarray:
    """Mask of the rows that are the last of their key (h1, h2)."""
    a, b = _i64(h1), _i64(h2)
    n = len(a)
    table = np.full(1 << max(4, int(2 * n).bit_length()), -1, np.int64)
    keep = np.zeros(n, np.uint8)
    lib.last_per_key(a, b, keep, table)
    return keep.view(bool)


class LatestTable:
    """Keep-latest's map-side combiner as a table rows stream into: per distinct key ``(h1, h2)``
    the row of greatest position, in one open-addressing table of whole rows (``h1, h2, pos,
    flags``: a row costs one cache miss) kept at most ``LOAD`` full, doubled when a chunk could
    pass that. A parsing task then holds its distinct keys, not all its rows, and nothing is
    concatenated or sorted at the end. Event times are not kept (keep-latest never ships them)."""

    LOAD = 0.6

    #: the smallest table a first chunk gets: a small run (the many small topics of a joint job
    #: or the in-process engine) then fills a few KiB instead of the full ``capacity``
    MIN_SLOTS = 1 << 10

    def __init__(self, lib, capacity: int = 1 << 17):
        self.lib = lib
        self.count = 0
        self.capacity = capacity
        self.table = self._empty(0)  # sized at the first chunk: at most ``capacity``

    def _first(self, n: int) -> None:
        """Size the table for a first chunk of ``n`` rows: ``capacity`` slots, or fewer when a
        quarter of them would hold it (a larger group still grows by doubling)."""
        slots = self.MIN_SLOTS
        while slots < self.capacity and 4 * n > self.LOAD * slots:
            slots *= 2
        self.table = self._empty(min(slots, self.capacity) if self.capacity > 0 else slots)

    @staticmethod
    def _empty(slots: int) -> np.ndarray:
        t = np.empty((slots, 4), np.int64)
        t[:, 2] = -1
        return t

    def add(self, h1, h2, pos, flags) -> None:
        n = len(pos)
        if not n:
            return
        if not len(self.table):
            self._first(n)
        slots = len(self.table)
        if self.count + n > self.LOAD * slots:
            while self.count + n > self.LOAD * slots:
                slots *= 2
            old = self.columns()
            self.table, self.count = self._empty(slots), 0
            self._upsert(old["h1"], old["h2"], old["pos"], old["flags"])
        self._upsert(h1, h2, pos, flags)

    def _upsert(self, h1, h2, pos, flags) -> None:
        if len(pos):
            flags = np.ascontiguousarray(flags, np.int8)
            self.count = self.lib.upsert_latest(_i64(h1), _i64(h2), _i64(pos), flags, self.table, self.count)

    def columns(self) -> dict:
        """The kept rows: ``h1, h2, pos`` (int64) and ``flags`` (int8), in no particular order."""
        t = self.table[self.table[:, 2] >= 0]
        return {"h1": t[:, 0], "h2": t[:, 1], "pos": t[:, 2], "flags": t[:, 3].astype(np.int8)}
