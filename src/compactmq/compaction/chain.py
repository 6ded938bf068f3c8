"""A compacted view as a *chain* of segments, so an incremental run writes only what changed.

Why
---
A run after a few new messages used to copy every surviving entry into a new compacted ledger
(old survivors re-read from the old view), then the driver concatenated the phase-two parts into
one file: the cost of a run grew with the view, not with the new data. Most entries of the
previous view are untouched by a small run, so the new view should *name* them, not copy them.

What a view is
--------------
A *segment* is a complete compacted-ledger file of today's layout (``compacted_ledger``: header,
records, index, trailer), written by one phase-two task: ``<run id>-<group>.seg`` in the topic's
compacted directory. A view ``<view id>.compacted`` written locally is a small *chain manifest*
(a file of the old one-file layout starts with ``CMQCLED1`` and stays readable) naming, in order,
the segments of every run since the chain was last rewritten, each with its *run number* (0, 1,
... within the chain), a sorted array of *dropped* positions, each with the run that dropped it,
and a sorted array of *masks* with the flat array of batch indexes they keep::

    magic    b"CMQCHAN2" (b"CMQCHAN1": no mask section; written so when there is no mask)
    header   [u32 n][n bytes of JSON: {"runs": R, "segments": [[name, run, entries, size], ...],
                                       "entries": N, "ledgers": [[ledger id, entries], ...]}]
    dropped  [u64 d] d x [i64 ledger_id][i64 entry_id][u32 run]                    (by position, run)
    masks    [u64 m] m x [i64 ledger_id][i64 entry_id][u32 run][u64 offset][u32 count]  (CMQCHAN2)
    kept     [u64 k] k x [u32 batch index]   (mask i keeps kept[offset_i : offset_i + count_i])
    [u32 crc32c of everything before] b"CMQCHEND"

Each run says, for the positions it touches, one of three things: a *copy* (the entry's bytes in
one of its segments), a *drop* (the position left the view), or a *mask* (the position's entry
keeps only some of its batch indexes). The entries of the view are, for every position, what the
*latest* run touching it said: its copy; nothing after a drop; after a mask of run r, the
*base* copy (the latest copy of an earlier run) rewritten so only the mask's batch indexes stay
live and every other message is a ``compacted_out`` placeholder: exactly the bytes phase two
writes when it rewrites a batch (``batch_rewrite.rebuild_ranges``, the one rewrite function, used
on read). A mask of a mask is therefore a mask of the base: the survivors of a later run are a
subset of an earlier one's, and a placeholder stays as it is. A dropped position never comes
back (positions only grow), so a drop is final.

A run masks an old batch that lost some of its messages (a few bytes in the manifest, instead
of decompressing, rewriting and recompressing it into the run's segment), drops an old entry
that lost every message (or that retention or the key TTL removed) and neither copies nor lists
an old entry that did not change. With ``compactionChainMasks`` false it rewrites such batches
into its segment instead (the older way; the bytes read are the same).

How reads stay a binary search
------------------------------
Opening a chain (``merge_index``, in ``chain_index``) concatenates the segments' indexes with the dropped positions
and the masks, sorts them by (position, run) when they are not already in order (a fresh chain's
segments are disjoint and in order: no sort at all), keeps the last row of each position, removes
the dropped ones and, for a masked one, keeps the row of its base copy and the mask. The result is
one sorted index, as a one-file view has, plus for each entry the segment its (base) copy lives
in and its mask, if any: ``CompactedLedgerReader`` answers ``find``/``read``/``last`` with the
same binary search, reading each entry's bytes from its own segment and applying its mask lazily,
when the entry is read (``entries`` rewrites the masked entries of a range in one call). The
broker, the Spark source, stats and the next run's phase two (``tasks.load_pieces``, which
rewrites only the masked entries it needs) all read through it, so none of them sees a mask.
Memory-mapping every segment at open keeps a pinned view readable after a newer run deleted some
of its files.

What the view reports: its entry count (``len``, the run's ``entries``) counts positions, a masked
entry once, as a rewrite would; ``size_bytes`` counts what is stored (the manifest, masks
included, and every segment it names), so a masked entry counts at its base copy's size, and a
superseded or dropped copy still counts until the chain is rewritten.

What a run writes (``runner.CompactionRunner``)
------------------------------------------------
* *Incremental* (the previous view is a local chain with a key sidecar and the merge policy
  allows it): a live group's task writes its survivors into a segment; a compacted group's task
  compares its survivors with the previous view's key sidecar (``view_keys``) entry by entry and
  reports a mask for each old batch that lost some message and the entries that lost all
  (``tasks.copy_group``); it writes no segment. A compacted group no survivor reached has no task: all its entries are
  dropped, and so are the entries retention removed (the driver lists both from the previous
  view's index; what it collects is proportional to what changed). The new manifest is the old
  one plus the new run's segments, drops and masks.
* *Fresh* (first run, a view of the old layout, a user strategy or no sidecar, a local chain
  when the view now goes to the object store or the reverse, or the merge policy): every survivor is copied, each task writing one complete
  segment, and the manifest names this run's segments only. No concatenation on the driver.

Merge policy (``should_merge``): a chain of ``compactionChainMaxRuns`` runs (8), or whose
stored entries are more than ``compactionChainMaxStaleRatio`` (25 %) stale, is rewritten fresh by
the next run, so reads never merge more than a few runs and dead bytes stay bounded. Stale is
every stored copy that is not read (dropped or superseded) plus ``MASK_STALE_WEIGHT`` (a tenth)
of an entry for every mask row (a masked entry stores a message nobody reads, typically one of
the ten or so live in a batch of a large view, and costs a rewrite on read; superseded masks
count too): a chain that keeps masking is rewritten fresh after a few runs (about four when
each run masks 60 % of the entries), which also turns its masks back into plain copies.

Files and their lifetime
------------------------
A segment may be named by several successive views. The clean-up after a commit deletes the
previous manifest and only those of its segments the new manifest does not name
(``stale_segments``); the orphan sweep at the start of a run keeps every file the view in force
names (``named_segments``) and deletes any other ``.seg`` file (a crashed run's). A view written
to the object store (tiered storage, cluster mode) is the same chain, manifest format included,
under a prefix of the store (``object_chain``: its layout and clean-up); offloaded one-file views
and the older manifest-of-parts views stay as they were.
"""

from __future__ import annotations

import json
import os
import re
import struct
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ..errors import StorageError
from ..storage.modes import open_private
from .chain_index import (  # noqa: F401  (re-exported: the merged index was part of this module)
    MERGE_CHUNK,
    SAMPLE,
    SPILL_ENTRIES,
    MergedIndex,
    SortedRows,
    _merge_core,
    _strictly_increasing,
    bisect,
    find_sampled,
    merge_chunked,
    merge_index,
)

MAGIC = b"CMQCHAN1"  # a manifest without masks (the first format; still written when there are none)
MAGIC_MASKS = b"CMQCHAN2"  # a manifest with a mask section after the dropped positions
END = b"CMQCHEND"
SEGMENT_SUFFIX = ".seg"
SEGMENT_NAME = re.compile(r"^(\d+)-(\d+)\.seg$")
DROPPED_DTYPE = np.dtype([("ledger_id", ">i8"), ("entry_id", ">i8"), ("run", ">u4")])
#: a mask: the entry at (ledger_id, entry_id) as of ``run`` keeps only the batch indexes
#: ``kept[offset : offset + count]`` of its base copy (see the module docstring)
MASK_DTYPE = np.dtype(
    [("ledger_id", ">i8"), ("entry_id", ">i8"), ("run", ">u4"), ("offset", ">u8"), ("count", ">u4")]
)
#: how much of an entry a mask row counts as stale for the merge policy (``should_merge``)
MASK_STALE_WEIGHT = 0.1

#: merge policy defaults (config keys ``compactionChainMaxRuns``, ``compactionChainMaxStaleRatio``)
MAX_RUNS = 8
MAX_STALE_RATIO = 0.25


def segment_name(run_id: int, group: int) -> str:
    """The file name of the segment phase-two task ``group`` of run ``run_id`` writes."""
    return f"{run_id:012d}-{group:06d}{SEGMENT_SUFFIX}"


@dataclass
class Manifest:
    """A chain manifest in memory: segments ``(name, run, entries, size)`` in chain order, the
    number of runs, and the dropped positions (``DROPPED_DTYPE``, sorted). ``ledgers`` (int64
    rows ``(ledger id, live entries)`` in id order) and ``entries`` (their total), when known,
    answer a run's plan without opening the view (``previous_view``)."""

    segments: list = field(default_factory=list)
    runs: int = 0
    dropped: np.ndarray = field(default_factory=lambda: np.zeros(0, DROPPED_DTYPE))
    masks: np.ndarray = field(default_factory=lambda: np.zeros(0, MASK_DTYPE))
    kept: np.ndarray = field(default_factory=lambda: np.zeros(0, ">u4"))
    ledgers: Optional[np.ndarray] = None
    entries: Optional[int] = None

    @property
    def stored(self) -> int:
        """Entries stored in the segments (live, superseded or dropped)."""
        return sum(int(s[2]) for s in self.segments)

    @property
    def size(self) -> int:
        return sum(int(s[3]) for s in self.segments)

    def names(self) -> list[str]:
        return [s[0] for s in self.segments]

    def extended(self, segments: list, ledger_ids, entry_ids, masks: Optional[tuple] = None) -> "Manifest":
        """The manifest of the next incremental run: its ``segments`` ``(name, entries, size)``,
        the positions it drops and its ``masks`` (``(ledger_ids, entry_ids, counts, kept)``: the
        batch indexes each masked entry keeps, ``kept`` flat in that order) appended as run
        ``self.runs``."""
        run = self.runs
        new = np.zeros(len(ledger_ids), DROPPED_DTYPE)
        new["ledger_id"], new["entry_id"], new["run"] = ledger_ids, entry_ids, run
        dropped = _append_run(self.dropped, new, DROPPED_DTYPE)
        all_masks, kept = self.masks, self.kept
        if masks is not None and len(masks[0]):
            m_lids, m_eids, counts, m_kept = masks
            counts = np.asarray(counts, np.int64)
            rows = np.zeros(len(counts), MASK_DTYPE)
            rows["ledger_id"], rows["entry_id"], rows["run"], rows["count"] = m_lids, m_eids, run, counts
            starts = np.zeros(len(counts), np.int64)
            np.cumsum(counts[:-1], out=starts[1:])
            rows["offset"] = starts + len(kept)
            kept = np.concatenate([kept, np.asarray(m_kept, np.int64).astype(">u4")])
            all_masks = _append_run(all_masks, rows, MASK_DTYPE)
        segs = self.segments + [(n, run, int(e), int(s)) for n, e, s in segments]
        return Manifest(segs, run + 1, dropped, all_masks, kept)

    @staticmethod
    def fresh(segments: list) -> "Manifest":
        """A chain of one run: ``segments`` ``(name, entries, size)`` in id order."""
        return Manifest([(n, 0, int(e), int(s)) for n, e, s in segments], 1)


def _append_run(old: np.ndarray, new: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``old`` rows (sorted by position, then run) with the rows of a later run ``new`` put in
    place: each after the rows of its position (an earlier run's) -- one insertion, not a sort of
    everything the chain ever dropped or masked (that array grows with the view)."""
    new = (
        new[np.lexsort((new["entry_id"], new["ledger_id"]))].astype(dtype) if len(new) else new.astype(dtype)
    )
    if not len(old) or not len(new):
        return np.concatenate([np.asarray(old, dtype), new]).astype(dtype)
    nl, ne = new["ledger_id"].astype(np.int64), new["entry_id"].astype(np.int64)
    key = (nl << 25) | ne
    at = np.zeros(len(new), np.int64)
    step = 1 << 20
    packable = _packable(nl, ne)
    for lo in range(0, len(old) if packable else 0, step):  # old rows at or before each new one
        part = old[lo : lo + step]
        pl, pe = part["ledger_id"].astype(np.int64), part["entry_id"].astype(np.int64)
        if not _packable(pl, pe):
            packable = False
            break
        at += np.searchsorted((pl << 25) | pe, key, side="right")
    if not packable:  # positions too large for one packed key: sort everything
        both = np.concatenate([np.asarray(old, dtype), new]).astype(dtype)
        return both[np.lexsort((both["run"], both["entry_id"], both["ledger_id"]))]
    return np.insert(np.asarray(old, dtype), at, new)


def _packable(lids: np.ndarray, eids: np.ndarray) -> bool:
    return bool(lids.min() >= 0 and eids.min() >= 0 and lids.max() < (1 << 38) and eids.max() < (1 << 25))


def is_chain(head) -> bool:
    return bytes(head[: len(MAGIC)]) in (MAGIC, MAGIC_MASKS)


def _pieces(manifest: Manifest) -> list:
    """The manifest's body as buffers, in order (the arrays as they are when already in the
    file's layout: a large manifest is written without a copy of its drops and masks)."""
    head: dict = {"runs": manifest.runs, "segments": [list(s) for s in manifest.segments]}
    if manifest.ledgers is not None and manifest.entries is not None:
        head["entries"] = int(manifest.entries)
        head["ledgers"] = np.asarray(manifest.ledgers, np.int64).tolist()
    header = json.dumps(head, separators=(",", ":")).encode()
    masked = len(manifest.masks) > 0
    pieces: list = [MAGIC_MASKS if masked else MAGIC, struct.pack(">I", len(header)), header]
    pieces += [struct.pack(">Q", len(manifest.dropped)), _raw(manifest.dropped, DROPPED_DTYPE)]
    if masked:
        pieces += [struct.pack(">Q", len(manifest.masks)), _raw(manifest.masks, MASK_DTYPE)]
        pieces += [struct.pack(">Q", len(manifest.kept)), _raw(manifest.kept, np.dtype(">u4"))]
    return pieces


def _raw(array: np.ndarray, dtype: np.dtype) -> memoryview:
    return memoryview(np.ascontiguousarray(array, dtype)).cast("B")


def encode(manifest: Manifest) -> bytes:
    body = b"".join(_pieces(manifest))
    return body + struct.pack(">I", _crc32c(body)) + END


def decode(data, path: str = "<manifest>") -> Manifest:
    """The manifest in ``data`` (any buffer), checked. Its dropped positions and masks are read
    in place, not copied: a reader's manifest stays in its memory-mapped file."""
    data = memoryview(data).cast("B")
    if len(data) < len(MAGIC) + 4 + 8 + 4 + len(END) or not is_chain(data):
        raise StorageError(f"{path}: not a compacted-view chain manifest")
    if bytes(data[-len(END) :]) != END:
        raise StorageError(f"{path}: chain manifest is incomplete")
    body = data[: -len(END) - 4]
    (crc,) = struct.unpack_from(">I", data, len(body))
    if _crc32c(body) != crc:
        raise StorageError(f"{path}: chain manifest checksum mismatch")
    at = len(MAGIC)
    (n,) = struct.unpack_from(">I", body, at)
    header = json.loads(bytes(body[at + 4 : at + 4 + n]))
    at += 4 + n
    (d,) = struct.unpack_from(">Q", body, at)
    at += 8
    dropped = np.frombuffer(body[at : at + d * DROPPED_DTYPE.itemsize], DROPPED_DTYPE)
    at += d * DROPPED_DTYPE.itemsize
    masks, kept = np.zeros(0, MASK_DTYPE), np.zeros(0, ">u4")
    if bytes(data[: len(MAGIC_MASKS)]) == MAGIC_MASKS:
        (m,) = struct.unpack_from(">Q", body, at)
        at += 8
        masks = np.frombuffer(body[at : at + m * MASK_DTYPE.itemsize], MASK_DTYPE)
        at += m * MASK_DTYPE.itemsize
        (k,) = struct.unpack_from(">Q", body, at)
        at += 8
        kept = np.frombuffer(body[at : at + k * 4], ">u4")
        if len(kept) != k or (m and int((masks["offset"] + masks["count"]).max()) > k):
            raise StorageError(f"{path}: chain manifest masks are inconsistent")
    segments = [(str(s[0]), int(s[1]), int(s[2]), int(s[3])) for s in header["segments"]]
    ledgers, entries = None, None
    if "ledgers" in header and "entries" in header:
        ledgers = np.array(header["ledgers"], np.int64).reshape(-1, 2)
        entries = int(header["entries"])
    return Manifest(segments, int(header["runs"]), dropped, masks, kept, ledgers, entries)


def write(path: str, manifest: Manifest) -> int:
    """Write the manifest to ``path`` durably (file and directory fsynced); returns its size."""
    from ..storage.managed_ledger import fsync_dir

    import crc32c

    crc, size = 0, 0
    with open_private(path) as f:
        for piece in _pieces(manifest):  # streamed, with a running checksum: no joined copy
            f.write(piece)
            crc = crc32c.crc32c(piece, crc)
            size += len(piece)
        f.write(struct.pack(">I", crc) + END)
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(os.path.dirname(path) or ".")
    return size + 4 + len(END)


def read(path: str) -> Optional[Manifest]:
    """The manifest at local ``path``; None when the file is missing or is not a chain."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    return decode(data, path) if is_chain(data) else None


def named_segments(path: str) -> Optional[set[str]]:
    """The segment file names the view at ``path`` names (empty: not a chain, or gone; None: the
    manifest cannot be read, so nothing may be assumed unnamed)."""
    try:
        manifest = read(path)
    except (StorageError, OSError):
        return None
    return set(manifest.names()) if manifest is not None else set()


def view_size(path: str, manifest: Manifest) -> int:
    """Bytes a chained view occupies: its manifest and every segment it names."""
    return os.path.getsize(path) + manifest.size


def remove_run_segments(directory: str, run_id: int) -> None:
    """Delete the segments run ``run_id`` wrote (its commit did not happen)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return
    for name in names:
        m = SEGMENT_NAME.match(name)
        if m and int(m.group(1)) == run_id:
            try:
                os.unlink(os.path.join(directory, name))
            except FileNotFoundError:
                pass


def stale_segments(previous: Optional[Manifest], current: Optional[Manifest]) -> list[str]:
    """Segments of the previous view the current one no longer names (to delete after a commit)."""
    if previous is None:
        return []
    keep = set(current.names()) if current is not None else set()
    return [n for n in previous.names() if n not in keep]


def should_merge(manifest: Optional[Manifest], live_entries: int, max_runs: int, max_stale: float) -> bool:
    """Whether the next run writes a fresh chain instead of extending ``manifest``."""
    if manifest is None or max_runs <= 1:
        return True
    if manifest.runs >= max_runs:
        return True
    stored = manifest.stored
    stale = stored - live_entries + MASK_STALE_WEIGHT * len(manifest.masks)
    return stored > 0 and stale / stored > max_stale


def _crc32c(data) -> int:
    import crc32c

    return crc32c.crc32c(data)
