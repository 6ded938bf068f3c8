"""What a managed ledger asks of the metadata store, and nothing more.

A managed ledger keeps two kinds of facts outside its ledger bytes: the list of its ledgers
(each OPEN while written, CLOSED with its final numbers once sealed) and its durable cursors
(a mark-delete position, the acknowledged ranges after it, properties). It also reads two
policies (retention time and size). ``LedgerMetadata`` names exactly these calls, so that the
parts of a managed ledger (recovery, appender, cursors, retention) depend on this small typed
contract rather than on one concrete store: ``resources.topic_metadata.TopicMetadata`` (typed
resources over the metadata store, embedded or ZooKeeper) is the one a ``Storage`` hands out.

Semantics every implementation keeps:

* ``add_ledger(topic, created_ms, close=info)`` records a new ledger OPEN and, in the SAME
  atomic change, ``info``'s ledger CLOSED with its final numbers (a rollover is one commit);
* ``transaction()`` groups calls made inside it into one atomic change (nested calls join);
* ``ledgers(topic)`` lists ledgers in id order (ids grow with creation);
* cursor records carry ``name``, ``mark_delete``, ``acked_ranges`` and ``properties``.
"""

from __future__ import annotations

from typing import Any, ContextManager, Mapping, Protocol, Sequence

from .position import LedgerInfo, Position


class StoredCursor(Protocol):
    """A durable cursor as the metadata store returns it."""

    @property
    def name(self) -> str: ...

    @property
    def mark_delete(self) -> Position: ...

    @property
    def acked_ranges(self) -> bytes: ...

    @property
    def properties(self) -> Mapping[str, Any]: ...


class LedgerMetadata(Protocol):
    """The metadata calls of a managed ledger (see the module docstring for their meaning)."""

    def ledgers(self, topic: str) -> Sequence[LedgerInfo]:
        """Every ledger of ``topic``, oldest first."""
        ...

    def add_ledger(self, topic: str, created_ms: int, close: LedgerInfo | None = None) -> int:
        """A new ledger id, recorded OPEN (and ``close`` recorded CLOSED, atomically)."""
        ...

    def close_ledger(self, info: LedgerInfo) -> None:
        """Record a ledger CLOSED with the numbers in ``info``."""
        ...

    def delete_ledgers(self, topic: str, ledger_ids: list[int]) -> None:
        """Forget ledgers (their bytes are deleted after this returns)."""
        ...

    def load_cursors(self, topic: str) -> Sequence[StoredCursor]:
        """Every durable cursor of ``topic``."""
        ...

    def get_cursor(self, topic: str, name: str) -> StoredCursor | None: ...

    def save_cursor(
        self,
        topic: str,
        name: str,
        mark_delete: Position,
        acked_ranges: bytes,
        properties: Mapping[str, Any] | None = None,
    ) -> None:
        """Insert or replace a durable cursor."""
        ...

    def delete_cursor(self, topic: str, name: str) -> bool: ...

    def effective_policy(self, topic: str, key: str, default: Any = None) -> Any:
        """The topic's policy, else its namespace's, else ``default``."""
        ...

    def transaction(self) -> ContextManager[Any]:
        """Calls made inside are one atomic change."""
        ...
