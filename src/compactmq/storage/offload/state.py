"""What a managed ledger knows about its offloaded ledgers (tiered storage).

The ``LedgerOffloader`` (``offloader.py``) copies sealed ledgers to an object store and
records each copy in its catalog (an ``OffloadRecord``: where the object lives). This module
is the managed ledger's side of that: which of its ledgers are offloaded, whether their local
copy is gone, and where reads of such a ledger go.

* At open, records of the topic are attached to its ledgers (``attach_records``); a ledger
  with a record and no local bytes is *remote*.
* The offloader asks for candidates (``sealed_ledgers_to_offload``), for a ledger's bytes and
  index (``offload_source``), reports a finished copy (``attach_offload``) and, after the
  deletion lag, deletes the local copy (``release_local_copy``): reads then switch to the
  object store (``read_range``), one ranged read made outside the managed ledger's lock.
* ``ledger_url`` tells a process that is not this broker (a Spark executor, maybe on another
  machine) where to read a ledger: the object's URI once offloaded (immutable), else the
  ledger storage's location.

All methods take the ledger list's lock where they touch ledgers; none holds it while waiting
for the object store.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import StorageError
from .. import ledger_file as lf
from ..ledger_state import LedgerList, LedgerState
from ..ledger_storage import LedgerStorage
from ..position import LEDGER_CLOSED, LedgerInfo, Position

if TYPE_CHECKING:  # pragma: no cover
    from ..reader import IndexCache


class OffloadState:
    """The offload side of one managed ledger (see the module docstring)."""

    def __init__(self, ledgers: LedgerList, storage: LedgerStorage, offloader: Any, indexes: "IndexCache"):
        self._ledgers = ledgers
        self._lock = ledgers.lock
        self._storage = storage
        self.offloader = offloader  # storage.offload.LedgerOffloader, or None
        self._indexes = indexes

    def attach_records(self) -> None:
        """Attach the catalog's records of this topic to the ledgers they describe."""
        if self.offloader is None:
            return
        records = self.offloader.catalog.for_topic(self._ledgers.topic)
        with self._lock:
            for led in self._ledgers.ledgers:
                rec = records.get(led.ledger_id)
                if rec is not None:
                    led.offload = rec
                    led.local_gone = not self._storage.exists(led.ledger_id)

    def is_remote(self, led: LedgerState) -> bool:
        """True when ``led`` is read from the object store (offloaded, local copy gone)."""
        if led.offload is None:
            return False
        if not led.local_gone and not self._storage.exists(led.ledger_id):
            led.local_gone = True
        return led.local_gone

    def read_range(self, led: LedgerState, lo: int, hi: int) -> bytes:
        """Bytes ``[lo, hi)`` of an offloaded ledger, from the object store."""
        return self.offloader.read_range(led.offload, lo, hi)

    def ledger_url(self, ledger_id: int) -> str:
        """Where a process that is not this broker reads a ledger from: the object store's URI
        once it is offloaded (immutable, and reachable from a Spark executor on another
        machine), else the ledger storage's location."""
        with self._lock:
            led = self._ledgers.by_id.get(ledger_id)
            rec = led.offload if led is not None else None
        if rec is None:
            return self._storage.location(ledger_id)
        return rec.location.url(rec.data_key)

    def sealed_ledgers_to_offload(self) -> list[int]:
        """Ids of the sealed ledgers not yet offloaded, oldest first."""
        with self._lock:
            return [
                led.ledger_id
                for led in self._ledgers.ledgers
                if led is not self._ledgers.current
                and led.state == LEDGER_CLOSED
                and led.offload is None
                and led.count > 0
            ]

    def offload_source(self, ledger_id: int) -> tuple[str, lf.LedgerIndex] | None:
        """(location, index) of a sealed ledger to copy; None when it is gone or offloaded."""
        with self._lock:
            led = self._ledgers.by_id.get(ledger_id)
            if (
                led is None
                or led is self._ledgers.current
                or led.offload is not None
                or led.state != LEDGER_CLOSED
            ):
                return None
            self._indexes.ensure(led)
            return self._storage.location(ledger_id), lf.LedgerIndex(
                led.ledger_id,
                np.asarray(led.offsets, np.int64),
                np.asarray(led.publish_times, np.int64),
                led.data_end,
            )

    def attach_offload(self, record: Any) -> None:
        """The offloader committed ``record`` for one of our ledgers."""
        with self._lock:
            led = self._ledgers.by_id.get(record.ledger_id)
            if led is not None:
                led.offload = record

    def offloaded_with_local_copy(self) -> list[Any]:
        with self._lock:
            return [
                led.offload for led in self._ledgers.ledgers if led.offload is not None and not led.local_gone
            ]

    def release_local_copy(self, ledger_id: int) -> bool:
        """Delete the local copy of an offloaded ledger (reads switch to the object store)."""
        with self._lock:
            led = self._ledgers.by_id.get(ledger_id)
            if led is None or led.offload is None or led.local_gone or self._ledgers.read_only:
                return False
            led.local_gone = True
            if led is not self._ledgers.current:  # an index read from the local file goes too
                led.offsets = led.publish_times = None
        self._storage.delete(ledger_id, durable=True)
        return True

    def ledgers_with_offload(self) -> list[tuple[LedgerInfo, bool]]:
        """Every ledger with whether it is offloaded (for internalStats and offload thresholds)."""
        ledgers = self._ledgers
        with self._lock:
            return [
                (ledgers.info(led, ledgers.visible(led)), led.offload is not None) for led in ledgers.ledgers
            ]

    def offload_state(self) -> dict[int, dict[str, Any]]:
        """Per offloaded ledger: where it lives and whether the local copy is gone."""
        with self._lock:
            return {
                led.ledger_id: {
                    "offloaded": True,
                    "localCopyDeleted": led.local_gone,
                    "location": led.offload.location.describe(),
                }
                for led in self._ledgers.ledgers
                if led.offload is not None
            }

    def first_unoffloaded_position(self) -> Position | None:
        with self._lock:
            for led in self._ledgers.ledgers:
                if led.offload is None and self._ledgers.visible(led):
                    return Position(led.ledger_id, 0)
            return None

    def ledgers_deleted(self) -> None:
        """Retention deleted ledgers: their offloaded objects are dead (retried if this fails)."""
        if self.offloader is not None:
            try:
                self.offloader.delete_dead(self._ledgers.topic)
            except StorageError:
                pass
