"""ManagedLedger: one topic's entries, as an ordered list of ledgers plus cursors.

A managed ledger is Pulsar's unit of storage for a topic: entries are appended to the current
ledger; a full or old ledger is sealed (rollover) and a new one started; readers and cursors
walk the ledgers in order; retention deletes whole ledgers from the front. This module is the
facade over parts that each do one job (read them in this order):

* ``ledger_state``    the shared in-memory state: the ledgers, their lock, what is visible
                      (only durable entries), and the lock order;
* ``ledger_storage``  where ledger bytes live (``LedgerStorage``; today ``LocalLedgerStorage``:
                      one file per ledger, in the record format of ``ledger_file``);
* ``ledger_metadata`` what is asked of the metadata store (``LedgerMetadata``: the ledger list,
                      cursor records, two policies, transactions);
* ``recovery``        opening: torn tails cut, orphans removed, a new ledger started; or a
                      read-only view of another process's topic;
* ``appender``        appends, group commit, rollover (Pulsar's rule) and fencing;
* ``reader``          entry reads, positions, sizes, and the in-memory index cache;
* ``cursors``         the registry of cursors (``cursor.Cursor`` is one cursor);
* ``retention``       Pulsar's retention rules and retention holds by opaque owners;
* ``offload.state``   which ledgers are offloaded to an object store and where reads go.

Durability in one paragraph (details in ``appender``): an append returns once its record is
durable; a failed write or sync *fences* the managed ledger (appends refuse, reads go on) until
it is reopened, which recovers it (``Storage.open_managed_ledger`` does that). Opening recovers
every ledger left OPEN by a crash (``recovery``).

The facade adds no work to the hot calls: ``append``, ``append_many`` and the read calls a
dispatcher makes are the parts' own bound methods, set on the instance when it is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

from . import ledger_file as lf
from .appender import Appender
from .cursor import Cursor
from .cursors import CursorRegistry
from .ledger_metadata import LedgerMetadata, StoredCursor
from .ledger_state import LedgerList, os_errors_as_storage_errors
from .ledger_storage import LedgerStorage, LocalLedgerStorage, fsync_dir, write_file_atomically
from ..config.policy_keys import DEFAULT_SETTINGS, RETENTION_SIZE_MB, RETENTION_TIME_MINUTES
from .policy_keys import COMPACTION_CURSOR
from .offload.state import OffloadState
from .position import LedgerInfo, Position
from .reader import IndexCache, Reader
from .recovery import load_read_only, recover
from .retention import RetentionTrimmer

if TYPE_CHECKING:  # pragma: no cover
    from ..config import Config

# compaction/ imports these from here (they moved to ledger_storage with the bytes)
__all__ = ["ManagedLedger", "fsync_dir", "write_file_atomically"]


class ManagedLedger:
    """A topic's log. Obtain from ``Storage.open_managed_ledger``. Thread-safe."""

    @os_errors_as_storage_errors
    def __init__(
        self,
        topic: str,
        directory: str,
        store: LedgerMetadata,
        config: "Config",
        clock: Callable[[], int],
        read_only: bool = False,
        on_close: Callable[["ManagedLedger"], None] | None = None,
        offloader: Any = None,
        ledger_storage: LedgerStorage | None = None,
    ):
        self.topic = topic
        self.directory = directory
        self._store = store
        self._on_close = on_close
        self._ledgers = state = LedgerList(topic, read_only)
        self._lock = state.lock
        self._storage = storage = ledger_storage or LocalLedgerStorage(directory, topic)
        self._indexes = IndexCache(state, storage, offloader)
        self._offload = OffloadState(state, storage, offloader, self._indexes)
        self._reader = reader = Reader(state, storage, self._indexes, self._offload)
        self._appender = appender = Appender(state, storage, store, self._indexes, config, clock)
        if offloader is not None:  # Pulsar checks its offload threshold on rollover
            appender.on_rollover = lambda: offloader.maybe_auto_offload(self)
        self._cursors = CursorRegistry(self, state, store)
        defaults = (
            int(config[DEFAULT_SETTINGS[RETENTION_TIME_MINUTES]]),
            int(config[DEFAULT_SETTINGS[RETENTION_SIZE_MB]]),
        )
        self._retention = RetentionTrimmer(
            state, storage, store, self._cursors, reader.next_position, self._offload, defaults, clock
        )
        # a compact-topic job (another process) places and moves the compaction hold
        self._retention.watch(COMPACTION_CURSOR)

        # the hot calls go straight to their part: no extra Python call per append or read
        self.append = appender.append  # type: ignore[method-assign]
        self.append_many = appender.append_many  # type: ignore[method-assign]
        self.try_write_many = appender.try_write_many  # type: ignore[method-assign]
        self.read_entry = reader.read_entry  # type: ignore[method-assign]
        self.read_entries = reader.read_entries  # type: ignore[method-assign]
        self.next_position = reader.next_position  # type: ignore[method-assign]
        self.last_position = reader.last_position  # type: ignore[method-assign]
        self.entries_after = reader.entries_after  # type: ignore[method-assign]
        self.size_after = reader.size_after  # type: ignore[method-assign]

        if read_only:
            load_read_only(state, storage, store)
        else:
            storage.claim(topic)  # before recovery deletes anything
            recover(state, storage, store, appender, self._indexes, clock)
        self._offload.attach_records()
        self._cursors.load()

    def ledger_path(self, ledger_id: int) -> str:
        """Where a ledger's bytes are (a path for local ledgers; ``ledger_file.index_path_for``
        gives its index beside it)."""
        return self._storage.location(ledger_id)

    def refresh(self) -> None:
        """Read-only ledgers: pick up what the writing process has added since."""
        if self._ledgers.read_only:
            load_read_only(self._ledgers, self._storage, self._store)
            self._offload.attach_records()

    # --- writing (appender) ----------------------------------------------------------------

    def append(self, data: bytes, publish_time_ms: int | None = None) -> Position:
        """Append one entry; returns once it is durable (``Appender.append``)."""
        return self._appender.append(data, publish_time_ms)

    def append_many(
        self, entries: Sequence[bytes], publish_times_ms: Sequence[int | None] | None = None
    ) -> list[Position]:
        """Append entries in order with one write and one sync (``Appender.append_many``)."""
        return self._appender.append_many(entries, publish_times_ms)

    def write_many(
        self, entries: Sequence[bytes], publish_times_ms: Sequence[int | None] | None = None
    ) -> tuple[int, int, int]:
        """Write entries without waiting for a sync: ``(ledger_id, first_entry_id, seq)``,
        durable once ``durable_seq >= seq`` (``Appender.write_many``; the pipelined commit)."""
        return self._appender.write_many(entries, publish_times_ms)

    def try_write_many(self, entries: list[bytes], publish_times_ms: list[int | None]):
        """``write_many`` if it cannot block for long, else None (``Appender.try_write_many``)."""
        return self._appender.try_write_many(entries, publish_times_ms)

    def sync_written(self, on_durable: Callable[[int], None] | None = None) -> int:
        """Sync until everything written is durable (``Appender.sync_written``)."""
        return self._appender.sync_written(on_durable)

    def try_sync_written(self) -> int | None:
        """One sync on the calling thread if nothing makes it wait, else None
        (``Appender.try_sync_written``)."""
        return self._appender.try_sync_written()

    @property
    def durable_seq(self) -> int:
        """Records written since open that are durable (compare with ``write_many``'s seq)."""
        return self._ledgers.durable_seq

    def maybe_rollover(self) -> bool:
        """Roll the current ledger if it is past a limit; True when it rolled."""
        return self._appender.maybe_rollover()

    def rollover(self) -> bool:
        """Seal the current ledger now if it holds entries; True when it rolled."""
        return self._appender.rollover()

    # --- reading (reader) ------------------------------------------------------------------

    def read_entry(self, position: Position) -> bytes:
        return self._reader.read_entry(position)

    def read_entries(
        self, start: Position, max_entries: int, max_bytes: int | None = None
    ) -> list[tuple[Position, bytes]]:
        return self._reader.read_entries(start, max_entries, max_bytes)

    def first_position(self) -> Position | None:
        return self._reader.first_position()

    def last_position(self) -> Position | None:
        return self._reader.last_position()

    def next_position(self, position: Position) -> Position:
        return self._reader.next_position(position)

    previous_position = staticmethod(Reader.previous_position)

    def find_position_by_publish_time(self, ts_ms: int) -> Position:
        return self._reader.find_position_by_publish_time(ts_ms)

    def publish_time_of(self, position: Position) -> int | None:
        return self._reader.publish_time_of(position)

    def release_idle_indexes(self, idle_s: float) -> int:
        """Drop the in-memory indexes of sealed ledgers no read used for ``idle_s`` seconds."""
        with self._lock:
            return self._indexes.drop_idle(idle_s)

    def ledgers(self) -> list[LedgerInfo]:
        return self._reader.ledgers()

    def entries_after(self, position: Position) -> int:
        return self._reader.entries_after(position)

    def size_after(self, position: Position) -> int:
        return self._reader.size_after(position)

    def total_size(self) -> int:
        return self._reader.total_size()

    def entry_count(self) -> int:
        return self._reader.entry_count()

    # --- cursors ---------------------------------------------------------------------------

    def open_cursor(
        self, name: str, durable: bool = True, initial_position: str | Position = "earliest"
    ) -> Cursor:
        """Open (or create) a cursor (``CursorRegistry.open``)."""
        return self._cursors.open(name, durable, initial_position)

    def get_cursor(self, name: str) -> Cursor | None:
        return self._cursors.get(name)

    def cursors(self) -> list[Cursor]:
        return self._cursors.all()

    def delete_cursor(self, name: str) -> None:
        self._cursors.delete(name)

    def save_cursor_state(self, cursor: Cursor) -> None:
        """``CursorHost``: persist a durable cursor."""
        self._cursors.save(cursor)

    def cursor_record(self, name: str) -> StoredCursor | None:
        """``CursorHost``: a cursor's record as the metadata store has it now."""
        return self._cursors.record(name)

    # --- retention -------------------------------------------------------------------------

    def retention_policy(self) -> tuple[int, int]:
        """(minutes, MB) in force: topic policy, else namespace policy, else broker config."""
        return self._retention.retention_policy()

    def trim_to_retention(
        self,
        now_ms: int | None = None,
        retention_time_minutes: int | None = None,
        retention_size_mb: int | None = None,
    ) -> list[int]:
        """Delete whole ledgers retention no longer keeps (Pulsar's rules: ``retention``);
        limits default to ``retention_policy()``. Returns the deleted ledger ids."""
        return self._retention.trim(now_ms, retention_time_minutes, retention_size_mb)

    def hold_retention(self, owner: str, position: Position | None = None) -> bool:
        """Keep every ledger from ``position`` (default: the first) on for ``owner``; True when
        this call placed the hold (``RetentionTrimmer.hold``)."""
        return self._retention.hold(owner, position)

    def release_retention_hold(self, owner: str) -> None:
        self._retention.release(owner)

    def watch_retention_hold(self, owner: str) -> None:
        """``owner``'s hold may be placed or moved by another process: re-read it before
        each trim."""
        self._retention.watch(owner)

    def hold_for_compaction(self) -> bool:
        """Have retention keep every ledger a compaction run is about to read, from before it
        plans until it commits: the ``__compaction`` hold, placed before the first entry when
        the topic has none (a topic with no subscription and no compaction threshold, whose
        sealed ledgers retention could otherwise delete while the run waits for Spark). The
        commit then moves it to the new horizon. A read-only process (a ``compact-topic`` job)
        writes it to the metadata store only; the broker's retention reads it from there. True
        when this call placed it: a run that fails then calls ``release_compaction_hold``."""
        return self._retention.hold(COMPACTION_CURSOR)

    def release_compaction_hold(self) -> None:
        """Remove the hold ``hold_for_compaction`` placed, after a failed run (a topic that was
        never compacted goes back to plain retention)."""
        self._retention.release(COMPACTION_CURSOR)

    def _on_compaction_committed(self) -> None:
        """The metadata store moved ``__compaction`` forward (maybe from another process)."""
        self._retention.refresh(COMPACTION_CURSOR)

    # --- tiered storage (offload.state) ----------------------------------------------------

    def ledger_url(self, ledger_id: int) -> str:
        return self._offload.ledger_url(ledger_id)

    def sealed_ledgers_to_offload(self) -> list[int]:
        return self._offload.sealed_ledgers_to_offload()

    def offload_source(self, ledger_id: int) -> tuple[str, lf.LedgerIndex] | None:
        return self._offload.offload_source(ledger_id)

    def attach_offload(self, record: Any) -> None:
        self._offload.attach_offload(record)

    def offloaded_with_local_copy(self) -> list[Any]:
        return self._offload.offloaded_with_local_copy()

    def release_local_copy(self, ledger_id: int) -> bool:
        return self._offload.release_local_copy(ledger_id)

    def ledgers_with_offload(self) -> list[tuple[LedgerInfo, bool]]:
        return self._offload.ledgers_with_offload()

    def offload_state(self) -> dict[int, dict[str, Any]]:
        return self._offload.offload_state()

    def first_unoffloaded_position(self) -> Position | None:
        return self._offload.first_unoffloaded_position()

    # --- closing ---------------------------------------------------------------------------

    @os_errors_as_storage_errors
    def close(self) -> None:
        """Seal the current ledger (so the next open needs no recovery) and release files."""
        with self._lock:
            if self._ledgers.closed:
                return
            self._ledgers.closed = True
            try:
                self._appender.close()
            finally:
                self._storage.close()
        if self._on_close is not None:
            self._on_close(self)

    @property
    def closed(self) -> bool:
        return self._ledgers.closed

    @property
    def fenced(self) -> bool:
        """A write or sync failed: appends refuse until the topic is reopened (reads go on).
        ``Storage.open_managed_ledger`` reopens a fenced ledger, recovering it."""
        return self._ledgers.fenced is not None

    def __repr__(self) -> str:
        return f"ManagedLedger({self.topic!r}, ledgers={[led.ledger_id for led in self._ledgers.ledgers]})"
