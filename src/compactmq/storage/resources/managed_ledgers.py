"""The managed-ledger info of each topic and its cursors (Pulsar's layout)::

    /managed-ledgers/{tenant}/{namespace}/persistent/{topic}            the ledger list and properties
    /managed-ledgers/{tenant}/{namespace}/persistent/{topic}/{cursor}   one cursor's position

A topic exists when its managed-ledger key does (as Pulsar's ``TopicResources``). The values are
JSON objects whose fields belong to the managed ledger; this module only stores them.

Writes are fenced by version: the owner of a topic keeps the version of its last write and passes
it as ``expected_version``; a ``BadVersion`` then means someone else wrote the ledger list (the
owner was deposed, or a second process opened the topic) and the owner must stop, not retry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...errors import InvalidInput, NotFound
from ...naming import TopicName
from ..metadata_store import Delete, KeyNotFound, Put
from .base import BaseResources, Json, dumps, encode_segment, loads

if TYPE_CHECKING:  # pragma: no cover
    from .fence import Fence

MANAGED_LEDGERS_ROOT = "/managed-ledgers"


def managed_ledger_path(topic: TopicName) -> str:
    if not topic.persistent:
        raise InvalidInput(f"{topic} is not persistent: it has no managed ledger")
    return "/".join(
        (MANAGED_LEDGERS_ROOT, encode_segment(topic.tenant), encode_segment(topic.namespace), "persistent",
         encode_segment(topic.local_name))
    )  # fmt: skip


class ManagedLedgerResources(BaseResources):
    # --- the ledger list ---------------------------------------------------------------------

    def create(self, topic: TopicName, info: Json) -> int:
        """Create the topic's managed ledger; returns its version (``AlreadyExists`` if it exists)."""
        return self._create(managed_ledger_path(topic), info, f"topic {topic}").version

    def get(self, topic: TopicName) -> tuple[Json, int] | None:
        """The info and its version, or None when the topic does not exist."""
        return self._read(managed_ledger_path(topic))

    def put(self, topic: TopicName, info: Json, expected_version: int) -> int:
        """Replace the info if it is still at ``expected_version``; returns the new version.

        Raises:
            BadVersion: another writer changed it (this writer is fenced out).
        """
        return self.store.put(managed_ledger_path(topic), dumps(info), expected_version).version

    def exists(self, topic: TopicName) -> bool:
        return self.store.exists(managed_ledger_path(topic))

    def delete(self, topic: TopicName, expected_version: int | None = None) -> None:
        """Delete the topic's managed ledger and all its cursors in one commit."""
        path = managed_ledger_path(topic)
        cursors = self.store.get_children(path)
        ops = [Delete(f"{path}/{c}") for c in cursors] + [Delete(path, expected_version)]
        try:
            self.store.commit(ops)
        except KeyNotFound:
            raise NotFound(f"topic {topic} does not exist") from None

    def list_topics(self, namespace: str) -> list[TopicName]:
        tenant, _, ns = namespace.partition("/")
        root = f"{MANAGED_LEDGERS_ROOT}/{encode_segment(tenant)}/{encode_segment(ns)}/persistent"
        return [TopicName("persistent", tenant, ns, name) for name in self._children(root)]

    # --- cursors -----------------------------------------------------------------------------

    def _cursor_path(self, topic: TopicName, cursor: str) -> str:
        if not cursor:
            raise InvalidInput("a cursor name is not empty")
        return f"{managed_ledger_path(topic)}/{encode_segment(cursor)}"

    def get_cursor(self, topic: TopicName, cursor: str) -> tuple[Json, int] | None:
        got = self.store.get(self._cursor_path(topic, cursor))
        return None if got is None else (loads(got.value, got.stat.path), got.stat.version)

    def put_cursor(
        self,
        topic: TopicName,
        cursor: str,
        info: Json,
        expected_version: int | None = None,
        fence: "Fence | None" = None,
    ) -> int:
        """Create or replace a cursor (``expected_version``: ``NEW`` to create, n to fence);
        ``fence``: the topic's ownership fence, committed with the write (``resources.fence``).

        The topic must exist: a cursor is never created beside a deleted topic.
        """
        if not self.exists(topic):
            raise NotFound(f"topic {topic} does not exist")
        path = self._cursor_path(topic, cursor)
        if fence is None or not (fence.checks or fence.lost):
            return self.store.put(path, dumps(info), expected_version).version
        stat = fence.commit(self.store, [Put(path, dumps(info), expected_version)])[0]
        assert stat is not None
        return stat.version

    def delete_cursor(self, topic: TopicName, cursor: str) -> None:
        self._delete(self._cursor_path(topic, cursor), f"cursor {cursor} of {topic}")

    def list_cursors(self, topic: TopicName) -> list[str]:
        return self._children(managed_ledger_path(topic))
