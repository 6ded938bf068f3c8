"""Topic compaction: keep, for every key, only the message that still matters.

Definitions
-----------
A topic is a sequence of *entries*, each stored at a position ``(ledger_id, entry_id)``. An entry
holds one message, or a *batch* of messages, addressed ``(ledger_id, entry_id, batch_index)``.
The *key* of a message is its ``partition_key`` (for a message inside a batch: the key in its
``SingleMessageMetadata``). A message with a key and an empty payload is a *tombstone*: it deletes
its key. A message is *obsolete* when the compaction strategy says a later (or earlier) message of
the same key replaces it, or when a later tombstone deletes its key.

The strategy is a left fold over the messages of one key in id order. The state starts empty; a
tombstone empties it; any other message ``cur`` replaces the state ``prev`` unless
``strategy.should_keep_left(prev, cur)`` says to keep ``prev``. What is left at the end survives.
Built in: *keep-latest* (never keep left: the newest value wins), *keep-first* (PIP-215: always
keep left, so a key's first value stands until a tombstone), *event-time* (keep left when its
``event_time`` is newer; equal times go to the later message). A user strategy is any class with
``should_keep_left(prev, cur)``, named by dotted path in the topic policy or in
``topicCompactionStrategy``.

Keyless messages take no part in the fold: they are dropped, unless
``topicCompactionRetainNullKey=true``, in which case every keyless message survives. Server-only
markers (``marker_type`` set) never survive. An encrypted entry cannot be opened, so it is judged
as one message by its outer ``partition_key`` and, if it survives, copied whole.

Regions of a topic
------------------
The *horizon* is the position of the last entry the last successful compaction read. Below and at
the horizon the topic is summarised by the *compacted ledger*: a file holding the surviving entries,
each next to its original id, in id order. Above the horizon is the live topic. A consumer reading
compacted (Exclusive or Failover subscription, or a reader) sees::

    compacted ledger entries (ids <= horizon, with gaps)  then  live entries (ids > horizon)

so it gets, for every key, the surviving message as of the horizon and then everything newer.
Ids are never renumbered: a compacted view keeps the original ids and simply skips the obsolete ones.

A batch keeps its entry and its size. When some of its messages are obsolete they are rewritten as
``compacted_out`` placeholders with empty payloads, so the batch indexes of the survivors do not
change; the batch is re-compressed with its own codec and keeps its entry's id. A batch with no
survivor is not written at all.

A run
-----
1. *Start*: take the topic's lock, delete compacted-ledger files of this topic that the metadata
   store does not name (left by a crashed run), note the last entry of the topic: the new horizon.
2. *Phase one* (Spark): read the previous compacted ledger and the entries after the previous
   horizon up to the new horizon. Python workers read ledger files through ``pyarrow.fs`` and
   turn entries into rows of ``(128-bit key hash, packed position, flags)`` in Arrow batches
   (reading the few protobuf fields needed without a protobuf parser, see ``entry_scan``; for
   keep-latest they first drop rows superseded within their own share of the input, as a
   map-side combiner). Spark's own engine then finds, per key, the surviving position. Only key
   hashes and positions are shuffled.
3. *Phase two* (Spark): group the surviving positions by source ledger, and copy the raw bytes of
   the surviving entries, in id order, into new *segments* (rewriting batches as above): each
   task writes one complete compacted-ledger file, with direct I/O where the file system allows
   it (``storage.direct_file``: a run's gigabytes bypass the page cache). Payload bytes never
   cross a shuffle: each task re-reads its own source ledgers.
4. *Commit*: write the view's *chain manifest* naming its segments (``chain``), then in ONE
   compare-and-set of the topic's compaction state (``state``: the view pointer and the new
   horizon are one value in the metadata store) make it the topic's compacted view -- refused
   when the state moved since the run marked it RUNNING, so a stale run can never replace a
   newer view. Only afterwards delete the previous view's manifest and the segments the new one
   does not name, and move the ``__compaction`` cursor to the horizon (which lets retention trim
   what is compacted).

A crash or an abort before the commit leaves the previous compacted ledger and horizon in force;
the half-written file is an orphan removed by the next run. After the commit the new view is in
force; a leftover previous file is likewise an orphan.

Runs are *incremental*: the second run reads the previous compacted view plus only the entries
after its horizon, so its cost grows with (compacted size + new data), not with the whole history.
Of the previous view, a run reads only its *key sidecar* (``view_keys``: key hashes, positions
and flags as Parquet, written by phase two beside the view and switched with it), not its
entries; a view without one is parsed. Phase two then *extends the chain* (``chain``): it
writes the new survivors, masks the old batches that lost a message and lists the old entries
that lost every message; unchanged compacted entries are not copied. After a few runs, or once
much of the chain is dead, a run rewrites it whole (the merge policy). Reads see one sorted index
over the chain's segments, so they stay a binary search. A keep-latest run that extends a chain
is a *lookup run* (``lookup_run``): only the new messages go through Spark's shuffle, and their keys
are looked up in the sidecar, so the run costs what is new; other strategies re-aggregate the
sidecar's rows with the new ones. The run's plan learns the previous view's entries per ledger
from its manifest (``previous_view``), without merging the chain's indexes.

Retention
---------
``topicCompactionRetentionMode``: in ``retention-bounded`` mode (default) a message that retention
removed from the topic is not readable from the compacted view either: readers skip compacted
entries below the topic's first retained position, and the next run drops them. In
``keep-until-tombstone`` mode the compacted ledger keeps every key until a tombstone deletes it,
whatever retention removed from the topic.

Pluggability (PIP-278)
----------------------
``TopicCompactionService`` is the interface the broker uses; ``CompactionServiceFactory`` builds
one per topic; ``load_factory(config)`` instantiates the factory named by the config key
``compactionServiceFactoryClassName`` (default
``compactmq.compaction.jobs.SparkCompactionServiceFactory``).

The interface is the whole seam, write side and read side: the broker and the admin adapter
never open a compacted-ledger file, build its path or import pyspark. Besides PIP-278's four
operations (``compact``, ``read_compacted_entries``, ``read_last_compacted_entry``,
``get_last_compacted_position``) a service offers:

* ``open_view(view_id=None)``: a ``CommittedView`` handle on the view in force (or on an older
  one, by id, while it still exists). A handle stays readable after a newer compaction
  replaced and deleted its view, until it is dropped: that is how the broker pins a view for a
  consumer part-way through it without knowing where views are kept;
* ``retention_filter()``: the one ``RetentionFilter`` of the topic (mode and first retained
  position), which every read of the compacted view goes through;
* ``stats()``: a ``CompactionStats`` (view id, horizon, entries, bytes, keys, last run's timings);
* ``state()``: the topic's compaction state (``compaction.state``: status, last error, view
  pointer and horizon, persisted with compare-and-set so a stale run cannot commit);
* ``cancel()``: stop a running ``compact()`` (it then fails with ``CompactionError``);
* ``try_lock()``: the topic's cross-process compaction lock, to tell a run in another process
  from one a crash interrupted.

A factory may also compact several topics together (``compact_together``: the partitions of a
partitioned topic, in one Spark job for the default factory); each topic still commits alone.

Only ``compact`` and the four reads are abstract: the other methods have defaults built on them,
so a minimal service still serves read-compacted consumers (without pinning older views).
"""

from __future__ import annotations

import abc
import importlib
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

from ..config import KEEP_UNTIL_TOMBSTONE, RETENTION_BOUNDED, RETENTION_MODES, SETTINGS, setting
from ..errors import CompactionError, InvalidConfiguration
from ..storage.engine import TOPIC_AREAS
from ..storage.policy_keys import COMPACTION_CURSOR
from ..storage.position import EARLIEST, Position

#: the data directory's area of the compaction layer: one directory per topic (its views, chain
#: segments, key sidecars and compaction lock); storage makes it and deletes a topic's part with
#: the topic (``storage.engine.TOPIC_AREAS``) and knows nothing else of it
COMPACTED_DIR = "compacted"
TOPIC_AREAS.add(COMPACTED_DIR)

DEFAULT_FACTORY = SETTINGS["compactionServiceFactoryClassName"].default

#: phases reported to a progress callback, in order
PHASES = ("start", "phase-one", "phase-two", "commit", "done")


@dataclass(frozen=True)
class CompactionProgress:
    """What a progress callback receives: the phase, entries processed so far, estimated total."""

    phase: str
    entries_processed: int
    entries_total: int


ProgressCallback = Callable[[CompactionProgress], None]


@dataclass(frozen=True)
class CompactionResult:
    """The outcome of one successful run (also what ``compact()`` returns)."""

    topic: str
    compacted_ledger_id: Optional[int]
    horizon: Any  # storage.Position, or None when the topic was empty
    entries_read: int
    messages_read: int
    entries_written: int
    messages_kept: int
    removed_event_count: int
    duration_ms: int
    previous_ledger_id: Optional[int] = None
    step_seconds: Optional[dict] = None  # wall time of start / seal / plan / spark / build / commit / cleanup
    job: Optional[str] = None  # the engine's name of the job that ran it (Spark job group)
    #: the engine's split of its step (``spark.timeline``), computed when called
    engine_seconds: Optional[Callable[[], Optional[dict]]] = None


#: an entry of a compacted view: its original position and its bytes
Entry = tuple  # (Position, bytes)


@dataclass(frozen=True)
class RetentionFilter:
    """Which compacted entries retention lets a consumer see (``topicCompactionRetentionMode``).

    In ``retention-bounded`` mode an entry below the topic's first retained position is hidden
    (all are, when retention emptied the topic); in ``keep-until-tombstone`` mode none is, and a
    consumer at (or before) the first retained entry starts at the first compacted entry.
    """

    mode: str = RETENTION_BOUNDED
    first: Optional[Position] = None  # the topic's first retained entry (None: it holds none)

    @property
    def bounded(self) -> bool:
        return self.mode == RETENTION_BOUNDED

    def visible(self, position) -> bool:
        """Whether the compacted entry at ``position`` may be served."""
        if not self.bounded:
            return True
        return self.first is not None and tuple(position) >= tuple(self.first)

    def at_beginning(self, start) -> bool:
        """keep-until-tombstone: ``start`` is at or before the first retained entry, so every
        compacted entry below it is still ahead of the consumer."""
        return not self.bounded and (self.first is None or tuple(start) <= tuple(self.first))

    def start(self, start, progress: bool = False) -> Optional[Position]:
        """Where a read of the compacted view asked at ``start`` really begins; None: nothing is
        visible. ``progress``: ``start`` continues what the reader already got (not a rewind)."""
        if self.bounded:
            if self.first is None:
                return None
            return Position(*max(tuple(start), tuple(self.first)))
        if not progress and self.at_beginning(start):
            return EARLIEST
        return Position(*start)


def retention_mode(value) -> str:
    """A configured retention mode, checked (None/empty: the default)."""
    mode = value or RETENTION_BOUNDED
    if mode not in RETENTION_MODES:
        raise CompactionError(f"unknown compaction retention mode {mode!r}")
    return mode


_KEY_INDEX_BUILD = threading.Lock()


class CommittedView(abc.ABC):
    """A handle on one committed compacted view: the surviving entries with ids <= ``horizon``.

    A handle keeps its view readable after a newer compaction replaced it (and its storage was
    deleted) until the handle is dropped. Reads are thread-safe. ``view_id`` names the view
    (for the default service, the compacted ledger's id); ids of successive views differ.
    """

    view_id: int
    horizon: Position

    @abc.abstractmethod
    def read(self, start, n: int) -> list:
        """Up to ``n`` ``(Position, bytes)`` with ``start`` <= id <= horizon, in id order."""

    @abc.abstractmethod
    def get(self, position) -> Optional[bytes]:
        """The entry at exactly ``position``, or None."""

    @abc.abstractmethod
    def last(self) -> Optional[tuple]:
        """The last ``(Position, bytes)`` of the view, or None when it is empty."""

    @abc.abstractmethod
    def __len__(self) -> int:
        """Entries in the view."""

    @property
    def size_bytes(self) -> int:
        """Bytes the view occupies where it is kept (-1: unknown)."""
        return -1

    def key_index(self):
        """The view's ``key_index.KeyIndex`` (which message holds a key), built on first use and
        kept with the handle. The default parses the view's entries; a view with a cheaper
        source of its key hashes overrides ``_build_key_index``. Builds are serialised (one lock
        for all views): concurrent first lookups wait for one build instead of each doing it."""
        index = getattr(self, "_key_index", None)
        if index is None:
            with _KEY_INDEX_BUILD:
                index = getattr(self, "_key_index", None)
                if index is None:
                    index = self._key_index = self._build_key_index()
        return index

    @property
    def key_index_built(self) -> bool:
        """Whether ``key_index()`` answers without building."""
        return getattr(self, "_key_index", None) is not None

    def drop_key_index(self) -> None:
        """Let the key index go (memory); the next ``key_index()`` builds it again."""
        self._key_index = None

    def _build_key_index(self):
        from .key_index import from_view

        return from_view(self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(id={self.view_id}, horizon={self.horizon}, entries={len(self)})"


@dataclass(frozen=True)
class CompactionStats:
    """What the admin API and the metrics report of a topic's compacted view and last run."""

    view_id: Optional[int] = None  # Pulsar's "compacted ledger id"; None: no view
    horizon: Optional[Position] = None
    entries: int = 0
    size_bytes: int = 0
    keys: int = -1  # distinct live keys in the view (-1: the service does not count them)
    tombstones: int = -1  # tombstones the view keeps (tombstone retention), not among keys; -1: not counted
    last_run_duration_ms: Optional[int] = None
    last_run_steps: dict = field(default_factory=dict)  # seconds per step of the last run here
    last_run_job: Optional[str] = None  # the engine's name of the job that ran it (Spark job group)


class _NoLock:
    def release(self) -> None:
        pass


class _ServiceView(CommittedView):
    """The default view handle: the service's current view through its four PIP-278 reads (it
    cannot keep an older view readable)."""

    def __init__(self, service: "TopicCompactionService", horizon) -> None:
        self.service = service
        self.horizon = Position(*horizon)
        self.view_id = hash(tuple(self.horizon)) & 0x7FFFFFFFFFFF

    def read(self, start, n: int) -> list:
        return [
            (Position(*p), d)
            for p, d in self.service.read_compacted_entries(start, n)
            if tuple(p) <= tuple(self.horizon)
        ]

    def get(self, position) -> Optional[bytes]:
        got = self.service.read_compacted_entries(position, 1)
        return got[0][1] if got and tuple(got[0][0]) == tuple(position) else None

    def last(self) -> Optional[tuple]:
        return self.service.read_last_compacted_entry()

    def __len__(self) -> int:
        return len(self.service.read_compacted_entries(EARLIEST, 1 << 62))


class TopicCompactionService(abc.ABC):
    """Compaction of one topic, as the broker sees it (PIP-278).

    Implementations are built by a ``CompactionServiceFactory``; the broker calls ``compact()`` in
    a worker thread (it blocks for the whole run) and the read methods from its read path.
    """

    @abc.abstractmethod
    def compact(self, progress: Optional[ProgressCallback] = None) -> CompactionResult:
        """Run one compaction of the topic and commit it.

        Returns:
            the run's ``CompactionResult``.
        Raises:
            Conflict: another compaction of this topic is running.
            CompactionError: the run failed; the previous compacted view stays in force.
        """

    @abc.abstractmethod
    def read_compacted_entries(self, start_position, n: int) -> list:
        """Up to ``n`` entries of the compacted ledger with id >= ``start_position``.

        Returns:
            a list of ``(Position, entry bytes)`` in id order; empty past the end or when there is
            no compacted ledger. In retention-bounded mode entries below the topic's first retained
            position are skipped.
        """

    @abc.abstractmethod
    def read_last_compacted_entry(self):
        """The last ``(Position, entry bytes)`` of the compacted ledger, or None."""

    @abc.abstractmethod
    def get_last_compacted_position(self):
        """The horizon (a ``Position``) of the last successful compaction, or None."""

    # --- beyond PIP-278's four operations (defaults built on them) ---------------------------

    def open_view(self, view_id: Optional[int] = None, horizon=None) -> Optional[CommittedView]:
        """A handle on the view in force (``view_id`` None) or on the view ``view_id`` while it
        still exists; None when there is no such view (or no compaction committed yet).

        ``horizon``: for an older view, the horizon the caller recorded when it pinned it (the
        service is asked only for the horizon of the view in force); without it an older view is
        not opened."""
        horizon = self.get_last_compacted_position()
        if horizon is None:
            return None
        view = _ServiceView(self, horizon)
        return view if view_id is None or view_id == view.view_id else None

    def state(self):
        """The topic's ``compaction.state.CompactionState``: status, last error and timings, the
        view pointer and its horizon (what the admin status, stats and internalStats report).

        The default knows only the horizon: SUCCESS once there is one, else NOT_RUN; a service
        that runs compactions keeps its state with ``compaction.state.CompactionStates``."""
        from .state import NOT_RUN, SUCCESS, CompactionState

        horizon = self.get_last_compacted_position()
        if horizon is None:
            return CompactionState(topic="", status=NOT_RUN)
        return CompactionState(topic="", horizon=Position(*horizon), status=SUCCESS)

    def retention_filter(self) -> RetentionFilter:
        """The topic's retention filter as of now (the default shows everything)."""
        return RetentionFilter(KEEP_UNTIL_TOMBSTONE)

    def stats(self) -> CompactionStats:
        """Statistics of the view in force."""
        view = self.open_view()
        if view is None:
            return CompactionStats()
        return CompactionStats(view.view_id, view.horizon, len(view), view.size_bytes)

    def cancel(self) -> None:
        """Ask a ``compact()`` running in another thread to stop (best effort; the default
        cannot)."""

    def try_lock(self):
        """The topic's compaction lock (an object with ``release()``), or None when a run in
        this or another process holds it. The default has no lock."""
        return _NoLock()

    def close(self) -> None:
        """Release what the service holds (open files). The default holds nothing."""


class CompactionServiceFactory(abc.ABC):
    """Builds the ``TopicCompactionService`` of a topic; one factory per broker process."""

    def initialize(self, storage, config) -> None:
        """Called once, before the first ``new_service``, with the broker's storage and config."""
        self.storage = storage
        self.config = config

    @abc.abstractmethod
    def new_service(self, topic: str) -> TopicCompactionService:
        """The compaction service of ``topic`` (a full topic name)."""

    def compact_together(
        self,
        services: Sequence[TopicCompactionService],
        progress: Optional[Sequence[Optional[ProgressCallback]]] = None,
    ) -> list:
        """Compact several topics (the partitions of a partitioned topic) as one piece of work.

        Each topic keeps its own horizon, view and commit: one whose run fails keeps its previous
        view and does not undo the others. A factory may share work between them (the Spark
        factory runs one Spark job for all); this default compacts them one after another.

        Args:
            services: services this factory built, one per topic.
            progress: a progress callback per service (or None).
        Returns:
            per service, in order, its ``CompactionResult`` or the ``Exception`` its run raised.
        """
        reports = list(progress) if progress is not None else [None] * len(services)
        outcomes: list = []
        for service, report in zip(services, reports):
            try:
                outcomes.append(service.compact(report))
            except Exception as e:  # this topic's outcome; the next one still runs
                outcomes.append(e)
        return outcomes

    def close(self) -> None:
        """Called at broker shutdown."""

    def warm_up(self) -> bool:
        """Prepare for a first run in the background, without blocking (``compactionSparkWarmup``:
        the entry point calls it once the broker is ready). False: nothing to warm."""
        return False

    def warmup_state(self) -> Optional[dict]:
        """How that preparation stands (``{"state": "warming" | "warm" | "failed" | "off", ...}``),
        or None for a factory that has nothing to warm."""
        return None


#: factory names an existing broker.conf may still hold, and where the class lives now (the
#: engine package was ``compaction.jobs``, a name that clashed with the Spark data source)
RENAMED_FACTORIES = {"compactmq.compaction.jobs.SparkCompactionServiceFactory": DEFAULT_FACTORY}


def load_factory(config: Mapping[str, Any], storage=None) -> CompactionServiceFactory:
    """Instantiate the factory named by ``compactionServiceFactoryClassName``.

    The name is a dotted path ``package.module.ClassName``. When ``storage`` is given the factory
    is also initialized with it.

    Raises:
        InvalidConfiguration: the name does not resolve to a ``CompactionServiceFactory`` subclass.
    """
    name = setting(config, "compactionServiceFactoryClassName")
    name = RENAMED_FACTORIES.get(name, name)
    cls = load_class(name, "compactionServiceFactoryClassName")
    if not (isinstance(cls, type) and issubclass(cls, CompactionServiceFactory)):
        raise InvalidConfiguration(
            f"compactionServiceFactoryClassName={name!r} is not a CompactionServiceFactory subclass"
        )
    factory = cls()
    if storage is not None:
        factory.initialize(storage, config)
    return factory


def load_class(name: str, what: str):
    """Resolve the dotted path ``package.module.Attr``; a bad name is one clear error."""
    module_name, _, attr = name.rpartition(".")
    if not module_name or not attr:
        raise InvalidConfiguration(f"{what}={name!r}: expected a dotted name like package.module.Class")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        raise InvalidConfiguration(f"{what}={name!r}: cannot import module {e.name!r}") from None
    except ImportError as e:
        raise InvalidConfiguration(f"{what}={name!r}: importing {module_name!r} failed: {e}") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise InvalidConfiguration(f"{what}={name!r}: module {module_name!r} has no {attr!r}") from None


__all__ = [
    "COMPACTION_CURSOR",
    "DEFAULT_FACTORY",
    "KEEP_UNTIL_TOMBSTONE",
    "PHASES",
    "RETENTION_BOUNDED",
    "RETENTION_MODES",
    "CommittedView",
    "CompactionProgress",
    "CompactionResult",
    "CompactionServiceFactory",
    "CompactionStats",
    "RetentionFilter",
    "retention_mode",
    "ProgressCallback",
    "TopicCompactionService",
    "load_class",
    "load_factory",
]
