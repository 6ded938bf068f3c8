"""A second compaction service, deliberately unlike the default one, to prove the PIP-278 seam.

``ArrowCompactionServiceFactory`` is named by class in ``compactionServiceFactoryClassName``
(``tests.broker.arrow_compaction.ArrowCompactionServiceFactory``). Nothing of it is shared with
the default service except the interface:

* it computes the view in plain Python, without Spark: every run folds the previous view (what
  retention still lets it keep) and the entries after the horizon, keep-latest per key;
* it keeps each view in a Parquet file of its own format (columns ``ledger_id``, ``entry_id``,
  ``entry``; the horizon in the schema metadata) under ``<dataDir>/arrow-views/``, never in a
  compacted ledger;
* its view handles hold the whole table in memory (so a pinned view outlives its file), and its
  stats count keys.

``COMPACTMQ_TEST_COMPACTION_GATE`` (a file path) holds every run after its first read until the
file exists, so a test can act while a run is certainly in progress (kill the broker, say).

If the broker reached compacted data any other way than through ``TopicCompactionService`` the
read-compacted tests would fail against it. It supports keep-latest only (what those tests use),
``topicCompactionRetainNullKey``, both retention modes and the minimum lag.
"""

from __future__ import annotations

import bisect
import fcntl
import os
import threading
import time
from typing import Optional
from urllib.parse import quote

import pyarrow as pa
import pyarrow.parquet as pq

from compactmq.compaction import (
    CommittedView,
    CompactionProgress,
    CompactionResult,
    CompactionServiceFactory,
    CompactionStats,
    RetentionFilter,
    TopicCompactionService,
)
from compactmq.compaction.lag import last_compactable
from compactmq.compaction.runner import topic_settings
from compactmq.compaction.state import advance_hold, states_of
from compactmq.errors import CompactionError, CompactMQError, Conflict
from compactmq.naming import canonical
from compactmq.protocol import batch as batch_codec
from compactmq.protocol import entry_format
from compactmq.protocol import pulsar_pb2 as pb
from compactmq.storage.position import EARLIEST, Position

FORMAT = b"compactmq-test-arrow-view/1"
SCHEMA = pa.schema([("ledger_id", pa.int64()), ("entry_id", pa.int64()), ("entry", pa.binary())])


#: a test that must catch a run part-way names a file here (in the broker's environment): every
#: run then stops after its first read until that file exists (or 120 s pass)
GATE_ENV = "COMPACTMQ_TEST_COMPACTION_GATE"


def wait_for_gate() -> None:
    gate = os.environ.get(GATE_ENV)
    deadline = time.monotonic() + 120
    while gate and not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.05)  # a stand-in for a long run, not test synchronisation


def view_dir(data_dir, topic: str) -> str:
    return os.path.join(str(data_dir), "arrow-views", quote(topic, safe=""))


def view_path(data_dir, topic: str, view_id: int) -> str:
    return os.path.join(view_dir(data_dir, topic), f"view-{view_id}.parquet")


class ArrowView(CommittedView):
    def __init__(self, view_id: int, horizon, table: pa.Table, size_bytes: int) -> None:
        self.view_id = view_id
        self.horizon = Position(*horizon)
        self._positions = list(
            zip(table.column("ledger_id").to_pylist(), table.column("entry_id").to_pylist())
        )
        self._entries = table.column("entry")
        self._size = size_bytes

    def read(self, start, n: int) -> list:
        i = bisect.bisect_left(self._positions, tuple(start))
        out = []
        for j in range(i, min(i + max(n, 0), len(self._positions))):
            pos = Position(*self._positions[j])
            if pos > self.horizon:
                break
            out.append((pos, self._entries[j].as_py()))
        return out

    def get(self, position) -> Optional[bytes]:
        i = bisect.bisect_left(self._positions, tuple(position))
        if i < len(self._positions) and self._positions[i] == tuple(position):
            return self._entries[i].as_py()
        return None

    def last(self) -> Optional[tuple]:
        if not self._positions:
            return None
        return Position(*self._positions[-1]), self._entries[len(self._positions) - 1].as_py()

    def __len__(self) -> int:
        return len(self._positions)

    @property
    def size_bytes(self) -> int:
        return self._size

    def items(self) -> list:
        return self.read(EARLIEST, len(self))


def load_view(path: str, view_id: int, horizon=None) -> Optional[ArrowView]:
    try:
        table = pq.read_table(path, memory_map=False)
        size = os.path.getsize(path)
    except (FileNotFoundError, OSError):
        return None
    meta = table.schema.metadata or {}
    if meta.get(b"format") != FORMAT:
        raise CompactionError(f"{path}: not an arrow view")
    if horizon is None:
        horizon = tuple(int(x) for x in meta[b"horizon"].split(b":"))
    return ArrowView(view_id, horizon, table, size)


def messages(entry: bytes) -> tuple[pb.MessageMetadata, list, bool]:
    """(metadata, [(index, key or None, tombstone, placeholder)], whole) of one entry; ``whole``:
    judged as one message (encrypted: it cannot be opened)."""
    metadata, payload = entry_format.parse_entry(entry, verify_checksum=False)
    key = metadata.partition_key if metadata.HasField("partition_key") else None
    if metadata.encryption_keys:
        return metadata, [(0, key, len(payload) == 0, False)], True
    out = []
    for i, item in enumerate(batch_codec.decode_batch(metadata, payload)):
        m = item.meta
        k = m.partition_key if m.HasField("partition_key") else None
        out.append((i, k, len(item.payload) == 0 or m.null_value, m.compacted_out))
    return metadata, out, not batch_codec.is_batch(metadata)


def rewrite(entry: bytes, keep: set) -> bytes:
    """``entry`` with the batch messages whose index is not in ``keep`` turned into placeholders."""
    metadata, payload = entry_format.parse_entry(entry, verify_checksum=False)
    items = batch_codec.decode_batch(metadata, payload)
    if all(i in keep or it.meta.compacted_out for i, it in enumerate(items)):
        return entry
    items = [it if i in keep else batch_codec.compacted_out(it.meta) for i, it in enumerate(items)]
    out = pb.MessageMetadata()
    out.CopyFrom(metadata)
    return entry_format.build_entry(out, batch_codec.encode_batch_payload(out, items))


class _FileLock:
    def __init__(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)
        self.fd = os.open(os.path.join(directory, ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self.fd)
            raise Conflict("a compaction of this topic is already running") from None

    def release(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


class ArrowCompactionService(TopicCompactionService):
    def __init__(self, storage, topic: str, config) -> None:
        self.storage = storage
        self.topic = canonical(topic)
        self.config = config
        self._view: Optional[ArrowView] = None
        self._lock = threading.Lock()
        self._cancelled = threading.Event()
        self._last_ms: Optional[int] = None

    # --- write side ------------------------------------------------------------------------

    def compact(self, progress=None) -> CompactionResult:
        report = progress or (lambda p: None)
        self._cancelled.clear()
        t0 = time.monotonic()
        lock = _FileLock(view_dir(self.storage.data_dir, self.topic))
        states = states_of(self.storage)  # the compaction service's state, compare-and-set
        try:
            state = states.get(self.topic)
            ml = self.storage.open_managed_ledger(self.topic, create=False)
            if getattr(ml, "refresh", None):
                ml.refresh()
            # the horizon stops before messages younger than the minimum lag (compaction.lag)
            min_lag = topic_settings(self.storage, self.topic, self.config)["min_lag_seconds"]
            last, first = last_compactable(ml, min_lag, int(time.time() * 1000)), ml.first_position()
            running = states.mark_running(self.topic, expected_version=state.version)
            if state.compacted_ledger_id is None and last is None:
                states.record_empty(self.topic, running.version, duration_ms=0)
                return CompactionResult(self.topic, None, None, 0, 0, 0, 0, 0, 0)
            try:
                return self._run(state, running, ml, last, first, report, t0)
            except BaseException as e:
                states.record_failure(
                    self.topic, f"{type(e).__name__}: {e}", expected_version=running.version
                )
                raise
        finally:
            lock.release()

    def _run(self, state, running, ml, last, first, report, t0) -> CompactionResult:
        settings = topic_settings(self.storage, self.topic, self.config)
        if settings["strategy"] not in (None, "", "keep-latest"):
            raise CompactionError(
                f"the arrow test service only knows keep-latest, not {settings['strategy']!r}"
            )
        horizon = state.horizon
        previous = []
        if state.compacted_ledger_id is not None:
            old = load_view(
                view_path(self.storage.data_dir, self.topic, state.compacted_ledger_id),
                state.compacted_ledger_id,
            )
            keep = RetentionFilter(settings["retention_mode"], first)
            previous = [(p, e) for p, e in (old.items() if old else []) if keep.visible(p)]
        new = []
        if last is not None and (horizon is None or last > horizon):
            pos = EARLIEST if horizon is None else Position(horizon[0], horizon[1] + 1)
            while pos <= last:
                if self._cancelled.is_set():
                    raise CompactionError(f"compaction of {self.topic} cancelled")
                got = ml.read_entries(pos, 500)
                got = [(p, e) for p, e in got if p <= last]
                if not got:
                    break
                new.extend(got)
                pos = Position(got[-1][0][0], got[-1][0][1] + 1)
                report(CompactionProgress("phase-one", len(new), len(new)))
                wait_for_gate()
        new_horizon = last if horizon is None or (last is not None and last > horizon) else horizon
        inputs = previous + new
        latest: dict = {}
        keyless: set = set()
        decoded = []
        read = 0
        for p, entry in inputs:
            metadata, msgs, whole = messages(entry)
            decoded.append((p, entry, whole))
            if metadata.HasField("marker_type"):
                continue
            for i, key, tomb, placeholder in msgs:
                if placeholder:
                    continue
                read += 1
                if key is None:
                    if settings["retain_null_key"]:
                        keyless.add((p, i))
                elif tomb:
                    latest.pop(key, None)
                else:
                    latest[key] = (p, i)
        survivors = keyless | set(latest.values())
        rows = []
        for p, entry, whole in decoded:
            keep_idx = {i for (q, i) in survivors if q == p}
            if not keep_idx:
                continue
            rows.append((p, entry if whole else rewrite(entry, keep_idx)))
        report(CompactionProgress("commit", len(inputs), len(inputs)))
        view_id = self.storage.resources.ledger_ids.allocate()
        path = view_path(self.storage.data_dir, self.topic, view_id)
        table = pa.table(
            {
                "ledger_id": [p[0] for p, _ in rows],
                "entry_id": [p[1] for p, _ in rows],
                "entry": [e for _, e in rows],
            },
            schema=SCHEMA,
        )
        table = table.replace_schema_metadata(
            {b"format": FORMAT, b"keys": str(len(latest)).encode(), b"horizon": b"%d:%d" % tuple(new_horizon)}
        )
        tmp = path + ".tmp"
        pq.write_table(table, tmp)
        os.replace(tmp, path)
        duration = int((time.monotonic() - t0) * 1000)
        kept = len(survivors)
        old_id, _ = states_of(self.storage).commit(
            self.topic,
            view_id,
            new_horizon,
            expected_version=running.version,
            stats={"duration_ms": duration, "removed_event_count": max(0, read - kept)},
        )
        advance_hold(self.storage, self.topic, new_horizon)
        if old_id is not None and old_id != view_id:
            try:
                os.unlink(view_path(self.storage.data_dir, self.topic, old_id))
            except FileNotFoundError:
                pass
        self._last_ms = duration
        report(CompactionProgress("done", len(inputs), len(inputs)))
        return CompactionResult(
            self.topic,
            view_id,
            Position(*new_horizon),
            len(inputs),
            read,
            len(rows),
            kept,
            max(0, read - kept),
            duration,
            previous_ledger_id=old_id,
        )

    def cancel(self) -> None:
        self._cancelled.set()

    def try_lock(self):
        try:
            return _FileLock(view_dir(self.storage.data_dir, self.topic))
        except Conflict:
            return None

    # --- read side -------------------------------------------------------------------------

    def open_view(self, view_id=None, horizon=None) -> Optional[ArrowView]:
        state = self.state()
        current = None
        if state.compacted_ledger_id is not None and state.horizon is not None:
            with self._lock:
                current = self._view
            if current is None or current.view_id != state.compacted_ledger_id:
                path = view_path(self.storage.data_dir, self.topic, state.compacted_ledger_id)
                current = load_view(path, state.compacted_ledger_id, state.horizon)
                with self._lock:
                    self._view = current
        if view_id is None or (current is not None and current.view_id == view_id):
            return current
        if horizon is None:
            return None
        return load_view(view_path(self.storage.data_dir, self.topic, view_id), view_id, horizon)

    def retention_filter(self) -> RetentionFilter:
        mode = topic_settings(self.storage, self.topic, self.config)["retention_mode"]
        try:
            first = self.storage.open_managed_ledger(self.topic, create=False).first_position()
        except CompactMQError:
            first = None
        return RetentionFilter(mode, first)

    def read_compacted_entries(self, start_position, n: int) -> list:
        view = self.open_view()
        start = self.retention_filter().start(start_position, progress=True)
        return [] if view is None or start is None else view.read(start, n)

    def read_last_compacted_entry(self):
        view = self.open_view()
        last = view.last() if view is not None else None
        return last if last is not None and self.retention_filter().visible(last[0]) else None

    def get_last_compacted_position(self):
        return self.state().horizon

    def state(self):
        return states_of(self.storage).get(self.topic)

    def stats(self) -> CompactionStats:
        view = self.open_view()
        if view is None:
            return CompactionStats(last_run_duration_ms=self._last_ms)
        keys = len(
            {k for _, e in view.items() for _, k, _, out in messages(e)[1] if k is not None and not out}
        )
        return CompactionStats(
            view.view_id,
            view.horizon,
            len(view),
            view.size_bytes,
            keys=keys,
            last_run_duration_ms=self._last_ms,
        )


class ArrowCompactionServiceFactory(CompactionServiceFactory):
    def new_service(self, topic: str) -> ArrowCompactionService:
        return ArrowCompactionService(self.storage, topic, self.config)
