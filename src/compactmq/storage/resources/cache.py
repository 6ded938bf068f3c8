"""Values read through the store and kept until a watch says their key changed (Pulsar's
``MetadataCache``), so hot reads (a namespace's policies, a partitioned topic's metadata) cost a
dictionary lookup instead of a ZooKeeper round trip.

The order of steps is what keeps it correct: a key's watch is registered BEFORE its first read,
and every notification for the key bumps the key's generation; a read stores its result only if
the generation did not move while it ran. So a change that lands during a read can never leave a
stale value in the cache: at worst the read's result is dropped and the next get reads again.
Like every ZooKeeper cache, a value may lag a change made elsewhere by the notification's
delay; a writer that needs to read its own write calls ``invalidate`` after writing.

Bounded: at most ``max_entries`` keys are kept (least recently used go first, and their watches
are cancelled), so a broker with many topics does not hold a watch per key it ever read.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from ..metadata_store import GetResult, MetadataStore, Notification, Watch

#: keys kept by default (each holds a watch on the store)
DEFAULT_MAX_ENTRIES = 10_000


class MetadataCache:
    def __init__(self, store: MetadataStore, max_entries: int = DEFAULT_MAX_ENTRIES):
        self._store = store
        self._max = max_entries
        self._lock = threading.Lock()
        self._values: OrderedDict[str, GetResult | None] = OrderedDict()
        self._watches: dict[str, Watch] = {}
        self._generation: dict[str, int] = {}
        self.hits = self.misses = 0

    def get(self, path: str) -> GetResult | None:
        """The key's value and stat (None: it does not exist), from the cache when it is there."""
        with self._lock:
            if path in self._values:
                self._values.move_to_end(path)
                self.hits += 1
                return self._values[path]
            self.misses += 1
            watched = path in self._watches
            generation = self._generation.get(path, 0)
        if not watched:
            watch = self._store.watch(path, self._changed)  # before the read: see module docstring
            with self._lock:
                if path in self._watches:
                    watch.cancel()
                else:
                    self._watches[path] = watch
                generation = self._generation.get(path, 0)
        got = self._store.get(path)
        with self._lock:
            if self._generation.get(path, 0) == generation:
                self._values[path] = got
                self._values.move_to_end(path)
                self._evict_locked()
        return got

    def invalidate(self, path: str) -> None:
        with self._lock:
            self._generation[path] = self._generation.get(path, 0) + 1
            self._values.pop(path, None)

    def _changed(self, notification: Notification) -> None:
        self.invalidate(notification.path)

    def _evict_locked(self) -> None:
        while len(self._values) > self._max:
            path, _ = self._values.popitem(last=False)
            watch = self._watches.pop(path, None)
            self._generation.pop(path, None)
            if watch is not None:
                watch.cancel()

    def __len__(self) -> int:
        return len(self._values)
