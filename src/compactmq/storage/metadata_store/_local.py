"""The store's semantics for data this process can lock: shared by ``memory:`` and ``sqlite:``.

Both keep a table of nodes (path -> value, version, times, owning session, sequence counter) and
differ only in where it lives. ``LocalMetadataStore`` implements every rule of the contract once,
on a ``NodeTable``: one transaction's view of the nodes, which the implementation commits as a
whole or rolls back (a lock and an undo log in memory; ``BEGIN IMMEDIATE`` in SQLite). A ``commit``
of many ops is then just the single-op code run in a loop inside one transaction: the first
failing op raises, the transaction rolls back, nothing changed.

Invariant kept by every write: a node's ancestors all exist (a put creates missing ones, a delete
refuses a node with children), so ensuring a parent is one lookup when it already exists.
The root ``/`` is a real node, invisible to callers, that carries the sequence counter of the
top-level keys.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace

from . import (
    NEW,
    SEQUENCE_DIGITS,
    BadVersion,
    Check,
    Delete,
    GetResult,
    InvalidPath,
    KeyNotFound,
    MetadataStore,
    NotEmpty,
    Notification,
    NotificationType,
    Op,
    Put,
    SessionListener,
    Stat,
    StoreUnavailable,
    Watch,
    WatchCallback,
    check_ops,
    check_value,
    parent_of,
    validate_path,
)
from ._notify import Notifier

CREATED, MODIFIED = NotificationType.CREATED, NotificationType.MODIFIED
DELETED, CHILDREN = NotificationType.DELETED, NotificationType.CHILDREN_CHANGED


@dataclass(frozen=True)
class Node:
    value: bytes
    version: int
    created_ms: int
    modified_ms: int
    #: the session owning an ephemeral node; None for a persistent one
    session: int | None = None
    #: the next counter of a sequential put under this node
    next_seq: int = 0


class NodeTable(abc.ABC):
    """One transaction's view of the nodes; ``notifications`` collects what the transaction did."""

    def __init__(self) -> None:
        self.notifications: list[Notification] = []

    @abc.abstractmethod
    def get(self, path: str) -> Node | None: ...

    @abc.abstractmethod
    def children(self, path: str) -> list[str]:
        """Child names, any order."""

    @abc.abstractmethod
    def write(self, path: str, node: Node, parent: str) -> None:
        """Insert or replace ``path``."""

    @abc.abstractmethod
    def remove(self, path: str) -> None: ...

    @abc.abstractmethod
    def owned_by(self, session: int) -> list[str]:
        """Paths of the ephemeral nodes of ``session``."""


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class LocalMetadataStore(MetadataStore):
    """The contract on a ``NodeTable``; subclasses say where the nodes live and how to lock them."""

    def __init__(self, name: str):
        self._notifier = Notifier(name)
        self._closed = False

    # --- what a subclass provides ----------------------------------------------------------------

    @property
    @abc.abstractmethod
    def session(self) -> int:
        """This store's current session id."""

    @abc.abstractmethod
    def _transaction(self, durable: bool) -> AbstractContextManager[NodeTable]:
        """A transaction: commit when the block ends, roll back when it raises. ``durable``: the
        change touches persistent keys, so it must be on disk before this returns."""

    @abc.abstractmethod
    def _read(self) -> AbstractContextManager[NodeTable]:
        """A consistent read-only view."""

    def _published(self, notifications: list[Notification]) -> None:
        """Tell every store on the same data (by default only this one) what a commit changed."""
        self._notifier.publish(notifications)

    # --- the contract ------------------------------------------------------------------------

    def get(self, path: str) -> GetResult | None:
        validate_path(path)
        with self._read() as nodes:
            node = nodes.get(path)
        return None if node is None else GetResult(node.value, self._stat(path, node))

    def exists(self, path: str) -> bool:
        validate_path(path, root_ok=True)
        with self._read() as nodes:
            return nodes.get(path) is not None

    def get_children(self, path: str) -> list[str]:
        validate_path(path, root_ok=True)
        with self._read() as nodes:
            return sorted(nodes.children(path))

    def put(self, path, value, expected_version=None, *, ephemeral=False, sequential=False) -> Stat:
        validate_path(path)
        value = check_value(value)
        if sequential and expected_version not in (None, NEW):
            raise ValueError("a sequential put creates a new key: expected_version must be None or NEW")
        with self._mutate(durable=not ephemeral) as nodes:
            return self._put(nodes, path, value, expected_version, ephemeral, sequential)

    def delete(self, path: str, expected_version: int | None = None) -> None:
        validate_path(path)
        with self._mutate(durable=True) as nodes:
            self._delete(nodes, path, expected_version)

    def commit(self, ops: Sequence[Op]) -> list[Stat | None]:
        ops = check_ops(ops)
        durable = not all(isinstance(op, Put) and op.ephemeral for op in ops)
        results: list[Stat | None] = []
        with self._mutate(durable=durable) as nodes:
            for op in ops:
                if isinstance(op, Put):
                    results.append(
                        self._put(nodes, op.path, op.value, op.expected_version, op.ephemeral, False)
                    )
                elif isinstance(op, Delete):
                    self._delete(nodes, op.path, op.expected_version)
                    results.append(None)
                else:
                    self._check(nodes, op)
                    results.append(None)
        return results

    def watch(self, path: str, callback: WatchCallback) -> Watch:
        validate_path(path, root_ok=True)
        return self._notifier.add_watch(path, callback)

    def register_session_listener(self, listener: SessionListener) -> None:
        self._notifier.add_session_listener(listener)

    # --- the rules ---------------------------------------------------------------------------

    def _mutate(self, durable: bool) -> AbstractContextManager[NodeTable]:
        if self._closed:
            raise StoreUnavailable("the metadata store is closed")
        return _Publishing(self, self._transaction(durable))

    def _stat(self, path: str, node: Node) -> Stat:
        return Stat(
            path=path,
            version=node.version,
            created_ms=node.created_ms,
            modified_ms=node.modified_ms,
            ephemeral=node.session is not None,
            created_by_self=node.session is not None and node.session == self.session,
        )

    def _put(self, nodes, path, value, expected, ephemeral, sequential) -> Stat:
        parent = parent_of(path)
        now = now_ms()
        parent_node = self._ensure_parent(nodes, parent, now)
        if sequential:
            nodes.write(parent, replace(parent_node, next_seq=parent_node.next_seq + 1), parent_of(parent))
            path = f"{path}{parent_node.next_seq:0{SEQUENCE_DIGITS}d}"
        node = nodes.get(path)
        if expected == NEW and node is not None:
            raise BadVersion(f"{path} already exists (version {node.version})")
        if expected is not None and expected >= 0 and (node is None or node.version != expected):
            found = "missing" if node is None else f"at version {node.version}"
            raise BadVersion(f"{path} is {found}, not at version {expected}")
        if expected is not None and expected < NEW:
            raise BadVersion(f"expected version {expected} of {path}: -1 or >= 0 only")
        if node is None:
            new = Node(value, 0, now, now, self.session if ephemeral else None)
            nodes.notifications += [Notification(CREATED, path), Notification(CHILDREN, parent)]
        else:
            new = replace(node, value=value, version=node.version + 1, modified_ms=now)
            nodes.notifications.append(Notification(MODIFIED, path))
        nodes.write(path, new, parent)
        return self._stat(path, new)

    def _ensure_parent(self, nodes: NodeTable, parent: str, now: int) -> Node:
        """The parent node, created (with its missing ancestors) as empty persistent keys."""
        node = nodes.get(parent)
        if node is None:
            grandparent = parent_of(parent)
            self._ensure_parent(nodes, grandparent, now)
            node = Node(b"", 0, now, now)
            nodes.write(parent, node, grandparent)
            nodes.notifications += [Notification(CREATED, parent), Notification(CHILDREN, grandparent)]
        elif node.session is not None:
            raise InvalidPath(f"{parent} is ephemeral: ephemeral keys cannot have children")
        return node

    def _delete(self, nodes: NodeTable, path: str, expected: int | None) -> None:
        node = nodes.get(path)
        if node is None:
            raise KeyNotFound(f"{path} does not exist")
        if expected is not None and node.version != expected:
            raise BadVersion(f"{path} is at version {node.version}, not {expected}")
        if nodes.children(path):
            raise NotEmpty(f"{path} has children")
        nodes.remove(path)
        nodes.notifications += [Notification(DELETED, path), Notification(CHILDREN, parent_of(path))]

    def _check(self, nodes: NodeTable, op: Check) -> None:
        node = nodes.get(op.path)
        if node is None or node.version != op.version:
            found = "missing" if node is None else f"at version {node.version}"
            raise BadVersion(f"{op.path} is {found}, not at version {op.version}")

    def _end_session(self, nodes: NodeTable, session: int) -> None:
        """Delete the ephemeral keys of ``session`` (inside the caller's transaction)."""
        for path in sorted(nodes.owned_by(session), reverse=True):
            nodes.remove(path)
            nodes.notifications += [Notification(DELETED, path), Notification(CHILDREN, parent_of(path))]


class _Publishing(AbstractContextManager):
    """Wraps a transaction: after it committed, publish its notifications."""

    def __init__(self, store: LocalMetadataStore, txn: AbstractContextManager[NodeTable]):
        self._store = store
        self._txn = txn
        self._nodes: NodeTable | None = None

    def __enter__(self) -> NodeTable:
        self._nodes = self._txn.__enter__()
        return self._nodes

    def __exit__(self, *exc) -> bool | None:
        suppressed = self._txn.__exit__(*exc)
        if exc[0] is None and self._nodes is not None and self._nodes.notifications:
            self._store._published(self._nodes.notifications)
        return suppressed
