"""The compaction state of each topic, owned by the compaction service (PIP-278)::

    /compaction/{tenant}/{namespace}/persistent/{topic}

A JSON object: ``status`` (NOT_RUN, RUNNING, SUCCESS, ERROR), ``horizon`` ([ledger, entry] of
the last message the last successful run read, or null), ``compactedLedgerId`` (the compacted
view), error and timing fields (``lastError``, ``startedMs``, ``lastSuccessMs``,
``lastFailureMs``, ``lastDurationMs``, ``removedEventCount``), and what the run that committed
view ``detailsOf`` recorded of it (``details``). ``compaction.state`` reads and writes it; this
module only stores it. Pulsar keeps the horizon and compacted ledger in the
``__compaction`` cursor's properties; we keep them apart so the service alone owns them.

Every change is a compare-and-set on the version the writer read. A compaction job reads the
state (and its version) when it starts and commits its new view with that version: if anything
changed the state meanwhile -- another job committed, an owner took the topic over -- the commit
fails with ``BadVersion`` instead of overwriting a newer view. ``commit_view`` also refuses a
horizon lower than the current one, whoever writes it, so the compacted view never moves
backwards (apache/pulsar#26486) even for a writer holding the right version.
"""

from __future__ import annotations

from ...errors import Conflict
from ...naming import TopicName
from ..metadata_store import NEW, BadVersion, Put
from .base import BaseResources, Json, dumps, encode_segment
from .fence import NO_FENCE, Fence
from .managed_ledgers import managed_ledger_path

COMPACTION_ROOT = "/compaction"


class StaleCompaction(Conflict):
    """A compacted view whose horizon is below the one already committed."""


def _path(topic: TopicName) -> str:
    return COMPACTION_ROOT + managed_ledger_path(topic).removeprefix("/managed-ledgers")


def _horizon(state: Json) -> tuple[int, int] | None:
    horizon = state.get("horizon")
    return None if horizon is None else (int(horizon[0]), int(horizon[1]))


def legacy_state(row: dict) -> Json:
    """The state a row of the old ``compaction_state`` table (with its ``compaction_details``)
    becomes, in this module's format (``resources.legacy_import``)."""
    horizon = None
    if row.get("horizon_ledger") is not None:
        horizon = [int(row["horizon_ledger"]), int(row["horizon_entry"])]
    return {
        "status": row.get("status") or "NOT_RUN",
        "compactedLedgerId": row.get("compacted_ledger_id"),
        "horizon": horizon,
        "lastError": row.get("last_error"),
        "startedMs": row.get("started_ms"),
        "lastSuccessMs": row.get("last_success_ms"),
        "lastFailureMs": row.get("last_failure_ms"),
        "lastDurationMs": row.get("last_duration_ms"),
        "removedEventCount": int(row.get("removed_event_count") or 0),
        "detailsOf": row.get("details_view_id"),
        "details": dict(row.get("details") or {}),
    }


def compaction_state_path(topic: TopicName) -> str:
    return _path(topic)


class CompactionStateResources(BaseResources):
    def get(self, topic: TopicName) -> tuple[Json, int] | None:
        """The state and its version, or None when the topic was never compacted."""
        return self._read(_path(topic))

    def put(self, topic: TopicName, state: Json, expected_version: int) -> int:
        """Compare-and-set of the whole state (``NEW``: the first state); returns the new version."""
        return self.store.put(_path(topic), dumps(state), expected_version).version

    def commit_view(
        self, topic: TopicName, state: Json, expected_version: int, fence: Fence = NO_FENCE
    ) -> int:
        """Make ``state``'s compacted view current, if the state is still at ``expected_version``
        and its horizon does not move backwards, in one commit with ``fence``'s ownership checks
        (``resources.fence``: the epoch the run started under).

        Raises:
            BadVersion: the state changed since the caller read it (a stale job or owner).
            StaleCompaction: the new horizon is below the committed one.
            Fenced: the ownership the run started under is over (nothing is written).
        """
        path = _path(topic)
        current = self._read(path)
        version = NEW if current is None else current[1]
        if version != expected_version:
            raise BadVersion(f"compaction state of {topic} is at version {version}, not {expected_version}")
        new, old = _horizon(state), None if current is None else _horizon(current[0])
        if old is not None and (new is None or new < old):
            raise StaleCompaction(f"compacted view of {topic} would move back from horizon {old} to {new}")
        stat = fence.commit(self.store, [Put(path, dumps(state), expected_version)])[0]
        assert stat is not None
        return stat.version

    def delete(self, topic: TopicName) -> None:
        if self.store.exists(_path(topic)):
            self._delete(_path(topic), f"compaction state of {topic}")

    def view_of(self, topic: TopicName) -> int | None:
        """The id of the compacted view in force (``compactedLedgerId``), or None: what storage's
        offload catalog needs to tell a live compacted object from a dead one."""
        got = self.get(topic)
        view = None if got is None else got[0].get("compactedLedgerId")
        return None if view is None else int(view)

    def list_topics(self) -> list[TopicName]:
        """Every topic that has a compaction state, sorted by name."""
        found = []
        for tenant in self._children(COMPACTION_ROOT):
            tenant_path = f"{COMPACTION_ROOT}/{encode_segment(tenant)}"
            for ns in self._children(tenant_path):
                root = f"{tenant_path}/{encode_segment(ns)}/persistent"
                found += [TopicName("persistent", tenant, ns, name) for name in self._children(root)]
        return sorted(found, key=str)
