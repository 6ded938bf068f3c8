"""What a run needs to know of the view in force, without opening it when it need not.

Why
---
Planning a run asks the previous view two things: how many entries it holds, and how many of
them each ledger holds (``runner`` turns those into the compacted segments of the plan). A
``CompactedLedgerReader`` answers both, but opening a chain whose runs dropped or masked entries
merges every segment's index (``chain.merge_chunked``): work that grows with the view, paid by
every incremental run before it has done anything (about 0.15 s at a million entries, a sixth
of a run after 1 % new messages).

So a chain manifest records the answers when it is written (``ledger_counts``): the live entries
of each ledger, in id order, and their total. The next run's plan reads only the manifest
(``PreviousView``) and opens the view itself on the first question the manifest cannot answer:
an entry's position or bytes (topic retention cut the view, or a group of old entries had no
task and the driver lists them to drop). A manifest written before the counts existed, a
one-file view and a view in the object store are opened as before.

How the counts are kept right
-----------------------------
A fresh chain's counts are its segments' (each segment is a complete compacted ledger: one
binary search per ledger in its sampled index). An incremental run's are the previous view's,
minus the entries it drops, plus the entries of its new groups' segments (a segment an old
group writes holds rewrites of entries already counted, ``compactionChainMasks`` false). The
total must equal the entry count the run computes on its own; when it does not, or the previous
counts are unknown, the manifest records none and the next run opens the view.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from . import chain
from .compacted_ledger import CompactedLedgerReader, is_remote


def _manifest(path: str) -> Optional[chain.Manifest]:
    """The chain manifest at local ``path`` (None: not a chain, e.g. a one-file view); the
    file is read whole only when it starts like a manifest."""
    with open(path, "rb") as f:
        if not chain.is_chain(f.read(len(chain.MAGIC))):
            return None
        f.seek(0)
        data = f.read()
    return chain.decode(data, path)


class PreviousView:
    """The view in force, as a run plans against it: ``manifest``, ``len`` and ``ledger_runs``
    from the chain manifest when it records them; anything else opens the view (``reader``)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._reader: Optional[CompactedLedgerReader] = None
        self.manifest = None if is_remote(path) else _manifest(path)
        if self.manifest is None or self.manifest.ledgers is None:
            self._reader = CompactedLedgerReader(path)
            self.manifest = self._reader.manifest

    @property
    def reader(self) -> CompactedLedgerReader:
        if self._reader is None:
            self._reader = CompactedLedgerReader(self.path)
        return self._reader

    @property
    def is_chain(self) -> bool:
        return self.manifest is not None

    @property
    def opened(self) -> bool:
        """Whether the view itself was opened (its index read), not only its manifest."""
        return self._reader is not None

    def __len__(self) -> int:
        if self._reader is None and self.manifest is not None and self.manifest.entries is not None:
            return int(self.manifest.entries)
        return len(self.reader)

    def ledger_runs(self, start: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """``CompactedLedgerReader.ledger_runs``: from the manifest when ``start`` is 0."""
        counts = self.manifest.ledgers if self.manifest is not None else None
        if start == 0 and counts is not None and self._reader is None:
            return counts[:, 0].copy(), counts[:, 1].copy()
        return self.reader.ledger_runs(start)

    def find(self, position) -> int:
        """``CompactedLedgerReader.find``: from the manifest when ``position`` starts a ledger or
        lies in one the view has no entry of (the start topic retention keeps: a whole ledger)."""
        counts = self.manifest.ledgers if self.manifest is not None else None
        if counts is not None and self._reader is None:
            lid, eid = int(position[0]), int(position[1])
            i = int(np.searchsorted(counts[:, 0], lid))
            if eid <= 0 or i == len(counts) or int(counts[i, 0]) != lid:
                return int(counts[:i, 1].sum())
        return self.reader.find(position)

    def ledger_range(self, ledger_id: int) -> tuple[int, int]:
        return self.reader.ledger_range(ledger_id)

    def columns(self, i: int, j: int) -> tuple:
        return self.reader.columns(i, j)


def part_counts(parts: list[dict]) -> Optional[dict[int, int]]:
    """Entries per ledger that phase-two tasks report having written (each part's ``ledgers``:
    raw ``>i8`` pairs ledger id, count), summed; None when a part did not report them, and the
    segments must be read instead (``segment_counts``: their whole index, which a run just wrote
    with direct I/O and the page cache does not hold)."""
    out: dict[int, int] = {}
    for part in parts:
        raw = part.get("ledgers")
        if raw is None:
            return None
        pairs = np.frombuffer(bytes(raw), ">i8").reshape(-1, 2)
        for lid, c in pairs.tolist():
            out[lid] = out.get(lid, 0) + c
    return out


def segment_counts(paths: list[str]) -> dict[int, int]:
    """Entries per ledger in the segment files at ``paths``, summed."""
    out: dict[int, int] = {}
    for path in paths:
        lids, counts = CompactedLedgerReader(path).ledger_runs()
        for lid, c in zip(lids.tolist(), counts.tolist()):
            out[lid] = out.get(lid, 0) + c
    return out


def ledger_counts(
    previous: Optional[np.ndarray], dropped_ledgers: np.ndarray, added: dict[int, int], entries: int
) -> Optional[np.ndarray]:
    """The new view's ``(ledger id, live entries)`` rows in id order: ``previous`` (None for a
    fresh chain; a chain extended from a view without counts passes what its reader answered)
    minus one per dropped entry (``dropped_ledgers``: the ledger of each) plus ``added``. None
    when they do not add up to ``entries``, the run's own count (the next run opens the view)."""
    counts: dict[int, int] = {}
    if previous is not None:
        counts.update(zip(previous[:, 0].tolist(), previous[:, 1].tolist()))
    lids, per = np.unique(np.asarray(dropped_ledgers, np.int64), return_counts=True)
    for lid, c in zip(lids.tolist(), per.tolist()):
        counts[lid] = counts.get(lid, 0) - c
    for lid, c in added.items():
        counts[lid] = counts.get(lid, 0) + c
    if any(c < 0 for c in counts.values()):
        return None
    rows = np.array(sorted((lid, c) for lid, c in counts.items() if c > 0), np.int64).reshape(-1, 2)
    return rows if int(rows[:, 1].sum()) == int(entries) else None
