"""Fencing: a commit that succeeds only while its writer still owns the topic.

In a cluster, a broker can lose a topic without knowing it yet: it was paused (GC, ``SIGSTOP``)
or cut off past ``metadataStoreSessionTimeoutMillis``, its bundle went to another broker, and it
wakes up with writes in flight. Such a *zombie* must never make a write visible. The metadata
store is the only arbiter: every commit of a topic's shared state carries, in the same atomic
``commit`` (ZooKeeper ``multi``; one transaction in the embedded stores), version checks on the
ownership of the topic's bundle. A zombie's commit then fails as a whole.

The epoch
---------
A bundle's ownership is an ephemeral key ``/namespace/{t}/{ns}/{range}`` (created at version 0,
never rewritten) plus a persistent counter ``/loadbalance/bundle-epochs/{t}/{ns}/{range}`` whose
version is bumped *in the same commit* that creates the ownership key (``resources.cluster``).
The **epoch** of a topic is that counter's version + 1 (so 0 means "no cluster"): it only grows,
each ownership has its own, and it names the owner's objects (``object_ledgers`` keys end in
``-e<epoch>``). A fence checks both keys:

* the ownership key at version 0: gone when the owner's session expired or it unloaded;
* the epoch counter at the owner's version: moved on as soon as any other broker took the
  bundle (an ephemeral key recreated by the next owner is at version 0 again, so the first
  check alone could not tell two owners apart).

The API (small on purpose; compaction commits use it too)
---------------------------------------------------------
``Fence``           frozen: ``checks`` (store ``Check`` ops), ``epoch`` (int), ``lost`` (bool)
``Fence.commit(store, ops)``  ``store.commit(ops + checks)``; ``Fenced`` when the fence no
                    longer holds (a lost race on the caller's own keys stays ``BadVersion``)
``Fence.verify(store)``  ``Fenced`` unless the fence holds now (a commit of the checks alone:
                    linearizable in ZooKeeper, where a plain read may be served stale)
``Fence.holds(store)``  the same as a bool
``NO_FENCE``        single node (embedded store): no checks, every commit goes through as before
``lost_fence(what)``   for a topic this broker does not own: every commit raises ``Fenced``
``fenced_update(store, path, fn, what, fence)``  read-modify-write of one JSON value under a fence

A topic's fence is ``Storage.fence_for(topic)`` (``TopicMetadata.fence_for`` is the same): the one
its open managed ledger was opened under, else the cluster's current one for the topic's bundle
(``broker.cluster`` sets ``Storage.fence_provider``); ``NO_FENCE`` on a single node. A commit of
other per-topic state (the compaction state) passes its ops through ``fence.commit(store, ops)``.

``Fence.revoke()``  this broker gave the ownership up (unload, lost session): from now on the
                    fence fails at once, before any store access
``Fence.when_over(callback)``  ``callback()`` (on the thread that found out) each time the
                    STORE says the fence no longer holds -- the owner learns that its
                    ownership ended even when no session event told it (``broker.cluster`` then
                    gives the bundle up instead of failing every commit under it for ever)
``FenceLease(fence, store, term_s).check()``  ``verify`` at most once per ``term_s`` (below)

``Fenced`` is a ``MetadataStoreError`` answered as ``ServiceNotReady`` (retriable): a client
told so looks the topic up again and reaches the new owner.

The lease (object-ledger flushes)
---------------------------------
Entries may be acknowledged only while the fence holds, and a flush is too frequent for a store
commit each time. ``FenceLease`` checks the store, and for ``term_s`` after the moment it SENT a
check that succeeded, trusts it: that request reached ZooKeeper after it was sent, so the session
cannot expire -- and no other broker can take the bundle, whose owner key is this session's
ephemeral -- before ``send time + metadataStoreSessionTimeoutMillis``; the term is half of that,
leaving the other half for clock-rate differences. The only other way out, giving the bundle up,
goes through ``revoke`` first, which ends every lease of the fence at once. A process frozen
(``SIGSTOP``) past its term finds on waking that the monotonic clock moved on: it checks again.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ...errors import NotFound, ServerError
from ..metadata_store import BadVersion, Check, KeyNotFound, MetadataStore, MetadataStoreError, Op, Put, Stat
from .base import UPDATE_ATTEMPTS, Json, dumps, loads


class Fenced(MetadataStoreError):
    """This broker no longer owns the topic (session lost, unloaded, or another broker took it)."""

    server_error = ServerError.ServiceNotReady
    http_status = 503


class _Revoked:
    """The mutable part of a fence: set once, when this broker gives the ownership up; and who
    to tell when the store shows the ownership is over."""

    def __init__(self) -> None:
        self.flag = False
        self.on_over: Callable[[], None] | None = None


@dataclass(frozen=True)
class Fence:
    checks: tuple[Check, ...] = ()
    epoch: int = 0
    lost: bool = False
    what: str = ""
    _revoked: _Revoked = field(default_factory=_Revoked, compare=False, repr=False)

    @property
    def revoked(self) -> bool:
        return self._revoked.flag

    def revoke(self) -> None:
        self._revoked.flag = True

    def when_over(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` each time a store check finds this fence over (a revoked fence is
        refused before any store check, so its owner, which gave it up, is not told again)."""
        self._revoked.on_over = callback

    def _over(self) -> None:
        callback = self._revoked.on_over
        if callback is not None:
            callback()

    def commit(self, store: MetadataStore, ops: Sequence[Op]) -> list[Stat | None]:
        """Commit ``ops`` only if the fence holds (see the module docstring)."""
        if self.lost or self.revoked:
            raise Fenced(f"{self.what} is not owned by this broker")
        if not self.checks:
            return store.commit(list(ops))
        try:
            return store.commit([*ops, *self.checks])[: len(ops)]
        except (BadVersion, KeyNotFound):
            if not self.holds(store):
                raise Fenced(f"{self.what}: ownership epoch {self.epoch} is over") from None
            raise

    def holds(self, store: MetadataStore) -> bool:
        if self.lost or self.revoked:
            return False
        if not self.checks:
            return True
        try:
            store.commit(list(self.checks))
            return True
        except (BadVersion, KeyNotFound):
            self._over()
            return False

    def verify(self, store: MetadataStore) -> None:
        if not self.holds(store):
            raise Fenced(f"{self.what}: ownership epoch {self.epoch} is over")


NO_FENCE = Fence()


class FenceLease:
    """``check()``: ``Fenced`` unless the fence holds, asking the store at most once per
    ``term_s`` (see "The lease" above). Thread-safe."""

    def __init__(
        self,
        fence: Fence,
        store: MetadataStore,
        term_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.fence = fence
        self._store = store
        self._term = max(0.0, term_s)
        self._clock = clock
        self._until = float("-inf")
        self._lock = threading.Lock()
        self.store_checks = 0  # how often the store was asked (tests, stats)

    def check(self) -> None:
        if self.fence.lost or self.fence.revoked:
            raise Fenced(f"{self.fence.what}: ownership epoch {self.fence.epoch} was given up")
        if not self.fence.checks:
            return
        with self._lock:
            if self._clock() < self._until:
                return
            sent = self._clock()
            self.store_checks += 1
            self.fence.verify(self._store)
            self._until = sent + self._term


def lost_fence(what: str) -> Fence:
    return Fence(lost=True, what=what)


def fenced_update(
    store: MetadataStore, path: str, fn: Callable[[Json], Json], what: str, fence: Fence
) -> Json:
    """``BaseResources._update`` under ``fence``: read, apply ``fn``, commit with the fence's
    checks; a lost race on ``path`` alone reads again, a lost fence raises ``Fenced``."""
    for _ in range(UPDATE_ATTEMPTS):
        got = store.get(path)
        if got is None:
            raise NotFound(f"{what} does not exist")
        new = fn(copy.deepcopy(loads(got.value, path)))
        try:
            fence.commit(store, [Put(path, dumps(new), got.stat.version)])
            return new
        except BadVersion:
            continue
    raise BadVersion(f"{what}: still contended after {UPDATE_ATTEMPTS} attempts")
