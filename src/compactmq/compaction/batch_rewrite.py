"""Rewriting the batches that lose messages, as phase two copies a group's survivors.

A compacted entry keeps its id and, when it is a batch, every batch index: a reader that holds a
message id of the batch must still find it there (DESIGN §2). So phase two never re-batches:
an entry that keeps all its messages, a non-batched entry and an encrypted one (which cannot be
opened) are copied byte for byte from the ledger; an entry that keeps none is not written; a
batch that keeps some has each dropped message replaced by an empty ``compacted_out``
placeholder, is re-compressed with its own codec, and gets a new ``uncompressed_size`` and
checksum. ``rebuild_ranges`` answers, per candidate entry, where its new bytes are -- a range of
the ledger's buffer or of one ``extra`` buffer of rewritten batches -- so that
``PartWriter.append_ranges`` writes a chunk of entries with one vectorised copy; the placeholder
bodies are assembled in C when the extension is built (``native``), in numpy otherwise, and the
tests check that both give the same bytes.

It reads entries with the scanners of ``entry_scan`` (metadata fields, batch sub-messages), the
one place that knows the stored entry layout.
"""

from __future__ import annotations

import struct

import numpy as np

from ..protocol.entry_format import MAGIC
from . import native
from .entry_scan import (
    MD_UNCOMPRESSED_SIZE,
    SM_COMPACTED_OUT,
    SM_PAYLOAD_SIZE,
    SubMessages,
    batch_payloads,
    copy_ranges,
    encode_varint,
    scan_batches,
    scan_entry_metadata,
)

_PLACEHOLDER_TAIL = bytes(
    [SM_PAYLOAD_SIZE << 3, 0, SM_COMPACTED_OUT << 3, 1]
)  # payload_size=0, compacted_out=true
_U32 = struct.Struct(">I")


def rebuild_entries(buf: np.ndarray, offsets, lengths, surv_entry, surv_batch) -> list:
    """``rebuild_ranges`` as a list: bytes (or a memoryview of ``buf``) per candidate entry, None
    for an entry that is not written."""
    src, lens, extra, extra_off = rebuild_ranges(buf, offsets, lengths, surv_entry, surv_batch)
    raw = memoryview(buf.data if buf.flags.c_contiguous else buf.tobytes()).cast("B")
    ext = memoryview(extra.tobytes())
    out: list = []
    for s_, l_, e_ in zip(src.tolist(), lens.tolist(), extra_off.tolist()):
        out.append(None if l_ < 0 else (raw[s_ : s_ + l_] if e_ < 0 else ext[e_ : e_ + l_]))
    return out


def rebuild_ranges(buf: np.ndarray, offsets, lengths, surv_entry, surv_batch):
    """Where the new bytes of each candidate entry ``buf[offsets[i] : offsets[i] + lengths[i]]``
    come from, given the surviving messages as pairs ``(surv_entry[k], surv_batch[k])``
    (candidate index, batch index).

    A non-batched or encrypted entry is kept as it is, so is a batch whose messages all survive:
    its bytes are ``buf[src[i] : src[i] + lens[i]]``. Otherwise each dropped message of a batch
    becomes a ``compacted_out`` placeholder with an empty payload, the batch is re-compressed with
    its codec, and ``uncompressed_size`` and the checksum are updated (the entry keeps its id): its
    bytes are ``extra[extra_off[i] : extra_off[i] + lens[i]]``. An entry with no surviving message
    is not written: ``lens[i] == -1``.

    Returns ``(src, lens, extra, extra_off)``; ``extra_off[i] == -1`` when the bytes are in ``buf``.
    """
    offsets = np.asarray(offsets, np.int64)
    lengths = np.asarray(lengths, np.int64)
    surv_entry = np.asarray(surv_entry, np.int64)
    surv_batch = np.asarray(surv_batch, np.int64)
    n = len(offsets)
    info = scan_entry_metadata(buf, offsets, lengths)
    has_survivor = np.bincount(surv_entry, minlength=n) > 0
    is_batch = info.batched & ~info.encrypted
    src = offsets.copy()
    lens = np.where(has_survivor, lengths, -1)
    extra_off = np.full(n, -1, np.int64)
    sel = np.flatnonzero(has_survivor & is_batch)
    if not sel.size:
        return src, lens, np.zeros(0, np.uint8), extra_off
    raw = memoryview(buf.data if buf.flags.c_contiguous else buf.tobytes()).cast("B")
    rewrite = sel.tolist()
    bbuf, bstart, bend = batch_payloads(buf, info, sel)
    sub = scan_batches(bbuf, bstart, bend, info.num_messages[sel])
    keep = _kept_sub_messages(sub, sel, n, surv_entry, surv_batch)
    any_live_kept = np.bincount(sub.batch[keep & ~sub.compacted_out], minlength=len(sel)) > 0
    all_kept = np.bincount(sub.batch[~keep], minlength=len(sel)) == 0
    body, bstarts, batch_len = _new_batch_bodies(bbuf, sub, keep, len(sel))
    todo = [j for j in range(len(rewrite)) if any_live_kept[j] and not all_kept[j]]
    for j in np.flatnonzero(~any_live_kept).tolist():
        lens[rewrite[j]] = -1
    rows_i = [rewrite[j] for j in todo]
    blobs = _reframed_entries(raw, info, rows_i, body, bstarts[todo].tolist(), batch_len[todo].tolist())
    if rows_i:
        extra_off[rows_i] = np.cumsum([0] + [len(b) for b in blobs[:-1]])
        lens[rows_i] = [len(b) for b in blobs]
    extra = np.frombuffer(b"".join(blobs), np.uint8) if blobs else np.zeros(0, np.uint8)
    return src, lens, extra, extra_off


def _kept_sub_messages(sub: SubMessages, sel, n: int, surv_entry, surv_batch) -> np.ndarray:
    """Per sub-message of the selected batches (``sel``: candidate indexes), whether it stays as
    it is: a survivor, or a placeholder an earlier compaction already left."""
    # candidate index -> position in the selection
    where = np.full(n, -1, np.int64)
    where[sel] = np.arange(len(sel))
    m_surv = where[surv_entry] >= 0
    # sub-messages of selected batch j are rows first[j] .. first[j] + count[j] - 1, with batch
    # indexes 0, 1, ... in order, so a survivor (j, i) is row first[j] + i when i < count[j]
    count = np.bincount(sub.batch, minlength=len(sel))
    first = np.zeros(len(sel), np.int64)
    np.cumsum(count[:-1], out=first[1:])
    sj, si = where[surv_entry[m_surv]], surv_batch[m_surv]
    ok = si < count[sj]
    keep = sub.compacted_out.copy()
    keep[first[sj[ok]] + si[ok]] = True
    return keep


def _new_batch_bodies(bbuf, sub: SubMessages, keep, batches: int) -> tuple:
    """The new (uncompressed) batch payloads: kept sub-messages as they are, dropped ones as
    placeholders. Returns ``(body bytes, start of each batch in it, length of each batch)``."""
    drop = np.flatnonzero(~keep)
    fs, fe = sub.size_span[0][drop], sub.size_span[1][drop]
    absent = fs < 0  # payload_size is required; tolerate its absence by removing nothing
    fs = np.where(absent, sub.smm_end[drop], fs)
    fe = np.where(absent, sub.smm_end[drop], fe)
    new_smm_size = (sub.smm_end[drop] - sub.smm_start[drop]) - (fe - fs) + len(_PLACEHOLDER_TAIL)
    seg_len = sub.payload_end - sub.seg_start
    seg_len[drop] = 4 + new_smm_size
    lib = native.library()
    if lib is not None:
        body = native.rebuild_subs(lib, bbuf, sub, fs, fe, keep, _PLACEHOLDER_TAIL, int(seg_len.sum()))
    else:
        body = _rebuild_subs_np(bbuf, sub, keep, drop, fs, fe, new_smm_size)
    # per batch output range
    batch_len = np.bincount(sub.batch, weights=seg_len, minlength=batches).astype(np.int64)
    bstarts = np.zeros(batches, np.int64)
    np.cumsum(batch_len[:-1], out=bstarts[1:])
    return body.tobytes(), bstarts, batch_len


def _reframed_entries(raw, info, rows_i: list, body_b: bytes, bs: list, bl: list) -> list:
    """The stored bytes of each rewritten entry ``rows_i[k]`` whose new payload is
    ``body_b[bs[k] : bs[k] + bl[k]]``: its metadata with the new ``uncompressed_size``, the
    payload re-compressed with the entry's codec, a new checksum."""
    import crc32c as _crc

    from ..protocol.compression import compress

    crc = _crc.crc32c
    pack_u32, pack_head = _U32.pack, struct.Struct(">HI").pack
    tag9 = bytes([MD_UNCOMPRESSED_SIZE << 3])
    codecs = info.compression[rows_i].tolist()
    ms = info.md_start[rows_i].tolist()
    me = info.md_end[rows_i].tolist()
    us_ = info.uncompressed_span[0][rows_i].tolist()
    ue_ = info.uncompressed_span[1][rows_i].tolist()
    blobs: list = []
    for k in range(len(rows_i)):
        payload = body_b[bs[k] : bs[k] + bl[k]]
        codec = codecs[k]
        m0 = ms[k]
        md = raw[m0 : me[k]].tobytes()
        us = us_[k]
        if us >= 0:  # drop the old uncompressed_size, append the new one (last value wins anyway)
            md = md[: us - m0] + md[ue_[k] - m0 :]
        if us >= 0 or codec:
            md += tag9 + encode_varint(len(payload))
        tail = pack_u32(len(md)) + md + (compress(codec, payload) if codec else payload)
        blobs.append(pack_head(MAGIC, crc(tail)) + tail)
    return blobs


def _rebuild_subs_np(bbuf, sub: SubMessages, keep, drop, fs, fe, new_smm_size) -> np.ndarray:
    """``native.rebuild_subs`` in numpy: the new batch bodies as pieces copied in two passes."""
    hdr = new_smm_size.astype(">u4").tobytes()
    # pieces come from the batch buffer or from a small side buffer (new size headers, then the
    # placeholder tail); the batch buffer may be a whole ledger file, so it is never copied whole
    aux = np.frombuffer(hdr + _PLACEHOLDER_TAIL, np.uint8)
    base_h = 0
    base_c = len(hdr)
    m = len(sub.batch)
    npieces = np.where(keep, 1, 4)
    first = np.zeros(m, np.int64)
    np.cumsum(npieces[:-1], out=first[1:])
    total = int(npieces.sum())
    piece = np.zeros(total, np.int64)
    ln = np.zeros(total, np.int64)
    k = np.flatnonzero(keep)
    piece[first[k]] = sub.seg_start[k]
    ln[first[k]] = sub.payload_end[k] - sub.seg_start[k]
    d0 = first[drop]
    piece[d0] = base_h + 4 * np.arange(len(drop), dtype=np.int64)
    ln[d0] = 4
    piece[d0 + 1] = sub.smm_start[drop]
    ln[d0 + 1] = fs - sub.smm_start[drop]
    piece[d0 + 2] = fe
    ln[d0 + 2] = sub.smm_end[drop] - fe
    piece[d0 + 3] = base_c
    ln[d0 + 3] = len(_PLACEHOLDER_TAIL)
    from_aux = np.zeros(total, bool)
    from_aux[d0] = True
    from_aux[d0 + 3] = True
    dst = np.zeros(total, np.int64)
    np.cumsum(ln[:-1], out=dst[1:])
    body = np.empty(int(ln.sum()), np.uint8)
    copy_ranges(body, dst[~from_aux], bbuf, piece[~from_aux], ln[~from_aux])
    copy_ranges(body, dst[from_aux], aux, piece[from_aux], ln[from_aux])
    return body
