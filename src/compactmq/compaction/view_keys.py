"""The key sidecar of a compacted view: what phase one needs of it, kept beside it as Parquet.

Why
---
An incremental run must know, for every message of the previous compacted view, its key hash,
its position and its flags (tombstone, keyless) -- and its event time for the event-time
strategy. Parsing the previous compacted ledger again to learn them costs as much as the whole
view is big, on every run. The phase-two tasks know all of it already when they copy the
survivors, so each writes it down as it copies: one Parquet file per part of the compacted
ledger (a columnar format Spark, pyarrow and every data tool read natively), and the next run
reads those few columns instead of the view's entries.

Layout
------
One row per surviving message, in id order (each file in id order, files in group order)::

    ledger_id long, id long (entry_id << 16 | batch_index), h1 long, h2 long, flags byte[, et long]

``flags`` uses ``entry_scan``'s bits (1: tombstone, kept by tombstone retention; 2: a retained
keyless message). ``et`` (the event time) is there only when the run used the event-time
strategy; a run that needs it and finds none falls back to parsing the view.

Where it lives, and the atomic switch
-------------------------------------
* Local view ``<topic dir>/<id>.compacted``: the sidecar is the directory ``<id>.keys`` beside it.
  Phase-two tasks write into the run directory; the driver renames the directory into place
  before the commit, so it exists whenever the metadata store names the view. A crash before the
  commit leaves an orphan ``<id>.keys`` which the next run's orphan sweep removes with the
  orphan ledger file; after the commit the previous view's sidecar is deleted with its file.
* View written to the object store (tiered storage): the tasks upload their sidecar files under
  the view's prefix, ``<prefix>/keys/...``, so deleting the view's prefix (or sweeping it as an
  orphan) takes the sidecar with it.
* Offloading a local view later copies its ledger file only; its sidecar stays local (it is
  small) and goes when the view is replaced.

The run that writes a sidecar lists its files in the compaction details it commits together
with the view (``viewKeys``). A view without that entry (written by code before the sidecar, by
a user strategy, or whose sidecar is missing) is parsed as before.

Chained sidecars
----------------
A *lookup run* (``lookup_run``: an incremental run that sends only the new messages through the engine) does not rewrite the
sidecar. It writes the rows of its new survivors (``keys-<run>-<group>.parquet``) and, for each
group of old entries, the ``(ledger_id, id)`` of the rows it retires -- superseded by a newer
message, deleted, expired -- (``gone-<run>-<group>.parquet``, ``write_gone``). The new view's
sidecar lists the previous one's files, hard-linked into its own directory, plus these: its
live rows are the rows of ``files`` whose id no ``gone`` file names (a message's position is
never reused, so a retired row never comes back). Its length is bounded by the chain's: a run
that writes a fresh chain writes one fresh sidecar.

Only ids <= the horizon are in a view, and a segment of the next run reads only the rows of its
own ledger from ``entry_lo`` on (retention may have trimmed the view's first ids), so a sidecar
row becomes exactly the phase-one row that parsing the view's entry would have produced.
"""

from __future__ import annotations

import os
import shutil
from collections import OrderedDict
from typing import Optional

import numpy as np

from . import entry_scan as es
from . import message_rows as mr

SUFFIX = ".keys"
STORE_DIR = "keys"
ROW_GROUP = 1 << 17  # rows per Parquet row group: a reader skips groups outside its ledgers
DETAILS_KEY = "viewKeys"


def part_name(group: int, run: Optional[int] = None) -> str:
    """The sidecar file of a part; a lookup run's names carry its run id (``Chained sidecars``)."""
    return f"keys-{group:06d}.parquet" if run is None else f"keys-{run:012d}-{group:06d}.parquet"


def gone_name(run: int, group: int) -> str:
    """The file of the rows a lookup run's ``group`` retires from the sidecar."""
    return f"gone-{run:012d}-{group:06d}.parquet"


def local_dir(topic_dir: str, view_id: int) -> str:
    """The sidecar directory of local view ``view_id``."""
    return os.path.join(topic_dir, f"{view_id:012d}{SUFFIX}")


def remove_local(topic_dir: str, view_id: Optional[int]) -> None:
    if view_id is not None:
        shutil.rmtree(local_dir(topic_dir, view_id), ignore_errors=True)


def place_run_dir(run_dir: str, topic_dir: str, view_id: int, move: bool) -> str:
    """Put the sidecar directory a run's tasks wrote (``<run_dir>/keys``) in place as view
    ``view_id``'s (``local_dir``), replacing what a crashed attempt left there; when ``move`` is
    false (the run wrote no sidecar rows) the view gets an empty directory. Returns the view's
    sidecar directory; the caller fsyncs it and ``topic_dir`` once it has finished filling it."""
    dst = local_dir(topic_dir, view_id)
    shutil.rmtree(dst, ignore_errors=True)
    if move:
        os.rename(os.path.join(run_dir, STORE_DIR), dst)
    else:
        os.makedirs(dst)
    return dst


# --- writing (phase-two tasks) ------------------------------------------------------------------


def write_part(path: str, ledger_ids, positions, h1, h2, flags, et=None) -> int:
    """Write the sidecar rows of one part to the local file ``path``; ``positions`` are the run's
    packed positions, ``ledger_ids`` the ledger of each. Returns the row count."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    positions = np.asarray(positions, np.int64)
    ids = positions & ((1 << (es.ENTRY_BITS + es.BATCH_BITS)) - 1)
    cols = [
        pa.array(np.asarray(ledger_ids, np.int64)),
        pa.array(ids),
        pa.array(np.asarray(h1, np.int64)),
        pa.array(np.asarray(h2, np.int64)),
        pa.array(np.asarray(flags, np.int8)),
    ]
    names = ["ledger_id", "id", "h1", "h2", "flags"]
    if et is not None:
        cols.append(pa.array(np.asarray(et, np.int64)))
        names.append("et")
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    # hashes do not compress; the ledger id column does, and its statistics let readers skip
    pq.write_table(
        pa.Table.from_arrays(cols, names=names),
        path,
        row_group_size=ROW_GROUP,
        compression="none",
        use_dictionary=["ledger_id"],
    )
    return len(positions)


def write_gone(path: str, ledger_ids, ids) -> int:
    """Write the (ledger id, id) pairs of rows a lookup run retires to the local file ``path``
    (sorted by ledger id, then id). Returns the row count."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    cols = [pa.array(np.asarray(ledger_ids, np.int64)), pa.array(np.asarray(ids, np.int64))]
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    pq.write_table(
        pa.Table.from_arrays(cols, names=["ledger_id", "id"]),
        path,
        row_group_size=ROW_GROUP,
        compression="none",
        use_dictionary=["ledger_id"],
    )
    return len(cols[0])


def flags_of(tomb, h2) -> np.ndarray:
    """Sidecar flags of survivors from their tombstone bit and key hash (a retained keyless
    message carries ``KEYLESS_MARK`` as its h2)."""
    tomb = np.asarray(tomb).astype(np.int8) & es.FLAG_TOMBSTONE
    keyless = np.where(np.asarray(h2, np.int64) == es.KEYLESS_MARK, es.FLAG_KEYLESS, 0).astype(np.int8)
    return (tomb | keyless).astype(np.int8)


# --- reading (phase-one tasks) ------------------------------------------------------------------


def plan_entry(files: list[str], store=None, gone: Optional[list[str]] = None) -> dict:
    """What a ``RunPlan`` carries (``view_keys``) for tasks to read a view's sidecar:
    local paths, or object keys in ``store`` (an offload location); ``gone``: the files of rows
    lookup runs retired (``Chained sidecars``)."""
    return {"files": list(files), "store": store, "gone": list(gone or [])}


def _read_table(source: dict, name: str, lo: int, hi: int, columns: Optional[list] = None):
    import pyarrow as pa
    import pyarrow.parquet as pq

    filters = [("ledger_id", ">=", lo), ("ledger_id", "<=", hi)]
    if source.get("store") is None:
        return pq.read_table(name, filters=filters, columns=columns)
    from ..storage.offload import open_store

    return pq.read_table(
        pa.BufferReader(open_store(source["store"]).read_all(name)), filters=filters, columns=columns
    )


#: sidecar rows a worker process keeps between tasks and runs (``_columns``): about 33 bytes each
FILE_CACHE_ROWS = 4_000_000
_file_cache: "OrderedDict[tuple, dict]" = OrderedDict()


def _columns(source: dict, name: str, lo: int, hi: int, wanted: tuple) -> dict:
    """The ``wanted`` columns (numpy) of sidecar file ``name``'s rows of ledgers ``lo .. hi``.

    A local file is read whole once per worker process and kept (up to ``FILE_CACHE_ROWS`` rows
    over all files, least recently used first out), keyed by its inode, size and time: files
    never change once written, and the next view's sidecar hard-links the same files, so a
    lookup run reads only the files written since this worker last read the sidecar -- what grows
    with the new data, not with the view. A file in the object store is read by ranges, as it is.
    """
    if source.get("store") is not None:
        t = _read_table(source, name, lo, hi, list(wanted))
        return {c: t.column(c).to_numpy() for c in wanted}
    st = os.stat(name)
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    cols = _file_cache.get(key)
    if cols is None:
        import pyarrow.parquet as pq

        if pq.read_metadata(name).num_rows > FILE_CACHE_ROWS:  # too large to keep: its rows of lo .. hi
            t = _read_table(source, name, lo, hi, [c for c in wanted if c in pq.read_schema(name).names])
            return {c: t.column(c).to_numpy() for c in t.column_names}
        t = pq.read_table(name)
        cols = {c: t.column(c).to_numpy() for c in t.column_names}
        lids = cols["ledger_id"]
        if len(lids) > 1 and (np.diff(lids) < 0).any():  # (written in id order: not expected)
            order = np.lexsort((cols["id"], lids))
            cols = {c: a[order] for c, a in cols.items()}
        if len(lids) <= FILE_CACHE_ROWS:
            _file_cache[key] = cols
            while sum(len(c["ledger_id"]) for c in _file_cache.values()) > FILE_CACHE_ROWS:
                _file_cache.popitem(last=False)
    else:
        _file_cache.move_to_end(key)
    a, b = np.searchsorted(cols["ledger_id"], [lo, hi + 1])
    return {c: cols[c][a:b] for c in wanted if c in cols}


def _not_gone(source: dict, lids: np.ndarray, ids: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Which of the rows ``(lids, ids)`` (sorted) no lookup run retired: the mask of live rows."""
    tables = [_columns(source, f, lo, hi, ("ledger_id", "id")) for f in source["gone"]]
    tables = [t for t in tables if len(t["id"])]
    live = np.ones(len(ids), bool)
    if not tables:
        return live
    g_lids = np.concatenate([t["ledger_id"] for t in tables]).astype(np.int64)
    g_ids = np.concatenate([t["id"] for t in tables]).astype(np.int64)
    for lid in np.unique(g_lids).tolist():
        a = int(np.searchsorted(lids, lid, side="left"))
        b = int(np.searchsorted(lids, lid, side="right"))
        live[a:b] &= ~np.isin(ids[a:b], g_ids[g_lids == lid], kind="sort")
    return live


def segment_rows(source: dict, segments: list, with_event_time: bool) -> list:
    """Phase-one ``Rows`` of compacted segments (one group's, in ordinal order) from the sidecar:
    the rows of each segment's ledger from its ``entry_lo`` on, positions packed with the
    segment's ordinal (a keyless row's h1 is its position, as when parsed)."""
    if not segments:
        return []
    lo = min(s.ledger_id for s in segments)
    hi = max(s.ledger_id for s in segments)
    wanted = ("ledger_id", "id", "h1", "h2", "flags") + (("et",) if with_event_time else ())
    tables = [_columns(source, f, lo, hi, wanted) for f in source["files"]]
    tables = [t for t in tables if len(t["id"])]
    if not tables:
        return []

    def col(name):
        return np.concatenate([t[name] for t in tables]).astype(np.int64)

    lids, ids, h1, h2 = col("ledger_id"), col("id"), col("h1"), col("h2")
    flags = np.concatenate([t["flags"] for t in tables]).astype(np.int8)
    et = col("et") if with_event_time else np.zeros(len(ids), np.int64)
    if len(ids) > 1 and ((np.diff(lids) < 0) | ((np.diff(lids) == 0) & (np.diff(ids) <= 0))).any():
        order = np.lexsort((ids, lids))  # (a reader that did not keep the files' order)
        lids, ids, h1, h2, flags, et = (a[order] for a in (lids, ids, h1, h2, flags, et))
    if source.get("gone"):
        live = _not_gone(source, lids, ids, lo, hi)
        if not live.all():
            lids, ids, h1, h2, flags, et = (a[live] for a in (lids, ids, h1, h2, flags, et))
    out = []
    for seg in segments:
        a = int(np.searchsorted(lids, seg.ledger_id, side="left"))
        b = int(np.searchsorted(lids, seg.ledger_id, side="right"))
        a += int(np.searchsorted(ids[a:b], int(seg.entry_lo) << es.BATCH_BITS, side="left"))
        if a >= b:
            continue
        pos = (np.int64(seg.ordinal) << (es.ENTRY_BITS + es.BATCH_BITS)) | ids[a:b]
        keyless = (flags[a:b] & es.FLAG_KEYLESS) != 0
        out.append(
            mr.Rows(np.where(keyless, pos, h1[a:b]), h2[a:b].copy(), pos, flags[a:b].copy(), et[a:b].copy())
        )
    return out
