"""What compaction tasks do inside Python workers: parse a group of segments into phase-one rows,
fold a user strategy; phase two, copying the survivors of a group into a part file, is
``copy_tasks`` (its names are still read here: ``tasks.copy_group``).

Plain functions of a ``RunPlan`` and numpy arrays, with no Spark in them, so the Spark job stays a
thin shell and the tests can call them directly. Files are read through ``pyarrow.fs`` (memory
mapped when local), never through a broker's memory.
"""

from __future__ import annotations

import os
from typing import Iterator, Optional

import numpy as np

from ..errors import CompactionError
from . import entry_scan as es
from . import message_rows as mr
from . import native
from .compacted_ledger import CompactedLedgerReader, read_file_bytes
from .plan import COMPACTED, RunPlan, Segment

# readers of compacted ledgers opened by this worker process (worker processes are reused)
_compacted_cache: dict[str, CompactedLedgerReader] = {}


def _compacted(path: str) -> CompactedLedgerReader:
    reader = _compacted_cache.get(path)
    if reader is None:
        _compacted_cache.clear()
        reader = _compacted_cache[path] = CompactedLedgerReader(path)
    return reader


def load_pieces(seg: Segment, only: Optional[np.ndarray] = None) -> list:
    """``[(buf, entry_ids, data_offsets, lengths), ...]`` of the entries a segment covers (of
    those, only the sorted entry ids ``only`` when given), one piece per file they are in (a live
    ledger, a one-file view: one; a chained view: one per chain segment holding some, plus one of
    its masked entries, rewritten as the view serves them), each in id order."""
    if seg.kind != COMPACTED:
        return [load_segment(seg)]
    r = _compacted(seg.path)
    lo, hi = r.ledger_range(seg.ledger_id)  # the view's entries of this ledger, nothing more
    _, eids, segs, offs, lens = r.columns(lo, hi)
    m = (eids >= seg.entry_lo) & (eids <= seg.entry_hi)
    if only is not None:
        m &= np.isin(eids, only)
    sel = np.flatnonzero(m)
    out = []
    if r.mask_ids is not None:
        masked = np.asarray(r.mask_ids[lo:hi])[sel] >= 0
        if masked.any():
            buf, moffs, mlens = r.masked_piece(sel[masked] + lo)
            out.append((buf, eids[sel[masked]], moffs, mlens))
            sel = sel[~masked]
    for k in np.unique(segs[sel]).tolist():
        pick = sel[segs[sel] == k]
        buf = np.frombuffer(r.segment_buffer(k), np.uint8)
        out.append((buf, eids[pick], offs[pick], lens[pick]))
    return out


def load_segment(seg: Segment):
    """``(buf, entry_ids, data_offsets, lengths)`` of the entries a segment covers (a compacted
    segment of a chained view, whose entries may be in several files: see ``load_pieces``)."""
    if seg.kind == COMPACTED:
        return gather(load_pieces(seg))
    return load_live(seg)


def load_live(seg: Segment, wanted: Optional[np.ndarray] = None):
    """``(buf, entry_ids, data_offsets, lengths)`` of the entries of a live ledger the segment
    covers (only the sorted entry ids ``wanted`` of them when given: phase two, which copies a
    tenth of them or less).

    Entries are located through the ledger's index, and only the records read are checked
    against it (each record header's length and entry id, ``native.check_records``): with a
    numpy gather per field, checking every header of a ledger cost more than parsing its
    metadata (a cache miss per record, twice). A ledger without a usable index, or whose index
    disagrees with a record, is scanned whole by ``storage.ledger_file``, which walks records
    when it cannot trust the index. A wanted entry the ledger lacks is left out (the caller's
    error to raise)."""
    from ..errors import StorageError
    from ..storage import ledger_file as lf

    if seg.index_path and os.path.exists(seg.index_path):
        buf = read_file_bytes(seg.path)
        arr = np.frombuffer(buf, np.uint8)
        try:
            index = lf.decode_index(read_file_bytes(seg.index_path))
            lf.decode_file_header(arr)
        except StorageError:
            index = None
        if index is not None and index.data_end <= len(arr):
            n = len(index.offsets)
            lo, hi = max(0, seg.entry_lo), min(seg.entry_hi, n - 1)
            if wanted is None:
                ids = np.arange(lo, hi + 1, dtype=np.int64)
            else:
                ids = np.asarray(wanted, np.int64)
                ids = ids[(ids >= lo) & (ids <= hi)]
            if not len(ids):
                return arr, ids, ids, ids
            offs = index.offsets[ids]
            ends = np.where(ids + 1 < n, index.offsets[np.minimum(ids + 1, n - 1)], index.data_end)
            lens = ends - offs - lf.RECORD_HEADER_SIZE
            if offs[0] >= lf.FILE_HEADER_SIZE and (lens >= 0).all() and _headers_match(arr, offs, lens, ids):
                return arr, ids, offs + lf.RECORD_HEADER_SIZE, lens
    return _scanned(seg, wanted)


def _scanned(seg: Segment, wanted: Optional[np.ndarray]):
    """``load_live`` by a scan of the whole ledger (``storage.ledger_file.scan_entries``)."""
    from ..storage import ledger_file as lf

    buf = read_file_bytes(seg.path)
    index = None
    if seg.index_path and os.path.exists(seg.index_path):
        index = read_file_bytes(seg.index_path)
    ids, offs, lens = lf.scan_entries(buf, index=index, verify_crc=False)
    m = (ids >= seg.entry_lo) & (ids <= seg.entry_hi)
    if wanted is not None:
        m &= np.isin(ids, wanted)
    return np.frombuffer(buf, np.uint8), ids[m], offs[m] + lf.RECORD_HEADER_SIZE, lens[m]


def _headers_match(arr: np.ndarray, offs: np.ndarray, lens: np.ndarray, ids: np.ndarray) -> bool:
    """Whether the ledger records at ``offs`` (``storage.ledger_file``'s record header: u32
    length, u32 crc, u64 entry id, big-endian) have the lengths ``lens`` and entry ids ``ids``."""
    lib = native.library()
    if lib is not None:
        return native.check_records(lib, arr, offs, lens, ids)
    if int(offs.max()) + 16 > len(arr):
        return False
    return np.array_equal(_be_at(arr, offs, 4), lens) and np.array_equal(_be_at(arr, offs + 8, 8), ids)


def _be_at(arr: np.ndarray, positions: np.ndarray, width: int) -> np.ndarray:
    """Big-endian unsigned integers of ``width`` bytes at ``positions`` of a uint8 array, as int64
    (one gather over an unaligned view of the bytes)."""
    view = np.ndarray((max(0, len(arr) - width + 1),), dtype=f">u{width}", buffer=arr, strides=(1,))
    return view[positions].astype(np.int64)


#: the combiner is judged once it has taken this many rows ...
COMBINE_PROBE_ROWS = 2_000_000
#: ... and given up when it holds more than this share of them as distinct keys
COMBINE_MAX_DISTINCT = 0.8


def group_rows(plan: RunPlan, group: int, stats: Optional[dict] = None) -> Iterator[mr.Rows]:
    """Phase-one rows of every segment of a group. Keyless rows are dropped unless retained;
    for keep-latest the group goes through the map-side combiner (``LatestCombiner``).
    ``stats["messages"]`` adds up the messages parsed, ``stats["keyless"]`` the keyless ones kept
    (each survives: the run's key count is its survivors minus these).

    The combiner gives up as Spark's adaptive partial aggregation does: when, after
    ``COMBINE_PROBE_ROWS`` rows, it still holds more than ``COMBINE_MAX_DISTINCT`` of them as
    distinct keys, its rows go out and the rest of the group passes uncombined (the aggregate
    after the shuffle reduces them all the same). A row costs the C table about a fifth of what
    it costs the JVM (Arrow in, two shuffle passes, the aggregate), so removing fewer than a
    fifth of the rows costs more than it saves: at 30 M messages over 30 M keys it removed 12 %."""
    combiner = None
    combining, taken = plan.combine, 0
    for rows, combine in _group_sources(plan, group):
        if stats is not None:
            stats["messages"] = stats.get("messages", 0) + len(rows)
        if not plan.retain_null_key:
            keep = (rows.flags & es.FLAG_KEYLESS) == 0
            if not keep.all():
                rows = rows.take(np.flatnonzero(keep))
        elif stats is not None:
            stats["keyless"] = stats.get("keyless", 0) + int(np.count_nonzero(rows.flags & es.FLAG_KEYLESS))
        if combining and combine:
            combiner = combiner or mr.LatestCombiner()
            combiner.add(rows)
            taken += len(rows)
            distinct = combiner.distinct()
            if (
                taken >= COMBINE_PROBE_ROWS
                and distinct is not None
                and distinct > COMBINE_MAX_DISTINCT * taken
            ):
                yield from _arrow_sized(combiner.rows())
                combiner, combining = None, False  # from now on rows pass uncombined
        else:
            yield from _arrow_sized(rows)
    if combiner is not None:
        yield from _arrow_sized(combiner.rows())


def _arrow_sized(rows: mr.Rows) -> Iterator[mr.Rows]:
    for start in range(0, len(rows), ARROW_BATCH_ROWS):
        yield rows.take(slice(start, start + ARROW_BATCH_ROWS))


def _group_sources(plan: RunPlan, group: int) -> Iterator[tuple]:
    """``(rows, combinable)`` of a group's segments: a compacted segment's rows come from the
    previous view's key sidecar when the plan names one (``view_keys``; one row per key already,
    nothing to combine), else from parsing its entries."""
    segments = [plan.segments[o] for o in plan.groups[group]]
    sidecar = plan.view_keys
    if sidecar is not None and segments and all(s.kind == COMPACTED for s in segments):
        from . import view_keys

        for rows in view_keys.segment_rows(sidecar, segments, plan.strategy == "event-time"):
            yield rows, False
        return
    for seg in segments:
        pieces = load_pieces(seg)
        if len(pieces) > 1:  # a chained view: rows of each file, merged back into id order
            rows = [
                mr.entry_rows(buf, eids[lo:hi], offs[lo:hi], lens[lo:hi], seg.ordinal)
                for buf, eids, offs, lens in pieces
                for lo, hi in chunks(lens)
            ]
            merged = mr.Rows.concat(rows)
            yield merged.take(np.argsort(merged.pos, kind="stable")), True
            continue
        for buf, eids, offs, lens in pieces:
            for lo, hi in chunks(lens):
                yield mr.entry_rows(buf, eids[lo:hi], offs[lo:hi], lens[lo:hi], seg.ordinal), True


ARROW_BATCH_ROWS = 1 << 20
# entries are scanned this many bytes at a time: per-message scratch arrays (13 longs per message
# of a batch) then stay small whatever the size of a ledger or of its batches
CHUNK_BYTES = 16 << 20


def chunks(lengths: np.ndarray, limit: Optional[int] = None):
    """``(lo, hi)`` index ranges of consecutive entries holding about ``limit`` bytes each."""
    limit = CHUNK_BYTES if limit is None else limit
    n = len(lengths)
    if not n:
        return []
    ends = np.cumsum(np.asarray(lengths, np.int64))
    out, lo = [], 0
    while lo < n:
        base = ends[lo - 1] if lo else 0
        hi = int(np.searchsorted(ends, base + limit, side="right"))
        hi = max(hi, lo + 1)
        out.append((lo, min(hi, n)))
        lo = hi
    return out


def rows_to_arrow(rows: mr.Rows, with_event_time: bool, packed: bool = False):
    """One Arrow record batch ``h1 long, h2 long, pos long, flags byte[, et long]``, or with
    ``packed`` (keep-latest) ``h1 long, h2 long, p2 long``: position and tombstone bit in one
    long, ``(pos << 1) | tomb`` (``pipeline.read_rows``)."""
    import pyarrow as pa

    cols = [pa.array(rows.h1, pa.int64()), pa.array(rows.h2, pa.int64())]
    names = ["h1", "h2"]
    if packed:
        p2 = (np.asarray(rows.pos, np.int64) << 1) | ((rows.flags & es.FLAG_TOMBSTONE) != 0)
        return pa.RecordBatch.from_arrays([*cols, pa.array(p2, pa.int64())], names=[*names, "p2"])
    cols += [pa.array(rows.pos, pa.int64()), pa.array(rows.flags, pa.int8())]
    names += ["pos", "flags"]
    if with_event_time:
        cols.append(pa.array(rows.event_time, pa.int64()))
        names.append("et")
    return pa.RecordBatch.from_arrays(cols, names=names)


# --- user strategies ------------------------------------------------------------------------


def decode_messages(entry: bytes, ledger_id: int, entry_id: int) -> list:
    """Every message of a stored entry as ``strategies.Message`` (the protocol package's own
    decoder; the slow path). An encrypted entry cannot be opened: it is one message, as stored."""
    from ..protocol import batch as batch_codec
    from ..protocol import entry_format
    from .strategies import Message

    md, payload = entry_format.parse_entry(entry, verify_checksum=False)
    if len(md.encryption_keys):
        key = md.partition_key if md.HasField("partition_key") else None
        props = {kv.key: kv.value for kv in md.properties}
        return [Message(key, bytes(payload), (ledger_id, entry_id, 0), md.publish_time, md.event_time, props)]
    out = []
    for i, item in enumerate(batch_codec.decode_batch(md, payload)):
        m = item.meta
        key = m.partition_key if m.HasField("partition_key") else None
        out.append(
            Message(
                key,
                bytes(item.payload),
                (ledger_id, entry_id, i),
                md.publish_time,
                m.event_time,
                {kv.key: kv.value for kv in m.properties},
            )
        )
    return out


def load_messages(plan: RunPlan, positions: np.ndarray) -> dict:
    """``{packed position: Message}`` for the given positions."""
    ords, eids, bidx = es.unpack_positions(positions)
    out = {}
    for o in np.unique(ords).tolist():
        m = ords == o
        seg = plan.segments[o]
        buf, seg_eids, offs, lens = load_segment(seg)
        raw = memoryview(buf.data if buf.flags.c_contiguous else buf.tobytes()).cast("B")
        want = np.unique(eids[m])
        at = np.searchsorted(seg_eids, want)
        decoded = {}
        for e, i in zip(want.tolist(), at.tolist()):
            if i >= len(seg_eids) or seg_eids[i] != e:
                raise CompactionError(f"entry {seg.ledger_id}:{e} vanished during compaction")
            blob = bytes(raw[int(offs[i]) : int(offs[i] + lens[i])])
            decoded[e] = decode_messages(blob, seg.ledger_id, e)
        for p, e, b in zip(positions[m].tolist(), eids[m].tolist(), bidx[m].tolist()):
            out[p] = decoded[e][b]
    return out


def fold_user(
    plan: RunPlan, strategy, h1: np.ndarray, h2: np.ndarray, pos: np.ndarray, flags: np.ndarray
) -> np.ndarray:
    """Survivors of rows sorted by (h1, h2, pos), folding ``strategy`` over each key in Python.
    Messages are loaded only for keys with more than one message; within a hash group the real
    keys are compared, so a hash collision cannot merge two keys."""
    from .strategies import fold

    n = len(pos)
    if n == 0:
        return np.zeros(0, np.int64)
    brk = np.ones(n, bool)
    brk[1:] = (h1[1:] != h1[:-1]) | (h2[1:] != h2[:-1])
    starts = np.flatnonzero(brk)
    ends = np.append(starts[1:], n)
    sizes = ends - starts
    single = starts[sizes == 1]
    keep = [pos[single][(flags[single] & es.FLAG_TOMBSTONE) == 0]]
    multi = [(int(s), int(e)) for s, e in zip(starts[sizes > 1], ends[sizes > 1])]
    if multi:
        idx = np.concatenate([np.arange(s, e) for s, e in multi])
        messages = load_messages(plan, pos[idx])
        extra = []
        for s, e in multi:
            by_key: dict = {}
            for p in pos[s:e].tolist():
                by_key.setdefault(messages[p].key, []).append(p)
            for ps in by_key.values():
                winner = fold([messages[p] for p in ps], strategy)
                if winner is not None:
                    extra.append(next(p for p in ps if messages[p] is winner))
        keep.append(np.asarray(extra, np.int64))
    return np.concatenate(keep)


def _locate(pieces: list, wanted: np.ndarray) -> tuple:
    """For sorted entry ids ``wanted``: the piece holding each, its index there, its length."""
    owner = np.full(len(wanted), -1, np.int64)
    where = np.zeros(len(wanted), np.int64)
    for k, (_, e, _, _) in enumerate(pieces):
        if not len(e):
            continue
        at = np.minimum(np.searchsorted(e, wanted), len(e) - 1)
        hit = e[at] == wanted
        owner[hit], where[hit] = k, at[hit]
    if (owner < 0).any():
        raise CompactionError("an entry of a compacted view is missing from its segments")
    lens = np.zeros(len(wanted), np.int64)
    for k, (_, _, _, n) in enumerate(pieces):
        mine = owner == k
        lens[mine] = n[where[mine]]
    return owner, where, lens


def gather(pieces: list, wanted: Optional[np.ndarray] = None):
    """One piece ``(buf, entry_ids, data_offsets, lengths)`` of the entries ``wanted`` (sorted
    entry ids; all when None) of ``pieces`` (each in id order, disjoint): the piece itself when
    there is one, else their bytes copied, in id order, into a new buffer (one vectorised copy per
    piece: a chained view's ledger whose entries lie in several segments)."""
    if not pieces:
        z = np.zeros(0, np.int64)
        return np.zeros(0, np.uint8), z, z, z
    if len(pieces) == 1 and wanted is None:
        return pieces[0]
    if wanted is None:
        wanted = np.sort(np.concatenate([p[1] for p in pieces]))
    if len(pieces) == 1:
        buf, e, o, n = pieces[0]
        at = np.searchsorted(e, wanted)
        return buf, wanted, o[at], n[at]
    from .entry_scan import copy_ranges

    owner, where, lens = _locate(pieces, wanted)
    starts = np.zeros(len(wanted), np.int64)
    if len(wanted):
        np.cumsum(lens[:-1], out=starts[1:])
    out = np.empty(int(lens.sum()), np.uint8)
    for k, (buf, _, o, _) in enumerate(pieces):
        mine = owner == k
        if mine.any():
            copy_ranges(out, starts[mine], buf, o[where[mine]], lens[mine])
    return out, wanted, starts, lens


def reached(plan: RunPlan, point: str) -> None:
    """Tell the plan's ``task_probe`` (if any) that this task reached ``point``."""
    if plan.task_probe is not None:
        plan.task_probe(point)


# --- phase two (``copy_tasks``) -----------------------------------------------------------------

#: phase two's names, still read as ``tasks.<name>`` by the Spark job shells and the tests
_PHASE_TWO = frozenset(
    [
        "copy_group",
        "retire_entries",
        "MASK_ROW",
        "encode_masks",
        "decode_masks",
        "touched_entries",
        "sorted_runs",
        "sorted_isin",
    ]
)


def __getattr__(name: str):
    """``tasks.copy_group`` and the rest of phase two live in ``copy_tasks`` (imported on first
    use: it imports this module's loaders)."""
    if name in _PHASE_TWO:
        from . import copy_tasks

        return getattr(copy_tasks, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
