"""The compaction state of each topic, owned by the compaction service (PIP-278).

What a topic's compaction state holds: its *status* (below), the last error and timestamps, and
-- written together, in one value -- the *view pointer* (the id of the compacted view in force)
and the *horizon* that view covers, with what the run that made it recorded of it (``details``:
keys, bytes, phase timings, the key sidecar). It lives in the metadata store through
``storage.resources.CompactionStateResources`` (``/compaction/{tenant}/{ns}/persistent/{topic}``),
so a ``compact-topic`` job in another process, or another broker sharing ZooKeeper, reads and
writes the same state. Storage never interprets it.

Status and its transitions (the only ones ``CompactionStates`` writes)::

    NOT_RUN --mark_running--> RUNNING --commit / record_empty--> SUCCESS
    SUCCESS | ERROR --mark_running--> RUNNING
    RUNNING --mark_running--> RUNNING       (a run a crash left RUNNING is restartable)
    any --record_failure--> ERROR           (the view in force stays)

Fencing, by construction: every write is a compare-and-set on the version of the state the
writer read. A run reads the state, marks it RUNNING with that version, and commits its view
with the version its RUNNING write got. Anything that changed the state meanwhile -- another
job that marked it RUNNING and committed, an owner that took the topic over and recorded the
interrupted run -- moves the version, so the late commit fails with ``StaleCompaction`` and
writes nothing: a stale job can never replace a newer view. The resource also refuses a horizon
below the committed one, whoever writes it. The pointer and the horizon are one value, so a
reload (a new broker, a restart) reads both from the same commit: the view cannot move
backwards across a reload either (apache/pulsar#26486, where the compacted ledger and the
horizon were read from different places and a reload could pair an older ledger with a newer
horizon).

Ownership (cluster mode): the commit also carries the checks of the topic's ownership *fence* as
the run found it when it started (``storage.resources.fence``), in the same atomic commit. A run
that straddles an ownership change -- its broker unloaded the topic, lost its session, or
another broker took the bundle -- fails with ``Fenced`` and writes nothing: a view is committed
under the epoch its run started with, or not at all.

A failure is recorded only by the run that still holds the state (its RUNNING version): a
stale job's failure never turns a newer SUCCESS into ERROR.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

from ..errors import Conflict
from ..naming import TopicName, canonical
from ..storage.metadata_store import NEW, BadVersion
from ..storage.position import Position
from ..storage.resources import CompactionStateResources, StaleCompaction
from ..storage.resources.fence import NO_FENCE, Fence

log = logging.getLogger(__name__)

NOT_RUN, RUNNING, SUCCESS, ERROR = "NOT_RUN", "RUNNING", "SUCCESS", "ERROR"

#: (from, to) pairs a write may make; ``record_failure`` may go to ERROR from anywhere
TRANSITIONS = {
    (NOT_RUN, RUNNING),
    (SUCCESS, RUNNING),
    (ERROR, RUNNING),
    (RUNNING, RUNNING),
    (RUNNING, SUCCESS),
}

#: read-modify-write attempts of a failure record that may be re-applied (no expected version)
_ATTEMPTS = 8

__all__ = [
    "ERROR",
    "NOT_RUN",
    "RUNNING",
    "SUCCESS",
    "CompactionState",
    "CompactionStates",
    "StaleCompaction",
    "advance_hold",
    "states_of",
]


@dataclass(frozen=True)
class CompactionState:
    """The compaction state of one topic as read. ``version`` is the store's version of it
    (-1: never written); any write moves it, so a reader can tell that something changed."""

    topic: str
    compacted_ledger_id: Optional[int] = None
    horizon: Optional[Position] = None
    status: str = NOT_RUN
    last_error: Optional[str] = None
    started_ms: Optional[int] = None
    last_success_ms: Optional[int] = None
    last_failure_ms: Optional[int] = None
    last_duration_ms: Optional[int] = None
    removed_event_count: int = 0
    version: int = NEW
    #: what the run that committed ``details_of`` recorded (keys, bytes, phase timings, sidecar)
    details_of: Optional[int] = None
    details: dict = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "compactedLedgerId": self.compacted_ledger_id,
            "horizon": None if self.horizon is None else [int(self.horizon[0]), int(self.horizon[1])],
            "lastError": self.last_error,
            "startedMs": self.started_ms,
            "lastSuccessMs": self.last_success_ms,
            "lastFailureMs": self.last_failure_ms,
            "lastDurationMs": self.last_duration_ms,
            "removedEventCount": self.removed_event_count,
            "detailsOf": self.details_of,
            "details": dict(self.details),
        }

    @classmethod
    def from_json(cls, topic: str, value: Mapping[str, Any], version: int) -> "CompactionState":
        horizon = value.get("horizon")
        details = value.get("details")
        return cls(
            topic,
            _int_or_none(value.get("compactedLedgerId")),
            None if horizon is None else Position(int(horizon[0]), int(horizon[1])),
            str(value.get("status") or NOT_RUN),
            value.get("lastError"),
            _int_or_none(value.get("startedMs")),
            _int_or_none(value.get("lastSuccessMs")),
            _int_or_none(value.get("lastFailureMs")),
            _int_or_none(value.get("lastDurationMs")),
            int(value.get("removedEventCount") or 0),
            version,
            _int_or_none(value.get("detailsOf")),
            dict(details) if isinstance(details, dict) else {},
        )

    def moved(self, **changes: Any) -> "CompactionState":
        """A copy with ``changes`` (the status change must be in ``TRANSITIONS``)."""
        status = changes.get("status")
        if status is not None and status != ERROR and (self.status, status) not in TRANSITIONS:
            raise Conflict(f"compaction of {self.topic}: no transition from {self.status} to {status}")
        values = {**self.__dict__, **changes}
        return CompactionState(**values)


def _int_or_none(value: Any) -> Optional[int]:
    return None if value is None else int(value)


class CompactionStates:
    """Reads and compare-and-set writes of topics' compaction states (module docstring).

    ``clock`` returns milliseconds since the epoch (tests pass a fake one)."""

    def __init__(self, resources: CompactionStateResources, clock: Optional[Callable[[], int]] = None):
        self.resources = resources
        self.clock = clock or (lambda: int(time.time() * 1000))

    def get(self, topic: str) -> CompactionState:
        name = canonical(topic)
        got = self.resources.get(TopicName.parse(name))
        if got is None:
            return CompactionState(name)
        return CompactionState.from_json(name, got[0], got[1])

    def all(self) -> dict[str, CompactionState]:
        """Every topic that has a state (sorted by name)."""
        return {str(t): self.get(str(t)) for t in self.resources.list_topics()}

    def _put(self, state: CompactionState, expected_version: int) -> CompactionState:
        version = self.resources.put(TopicName.parse(state.topic), state.to_json(), expected_version)
        return state.moved(version=version)

    def mark_running(
        self, topic: str, expected_version: int, started_ms: Optional[int] = None
    ) -> CompactionState:
        """A run starts from the state it read at ``expected_version``.

        Raises:
            Conflict: the state moved on since (another run got there first).
        """
        state = self.get(topic)
        if state.version != expected_version:
            raise Conflict(
                f"compaction state of {state.topic} changed since it was read: another run started"
            )
        running = state.moved(status=RUNNING, started_ms=self.clock() if started_ms is None else started_ms)
        try:
            return self._put(running, expected_version)
        except BadVersion:
            raise Conflict(f"compaction state of {state.topic} changed: another run started") from None

    def record_empty(
        self, topic: str, expected_version: int, duration_ms: Optional[int] = None
    ) -> CompactionState:
        """A run found nothing to compact (an empty topic never compacted): SUCCESS with no view.

        Pulsar leaves such a topic at NOT_RUN, which reads as "never triggered"; an operator who
        triggered it should see that it ran (NOT_RUN -> RUNNING -> SUCCESS).

        Raises:
            StaleCompaction: the state moved on since the run marked it RUNNING.
        """
        state = self._still_mine(topic, expected_version)
        done = state.moved(
            status=SUCCESS,
            last_error=None,
            last_success_ms=self.clock(),
            last_duration_ms=duration_ms,
            removed_event_count=0,
        )
        try:
            return self._put(done, expected_version)
        except BadVersion:
            raise StaleCompaction(f"compaction state of {state.topic} changed during the run") from None

    def commit(
        self,
        topic: str,
        view_id: int,
        horizon,
        *,
        expected_version: int,
        stats: Optional[Mapping[str, Any]] = None,
        details: Optional[Mapping[str, Any]] = None,
        fence: Fence = NO_FENCE,
    ) -> tuple[Optional[int], CompactionState]:
        """Make ``view_id`` with ``horizon`` the topic's compacted view: status SUCCESS,
        ``last_success_ms`` (``stats["finished_ms"]`` or now), ``last_duration_ms`` and
        ``removed_event_count`` from ``stats``, ``details`` (None keeps the previous ones).

        Returns:
            the previous view's id (the caller deletes it after this returns) and the new state.
        Raises:
            StaleCompaction: the state is no longer at ``expected_version`` (a stale job, a
                deposed owner), or the horizon would move backwards; nothing was written.
            Fenced: ``fence`` (the topic's ownership when the run started) no longer holds:
                the owner changed during the run; nothing was written.
        """
        stats = dict(stats or {})
        state = self._still_mine(topic, expected_version)
        previous = state.compacted_ledger_id
        new = state.moved(
            compacted_ledger_id=int(view_id),
            horizon=Position(*horizon),
            status=SUCCESS,
            last_error=None,
            last_success_ms=int(stats.get("finished_ms", self.clock())),
            last_duration_ms=stats.get("duration_ms"),
            removed_event_count=int(stats.get("removed_event_count", 0)),
        )
        if details is not None:
            new = new.moved(details_of=int(view_id), details=dict(details))
        try:
            version = self.resources.commit_view(
                TopicName.parse(new.topic), new.to_json(), expected_version, fence
            )
        except BadVersion:
            raise StaleCompaction(
                f"compaction of {new.topic}: the state changed since this run started; its view is not committed"
            ) from None
        return previous, new.moved(version=version)

    def record_failure(
        self,
        topic: str,
        error: str,
        *,
        expected_version: Optional[int] = None,
        duration_ms: Optional[int] = None,
    ) -> Optional[CompactionState]:
        """The run failed; the view in force and its horizon stay.

        ``expected_version``: the version of the state the failing run holds (its RUNNING write,
        or what a caller read before deciding the run was interrupted); when the state moved on
        since, nothing is written and None is returned (a stale run's failure is not news).
        Without it the failure is recorded on whatever the state is now."""
        for _ in range(_ATTEMPTS):
            state = self.get(topic)
            if expected_version is not None and state.version != expected_version:
                log.info("not recording a stale failure of %s's compaction: %s", state.topic, error)
                return None
            failed = state.moved(
                status=ERROR, last_error=error, last_failure_ms=self.clock(), last_duration_ms=duration_ms
            )
            try:
                return self._put(failed, state.version)
            except BadVersion:
                if expected_version is not None:
                    return None
        raise Conflict(f"compaction state of {canonical(topic)}: still contended")

    def delete(self, topic: str) -> None:
        self.resources.delete(TopicName.parse(canonical(topic)))

    def _still_mine(self, topic: str, expected_version: int) -> CompactionState:
        state = self.get(topic)
        if state.version != expected_version:
            raise StaleCompaction(
                f"compaction of {state.topic}: the state is at version {state.version}, not "
                f"{expected_version} (another run or owner moved it on); nothing is committed"
            )
        return state


def advance_hold(storage, topic: str, horizon) -> None:
    """Move the topic's retention hold for compaction (the ``__compaction`` durable cursor) to a
    committed ``horizon``, so retention may trim what the view now summarises.

    After the commit, not with it: a hold behind the horizon only keeps more, so a crash in
    between is harmless (the next commit moves it). A read-only ``compact-topic`` job writes it to
    the metadata store; the broker's retention reads it from there before it decides."""
    from ..errors import CompactMQError
    from . import COMPACTION_CURSOR

    try:
        ml = storage.open_managed_ledger(topic, create=False)
        ml.open_cursor(COMPACTION_CURSOR, True, "earliest").ack_cumulative(Position(*horizon))
    except CompactMQError as e:  # the topic is gone meanwhile: nothing left to hold
        log.warning("moving the compaction hold of %s failed: %s", topic, e)


def states_of(storage) -> CompactionStates:
    """The compaction states of ``storage``'s metadata store (its clock, for timestamps)."""
    clock = getattr(getattr(storage, "metadata", None), "now_ms", None)
    return CompactionStates(storage.resources.compaction, clock)
