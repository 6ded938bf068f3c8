"""Building one ZooKeeper ``multi`` from a commit's ops (``zookeeper.ZKMetadataStore.commit``).

A commit's ops do not map one to one onto ZooKeeper's: a ``Put`` whose parents are missing
creates them inside the multi (all-or-nothing too), and an unversioned ``Put`` becomes a
``create`` or a ``set`` at the version just read. Knowing which needs reads of the server, and
they are what made a commit slow: read one key at a time, a commit of n puts waited for up to
2n round trips before its multi. ``_Multi.prefetch`` sends them together (one round trip, a
second only for parents of missing parents), and ``_ParentCache`` remembers the parents this
store saw exist, so a steady writer (the group flush's range records, always under the same
ledger nodes) reads nothing at all. The cache is a hint: another client may delete a remembered
parent; the multi then fails on the create under it, which is retried with reads (the op is
*guessed*), never reported as the caller's failure. The multi itself checks everything it
relies on, as before.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from . import NEW, Check, Delete, Put, parent_of

if TYPE_CHECKING:  # pragma: no cover
    from .zookeeper import ZKMetadataStore


class _ParentCache:
    """Keys a store saw exist as parents (at most ``limit``; when full it starts again). A hint
    only: a commit that relied on one and failed forgets it and reads again. Thread-safe."""

    def __init__(self, limit: int = 10_000) -> None:
        self._keys: set[str] = set()
        self._lock = threading.Lock()
        self._limit = limit

    def has(self, path: str) -> bool:
        return path in self._keys

    def remember(self, paths) -> None:
        with self._lock:
            for p in paths:
                if len(self._keys) >= self._limit:
                    self._keys.clear()
                self._keys.add(p)

    def forget(self, paths) -> None:
        with self._lock:
            self._keys.difference_update(paths)


class _Multi:
    """One ZooKeeper ``multi`` being built from the caller's ops.

    Missing parents are created inside the multi (so they are all-or-nothing too), which means
    ZooKeeper's operations do not line up with the caller's: ``owners`` maps each operation to the
    caller's op (None for a parent create), ``index_of`` the other way. ``known`` is the existence
    of paths as the ops so far leave them; ``guessed`` holds operations built from a read (an
    unversioned put became create or set-at-version) or from a remembered parent, which may
    lose a race and be retried.
    """

    def __init__(self, store: ZKMetadataStore):
        self.store = store
        self.txn = store._zk.transaction()
        self.owners: list[int | None] = []
        self.index_of: dict[int, int] = {}
        self.guessed: set[int] = set()
        self.known: dict[str, bool] = {}
        self.server: dict[str, Any] = {}  # path -> its stat as read before the multi (None: absent)
        self.remembered: set[str] = set()  # parents taken from the store's cache, not read
        self.created: list[str] = []  # parents the multi creates
        self.deleted: list[str] = []  # keys the multi deletes

    def _push(self, owner: int | None) -> None:
        if owner is not None:
            self.index_of[owner] = len(self.owners)
        self.owners.append(owner)

    def prefetch(self, ops) -> None:
        """Read at once what ``add`` would read one key at a time: each unversioned Put's own
        key, each Put's parent (unless the store remembers it exists: ``_ParentCache``), then,
        level by level, the parents of parents found missing. A commit of n puts thus waits
        for one or two round trips before its multi, or none, not up to 2n in a row (a group
        flush's commit spent ~90 % of its time in those reads with 30 topics publishing:
        bench/results/cluster_many_ab_*_clusterperf.json). Only reads move earlier or go: the
        multi checks what it relies on, as before (a lost race retries the commit)."""
        own = {op.path for op in ops if isinstance(op, Put) and op.expected_version is None}
        ask, put_before = set(own), set()
        for op in ops:
            parent = parent_of(op.path) if isinstance(op, Put) else "/"
            if isinstance(op, Put):
                put_before.add(op.path)
            if parent == "/" or parent in own or parent in put_before:
                continue  # the root, a key read anyway, or one an earlier op of the multi makes
            if self.store._parents.has(parent):
                self.remembered.add(parent)
            else:
                ask.add(parent)
        while ask:
            paths = sorted(ask)
            zk, full = self.store._zk, self.store._full
            got = self.store._call_all([(zk.exists_async(full(p)), p) for p in paths])
            self.server.update(zip(paths, got))
            self.store._parents.remember([p for p, zstat in zip(paths, got) if zstat is not None])
            ask = {parent_of(p) for p, zstat in zip(paths, got) if zstat is None} - {"/"}
            ask -= self.server.keys() | self.remembered

    def applied(self) -> None:
        """The multi went through: its created parents exist, its deleted keys do not."""
        self.store._parents.forget(self.deleted)
        self.store._parents.remember(self.created)

    def failed(self) -> None:
        """The multi failed: the parents taken from the cache are read at the next attempt."""
        self.store._parents.forget(self.remembered)

    def _exists(self, path: str):
        if path in self.server:
            return self.server[path]
        if path in self.remembered:
            return True
        return self.store._call(self.store._zk.exists_async(self.store._full(path)), path)

    def add(self, i: int, op) -> None:
        full = self.store._full(op.path)
        if isinstance(op, Check):
            self.txn.check(full, op.version)
        elif isinstance(op, Delete):
            self.txn.delete(full, -1 if op.expected_version is None else op.expected_version)
            self.known[op.path] = False
            self.deleted.append(op.path)
        else:
            if self._add_parents(op.path):
                self.guessed.add(len(self.owners))  # under a remembered parent: may be gone
            if op.expected_version == NEW:
                self.txn.create(full, op.value, ephemeral=op.ephemeral)
            elif op.expected_version is not None:
                self.txn.set_data(full, op.value, op.expected_version)
            else:
                self.guessed.add(len(self.owners))
                zstat = None if self.known.get(op.path) is False else self._exists(op.path)
                if zstat is None:
                    self.txn.create(full, op.value, ephemeral=op.ephemeral)
                else:
                    self.txn.set_data(full, op.value, zstat.version)
            self.known[op.path] = True
        self._push(i)

    def _add_parents(self, path: str) -> bool:
        """Create the missing parents of ``path`` in the multi; True when the first one that
        exists was taken from the store's cache of parents (a guess: the multi may fail on it)."""
        missing = []
        parent = parent_of(path)
        while parent != "/":
            if parent not in self.known:
                self.known[parent] = self._exists(parent) is not None
            if self.known[parent]:
                break
            missing.append(parent)
            parent = parent_of(parent)
        for p in reversed(missing):
            self.txn.create(self.store._full(p), b"")
            self.known[p] = True
            self.created.append(p)
            self._push(None)
        return parent in self.remembered
