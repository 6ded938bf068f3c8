"""Retention: which whole ledgers a managed ledger may delete, and holds that keep them.

``RetentionTrimmer.trim`` applies Pulsar's rules (``ManagedLedgerImpl.internalTrimLedgers``):

* with no durable cursor every ledger but the one being written counts as consumed: a
  reader's non-durable cursor alone holds nothing, as in Pulsar (no durable cursors, the
  slowest reader is the current ledger; the minimum rollover time is what keeps a young burst
  in that ledger);
* otherwise a ledger holding any entry that some cursor -- durable, or a reader's non-durable
  one, all in Pulsar's cursor container -- has not acknowledged up to its mark-delete position
  stays;
* of the fully acknowledged ledgers, oldest first, a ledger goes when it is past the time limit
  (closed longer ago than the retention time) OR the topic is over the size limit without it;
  the first ledger that is within both limits stops the trim;
* -1 means no limit for that dimension (-1/-1 keeps everything forever), 0 none;
* the ledger being written is never deleted.

Limits come from the topic's policy, else its namespace's, else the broker's config
(``retention_policy``). Ledgers leave the metadata store first, then their bytes go; a crash
between leaves bytes that recovery removes as orphans.

Retention holds: an owner (an opaque name, e.g. a compaction run) can keep every ledger from a
position on until it releases or moves its hold (``hold`` / ``release``). A hold is a durable
cursor named after its owner, so it survives restarts and another process can place or move it
in the metadata store (a read-only ``compact-topic`` job writes it there only). Owners whose
holds other processes may change are *watched*: the trimmer re-reads them from the metadata
store before it decides (``watch`` / ``refresh``).
"""

from __future__ import annotations

from typing import Callable

from ..errors import NotAllowed
from .cursors import CursorRegistry
from .ledger_metadata import LedgerMetadata
from .ledger_state import MiB, LedgerList, LedgerState, os_errors_as_storage_errors
from .ledger_storage import LedgerStorage
from .offload.state import OffloadState
from .policy_keys import RETENTION_SIZE_MB, RETENTION_TIME_MINUTES
from .position import Position
from .reader import Reader


class RetentionTrimmer:
    """Retention and holds of one managed ledger (see the module docstring)."""

    def __init__(
        self,
        ledgers: LedgerList,
        storage: LedgerStorage,
        metadata: LedgerMetadata,
        cursors: CursorRegistry,
        next_position: Callable[[Position], Position],
        offload: OffloadState,
        defaults: tuple[int, int],
        clock: Callable[[], int],
    ):
        self.topic = ledgers.topic
        self._ledgers = ledgers
        self._lock = ledgers.lock
        self._storage = storage
        self._store = metadata
        self._cursors = cursors
        self._next_position = next_position
        self._offload = offload
        self._default_minutes, self._default_mb = defaults
        self._clock = clock
        self._watched: set[str] = set()

    def retention_policy(self) -> tuple[int, int]:
        """(minutes, MB) in force: topic policy, else namespace policy, else broker config."""
        minutes = self._store.effective_policy(self.topic, RETENTION_TIME_MINUTES, self._default_minutes)
        mb = self._store.effective_policy(self.topic, RETENTION_SIZE_MB, self._default_mb)
        return int(minutes), int(mb)

    @os_errors_as_storage_errors
    def trim(
        self,
        now_ms: int | None = None,
        retention_time_minutes: int | None = None,
        retention_size_mb: int | None = None,
    ) -> list[int]:
        """Delete whole ledgers that retention no longer keeps; returns their ids."""
        if self._ledgers.read_only:
            raise NotAllowed(f"{self.topic} is open read-only in this process")
        now = self._clock() if now_ms is None else now_ms
        minutes, mb = self.retention_policy()
        if retention_time_minutes is not None:
            minutes = retention_time_minutes
        if retention_size_mb is not None:
            mb = retention_size_mb
        if minutes < 0 and mb < 0:
            return []
        self.refresh()
        with self._lock:
            victims = self._victims(now, minutes, mb)
            if not victims:
                return []
            ids = [led.ledger_id for led in victims]
            self._store.delete_ledgers(self.topic, ids)
            for led in victims:
                self._ledgers.remove(led)
        for ledger_id in ids:
            self._storage.delete(ledger_id)
        self._offload.ledgers_deleted()
        return ids

    def _victims(self, now: int, minutes: int, mb: int) -> list[LedgerState]:
        """The oldest ledgers that every cursor is past and a limit lets go (under the lock)."""
        ledgers = self._ledgers
        if self._cursors.has_durable():
            boundary = self._next_position(self._cursors.slowest_mark_delete()).ledger_id
        else:
            boundary = (
                ledgers.current.ledger_id
                if ledgers.current is not None
                else (ledgers.ledgers[-1].ledger_id if ledgers.ledgers else 0)
            )
        total = sum(led.size for led in ledgers.ledgers)
        victims: list[LedgerState] = []
        freed = 0
        for led in ledgers.ledgers:
            if led.ledger_id >= boundary or led is ledgers.current:
                break
            stamp = led.closed_ms if led.closed_ms is not None else (led.last_pt or led.created_ms)
            expired = minutes >= 0 and now - stamp >= minutes * 60_000
            over_quota = mb >= 0 and total - freed > mb * MiB
            if not (expired or over_quota):
                break
            victims.append(led)
            freed += led.size
        return victims

    # --- holds -----------------------------------------------------------------------------

    def hold(self, owner: str, position: Position | None = None) -> bool:
        """Keep every ledger from ``position`` (default: the first entry) on, for ``owner``,
        until it releases or moves its hold. True when this call placed the hold; False when
        ``owner`` already holds (here or, for a watched owner, in the metadata store)."""
        with self._lock:
            if self._cursors.get(owner) is not None:
                return False
            if self._cursors.record(owner) is not None:
                return False
            if not self._ledgers.read_only:
                self._cursors.open(owner, True, "earliest" if position is None else position)
                return True
            if position is None:
                mark_delete = self._cursors.earliest_mark_delete()
            else:
                mark_delete = Reader.previous_position(Position(*position))
            # a read-only process writes the hold to the metadata store only; the writer's
            # retention reads it from there (the owner must be watched)
            self._store.save_cursor(self.topic, owner, mark_delete, b"", {})
            return True

    def release(self, owner: str) -> None:
        """Remove ``owner``'s hold (the ledgers go back to plain retention)."""
        self._cursors.delete(owner)

    def watch(self, owner: str) -> None:
        """Re-read ``owner``'s hold from the metadata store before each trim."""
        self._watched.add(owner)

    def refresh(self, owner: str | None = None) -> None:
        """Take one watched hold (or all) as the metadata store has it now."""
        for name in sorted(self._watched) if owner is None else [owner]:
            self._cursors.refresh(name)
