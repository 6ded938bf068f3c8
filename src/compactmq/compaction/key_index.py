"""The key index of a compacted view: which message of the view holds a key, in a few microseconds.

Why
---
The broker answers "the latest value of key K" (``broker.latest_values``) from the compacted view
plus the live topic after its horizon. Scanning the view for one key costs as much as the view is
big; a view of a million keys must answer in well under a millisecond. A view's *key sidecar*
(``view_keys``: one Parquet row per surviving message with its 128-bit key hash, ledger id, packed
id and flags) already holds everything a lookup needs, but in id order. ``KeyIndex`` is those rows
sorted by key hash, held in memory beside the view handle: a lookup is a binary search on ``h1``
then a check of ``h2``.

Where the rows come from
------------------------
* A view with a sidecar (written by the default pipeline; ``viewKeys`` in the compaction details
  committed with the view): its files, minus the rows chained lookup runs retired (``gone``
  files), exactly the rows the next run's phase one would read. Nothing in the view's format
  changes, so views written before this module are read as they always were.
* Any other view (an old view whose sidecar is gone, a view in the object store, another
  factory's view): the view's entries parsed once with the compaction scanner
  (``message_rows.entry_rows``), ``PARSE_ENTRIES`` at a time.

Either way keyless rows (``topicCompactionRetainNullKey``) are left out: a key lookup can never
name them. Should two rows share a key (a view cannot hold that, but a parsed foreign view might),
the one with the greatest id wins, as a reader replaying the view would end with it.

Hashes, not keys
----------------
The index holds hashes (``entry_scan.hash_key_py``), so a hit is a *candidate*: the caller reads
the message and compares its key (``broker.latest_values`` does). Two distinct keys share both
hashes with odds about n^2 / 2^129 (``entry_scan``); a mismatch is then reported as a miss, never
as another key's value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional

import numpy as np

from . import entry_scan as es
from . import message_rows as mr

#: entries of a view parsed in one pass when the view has no sidecar
PARSE_ENTRIES = 20_000


@dataclass(frozen=True)
class KeyHit:
    """Where a key's message is: ``(ledger_id, entry_id, batch_index)`` and whether it is a
    tombstone (kept by tombstone retention)."""

    ledger_id: int
    entry_id: int
    batch_index: int
    tombstone: bool

    @property
    def position(self) -> tuple[int, int]:
        return (self.ledger_id, self.entry_id)


class KeyIndex:
    """Rows ``(h1, h2, ledger_id, id, flags)`` sorted by ``h1`` (``id``: entry << 16 | batch)."""

    def __init__(self, h1, h2, ledger_ids, ids, flags, source: str = "") -> None:
        h1, h2 = np.asarray(h1, np.int64), np.asarray(h2, np.int64)
        lids, ids = np.asarray(ledger_ids, np.int64), np.asarray(ids, np.int64)
        flags = np.asarray(flags, np.int8)
        keyed = (flags & es.FLAG_KEYLESS) == 0
        if not keyed.all():
            h1, h2, lids, ids, flags = (a[keyed] for a in (h1, h2, lids, ids, flags))
        # by h1 alone (a view holds one row per key, so equal h1s are all but unheard of); only
        # when two rows share h1 is the order refined to key then id, the last row of a key being
        # the one a replay ends with
        order = np.argsort(h1, kind="stable")
        h1, h2, lids, ids, flags = (a[order] for a in (h1, h2, lids, ids, flags))
        if len(h1) > 1 and (h1[1:] == h1[:-1]).any():
            order = np.lexsort((ids, lids, h2, h1))
            h1, h2, lids, ids, flags = (a[order] for a in (h1, h2, lids, ids, flags))
            last = np.ones(len(h1), bool)
            last[:-1] = (h1[1:] != h1[:-1]) | (h2[1:] != h2[:-1])
            h1, h2, lids, ids, flags = (a[last] for a in (h1, h2, lids, ids, flags))
        self.h1, self.h2, self.ledger_ids, self.ids, self.flags = h1, h2, lids, ids, flags
        self.source = source  # "sidecar" or "parsed": how it was built (reported in stats)

    def __len__(self) -> int:
        return len(self.h1)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.h1, self.h2, self.ledger_ids, self.ids, self.flags))

    def find(self, h1: int, h2: int) -> Optional[KeyHit]:
        """The row of the key hashed ``(h1, h2)``, or None."""
        i = int(np.searchsorted(self.h1, h1, side="left"))
        n = len(self.h1)
        while i < n and int(self.h1[i]) == h1:  # (a run longer than one needs a shared h1)
            if int(self.h2[i]) == h2:
                pid = int(self.ids[i])
                return KeyHit(
                    int(self.ledger_ids[i]),
                    pid >> es.BATCH_BITS,
                    pid & es.MAX_BATCH,
                    bool(int(self.flags[i]) & es.FLAG_TOMBSTONE),
                )
            i += 1
        return None


def rows_of_entries(entries: list) -> tuple:
    """``(h1, h2, ledger_ids, ids, flags)`` of the messages of ``entries`` (``(position, bytes)``
    in id order), markers and ``compacted_out`` placeholders left out, keyless rows flagged."""
    if not entries:
        z = np.zeros(0, np.int64)
        return z, z, z, z, np.zeros(0, np.int8)
    lids = np.fromiter((int(p[0]) for p, _ in entries), np.int64, len(entries))
    eids = np.fromiter((int(p[1]) for p, _ in entries), np.int64, len(entries))
    lengths = np.fromiter((len(d) for _, d in entries), np.int64, len(entries))
    offsets = np.zeros(len(entries), np.int64)
    np.cumsum(lengths[:-1], out=offsets[1:])
    buf = np.frombuffer(b"".join(bytes(d) for _, d in entries), np.uint8)
    ledgers, ordinal = np.unique(lids, return_inverse=True)
    rows = mr.entry_rows(buf, eids, offsets, lengths, ordinal)
    ords, entry_ids, batch = es.unpack_positions(rows.pos)
    ids = (entry_ids << es.BATCH_BITS) | batch
    return rows.h1, rows.h2, ledgers[ords], ids, rows.flags


def from_entries(batches: Iterable[list], source: str = "parsed") -> KeyIndex:
    """The index of a view whose entries come in ``batches`` of ``(position, bytes)``."""
    parts = [rows_of_entries(b) for b in batches if b]
    if not parts:
        return KeyIndex([], [], [], [], [], source)
    cols = [np.concatenate([p[k] for p in parts]) for k in range(5)]
    return KeyIndex(*cols, source=source)


def from_view(view) -> KeyIndex:
    """Parse ``view`` (a ``CommittedView``) into its index, ``PARSE_ENTRIES`` entries at a time."""

    def batches():
        start: tuple = (-1, -1)
        while True:
            got = view.read(start, PARSE_ENTRIES)
            if not got:
                return
            yield got
            last = got[-1][0]
            start = (int(last[0]), int(last[1]) + 1)

    return from_entries(batches())


def _read(source: dict, name: str, columns: list) -> dict:
    """Columns of sidecar file ``name`` (local, or an object in ``source["store"]``), read once
    here: the broker keeps the index, not the files (``view_keys``' worker cache is for tasks)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if source.get("store") is None:
        t = pq.read_table(name, columns=columns)
    else:
        from ..storage.offload import open_store

        t = pq.read_table(pa.BufferReader(open_store(source["store"]).read_all(name)), columns=columns)
    return {c: t.column(c).to_numpy() for c in columns}


def from_sidecar(source: dict) -> KeyIndex:
    """The index of a view from its key sidecar (``view_keys.plan_entry``: files, gone files)."""
    wanted = ["ledger_id", "id", "h1", "h2", "flags"]
    tables = [_read(source, f, wanted) for f in source["files"]]
    tables = [t for t in tables if len(t["id"])]
    if not tables:
        return KeyIndex([], [], [], [], [], "sidecar")
    cols = {c: np.concatenate([t[c] for t in tables]) for c in wanted}
    lids, ids = cols["ledger_id"].astype(np.int64), cols["id"].astype(np.int64)
    gone = [_read(source, f, ["ledger_id", "id"]) for f in source.get("gone") or []]
    if gone:
        g_lids = np.concatenate([g["ledger_id"] for g in gone]).astype(np.int64)
        g_ids = np.concatenate([g["id"] for g in gone]).astype(np.int64)
        live = np.ones(len(ids), bool)
        for lid in np.unique(g_lids).tolist():  # rows a lookup run retired (a position is never reused)
            rows = lids == lid
            live[rows] &= ~np.isin(ids[rows], g_ids[g_lids == lid])
        cols = {c: a[live] for c, a in cols.items()}
        lids, ids = lids[live], ids[live]
    return KeyIndex(cols["h1"], cols["h2"], lids, ids, cols["flags"], source="sidecar")
