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
   the surviving entries, in id order, into a new compacted ledger (rewriting batches as above).
   Payload bytes never cross a shuffle: each task re-reads its own source ledgers.
4. *Commit*: flush the new file, then in ONE metadata transaction make it the topic's compacted
   ledger together with the new horizon. Only afterwards delete the previous compacted ledger and
   move the ``__compaction`` cursor to the horizon (which lets retention trim what is compacted).

A crash or an abort before the commit leaves the previous compacted ledger and horizon in force;
the half-written file is an orphan removed by the next run. After the commit the new view is in
force; a leftover previous file is likewise an orphan.

Runs are *incremental*: the second run reads the previous compacted ledger plus only the entries
after its horizon, so its cost grows with (compacted size + new data), not with the whole history.

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
``compactmq.compaction.spark.SparkCompactionServiceFactory``).
"""

from __future__ import annotations

import abc
import importlib
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from ..errors import InvalidConfiguration

DEFAULT_FACTORY = "compactmq.compaction.spark.SparkCompactionServiceFactory"
COMPACTION_CURSOR = "__compaction"

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
    step_seconds: Optional[dict] = None  # wall time of plan / spark / build / commit / cleanup


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

    def close(self) -> None:
        """Called at broker shutdown."""


def load_factory(config: Mapping[str, Any], storage=None) -> CompactionServiceFactory:
    """Instantiate the factory named by ``compactionServiceFactoryClassName``.

    The name is a dotted path ``package.module.ClassName``. When ``storage`` is given the factory
    is also initialized with it.

    Raises:
        InvalidConfiguration: the name does not resolve to a ``CompactionServiceFactory`` subclass.
    """
    name = config.get("compactionServiceFactoryClassName") or DEFAULT_FACTORY
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
    "PHASES",
    "CompactionProgress",
    "CompactionResult",
    "CompactionServiceFactory",
    "ProgressCallback",
    "TopicCompactionService",
    "load_class",
    "load_factory",
]
