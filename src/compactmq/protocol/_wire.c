/* compactmq.protocol._wire: the C twin of the readers and writers in wire.py.
 *
 * A CPython extension built at install time (setup.py declares it, optional: without a compiler
 * the install succeeds and wire.py runs its pure-Python code). Each function here does exactly
 * what the Python function of the same name in wire.py does, returns the same values, and refuses
 * (returns None) exactly the shapes the Python code refuses, so callers fall back to protobuf in
 * the same cases; tests/protocol/test_wire.py runs every test on both implementations.
 *
 * Every offset read from the input is bounds-checked against the caller's end; a malformed
 * buffer gives None, never a read out of bounds.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* bump when a function's arguments or results change: wire.py refuses a stale build */
#define WIRE_ABI 4

static inline int rd_varint(const uint8_t *b, Py_ssize_t end, Py_ssize_t *p, uint64_t *v) {
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

static inline Py_ssize_t wr_varint(uint8_t *out, uint64_t v) {
    Py_ssize_t n = 0;
    while (v >= 0x80) {
        out[n++] = (uint8_t)((v & 0x7f) | 0x80);
        v >>= 7;
    }
    out[n++] = (uint8_t)v;
    return n;
}

static inline int64_t as_int32(uint64_t v) { return (int64_t)(int32_t)(uint32_t)(v & 0xffffffffu); }

/* a Python int reduced to its low 64 bits (what `value & MASK64` gives for any int) */
static int u64_of(PyObject *o, uint64_t *v) {
    unsigned long long r = PyLong_AsUnsignedLongLongMask(o);
    if (r == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    *v = (uint64_t)r;
    return 0;
}

static int get_span(PyObject *args, Py_buffer *view, Py_ssize_t *start, Py_ssize_t *end) {
    if (!PyArg_ParseTuple(args, "y*nn", view, start, end)) return -1;
    if (*start < 0 || *end > view->len || *start > *end) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_ValueError, "span outside the buffer");
        return -1;
    }
    return 0;
}

/* the fields of a plain SEND in the BaseCommand at b[start:end]: 1, or 0 when not that shape */
static int send_fields(const uint8_t *b, Py_ssize_t start, Py_ssize_t end, uint64_t *pid_out, uint64_t *seq_out,
                       int64_t *num_out, uint64_t *highest_out) {
    uint64_t size, v, pid = 0, seq = 0, highest = 0;
    int64_t num = 1;
    int have = 0;
    Py_ssize_t p = start + 3;
    if (end - start < 4 || b[start] != 0x08 || b[start + 1] != 6 || b[start + 2] != 0x32) return 0;
    if (rd_varint(b, end, &p, &size) || size != (uint64_t)(end - p)) return 0;
    while (p < end) {
        uint8_t tag = b[p++];
        if (rd_varint(b, end, &p, &v)) return 0;
        switch (tag) {
            case 0x08: pid = v; have |= 1; break;
            case 0x10: seq = v; have |= 2; break;
            case 0x18: num = as_int32(v); break;
            case 0x30: highest = v; break;
            default: return 0;
        }
    }
    if (have != 3) return 0;
    *pid_out = pid;
    *seq_out = seq;
    *num_out = num;
    *highest_out = highest;
    return 1;
}

/* decode_send(buf, start, end) -> (producer_id, sequence_id, num_messages, highest) | None */
static PyObject *decode_send(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t start, end;
    if (get_span(args, &view, &start, &end)) return NULL;
    uint64_t pid, seq, highest;
    int64_t num;
    int ok = send_fields(view.buf, start, end, &pid, &seq, &num, &highest);
    PyBuffer_Release(&view);
    if (!ok) Py_RETURN_NONE;
    return Py_BuildValue("(KKLK)", (unsigned long long)pid, (unsigned long long)seq, (long long)num,
                         (unsigned long long)highest);
}

/* MessageMetadata field number -> accepted wire type (0 varint, 2 length), -1 not accepted */
static const signed char MD_WIRE[31] = {
    -1, 2, 0, 0, 2, 2, 2, 2, 0, 0, -1, 0, 0, -1, 2, 2,
    2,  0, 2, 0, 0, -1, 0, 0, 0, 0, 2,  0, 0, 0,  0,
};

static int plain_key_value(const uint8_t *b, Py_ssize_t p, Py_ssize_t end) {
    int seen = 0;
    uint64_t size;
    while (p < end) {
        uint8_t tag = b[p++];
        if (tag != 0x0a && tag != 0x12) return 0;
        if (rd_varint(b, end, &p, &size) || size > (uint64_t)(end - p)) return 0;
        p += (Py_ssize_t)size;
        seen |= tag == 0x0a ? 1 : 2;
    }
    return p == end && seen == 3;
}

/* the routing fields of the MessageMetadata at b[start:end] as a tuple (see scan_metadata), or
   Py_None (a new reference) when the shape is not one the scanner accepts; NULL on error */
static PyObject *scan_md(const uint8_t *b, Py_ssize_t start, Py_ssize_t end, uint64_t *publish_time_out) {
    uint64_t key, v, size, publish_time = 0;
    int64_t num = 1, deliver_at = 0;
    int has_num = 0, has_deliver = 0, b64 = 0, required = 0;
    Py_ssize_t pk_at = -1, pk_len = 0, ok_at = -1, ok_len = 0;
    Py_ssize_t p = start;
    while (p < end) {
        if (rd_varint(b, end, &p, &key)) Py_RETURN_NONE;
        uint64_t field = key >> 3;
        int wire = (int)(key & 7);
        if (field > 30 || MD_WIRE[field] != wire) Py_RETURN_NONE;
        if (wire == 0) {
            if (rd_varint(b, end, &p, &v)) Py_RETURN_NONE;
            switch (field) {
                case 3: publish_time = v; required |= 4; break;
                case 2: required |= 2; break;
                case 11: num = as_int32(v); has_num = 1; break;
                case 19: deliver_at = (int64_t)v; has_deliver = 1; break;
                case 17: b64 = v != 0; break;
                default: break;
            }
            continue;
        }
        if (rd_varint(b, end, &p, &size) || size > (uint64_t)(end - p)) Py_RETURN_NONE;
        switch (field) {
            case 1: required |= 1; break;
            case 6: pk_at = p; pk_len = (Py_ssize_t)size; break;
            case 18: ok_at = p; ok_len = (Py_ssize_t)size; break;
            case 4:
                if (!plain_key_value(b, p, p + (Py_ssize_t)size)) Py_RETURN_NONE;
                break;
            default: break;
        }
        p += (Py_ssize_t)size;
    }
    if (required != 7) Py_RETURN_NONE;
    if (publish_time_out != NULL) { /* only the publish time is wanted: no tuple */
        *publish_time_out = publish_time;
        return Py_NewRef(Py_True);
    }
    PyObject *pk, *ok;
    if (pk_at >= 0) {
        pk = PyUnicode_DecodeUTF8((const char *)b + pk_at, pk_len, NULL);
        if (pk == NULL) { /* not UTF-8: protobuf decides */
            PyErr_Clear();
            Py_RETURN_NONE;
        }
    } else {
        pk = Py_NewRef(Py_None);
    }
    ok = ok_at >= 0 ? PyBytes_FromStringAndSize((const char *)b + ok_at, ok_len) : Py_NewRef(Py_None);
    if (ok == NULL) {
        Py_DECREF(pk);
        return NULL;
    }
    return Py_BuildValue("(KLNNNNLN)", (unsigned long long)publish_time, (long long)num,
                         PyBool_FromLong(has_num), pk, PyBool_FromLong(b64), ok, (long long)deliver_at,
                         PyBool_FromLong(has_deliver));
}

/* scan_metadata(buf, start, end) -> (publish_time, num_messages_in_batch, has_num, partition_key
   str|None, b64, ordering_key bytes|None, deliver_at_time, has_deliver_at) | None */
static PyObject *scan_metadata(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t start, end;
    if (get_span(args, &view, &start, &end)) return NULL;
    PyObject *out = scan_md(view.buf, start, end, NULL);
    PyBuffer_Release(&view);
    return out;
}

/* where the MessageMetadata of a stored entry lies: [magic crc] optional, then [size][metadata];
   -1 when the sizes do not fit or the entry starts with a broker-entry-metadata prefix */
static int md_bounds(const uint8_t *b, Py_ssize_t n, Py_ssize_t *start, Py_ssize_t *end) {
    Py_ssize_t off = 0;
    if (n >= 2 && b[0] == 0x0e && b[1] == 0x02) return -1;
    if (n >= 2 && b[0] == 0x0e && b[1] == 0x01) off = 6;
    if (n - off < 4) return -1;
    uint32_t size = ((uint32_t)b[off] << 24) | ((uint32_t)b[off + 1] << 16) | ((uint32_t)b[off + 2] << 8) | b[off + 3];
    if ((Py_ssize_t)size > n - off - 4) return -1;
    *start = off + 4;
    *end = off + 4 + (Py_ssize_t)size;
    return 0;
}

/* scan_entry(entry) -> the scan_metadata tuple of a stored entry's metadata, or None */
static PyObject *scan_entry(PyObject *self, PyObject *arg) {
    Py_buffer view;
    Py_ssize_t start, end;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *out = md_bounds(view.buf, view.len, &start, &end) ? Py_NewRef(Py_None) : scan_md(view.buf, start, end, NULL);
    PyBuffer_Release(&view);
    return out;
}

/* CRC32C (Castagnoli), reflected polynomial 0x82F63B78: SSE4.2 when the CPU has it */
static uint32_t crc_table[256];

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[i] = c;
    }
}

static uint32_t crc32c_sw_run(uint32_t c, const uint8_t *p, Py_ssize_t n) {
    while (n--) c = crc_table[(c ^ *p++) & 0xff] ^ (c >> 8);
    return c;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_HW_CRC 1
/* the running (pre-inverted) state: crc32c_hw_run(0xffffffff, ...) ^ 0xffffffff is the CRC */
__attribute__((target("sse4.2"))) static uint32_t crc32c_hw_run(uint32_t c32, const uint8_t *p, Py_ssize_t n) {
    uint64_t c = c32;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = __builtin_ia32_crc32di(c, w);
        p += 8;
        n -= 8;
    }
    c32 = (uint32_t)c;
    while (n--) c32 = __builtin_ia32_crc32qi(c32, *p++);
    return c32;
}
#endif

static int use_hw_crc = 0;

/* continue a CRC32C over more bytes; state starts at 0xffffffff, the CRC is state ^ 0xffffffff */
static uint32_t crc32c_run(uint32_t state, const uint8_t *p, Py_ssize_t n) {
#ifdef HAVE_HW_CRC
    if (use_hw_crc) return crc32c_hw_run(state, p, n);
#endif
    return crc32c_sw_run(state, p, n);
}

static uint32_t crc32c(const uint8_t *p, Py_ssize_t n) { return crc32c_run(0xffffffffu, p, n) ^ 0xffffffffu; }

/* crc32c(data) -> int: the CRC32C of a buffer (for tests against the crc32c package) */
static PyObject *py_crc32c(PyObject *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    uint32_t c = crc32c(view.buf, view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(c);
}

/* the publish time of the entry at b[0:n] when it carries magic, a matching CRC and metadata
   of a shape the scanner accepts: 1; 0 otherwise; -1 with an exception set */
static int checked_pt(const uint8_t *b, Py_ssize_t n, uint64_t *publish_time) {
    Py_ssize_t start, end;
    if (n < 10 || b[0] != 0x0e || b[1] != 0x01) return 0;
    uint32_t carried = ((uint32_t)b[2] << 24) | ((uint32_t)b[3] << 16) | ((uint32_t)b[4] << 8) | b[5];
    if (crc32c(b + 6, n - 6) != carried) return 0;
    if (md_bounds(b, n, &start, &end)) return 0;
    PyObject *out = scan_md(b, start, end, publish_time);
    if (out == NULL) return -1;
    int ok = out != Py_None;
    Py_DECREF(out);
    return ok;
}

/* checked_publish_time(entry) -> the publish time of a SEND's entry that carries magic and a
   matching CRC and whose metadata the scanner accepts; None otherwise (no checksum, a mismatch,
   another shape: the caller takes the general path, which adds the checksum or raises) */
static PyObject *checked_publish_time(PyObject *self, PyObject *arg) {
    Py_buffer view;
    uint64_t publish_time = 0;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    int ok = checked_pt(view.buf, view.len, &publish_time);
    PyBuffer_Release(&view);
    if (ok < 0) return NULL;
    if (!ok) Py_RETURN_NONE;
    return PyLong_FromUnsignedLongLong(publish_time);
}

static inline uint32_t rd_be32(const uint8_t *b) {
    return ((uint32_t)b[0] << 24) | ((uint32_t)b[1] << 16) | ((uint32_t)b[2] << 8) | b[3];
}

static inline void wr_le64(uint8_t *o, uint64_t v) {
    for (int i = 0; i < 8; i++) { o[i] = (uint8_t)v; v >>= 8; }
}

static inline uint64_t rd_le64(const uint8_t *b) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | b[i];
    return v;
}

/* split_sends(buf, pos, end, max_frame_size) -> (next_pos, producer_id, entries, publish_times,
 *   receipts, messages, size, last_sequence_id) | None
 * The run of complete frames from buf[pos:end] that are plain SENDs of one producer whose entries
 * carry magic, a matching CRC and plain metadata (what decode_send and checked_publish_time both
 * accept); it stops before the first frame that is not (or is partial, or breaks the size rules:
 * the general path then reads it and raises or answers as before). None when the first frame is
 * not such a SEND. receipts: 16 bytes per message (sequence_id, highest_sequence_id; u64 little
 * endian) for send_receipt_frames; messages: the sum of num_messages; size: the entries' bytes;
 * last_sequence_id: the largest of the messages' last sequence ids (highest_sequence_id when
 * sent, else sequence_id + max(num_messages, 1) - 1; a frame where that passes 2**64 - 1 ends
 * the run). */
static PyObject *split_sends(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t pos, end, max_frame;
    if (!PyArg_ParseTuple(args, "y*nnn", &view, &pos, &end, &max_frame)) return NULL;
    if (pos < 0 || end > view.len || pos > end) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "span outside the buffer");
        return NULL;
    }
    const uint8_t *b = view.buf;
    PyObject *entries = NULL, *times = NULL, *receipts = NULL;
    uint8_t stack[16 * 256];
    uint8_t *meta = stack;
    Py_ssize_t cap = 256, count = 0, size = 0;
    uint64_t first_pid = 0, last_seq = 0;
    int64_t messages = 0;
    while (end - pos >= 4) {
        uint32_t total = rd_be32(b + pos);
        if ((Py_ssize_t)total > max_frame || total < 4 || (Py_ssize_t)total > end - pos - 4) break;
        Py_ssize_t fstart = pos + 4, fend = fstart + (Py_ssize_t)total;
        uint32_t cmd_size = rd_be32(b + fstart);
        Py_ssize_t cs = fstart + 4;
        if ((Py_ssize_t)cmd_size >= fend - cs) break; /* no entry after the command, or too long */
        Py_ssize_t ce = cs + (Py_ssize_t)cmd_size;
        uint64_t pid, seq, highest, pt = 0;
        int64_t num;
        if (!send_fields(b, cs, ce, &pid, &seq, &num, &highest)) break;
        if (count && pid != first_pid) break;
        int ok = checked_pt(b + ce, fend - ce, &pt);
        if (ok < 0) goto fail;
        if (!ok) break;
        uint64_t last = highest;
        if (!highest) {
            uint64_t extra = num > 1 ? (uint64_t)(num - 1) : 0;
            if (seq > UINT64_MAX - extra) break; /* past 64 bits: the general path keeps Python's ints */
            last = seq + extra;
        }
        if (entries == NULL) {
            entries = PyList_New(0);
            times = PyList_New(0);
            if (entries == NULL || times == NULL) goto fail;
        }
        PyObject *entry = PyBytes_FromStringAndSize((const char *)b + ce, fend - ce);
        if (entry == NULL) goto fail;
        int err = PyList_Append(entries, entry);
        Py_DECREF(entry);
        if (err) goto fail;
        PyObject *t = PyLong_FromUnsignedLongLong(pt);
        if (t == NULL) goto fail;
        err = PyList_Append(times, t);
        Py_DECREF(t);
        if (err) goto fail;
        if (count == cap) {
            uint8_t *bigger = PyMem_Malloc((size_t)cap * 2 * 16);
            if (bigger == NULL) {
                PyErr_NoMemory();
                goto fail;
            }
            memcpy(bigger, meta, (size_t)count * 16);
            if (meta != stack) PyMem_Free(meta);
            meta = bigger;
            cap *= 2;
        }
        wr_le64(meta + 16 * count, seq);
        wr_le64(meta + 16 * count + 8, highest);
        if (!count || last > last_seq) last_seq = last;
        first_pid = pid;
        count++;
        messages += num;
        size += fend - ce;
        pos = fend;
    }
    PyBuffer_Release(&view);
    if (!count) {
        if (meta != stack) PyMem_Free(meta);
        Py_RETURN_NONE;
    }
    receipts = PyBytes_FromStringAndSize((const char *)meta, count * 16);
    if (meta != stack) PyMem_Free(meta);
    if (receipts == NULL) {
        Py_DECREF(entries);
        Py_DECREF(times);
        return NULL;
    }
    return Py_BuildValue("(nKNNNLnK)", pos, (unsigned long long)first_pid, entries, times, receipts,
                         (long long)messages, size, (unsigned long long)last_seq);
fail:
    PyBuffer_Release(&view);
    if (meta != stack) PyMem_Free(meta);
    Py_XDECREF(entries);
    Py_XDECREF(times);
    return NULL;
}

static inline void put_u32(uint8_t *out, uint32_t v) {
    out[0] = (uint8_t)(v >> 24);
    out[1] = (uint8_t)(v >> 16);
    out[2] = (uint8_t)(v >> 8);
    out[3] = (uint8_t)v;
}

/* a MessageIdData: ledgerId, entryId, partition (int32: sign-extended), batch_index if >= 0 */
static Py_ssize_t message_id(uint8_t *out, uint64_t ledger, uint64_t entry, int64_t partition, int has_batch,
                             int64_t batch_index) {
    Py_ssize_t n = 0;
    out[n++] = 0x08;
    n += wr_varint(out + n, ledger);
    out[n++] = 0x10;
    n += wr_varint(out + n, entry);
    out[n++] = 0x18;
    n += wr_varint(out + n, (uint64_t)partition);
    if (has_batch) {
        out[n++] = 0x20;
        n += wr_varint(out + n, (uint64_t)batch_index);
    }
    return n;
}

/* a framed SEND_RECEIPT at out (room for 120 bytes); its length */
static Py_ssize_t receipt(uint8_t *out, uint64_t pid, uint64_t seq, uint64_t ledger, uint64_t entry, long partition,
                          int has_highest, uint64_t highest) {
    uint8_t mid[40], inner[100];
    Py_ssize_t m = message_id(mid, ledger, entry, (int64_t)(int32_t)partition, 0, 0);
    Py_ssize_t n = 0;
    inner[n++] = 0x08;
    n += wr_varint(inner + n, pid);
    inner[n++] = 0x10;
    n += wr_varint(inner + n, seq);
    inner[n++] = 0x1a;
    n += wr_varint(inner + n, (uint64_t)m);
    memcpy(inner + n, mid, (size_t)m);
    n += m;
    if (has_highest) {
        inner[n++] = 0x20;
        n += wr_varint(inner + n, highest);
    }
    Py_ssize_t c = 8;
    out[c++] = 0x08;
    out[c++] = 0x07;
    out[c++] = 0x3a;
    c += wr_varint(out + c, (uint64_t)n);
    memcpy(out + c, inner, (size_t)n);
    c += n;
    put_u32(out, (uint32_t)(c - 4));
    put_u32(out + 4, (uint32_t)(c - 8));
    return c;
}

/* send_receipt_frame(producer_id, sequence_id, ledger_id, entry_id, partition, highest|None) */
static PyObject *send_receipt_frame(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "send_receipt_frame takes 6 arguments");
        return NULL;
    }
    uint64_t pid, seq, ledger, entry, highest = 0;
    if (u64_of(args[0], &pid) || u64_of(args[1], &seq) || u64_of(args[2], &ledger) || u64_of(args[3], &entry))
        return NULL;
    long partition = PyLong_AsLong(args[4]);
    if (partition == -1 && PyErr_Occurred()) return NULL;
    int has_highest = args[5] != Py_None;
    if (has_highest && u64_of(args[5], &highest)) return NULL;
    uint8_t out[120];
    Py_ssize_t c = receipt(out, pid, seq, ledger, entry, partition, has_highest, highest);
    return PyBytes_FromStringAndSize((const char *)out, c);
}

/* send_receipt_frames(producer_id, partition, ledger_id, first_entry_id, receipts) -> bytes: the
   SEND_RECEIPTs of a run (receipts as split_sends gives them: a highest_sequence_id of 0 is not
   sent), the i-th for entry first_entry_id + i, one after the other */
static PyObject *send_receipt_frames(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "send_receipt_frames takes 5 arguments");
        return NULL;
    }
    uint64_t pid, ledger, first;
    if (u64_of(args[0], &pid) || u64_of(args[2], &ledger) || u64_of(args[3], &first)) return NULL;
    long partition = PyLong_AsLong(args[1]);
    if (partition == -1 && PyErr_Occurred()) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[4], &view, PyBUF_SIMPLE) < 0) return NULL;
    if (view.len % 16) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "receipts: 16 bytes per message");
        return NULL;
    }
    Py_ssize_t count = view.len / 16;
    PyObject *out = PyBytes_FromStringAndSize(NULL, count * 120);
    if (out == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    uint8_t *o = (uint8_t *)PyBytes_AS_STRING(out);
    const uint8_t *m = view.buf;
    Py_ssize_t c = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        uint64_t seq = rd_le64(m + 16 * i), highest = rd_le64(m + 16 * i + 8);
        c += receipt(o + c, pid, seq, ledger, first + (uint64_t)i, partition, highest != 0, highest);
    }
    PyBuffer_Release(&view);
    if (_PyBytes_Resize(&out, c) < 0) return NULL;
    return out;
}

/* message_frame_header(consumer_id, ledger_id, entry_id, partition, redelivery_count, ack_set,
   entry_size, batch_index=None) */
static PyObject *message_frame_header(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 7 || nargs > 8) {
        PyErr_SetString(PyExc_TypeError, "message_frame_header takes 7 or 8 arguments");
        return NULL;
    }
    uint64_t consumer, ledger, entry, redelivery;
    if (u64_of(args[0], &consumer) || u64_of(args[1], &ledger) || u64_of(args[2], &entry) ||
        u64_of(args[4], &redelivery))
        return NULL;
    long partition = PyLong_AsLong(args[3]);
    if (partition == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t entry_size = PyLong_AsSsize_t(args[6]);
    if (entry_size == -1 && PyErr_Occurred()) return NULL;
    int has_batch = 0;
    long long batch_index = -1;
    if (nargs == 8 && args[7] != Py_None) {
        batch_index = PyLong_AsLongLong(args[7]);
        if (batch_index == -1 && PyErr_Occurred()) return NULL;
        has_batch = batch_index >= 0;
    }
    PyObject *ack_set = args[5];
    Py_ssize_t words = 0;
    PyObject *seq = NULL;
    if (ack_set != Py_None) {
        seq = PySequence_Fast(ack_set, "ack_set must be a sequence");
        if (seq == NULL) return NULL;
        words = PySequence_Fast_GET_SIZE(seq);
    }
    /* 32 bytes of frame head in front of the body; the body: consumer id, message id (at most
       45 bytes), redelivery count, 11 bytes per ack_set word */
    Py_ssize_t cap = 32 + 80 + 11 * words;
    uint8_t stack[256];
    uint8_t *buf = cap <= (Py_ssize_t)sizeof(stack) ? stack : PyMem_Malloc((size_t)cap);
    if (buf == NULL) {
        Py_XDECREF(seq);
        return PyErr_NoMemory();
    }
    uint8_t mid[48];
    Py_ssize_t m = message_id(mid, ledger, entry, (int64_t)(int32_t)partition, has_batch, batch_index);
    /* the body first, after room for the frame head, then the head in front of it */
    uint8_t *inner = buf + 32;
    Py_ssize_t n = 0;
    inner[n++] = 0x08;
    n += wr_varint(inner + n, consumer);
    inner[n++] = 0x12;
    n += wr_varint(inner + n, (uint64_t)m);
    memcpy(inner + n, mid, (size_t)m);
    n += m;
    inner[n++] = 0x18;
    n += wr_varint(inner + n, redelivery & 0xffffffffu);
    for (Py_ssize_t i = 0; i < words; i++) {
        uint64_t w;
        if (u64_of(PySequence_Fast_GET_ITEM(seq, i), &w)) {
            Py_DECREF(seq);
            if (buf != stack) PyMem_Free(buf);
            return NULL;
        }
        inner[n++] = 0x20;
        n += wr_varint(inner + n, w);
    }
    Py_XDECREF(seq);
    uint8_t head[24];
    Py_ssize_t h = 8;
    head[h++] = 0x08;
    head[h++] = 0x09;
    head[h++] = 0x4a;
    h += wr_varint(head + h, (uint64_t)n);
    Py_ssize_t command = h - 8 + n;
    put_u32(head, (uint32_t)(command + 4 + entry_size));
    put_u32(head + 4, (uint32_t)command);
    memcpy(inner - h, head, (size_t)h);
    PyObject *out = PyBytes_FromStringAndSize((const char *)(inner - h), h + n);
    if (buf != stack) PyMem_Free(buf);
    return out;
}

/* --- ledger records (the format is storage/ledger_file.py's; these are twins of its
 * _py_record_header and _py_frame_records, tested byte for byte against them) ----------- */

#define RECORD_HEADER_SIZE 24

static inline void wr_be32(uint8_t *o, uint32_t v) {
    o[0] = (uint8_t)(v >> 24); o[1] = (uint8_t)(v >> 16); o[2] = (uint8_t)(v >> 8); o[3] = (uint8_t)v;
}

static inline void wr_be64(uint8_t *o, uint64_t v) {
    for (int i = 7; i >= 0; i--) { o[i] = (uint8_t)v; v >>= 8; }
}

/* the 24-byte header of a record: length, CRC32C(entry_id, publish_ms, data), entry_id, publish_ms */
static void fill_record_header(uint8_t *h, uint64_t entry_id, int64_t pt, const uint8_t *data, Py_ssize_t n) {
    wr_be64(h + 8, entry_id);
    wr_be64(h + 16, (uint64_t)pt);
    uint32_t c = crc32c_run(0xffffffffu, h + 8, 16);
    c = crc32c_run(c, data, n) ^ 0xffffffffu;
    wr_be32(h, (uint32_t)n);
    wr_be32(h + 4, c);
}

/* record_header(entry_id, publish_time_ms, data) -> bytes: the 24 bytes before data */
static PyObject *record_header(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "record_header(entry_id, publish_time_ms, data)");
        return NULL;
    }
    unsigned long long eid = PyLong_AsUnsignedLongLong(args[0]);
    if (eid == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    long long pt = PyLong_AsLongLong(args[1]);
    if (pt == -1 && PyErr_Occurred()) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[2], &view, PyBUF_SIMPLE) < 0) return NULL;
    if ((unsigned long long)view.len > 0xffffffffull) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "record data longer than a u32 length");
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, RECORD_HEADER_SIZE);
    if (out != NULL)
        fill_record_header((uint8_t *)PyBytes_AS_STRING(out), eid, pt, view.buf, view.len);
    PyBuffer_Release(&view);
    return out;
}

/* frame_records(datas, publish_times, now, first_entry_id, start, max_size)
 *   -> (parts, offsets, times, end) or None when an entry is longer than max_size.
 * datas and publish_times are lists of one length (a publish time of None means now);
 * parts is [header0, data0, header1, data1, ...] (the data objects themselves, not copies),
 * offsets and times the native int64 bytes of each record's file offset and publish time,
 * end the offset just past the last record. */
static PyObject *frame_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6 || !PyList_Check(args[0]) || !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "frame_records(datas: list, publish_times: list, now, first_entry_id, start, max_size)");
        return NULL;
    }
    PyObject *datas = args[0], *pts = args[1];
    Py_ssize_t n = PyList_GET_SIZE(datas);
    if (PyList_GET_SIZE(pts) != n) {
        PyErr_SetString(PyExc_ValueError, "frame_records: one publish time per entry");
        return NULL;
    }
    long long now = PyLong_AsLongLong(args[2]);
    if (now == -1 && PyErr_Occurred()) return NULL;
    unsigned long long first = PyLong_AsUnsignedLongLong(args[3]);
    if (first == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    long long off = PyLong_AsLongLong(args[4]);
    if (off == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t max_size = PyLong_AsSsize_t(args[5]);
    if (max_size == -1 && PyErr_Occurred()) return NULL;
    PyObject *parts = PyList_New(2 * n);
    PyObject *offs = PyBytes_FromStringAndSize(NULL, n * 8);
    PyObject *times = PyBytes_FromStringAndSize(NULL, n * 8);
    if (parts == NULL || offs == NULL || times == NULL) goto fail;
    int64_t *o = (int64_t *)PyBytes_AS_STRING(offs);
    int64_t *t = (int64_t *)PyBytes_AS_STRING(times);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *d = PyList_GET_ITEM(datas, i);
        PyObject *p = PyList_GET_ITEM(pts, i);
        long long pt = now;
        if (p != Py_None) {
            PyObject *as_int = PyNumber_Long(p); /* int(p), as the Python twin does */
            if (as_int == NULL) goto fail;
            pt = PyLong_AsLongLong(as_int);
            Py_DECREF(as_int);
            if (pt == -1 && PyErr_Occurred()) goto fail;
        }
        Py_buffer view;
        if (PyObject_GetBuffer(d, &view, PyBUF_SIMPLE) < 0) goto fail;
        if (view.len > max_size) {
            PyBuffer_Release(&view);
            Py_DECREF(parts); Py_DECREF(offs); Py_DECREF(times);
            Py_RETURN_NONE;
        }
        PyObject *h = PyBytes_FromStringAndSize(NULL, RECORD_HEADER_SIZE);
        if (h == NULL) {
            PyBuffer_Release(&view);
            goto fail;
        }
        fill_record_header((uint8_t *)PyBytes_AS_STRING(h), first + (uint64_t)i, pt, view.buf, view.len);
        Py_ssize_t len = view.len;
        PyBuffer_Release(&view);
        PyList_SET_ITEM(parts, 2 * i, h);
        Py_INCREF(d);
        PyList_SET_ITEM(parts, 2 * i + 1, d);
        o[i] = off;
        t[i] = pt;
        off += RECORD_HEADER_SIZE + len;
    }
    PyObject *out = Py_BuildValue("(NNNL)", parts, offs, times, off);
    return out;
fail:
    Py_XDECREF(parts);
    Py_XDECREF(offs);
    Py_XDECREF(times);
    return NULL;
}

static PyMethodDef methods[] = {
    {"decode_send", decode_send, METH_VARARGS, "CommandSend fields of a plain SEND, or None"},
    {"scan_metadata", scan_metadata, METH_VARARGS, "routing fields of a MessageMetadata, or None"},
    {"scan_entry", scan_entry, METH_O, "routing fields of a stored entry's MessageMetadata, or None"},
    {"checked_publish_time", checked_publish_time, METH_O, "publish time of a checksummed SEND entry, or None"},
    {"crc32c", py_crc32c, METH_O, "CRC32C of a buffer"},
    {"record_header", (PyCFunction)(void (*)(void))record_header, METH_FASTCALL,
     "the header of a ledger record"},
    {"frame_records", (PyCFunction)(void (*)(void))frame_records, METH_FASTCALL,
     "the headers, offsets and publish times of a run of ledger records"},
    {"send_receipt_frame", (PyCFunction)(void (*)(void))send_receipt_frame, METH_FASTCALL,
     "a framed SEND_RECEIPT"},
    {"send_receipt_frames", (PyCFunction)(void (*)(void))send_receipt_frames, METH_FASTCALL,
     "the framed SEND_RECEIPTs of a run of SENDs"},
    {"split_sends", split_sends, METH_VARARGS, "a run of plain, checksummed SENDs of one producer, or None"},
    {"message_frame_header", (PyCFunction)(void (*)(void))message_frame_header, METH_FASTCALL,
     "the framed head of a MESSAGE"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_wire", NULL, -1, methods};

PyMODINIT_FUNC PyInit__wire(void) {
    crc_init();
#ifdef HAVE_HW_CRC
    __builtin_cpu_init();
    use_hw_crc = __builtin_cpu_supports("sse4.2");
#endif
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "ABI", WIRE_ABI) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
