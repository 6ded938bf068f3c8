"""The plan of one compaction run: what to read, how positions are packed, how work is split.

Plain, picklable Python built on the driver and shipped to every task; nothing here touches
Spark. A *segment* is one ledger id read from one source: either the previous compacted ledger
(only the ids it holds for that ledger) or the live ledger file (only entries after the previous
horizon, up to the new horizon). Segments are numbered by *ordinal* in id order, so a packed
position ``(ordinal, entry_id, batch_index)`` orders exactly like the message id. The horizon's
ledger may appear twice: its compacted part (ids <= old horizon) gets the smaller ordinal.

A *group* is a run of consecutive segments of one kind, about ``target`` entries big: one task
parses a group in phase one, and one task copies its survivors in phase two, into one part file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Optional, TypedDict

COMPACTED, LIVE = "compacted", "live"


@dataclass(frozen=True)
class Segment:
    ordinal: int
    ledger_id: int
    kind: str  # COMPACTED or LIVE
    path: str  # the ledger file, or the previous compacted ledger
    index_path: Optional[str]  # a live ledger's .idx file (may not exist)
    entry_lo: int  # first entry id to read (inclusive)
    entry_hi: int  # last entry id to read (inclusive)
    est_entries: int


class ChainTarget(TypedDict):
    """How the tasks write a local chain view (``view_store.LocalChainStore.prepare``)."""

    dir: str  # the topic's compaction directory, where segments go
    run: int  # the new view's id: segments are named by it
    incremental: bool  # the run extends the previous chain instead of writing a fresh one
    masks: bool  # old batches that lost some message are masked, not rewritten
    direct_io: bool  # segments are written with direct I/O where the file system allows it
    lookup: bool  # only the new messages go through the engine, looked up in the key sidecar


@dataclass
class RunPlan:
    topic: str
    segments: list[Segment]
    groups: list[list[int]]  # ordinals per group, ascending, contiguous
    run_dir: str  # where phase-two tasks write their part files
    strategy: str  # native strategy name, or "user"
    strategy_class: Optional[str] = None  # dotted name for a user strategy
    retain_null_key: bool = False
    combine: bool = False  # keep-latest: map-side combiner in the parsing task (see tasks.group_rows)
    new_horizon: Optional[tuple] = None
    estimated_entries: int = 0
    # called by the tasks with the name of each point they reach (``copy_tasks.copy_group``:
    # "phase-two-task"); None calls nothing. Picklable: it travels with the plan to the tasks
    task_probe: Optional[Callable[[str], None]] = None
    # keep-latest, as packed positions (see ``packed_cut``): a key whose last message is below
    # ``drop_before`` leaves the view (key TTL; so does a retained keyless message below it); a
    # tombstone at or above ``tombstones_from`` stays
    drop_before: int = 0
    tombstones_from: Optional[int] = None
    # the previous view's key sidecar, for tasks that look keys up in it (``view_keys.plan_entry``)
    view_keys: Optional[dict] = None
    # where the view goes: a local chain (``chain``) or the object store (``store``, ``prefix``)
    chain: Optional[ChainTarget] = None
    store: Optional[str] = None  # the object store's location (tiered storage)
    prefix: Optional[str] = None  # the key prefix the tasks upload their parts under

    @property
    def is_lookup_run(self) -> bool:
        """An incremental run whose engine reads only the new messages (a lookup run, ``lookup_run``)."""
        return bool(self.chain and self.chain.get("lookup"))

    def group_of_ordinal(self) -> list[int]:
        table = [0] * len(self.segments)
        for g, ords in enumerate(self.groups):
            for o in ords:
                table[o] = g
        return table

    def part_path(self, group: int) -> str:
        return os.path.join(self.run_dir, f"part-{group:06d}")


def build_segments(compacted: Optional[dict], live: list[dict]) -> list[Segment]:
    """Number segments in id order. ``compacted`` = {"path", "ledgers": {ledger_id: (count, first
    entry id to read)}};
    ``live`` = [{"ledger_id", "path", "index_path", "lo", "hi", "count"}]."""
    keyed = []
    if compacted:
        for lid, (count, lo) in compacted["ledgers"].items():
            keyed.append(
                (
                    (lid, 0),
                    dict(
                        ledger_id=lid,
                        kind=COMPACTED,
                        path=compacted["path"],
                        index_path=None,
                        entry_lo=lo,
                        entry_hi=(1 << 62),
                        est_entries=count,
                    ),
                )
            )
    for led in live:
        keyed.append(
            (
                (led["ledger_id"], 1),
                dict(
                    ledger_id=led["ledger_id"],
                    kind=LIVE,
                    path=led["path"],
                    index_path=led.get("index_path"),
                    entry_lo=led["lo"],
                    entry_hi=led["hi"],
                    est_entries=led["count"],
                ),
            )
        )
    keyed.sort(key=lambda kv: kv[0])
    return [Segment(ordinal=i, **kw) for i, (_, kw) in enumerate(keyed)]


def packed_cut(segments: list[Segment], cut) -> int:
    """The smallest packed position of a message with id >= ``cut`` (a ``(ledger, entry)``), so
    that ``packed >= packed_cut(...)`` is ``id >= cut`` for every message of the run."""
    from .entry_scan import BATCH_BITS, ENTRY_BITS

    lid, eid = int(cut[0]), max(0, int(cut[1]))
    for i, s in enumerate(segments):
        if s.ledger_id > lid:
            return s.ordinal << (ENTRY_BITS + BATCH_BITS)
        hi = s.entry_hi
        nxt = segments[i + 1] if i + 1 < len(segments) else None
        if nxt is not None and nxt.ledger_id == s.ledger_id:  # the horizon's ledger: compacted part
            hi = nxt.entry_lo - 1  # ends before its live part
        if s.ledger_id == lid and hi >= eid:
            return (s.ordinal << (ENTRY_BITS + BATCH_BITS)) | (min(eid, (1 << ENTRY_BITS) - 1) << BATCH_BITS)
    return len(segments) << (ENTRY_BITS + BATCH_BITS)


# A parsing task holds one row per distinct key of its group (the keep-latest combiner's table),
# and a phase-two task the survivors of its group: this caps both, and the work a failed task redoes
MAX_GROUP_ENTRIES = 8_000_000


def build_groups(
    segments: list[Segment], parallelism: int, min_group: int = 20_000, max_group: int = MAX_GROUP_ENTRIES
) -> list[list[int]]:
    """Consecutive segments of one kind, in about equally big groups, as few as the cores and
    ``max_group`` allow: their number is a multiple of ``parallelism`` (when there is enough work
    for every core), so the last wave of tasks keeps every core busy, and few large groups give
    the keep-latest combiner the most to remove (each task sees more repeats of its keys: at
    10 M messages over 1 M keys, 2 groups hand the shuffle 2.0 M rows, 3 groups 2.8 M)."""
    total = sum(s.est_entries for s in segments)
    cores = max(1, parallelism)
    count = max(1, -(-total // max_group))  # groups needed to stay within max_group
    count = -(-count // cores) * cores  # ... rounded up to a multiple of the cores
    target = max(min_group, -(-total // count))
    groups: list[list[int]] = []
    size = 0
    for s in segments:
        if groups and size + s.est_entries <= target and segments[groups[-1][-1]].kind == s.kind:
            groups[-1].append(s.ordinal)
            size += s.est_entries
        else:
            groups.append([s.ordinal])
            size = s.est_entries
    return groups
