"""Phase-one rows: one per message of a source's entries -- a 128-bit key hash, the packed
position, tombstone and keyless flags, the event time -- and keep-latest's map-side combiner.

``entry_rows`` turns a source's entries into rows with what ``entry_scan`` reads (metadata and
batch fields, key hashes; the native extension does the common case of one message per entry
in a single pass). A keyless message gets a group of its own: its position stands in for the
hash (``h1 = pos``, ``h2 = KEYLESS_MARK``). For keep-latest a parsing task then drops the rows
that a later row of the same key in its own group supersedes (``LatestCombiner``, streaming a
group's chunks into the native table; ``combine_latest`` for one batch of rows), as Spark's
partial aggregation would: the final aggregate never needs them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import native
from .entry_scan import (
    _SEED_ARRAY,
    FLAG_KEYLESS,
    FLAG_TOMBSTONE,
    KEYLESS_MARK,
    batch_payloads,
    hash_keys,
    pack_positions,
    scan_batches,
    scan_entry_metadata,
)


@dataclass
class Rows:
    """Phase-one rows of one source: key hash, packed position, flags, event time; in position
    order. A keyless row has ``h1 = pos``, ``h2 = KEYLESS_MARK`` (a group of its own)."""

    h1: np.ndarray
    h2: np.ndarray
    pos: np.ndarray
    flags: np.ndarray  # int8
    event_time: np.ndarray

    def __len__(self):
        return len(self.pos)

    def take(self, idx) -> "Rows":
        return Rows(self.h1[idx], self.h2[idx], self.pos[idx], self.flags[idx], self.event_time[idx])

    @staticmethod
    def concat(parts: list) -> "Rows":
        return Rows(
            *(
                np.concatenate([getattr(r, f) for r in parts])
                for f in ("h1", "h2", "pos", "flags", "event_time")
            )
        )


def _rows(buf, key_off, key_len, pos, tomb, et) -> Rows:
    h1, h2 = hash_keys(buf, key_off, key_len)
    keyless = key_len < 0
    flags = np.where(keyless, FLAG_KEYLESS, 0) | np.where(tomb & ~keyless, FLAG_TOMBSTONE, 0)
    h1 = np.where(keyless, pos, h1)
    h2 = np.where(keyless, KEYLESS_MARK, h2)
    return Rows(h1, h2, pos, flags.astype(np.int8), et)


def entry_rows(
    buf: np.ndarray, entry_ids: np.ndarray, offsets: np.ndarray, lengths: np.ndarray, ordinal
) -> Rows:
    """Phase-one rows for the entries of one source (``ordinal`` per entry or one for all), in
    position order.

    Non-batched and encrypted entries give one row (batch index 0) keyed by the outer
    ``partition_key``; a batch gives one row per sub-message that is not already a
    ``compacted_out`` placeholder; markers give none. A keyless message is never a tombstone.
    """
    entry_ids = np.asarray(entry_ids, np.int64)
    ordinal = np.broadcast_to(np.asarray(ordinal, np.int64), entry_ids.shape)
    lib = native.library()
    if lib is not None:  # entries of one message each (no batch, no marker): one pass in C
        got = native.single_rows(lib, buf, offsets, lengths, _SEED_ARRAY)
        if got is not None:
            h1, h2, flags, et = got
            pos = pack_positions(ordinal, entry_ids, np.zeros(len(entry_ids), np.int64))
            keyless = (flags & FLAG_KEYLESS) != 0
            if keyless.any():
                h1, h2 = np.where(keyless, pos, h1), np.where(keyless, KEYLESS_MARK, h2)
            return Rows(h1, h2, pos, flags, et)
    info = scan_entry_metadata(buf, offsets, lengths)
    live = ~info.marker
    single = np.flatnonzero(live & (~info.batched | info.encrypted))
    batch = np.flatnonzero(live & info.batched & ~info.encrypted)
    s_pos = pack_positions(ordinal[single], entry_ids[single], np.zeros(len(single), np.int64))
    rows = _rows(
        buf,
        info.key_off[single],
        info.key_len[single],
        s_pos,
        info.end[single] == info.md_end[single],
        info.event_time[single],
    )
    if not batch.size:
        return rows
    bbuf, bstart, bend = batch_payloads(buf, info, batch)
    sub = scan_batches(bbuf, bstart, bend, info.num_messages[batch])
    keep = np.flatnonzero(~sub.compacted_out)
    e = batch[sub.batch[keep]]
    b_pos = pack_positions(ordinal[e], entry_ids[e], sub.index[keep])
    brows = _rows(
        bbuf, sub.key_off[keep], sub.key_len[keep], b_pos, sub.payload_size[keep] == 0, sub.event_time[keep]
    )
    if not len(rows):
        return brows
    both = Rows.concat([rows, brows])
    return both.take(np.argsort(both.pos, kind="stable"))


class LatestCombiner:
    """``combine_latest`` over rows that arrive a chunk at a time (a parsing task's whole group):
    with the extension each chunk streams into a table of one row per key (``native.LatestTable``:
    memory grows with the group's distinct keys, not its rows; kept rows come out in no
    particular order, without event times, which keep-latest never ships); without it the chunks
    are kept and combined at the end. Chunks must come in position order (the numpy path keeps
    the last row in input order; the table keeps the greatest position, the same row)."""

    def __init__(self) -> None:
        lib = native.library()
        self._table = native.LatestTable(lib) if lib is not None else None
        self._parts: list = []

    def add(self, rows: Rows) -> None:
        if self._table is None:
            self._parts.append(rows)
        else:
            self._table.add(rows.h1, rows.h2, rows.pos, rows.flags)

    def distinct(self) -> int | None:
        """The keys held so far (None without the extension: its chunks are combined only at
        the end)."""
        return None if self._table is None else self._table.count

    def rows(self) -> Rows:
        if self._table is None:
            return combine_latest(Rows.concat(self._parts)) if self._parts else no_rows()
        c = self._table.columns()
        return Rows(c["h1"], c["h2"], c["pos"], c["flags"], np.zeros(len(c["pos"]), np.int64))


def no_rows() -> Rows:
    """Rows of nothing."""
    z = np.zeros(0, np.int64)
    return Rows(z, z.copy(), z.copy(), np.zeros(0, np.int8), z.copy())


def combine_latest(rows: Rows) -> Rows:
    """Map-side combiner for keep-latest: of the rows of one key in this batch keep only the last
    (rows must be in position order). Like Spark's partial aggregation, it only removes rows the
    final aggregate would discard anyway; a tombstone that is a key's last row here is kept, so it
    still deletes that key's earlier rows elsewhere."""
    if len(rows) < 2:
        return rows
    lib = native.library()
    if lib is not None:  # a hash table in C: exact, and no sort
        return rows.take(np.flatnonzero(native.last_per_key(lib, rows.h1, rows.h2)))
    # by key (both halves: keys that share h1 must not interleave), then position order
    order = np.lexsort((np.arange(len(rows)), rows.h2, rows.h1))
    h1, h2 = rows.h1[order], rows.h2[order]
    last = np.ones(len(order), bool)
    last[:-1] = (h1[1:] != h1[:-1]) | (h2[1:] != h2[:-1])
    keep = np.sort(order[last])
    return rows.take(keep)
