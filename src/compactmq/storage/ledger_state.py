"""The in-memory state the parts of a managed ledger share: its ledgers and their lock.

A managed ledger is an ordered list of ledgers (``LedgerState``, one per ledger id, oldest
first); the last may be *current* (OPEN, being appended to). The parts of a managed ledger
(``recovery``, ``appender``, ``reader``, ``cursors``, ``retention``, ``offload.state``) each
own one job and share one ``LedgerList``: the list, the lock that guards it, and the two
counters that decide what a reader may see.

Visibility: the appender numbers records it writes (``written_seq``) and advances
``durable_seq`` once a sync covers them; a reader sees an entry of the current ledger only
once it is durable (BookKeeper's "last add confirmed"), so no reader sees an entry a crash
could take back. A sealed ledger is fully visible. ``visible(led)`` says how many entries.

Locks, always taken in this order (never the reverse)::

    Cursor._lock  ->  LedgerList.lock  ->  metadata store lock

The appender's ``sync_cond`` (group-commit bookkeeping) is never held while waiting for
``lock``; a storage writer's own lock is a leaf (nothing is taken while it is held).
"""

from __future__ import annotations

import functools
import threading
from typing import Any

from ..errors import StorageError
from . import ledger_file as lf
from .position import LedgerInfo, Position

MiB = 1024 * 1024

_new_tuple = tuple.__new__


def position(ledger_id: int, entry_id: int) -> Position:
    """``Position(ledger_id, entry_id)`` without the Python-level ``__new__``: the same tuple,
    3x cheaper, and reads build one per entry."""
    return _new_tuple(Position, (ledger_id, entry_id))


def os_errors_as_storage_errors(method):
    """An I/O failure reaches callers as ``StorageError`` (the broker maps that to
    PersistenceError on the wire), never as a bare ``OSError``. The decorated method's object
    has a ``topic``."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except OSError as e:
            raise StorageError(f"{self.topic}: {method.__name__} failed: {e}") from e

    return wrapper


class LedgerState:
    """In-memory state of one ledger. ``offsets``/``publish_times`` (record offsets and publish
    times, per entry) are loaded lazily for sealed ledgers (from their index) and grow in
    place for the current one; ``writer`` is set while the ledger is current."""

    __slots__ = (
        "ledger_id",
        "state",
        "created_ms",
        "closed_ms",
        "count",
        "size",
        "first_pt",
        "last_pt",
        "offsets",
        "publish_times",
        "data_end",
        "writer",
        "sync_users",
        "writer_to_close",
        "seq_base",
        "offload",
        "local_gone",
    )

    def __init__(
        self,
        ledger_id: int,
        state: str,
        created_ms: int,
        closed_ms: int | None = None,
        count: int = 0,
        size: int = 0,
        first_pt: int | None = None,
        last_pt: int | None = None,
    ):
        self.ledger_id = ledger_id
        self.state = state
        self.created_ms = created_ms
        self.closed_ms = closed_ms
        self.count = count
        self.size = size
        self.first_pt = first_pt
        self.last_pt = last_pt
        self.offsets: Any = None
        self.publish_times: Any = None
        self.data_end = lf.FILE_HEADER_SIZE
        self.writer: Any = None  # ledger_storage.LedgerWriter while current
        self.sync_users = 0  # syncs running on the writer (it is closed after the last)
        self.writer_to_close: Any = None
        self.seq_base = 0  # written_seq when this ledger became current
        self.offload: Any = None  # OffloadRecord once offloaded (storage.offload)
        self.local_gone = False  # the local copy was deleted: reads go to the object store

    @classmethod
    def from_info(cls, info: LedgerInfo) -> "LedgerState":
        """A ledger as the metadata store records it."""
        return cls(
            info.ledger_id,
            info.state,
            info.created_ms,
            info.closed_ms,
            info.entry_count,
            info.size,
            info.first_publish_ms,
            info.last_publish_ms,
        )

    def end_of(self, k: int) -> int:
        """Byte offset just past entry ``k``'s record."""
        return int(self.offsets[k + 1]) if k + 1 < self.count else self.data_end

    def bytes_between(self, lo: int, hi: int) -> int:
        """Entry bytes (framing excluded) of entries ``[lo, hi)``."""
        if hi <= lo:
            return 0
        return self.end_of(hi - 1) - int(self.offsets[lo]) - lf.RECORD_HEADER_SIZE * (hi - lo)


class LedgerList:
    """The ledgers of one managed ledger, the lock over them, and what readers may see."""

    def __init__(self, topic: str, read_only: bool):
        self.topic = topic
        self.read_only = read_only
        self.lock = threading.RLock()  # ledger list, current ledger, writes, reads
        self.ledgers: list[LedgerState] = []
        self.by_id: dict[int, LedgerState] = {}
        self.current: LedgerState | None = None
        self.written_seq = 0  # records written since open
        self.durable_seq = 0  # records known durable
        self.fenced: BaseException | None = None
        self.closed = False

    def add(self, led: LedgerState) -> None:
        self.ledgers.append(led)
        self.by_id[led.ledger_id] = led

    def remove(self, led: LedgerState) -> None:
        self.ledgers.remove(led)
        del self.by_id[led.ledger_id]

    def replace_all(self, ledgers: list[LedgerState]) -> None:
        self.ledgers, self.by_id = [], {}
        for led in ledgers:
            self.add(led)

    def visible(self, led: LedgerState) -> int:
        """Entries of ``led`` a reader may see: all of a sealed ledger, the durable ones of
        the current ledger."""
        if led is not self.current:
            return led.count
        return max(0, min(led.count, self.durable_seq - led.seq_base))

    def info(self, led: LedgerState, visible: int) -> LedgerInfo:
        """``led`` as a ``LedgerInfo`` counting only its first ``visible`` entries."""
        size = (
            led.size
            if visible == led.count
            else (led.bytes_between(0, visible) if led.offsets is not None else 0)
        )
        return LedgerInfo(
            led.ledger_id,
            visible,
            size,
            led.first_pt if visible else None,
            (int(led.publish_times[visible - 1]) if visible != led.count else led.last_pt)
            if visible
            else None,
            led.state,
            led.created_ms,
            led.closed_ms,
        )
