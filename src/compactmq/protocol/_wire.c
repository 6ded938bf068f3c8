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
#define WIRE_ABI 2

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

/* decode_send(buf, start, end) -> (producer_id, sequence_id, num_messages, highest) | None */
static PyObject *decode_send(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t start, end;
    if (get_span(args, &view, &start, &end)) return NULL;
    const uint8_t *b = view.buf;
    uint64_t size, v, pid = 0, seq = 0, highest = 0;
    int64_t num = 1;
    int have = 0;
    Py_ssize_t p = start + 3;
    if (end - start < 4 || b[start] != 0x08 || b[start + 1] != 6 || b[start + 2] != 0x32) goto refuse;
    if (rd_varint(b, end, &p, &size) || size != (uint64_t)(end - p)) goto refuse;
    while (p < end) {
        uint8_t tag = b[p++];
        if (rd_varint(b, end, &p, &v)) goto refuse;
        switch (tag) {
            case 0x08: pid = v; have |= 1; break;
            case 0x10: seq = v; have |= 2; break;
            case 0x18: num = as_int32(v); break;
            case 0x30: highest = v; break;
            default: goto refuse;
        }
    }
    if (have != 3) goto refuse;
    PyBuffer_Release(&view);
    return Py_BuildValue("(KKLK)", (unsigned long long)pid, (unsigned long long)seq, (long long)num,
                         (unsigned long long)highest);
refuse:
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
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

static uint32_t crc32c_sw(const uint8_t *p, Py_ssize_t n) {
    uint32_t c = 0xffffffffu;
    while (n--) c = crc_table[(c ^ *p++) & 0xff] ^ (c >> 8);
    return c ^ 0xffffffffu;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_HW_CRC 1
__attribute__((target("sse4.2"))) static uint32_t crc32c_hw(const uint8_t *p, Py_ssize_t n) {
    uint64_t c = 0xffffffffu;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = __builtin_ia32_crc32di(c, w);
        p += 8;
        n -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (n--) c32 = __builtin_ia32_crc32qi(c32, *p++);
    return c32 ^ 0xffffffffu;
}
#endif

static int use_hw_crc = 0;

static uint32_t crc32c(const uint8_t *p, Py_ssize_t n) {
#ifdef HAVE_HW_CRC
    if (use_hw_crc) return crc32c_hw(p, n);
#endif
    return crc32c_sw(p, n);
}

/* crc32c(data) -> int: the CRC32C of a buffer (for tests against the crc32c package) */
static PyObject *py_crc32c(PyObject *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    uint32_t c = crc32c(view.buf, view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(c);
}

/* checked_publish_time(entry) -> the publish time of a SEND's entry that carries magic and a
   matching CRC and whose metadata the scanner accepts; None otherwise (no checksum, a mismatch,
   another shape: the caller takes the general path, which adds the checksum or raises) */
static PyObject *checked_publish_time(PyObject *self, PyObject *arg) {
    Py_buffer view;
    Py_ssize_t start, end;
    uint64_t publish_time = 0;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    const uint8_t *b = view.buf;
    Py_ssize_t n = view.len;
    PyObject *out = NULL;
    if (n < 10 || b[0] != 0x0e || b[1] != 0x01) goto refuse;
    uint32_t carried = ((uint32_t)b[2] << 24) | ((uint32_t)b[3] << 16) | ((uint32_t)b[4] << 8) | b[5];
    if (crc32c(b + 6, n - 6) != carried) goto refuse;
    if (md_bounds(b, n, &start, &end)) goto refuse;
    out = scan_md(b, start, end, &publish_time);
    if (out == NULL || out == Py_None) {
        PyBuffer_Release(&view);
        return out;
    }
    Py_DECREF(out);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLongLong(publish_time);
refuse:
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
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
    uint8_t mid[40], inner[100], out[120];
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
    return PyBytes_FromStringAndSize((const char *)out, c);
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

static PyMethodDef methods[] = {
    {"decode_send", decode_send, METH_VARARGS, "CommandSend fields of a plain SEND, or None"},
    {"scan_metadata", scan_metadata, METH_VARARGS, "routing fields of a MessageMetadata, or None"},
    {"scan_entry", scan_entry, METH_O, "routing fields of a stored entry's MessageMetadata, or None"},
    {"checked_publish_time", checked_publish_time, METH_O, "publish time of a checksummed SEND entry, or None"},
    {"crc32c", py_crc32c, METH_O, "CRC32C of a buffer"},
    {"send_receipt_frame", (PyCFunction)(void (*)(void))send_receipt_frame, METH_FASTCALL,
     "a framed SEND_RECEIPT"},
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
