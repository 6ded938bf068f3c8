"""``memory:`` -- the metadata store in this process's memory, for tests (Pulsar has the same).

``memory:`` or ``memory:local`` is a private data set. Any other name (``memory:cluster-a``) is
shared by every store opened on it in this process while one of them is open, each store with its
own session: closing one deletes its ephemeral keys and the others' watches see it, which is how
tests play several brokers on one ZooKeeper without a ZooKeeper.

A data set is a dict of nodes plus a dict of child-name sets, under one lock; a transaction keeps
an undo log and replays it backwards when an op fails.
"""

from __future__ import annotations

import re
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ...errors import InvalidConfiguration
from . import Notification, parent_of
from ._local import LocalMetadataStore, Node, NodeTable, now_ms

_NAME = re.compile(r"[A-Za-z0-9_.-]{0,64}")


class _DataSet:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.nodes: dict[str, Node] = {"/": Node(b"", 0, now_ms(), now_ms())}
        self.children: dict[str, set[str]] = {"/": set()}
        self.next_session = 1
        self.stores: weakref.WeakSet[MemoryMetadataStore] = weakref.WeakSet()


#: shared data sets by name, alive while a store holds them
_SHARED: weakref.WeakValueDictionary[str, _DataSet] = weakref.WeakValueDictionary()
_SHARED_LOCK = threading.Lock()


class _MemoryTable(NodeTable):
    def __init__(self, data: _DataSet):
        super().__init__()
        self._data = data
        self.undo: list[tuple[str, Node | None]] = []

    def get(self, path: str) -> Node | None:
        return self._data.nodes.get(path)

    def children(self, path: str) -> list[str]:
        return list(self._data.children.get(path, ()))

    def write(self, path: str, node: Node, parent: str) -> None:
        old = self._data.nodes.get(path)
        self.undo.append((path, old))
        self._data.nodes[path] = node
        if old is None:
            self._data.children.setdefault(path, set())
            self._data.children.setdefault(parent, set()).add(path.rsplit("/", 1)[1])

    def remove(self, path: str) -> None:
        self.undo.append((path, self._data.nodes.pop(path)))
        self._data.children.pop(path, None)
        self._data.children[parent_of(path)].discard(path.rsplit("/", 1)[1])

    def owned_by(self, session: int) -> list[str]:
        return [p for p, n in self._data.nodes.items() if n.session == session]

    def roll_back(self) -> None:
        for path, old in reversed(self.undo):
            if old is None:
                self._data.nodes.pop(path, None)
                self._data.children.pop(path, None)
                self._data.children[parent_of(path)].discard(path.rsplit("/", 1)[1])
            else:
                if path not in self._data.nodes:
                    self._data.children.setdefault(path, set())
                    self._data.children.setdefault(parent_of(path), set()).add(path.rsplit("/", 1)[1])
                self._data.nodes[path] = old


class MemoryMetadataStore(LocalMetadataStore):
    def __init__(self, name: str = ""):
        super().__init__(f"memory:{name}")
        if name in ("", "local"):
            self._data = _DataSet()
        else:
            with _SHARED_LOCK:
                data = _SHARED.get(name)
                if data is None:
                    data = _SHARED[name] = _DataSet()
            self._data = data
        with self._data.lock:
            self._session = self._data.next_session
            self._data.next_session += 1
            self._data.stores.add(self)

    @classmethod
    def from_url(cls, rest: str, *, data_dir: Path, session_timeout_ms: int, operation_timeout_s: float):
        name = rest.removeprefix("//")
        if not _NAME.fullmatch(name):
            raise InvalidConfiguration(f"metadataStoreUrl memory:{rest}: the name is 0-64 of [A-Za-z0-9_.-]")
        return cls(name)

    @property
    def session(self) -> int:
        return self._session

    @contextmanager
    def _transaction(self, durable: bool) -> Iterator[NodeTable]:
        with self._data.lock:
            table = _MemoryTable(self._data)
            try:
                yield table
            except BaseException:
                table.roll_back()
                raise

    @contextmanager
    def _read(self) -> Iterator[NodeTable]:
        with self._data.lock:
            yield _MemoryTable(self._data)

    def _published(self, notifications: list[Notification]) -> None:
        for store in list(self._data.stores):
            store._notifier.publish(notifications)

    def close(self) -> None:
        if self._closed:
            return
        with self._mutate(durable=False) as nodes:
            self._end_session(nodes, self._session)
        self._closed = True
        self._data.stores.discard(self)
        self._notifier.close()
