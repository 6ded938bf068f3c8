"""Vectorised reading of stored entries, for the compaction hot path (``batch_rewrite`` rewrites
the batches that lose messages with what is read here).

Parsing ten million ``MessageMetadata`` with protobuf costs several microseconds each; this module
instead reads the few fields compaction needs straight from the protobuf wire format, for all
entries of a ledger at once, with numpy. It advances one cursor per record "in lockstep": each
round decodes one field (tag, then varint / length / fixed width) of every record that still has
fields left, so the number of Python-level steps is the number of fields, not of records.

Facts of the protobuf wire format used here: a field is a varint tag ``(number << 3) | wire
type``; wire type 0 is a varint, 1 is 8 bytes, 2 is a varint length then that many bytes, 5 is
4 bytes. For a non-repeated scalar field that appears twice the last value wins. The tests check
every value read here against ``pulsar_pb2``.

Stored entry layout (contract): ``[0x0e01][crc32c u32][metadata size u32][MessageMetadata][payload]``;
a batch payload (after decompression) is ``n x [u32 size][SingleMessageMetadata][payload]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import CompactionError, UnreadableEntry
from ..protocol.commands import to_signed64
from ..protocol.entry_format import MAGIC
from . import native

# MessageMetadata field numbers (our pulsar.proto)
MD_PUBLISH_TIME = 3
MD_PARTITION_KEY = 6
MD_COMPRESSION = 8
MD_UNCOMPRESSED_SIZE = 9
MD_NUM_MESSAGES = 11
MD_EVENT_TIME = 12
MD_ENCRYPTION_KEYS = 13
MD_MARKER_TYPE = 20
MD_NULL_VALUE = 25
# SingleMessageMetadata field numbers
SM_PARTITION_KEY = 2
SM_PAYLOAD_SIZE = 3
SM_COMPACTED_OUT = 4
SM_EVENT_TIME = 5
SM_NULL_VALUE = 9

VARINT, BYTES = 0, 2

# row flags
FLAG_TOMBSTONE = 1
FLAG_KEYLESS = 2

# packed position: [ordinal 22 bits][entry id 24 bits][batch index 16 bits] = 62 bits, so that
# (pos << 1) | tombstone still fits a signed 64-bit long
ORDINAL_BITS, ENTRY_BITS, BATCH_BITS = 22, 24, 16
MAX_ORDINAL = (1 << ORDINAL_BITS) - 1
MAX_ENTRY = (1 << ENTRY_BITS) - 1
MAX_BATCH = (1 << BATCH_BITS) - 1


def pack_positions(ordinal, entry_ids, batch_indexes) -> np.ndarray:
    entry_ids = np.asarray(entry_ids, dtype=np.int64)
    batch_indexes = np.asarray(batch_indexes, dtype=np.int64)
    if entry_ids.size and (entry_ids.max() > MAX_ENTRY or batch_indexes.max() > MAX_BATCH):
        raise CompactionError(
            f"entry id or batch index beyond what compaction packs ({MAX_ENTRY} entries per ledger, "
            f"{MAX_BATCH + 1} messages per batch)"
        )
    ordinal = np.asarray(ordinal, dtype=np.int64)
    return (ordinal << (ENTRY_BITS + BATCH_BITS)) | (entry_ids << BATCH_BITS) | batch_indexes


def unpack_positions(pos):
    pos = np.asarray(pos, dtype=np.int64)
    return (
        pos >> (ENTRY_BITS + BATCH_BITS),
        (pos >> BATCH_BITS) & MAX_ENTRY,
        pos & MAX_BATCH,
    )


def position_order(pos: np.ndarray) -> np.ndarray:
    """``np.argsort(pos, kind="stable")`` of packed positions, about twice as fast on millions.

    Positions use few of their bits (a group spans few ordinals, entry ids stay far below 2^24
    and batch indexes below 2^16), so each is re-packed densely -- ordinal, entry id and batch
    index each in just the bits its largest value needs -- with its index in the bits below,
    and one value sort orders both (ties keep index order). When the dense key and the index
    do not fit in 63 bits together, it is a plain argsort."""
    pos = np.asarray(pos, np.int64)
    n = len(pos)
    if n < 2:
        return np.arange(n, dtype=np.int64)
    ords, eids, bidx = unpack_positions(pos)
    lo = int(ords.min())
    ob = (int(ords.max()) - lo).bit_length()
    eb, bb = int(eids.max()).bit_length(), int(bidx.max()).bit_length()
    ib = (n - 1).bit_length()
    if ob + eb + bb + ib > 63:
        return np.argsort(pos, kind="stable")
    key = (((ords - lo) << (eb + bb)) | (eids << bb) | bidx) << ib
    key |= np.arange(n, dtype=np.int64)
    key.sort()
    return key & ((1 << ib) - 1)


def _take(buf: np.ndarray, idx: np.ndarray) -> np.ndarray:
    return np.take(buf, idx, mode="clip")


def read_varints(buf: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Decode one varint at each position; returns (values as uint64, positions after them)."""
    b = _take(buf, pos).astype(np.uint64)
    val = b & np.uint64(0x7F)
    nxt = pos + 1
    todo = np.flatnonzero(b >= 0x80)
    shift = 7
    while todo.size:
        if shift > 63:
            raise UnreadableEntry("varint longer than 10 bytes")
        bb = _take(buf, nxt[todo]).astype(np.uint64)
        val[todo] |= (bb & np.uint64(0x7F)) << np.uint64(shift)
        nxt[todo] += 1
        todo = todo[bb >= 0x80]
        shift += 7
    return val, nxt


def read_u32(buf: np.ndarray, pos: np.ndarray) -> np.ndarray:
    idx = pos[:, None] + np.arange(4, dtype=np.int64)
    raw = np.ascontiguousarray(_take(buf, idx))
    return raw.view(">u4").reshape(-1).astype(np.int64)


@dataclass
class Field:
    """What a lockstep scan found for one field number, one slot per record."""

    present: np.ndarray  # bool
    value: np.ndarray  # uint64 (varint fields); for bytes fields the data offset
    length: np.ndarray  # int64 (bytes fields)
    start: np.ndarray  # int64: offset of the (last) tag of this field, -1 when absent
    end: np.ndarray  # int64: offset just past that field


def scan_fields(
    buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, wanted: dict[int, int]
) -> dict[int, Field]:
    """Read the wanted fields (number -> VARINT or BYTES) of the protobuf messages
    ``buf[starts[i]:ends[i]]``. Unwanted fields are skipped; a field seen twice keeps the last."""
    n = len(starts)
    out = {
        f: Field(
            np.zeros(n, bool),
            np.zeros(n, np.uint64),
            np.zeros(n, np.int64),
            np.full(n, -1, np.int64),
            np.full(n, -1, np.int64),
        )
        for f in wanted
    }
    cur = np.asarray(starts, dtype=np.int64).copy()
    ends = np.asarray(ends, dtype=np.int64)
    active = np.flatnonzero(cur < ends)
    while active.size:
        p0 = cur[active]
        tag, p = read_varints(buf, p0)
        number = (tag >> np.uint64(3)).astype(np.int64)
        wt = (tag & np.uint64(7)).astype(np.int64)
        newp = np.empty_like(p)
        val = np.zeros(len(p), np.uint64)
        m = wt == 0
        if m.any():
            val[m], newp[m] = read_varints(buf, p[m])
        m2 = wt == 2
        if m2.any():
            ln, q = read_varints(buf, p[m2])
            val[m2] = q.astype(np.uint64)
            newp[m2] = q + ln.astype(np.int64)
        m1 = wt == 1
        newp[m1] = p[m1] + 8
        m5 = wt == 5
        newp[m5] = p[m5] + 4
        if not (m | m1 | m2 | m5).all():
            raise UnreadableEntry("unsupported protobuf wire type in entry metadata")
        e = ends[active]
        if (newp > e).any():
            raise UnreadableEntry("protobuf field runs past the end of its message")
        for f, kind in wanted.items():
            hit = number == f
            if not hit.any():
                continue
            rows = active[hit]
            fld = out[f]
            fld.present[rows] = True
            fld.start[rows] = p0[hit]
            fld.end[rows] = newp[hit]
            fld.value[rows] = val[hit]
            if kind == BYTES:
                fld.length[rows] = newp[hit] - val[hit].astype(np.int64)
        cur[active] = newp
        active = active[newp < e]
    return out


def encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


# --- entries ----------------------------------------------------------------------------------


@dataclass
class EntryInfo:
    """Per-entry facts from the outer ``MessageMetadata`` (arrays, one slot per entry)."""

    md_start: np.ndarray
    md_end: np.ndarray  # = payload start
    end: np.ndarray  # payload end
    key_off: np.ndarray
    key_len: np.ndarray  # -1: no key
    batched: np.ndarray  # bool
    num_messages: np.ndarray
    compression: np.ndarray
    uncompressed_size: np.ndarray
    encrypted: np.ndarray
    marker: np.ndarray
    event_time: np.ndarray
    publish_time: np.ndarray
    uncompressed_span: tuple  # (start, end) of field 9, -1 when absent


def scan_entry_metadata(buf: np.ndarray, offsets: np.ndarray, lengths: np.ndarray) -> EntryInfo:
    """The outer metadata of the entries ``buf[offsets[i] : offsets[i] + lengths[i]]``."""
    lib = native.library()
    if lib is None:
        return scan_entry_metadata_np(buf, offsets, lengths)
    offsets = np.asarray(offsets, dtype=np.int64)
    o = native.scan_md(lib, buf, offsets, lengths)
    bits = o[:, 4]
    return EntryInfo(
        md_start=o[:, 0],
        md_end=o[:, 1],
        end=offsets + np.asarray(lengths, np.int64),
        key_off=o[:, 2],
        key_len=o[:, 3],
        batched=(bits & 1) != 0,
        num_messages=o[:, 5],
        compression=o[:, 6],
        uncompressed_size=o[:, 7],
        encrypted=(bits & 2) != 0,
        marker=(bits & 4) != 0,
        event_time=o[:, 8],
        publish_time=o[:, 9],
        uncompressed_span=(o[:, 10], o[:, 11]),
    )


def scan_entry_metadata_np(buf: np.ndarray, offsets: np.ndarray, lengths: np.ndarray) -> EntryInfo:
    """``scan_entry_metadata`` in numpy only (the reference for the C path)."""
    offsets = np.asarray(offsets, dtype=np.int64)
    ends = offsets + np.asarray(lengths, dtype=np.int64)
    if (ends - offsets < 4).any():
        raise UnreadableEntry("entry shorter than its header")
    head = read_u32(buf, offsets)
    magic = (head >> 16) == MAGIC
    size_at = np.where(magic, offsets + 6, offsets)
    md_size = read_u32(buf, size_at)
    md_start = size_at + 4
    md_end = md_start + md_size
    if (md_end > ends).any():
        raise UnreadableEntry("metadata size runs past the end of the entry")
    f = scan_fields(
        buf,
        md_start,
        md_end,
        {
            MD_PUBLISH_TIME: VARINT,
            MD_PARTITION_KEY: BYTES,
            MD_COMPRESSION: VARINT,
            MD_UNCOMPRESSED_SIZE: VARINT,
            MD_NUM_MESSAGES: VARINT,
            MD_EVENT_TIME: VARINT,
            MD_ENCRYPTION_KEYS: BYTES,
            MD_MARKER_TYPE: VARINT,
        },
    )
    key = f[MD_PARTITION_KEY]
    nm = f[MD_NUM_MESSAGES]
    return EntryInfo(
        md_start=md_start,
        md_end=md_end,
        end=ends,
        key_off=key.value.astype(np.int64),
        key_len=np.where(key.present, key.length, -1),
        batched=nm.present,
        num_messages=np.where(nm.present, nm.value.astype(np.int64), 1),
        compression=f[MD_COMPRESSION].value.astype(np.int64),
        uncompressed_size=f[MD_UNCOMPRESSED_SIZE].value.astype(np.int64),
        encrypted=f[MD_ENCRYPTION_KEYS].present,
        marker=f[MD_MARKER_TYPE].present,
        event_time=f[MD_EVENT_TIME].value.astype(np.int64),
        publish_time=f[MD_PUBLISH_TIME].value.astype(np.int64),
        uncompressed_span=(f[MD_UNCOMPRESSED_SIZE].start, f[MD_UNCOMPRESSED_SIZE].end),
    )


def batch_payloads(
    buf: np.ndarray, info: EntryInfo, sel: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The uncompressed batch payloads of entries ``sel``: (buffer, starts, ends), one slot per
    selected entry. Uncompressed payloads are read in place (the buffer is ``buf`` itself);
    compressed ones are decompressed and laid end to end in a new buffer."""
    sel = np.asarray(sel, dtype=np.int64)
    if not sel.size:
        return np.zeros(0, np.uint8), np.zeros(0, np.int64), np.zeros(0, np.int64)
    comp = info.compression[sel]
    if not comp.any():
        return buf, info.md_end[sel], info.end[sel]
    from ..protocol.compression import decompress

    pieces = []
    raw = buf.data if buf.flags.c_contiguous else buf.tobytes()
    mv = memoryview(raw).cast("B")
    for j, e in enumerate(sel):
        s, t = int(info.md_end[e]), int(info.end[e])
        codec = int(comp[j])
        data = mv[s:t]
        pieces.append(decompress(codec, data, int(info.uncompressed_size[e])) if codec else bytes(data))
    lens = np.fromiter((len(p) for p in pieces), np.int64, len(pieces))
    new_starts = np.zeros(len(sel), np.int64)
    np.cumsum(lens[:-1], out=new_starts[1:])
    return np.frombuffer(b"".join(pieces), np.uint8), new_starts, new_starts + lens


def copy_ranges(dst: np.ndarray, dst_starts, src: np.ndarray, src_starts, lens) -> None:
    """``dst[dst_starts[i] : + lens[i]] = src[src_starts[i] : + lens[i]]`` for all i, vectorised."""
    lib = native.library()
    if lib is not None and len(src):
        native.copy_ranges(lib, dst, dst_starts, src, src_starts, lens)
        return
    lens = np.asarray(lens, np.int64)
    nz = lens > 0
    lens = lens[nz]
    total = int(lens.sum())
    if not total:
        return
    d = np.asarray(dst_starts, np.int64)[nz]
    s_ = np.asarray(src_starts, np.int64)[nz]
    cum = np.zeros(len(lens), np.int64)
    np.cumsum(lens[:-1], out=cum[1:])
    di = np.repeat(d - cum, lens) + np.arange(total, dtype=np.int64)
    dst[di] = src[di + np.repeat(s_ - d, lens)]


def gather_ranges(buf: np.ndarray, starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Concatenate ``buf[starts[i] : starts[i] + lens[i]]`` for all i, vectorised."""
    lens = np.asarray(lens, dtype=np.int64)
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, np.uint8)
    if native.library() is not None:
        out = np.empty(total, np.uint8)
        out_starts = np.zeros(len(lens), np.int64)
        np.cumsum(lens[:-1], out=out_starts[1:])
        copy_ranges(out, out_starts, buf, starts, lens)
        return out
    out_starts = np.zeros(len(lens), np.int64)
    np.cumsum(lens[:-1], out=out_starts[1:])
    nz = lens > 0
    shift = np.repeat((np.asarray(starts, np.int64) - out_starts)[nz], lens[nz])
    idx = shift + np.arange(total, dtype=np.int64)
    return buf[idx]


@dataclass
class SubMessages:
    """Every sub-message of a set of batches (flat arrays, in batch then index order)."""

    batch: np.ndarray  # which batch (index into the selection)
    index: np.ndarray  # batch index
    seg_start: np.ndarray  # offset of its u32 size
    smm_start: np.ndarray
    smm_end: np.ndarray
    payload_end: np.ndarray
    key_off: np.ndarray
    key_len: np.ndarray  # -1: no key
    payload_size: np.ndarray
    compacted_out: np.ndarray
    event_time: np.ndarray
    size_span: tuple  # (start, end) of the payload_size field


def scan_batches(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, counts: np.ndarray) -> SubMessages:
    """Walk ``counts[i]`` sub-messages in each batch payload ``buf[starts[i]:ends[i]]``."""
    lib = native.library()
    if lib is None:
        return scan_batches_np(buf, starts, ends, counts)
    o = native.scan_batches(lib, buf, starts, ends, counts)
    return SubMessages(
        o[:, 0],
        o[:, 1],
        o[:, 2],
        o[:, 3],
        o[:, 4],
        o[:, 5],
        o[:, 6],
        o[:, 7],
        o[:, 8],
        o[:, 9] != 0,
        o[:, 10],
        (o[:, 11], o[:, 12]),
    )


def scan_batches_np(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, counts: np.ndarray) -> SubMessages:
    """``scan_batches`` in numpy: all batches in lockstep, one round per batch index."""
    cur = np.asarray(starts, np.int64).copy()
    ends = np.asarray(ends, np.int64)
    counts = np.asarray(counts, np.int64)
    parts = []
    i = 0
    active = np.flatnonzero((counts > 0) & (cur < ends))
    while active.size:
        p = cur[active]
        if (p + 4 > ends[active]).any():
            raise UnreadableEntry("batch ends inside a sub-message header")
        size = read_u32(buf, p)
        s0 = p + 4
        s1 = s0 + size
        if (s1 > ends[active]).any():
            raise UnreadableEntry("sub-message metadata runs past the end of its batch")
        f = scan_fields(
            buf,
            s0,
            s1,
            {
                SM_PARTITION_KEY: BYTES,
                SM_PAYLOAD_SIZE: VARINT,
                SM_COMPACTED_OUT: VARINT,
                SM_EVENT_TIME: VARINT,
            },
        )
        psize = f[SM_PAYLOAD_SIZE].value.astype(np.int64)
        pend = s1 + psize
        if (pend > ends[active]).any():
            raise UnreadableEntry("sub-message payload runs past the end of its batch")
        k = f[SM_PARTITION_KEY]
        parts.append(
            (
                active,
                np.full(len(active), i, np.int64),
                p,
                s0,
                s1,
                pend,
                k.value.astype(np.int64),
                np.where(k.present, k.length, -1),
                psize,
                f[SM_COMPACTED_OUT].present & (f[SM_COMPACTED_OUT].value != 0),
                f[SM_EVENT_TIME].value.astype(np.int64),
                f[SM_PAYLOAD_SIZE].start,
                f[SM_PAYLOAD_SIZE].end,
            )
        )
        cur[active] = pend
        i += 1
        if i > MAX_BATCH + 1:
            raise UnreadableEntry("batch with too many messages")
        keep = (pend < ends[active]) & (i < counts[active])
        active = active[keep]
    if not parts:
        z = np.zeros(0, np.int64)
        return SubMessages(z, z, z, z, z, z, z, z, z, np.zeros(0, bool), z, (z, z))
    cols = [np.concatenate(c) for c in zip(*parts)]
    order = np.lexsort((cols[1], cols[0]))  # by batch, then batch index
    cols = [c[order] for c in cols]
    return SubMessages(*cols[:11], (cols[11], cols[12]))


# --- key hashes -------------------------------------------------------------------------------
#
# Keys are grouped by a 128-bit hash (two independent 64-bit hashes), computed here with numpy so
# that only fixed-width longs travel to the JVM. Each 64-bit hash reads the key in 8-byte
# little-endian words (the last one zero-padded), mixes every word with its own seed through the
# MurmurHash3 64-bit finaliser and folds it in with a multiply; the length is mixed in first, so
# keys that differ only by trailing zero bytes differ. For n distinct keys the chance that two of
# them share both hashes is about n^2 / 2^129 if the hashes behave as independent random
# functions (1.5e-21 for a billion keys). A user strategy compares the real keys anyway.

_M1, _M2 = np.uint64(0xFF51AFD7ED558CCD), np.uint64(0xC4CEB9FE1A85EC53)
_SEEDS = (
    (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xD6E8FEB86659FD93)),
    (np.uint64(0xA0761D6478BD642F), np.uint64(0xE7037ED1A0B428DB)),
)
KEYLESS_MARK = -0x3C6EF372FE94F82B  # h2 of a retained keyless row (its h1 is its position)


def _fmix(h: np.ndarray) -> np.ndarray:
    h = h ^ (h >> np.uint64(33))
    h = h * _M1
    h = h ^ (h >> np.uint64(33))
    h = h * _M2
    return h ^ (h >> np.uint64(33))


_SEED_ARRAY = np.array([v for pair in _SEEDS for v in pair], np.uint64)


def hash_keys(buf: np.ndarray, off: np.ndarray, ln: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two 64-bit hashes (as int64) of the keys ``buf[off[i] : off[i] + ln[i]]``."""
    lib = native.library()
    if lib is not None:
        return native.hash_keys(lib, buf, off, ln, _SEED_ARRAY)
    return hash_keys_np(buf, off, ln)


def hash_keys_np(buf: np.ndarray, off: np.ndarray, ln: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``hash_keys`` in numpy only."""
    off = np.asarray(off, np.int64)
    ln = np.maximum(np.asarray(ln, np.int64), 0)
    n = len(off)
    lu = ln.astype(np.uint64)
    hs = [_fmix(lu ^ s0) for s0, _ in _SEEDS]
    last = max(len(buf) - 1, 0)
    words = int((ln.max() + 7) // 8) if n else 0
    lanes = np.arange(8, dtype=np.int64)
    with np.errstate(over="ignore"):
        for j in range(words):
            live = ln > 8 * j
            idx = np.flatnonzero(live)
            pos = off[idx, None] + 8 * j + lanes
            raw = np.take(buf, np.minimum(pos, last)) if len(buf) else np.zeros(pos.shape, np.uint8)
            raw = np.where(lanes < (ln[idx, None] - 8 * j), raw, 0).astype(np.uint8)
            w = np.ascontiguousarray(raw).view("<u8").reshape(-1)
            for k, (s0, s1) in enumerate(_SEEDS):
                h = hs[k]
                h[idx] = (h[idx] ^ _fmix(w ^ s1)) * _M1 + s0
    return tuple(_fmix(h).view(np.int64) for h in hs)


def hash_key_py(key: bytes) -> tuple[int, int]:
    """The same hashes for one key, in plain Python (the tests check the vectorised version)."""
    mask = (1 << 64) - 1

    def fmix(h):
        h ^= h >> 33
        h = (h * 0xFF51AFD7ED558CCD) & mask
        h ^= h >> 33
        h = (h * 0xC4CEB9FE1A85EC53) & mask
        return h ^ (h >> 33)

    out = []
    for s0, s1 in _SEEDS:
        s0, s1 = int(s0), int(s1)
        h = fmix(len(key) ^ s0)
        for j in range(0, len(key), 8):
            w = int.from_bytes(key[j : j + 8].ljust(8, b"\0"), "little")
            h = (((h ^ fmix(w ^ s1)) * 0xFF51AFD7ED558CCD) + s0) & mask
        h = fmix(h)
        out.append(to_signed64(h))
    return out[0], out[1]
