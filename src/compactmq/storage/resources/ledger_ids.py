"""Ledger ids: one counter for the whole store, so ids are unique and increasing everywhere::

    /ledgers/next-id        {"next": n}: the id the next allocation returns

Message ids order by ledger id within a topic, and a topic may move between brokers, so an id
must be larger than every id handed out before, by any broker -- not just unique. Each
allocation is therefore one compare-and-set on the counter (no per-process blocks, which would
hand a later ledger a smaller id on another broker). Ledgers roll over every few minutes per
topic, so this is a rare write; contention only costs a re-read.

Compacted ledgers draw from the same counter (they share the id space with topic ledgers today).
"""

from __future__ import annotations

from ..metadata_store import NEW, BadVersion
from .base import BaseResources, dumps

LEDGER_ID_PATH = "/ledgers/next-id"
#: attempts before giving up on a counter that other brokers keep moving
ALLOCATE_ATTEMPTS = 64


class LedgerIdResources(BaseResources):
    def allocate(self) -> int:
        """A new ledger id, larger than every id allocated before (by anyone)."""
        for _ in range(ALLOCATE_ATTEMPTS):
            current = self._read(LEDGER_ID_PATH)
            next_id, version = (1, NEW) if current is None else (int(current[0]["next"]), current[1])
            try:
                self.store.put(LEDGER_ID_PATH, dumps({"next": next_id + 1}), version)
                return next_id
            except BadVersion:
                continue
        raise BadVersion(f"ledger id counter still contended after {ALLOCATE_ATTEMPTS} attempts")

    def ensure_above(self, floor: int) -> None:
        """Make every future id larger than ``floor`` (a data directory migrated from the old
        metadata schema carries its own counter)."""
        while True:
            current = self._read(LEDGER_ID_PATH)
            if current is not None and int(current[0]["next"]) > floor:
                return
            try:
                self.store.put(
                    LEDGER_ID_PATH, dumps({"next": floor + 1}), NEW if current is None else current[1]
                )
                return
            except BadVersion:
                continue
