"""The latest value of a key, served by the broker: what a TableView would hold, without one.

What it answers
---------------
A TableView (``client.create_table_view``) reads a topic compacted from the start -- the
compacted view (ids <= horizon), then the live topic after the horizon -- and keeps, per key, the
last message it saw; a tombstone (a keyed message with an empty payload) removes the key.
``LatestValues.lookup_blocking(topic, keys)`` answers, for each key, the message that map would
hold at this instant: the key's last message in the live topic after the horizon if it has one,
else its message in the compacted view (when retention still lets a reader see it); a tombstone
in either place means "absent". Keyless messages and markers are never anyone's value.

How, at scale
-------------
* **The compacted view** answers through its key index (``compaction.key_index``: the view's
  key sidecar sorted by key hash, or the view parsed once when it has no sidecar), kept with the
  view handle: a binary search, then one read of the entry the index names.
* **The tail** (entries after the horizon) has a ``TailIndex`` per topic that has been asked:
  key hash -> where the key's last message after the horizon is. It is brought up to date at
  each lookup, reading only the entries appended since the previous one (so a lookup sees
  everything published before it began), and rebased when a new compaction moves the horizon
  (rows at or below the new horizon are dropped: the new view holds them).
* **The bound**: all tail indexes together hold at most ``latestValueTailIndexMaxSizeMB``
  (each key counted at ``TAIL_ENTRY_BYTES``, measured). Going over evicts the indexes of the
  topics asked least recently; a tail that alone exceeds the bound *overflows*: its index is
  dropped and each lookup of that topic scans its tail instead (``tailScans`` in the stats),
  until a compaction moves the horizon and the tail is indexed afresh.
* A hit is a candidate (indexes hold 128-bit hashes): the message is read, and its key must be
  the one asked, or the answer is "absent" (a collision, odds about n^2 / 2^129).

A batch's messages are found one by one: a key inside a batch answers with that message's
batch index, properties and event time (``decode_message``).

Threads: lookups run in the broker's thread pool. One lock guards the tail indexes and their
budget (catch-up and tail lookups are short: what was appended since the last lookup); building a
view's key index and reading the found messages happen outside it.

Retention: the compaction cursor holds the topic at the horizon, so retention does not remove
tail entries of a compacted topic. Should one go anyway (a topic whose compaction cursor was
deleted), its key answers "absent" -- what a TableView sees in ``retention-bounded`` mode, where
the view's older entries are hidden too; in ``keep-until-tombstone`` mode a TableView would fall
back to the view's value, which this lookup does not.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

import numpy as np

from ..compaction.entry_scan import FLAG_KEYLESS, FLAG_TOMBSTONE, hash_key_py, scan_batches
from ..compaction.key_index import rows_of_entries
from ..errors import CompactMQError
from ..protocol import batch as batch_codec
from ..protocol import compression
from ..protocol import entry_format
from ..protocol import pulsar_pb2 as pb
from ..storage.position import Position
from .compacted_source import views_of

if TYPE_CHECKING:  # pragma: no cover
    from .topics import Topic

log = logging.getLogger(__name__)

#: estimated memory of one key in a tail index (a dict item: a two-int tuple key, a three-item
#: tuple value, their ints, the table slot), measured with tracemalloc over 100 k random keys
TAIL_ENTRY_BYTES = 300
#: entries read per pass when catching up or scanning a tail (and at most these bytes)
READ_ENTRIES = 5000
READ_BYTES = 16 * 1024 * 1024
_START = Position(-1, 0)  # before every entry: the tail of a topic without a compacted view


@dataclass
class LatestMessage:
    """One key's latest message."""

    key: bytes
    value: bytes
    properties: dict
    ledger_id: int
    entry_id: int
    batch_index: int  # -1: the entry is not a batch
    publish_time: int
    event_time: int  # 0: none
    encrypted: bool = False


def decode_message(entry: bytes, batch_index: int) -> tuple[Optional[bytes], LatestMessage]:
    """The message at ``batch_index`` of ``entry`` (``(key, message)``; the key is None when the
    message has none). An encrypted entry is one message, its payload left as stored."""
    md, payload = entry_format.parse_entry(entry, verify_checksum=False)
    outer_key = md.partition_key.encode() if md.HasField("partition_key") else None
    if md.encryption_keys:
        msg = LatestMessage(
            b"", payload, _props(md.properties), 0, 0, -1, md.publish_time, md.event_time, True
        )
        return outer_key, msg
    data = compression.decompress(md.compression, payload, md.uncompressed_size)
    if not batch_codec.is_batch(md):
        msg = LatestMessage(b"", data, _props(md.properties), 0, 0, -1, md.publish_time, md.event_time)
        return outer_key, msg
    found = _batch_record(data, md.num_messages_in_batch, batch_index)
    if found is None:
        return None, LatestMessage(b"", b"", {}, 0, 0, batch_index, md.publish_time, 0)
    meta, data = found
    key = meta.partition_key.encode() if meta.HasField("partition_key") else None
    event_time = meta.event_time if meta.HasField("event_time") else md.event_time
    return key, LatestMessage(
        b"", data, _props(meta.properties), 0, 0, batch_index, md.publish_time, event_time
    )


def _batch_record(data: bytes, count: int, batch_index: int):
    """``(SingleMessageMetadata, payload)`` of record ``batch_index`` of an uncompressed batch, or
    None. The compaction scanner walks the records' sizes (in C when the extension is built) and
    only the wanted record's metadata is parsed: a batch holds up to thousands of messages, and
    decoding them all would cost a lookup milliseconds."""
    if not 0 <= batch_index < count:
        return None
    buf = np.frombuffer(data, np.uint8)
    one = np.zeros(1, np.int64)
    sub = scan_batches(buf, one, np.array([len(data)], np.int64), np.array([count], np.int64))
    rows = np.flatnonzero(sub.index == batch_index)
    if not len(rows):
        return None
    r = int(rows[0])
    meta = pb.SingleMessageMetadata.FromString(data[int(sub.smm_start[r]) : int(sub.smm_end[r])])
    return meta, data[int(sub.smm_end[r]) : int(sub.payload_end[r])]


def _props(kvs) -> dict:
    return {kv.key: kv.value for kv in kvs}


@dataclass
class TailIndex:
    """Key hash -> ``(ledger_id, id, tombstone)`` of the key's last message after the horizon of
    view ``view_id``, for the entries before ``next``."""

    topic: str
    view_id: Optional[int] = None
    horizon: Optional[Position] = None
    next: Optional[Position] = None  # None: not built yet
    keys: dict = field(default_factory=dict)
    overflowed: bool = False
    lookups: int = 0
    scans: int = 0
    last_scan_ms: float = 0.0
    compacted: Optional[dict] = None  # the key index of the view last used (stats)
    view: Any = None  # the CommittedView answering with this tail (see ``LatestValues._serving``)

    def start(self) -> Position:
        """The first position of the tail."""
        h = self.horizon
        return _START if h is None else Position(h[0], h[1] + 1)

    def rebase(self, view) -> None:
        """Follow the view in force: keep the rows after its horizon when it only moved forward,
        else start over from its horizon."""
        view_id = None if view is None else view.view_id
        if self.next is not None and view_id == self.view_id:
            return
        old_start = self.start() if self.next is not None else None
        self.view_id, self.horizon = view_id, (None if view is None else Position(*view.horizon))
        start = self.start()
        nxt = self.next
        forward = old_start is not None and nxt is not None and old_start <= start <= nxt
        if forward and not self.overflowed:
            h = tuple(start)
            self.keys = {k: v for k, v in self.keys.items() if (v[0], v[1] >> 16) >= h}
        else:
            self.keys, self.next, self.overflowed = {}, start, False
        if self.next is None or self.next < start:
            self.next = start

    def add(self, rows: tuple) -> None:
        h1, h2, lids, ids, flags = rows
        keyed = (flags & FLAG_KEYLESS) == 0
        tomb = (flags & FLAG_TOMBSTONE) != 0
        keys = self.keys
        for a, b, lid, pid, t in zip(
            h1[keyed].tolist(),
            h2[keyed].tolist(),
            lids[keyed].tolist(),
            ids[keyed].tolist(),
            tomb[keyed].tolist(),
        ):
            keys[(a, b)] = (lid, pid, t)

    def stats(self) -> dict[str, Any]:
        return {
            "keys": len(self.keys),
            "sizeBytes": len(self.keys) * TAIL_ENTRY_BYTES,
            "overflowed": self.overflowed,
            "indexedUpTo": None if self.next is None else f"{self.next[0]}:{self.next[1] - 1}",
            "horizon": None if self.horizon is None else f"{self.horizon[0]}:{self.horizon[1]}",
            "lookups": self.lookups,
            "tailScans": self.scans,
            "lastTailScanMs": round(self.last_scan_ms, 3),
            "compactedKeyIndex": self.compacted,
            "viewId": None if self.view is None else self.view.view_id,
        }


class LatestValues:
    """The tail indexes of the topics asked, under one memory bound (see the module notes)."""

    def __init__(self, max_bytes: int, max_view_bytes: int = 256 << 20) -> None:
        self.max_bytes = max(0, int(max_bytes))
        self.max_view_bytes = max(0, int(max_view_bytes))
        self.view_index_evictions = 0
        self._lock = threading.Lock()
        self._tails: "OrderedDict[str, TailIndex]" = OrderedDict()
        self._building: set = set()  # ids of views whose key index a background thread builds
        self.evictions = 0

    @classmethod
    def from_config(cls, config) -> "LatestValues":
        from ..config import int_setting

        def mb(key: str) -> int:
            return int_setting(config, key) * 1024 * 1024

        return cls(mb("latestValueTailIndexMaxSizeMB"), mb("latestValueKeyIndexMaxSizeMB"))

    # --- lookups (blocking: the thread pool) -------------------------------------------------

    def lookup_blocking(self, topic: "Topic", keys: list[bytes]) -> list[Optional[LatestMessage]]:
        """Each key's latest message on ``topic`` (None: absent or deleted)."""
        views = views_of(topic)
        view = self._serving(topic.name, views.current_blocking())
        index = view.key_index() if view is not None else None
        retention = views.retention_blocking() if view is not None else None
        hashes = [hash_key_py(k) for k in keys]
        with self._lock:
            tail = self._tail_of(topic.name)
            tail.rebase(view)
            tail.view = view
            self._bound_view_indexes(tail)
            tail.lookups += len(keys)
            if index is not None:
                tail.compacted = {"keys": len(index), "sizeBytes": index.nbytes, "source": index.source}
            if not tail.overflowed:
                self._catch_up(topic, tail)
            if tail.overflowed:
                found = self._scan(topic, tail, set(hashes))
            else:
                found = {h: tail.keys[h] for h in hashes if h in tail.keys}
        out: list[Optional[LatestMessage]] = []
        for key, h in zip(keys, hashes):
            hit = found.get(h)
            if hit is not None:
                lid, pid, tomb = hit
                out.append(None if tomb else _read(topic.ledger.read_entry, key, lid, pid))
                continue
            vhit = index.find(*h) if index is not None else None
            if vhit is None or vhit.tombstone or not retention.visible(vhit.position):
                out.append(None)
                continue
            pid = (vhit.entry_id << 16) | vhit.batch_index
            out.append(_read(view.get, key, vhit.ledger_id, pid))
        return out

    def _serving(self, name: str, current):
        """The view to answer with: the view in force once its key index is built. A newer view
        whose index is not built yet is indexed in the background while the view the topic's
        tail index follows keeps answering -- that view plus the tail after its horizon hold the
        same latest values, so no lookup waits for an index build but a topic's first."""
        with self._lock:
            tail = self._tails.get(name)
            previous = tail.view if tail is not None else None
        if current is None or current.key_index_built or previous is None:
            return current  # (the first lookup of a topic builds its index here)
        if previous.view_id == current.view_id:
            return previous  # the same view (a service may hand out a new handle per call)
        with self._lock:
            if current.view_id not in self._building:
                self._building.add(current.view_id)
                threading.Thread(
                    target=self._build, args=(current,), name="latest-value-index", daemon=True
                ).start()
        return previous

    def _build(self, view) -> None:
        try:
            view.key_index()
        except Exception:  # the next lookup builds it in its own thread (and reports the error)
            log.exception("building the key index of compacted view %s failed", view.view_id)
        finally:
            with self._lock:
                self._building.discard(view.view_id)

    def _tail_of(self, name: str) -> TailIndex:
        tail = self._tails.get(name)
        if tail is None:
            tail = self._tails[name] = TailIndex(name)
        self._tails.move_to_end(name)
        return tail

    def _catch_up(self, topic: "Topic", tail: TailIndex) -> None:
        """Index the entries appended since the last lookup (up to the last one now durable)."""
        ml = topic.ledger
        last = ml.last_position()
        while last is not None and tail.next <= last:
            got = ml.read_entries(tail.next, READ_ENTRIES, READ_BYTES)
            got = [(p, d) for p, d in got if p <= last]
            if not got:
                break
            tail.add(rows_of_entries(got))
            end = got[-1][0]
            tail.next = Position(end[0], end[1] + 1)
            if not self._within_budget(tail):
                tail.keys, tail.overflowed = {}, True
                return

    def _within_budget(self, tail: TailIndex) -> bool:
        """Evict the least recently asked other indexes until the total fits; False when
        ``tail`` alone does not."""
        total = sum(len(t.keys) for t in self._tails.values()) * TAIL_ENTRY_BYTES
        for name in list(self._tails):
            if total <= self.max_bytes:
                break
            other = self._tails[name]
            if other is tail:
                continue
            total -= len(other.keys) * TAIL_ENTRY_BYTES
            del self._tails[name]
            self.evictions += 1
            if other.view is not None:  # no longer accounted for: let its view's index go too
                other.view.drop_key_index()
        return total <= self.max_bytes

    def _view_index_bytes(self) -> int:
        views = [t.view for t in self._tails.values() if t.view is not None and t.view.key_index_built]
        return sum(v.key_index().nbytes for v in views)

    def _bound_view_indexes(self, tail: TailIndex) -> None:
        """Drop the key indexes of the views of the least recently asked topics until those of
        all topics fit ``max_view_bytes`` (the asked topic's stays: it answers now)."""
        total = self._view_index_bytes()
        for other in list(self._tails.values()):
            if total <= self.max_view_bytes:
                return
            view = other.view
            if other is tail or view is None or not view.key_index_built:
                continue
            total -= view.key_index().nbytes
            view.drop_key_index()
            self.view_index_evictions += 1

    def _scan(self, topic: "Topic", tail: TailIndex, wanted: set) -> dict:
        """The last tail row of each wanted key hash, by reading the whole tail (an overflowed
        index)."""
        t0 = time.perf_counter()
        tail.scans += 1
        ml = topic.ledger
        last = ml.last_position()
        found: dict = {}
        want_h1 = np.array(sorted({h[0] for h in wanted}), np.int64)
        pos = tail.start()
        while last is not None and pos <= last:
            got = [(p, d) for p, d in ml.read_entries(pos, READ_ENTRIES, READ_BYTES) if p <= last]
            if not got:
                break
            h1, h2, lids, ids, flags = rows_of_entries(got)
            sel = np.flatnonzero(np.isin(h1, want_h1) & ((flags & FLAG_KEYLESS) == 0))
            for i in sel.tolist():
                h = (int(h1[i]), int(h2[i]))
                if h in wanted:
                    found[h] = (int(lids[i]), int(ids[i]), bool(flags[i] & FLAG_TOMBSTONE))
            end = got[-1][0]
            pos = Position(end[0], end[1] + 1)
        tail.last_scan_ms = (time.perf_counter() - t0) * 1000
        return found

    # --- stats --------------------------------------------------------------------------------

    def topic_stats(self, topic: str) -> Optional[dict[str, Any]]:
        """What topic stats report (``latestValue``) of a topic that has been asked; None else."""
        with self._lock:
            tail = self._tails.get(topic)
            if tail is None:
                return None
            out = tail.stats()
            out["maxSizeBytes"] = self.max_bytes
            out["totalSizeBytes"] = sum(len(t.keys) for t in self._tails.values()) * TAIL_ENTRY_BYTES
            out["evictions"] = self.evictions
            out["indexesBuilding"] = len(self._building)
            out["keyIndexesMaxSizeBytes"] = self.max_view_bytes
            out["keyIndexesSizeBytes"] = self._view_index_bytes()
            out["keyIndexEvictions"] = self.view_index_evictions
        return out


def _read(read_entry, key: bytes, ledger_id: int, pid: int) -> Optional[LatestMessage]:
    """The message at ``(ledger_id, pid)`` if it is ``key``'s (None: gone, or a hash collision)."""
    try:
        entry = read_entry(Position(ledger_id, pid >> 16))
    except CompactMQError:
        return None
    if entry is None:
        return None
    try:
        got_key, msg = decode_message(entry, pid & 0xFFFF)
    except CompactMQError:  # (an entry the broker accepted decodes; a damaged one is no value)
        return None
    if got_key != key:
        return None
    msg.key, msg.ledger_id, msg.entry_id = key, ledger_id, pid >> 16
    return msg
