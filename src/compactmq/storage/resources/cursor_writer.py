"""Cursor positions written at a bounded rate (Pulsar's ``managedLedgerDefaultMarkDeleteRateLimit``).

An acknowledgement moves a cursor's mark-delete position; writing the store on every ack would
cost ZooKeeper a write (about 2 ms, see bench/results/metadata_store.json) per message. Pulsar
persists at most ``rate`` positions per second per cursor, keeps the newest in memory meanwhile,
and writes it on close (and periodically, so an idle cursor does not stay behind): after a crash
a cursor may step back by up to 1/rate seconds of acks -- redelivery, Pulsar's at-least-once --
never forward.

``CursorWriter`` is that rule and nothing else: ``update(info)`` records the newest info and
writes it if the rate allows; ``flush_if_due()`` (for a periodic task) writes a pending info once
the rate allows; ``flush()`` writes it now (close). Every write is a compare-and-set on the
version of the writer's last write, so a broker that lost the topic gets ``BadVersion`` instead of
overwriting the new owner's position; in a cluster it also carries the topic's ownership fence
(``fence``), so a broker whose ownership ended gets ``Fenced`` even before anyone else wrote. The clock is passed in, so tests need not sleep.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from ...naming import TopicName
from .base import Json
from .fence import NO_FENCE, Fence
from .managed_ledgers import ManagedLedgerResources

#: Pulsar's default managedLedgerDefaultMarkDeleteRateLimit: one position per second per cursor
DEFAULT_RATE_PER_S = 1.0


class CursorWriter:
    def __init__(
        self,
        resources: ManagedLedgerResources,
        topic: TopicName,
        cursor: str,
        version: int,
        rate_per_s: float = DEFAULT_RATE_PER_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        """``version``: the cursor's version as this owner read or created it."""
        self._resources = resources
        self._topic = topic
        self._cursor = cursor
        self.version = version
        self._interval = 0.0 if rate_per_s <= 0 else 1.0 / rate_per_s  # <= 0: no limit
        self._clock = clock
        self._lock = threading.Lock()
        self._pending: Json | None = None
        self._next_write = float("-inf")
        self.writes = 0
        self.created_ms = 0  # the cursor's creation time, for the owner's values
        self.fence: Callable[[], Fence] = lambda: NO_FENCE

    def update(self, info: Json) -> bool:
        """Record ``info`` as the cursor's newest state; returns True when it was written now."""
        with self._lock:
            self._pending = info
            return self._write_if_due_locked()

    def flush_if_due(self) -> bool:
        with self._lock:
            return self._write_if_due_locked()

    def flush(self) -> bool:
        """Write the pending info now, whatever the rate (on close); True when there was one."""
        with self._lock:
            if self._pending is None:
                return False
            self._write_locked()
            return True

    def pending_write(self) -> tuple[Json, int] | None:
        """The pending info and the version it must replace, for a batched write
        (``close_batch``); ``written`` is told when the batch committed it."""
        with self._lock:
            return None if self._pending is None else (self._pending, self.version)

    def written(self, info: Json, version: int) -> None:
        """A batch committed ``info`` at ``version`` (a newer pending info stays pending)."""
        with self._lock:
            if self._pending is info:
                self._pending = None
            self.version = version
            self.writes += 1
            self._next_write = self._clock() + self._interval

    @property
    def pending(self) -> bool:
        return self._pending is not None

    @property
    def pending_info(self) -> Json | None:
        """The newest info not written yet (None: everything recorded is written)."""
        return self._pending

    def discard(self) -> None:
        """Forget the pending info (the cursor was deleted, or another writer is ahead)."""
        with self._lock:
            self._pending = None

    @property
    def topic(self) -> TopicName:
        return self._topic

    @property
    def cursor(self) -> str:
        return self._cursor

    def _write_if_due_locked(self) -> bool:
        if self._pending is None or self._clock() < self._next_write:
            return False
        self._write_locked()
        return True

    def _write_locked(self) -> None:
        info, self._pending = self._pending, None
        try:
            self.version = self._resources.put_cursor(
                self._topic, self._cursor, info, self.version, self.fence()
            )
        except BaseException:
            self._pending = info  # not written: a later flush may try again (unless fenced)
            raise
        self.writes += 1
        self._next_write = self._clock() + self._interval
