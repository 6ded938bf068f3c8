"""``zk:host:port[,host:port...][/chroot]`` -- the metadata store on Apache ZooKeeper, through kazoo.

kazoo is the maintained pure-Python ZooKeeper client (sessions, reconnection, multi, watches).
Every call goes through its ``*_async`` variant and waits at most
``metadataStoreOperationTimeoutSeconds`` (kazoo's sync calls would wait forever on a partition);
``metadataStoreSessionTimeoutMillis`` is the session timeout kazoo negotiates with the server.

Mapping of the contract onto ZooKeeper
--------------------------------------
* A key is a znode under the chroot (the chroot is prefixed here, not by kazoo, so that a missing
  chroot is created like any parent). Versions, times and the ephemeral owner are the znode's stat.
* ``put`` without an expectation is ``set`` then, on ``NoNode``, ``create`` (then ``set`` again if
  another client created it meanwhile); ``NEW`` is ``create`` (``NodeExists`` -> ``BadVersion``);
  ``n`` is ``set`` at version n (``NoNode`` -> ``BadVersion``, as Pulsar's stores answer). Parents
  are created by kazoo's ``makepath`` as empty persistent znodes, as the other stores do.
* ``commit`` is one ZooKeeper ``multi`` (``_Multi``), missing parents created inside it. A ``Put``
  without an expectation becomes ``create`` or a ``set`` at the version just read; if another
  client changed that key (or created a parent) in between, the multi fails and is retried (only
  that case: an explicit expectation that fails is the caller's answer). What the multi needs to
  know is read before it all at once (``_Multi.prefetch``: one round trip, a second only for
  parents of missing parents), and a parent this store has seen exist is not read again
  (``_ParentCache``, a hint: a multi that fails on one forgets it and is retried with reads).
  A key the multi creates is read back for its stat (all at once), unless the caller asked
  ``commit_no_stats``. Reading one key at a time, a commit of n puts waited for up to 3n round
  trips in a row, which bounded a cluster broker's group flush (bench/README.md, stop 41).
* Watches: ZooKeeper 3.8's watches are one-shot; each ``watch`` re-arms an ``exists`` watch (data:
  Created/Modified/Deleted) and a ``get_children`` watch (ChildrenChanged) every time one fires;
  what is reported is the difference between the state the last read saw and the new one
  (``_WatchState``), so changes between a firing and its re-arming are coalesced, never lost.
* Sessions: kazoo's states map onto ``SessionEvent`` (SUSPENDED -> ConnectionLost, CONNECTED ->
  Reconnected, LOST -> SessionLost then SessionReestablished once kazoo has a new session, after
  which the watches are armed again). kazoo reconnects by itself for as long as the store is open.
  kazoo learns that its session expired only from the server, once it reaches one again; a
  process cut off from ZooKeeper (while its own clients still reach it) would go on believing in
  its ephemeral keys for as long as the cut lasts, though the server dropped them a session
  timeout after it last heard from it. So, as Pulsar's session watcher does, a connection lost
  for ``metadataStoreSessionTimeoutMillis`` is declared SessionLost here (``_declare_lost``); if
  kazoo then gets the same session back after all, that is SessionReestablished too (the keys
  still held are found again as this session's).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from pathlib import Path
from typing import Any

from ...errors import InvalidConfiguration
from . import (
    NEW,
    BadVersion,
    Delete,
    GetResult,
    InvalidPath,
    KeyNotFound,
    MetadataStore,
    MetadataStoreError,
    NotEmpty,
    Notification,
    NotificationType,
    Put,
    SessionEvent,
    Stat,
    StoreUnavailable,
    Watch,
    check_ops,
    check_value,
    validate_path,
)
from ._notify import Notifier, _Registered
from ._zk_multi import _Multi, _ParentCache

# kazoo: when missing, create_metadata_store says which package to install
from kazoo import exceptions as zke
from kazoo.client import KazooClient, KazooState
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import EventType

log = logging.getLogger(__name__)

_HOST = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252}))(?::(\d{1,5}))?")
#: attempts of a commit whose unversioned puts lost a race to another client (or whose
#: remembered parent another client deleted)
_MULTI_ATTEMPTS = 5


def parse_zk_url(rest: str) -> tuple[str, str]:
    """``host:port[,host:port...][/chroot]`` -> (kazoo's hosts string, chroot or ``""``)."""
    rest = rest.removeprefix("//")
    hosts, slash, chroot = rest.partition("/")
    chroot = slash + chroot if slash else ""
    if not hosts:
        raise InvalidConfiguration("metadataStoreUrl zk: needs host:port[,host:port...][/chroot]")
    for host in hosts.split(","):
        m = _HOST.fullmatch(host)
        if not m or (m.group(2) is not None and not 0 < int(m.group(2)) < 65536):
            raise InvalidConfiguration(f"metadataStoreUrl zk:{rest}: {host!r} is not host:port")
    if chroot:
        try:
            validate_path(chroot)
        except InvalidPath as exc:
            raise InvalidConfiguration(f"metadataStoreUrl zk:{rest}: bad chroot: {exc}") from None
    return hosts, chroot


class ZKMetadataStore(MetadataStore):
    def __init__(
        self,
        hosts: str,
        chroot: str = "",
        *,
        session_timeout_ms: int = 30_000,
        operation_timeout_s: float = 30,
    ):
        self._chroot = chroot
        self._timeout = float(operation_timeout_s)
        #: waits for the server (a call, or calls sent together): tests count a commit's
        self.round_trips = 0
        #: keys this store saw exist as a Put's parent (read, or created by its commits), so a
        #: commit does not ask again (``_Multi``): only ever a guess -- another client may have
        #: deleted one; the multi then fails on it, and is retried without the guess
        self._parents = _ParentCache()
        self._notifier = Notifier(f"zk:{hosts}{chroot}")
        self._closed = False
        self._state_lock = threading.Lock()
        self._was_lost = False  # SessionLost published; SessionReestablished on the next connect
        self._session_timeout_s = session_timeout_ms / 1000
        self._suspensions = 0  # connections lost so far: a timer declares only its own one lost
        self._lost_timer: threading.Timer | None = None
        self._watch_states: list[_WatchState] = []
        self._zk = KazooClient(
            hosts=hosts, timeout=session_timeout_ms / 1000, connection_retry={"max_tries": -1}
        )
        self._zk.add_listener(self._on_state)
        try:
            self._zk.start(timeout=self._timeout)
        except KazooTimeoutError as exc:
            self._zk.close()
            raise StoreUnavailable(f"ZooKeeper {hosts} not reachable within {self._timeout:g} s") from exc
        if chroot:
            try:
                self._call(self._zk.ensure_path_async(chroot), chroot)
            except BaseException:
                self.close()
                raise

    @classmethod
    def from_url(cls, rest: str, *, data_dir: Path, session_timeout_ms: int, operation_timeout_s: float):
        hosts, chroot = parse_zk_url(rest)
        return cls(
            hosts, chroot, session_timeout_ms=session_timeout_ms, operation_timeout_s=operation_timeout_s
        )

    # --- plumbing ----------------------------------------------------------------------------

    def _full(self, path: str) -> str:
        return self._chroot + path if path != "/" else (self._chroot or "/")

    def _call(self, async_result, path: str) -> Any:
        """Wait for one kazoo call and turn its errors into the contract's."""
        self.round_trips += 1
        return self._wait(async_result, path)

    def _call_all(self, calls: list[tuple[Any, str]]) -> list[Any]:
        """Wait for kazoo calls that were all sent before the first wait: ONE round trip to the
        server (kazoo pipelines them on the session's connection), not one per call."""
        self.round_trips += 1
        return [self._wait(async_result, path) for async_result, path in calls]

    def _wait(self, async_result, path: str) -> Any:
        if self._closed:
            raise StoreUnavailable("the metadata store is closed")
        try:
            return async_result.get(timeout=self._timeout)
        except KazooTimeoutError as exc:
            raise StoreUnavailable(f"ZooKeeper did not answer within {self._timeout:g} s ({path})") from exc
        except zke.NoChildrenForEphemeralsError as exc:
            raise InvalidPath(
                f"an ancestor of {path} is ephemeral: ephemeral keys cannot have children"
            ) from exc
        except zke.NotEmptyError as exc:
            raise NotEmpty(f"{path} has children") from exc
        except (zke.ConnectionLoss, zke.SessionExpiredError, zke.ConnectionClosedError) as exc:
            raise StoreUnavailable(f"ZooKeeper connection lost ({path}): {type(exc).__name__}") from exc

    def _stat(self, path: str, zstat) -> Stat:
        owner = zstat.ephemeralOwner
        return Stat(
            path=path,
            version=zstat.version,
            created_ms=zstat.ctime,
            modified_ms=zstat.mtime,
            ephemeral=owner != 0,
            created_by_self=owner != 0 and owner == (self._zk.client_id or (None,))[0],
        )

    # --- the contract ------------------------------------------------------------------------

    def get(self, path: str) -> GetResult | None:
        validate_path(path)
        try:
            value, zstat = self._call(self._zk.get_async(self._full(path)), path)
        except zke.NoNodeError:
            return None
        return GetResult(value, self._stat(path, zstat))

    def exists(self, path: str) -> bool:
        validate_path(path, root_ok=True)
        return self._call(self._zk.exists_async(self._full(path)), path) is not None

    def get_children(self, path: str) -> list[str]:
        validate_path(path, root_ok=True)
        try:
            children = self._call(self._zk.get_children_async(self._full(path)), path)
        except zke.NoNodeError:
            return []
        if path == "/" and not self._chroot:
            children = [c for c in children if c != "zookeeper"]  # the server's own subtree
        return sorted(children)

    def put(self, path, value, expected_version=None, *, ephemeral=False, sequential=False) -> Stat:
        validate_path(path)
        value = check_value(value)
        if sequential and expected_version not in (None, NEW):
            raise ValueError("a sequential put creates a new key: expected_version must be None or NEW")
        if expected_version is not None and expected_version < NEW:
            raise BadVersion(f"expected version {expected_version} of {path}: -1 or >= 0 only")
        if sequential or expected_version == NEW:
            return self._create(path, value, ephemeral, sequential)
        if expected_version is not None:
            try:
                zstat = self._call(self._zk.set_async(self._full(path), value, expected_version), path)
            except (zke.BadVersionError, zke.NoNodeError):
                raise BadVersion(f"{path} is not at version {expected_version}") from None
            return self._stat(path, zstat)
        while True:  # no expectation: replace, or create; another client may race either way
            try:
                return self._stat(path, self._call(self._zk.set_async(self._full(path), value, -1), path))
            except zke.NoNodeError:
                pass
            try:
                return self._create(path, value, ephemeral, False)
            except BadVersion:
                continue

    def _create(self, path: str, value: bytes, ephemeral: bool, sequential: bool) -> Stat:
        full = self._full(path)
        try:
            real, zstat = self._call(
                self._zk.create_async(
                    full, value, ephemeral=ephemeral, sequence=sequential, makepath=True, include_data=True
                ),
                path,
            )
        except zke.NodeExistsError:
            raise BadVersion(f"{path} already exists") from None
        return self._stat(real[len(self._chroot) :], zstat)

    def delete(self, path: str, expected_version: int | None = None) -> None:
        validate_path(path)
        version = -1 if expected_version is None else expected_version
        if version < 0 and expected_version is not None:
            raise BadVersion(f"expected version {expected_version} of {path}: delete needs >= 0 or None")
        self._parents.forget([path])
        try:
            self._call(self._zk.delete_async(self._full(path), version), path)
        except zke.NoNodeError:
            raise KeyNotFound(f"{path} does not exist") from None
        except zke.BadVersionError:
            raise BadVersion(f"{path} is not at version {expected_version}") from None

    def commit(self, ops) -> list[Stat | None]:
        return self._commit(ops, stats=True)

    def commit_no_stats(self, ops) -> None:
        self._commit(ops, stats=False)

    def _commit(self, ops, stats: bool) -> list[Stat | None]:
        ops = check_ops(ops)
        if not ops:
            return []
        for attempt in range(_MULTI_ATTEMPTS):
            multi = _Multi(self)
            multi.prefetch(ops)
            for i, op in enumerate(ops):
                multi.add(i, op)
            results = self._call(multi.txn.commit_async(), ops[0].path)
            failed = next((j for j, r in enumerate(results) if isinstance(r, Exception)
                           and not isinstance(r, zke.RolledBackError)), None)  # fmt: skip
            if failed is None:
                multi.applied()
                if not stats:
                    return []
                return self._multi_stats(ops, [results[multi.index_of[i]] for i in range(len(ops))])
            multi.failed()
            owner = multi.owners[failed]
            if attempt + 1 < _MULTI_ATTEMPTS and (owner is None or failed in multi.guessed):
                # a parent create or an unversioned put lost a race, or a parent this store
                # remembered was deleted by another client: read again, retry
                continue
            if owner is None:
                raise BadVersion(
                    f"a parent in the commit kept being created by another client ({ops[0].path})"
                )
            raise self._multi_error(ops[owner], results[failed])
        raise BadVersion("the commit kept losing races to other clients")  # pragma: no cover

    def _multi_stats(self, ops, results) -> list[Stat | None]:
        """The caller's stats of a multi that went through. A set_data answers its new stat; a
        create inside a multi answers only its path (ZooKeeper has no create2 there): the new
        key is at version 0, its times come from a read (or now, if it is already gone) -- the
        reads of every create sent together, one round trip for the commit, not one per key."""
        creates = [
            i for i, (op, r) in enumerate(zip(ops, results)) if isinstance(op, Put) and isinstance(r, str)
        ]
        read = (
            self._call_all([(self._zk.exists_async(results[i]), ops[i].path) for i in creates])
            if creates
            else []
        )
        zstats = dict(zip(creates, read))
        out: list[Stat | None] = []
        for i, (op, result) in enumerate(zip(ops, results)):
            if not isinstance(op, Put):
                out.append(None)
            elif i not in zstats:
                out.append(self._stat(op.path, result))
            elif zstats[i] is not None and zstats[i].version == 0:
                out.append(self._stat(op.path, zstats[i]))
            else:
                now = time.time_ns() // 1_000_000
                out.append(Stat(op.path, 0, now, now, op.ephemeral, op.ephemeral))
        return out

    def _multi_error(self, op, error: Exception) -> MetadataStoreError:
        if isinstance(op, Delete) and isinstance(error, zke.NoNodeError):
            return KeyNotFound(f"{op.path} does not exist")
        if isinstance(error, (zke.BadVersionError, zke.NoNodeError, zke.NodeExistsError)):
            return BadVersion(f"{op.path}: {type(error).__name__} in the commit")
        if isinstance(error, zke.NotEmptyError):
            return NotEmpty(f"{op.path} has children")
        if isinstance(error, zke.NoChildrenForEphemeralsError):
            return InvalidPath(f"an ancestor of {op.path} is ephemeral")
        return MetadataStoreError(f"{op.path}: ZooKeeper refused the commit ({type(error).__name__})")

    # --- watches -----------------------------------------------------------------------------

    def watch(self, path: str, callback) -> Watch:
        validate_path(path, root_ok=True)
        registered = self._notifier.add_watch(path, callback)
        state = _WatchState(self, registered)
        self._watch_states.append(state)
        for armed in filter(None, state.arm()):  # the watch is set on the server when this returns
            try:
                self._call(armed, path)
            except zke.NoNodeError:
                pass
        return registered

    # --- session -----------------------------------------------------------------------------

    def register_session_listener(self, listener) -> None:
        self._notifier.add_session_listener(listener)

    def _on_state(self, state) -> None:  # on kazoo's connection thread: no blocking
        with self._state_lock:
            if state == KazooState.SUSPENDED:
                self._notifier.publish_session(SessionEvent.CONNECTION_LOST)
                self._start_lost_timer()
            elif state == KazooState.LOST:
                self._suspensions += 1  # kazoo said it: no timer declares it again
                if not self._was_lost:
                    self._was_lost = True
                    if not self._closed:
                        self._notifier.publish_session(SessionEvent.SESSION_LOST)
            elif state == KazooState.CONNECTED:
                self._suspensions += 1  # connected again: the pending timer declares nothing
                if self._was_lost:
                    self._was_lost = False
                    self._notifier.publish_session(SessionEvent.SESSION_REESTABLISHED)
                    self._notifier.run_later(self._rearm_all)
                else:
                    self._notifier.publish_session(SessionEvent.RECONNECTED)

    def _start_lost_timer(self) -> None:
        """(Under ``_state_lock``.) Declare the session lost if this disconnection lasts the
        session timeout (module docstring, "Sessions")."""
        self._suspensions += 1
        if self._was_lost or self._closed:
            return
        timer = threading.Timer(self._session_timeout_s, self._declare_lost, (self._suspensions,))
        timer.daemon = True
        if self._lost_timer is not None:
            self._lost_timer.cancel()
        self._lost_timer = timer
        timer.start()

    def _declare_lost(self, suspension: int) -> None:
        """Timer thread: still disconnected since ``suspension`` began, a session timeout later:
        the server has expired the session (or will before anyone could act on its keys)."""
        with self._state_lock:
            if suspension != self._suspensions or self._was_lost or self._closed:
                return
            self._was_lost = True
            log.warning(
                "ZooKeeper unreachable for the session timeout (%g s): the session is lost",
                self._session_timeout_s,
            )
            self._notifier.publish_session(SessionEvent.SESSION_LOST)

    def _rearm_all(self) -> None:
        self._watch_states = [state for state in self._watch_states if not state.watch.cancelled]
        for state in self._watch_states:
            state.arm()

    @property
    def connected(self) -> bool:
        return bool(self._zk.connected) and not self._closed

    @property
    def session_id(self) -> int | None:
        """ZooKeeper's id of this store's current session (None while there is none)."""
        client_id = self._zk.client_id
        return client_id[0] if client_id else None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._lost_timer is not None:
            self._lost_timer.cancel()
        try:
            self._zk.stop()  # closes the session: the server deletes its ephemeral znodes now
        finally:
            self._zk.close()
            self._notifier.close()


_UNKNOWN = object()
_DATA_EVENTS = (EventType.CREATED, EventType.CHANGED, EventType.DELETED)


class _WatchState:
    """One ``watch`` on ZooKeeper: its one-shot server watches and the last state they read.

    A fired watch only makes this re-read the key with a new watch; what to report comes from the
    difference between the last state read and this one (the key appeared, went, was recreated,
    changed version; its children version changed), so a change that lands between a firing and
    the re-arming is reported too, never lost. The two watcher callables are made once, so kazoo
    (which keeps watchers in a set) never holds two of the same for one path. Everything here runs
    on kazoo's threads and makes only asynchronous calls.
    """

    def __init__(self, store: ZKMetadataStore, watch: _Registered):
        self.store = store
        self.watch = watch
        self.full = store._full(watch.path)
        self.data: Any = _UNKNOWN  # None (absent) or (czxid, version)
        self.children: Any = _UNKNOWN  # None (absent) or cversion
        self._on_data = lambda event: event.type in _DATA_EVENTS and self.arm_data()
        self._on_children = lambda event: event.type == EventType.CHILD and self.arm_children()

    def arm(self) -> list:
        return [self.arm_data(), self.arm_children()]

    def arm_data(self):
        if self.watch.cancelled or self.store._closed:
            return None
        result = self.store._zk.exists_async(self.full, watch=self._on_data)
        result.rawlink(self._data_read)
        return result

    def arm_children(self):
        if self.watch.cancelled or self.store._closed:
            return None
        result = self.store._zk.get_children_async(self.full, watch=self._on_children, include_data=True)
        result.rawlink(self._children_read)
        return result

    def _report(self, kind: NotificationType) -> None:
        if not self.watch.cancelled:
            self.store._notifier.deliver(self.watch, Notification(kind, self.watch.path))

    def _data_read(self, result) -> None:
        if not result.successful():
            return  # connection trouble: armed again on SessionReestablished
        zstat = result.value
        new = None if zstat is None else (zstat.czxid, zstat.version)
        old, self.data = self.data, new
        if new is None:
            self.children = None  # a recreated key starts with no children
        if old is _UNKNOWN or old == new:
            return
        if old is not None and (new is None or new[0] != old[0]):
            self._report(NotificationType.DELETED)
        if new is not None and (old is None or new[0] != old[0]):
            self._report(NotificationType.CREATED)
            self.arm_children()  # get_children could not watch a missing key
        elif new is not None:
            self._report(NotificationType.MODIFIED)

    def _children_read(self, result) -> None:
        if isinstance(result.exception, zke.NoNodeError):
            self.children = None
            return
        if not result.successful():
            return
        new = result.value[1].cversion
        old, self.children = self.children, new
        if old is not _UNKNOWN and new != old and (old is not None or new > 0):
            self._report(NotificationType.CHILDREN_CHANGED)
