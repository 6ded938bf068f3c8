"""Planning a read: which slices of which topic partitions each Spark task reads.

A read is planned on the driver from a ``Layout`` of each topic partition (its ledgers, first and
last positions, compacted view) that a backend (``direct`` files or the ``broker``) describes. Then:

* ``raw``: one split per ledger holding entries in the range, cut further so that there are at
  least ``minPartitions`` splits and no split holds more than ``maxRecordsPerPartition`` entries.
  Parallelism therefore follows the data, not the number of partitions.
* ``compacted``: the compacted ledger's entries grouped by the ledger they came from (one split per
  group, cut the same way), then the live entries after the horizon as in ``raw``. The direct
  path cuts a group by index in the compacted ledger, so its pieces hold equal numbers of
  entries. The broker shows no such index: a piece is a range of *source* entry ids, and a
  compacted view is far from uniform over them (a key written over and over survives only in
  the last stretch of the log). So a broker split carries ``spans``, where the view's entries
  were found to sit (``broker.probe_view``), and is cut at equal shares of those.
* ``latest``: the splits of ``compacted`` up to the horizon, each carrying the folded
  not-yet-compacted tail (read on the driver: it is what the next compaction would read, bounded by
  the compaction threshold), plus one ``tail`` split that emits the keys only the tail knows. A
  compacted message whose key the tail touches is replaced by the fold of (message, tail messages)
  with the topic's strategy, which is exactly what the next compaction would keep, so the result is
  right before compaction ever ran (everything is then tail) and between runs.

Every split also carries the id bounds (start inclusive, end exclusive) and the publish-time bounds,
applied per message by ``bounded``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace

MAX_ID = (1 << 62, 1 << 62, 1 << 30)
MIN_ID = (-1, -1, -1)


@dataclass(frozen=True)
class Layout:
    """One topic partition as a backend sees it at planning time."""

    topic: str  # the partition's full name (or the topic's when not partitioned)
    partition: int  # -1 when the topic is not partitioned
    ledgers: tuple  # ((ledger_id, entry_count), ...) in order, entries 0..count-1
    first: tuple | None  # first retained (ledger, entry), None when empty
    last: tuple | None  # last (ledger, entry), None when empty
    view: object = None  # compacted_view.CompactedView, None when unknown (broker without admin)


@dataclass(frozen=True)
class LatestTail:
    """The tail of a ``latest`` read after the horizon: per key, the messages that matter."""

    by_key: dict  # key -> [Message, ...] in id order (only the last one for keep-latest)
    keyless: tuple  # keyless tail messages (kept only when the topic retains them)
    strategy: str
    include_tombstones: bool
    retain_null_key: bool


@dataclass(frozen=True)
class Split:
    topic: str
    partition: int
    kind: str  # "live" | "compacted" | "tail" | "view"
    ledger_id: int = -1
    lo: int = 0  # live: first entry id; compacted: first index in the compacted ledger (direct) or
    # first source entry id (broker)
    hi: int = -1  # live: last entry id (inclusive); compacted: stop index / source entry (exclusive)
    start_id: tuple = MIN_ID
    end_id: tuple = MAX_ID
    start_time: int | None = None
    end_time: int | None = None
    view: str = "raw"
    path: str | None = None  # compacted ledger file (direct)
    next_ledger: int | None = None  # broker: the boundary where this split stops
    latest: LatestTail | None = None
    parts: tuple = field(default=(), compare=False)  # tail: the compacted splits to check keys against
    # broker compacted: ((first entry, stop entry), ...) of this ledger where the view's entries
    # are estimated to be (None: not probed, assume them spread evenly over lo..hi)
    spans: tuple | None = field(default=None, compare=False)
    # direct compacted: only these indexes of lo..hi-1 (the entries a key index named), None: all
    entries: tuple | None = None


def _by_source_entries(split: Split) -> bool:
    """A compacted split read through the broker over entries ``lo`` until ``hi`` (exclusive) of
    the source ledger ``ledger_id`` (the compacted view keeps the original ids)."""
    return split.kind == "compacted" and split.path is None and split.ledger_id >= 0 and split.hi > split.lo


def _cut(split: Split, pieces: int) -> list[Split]:
    """Cut a live or compacted split into ``pieces`` contiguous parts of about equal size."""
    if split.entries is not None:
        return [split]
    if split.kind == "live":
        lo, hi = split.lo, split.hi + 1
    elif split.kind == "compacted" and (split.path is not None or _by_source_entries(split)):
        lo, hi = split.lo, split.hi
    else:
        return [split]
    n = hi - lo
    pieces = max(1, min(pieces, n))
    if split.spans is not None and _size(split) > 0:
        bounds = _span_bounds(lo, hi, split.spans, pieces)
    else:
        bounds = [lo + (n * i) // pieces for i in range(pieces + 1)]
    out = []
    for a, b in itertools.pairwise(bounds):
        if split.kind == "live":
            out.append(replace(split, lo=a, hi=b - 1))
        elif split.path is not None:
            out.append(replace(split, lo=a, hi=b))
        elif b < hi:  # through the broker: a piece before the last stops at its source entry
            out.append(
                replace(
                    split,
                    lo=a,
                    hi=b,
                    next_ledger=None,
                    end_id=min(split.end_id, (split.ledger_id, b, -1)),
                    spans=_clip(split.spans, a, b),
                )
            )
        else:  # the last piece keeps the split's own stop (the next ledger, or the view's end)
            out.append(replace(split, lo=a, hi=b, spans=_clip(split.spans, a, b)))
    return out


def _clip(spans: tuple | None, lo: int, hi: int) -> tuple | None:
    if spans is None:
        return None
    return tuple((max(a, lo), min(b, hi)) for a, b in spans if min(b, hi) > max(a, lo))


def _span_bounds(lo: int, hi: int, spans: tuple, pieces: int) -> list[int]:
    """Entry ids cutting ``lo..hi`` into ``pieces`` with equal shares of the entries in ``spans``."""
    spans = _clip(spans, lo, hi) or ()
    total = sum(b - a for a, b in spans)
    targets = [total * i / pieces for i in range(1, pieces)]
    bounds = [lo]
    done = 0
    for a, b in spans:
        while targets and done + (b - a) >= targets[0]:
            cut = a + round(targets.pop(0) - done)
            if bounds[-1] < cut < hi:
                bounds.append(cut)
        done += b - a
    return [*bounds, hi]


def _size(split: Split) -> int:
    if split.entries is not None:
        return len(split.entries)
    if split.kind == "live":
        return split.hi - split.lo + 1
    if split.kind == "compacted" and split.path is not None:
        return split.hi - split.lo
    if _by_source_entries(split):
        if split.spans is None:
            return split.hi - split.lo
        return sum(b - a for a, b in _clip(split.spans, split.lo, split.hi) or ())
    return 0


def balance(splits: list[Split], min_partitions: int, max_records: int) -> list[Split]:
    """Cut splits so that none exceeds ``max_records`` entries and there are at least
    ``min_partitions`` of them (the largest are cut first)."""
    out: list[Split] = []
    for s in splits:
        size = _size(s)
        if max_records and size > max_records:
            out.extend(_cut(s, -(-size // max_records)))
        else:
            out.append(s)
    # splits of size 0 (an empty range, or one that cannot be cut) add no parallelism
    if min_partitions and sum(1 for s in out if _size(s) > 0) < min_partitions:
        total = sum(_size(s) for s in out) or 1
        result = []
        for s in out:
            share = max(1, round(min_partitions * _size(s) / total))
            result.extend(_cut(s, share) if share > 1 else [s])
        out = result
    return out


def live_splits(layout: Layout, after: tuple | None, start: tuple, end: tuple, base: Split) -> list[Split]:
    """One split per ledger for the live entries after ``after`` (exclusive) within [start, end)."""
    out = []
    for lid, count in layout.ledgers:
        lo, hi = 0, count - 1
        if after is not None:
            if lid < after[0]:
                continue
            if lid == after[0]:
                lo = after[1] + 1
        if start[0] > lid or (start[0] == lid and start[1] > hi):
            continue
        if start[0] == lid:
            lo = max(lo, start[1])
        if end[0] < lid:
            continue
        if end[0] == lid:
            hi = min(hi, end[1] if end[2] >= 0 else end[1] - 1)
        if layout.last is not None and lid == layout.last[0]:
            hi = min(hi, layout.last[1])
        if lo > hi:
            continue
        out.append(replace(base, kind="live", ledger_id=lid, lo=lo, hi=hi))
    return out


def compacted_splits(layout: Layout, start: tuple, end: tuple, base: Split) -> list[Split]:
    """Splits over the compacted part of the view (ids <= horizon), one per source ledger."""
    view = layout.view
    if view is None or view.horizon is None:
        return []
    if view.path is not None:  # direct: slices of the compacted-ledger file
        return [
            replace(base, kind="compacted", ledger_id=lid, lo=a, hi=b, path=view.path)
            for lid, a, b in view.ledger_ids
            if lid >= start[0] and lid <= end[0]
        ]
    # through the broker: ranges between ledger boundaries, read with a read-compacted reader;
    # a ledger's range spans its source entries (lo..hi), so ``balance`` can cut it by entry ids
    # (-1: what the view keeps from before the first retained ledger, never cut)
    counts = dict(layout.ledgers)
    bounds = sorted(lid for lid in counts if lid <= view.horizon[0])
    edges = [-1] + bounds
    out = []
    for i, lid in enumerate(edges):
        nxt = edges[i + 1] if i + 1 < len(edges) else None
        hi = (
            0 if lid < 0 else min(counts[lid], view.horizon[1] + 1 if lid == view.horizon[0] else counts[lid])
        )
        # probed: where this ledger's entries in the view are (none: an empty tuple)
        spans = tuple((a, b) for ledger, a, b in view.spans if ledger == lid) if view.spans else None
        out.append(replace(base, kind="compacted", ledger_id=lid, next_ledger=nxt, lo=0, hi=hi, spans=spans))
    return out


def bounded(messages: Iterable, split: Split) -> Iterator:
    """The messages of ``split`` within its id and publish-time bounds."""
    for m in messages:
        mid = m.message_id
        if mid < split.start_id or mid >= split.end_id:
            continue
        if split.start_time is not None and m.publish_time < split.start_time:
            continue
        if split.end_time is not None and m.publish_time >= split.end_time:
            continue
        yield m


# --- latest ----------------------------------------------------------------------------------


def build_tail(
    messages: Iterable, strategy_name: str, include_tombstones: bool, retain_null_key: bool
) -> LatestTail:
    from . import compacted_view

    strat = compacted_view.strategy(strategy_name)
    shrink = compacted_view.reducible(strat)
    by_key: dict = {}
    keyless = []
    for m in messages:
        if m.key is None:
            if retain_null_key:
                keyless.append(m)
            continue
        if shrink:
            by_key[m.key] = [m]
        else:
            by_key.setdefault(m.key, []).append(m)
    return LatestTail(by_key, tuple(keyless), strategy_name, include_tombstones, retain_null_key)


def resolve_latest(compacted: Iterable, tail: LatestTail):
    """Rows of a ``latest`` compacted split: each compacted message, folded with the tail of its key.
    Yields ``(message, deleted)``; ``deleted`` rows are emitted only with includeTombstones."""
    from . import compacted_view

    strat = compacted_view.strategy(tail.strategy)
    shrink = compacted_view.reducible(strat)
    for m in compacted:
        if m.key is None:
            if tail.retain_null_key:
                yield m, False
            continue
        later = tail.by_key.get(m.key)
        if later is None:
            if not m.is_tombstone:
                yield m, False
            continue
        if shrink:  # keep-latest: the tail alone decides, and the tail split emits it
            continue
        survivor = compacted_view.fold([m, *later], strat)
        if survivor is not None:
            yield survivor, False
        elif tail.include_tombstones:
            yield later[-1], True


def resolve_tail(tail: LatestTail, known_keys: set):
    """Rows of the ``tail`` split: keys the compacted part does not hold, folded alone."""
    from . import compacted_view

    strat = compacted_view.strategy(tail.strategy)
    for key, msgs in tail.by_key.items():
        if key in known_keys:
            continue
        survivor = compacted_view.fold(msgs, strat)
        if survivor is not None:
            yield survivor, False
        elif tail.include_tombstones:
            yield msgs[-1], True
    for m in tail.keyless:
        yield m, False


def fold_all(messages: Iterable, strategy_name: str, include_tombstones: bool, retain_null_key: bool):
    """``latest`` over a whole view read by one task (the broker path without admin.url)."""
    tail = build_tail(messages, strategy_name, include_tombstones, retain_null_key)
    yield from resolve_tail(tail, set())
