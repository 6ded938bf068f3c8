"""Positions and ledger descriptions: small value objects shared by every storage module."""

from __future__ import annotations

from typing import NamedTuple


class Position(NamedTuple):
    """Where an entry lives: (ledger_id, entry_id). Tuples compare in order, so positions do too.

    ``entry_id == -1`` means "just before the first entry of the ledger" (a mark-delete position
    of a cursor that has acknowledged nothing in that ledger).
    """

    ledger_id: int
    entry_id: int

    def __str__(self) -> str:
        return f"{self.ledger_id}:{self.entry_id}"

    @classmethod
    def parse(cls, text: str) -> "Position":
        """Inverse of ``str(position)``: ``"12:7"`` -> ``Position(12, 7)``."""
        ledger, _, entry = text.partition(":")
        return cls(int(ledger), int(entry))


# Sentinel before every real position (ledger ids start at 1).
EARLIEST = Position(-1, -1)

LEDGER_OPEN = "OPEN"
LEDGER_CLOSED = "CLOSED"


class LedgerInfo(NamedTuple):
    """One ledger of a managed ledger, as recorded in the metadata store.

    ``size`` counts entry bytes (what producers sent), not the per-entry framing. For the
    ledger that is still OPEN the numbers are live in the broker that writes it; another
    process reading the metadata store sees the values of the last rollover and should scan the
    file (``ledger_file.scan_entries``) to find the entries appended since.
    """

    ledger_id: int
    entry_count: int
    size: int
    first_publish_ms: int | None
    last_publish_ms: int | None
    state: str
    created_ms: int = 0
    closed_ms: int | None = None


def pack(position: Position) -> int:
    """One int64 per position (ledger in the high 32 bits), so ranges of acks are int pairs.

    Consecutive entries of one ledger map to consecutive integers; the next ledger never does,
    because entry ids stay below 2**32. ``(L, -1)`` maps to the integer just before ``(L, 0)``.
    """
    return (position[0] << 32) + position[1]


def unpack(key: int) -> Position:
    return Position(key >> 32, key & 0xFFFFFFFF)
