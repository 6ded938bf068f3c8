/* compactmq.compaction._scan: the C loops behind compaction's entry scanner.
 *
 * A CPython extension built at install time (setup.py declares it; `pip install .` and
 * `pip install -e .` compile it). compactmq.compaction.native wraps it and falls back to the numpy
 * code of entry_scan when it is absent; both give identical results (tests/compaction compares
 * them). Every function takes buffer objects (numpy arrays, bytes, bytearrays) and writes its
 * results into arrays the caller allocated, so no Python object is created per record; the GIL is
 * released while a loop runs. Offsets and counts are int64 and must be 8-byte aligned and
 * C-contiguous (numpy.ascontiguousarray gives that); every index read from the input is
 * bounds-checked, so malformed entries give an error code, never a read out of bounds.
 *
 * The protobuf field numbers are those of Pulsar's MessageMetadata (3 publish_time,
 * 6 partition_key, 8 compression, 9 uncompressed_size, 11 num_messages_in_batch, 12 event_time,
 * 13 encryption_keys, 20 marker_type) and SingleMessageMetadata (2 partition_key,
 * 3 payload_size, 4 compacted_out, 5 event_time).
 *
 * ABI 2 added upsert_latest: keep-latest's map-side combiner as a table that rows stream into
 * chunk by chunk, so a parsing task holds one row per distinct key, not all its rows.
 * ABI 3 added check_records: a ledger index checked against the record headers it points at;
 * rebuild_subs: the new bodies of batches that lose messages, assembled in one pass; and
 * single_rows: phase-one rows of non-batched entries in one pass (metadata, key hash, flags).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* bump when a function's arguments or output layout change: native.py refuses a stale build */
#define SCAN_ABI 3
#define MD_COLS 12
#define SM_COLS 13

/* ---- the loops (no Python API; run without the GIL) ------------------------------------- */

static inline int varint(const uint8_t *b, int64_t end, int64_t *p, uint64_t *v) {
    uint64_t r = 0;
    int shift = 0;
    while (*p < end) {
        uint8_t c = b[(*p)++];
        r |= (uint64_t)(c & 0x7f) << shift;
        if (!(c & 0x80)) {
            *v = r;
            return 0;
        }
        shift += 7;
        if (shift > 63) return -1;
    }
    return -1;
}

/* one protobuf field at *p (< end): its number, wire type, varint value or data offset and
   length, and the offset of its tag; -1 when it runs past end */
static inline int field(const uint8_t *b, int64_t end, int64_t *p, uint64_t *num, int *wt,
                        uint64_t *val, int64_t *data, int64_t *dlen, int64_t *tag_at) {
    uint64_t tag, l;
    *tag_at = *p;
    if (varint(b, end, p, &tag)) return -1;
    *num = tag >> 3;
    *wt = (int)(tag & 7);
    *val = 0;
    *data = -1;
    *dlen = 0;
    switch (*wt) {
    case 0:
        return varint(b, end, p, val);
    case 2:
        if (varint(b, end, p, &l) || l > (uint64_t)(end - *p)) return -1;
        *data = *p;
        *dlen = (int64_t)l;
        *p += (int64_t)l;
        return 0;
    case 1:
        if (end - *p < 8) return -1;
        *p += 8;
        return 0;
    case 5:
        if (end - *p < 4) return -1;
        *p += 4;
        return 0;
    }
    return -1;
}

static inline uint32_t be32(const uint8_t *b) {
    return ((uint32_t)b[0] << 24) | ((uint32_t)b[1] << 16) | ((uint32_t)b[2] << 8) | b[3];
}

/* outer MessageMetadata of n entries into out (n rows of MD_COLS); 0, or -(i+1) when entry i
   is malformed */
static int64_t scan_md(const uint8_t *b, int64_t blen, const int64_t *off, const int64_t *len,
                       int64_t n, int64_t *out) {
    for (int64_t i = 0; i < n; i++) {
        int64_t *o = out + i * MD_COLS;
        int64_t s = off[i], e = off[i] + len[i];
        if (s < 0 || len[i] < 0 || e > blen || e - s < 4) return -(i + 1);
        /* a stored entry may start with the 0x0e01 magic and a crc32c: skip both */
        int64_t at = (b[s] == 0x0e && b[s + 1] == 0x01) ? s + 6 : s;
        if (at + 4 > e) return -(i + 1);
        int64_t ms = at + 4, me = ms + (int64_t)be32(b + at);
        if (me > e) return -(i + 1);
        o[0] = ms; o[1] = me; o[2] = 0; o[3] = -1; o[4] = 0; o[5] = 1;
        o[6] = 0; o[7] = 0; o[8] = 0; o[9] = 0; o[10] = -1; o[11] = -1;
        int64_t p = ms;
        while (p < me) {
            uint64_t num, v;
            int wt;
            int64_t d, dl, t;
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

/* the sub-messages of nb batch payloads into out (room for cap rows of SM_COLS); the number of
   rows, or -(i+1) when batch i is malformed, or -(nb+1) when out is too small */
static int64_t scan_batches(const uint8_t *b, int64_t blen, const int64_t *starts,
                            const int64_t *ends, const int64_t *counts, int64_t nb, int64_t cap,
                            int64_t *out) {
    int64_t r = 0;
    for (int64_t i = 0; i < nb; i++) {
        int64_t p = starts[i], e = ends[i];
        if (p < 0 || e > blen) return -(i + 1);
        for (int64_t k = 0; k < counts[i] && p < e; k++) {
            if (r >= cap) return -(nb + 1);
            if (p + 4 > e) return -(i + 1);
            int64_t s0 = p + 4, s1 = s0 + (int64_t)be32(b + p);
            if (s1 > e) return -(i + 1);
            int64_t *o = out + r * SM_COLS;
            o[0] = i; o[1] = k; o[2] = p; o[3] = s0; o[4] = s1; o[6] = 0; o[7] = -1;
            o[8] = 0; o[9] = 0; o[10] = 0; o[11] = -1; o[12] = -1;
            int64_t q = s0;
            while (q < s1) {
                uint64_t num, v;
                int wt;
                int64_t d, dl, t;
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
    h ^= h >> 33;
    h *= 0xFF51AFD7ED558CCDULL;
    h ^= h >> 33;
    h *= 0xC4CEB9FE1A85EC53ULL;
    return h ^ (h >> 33);
}

/* the two 64-bit key hashes of entry_scan.hash_keys_np: 8-byte little-endian words, each mixed
   into two accumulators with their own seeds */
static void hash_keys(const uint8_t *b, const int64_t *off, const int64_t *len, int64_t n,
                      const uint64_t *seeds, uint64_t *h1, uint64_t *h2) {
    for (int64_t i = 0; i < n; i++) {
        int64_t l = len[i] > 0 ? len[i] : 0;
        const uint8_t *k = b + (l ? off[i] : 0);
        uint64_t a = fmix((uint64_t)l ^ seeds[0]), c = fmix((uint64_t)l ^ seeds[2]);
        for (int64_t j = 0; j < l; j += 8) {
            uint64_t w = 0;
            int64_t m = l - j < 8 ? l - j : 8;
            for (int64_t x = 0; x < m; x++) w |= (uint64_t)k[j + x] << (8 * x);
            a = (a ^ fmix(w ^ seeds[1])) * 0xFF51AFD7ED558CCDULL + seeds[0];
            c = (c ^ fmix(w ^ seeds[3])) * 0xFF51AFD7ED558CCDULL + seeds[2];
        }
        h1[i] = fmix(a);
        h2[i] = fmix(c);
    }
}

/* keep[i] = 1 when row i is the last of its key (h1, h2) in input order: open addressing over a
   table of row indexes (cap a power of two > n, all -1), filled from the last row backwards;
   the number of rows kept */
static int64_t last_per_key(const uint64_t *h1, const uint64_t *h2, int64_t n, uint8_t *keep,
                            int64_t *table, int64_t cap) {
    int64_t kept = 0, mask = cap - 1;
    for (int64_t i = n - 1; i >= 0; i--) {
        int64_t s = (int64_t)(h1[i] & (uint64_t)mask);
        for (;;) {
            int64_t j = table[s];
            if (j < 0) {
                table[s] = i;
                keep[i] = 1;
                kept++;
                break;
            }
            if (h1[j] == h1[i] && h2[j] == h2[i]) {
                keep[i] = 0;
                break;
            }
            s = (s + 1) & mask;
        }
    }
    return kept;
}

/* the slot of key (h1, h2) in a table of 2^bits slots: multiplicative hashing of both words, so
   that keys whose low bits agree (a retained keyless row's h1 is its position, whose low 16 bits
   are often all 0) still spread over the table */
static inline int64_t slot_of(uint64_t h1, uint64_t h2, int bits) {
    return (int64_t)(((h1 ^ (h2 * 0xC2B2AE3D27D4EB4FULL)) * 0x9E3779B97F4A7C15ULL) >> (64 - bits));
}

#define PREFETCH_AHEAD 8

/* streaming keep-latest: rows i < n (h1, h2, pos >= 0, flags) go into an open-addressing table
   of cap slots (a power of two) of 4 int64 each, h1, h2, pos, flags, a slot with pos < 0 being
   empty: a key already there keeps the row with the greater position, whatever the order rows
   arrive in. A slot holds its whole row, so a row costs one cache miss (prefetched a few rows
   ahead). `count` is the number of slots in use; returns the new count, or -1 when a position
   is negative or the table is full. */
static int64_t upsert_latest(const uint64_t *h1, const uint64_t *h2, const int64_t *pos, const int8_t *flags,
                             int64_t n, int64_t *table, int64_t cap, int64_t count) {
    int bits = 0;
    while (((int64_t)1 << bits) < cap) bits++;
    int64_t mask = cap - 1;
    for (int64_t i = 0; i < n; i++) {
        if (i + PREFETCH_AHEAD < n)
            __builtin_prefetch(table + 4 * slot_of(h1[i + PREFETCH_AHEAD], h2[i + PREFETCH_AHEAD], bits), 1);
        if (pos[i] < 0) return -1;
        int64_t s = slot_of(h1[i], h2[i], bits);
        for (;;) {
            int64_t *e = table + 4 * s;
            if (e[2] < 0) {
                if (count >= cap - 1) return -1; /* keep one slot empty: probes always end */
                e[0] = (int64_t)h1[i];
                e[1] = (int64_t)h2[i];
                e[2] = pos[i];
                e[3] = flags[i];
                count++;
                break;
            }
            if ((uint64_t)e[0] == h1[i] && (uint64_t)e[1] == h2[i]) {
                if (pos[i] > e[2]) {
                    e[2] = pos[i];
                    e[3] = flags[i];
                }
                break;
            }
            s = (s + 1) & mask;
        }
    }
    return count;
}

/* whether the n ledger records at rec[i] (storage.ledger_file's record header: u32 length,
   u32 crc, u64 entry id, i64 publish time, big-endian) have length len[i] and entry id id[i]:
   -1 when all do, else the first i that does not (or lies outside the buffer) */
static int64_t check_records(const uint8_t *b, int64_t blen, const int64_t *rec, const int64_t *len,
                             const int64_t *id, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        int64_t o = rec[i];
        if (o < 0 || o > blen - 16) return i;
        uint64_t e = ((uint64_t)be32(b + o + 8) << 32) | be32(b + o + 12);
        if ((int64_t)be32(b + o) != len[i] || e != (uint64_t)id[i]) return i;
    }
    return -1;
}

/* the new bodies of batches some of whose m sub-messages (in order, batch after batch) are
   dropped: a kept one (keep[r]) is copied as it is, b[seg[r] : pend[r]]; dropped one j (the
   j-th dropped, in order) becomes a placeholder: [u32 new metadata size][its metadata
   b[s0[r] : s1[r]] without the bytes fs[j] .. fe[j] (its payload_size field)][tail], with no
   payload. Writes into out (cap bytes); returns the bytes written, or -1 when a range lies
   outside b or out is too small. */
static int64_t rebuild_subs(const uint8_t *b, int64_t blen, const int64_t *seg, const int64_t *s0,
                            const int64_t *s1, const int64_t *pend, const int64_t *fs, const int64_t *fe,
                            int64_t nd, const uint8_t *keep, int64_t m, const uint8_t *tail, int64_t tlen,
                            uint8_t *out, int64_t cap) {
    int64_t w = 0, j = 0;
    for (int64_t r = 0; r < m; r++) {
        if (keep[r]) {
            int64_t a = seg[r], z = pend[r];
            if (a < 0 || z < a || z > blen || z - a > cap - w) return -1;
            memcpy(out + w, b + a, (size_t)(z - a));
            w += z - a;
            continue;
        }
        if (j >= nd) return -1;
        int64_t a = s0[r], z = s1[r], f = fs[j], g = fe[j];
        j++;
        if (a < 0 || f < a || g < f || z < g || z > blen) return -1;
        int64_t size = (f - a) + (z - g) + tlen;
        if (size > 0xFFFFFFFFLL || 4 + size > cap - w) return -1;
        out[w] = (uint8_t)(size >> 24); out[w + 1] = (uint8_t)(size >> 16);
        out[w + 2] = (uint8_t)(size >> 8); out[w + 3] = (uint8_t)size;
        w += 4;
        memcpy(out + w, b + a, (size_t)(f - a));
        w += f - a;
        memcpy(out + w, b + g, (size_t)(z - g));
        w += z - g;
        memcpy(out + w, tail, (size_t)tlen);
        w += tlen;
    }
    return w;
}

/* phase-one rows of n entries that each hold one message (not batched, or encrypted): the key
   hashes of hash_keys into h1, h2, flags (1: tombstone, an empty payload with a key; 2: no key)
   and event_time. 0, or 1 as soon as an entry is a batch or a marker (the caller then takes the
   general path), or -(i+1) when entry i is malformed. */
static int64_t single_rows(const uint8_t *b, int64_t blen, const int64_t *off, const int64_t *len, int64_t n,
                           const uint64_t *seeds, uint64_t *h1, uint64_t *h2, int8_t *flags, int64_t *et) {
    int64_t o[MD_COLS];
    for (int64_t i = 0; i < n; i++) {
        if (scan_md(b, blen, off + i, len + i, 1, o) < 0) return -(i + 1);
        int64_t bits = o[4];
        if ((bits & 4) || ((bits & 1) && !(bits & 2))) return 1;
        int64_t kl = o[3];
        hash_keys(b, o + 2, o + 3, 1, seeds, h1 + i, h2 + i);
        flags[i] = kl < 0 ? 2 : (off[i] + len[i] == o[1] ? 1 : 0);
        et[i] = o[8];
    }
    return 0;
}

/* ---- argument checks ------------------------------------------------------------------------ */

typedef struct {
    Py_buffer v[12];
    int n;
} Buffers;

static void release(Buffers *bs) {
    for (int i = 0; i < bs->n; i++) PyBuffer_Release(&bs->v[i]);
    bs->n = 0;
}

/* take a C-contiguous buffer from obj (writable when asked) into the next slot */
static Py_buffer *take(Buffers *bs, PyObject *obj, int writable, const char *name) {
    Py_buffer *v = &bs->v[bs->n];
    if (PyObject_GetBuffer(obj, v, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0) {
        PyErr_Format(PyExc_TypeError, "%s: a C-contiguous%s buffer is required", name,
                     writable ? " writable" : "");
        return NULL;
    }
    bs->n++;
    return v;
}

/* the number of int64 in v (which must be 8-byte aligned), or -1 with an error set */
static Py_ssize_t words(Py_buffer *v, const char *name) {
    if (v->len % 8 || ((uintptr_t)v->buf % 8)) {
        PyErr_Format(PyExc_ValueError, "%s: an aligned buffer of 64-bit integers is required", name);
        return -1;
    }
    return v->len / 8;
}

static int need(Py_ssize_t have, Py_ssize_t want, const char *name) {
    if (have < want) {
        PyErr_Format(PyExc_ValueError, "%s: %zd elements, at least %zd needed", name, have, want);
        return -1;
    }
    return 0;
}

/* ---- the module's functions ----------------------------------------------------------------- */

PyDoc_STRVAR(scan_md_doc,
             "scan_md(buf, offsets, lengths, out) -> int\n\n"
             "The outer MessageMetadata of the entries buf[offsets[i]:offsets[i]+lengths[i]] into out\n"
             "(int64, len(offsets) rows of 12). 0, or -(i+1) when entry i is malformed.");

static PyObject *py_scan_md(PyObject *self, PyObject *args) {
    PyObject *ob, *oo, *ol, *out;
    Buffers bs = {.n = 0};
    if (!PyArg_ParseTuple(args, "OOOO", &ob, &oo, &ol, &out)) return NULL;
    Py_buffer *b = take(&bs, ob, 0, "buf"), *o = b ? take(&bs, oo, 0, "offsets") : NULL;
    Py_buffer *l = o ? take(&bs, ol, 0, "lengths") : NULL, *w = l ? take(&bs, out, 1, "out") : NULL;
    if (!w) goto fail;
    Py_ssize_t n = words(o, "offsets"), nl = words(l, "lengths"), nw = words(w, "out");
    if (n < 0 || nl < 0 || nw < 0 || need(nl, n, "lengths") || need(nw, n * MD_COLS, "out")) goto fail;
    int64_t rc;
    Py_BEGIN_ALLOW_THREADS
    rc = scan_md(b->buf, b->len, o->buf, l->buf, n, w->buf);
    Py_END_ALLOW_THREADS
    release(&bs);
    return PyLong_FromLongLong(rc);
fail:
    release(&bs);
    return NULL;
}

PyDoc_STRVAR(scan_batches_doc,
             "scan_batches(buf, starts, ends, counts, out) -> int\n\n"
             "Up to counts[i] sub-messages of each batch payload buf[starts[i]:ends[i]] into out\n"
             "(int64 rows of 13). The number of rows, or -(i+1) when batch i is malformed, or\n"
             "-(len(starts)+1) when out is too small.");

static PyObject *py_scan_batches(PyObject *self, PyObject *args) {
    PyObject *ob, *os_, *oe, *oc, *out;
    Buffers bs = {.n = 0};
    if (!PyArg_ParseTuple(args, "OOOOO", &ob, &os_, &oe, &oc, &out)) return NULL;
    Py_buffer *b = take(&bs, ob, 0, "buf"), *s = b ? take(&bs, os_, 0, "starts") : NULL;
    Py_buffer *e = s ? take(&bs, oe, 0, "ends") : NULL, *c = e ? take(&bs, oc, 0, "counts") : NULL;
    Py_buffer *w = c ? take(&bs, out, 1, "out") : NULL;
    if (!w) goto fail;
    Py_ssize_t n = words(s, "starts"), ne = words(e, "ends"), nc = words(c, "counts");
    Py_ssize_t nw = words(w, "out");
    if (n < 0 || ne < 0 || nc < 0 || nw < 0 || need(ne, n, "ends") || need(nc, n, "counts")) goto fail;
    int64_t rc;
    Py_BEGIN_ALLOW_THREADS
    rc = scan_batches(b->buf, b->len, s->buf, e->buf, c->buf, n, nw / SM_COLS, w->buf);
    Py_END_ALLOW_THREADS
    release(&bs);
    return PyLong_FromLongLong(rc);
fail:
    release(&bs);
    return NULL;
}

PyDoc_STRVAR(hash_keys_doc,
             "hash_keys(buf, offsets, lengths, seeds, h1, h2) -> None\n\n"
             "The two 64-bit hashes of the keys buf[offsets[i]:offsets[i]+lengths[i]] (a length <= 0\n"
             "is the empty key) into h1 and h2; seeds holds four 64-bit seeds.");

static PyObject *py_hash_keys(PyObject *self, PyObject *args) {
    PyObject *ob, *oo, *ol, *osd, *o1, *o2;
    Buffers bs = {.n = 0};
    if (!PyArg_ParseTuple(args, "OOOOOO", &ob, &oo, &ol, &osd, &o1, &o2)) return NULL;
    Py_buffer *b = take(&bs, ob, 0, "buf"), *o = b ? take(&bs, oo, 0, "offsets") : NULL;
    Py_buffer *l = o ? take(&bs, ol, 0, "lengths") : NULL, *sd = l ? take(&bs, osd, 0, "seeds") : NULL;
    Py_buffer *h1 = sd ? take(&bs, o1, 1, "h1") : NULL, *h2 = h1 ? take(&bs, o2, 1, "h2") : NULL;
    if (!h2) goto fail;
    Py_ssize_t n = words(o, "offsets"), nl = words(l, "lengths"), ns = words(sd, "seeds");
    Py_ssize_t n1 = words(h1, "h1"), n2 = words(h2, "h2");
    if (n < 0 || nl < 0 || ns < 0 || n1 < 0 || n2 < 0 || need(nl, n, "lengths") || need(ns, 4, "seeds") ||
        need(n1, n, "h1") || need(n2, n, "h2"))
        goto fail;
    const int64_t *off = o->buf, *len = l->buf;
    for (Py_ssize_t i = 0; i < n; i++)
        if (len[i] > 0 && (off[i] < 0 || off[i] > b->len || len[i] > b->len - off[i])) {
            PyErr_Format(PyExc_ValueError, "hash_keys: key %zd lies outside the buffer", i);
            goto fail;
        }
    Py_BEGIN_ALLOW_THREADS
    hash_keys(b->buf, off, len, n, sd->buf, h1->buf, h2->buf);
    Py_END_ALLOW_THREADS
    release(&bs);
    Py_RETURN_NONE;
fail:
    release(&bs);
    return NULL;
}

PyDoc_STRVAR(copy_ranges_doc,
             "copy_ranges(dst, dst_starts, src, src_starts, lengths) -> None\n\n"
             "dst[dst_starts[i]:+lengths[i]] = src[src_starts[i]:+lengths[i]] for every i with a\n"
             "positive length; ValueError (nothing copied) when a range lies outside its buffer.");

static PyObject *py_copy_ranges(PyObject *self, PyObject *args) {
    PyObject *od, *ods, *osr, *oss, *ol;
    Buffers bs = {.n = 0};
    if (!PyArg_ParseTuple(args, "OOOOO", &od, &ods, &osr, &oss, &ol)) return NULL;
    Py_buffer *d = take(&bs, od, 1, "dst"), *ds = d ? take(&bs, ods, 0, "dst_starts") : NULL;
    Py_buffer *s = ds ? take(&bs, osr, 0, "src") : NULL, *ss = s ? take(&bs, oss, 0, "src_starts") : NULL;
    Py_buffer *l = ss ? take(&bs, ol, 0, "lengths") : NULL;
    if (!l) goto fail;
    Py_ssize_t n = words(l, "lengths"), nd = words(ds, "dst_starts"), nss = words(ss, "src_starts");
    if (n < 0 || nd < 0 || nss < 0 || need(nd, n, "dst_starts") || need(nss, n, "src_starts")) goto fail;
    const int64_t *dst_at = ds->buf, *src_at = ss->buf, *len = l->buf;
    for (Py_ssize_t i = 0; i < n; i++)
        if (len[i] > 0 && (dst_at[i] < 0 || src_at[i] < 0 || dst_at[i] > d->len - len[i] ||
                           src_at[i] > s->len - len[i])) {
            PyErr_Format(PyExc_ValueError, "copy range %zd out of bounds", i);
            goto fail;
        }
    Py_BEGIN_ALLOW_THREADS
    uint8_t *dst = d->buf;
    const uint8_t *src = s->buf;
    for (Py_ssize_t i = 0; i < n; i++)
        if (len[i] > 0) memcpy(dst + dst_at[i], src + src_at[i], (size_t)len[i]);
    Py_END_ALLOW_THREADS
    release(&bs);
    Py_RETURN_NONE;
fail:
    release(&bs);
    return NULL;
}

PyDoc_STRVAR(last_per_key_doc,
             "last_per_key(h1, h2, keep, table) -> int\n\n"
             "keep[i] = 1 (a uint8 array) when row i is the last row of its key (h1[i], h2[i]);\n"
             "table is int64 scratch space, its length a power of two greater than len(h1), all -1.\n"
             "Returns the number of rows kept.");

static PyObject *py_last_per_key(PyObject *self, PyObject *args) {
    PyObject *o1, *o2, *ok, *ot;
    Buffers bs = {.n = 0};
    if (!PyArg_ParseTuple(args, "OOOO", &o1, &o2, &ok, &ot)) return NULL;
    Py_buffer *h1 = take(&bs, o1, 0, "h1"), *h2 = h1 ? take(&bs, o2, 0, "h2") : NULL;
    Py_buffer *k = h2 ? take(&bs, ok, 1, "keep") : NULL, *t = k ? take(&bs, ot, 1, "table") : NULL;
    if (!t) goto fail;
    Py_ssize_t n = words(h1, "h1"), n2 = words(h2, "h2"), cap = words(t, "table");
    if (n < 0 || n2 < 0 || cap < 0 || need(n2, n, "h2") || need(k->len, n, "keep")) goto fail;
    if (cap <= n || (cap & (cap - 1))) {
        PyErr_SetString(PyExc_ValueError, "table: its length must be a power of two greater than len(h1)");
        goto fail;
    }
    int64_t kept;
    Py_BEGIN_ALLOW_THREADS
    kept = last_per_key(h1->buf, h2->buf, n, k->buf, t->buf, cap);
    Py_END_ALLOW_THREADS
    release(&bs);
    return PyLong_FromLongLong(kept);
fail:
    release(&bs);
    return NULL;
}

PyDoc_STRVAR(upsert_latest_doc,
             "upsert_latest(h1, h2, pos, flags, table, count) -> int\n\n"
             "Stream the rows (h1, h2, pos: int64, pos >= 0; flags: int8) into table, int64 slots of 4\n"
             "(h1, h2, pos, flags; pos -1 when empty), a power-of-two number of them, count in use: a\n"
             "key keeps its row of greatest position. Returns the new count of slots in use.");

static PyObject *py_upsert_latest(PyObject *self, PyObject *args) {
    PyObject *o1, *o2, *op, *of, *ot;
    long long count;
    Buffers bs = {.n = 0};
    if (!PyArg_ParseTuple(args, "OOOOOL", &o1, &o2, &op, &of, &ot, &count)) return NULL;
    Py_buffer *h1 = take(&bs, o1, 0, "h1"), *h2 = h1 ? take(&bs, o2, 0, "h2") : NULL;
    Py_buffer *p = h2 ? take(&bs, op, 0, "pos") : NULL, *f = p ? take(&bs, of, 0, "flags") : NULL;
    Py_buffer *t = f ? take(&bs, ot, 1, "table") : NULL;
    if (!t) goto fail;
    Py_ssize_t n = words(h1, "h1"), n2 = words(h2, "h2"), np_ = words(p, "pos"), nt = words(t, "table");
    if (n < 0 || n2 < 0 || np_ < 0 || nt < 0 || need(n2, n, "h2") || need(np_, n, "pos") || need(f->len, n, "flags"))
        goto fail;
    Py_ssize_t cap = nt / 4;
    if (nt % 4 || cap < 2 || (cap & (cap - 1)) || count < 0 || count >= cap) {
        PyErr_SetString(PyExc_ValueError, "table: a power-of-two number (>= 2) of 4-long slots, fewer in use");
        goto fail;
    }
    int64_t out;
    Py_BEGIN_ALLOW_THREADS
    out = upsert_latest(h1->buf, h2->buf, p->buf, f->buf, n, t->buf, cap, count);
    Py_END_ALLOW_THREADS
    release(&bs);
    if (out < 0) {
        PyErr_SetString(PyExc_ValueError, "upsert_latest: a negative position, or the table is full");
        return NULL;
    }
    return PyLong_FromLongLong(out);
fail:
    release(&bs);
    return NULL;
}

PyDoc_STRVAR(check_records_doc,
             "check_records(buf, offsets, lengths, ids) -> int\n\n"
             "Whether the ledger record headers at buf[offsets[i]] (u32 length, u32 crc, u64 entry id,\n"
             "big-endian) carry lengths[i] and ids[i]: -1 when all do, else the first i that does not.");

static PyObject *py_check_records(PyObject *self, PyObject *args) {
    PyObject *ob, *oo, *ol, *oi;
    Buffers bs = {.n = 0};
    if (!PyArg_ParseTuple(args, "OOOO", &ob, &oo, &ol, &oi)) return NULL;
    Py_buffer *b = take(&bs, ob, 0, "buf"), *o = b ? take(&bs, oo, 0, "offsets") : NULL;
    Py_buffer *l = o ? take(&bs, ol, 0, "lengths") : NULL, *d = l ? take(&bs, oi, 0, "ids") : NULL;
    if (!d) goto fail;
    Py_ssize_t n = words(o, "offsets"), nl = words(l, "lengths"), nd = words(d, "ids");
    if (n < 0 || nl < 0 || nd < 0 || need(nl, n, "lengths") || need(nd, n, "ids")) goto fail;
    int64_t rc;
    Py_BEGIN_ALLOW_THREADS
    rc = check_records(b->buf, b->len, o->buf, l->buf, d->buf, n);
    Py_END_ALLOW_THREADS
    release(&bs);
    return PyLong_FromLongLong(rc);
fail:
    release(&bs);
    return NULL;
}

PyDoc_STRVAR(rebuild_subs_doc,
             "rebuild_subs(buf, seg, smm_start, smm_end, payload_end, fs, fe, keep, tail, out) -> int\n\n"
             "The new bodies of batches losing messages, into out: sub-message r kept (keep[r], uint8)\n"
             "as buf[seg[r]:payload_end[r]], else, as the j-th dropped, a placeholder: a u32 size, its\n"
             "metadata buf[smm_start[r]:smm_end[r]] without buf[fs[j]:fe[j]], then tail. Returns the\n"
             "bytes written, or -1 when a range lies outside buf or out is too small.");

static PyObject *py_rebuild_subs(PyObject *self, PyObject *args) {
    PyObject *ob, *o_seg, *o_s0, *o_s1, *o_pe, *o_fs, *o_fe, *o_keep, *o_tail, *o_out;
    Buffers bs = {.n = 0};
    if (!PyArg_ParseTuple(args, "OOOOOOOOOO", &ob, &o_seg, &o_s0, &o_s1, &o_pe, &o_fs, &o_fe, &o_keep, &o_tail, &o_out))
        return NULL;
    Py_buffer *b = take(&bs, ob, 0, "buf"), *sg = b ? take(&bs, o_seg, 0, "seg") : NULL;
    Py_buffer *a0 = sg ? take(&bs, o_s0, 0, "smm_start") : NULL, *a1 = a0 ? take(&bs, o_s1, 0, "smm_end") : NULL;
    Py_buffer *pe = a1 ? take(&bs, o_pe, 0, "payload_end") : NULL, *f0 = pe ? take(&bs, o_fs, 0, "fs") : NULL;
    Py_buffer *f1 = f0 ? take(&bs, o_fe, 0, "fe") : NULL, *k = f1 ? take(&bs, o_keep, 0, "keep") : NULL;
    Py_buffer *t = k ? take(&bs, o_tail, 0, "tail") : NULL, *w = t ? take(&bs, o_out, 1, "out") : NULL;
    if (!w) goto fail;
    Py_ssize_t m = words(sg, "seg"), n0 = words(a0, "smm_start"), n1 = words(a1, "smm_end");
    Py_ssize_t np_ = words(pe, "payload_end"), nd = words(f0, "fs"), nde = words(f1, "fe");
    if (m < 0 || n0 < 0 || n1 < 0 || np_ < 0 || nd < 0 || nde < 0 || need(n0, m, "smm_start") ||
        need(n1, m, "smm_end") || need(np_, m, "payload_end") || need(nde, nd, "fe") || need(k->len, m, "keep"))
        goto fail;
    int64_t rc;
    Py_BEGIN_ALLOW_THREADS
    rc = rebuild_subs(b->buf, b->len, sg->buf, a0->buf, a1->buf, pe->buf, f0->buf, f1->buf, nd, k->buf, m,
                      t->buf, t->len, w->buf, w->len);
    Py_END_ALLOW_THREADS
    release(&bs);
    return PyLong_FromLongLong(rc);
fail:
    release(&bs);
    return NULL;
}

PyDoc_STRVAR(single_rows_doc,
             "single_rows(buf, offsets, lengths, seeds, h1, h2, flags, event_time) -> int\n\n"
             "Phase-one rows of entries holding one message each: key hashes (as hash_keys), flags\n"
             "(int8: 1 tombstone, 2 keyless) and event times. 0; 1 when an entry is a batch or a\n"
             "marker (nothing to rely on then); -(i+1) when entry i is malformed.");

static PyObject *py_single_rows(PyObject *self, PyObject *args) {
    PyObject *ob, *oo, *ol, *osd, *o1, *o2, *of, *oe;
    Buffers bs = {.n = 0};
    if (!PyArg_ParseTuple(args, "OOOOOOOO", &ob, &oo, &ol, &osd, &o1, &o2, &of, &oe)) return NULL;
    Py_buffer *b = take(&bs, ob, 0, "buf"), *o = b ? take(&bs, oo, 0, "offsets") : NULL;
    Py_buffer *l = o ? take(&bs, ol, 0, "lengths") : NULL, *sd = l ? take(&bs, osd, 0, "seeds") : NULL;
    Py_buffer *w1 = sd ? take(&bs, o1, 1, "h1") : NULL, *w2 = w1 ? take(&bs, o2, 1, "h2") : NULL;
    Py_buffer *wf = w2 ? take(&bs, of, 1, "flags") : NULL, *we = wf ? take(&bs, oe, 1, "event_time") : NULL;
    if (!we) goto fail;
    Py_ssize_t n = words(o, "offsets"), nl = words(l, "lengths"), ns = words(sd, "seeds");
    Py_ssize_t n1 = words(w1, "h1"), n2 = words(w2, "h2"), ne = words(we, "event_time");
    if (n < 0 || nl < 0 || ns < 0 || n1 < 0 || n2 < 0 || ne < 0 || need(nl, n, "lengths") || need(ns, 4, "seeds") ||
        need(n1, n, "h1") || need(n2, n, "h2") || need(wf->len, n, "flags") || need(ne, n, "event_time"))
        goto fail;
    int64_t rc;
    Py_BEGIN_ALLOW_THREADS
    rc = single_rows(b->buf, b->len, o->buf, l->buf, n, sd->buf, w1->buf, w2->buf, wf->buf, we->buf);
    Py_END_ALLOW_THREADS
    release(&bs);
    return PyLong_FromLongLong(rc);
fail:
    release(&bs);
    return NULL;
}

static PyMethodDef methods[] = {
    {"scan_md", py_scan_md, METH_VARARGS, scan_md_doc},
    {"scan_batches", py_scan_batches, METH_VARARGS, scan_batches_doc},
    {"hash_keys", py_hash_keys, METH_VARARGS, hash_keys_doc},
    {"copy_ranges", py_copy_ranges, METH_VARARGS, copy_ranges_doc},
    {"last_per_key", py_last_per_key, METH_VARARGS, last_per_key_doc},
    {"upsert_latest", py_upsert_latest, METH_VARARGS, upsert_latest_doc},
    {"check_records", py_check_records, METH_VARARGS, check_records_doc},
    {"rebuild_subs", py_rebuild_subs, METH_VARARGS, rebuild_subs_doc},
    {"single_rows", py_single_rows, METH_VARARGS, single_rows_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "compactmq.compaction._scan",
    "The C loops of compaction's entry scanner (see compactmq.compaction.native).",
    -1,
    methods,
};

PyMODINIT_FUNC PyInit__scan(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddIntConstant(m, "ABI", SCAN_ABI) < 0 || PyModule_AddIntConstant(m, "MD_COLS", MD_COLS) < 0 ||
        PyModule_AddIntConstant(m, "SM_COLS", SM_COLS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
