"""An optional C accelerator for the three hot loops of ``entry_scan``.

The numpy code in ``entry_scan`` is the reference and always works. Where a C compiler is at
hand (``cc``), the first use in a process compiles the small C source below into a shared
library cached by the hash of its source (``$COMPACTMQ_NATIVE_CACHE``, else ``~/.cache/compactmq``,
else ``$TMPDIR/compactmq-native-<uid>``) and loads it with ctypes; each function then walks the
protobuf fields of one record at a time in C, which is about ten times cheaper than numpy's
lockstep rounds. Results are identical (the tests compare both paths); set ``COMPACTMQ_NATIVE=0``
to use numpy only. A Spark executor without a compiler simply uses numpy.

Loading a shared object runs its code in the broker, so the cache directory must be one only
this user can write: the loader creates it with mode 0700 and, before building or loading,
checks it with ``lstat`` (a real directory, not a symlink, owned by this uid, no group or other
permission bits; one only others could read, as older releases made it, is tightened to
0700) and checks the library file the same way (a regular file owned by this uid,
writable by nobody else). Anything else (say a directory another local user planted in
``/tmp``) turns the fast path off. The compiler is ``cc`` from ``PATH``; ``$CC`` is ignored
unless ``COMPACTMQ_NATIVE_USE_CC=true`` asks for it. When the fast path is unavailable the
reason is logged once per process.

This is a stopgap until the accelerator becomes a build-time extension.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import stat
import subprocess
import tempfile
import threading
from typing import Optional

import numpy as np

MD_COLS = 12  # md_start, md_end, key_off, key_len, bits, num_messages, compression, uncompressed_size,
#              event_time, publish_time, uncompressed span start, span end
SM_COLS = 13  # batch, index, seg_start, smm_start, smm_end, payload_end, key_off, key_len, payload_size,
#              compacted_out, event_time, size span start, size span end

SOURCE = r"""
#include <stdint.h>
#include <string.h>

static inline int varint(const uint8_t *b, int64_t end, int64_t *p, uint64_t *v) {
    uint64_t r = 0; int shift = 0;
    while (*p < end) {
        uint8_t c = b[(*p)++];
        r |= (uint64_t)(c & 0x7f) << shift;
        if (!(c & 0x80)) { *v = r; return 0; }
        shift += 7;
        if (shift > 63) return -1;
    }
    return -1;
}

/* one protobuf field at *p (< end): number, wire type, varint value or data offset/length,
   and the offset of its tag */
static inline int field(const uint8_t *b, int64_t end, int64_t *p, uint64_t *num, int *wt,
                        uint64_t *val, int64_t *data, int64_t *dlen, int64_t *tag_at) {
    uint64_t tag, l;
    *tag_at = *p;
    if (varint(b, end, p, &tag)) return -1;
    *num = tag >> 3; *wt = (int)(tag & 7); *val = 0; *data = -1; *dlen = 0;
    switch (*wt) {
    case 0: return varint(b, end, p, val);
    case 2:
        if (varint(b, end, p, &l) || l > (uint64_t)(end - *p)) return -1;
        *data = *p; *dlen = (int64_t)l; *p += (int64_t)l; return 0;
    case 1: if (end - *p < 8) return -1; *p += 8; return 0;
    case 5: if (end - *p < 4) return -1; *p += 4; return 0;
    }
    return -1;
}

static inline uint32_t be32(const uint8_t *b) {
    return ((uint32_t)b[0] << 24) | ((uint32_t)b[1] << 16) | ((uint32_t)b[2] << 8) | b[3];
}

/* outer MessageMetadata of n entries; out is n x 12 (see MD_COLS). returns 0, or -(i+1) when
   entry i is malformed */
int64_t cmq_scan_md(const uint8_t *b, int64_t blen, const int64_t *off, const int64_t *len,
                    int64_t n, int64_t *out) {
    for (int64_t i = 0; i < n; i++) {
        int64_t *o = out + i * 12;
        int64_t s = off[i], e = off[i] + len[i];
        if (s < 0 || e > blen || e - s < 4) return -(i + 1);
        int64_t at = (b[s] == 0x0e && b[s + 1] == 0x01) ? s + 6 : s;
        if (at + 4 > e) return -(i + 1);
        int64_t ms = at + 4, me = ms + (int64_t)be32(b + at);
        if (me > e) return -(i + 1);
        o[0] = ms; o[1] = me; o[2] = 0; o[3] = -1; o[4] = 0; o[5] = 1; o[6] = 0; o[7] = 0;
        o[8] = 0; o[9] = 0; o[10] = -1; o[11] = -1;
        int64_t p = ms;
        while (p < me) {
            uint64_t num, v; int wt; int64_t d, dl, t;
            if (field(b, me, &p, &num, &wt, &v, &d, &dl, &t)) return -(i + 1);
            switch (num) {
            case 3: if (wt == 0) o[9] = (int64_t)v; break;
            case 6: if (wt == 2) { o[2] = d; o[3] = dl; } break;
            case 8: if (wt == 0) o[6] = (int64_t)v; break;
            case 9: if (wt == 0) { o[7] = (int64_t)v; o[10] = t; o[11] = p; } break;
            case 11: if (wt == 0) { o[4] |= 1; o[5] = (int64_t)v; } break;
            case 12: if (wt == 0) o[8] = (int64_t)v; break;
            case 13: o[4] |= 2; break;
            case 20: o[4] |= 4; break;
            }
        }
    }
    return 0;
}

/* sub-messages of nb batch payloads; out has room for cap rows of 13 (see SM_COLS). returns the
   number of rows, or -(i+1) when batch i is malformed, or -(nb+1) when out is too small */
int64_t cmq_scan_batches(const uint8_t *b, int64_t blen, const int64_t *starts, const int64_t *ends,
                         const int64_t *counts, int64_t nb, int64_t cap, int64_t *out) {
    int64_t r = 0;
    for (int64_t i = 0; i < nb; i++) {
        int64_t p = starts[i], e = ends[i];
        if (e > blen) return -(i + 1);
        for (int64_t k = 0; k < counts[i] && p < e; k++) {
            if (r >= cap) return -(nb + 1);
            if (p + 4 > e) return -(i + 1);
            int64_t s0 = p + 4, s1 = s0 + (int64_t)be32(b + p);
            if (s1 > e) return -(i + 1);
            int64_t *o = out + r * 13;
            o[0] = i; o[1] = k; o[2] = p; o[3] = s0; o[4] = s1; o[6] = 0; o[7] = -1; o[8] = 0;
            o[9] = 0; o[10] = 0; o[11] = -1; o[12] = -1;
            int64_t q = s0;
            while (q < s1) {
                uint64_t num, v; int wt; int64_t d, dl, t;
                if (field(b, s1, &q, &num, &wt, &v, &d, &dl, &t)) return -(i + 1);
                switch (num) {
                case 2: if (wt == 2) { o[6] = d; o[7] = dl; } break;
                case 3: if (wt == 0) { o[8] = (int64_t)v; o[11] = t; o[12] = q; } break;
                case 4: if (wt == 0) o[9] = v != 0; break;
                case 5: if (wt == 0) o[10] = (int64_t)v; break;
                }
            }
            if (o[8] < 0 || o[8] > e - s1) return -(i + 1);
            o[5] = s1 + o[8];
            p = o[5];
            r++;
        }
    }
    return r;
}

static inline uint64_t fmix(uint64_t h) {
    h ^= h >> 33; h *= 0xFF51AFD7ED558CCDULL; h ^= h >> 33; h *= 0xC4CEB9FE1A85EC53ULL;
    return h ^ (h >> 33);
}

/* dst[ds[i] : ds[i] + len[i]] = src[ss[i] : ss[i] + len[i]]; bounds are checked by the caller */
void cmq_copy_ranges(uint8_t *dst, const int64_t *ds, const uint8_t *src, const int64_t *ss,
                     const int64_t *len, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (len[i] > 0) memcpy(dst + ds[i], src + ss[i], (size_t)len[i]);
}

/* keep[i] = 1 when row i is the last row of its key (h1, h2) in input order: an open-addressing
   table of row indexes (cap a power of two > n, filled with -1 by the caller), probed from the
   last row backwards. returns the number of rows kept */
int64_t cmq_last_per_key(const uint64_t *h1, const uint64_t *h2, int64_t n, uint8_t *keep,
                         int64_t *table, int64_t cap) {
    int64_t kept = 0, mask = cap - 1;
    for (int64_t i = n - 1; i >= 0; i--) {
        int64_t s = (int64_t)(h1[i] & (uint64_t)mask);
        for (;;) {
            int64_t j = table[s];
            if (j < 0) { table[s] = i; keep[i] = 1; kept++; break; }
            if (h1[j] == h1[i] && h2[j] == h2[i]) { keep[i] = 0; break; }
            s = (s + 1) & mask;
        }
    }
    return kept;
}

/* the two key hashes of entry_scan.hash_keys */
void cmq_hash_keys(const uint8_t *b, const int64_t *off, const int64_t *len, int64_t n,
                   const uint64_t *seeds, uint64_t *h1, uint64_t *h2) {
    for (int64_t i = 0; i < n; i++) {
        int64_t l = len[i] > 0 ? len[i] : 0;
        const uint8_t *k = b + off[i];
        uint64_t a = fmix((uint64_t)l ^ seeds[0]), c = fmix((uint64_t)l ^ seeds[2]);
        for (int64_t j = 0; j < l; j += 8) {
            uint64_t w = 0;
            int64_t m = l - j < 8 ? l - j : 8;
            for (int64_t x = 0; x < m; x++) w |= (uint64_t)k[j + x] << (8 * x);
            a = (a ^ fmix(w ^ seeds[1])) * 0xFF51AFD7ED558CCDULL + seeds[0];
            c = (c ^ fmix(w ^ seeds[3])) * 0xFF51AFD7ED558CCDULL + seeds[2];
        }
        h1[i] = fmix(a); h2[i] = fmix(c);
    }
}
"""

log = logging.getLogger(__name__)

_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_tried = False


class NativeUnavailable(Exception):
    """Why the fast path is off (logged once; callers then use numpy)."""


def _cache_dir() -> str:
    d = os.environ.get("COMPACTMQ_NATIVE_CACHE")
    if not d:
        home = os.path.expanduser("~")
        d = os.path.join(home, ".cache", "compactmq") if home and home != "~" else ""
    if not d:
        d = os.path.join(tempfile.gettempdir(), f"compactmq-native-{os.getuid()}")
    return d


def _private_dir(d: str) -> str:
    """``d``, created 0700 when missing; raises NativeUnavailable unless it is a real directory
    (not a symlink) owned by this user with no group/other permissions."""
    parent = os.path.dirname(os.path.abspath(d))
    os.makedirs(parent, exist_ok=True)
    try:
        os.mkdir(d, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(d)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise NativeUnavailable(f"{d} is not a directory (a symlink is never followed)")
    if st.st_uid != os.getuid():
        raise NativeUnavailable(f"{d} is owned by uid {st.st_uid}, not by this user ({os.getuid()})")
    if st.st_mode & 0o022:
        raise NativeUnavailable(
            f"{d} has mode {stat.S_IMODE(st.st_mode):o}: others may have written to it; it must be 700"
        )
    if st.st_mode & 0o077:  # ours, and nobody else could write to it (an older release made it 755)
        os.chmod(d, 0o700)
    return d


def _check_library(so: str) -> None:
    st = os.lstat(so)
    if not stat.S_ISREG(st.st_mode):
        raise NativeUnavailable(f"{so} is not a regular file (a symlink is never followed)")
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise NativeUnavailable(f"{so} is not owned by this user or is writable by others")


def _compiler() -> str:
    from ..config import parse_bool

    if parse_bool(os.environ.get("COMPACTMQ_NATIVE_USE_CC"), False) and os.environ.get("CC"):
        return os.environ["CC"]
    return "cc"


def _build() -> ctypes.CDLL:
    digest = hashlib.sha256(SOURCE.encode()).hexdigest()[:16]
    d = _private_dir(_cache_dir())
    so = os.path.join(d, f"cmq_scan_{digest}.so")
    if not os.path.lexists(so):
        with tempfile.TemporaryDirectory(dir=d) as tmp:
            src = os.path.join(tmp, "cmq_scan.c")
            with open(src, "w") as f:
                f.write(SOURCE)
            out = os.path.join(tmp, "cmq_scan.so")
            try:
                subprocess.run(
                    [_compiler(), "-O2", "-shared", "-fPIC", "-o", out, src],
                    check=True,
                    capture_output=True,
                    timeout=60,
                )
            except (OSError, subprocess.SubprocessError) as e:
                raise NativeUnavailable(f"no usable C compiler ({e})") from None
            os.chmod(out, 0o700)
            os.replace(out, so)  # atomic: concurrent workers never load a half-written file
    _check_library(so)
    lib = ctypes.CDLL(so)
    p = ctypes.c_void_p
    i64 = ctypes.c_int64
    lib.cmq_scan_md.argtypes = [p, i64, p, p, i64, p]
    lib.cmq_scan_md.restype = i64
    lib.cmq_scan_batches.argtypes = [p, i64, p, p, p, i64, i64, p]
    lib.cmq_scan_batches.restype = i64
    lib.cmq_hash_keys.argtypes = [p, p, p, i64, p, p, p]
    lib.cmq_hash_keys.restype = None
    lib.cmq_copy_ranges.argtypes = [p, p, p, p, p, i64]
    lib.cmq_copy_ranges.restype = None
    lib.cmq_last_per_key.argtypes = [p, p, i64, p, p, i64]
    lib.cmq_last_per_key.restype = i64
    return lib


def library() -> Optional[ctypes.CDLL]:
    """The compiled library, or None (disabled, unsafe cache directory, or no compiler): callers
    then use numpy. The first call decides for the whole process and logs why when it is None."""
    global _lib, _tried
    if os.environ.get("COMPACTMQ_NATIVE", "1") == "0":
        return None
    if _tried:
        return _lib
    with _lock:
        if not _tried:
            try:
                _lib = _build()
            except Exception as e:  # noqa: BLE001 - any failure means: use numpy
                _lib = None
                log.warning("native scan accelerator unavailable, using numpy: %s", e)
            _tried = True
    return _lib


def _ptr(a: np.ndarray) -> int:
    return a.ctypes.data


def _u8(buf: np.ndarray) -> np.ndarray:
    return buf if buf.dtype == np.uint8 and buf.flags.c_contiguous else np.ascontiguousarray(buf, np.uint8)


def scan_md(lib, buf: np.ndarray, offsets: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    from ..errors import CompactionError

    buf = _u8(buf)
    off = np.ascontiguousarray(offsets, np.int64)
    ln = np.ascontiguousarray(lengths, np.int64)
    out = np.empty((len(off), MD_COLS), np.int64)
    rc = lib.cmq_scan_md(_ptr(buf), len(buf), _ptr(off), _ptr(ln), len(off), _ptr(out))
    if rc < 0:
        raise CompactionError(f"malformed entry metadata (entry {-rc - 1} of the batch)")
    return out


def scan_batches(lib, buf: np.ndarray, starts, ends, counts) -> np.ndarray:
    from ..errors import CompactionError

    buf = _u8(buf)
    s = np.ascontiguousarray(starts, np.int64)
    e = np.ascontiguousarray(ends, np.int64)
    c = np.ascontiguousarray(np.maximum(counts, 0), np.int64)
    cap = int(c.sum())
    out = np.empty((cap, SM_COLS), np.int64)
    rc = lib.cmq_scan_batches(_ptr(buf), len(buf), _ptr(s), _ptr(e), _ptr(c), len(s), cap, _ptr(out))
    if rc < 0:
        raise CompactionError(f"malformed batch (batch {-rc - 1} of the selection)")
    return out[:rc]


def hash_keys(lib, buf: np.ndarray, off, ln, seeds: np.ndarray):
    buf = _u8(buf)
    off = np.ascontiguousarray(off, np.int64)
    ln = np.ascontiguousarray(ln, np.int64)
    h1 = np.empty(len(off), np.uint64)
    h2 = np.empty(len(off), np.uint64)
    if len(buf) == 0:
        buf = np.zeros(1, np.uint8)
    lib.cmq_hash_keys(_ptr(buf), _ptr(off), _ptr(ln), len(off), _ptr(seeds), _ptr(h1), _ptr(h2))
    return h1.view(np.int64), h2.view(np.int64)


def copy_ranges(lib, dst: np.ndarray, dst_starts, src: np.ndarray, src_starts, lens) -> None:
    from ..errors import CompactionError

    src = _u8(src)
    ds = np.ascontiguousarray(dst_starts, np.int64)
    ss = np.ascontiguousarray(src_starts, np.int64)
    ln = np.ascontiguousarray(lens, np.int64)
    pos = ln > 0
    if pos.any() and (
        ds[pos].min() < 0
        or ss[pos].min() < 0
        or (ds + ln)[pos].max() > len(dst)
        or (ss + ln)[pos].max() > len(src)
    ):
        raise CompactionError("copy range out of bounds")
    if not (dst.flags.c_contiguous and dst.dtype == np.uint8 and dst.flags.writeable):
        raise ValueError("dst must be a writable contiguous uint8 array")
    lib.cmq_copy_ranges(_ptr(dst), _ptr(ds), _ptr(src), _ptr(ss), _ptr(ln), len(ln))


def last_per_key(lib, h1: np.ndarray, h2: np.ndarray) -> np.ndarray:
    """Mask of the rows that are the last of their key (h1, h2)."""
    a = np.ascontiguousarray(h1, np.int64)
    b = np.ascontiguousarray(h2, np.int64)
    n = len(a)
    cap = 1 << max(4, int(2 * n).bit_length())
    table = np.full(cap, -1, np.int64)
    keep = np.zeros(n, np.uint8)
    lib.cmq_last_per_key(_ptr(a), _ptr(b), n, _ptr(keep), _ptr(table), cap)
    return keep.view(bool)
