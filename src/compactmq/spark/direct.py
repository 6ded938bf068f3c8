"""The fast path: read a data directory's files directly (read-only, beside a running broker).

The driver opens the data directory with ``Storage(read_only=True)`` to plan (ledgers, compacted
view, schema, partitions); executors need only the files: a ledger file (``.log``, with its
``.idx`` when the ledger is closed) or the compacted ledger, read through ``storage.ledger_file``
and ``compacted_view``. Nothing here writes, repairs or locks anything; a ledger still being written
is read up to its last complete record.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING

from ..errors import TopicNotFound
from .compacted_view import describe as describe_view
from .compacted_view import read_slices
from .plan import Layout, Split
from .values import TopicSchema

if TYPE_CHECKING:  # the row path's messages (protobuf) are imported only where rows are read
    from .messages import Message


class DirectBackend:
    """Planning over a data directory (driver side). Close it when planning is done."""

    def __init__(self, data_dir: str):
        from ..config import load_config
        from ..storage import Storage

        if not os.path.isdir(os.path.join(data_dir, "ledgers")) or not os.path.exists(
            os.path.join(data_dir, "metadata.db")
        ):
            raise TopicNotFound(f"{data_dir} is not a compactmq data directory (no metadata.db)")
        self.data_dir = data_dir
        self.config = load_config()
        self.storage = Storage(data_dir, self.config, read_only=True)

    def close(self) -> None:
        self.storage.close()

    def partitions(self, topics: tuple, pattern: str | None) -> list[tuple[str, int]]:
        """``(partition topic, index)`` of every topic read; a partitioned topic gives all its
        partitions (index -1 when the topic is not partitioned)."""
        from ..naming import TopicName

        meta = self.storage.topic_metadata
        partitioned = self.storage.partitioned_topics()
        if pattern is not None:
            regex = re.compile(pattern)
            names = sorted(
                set(partitioned) | {t for t in meta.topics() if TopicName.parse(t).partition_index < 0}
            )
            topics = tuple(t for t in names if regex.fullmatch(t) or regex.fullmatch(t.split("://", 1)[-1]))
        out = []
        for t in topics:
            n = partitioned.get(t)
            if n:
                out.extend((str(TopicName.parse(t).partition(i)), i) for i in range(n))
            elif meta.topic_exists(t):
                out.append((t, TopicName.parse(t).partition_index))
            else:
                raise TopicNotFound(f"topic {t} does not exist in {self.data_dir}")
        return out

    def layout(self, topic: str, partition: int, with_view: bool) -> Layout:
        ml = self.storage.open_managed_ledger(topic, create=False)
        ml.refresh()
        ledgers = tuple((li.ledger_id, li.entry_count) for li in ml.ledgers() if li.entry_count > 0)
        first, last = ml.first_position(), ml.last_position()
        view = describe_view(self.storage, topic, self.config) if with_view else None
        return Layout(
            topic, partition, ledgers, tuple(first) if first else None, tuple(last) if last else None, view
        )

    def schema(self, topic: str) -> TopicSchema:
        """The schema in force from the metadata store (keyed by Pulsar's schema id,
        shared by the partitions); a data directory the broker has not upgraded yet still has
        its schemas in the topic properties."""
        from ..broker.schema_registry import schema_id
        from ..naming import TopicName
        from ..storage.schemas import SchemaStorage, active

        records = active(SchemaStorage(self.storage.resources.schemas).versions(schema_id(topic)))
        if records:
            rec = records[-1]
            return TopicSchema(rec.type, rec.data.decode("utf-8", "replace"))
        for name in (topic, str(TopicName.parse(topic).partitioned_base)):
            try:
                legacy = self.storage.topic_metadata.topic_properties(name).get("__schemas") or []
            except TopicNotFound:
                continue
            if legacy:
                return TopicSchema.from_record(legacy[-1])
        return TopicSchema()

    def ledger_path(self, topic: str, ledger_id: int) -> str:
        return self.storage.open_managed_ledger(topic, create=False).ledger_path(ledger_id)

    def position_by_time(self, topic: str, ts_ms: int) -> tuple:
        ml = self.storage.open_managed_ledger(topic, create=False)
        return tuple(ml.find_position_by_publish_time(ts_ms))


def read_split(split: Split) -> Iterator[Message]:
    """Messages of a ``live`` or ``compacted`` split, from the files alone (executor side)."""
    from .messages import entry_messages

    if split.kind == "compacted":
        for lid, eid, data in read_slices(split.path, index_runs(split)):
            yield from entry_messages(lid, eid, data, split.partition)
        return
    yield from _read_ledger(split)


def _open_ledger(split: Split):
    """(file bytes, record scan) of a live split's ledger file."""
    import mmap

    from ..storage import ledger_file as lf

    path = split.path
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        # mapped, not read: a split cut from a big ledger touches only its own pages
        buf = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) if size else b""
    index = None
    try:
        with open(lf.index_path_for(path), "rb") as f:
            index = f.read()
    except FileNotFoundError:
        pass
    return buf, lf.scan_records(buf, index=index, verify_crc=False)


def _read_ledger(split: Split) -> Iterator[Message]:
    from ..storage import ledger_file as lf
    from .messages import entry_messages

    buf, scan = _open_ledger(split)
    mv = memoryview(buf)
    n = len(scan.entry_ids)
    hi = min(split.hi, n - 1)
    for e in range(split.lo, hi + 1):
        start = int(scan.offsets[e]) + lf.RECORD_HEADER_SIZE
        data = bytes(mv[start : start + int(scan.lengths[e])])
        yield from entry_messages(split.ledger_id, e, data, split.partition)


# --- the columnar path -------------------------------------------------------------------------

CHUNK_ENTRIES = 2048  # entries parsed together (the record batches are cut smaller after)
CHUNK_BYTES = 4 << 20  # bounds a chunk's buffer (and its decompressed payloads' count)


def read_split_columns(split: Split, properties: bool = True) -> Iterator:
    """``entry_columns.MessageColumns`` of a ``live`` or ``compacted`` split, chunk by chunk,
    within the split's id and publish-time bounds (what ``read_split`` then ``plan.bounded``
    give, as columns); without the properties when ``properties`` is False."""
    chunks = (
        _compacted_chunks(split, properties)
        if split.kind == "compacted"
        else _ledger_chunks(split, properties)
    )
    for cols in chunks:
        keep = cols.within(split.start_id, split.end_id, split.start_time, split.end_time)
        yield cols if keep.all() else cols.take(keep)


def _ledger_chunks(split: Split, properties: bool = True) -> Iterator:
    import numpy as np

    from ..storage import ledger_file as lf
    from .entry_columns import parse_entries

    buf, scan = _open_ledger(split)
    whole = np.frombuffer(buf, np.uint8) if len(buf) else np.zeros(0, np.uint8)
    sel = _in_window(split, scan)
    offs = np.asarray(scan.offsets, np.int64)[sel] + lf.RECORD_HEADER_SIZE
    lens = np.asarray(scan.lengths, np.int64)[sel]
    a = 0
    while a < len(sel):
        b = min(len(sel), a + CHUNK_ENTRIES)
        b = max(a + 1, min(b, int(np.searchsorted(offs, offs[a] + CHUNK_BYTES))))
        lo_byte, hi_byte = int(offs[a]), int(offs[b - 1] + lens[b - 1])
        region = whole[lo_byte:hi_byte]  # a view of the mapped file: copied only if decompressed
        yield parse_entries(
            region,
            offs[a:b] - lo_byte,
            lens[a:b],
            split.ledger_id,
            sel[a:b],
            split.start_time,
            split.end_time,
            properties,
        )
        a = b


def _in_window(split: Split, scan):
    """Entry ids of a live split, without those the ledger index shows were published outside
    the split's time window. The index keeps the publish time the broker stored with the entry:
    the metadata's, or the time of the write when the metadata had 0 -- so only a window that
    starts after 0 (which no such entry is in) is read from the index; the metadata decides."""
    import numpy as np

    hi = min(split.hi, len(scan.entry_ids) - 1)
    ids = np.arange(split.lo, hi + 1, dtype=np.int64)
    if split.start_time is None or split.start_time <= 0 or not len(ids):
        return ids
    pts = np.asarray(scan.publish_times, np.int64)[ids]
    keep = pts >= split.start_time
    if split.end_time is not None:
        keep &= pts < split.end_time
    return ids[keep]


def index_runs(split: Split) -> list[tuple[int, int]]:
    """``(first, stop)`` runs of compacted-ledger indexes a compacted split reads: ``lo..hi``, or
    its ``entries`` (a key index's pick) grouped into runs of consecutive indexes."""
    if split.entries is None:
        return [(split.lo, split.hi)]
    runs: list[list[int]] = []
    for i in split.entries:
        if runs and runs[-1][1] == i:
            runs[-1][1] = i + 1
        else:
            runs.append([i, i + 1])
    return [(a, b) for a, b in runs]


def _compacted_chunks(split: Split, properties: bool = True) -> Iterator:
    from ..compaction.compacted_ledger import CompactedLedgerReader

    reader = CompactedLedgerReader(split.path)
    for lo, hi in index_runs(split):
        yield from _compacted_run(reader, lo, hi, split, properties)


def _compacted_run(reader, lo: int, hi: int, split: Split, properties: bool = True) -> Iterator:
    import numpy as np

    from .entry_columns import parse_entries

    stop = min(hi, len(reader))
    i = lo
    while i < stop:
        j = min(stop, i + CHUNK_ENTRIES)
        lids, eids, _, _, stored = reader.columns(i, j)
        # at most CHUNK_BYTES of entries (at least one): a compacted batch can be large
        j = i + max(1, int(np.searchsorted(np.cumsum(stored), CHUNK_BYTES, side="right")))
        lids, eids = lids[: j - i], eids[: j - i]
        entries = reader.entries(i, j)  # one read per segment, one bytes object per entry
        lens = np.fromiter((len(d) for d in entries), np.int64, len(entries))
        offs = np.zeros(len(entries), np.int64)
        np.cumsum(lens[:-1], out=offs[1:])
        buf = np.frombuffer(b"".join(entries), np.uint8)
        yield parse_entries(buf, offs, lens, lids, eids, split.start_time, split.end_time, properties)
        i = j
