"""The compaction service of a topic over its compacted ledger: the read side of the view.

``LedgerCompactionService`` implements ``TopicCompactionService``: ``compact`` runs one
``CompactionRunner`` (``runner``: a run from start to commit) with the engine a subclass
provides, and the read half serves the compacted ledger the metadata store names; it notices a
new one (committed by this process or by a ``compact-topic`` job) by the compaction state's
``version``. Its view handles (``LedgerView``) hold the compacted ledger's bytes (a memory map:
the data outlives the file's deletion), so a handle pinned by a consumer stays readable after a
newer compaction.
"""

from __future__ import annotations

import threading
from typing import Optional

from ..errors import CompactionError, CompactMQError, Conflict, StorageError
from . import (
    CommittedView,
    CompactionResult,
    CompactionStats,
    ProgressCallback,
    RetentionFilter,
    TopicCompactionService,
)
from .compacted_ledger import (
    CompactedLedgerReader,
    topic_dir,
)
from ..storage.position import Position
from .topic_lock import TopicLock
from .runner import CompactionRunner
from .settings import topic_settings
from .tiered import compacted_location
from .state import CompactionState, states_of


class LedgerView(CommittedView):
    """A handle on one compacted ledger (see ``CommittedView``)."""

    def __init__(
        self, view_id: int, horizon, reader: CompactedLedgerReader, sidecar: Optional[dict] = None
    ) -> None:
        self.view_id = view_id
        self.horizon = Position(*horizon)
        self.reader = reader
        self.sidecar = sidecar  # ``view_keys.plan_entry`` of its key sidecar, when it has one

    def _build_key_index(self):
        from . import key_index

        if self.sidecar is not None:
            try:
                return key_index.from_sidecar(self.sidecar)
            except (OSError, ValueError, CompactMQError):  # gone with a newer view, unreadable:
                pass  # parse the (mapped) view instead
        return key_index.from_view(self)

    def read(self, start, n: int) -> list:
        out = []
        for pos, data in self.reader.read(start, n):
            pos = Position(*pos)
            if pos > self.horizon:
                break
            out.append((pos, data))
        return out

    def get(self, position) -> Optional[bytes]:
        i = self.reader.find(position)
        if i < len(self.reader) and tuple(self.reader.position_at(i)) == tuple(position):
            return self.reader.entry_at(i)
        return None

    def last(self) -> Optional[tuple]:
        last = self.reader.last()
        return None if last is None else (Position(*last[0]), last[1])

    def __len__(self) -> int:
        return len(self.reader)

    @property
    def size_bytes(self) -> int:
        return self.reader.size_bytes  # without reading it (it may be in the object store)


class LedgerCompactionService(TopicCompactionService):
    """The read side over the compacted ledger named by the metadata store, plus ``compact()``
    through a ``CompactionRunner`` with the engine a subclass provides."""

    def __init__(self, storage, topic: str, config, *, abort_hook=None, task_probe=None):
        from ..naming import canonical

        self.storage = storage
        self.topic = canonical(topic)
        self.config = config
        self.abort_hook = abort_hook
        self.task_probe = task_probe
        self._lock = threading.Lock()
        self._view: Optional[LedgerView] = None
        self._engine = None
        self._cancelled = threading.Event()
        self._last_steps: dict = {}

    def engine(self):  # pragma: no cover - subclasses
        raise NotImplementedError

    def compact(self, progress: Optional[ProgressCallback] = None, *, engine=None) -> CompactionResult:
        """``engine``: the phases' engine for this run (a joint run's member, see
        ``spark.multi``) instead of a new ``engine()``."""
        self._cancelled.clear()
        self._engine = engine if engine is not None else self.engine()
        runner = CompactionRunner(
            self.storage,
            self.topic,
            self.config,
            self._engine,
            abort_hook=self._check_cancelled,
            task_probe=self.task_probe,
        )
        try:
            result = runner.run(progress)
        finally:
            self._engine = None
        self._last_steps = dict(result.step_seconds or {})
        return result

    def _check_cancelled(self, point: str) -> None:
        if self._cancelled.is_set() and point != "after-commit":
            raise CompactionError(f"compaction of {self.topic} cancelled")
        if self.abort_hook is not None:
            self.abort_hook(point)

    def cancel(self) -> None:
        self._cancelled.set()
        cancel = getattr(self._engine, "cancel", None)
        if cancel is not None:
            cancel()

    def try_lock(self):
        try:
            return TopicLock(topic_dir(self.storage.data_dir, self.topic))
        except Conflict:
            return None

    # --- the read side -----------------------------------------------------------------------

    def _open(self, view_id: int, horizon) -> Optional[LedgerView]:
        # the local file, or the offloaded object once tiered storage deleted the file
        path = compacted_location(self.storage, self.topic, view_id)
        try:
            reader = CompactedLedgerReader(path)
        except (OSError, StorageError):  # gone: a newer compaction replaced it
            return None
        try:
            sidecar = self._sidecar(view_id)
        except Exception:  # noqa: BLE001 - only a key lookup's speed depends on it, never a read
            sidecar = None
        return LedgerView(view_id, horizon, reader, sidecar)

    def _sidecar(self, view_id: int) -> Optional[dict]:
        """Where the key sidecar of view ``view_id`` is (``view_keys.plan_entry``) when the
        details committed with it list one: its local directory, or its objects beside a view
        written to the object store; None otherwise (the view is then parsed)."""
        import os

        from . import object_chain, view_keys

        state = self.state()
        details_of, details = state.details_of, state.details
        info = details.get(view_keys.DETAILS_KEY) if details_of == view_id else None
        if not isinstance(info, dict):
            return None
        names, gone = list(info.get("files") or []), list(info.get("gone") or [])
        local = view_keys.local_dir(topic_dir(self.storage.data_dir, self.topic), view_id)
        if os.path.isdir(local):
            return view_keys.plan_entry(
                [os.path.join(local, n) for n in names], gone=[os.path.join(local, n) for n in gone]
            )
        offloader = getattr(self.storage, "offloader", None)
        rec = offloader.compacted_record(view_id) if offloader is not None else None
        if object_chain.is_chain_record(rec):  # a chain in the object store: names relative to it
            return view_keys.plan_entry(
                object_chain.sidecar_keys(rec, names), rec.location, object_chain.sidecar_keys(rec, gone)
            )
        if rec is None or not rec.index_key.endswith("/"):  # (the view's parts hold no sidecar)
            return None
        base = rec.index_key.rstrip("/")
        return view_keys.plan_entry(
            [f"{base}/{view_keys.STORE_DIR}/{n}" for n in names],
            rec.location,
            [f"{base}/{view_keys.STORE_DIR}/{n}" for n in gone],
        )

    def state(self) -> CompactionState:
        return states_of(self.storage).get(self.topic)

    def open_view(self, view_id: Optional[int] = None, horizon=None) -> Optional[LedgerView]:
        for _ in range(5):
            state = self.state()
            if state.compacted_ledger_id is None or state.horizon is None:
                current = None
            else:
                with self._lock:
                    current = self._view
                if current is None or current.view_id != state.compacted_ledger_id:
                    current = self._open(state.compacted_ledger_id, state.horizon)
                    if current is None:
                        continue  # replaced between the lookup and the open: look again
                    with self._lock:
                        self._view = current
            if view_id is None or (current is not None and current.view_id == view_id):
                return current
            return None if horizon is None else self._open(view_id, horizon)
        raise StorageError(f"cannot open the compacted ledger of {self.topic}")

    def compacted_ledger(self) -> Optional[CompactedLedgerReader]:
        """The reader of the compacted ledger in force (tests and tools)."""
        view = self.open_view()
        return view.reader if view is not None else None

    def retention_filter(self) -> RetentionFilter:
        mode = topic_settings(self.storage, self.topic, self.config)["retention_mode"]
        try:
            first = self.storage.open_managed_ledger(self.topic, create=False).first_position()
        except CompactMQError:
            first = None
        return RetentionFilter(mode, None if first is None else Position(*first))

    def read_compacted_entries(self, start_position, n: int) -> list:
        view = self.open_view()
        if view is None:
            return []
        start = self.retention_filter().start(start_position, progress=True)
        return [] if start is None else view.read(start, n)

    def read_last_compacted_entry(self):
        view = self.open_view()
        last = view.last() if view is not None else None
        if last is not None and not self.retention_filter().visible(last[0]):
            return None
        return last

    def get_last_compacted_position(self):
        return self.state().horizon

    def stats(self) -> CompactionStats:
        view = self.open_view()
        state = self.state()
        # what the run that committed the view recorded (this process or a compact-topic job)
        details_of, details = state.details_of, state.details
        steps = dict(details.get("phaseSeconds") or self._last_steps)
        if view is None:
            return CompactionStats(last_run_duration_ms=state.last_duration_ms, last_run_steps=steps)
        mine = details_of == view.view_id
        keys = int(details.get("keys", -1)) if mine else -1
        return CompactionStats(
            view.view_id,
            view.horizon,
            len(view),
            view.size_bytes,
            keys=keys,
            tombstones=int(details.get("tombstones", -1)) if mine else -1,
            last_run_duration_ms=state.last_duration_ms,
            last_run_steps=steps,
            last_run_job=details.get("job"),
        )

    def close(self) -> None:
        with self._lock:
            self._view = None
