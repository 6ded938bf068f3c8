"""``spark.readStream.format("compactmq")``: a topic's raw log as an unbounded table.

An offset is, per topic partition, the id of the next entry to read, written ``"ledger:entry"``
(``"-1:-1"`` is the beginning); Spark checkpoints these dicts, so a query restarted from its
checkpoint plans its next micro-batch from exactly where the last committed one ended: no message is
lost and none is delivered twice (with an idempotent sink such as Spark's file sink). A micro-batch
``[start, end)`` is planned and read like a batch read with those bounds (``source.plan_read``), so it
splits by ledger and reads files directly where it can.

``maxOffsetsPerTrigger`` (Kafka's name; ``maxRecordsPerTrigger`` is an alias) caps the *entries* of
a micro-batch (a batched entry is one offset, as one Kafka record batch is not), shared evenly over
the partitions that have data. Partitions created while the query runs start at their beginning.
Retention may remove entries before a micro-batch reads them: they are skipped (the gap a compaction
or retention leaves is not reported as data loss).

``view=latest`` streams the latest state first, then the changes: the first micro-batch is the
``latest`` view up to the end offsets it plans (one row per live key, whatever the trigger limit),
every later one is the raw log after them (a tombstone arrives as a row with an empty value). The
offset dict carries a ``__latestStateDelivered`` flag so a restart knows which phase it is in.
"""

from __future__ import annotations

from dataclasses import replace

from pyspark.sql.datasource import DataSourceStreamReader
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from ..errors import InvalidConfiguration
from .options import ReadOptions
from .source import (
    SplitPartition,
    backend_args,
    open_backend,
    plan_read,
    read_split_batches,
)
from .values import TopicSchema

BEGINNING = "-1:-1"
SNAPSHOT = "__latestStateDelivered"  # view=latest: 0 until the first micro-batch (the state) is planned


def _parse(text: str) -> tuple:
    a, b = text.split(":")
    return (int(a), int(b), -1)


def _text(pos: tuple) -> str:
    return f"{pos[0]}:{pos[1]}"


def advance(ledgers: tuple, start: tuple, end: tuple, budget: int) -> tuple:
    """The position ``budget`` entries after ``start`` (not beyond ``end``) over ``ledgers``."""
    pos = start
    for lid, count in ledgers:
        if lid < pos[0]:
            continue
        if lid > end[0]:
            break
        first = pos[1] if lid == pos[0] else 0
        last = min(count, end[1]) if lid == end[0] else count
        n = max(0, last - first)
        if budget < n:
            return (lid, first + budget, -1)
        budget -= n
    return end


class CompactMQStreamReader(DataSourceStreamReader):
    def __init__(self, opts: ReadOptions, schema, topic_schema_: TopicSchema):
        if opts.view == "compacted":
            raise InvalidConfiguration(
                "readStream supports view=raw and view=latest (latest state, then changes)"
            )
        self.opts = opts
        self.schema = schema
        self.topic_schema = topic_schema_

    def _layouts(self, backend) -> dict:
        return {
            topic: backend.layout(topic, index, with_view=False)
            for topic, index in backend.partitions(self.opts.topics, self.opts.topics_pattern)
        }

    def initialOffset(self) -> dict:
        backend = open_backend(self.opts)
        try:
            out = {}
            for topic, layout in self._layouts(backend).items():
                spec = self.opts.topic_offset("start", topic)
                if spec == "earliest":
                    out[topic] = BEGINNING
                elif spec == "latest":
                    out[topic] = _text((layout.last[0], layout.last[1] + 1)) if layout.last else BEGINNING
                else:
                    out[topic] = _text(spec)
            if self.opts.view == "latest":
                out = {t: BEGINNING for t in out}
                out[SNAPSHOT] = 0
            return out
        finally:
            backend.close()

    def getDefaultReadLimit(self):
        if self.opts.max_offsets_per_trigger:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        return ReadAllAvailable()

    def latestOffset(self, start: dict, limit) -> dict:
        backend = open_backend(self.opts)
        try:
            layouts = self._layouts(backend)
        finally:
            backend.close()
        ends = {}
        snapshot = SNAPSHOT in start and not start[SNAPSHOT]
        for topic, layout in layouts.items():
            begin = _parse(start.get(topic, BEGINNING))
            last = (layout.last[0], layout.last[1] + 1, -1) if layout.last else begin
            ends[topic] = max(begin, last)
        if snapshot:  # the first micro-batch of view=latest is the whole latest state
            return {**{t: _text(pos) for t, pos in ends.items()}, SNAPSHOT: 1}
        if isinstance(limit, ReadMaxRows) and limit.max_rows > 0:
            busy = [t for t in ends if ends[t] > _parse(start.get(t, BEGINNING)) and layouts[t].ledgers]
            share = -(-limit.max_rows // max(1, len(busy)))
            for t in busy:
                ends[t] = advance(layouts[t].ledgers, _parse(start.get(t, BEGINNING)), ends[t], share)
        out = {t: _text(pos) for t, pos in ends.items()}
        if SNAPSHOT in start:
            out[SNAPSHOT] = 1
        return out

    def partitions(self, start: dict, end: dict):
        ranges = {t: (_parse(start.get(t, BEGINNING)), _parse(e)) for t, e in end.items() if t != SNAPSHOT}
        snapshot = SNAPSHOT in start and not start[SNAPSHOT]
        opts = self.opts if snapshot else replace(self.opts, view="raw")
        backend = open_backend(opts)
        try:
            splits = plan_read(opts, backend, ranges)
            args = backend_args(backend, opts)
        finally:
            backend.close()
        return [SplitPartition(s, args) for s in splits]

    def read(self, partition):
        split, args = partition.value
        if split is None:
            return iter(())
        return read_split_batches(split, args, self.schema, self.topic_schema)

    def commit(self, end: dict) -> None:
        pass
