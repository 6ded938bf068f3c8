"""Stored entries to flat message columns, with no Python object per message.

The row path of the source (``messages.entry_messages``) parses each entry with protobuf and
builds one ``Message`` per message: several microseconds each. This module reads the same facts
for a whole range of entries at once, with the compaction scanner's wire readers
(``compaction.entry_scan``: the C extension when it is built, its numpy reference otherwise):

1. the outer ``MessageMetadata`` of every entry (``scan_entry_metadata``);
2. the payload of every compressed entry, decompressed -- one library call per *entry* -- and laid
   after the entries in one buffer (``batch_payloads``);
3. the sub-messages of every batch (``scan_batches``);
4. the properties (``MessageMetadata`` field 4, ``SingleMessageMetadata`` field 1: repeated
   ``KeyValue``), found by a lockstep walk over all metadata (``repeated_fields``).

The result, ``MessageColumns``, is a set of numpy arrays, one slot per message in id order (entry,
then batch index), whose keys, values and properties are byte ranges of one buffer;
``arrow_columns`` turns it into Arrow arrays. It says exactly what ``entry_messages`` says: marker
entries and ``compacted_out`` placeholders are skipped, an encrypted entry is one opaque message
(payload neither decompressed nor split), a batched message takes its key and event time from its
own metadata and a single message from the entry's. ``tests/spark/test_columns.py`` checks the
two against each other over random entries.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from ..compaction import entry_scan as es
from ..errors import MalformedEntry, UnreadableEntry

MD_PROPERTIES = 4  # MessageMetadata.properties (repeated KeyValue)
SM_PROPERTIES = 1  # SingleMessageMetadata.properties
KV_KEY, KV_VALUE = 1, 2


@dataclass
class MessageColumns:
    """One slot per message (int64 arrays) plus the properties, as ranges of ``buf``.

    ``key_len`` is -1 for a keyless message. Message ``i``'s properties are the key/value
    ranges ``prop_start[i] .. prop_start[i] + prop_count[i] - 1`` of the ``kv_*`` arrays (shared
    by a ``take`` of some messages)."""

    buf: np.ndarray
    ledger_id: np.ndarray
    entry_id: np.ndarray
    batch_index: np.ndarray  # -1: not in a batch
    batch_size: np.ndarray  # 0: not in a batch
    publish_time: np.ndarray  # ms
    event_time: np.ndarray  # ms, 0: none
    key_off: np.ndarray
    key_len: np.ndarray
    value_off: np.ndarray
    value_len: np.ndarray
    prop_start: np.ndarray
    prop_count: np.ndarray
    kv_key_off: np.ndarray
    kv_key_len: np.ndarray
    kv_value_off: np.ndarray
    kv_value_len: np.ndarray

    def __len__(self) -> int:
        return len(self.entry_id)

    def take(self, idx) -> MessageColumns:
        """The messages ``idx`` (indexes or a mask), in that order."""
        per_row = {f.name for f in fields(self)} - {
            "buf",
            "kv_key_off",
            "kv_key_len",
            "kv_value_off",
            "kv_value_len",
        }
        return MessageColumns(
            **{
                f.name: getattr(self, f.name)[idx] if f.name in per_row else getattr(self, f.name)
                for f in fields(self)
            }
        )

    def within(self, start_id: tuple, end_id: tuple, start_time, end_time) -> np.ndarray:
        """Mask of the messages with ``start_id <= (ledger, entry, batch) < end_id`` and a publish
        time in ``[start_time, end_time)`` (None: unbounded), as ``plan.bounded`` selects."""
        ids = (self.ledger_id, self.entry_id, self.batch_index)
        keep = ~_less(ids, start_id) & _less(ids, end_id)
        if start_time is not None:
            keep &= self.publish_time >= start_time
        if end_time is not None:
            keep &= self.publish_time < end_time
        return keep


def _less(ids: tuple, bound: tuple) -> np.ndarray:
    """Lexicographic ``ids < bound`` of id columns against one id tuple."""
    out = np.zeros(len(ids[0]), bool)
    equal = np.ones(len(ids[0]), bool)
    for col, b in zip(ids, bound):
        out |= equal & (col < b)
        equal &= col == b
    return out


def _empty_i64() -> np.ndarray:
    return np.zeros(0, np.int64)


def parse_entries(
    buf: np.ndarray,
    offsets,
    lengths,
    ledger_ids,
    entry_ids,
    start_time=None,
    end_time=None,
    properties: bool = True,
) -> MessageColumns:
    """The messages of the entries ``buf[offsets[i] : offsets[i] + lengths[i]]`` (entry ``i`` has
    id ``(ledger_ids[i], entry_ids[i])``; entries in id order). An entry published outside
    ``[start_time, end_time)`` (ms; None: unbounded) is skipped whole, before its payload is
    decompressed or split (its messages share its publish time). ``properties=False`` leaves
    the properties out (every message then has none): a read that returns no
    ``__messageProperties`` column skips their walk over all metadata.

    Raises:
        UnreadableEntry / MalformedEntry: an entry that does not decode (as the row path does).
    """
    offsets = np.asarray(offsets, np.int64)
    lengths = np.asarray(lengths, np.int64)
    ledger_ids = np.broadcast_to(np.asarray(ledger_ids, np.int64), offsets.shape)
    entry_ids = np.asarray(entry_ids, np.int64)
    if not len(offsets):
        z = _empty_i64()
        return MessageColumns(buf, *([z] * 16))
    info = es.scan_entry_metadata(buf, offsets, lengths)
    live = ~info.marker
    if start_time is not None:
        live &= info.publish_time >= start_time
    if end_time is not None:
        live &= info.publish_time < end_time
    buf, pstart, pend = _payloads(buf, info, live)
    batched = np.flatnonzero(live & info.batched & ~info.encrypted)
    single = np.flatnonzero(live & ~(info.batched & ~info.encrypted))
    sub = _batch_messages(buf, pstart[batched], pend[batched], info.num_messages[batched])
    keep = ~sub.compacted_out
    ent = np.concatenate([single, batched[sub.batch[keep]]])
    index = np.concatenate([np.full(len(single), -1, np.int64), sub.index[keep]])
    order = np.lexsort((index, ent))
    ent, index = ent[order], index[order]
    in_batch = index >= 0

    def pick(single_col, sub_col):
        return np.concatenate([single_col, sub_col[keep]])[order]

    if properties:
        numbers = np.where(in_batch, SM_PROPERTIES, MD_PROPERTIES)
        meta = (pick(info.md_start[single], sub.smm_start), pick(info.md_end[single], sub.smm_end))
        prop_start, prop_count, kv_key, kv_value = _properties(buf, *meta, numbers)
    else:
        z = _empty_i64()
        prop_start, prop_count, kv_key, kv_value = (
            np.zeros(len(ent), np.int64),
            np.zeros(len(ent), np.int64),
            (z, z),
            (z, z),
        )
    return MessageColumns(
        buf=buf,
        ledger_id=ledger_ids[ent],
        entry_id=entry_ids[ent],
        batch_index=index,
        batch_size=np.where(in_batch, info.num_messages[ent], 0),
        publish_time=info.publish_time[ent],
        event_time=pick(info.event_time[single], sub.event_time),
        key_off=pick(info.key_off[single], sub.key_off),
        key_len=pick(info.key_len[single], sub.key_len),
        value_off=pick(pstart[single], sub.smm_end),
        value_len=pick(pend[single] - pstart[single], sub.payload_size),
        prop_start=prop_start,
        prop_count=prop_count,
        kv_key_off=kv_key[0],
        kv_key_len=kv_key[1],
        kv_value_off=kv_value[0],
        kv_value_len=kv_value[1],
    )


def _payloads(buf: np.ndarray, info, live: np.ndarray) -> tuple:
    """``(buffer, payload starts, payload ends)`` of the entries: in place, but for the
    compressed ones (not encrypted), decompressed once per entry and laid after the entries."""
    pstart, pend = info.md_end.copy(), info.end.copy()
    packed = np.flatnonzero(live & (info.compression != 0) & ~info.encrypted)
    if packed.size:
        pbuf, s, e = es.batch_payloads(buf, info, packed)
        base = len(buf)
        buf = np.concatenate([buf, pbuf])
        pstart[packed], pend[packed] = s + base, e + base
    return buf, pstart, pend


def _properties(buf: np.ndarray, meta_start, meta_end, numbers) -> tuple:
    """``(prop_start, prop_count, (key offsets, lengths), (value offsets, lengths))`` of the
    properties (field ``numbers[i]``) of the metadata ``buf[meta_start[i]:meta_end[i]]``."""
    row, kv_off, kv_len = repeated_fields(buf, meta_start, meta_end, numbers)
    kv = es.scan_fields(buf, kv_off, kv_off + kv_len, {KV_KEY: es.BYTES, KV_VALUE: es.BYTES})
    key = (kv[KV_KEY].value.astype(np.int64), np.where(kv[KV_KEY].present, kv[KV_KEY].length, 0))
    value = (kv[KV_VALUE].value.astype(np.int64), np.where(kv[KV_VALUE].present, kv[KV_VALUE].length, 0))
    row, key, value = _distinct_keys(buf, row, key, value)
    count = np.bincount(row, minlength=len(meta_start)).astype(np.int64)
    start = np.zeros(len(meta_start), np.int64)
    np.cumsum(count[:-1], out=start[1:])
    return start, count, key, value


def _distinct_keys(buf: np.ndarray, row: np.ndarray, key: tuple, value: tuple) -> tuple:
    """The properties as a dict holds them (what the row path builds): a key a message repeats
    stays at its first place with its last value. Keys are compared by two 64-bit hashes
    (``entry_scan.hash_keys``), then, for the rare message that repeats one, byte for byte."""
    n = len(row)
    if n < 2 or np.all(np.diff(row) > 0):  # at most one property per message: nothing to merge
        return row, key, value
    h1, h2 = es.hash_keys(buf, key[0], key[1])
    order = np.lexsort((np.arange(n), h2, h1, row))
    r, a, b = row[order], h1[order], h2[order]
    same = (r[1:] == r[:-1]) & (a[1:] == a[:-1]) & (b[1:] == b[:-1])
    if not same.any():
        return row, key, value
    for i in np.flatnonzero(same):  # a hash match: the bytes decide (a collision keeps both)
        x, y = order[i], order[i + 1]
        kx = buf[key[0][x] : key[0][x] + key[1][x]]
        ky = buf[key[0][y] : key[0][y] + key[1][y]]
        same[i] = np.array_equal(kx, ky)
    first = np.concatenate([[True], ~same])  # the first of each run of equal keys
    last = np.concatenate([~same, [True]])
    group = np.cumsum(first) - 1
    keep = order[first]  # the first place of each key ...
    take_value = order[last][group[first]]  # ... with the value of its last occurrence
    by_place = np.argsort(keep, kind="stable")
    keep, take_value = keep[by_place], take_value[by_place]
    return row[keep], (key[0][keep], key[1][keep]), (value[0][take_value], value[1][take_value])


def _batch_messages(
    buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, counts: np.ndarray
) -> es.SubMessages:
    """The sub-messages of the batches, checked as ``batch.decode_records`` checks them: exactly
    ``counts[i]`` records filling batch ``i`` to its last byte."""
    if not len(starts):
        z = _empty_i64()
        return es.SubMessages(z, z, z, z, z, z, z, z, z, np.zeros(0, bool), z, (z, z))
    if (counts < 0).any():
        raise MalformedEntry("negative message count in batch")
    sub = es.scan_batches(buf, starts, ends, counts)
    found = np.bincount(sub.batch, minlength=len(starts))
    if (found != counts).any():
        raise MalformedEntry("a batch holds fewer records than its metadata says")
    last_end = starts.copy()  # an empty batch ends where it starts
    if len(sub.batch):
        last_end[sub.batch] = sub.payload_end  # batch then index order: the last write wins
    if (last_end != ends).any():
        raise MalformedEntry("bytes after the last record of a batch")
    return sub


def repeated_fields(buf: np.ndarray, starts, ends, numbers) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every length-delimited field numbered ``numbers[i]`` of the protobuf messages
    ``buf[starts[i]:ends[i]]``: ``(i, data offset, data length)`` in message then wire order.

    One round per field position (a lockstep walk, as ``entry_scan.scan_fields``), so the
    Python steps follow the number of fields of the longest metadata, not the messages."""
    starts = np.asarray(starts, np.int64)
    ends = np.asarray(ends, np.int64)
    numbers = np.asarray(numbers, np.uint64)
    cur = starts.copy()
    active = np.flatnonzero(cur < ends)
    found: list = []
    while active.size:
        tag, p = es.read_varints(buf, cur[active])
        wt = (tag & np.uint64(7)).astype(np.int64)
        nxt = np.full(len(active), -1, np.int64)
        nxt[wt == 1] = p[wt == 1] + 8
        nxt[wt == 5] = p[wt == 5] + 4
        var = np.flatnonzero((wt == 0) | (wt == 2))
        if var.size:
            val, after = es.read_varints(buf, p[var])
            is_len = wt[var] == 2
            nxt[var] = np.where(is_len, after + val.astype(np.int64), after)
            wanted = is_len & ((tag[var] >> np.uint64(3)) == numbers[active[var]])
            if wanted.any():
                found.append((active[var[wanted]], after[wanted], val[wanted].astype(np.int64)))
        bad = (nxt < 0) | (nxt > ends[active]) | (nxt <= cur[active])
        if bad.any():
            raise UnreadableEntry("metadata field runs past the end of its message")
        cur[active] = nxt
        active = active[nxt < ends[active]]
    if not found:
        return _empty_i64(), _empty_i64(), _empty_i64()
    rows, offs, lens = (np.concatenate(c) for c in zip(*found))
    order = np.argsort(rows, kind="stable")  # rounds are in wire order: stable keeps it per message
    return rows[order], offs[order], lens[order]
