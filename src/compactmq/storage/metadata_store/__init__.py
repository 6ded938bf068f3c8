"""The metadata store: versioned key-value pairs at paths, on Pulsar's ``pulsar-metadata`` model.

Everything compactmq knows about topics that is not entry bytes (tenants, namespaces, policies,
ledger lists, cursors, schemas, compaction state) will live here, behind one small interface
with several implementations, so that a broker can keep it in an embedded file today and share
it with other brokers through ZooKeeper tomorrow. Typed resources sit above it; nothing above
them sees a path.

The model
---------
* A **key** is a path: ``/`` then segments separated by ``/`` (``/admin/policies/public``). A
  segment is any non-empty Unicode text except ``.`` and ``..``, without ``/`` or control
  characters (ZooKeeper's rule, applied by every implementation). Callers that put user-chosen
  names into paths percent-encode them first; the store does not decode anything.
* A **value** is bytes (at most ``MAX_VALUE_SIZE``), and every value has a ``Stat``: its
  **version** (0 when created, +1 per put), creation and modification times, and whether it is
  ephemeral. Putting a key creates its missing ancestors as empty persistent keys (as Pulsar's
  ZooKeeper store does), so ``exists`` and ``get_children`` answer the same everywhere; a key with
  children cannot be deleted (``NotEmpty``).
* **Compare-and-set** is the only safe way to change shared state. ``put`` and ``delete`` take an
  ``expected_version``: ``None`` means no check; ``-1`` (``NEW``) means "the key must not exist"
  (Pulsar's convention); ``n >= 0`` means the current version must be ``n``. A mismatch raises
  ``BadVersion``: someone else won, which is normal control flow to be handled where it happens,
  never blindly retried.
* **Ephemeral** keys belong to the store's **session** and disappear when the session ends
  (``close()``) or expires (the process died or lost its connection for longer than
  ``metadataStoreSessionTimeoutMillis``): the basis of ownership between brokers. Only the put
  that creates a key decides whether it is ephemeral; an ephemeral key cannot have children.
* **Sequential** puts append a 10-digit, zero-padded counter to the path's last segment; within a
  parent the counter only grows, so the children of a queue sort in creation order.
* **Watches** (``watch(path, callback)``) report ``Created``, ``Modified`` and ``Deleted`` for the
  path, and ``ChildrenChanged`` when a child of it is created or deleted. As in ZooKeeper a watch
  says *that* something changed, not what: rapid changes may be coalesced into one callback, so a
  callback reads the key again. Callbacks run on the store's own notification thread, one at a
  time and in order; they may call the store, and must not block for long.
* **Multi-key commits** (``commit(ops)``) apply a list of ``Put``/``Delete``/``Check`` as one
  atomic step: every op applies or none does (ZooKeeper ``multi``; one transaction in SQLite).

Synchronous, deliberately
-------------------------
Every method blocks until the store answered (or ``metadataStoreOperationTimeoutSeconds`` passed:
``StoreUnavailable``). Storage is synchronous and the broker already calls it from a thread pool,
off its event loop; the embedded store answers in microseconds, where an ``await`` would cost more
than the call; and kazoo, the ZooKeeper client, is itself synchronous (its ``*_async`` variants
return thread-based futures, not asyncio ones). An async facade for the broker is one
``run_in_executor`` away; the reverse (blocking on a coroutine from storage code) would not be.

Implementations (chosen by ``metadataStoreUrl``, see ``create_metadata_store``)
------------------------------------------------------------------------------
``memory:[name]``          ``memory.py``: in this process only, for tests (stores opened on the
                           same name share their data, each with its own session)
``sqlite:<path>`` / none   ``sqlite.py``: the embedded default, one SQLite file in the data directory
``zk:h:p[,h:p...][/root]`` ``zookeeper.py``: Apache ZooKeeper through kazoo
"""

from __future__ import annotations

import abc
import enum
import importlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import CompactMQError, InvalidConfiguration, ServerError

#: ``expected_version`` meaning "the key must not exist yet" (Pulsar's ``Optional.of(-1L)``)
NEW = -1

#: Largest value, and largest total of the values of one ``commit``. ZooKeeper refuses a packet over
#: its ``jute.maxbuffer`` (1 MiB - 1 by default) including path and framing, so every implementation
#: stops a little below it: a value that one store accepts, all accept.
MAX_VALUE_SIZE = 1_000_000

#: Pulsar's defaults for ``metadataStoreSessionTimeoutMillis`` / ``metadataStoreOperationTimeoutSeconds``
DEFAULT_SESSION_TIMEOUT_MS = 30_000
DEFAULT_OPERATION_TIMEOUT_S = 30

#: the embedded store's file when ``metadataStoreUrl`` is empty (beside today's tables: one file)
DEFAULT_SQLITE_FILE = "metadata.db"

#: digits of the counter a sequential put appends (ZooKeeper's format)
SEQUENCE_DIGITS = 10


# --- errors -----------------------------------------------------------------------------------


class MetadataStoreError(CompactMQError):
    """Root of the store's errors (Pulsar's ``MetadataStoreException``)."""

    server_error = ServerError.MetadataError
    http_status = 500


class BadVersion(MetadataStoreError):
    """The key's version is not the expected one (or it exists when it must not): someone else won."""

    http_status = 409


class KeyNotFound(MetadataStoreError):
    """The key does not exist (``delete`` of a missing key)."""

    http_status = 404


class NotEmpty(MetadataStoreError):
    """The key has children, so it cannot be deleted."""

    http_status = 409


class InvalidPath(MetadataStoreError):
    """A path that breaks the path rules (see the module docstring), or a child of an ephemeral key."""

    http_status = 400


class ValueTooLarge(MetadataStoreError):
    """A value (or the values of one commit) over ``MAX_VALUE_SIZE`` bytes."""

    http_status = 413


class StoreUnavailable(MetadataStoreError):
    """The store did not answer in time, lost its connection, or is closed."""

    server_error = ServerError.ServiceNotReady
    http_status = 503


# --- values -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stat:
    """What the store knows about one value besides its bytes (Pulsar's ``Stat``)."""

    path: str
    version: int
    created_ms: int
    modified_ms: int
    ephemeral: bool
    #: this store's session created the key (meaningful for ephemeral keys: "do I own it?")
    created_by_self: bool


@dataclass(frozen=True)
class GetResult:
    value: bytes
    stat: Stat


class NotificationType(enum.Enum):
    CREATED = "Created"
    MODIFIED = "Modified"
    DELETED = "Deleted"
    CHILDREN_CHANGED = "ChildrenChanged"


@dataclass(frozen=True)
class Notification:
    type: NotificationType
    path: str


class SessionEvent(enum.Enum):
    """Changes of the store's session (Pulsar's ``SessionEvent``)."""

    #: disconnected, but the session (and its ephemeral keys) may still be alive
    CONNECTION_LOST = "ConnectionLost"
    RECONNECTED = "Reconnected"
    #: the session expired: its ephemeral keys are gone (or going); owners must stop serving
    SESSION_LOST = "SessionLost"
    #: a new session replaced the lost one (ephemeral keys are NOT recreated)
    SESSION_REESTABLISHED = "SessionReestablished"


@dataclass(frozen=True)
class Put:
    """Set ``path`` to ``value`` (see ``MetadataStore.put``); not sequential inside a commit."""

    path: str
    value: bytes
    expected_version: int | None = None
    ephemeral: bool = False


@dataclass(frozen=True)
class Delete:
    path: str
    expected_version: int | None = None


@dataclass(frozen=True)
class Check:
    """Fail the commit unless ``path`` is at ``version`` (>= 0); changes nothing."""

    path: str
    version: int


Op = Put | Delete | Check
WatchCallback = Callable[[Notification], None]
SessionListener = Callable[[SessionEvent], None]


class Watch(abc.ABC):
    """A registered watch; ``cancel()`` stops its callbacks (idempotent)."""

    @abc.abstractmethod
    def cancel(self) -> None: ...


# --- the interface ----------------------------------------------------------------------------


class MetadataStore(abc.ABC):
    """Versioned key-value store; the contract every implementation keeps (module docstring).

    Every method may raise ``InvalidPath`` for a bad path and ``StoreUnavailable`` when the store
    cannot answer within the operation timeout or is closed. Thread-safe.
    """

    @abc.abstractmethod
    def get(self, path: str) -> GetResult | None:
        """Read one key.

        Returns:
            its value and ``Stat``, or ``None`` when the key does not exist.
        """

    @abc.abstractmethod
    def exists(self, path: str) -> bool:
        """Whether the key exists (``/`` always does)."""

    @abc.abstractmethod
    def get_children(self, path: str) -> list[str]:
        """The names (last segments, not full paths) of the key's children, sorted.

        Returns:
            an empty list when the key has no children or does not exist.
        """

    @abc.abstractmethod
    def put(
        self,
        path: str,
        value: bytes,
        expected_version: int | None = None,
        *,
        ephemeral: bool = False,
        sequential: bool = False,
    ) -> Stat:
        """Create or replace the value of a key, creating missing ancestors.

        Args:
            expected_version: ``None``: no check; ``NEW`` (-1): the key must not exist; ``n``: the
                key must exist at version ``n``.
            ephemeral: when this put creates the key, tie it to this store's session.
            sequential: append a ``SEQUENCE_DIGITS``-digit counter to the path (always creates;
                ``expected_version`` must then be ``None`` or ``NEW``).
        Returns:
            the new ``Stat``; its ``path`` is the real path (with the counter when sequential).
        Raises:
            BadVersion: the expectation did not hold; nothing changed.
            ValueTooLarge: ``value`` is over ``MAX_VALUE_SIZE``.
            InvalidPath: a bad path, or an ancestor is ephemeral.
        """

    @abc.abstractmethod
    def delete(self, path: str, expected_version: int | None = None) -> None:
        """Delete a key that has no children.

        Raises:
            KeyNotFound: the key does not exist.
            BadVersion: ``expected_version`` is not ``None`` and not the key's version.
            NotEmpty: the key has children.
        """

    @abc.abstractmethod
    def commit(self, ops: Sequence[Op]) -> list[Stat | None]:
        """Apply ``ops`` in order as one atomic step: all of them, or none.

        Returns:
            one entry per op: the new ``Stat`` of a ``Put``, ``None`` for ``Delete``/``Check``.
        Raises:
            the error the first failing op would raise alone (``BadVersion``, ``KeyNotFound``,
            ``NotEmpty``, ``InvalidPath``, ``ValueTooLarge`` for the values' total); then the
            store is exactly as before the call.
        """

    def commit_no_stats(self, ops: Sequence[Op]) -> None:
        """``commit`` for a caller that needs no stats: a store may save reads (ZooKeeper reads
        every key a multi created back for its stat)."""
        self.commit(ops)

    @abc.abstractmethod
    def watch(self, path: str, callback: WatchCallback) -> Watch:
        """Call ``callback(Notification)`` on changes of ``path`` and of its set of children.

        The key need not exist. Changes made through any store on the same data (another process,
        another broker) are reported, and so are this store's own.
        """

    @abc.abstractmethod
    def register_session_listener(self, listener: SessionListener) -> None:
        """Call ``listener(SessionEvent)`` on the notification thread when the session changes."""

    @property
    def connected(self) -> bool:
        """Whether the store is reachable now (False while a shared store's connection is down:
        a call would wait up to the operation timeout). The embedded stores always are."""
        return True

    @abc.abstractmethod
    def close(self) -> None:
        """End the session (its ephemeral keys are deleted) and release everything. Idempotent."""

    def __enter__(self) -> MetadataStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- paths ------------------------------------------------------------------------------------

# ZooKeeper refuses these code points in a path, every implementation does the same: controls,
# surrogates and the private-use area, U+FFF0.., and (as Java's surrogate pairs) all beyond U+FFFF
_FORBIDDEN = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\uf8ff\ufff0-\U0010ffff]")


def validate_path(path: str, *, root_ok: bool = False) -> str:
    """``path`` if it is a valid key path (module docstring), else ``InvalidPath``."""
    if not isinstance(path, str) or not path.startswith("/"):
        raise InvalidPath(f"a metadata path starts with '/': {path!r}")
    if path == "/":
        if root_ok:
            return path
        raise InvalidPath("'/' is the root: it has no value of its own")
    for segment in path[1:].split("/"):
        if segment in ("", ".", ".."):
            raise InvalidPath(f"empty, '.' or '..' segment in metadata path {path!r}")
    if _FORBIDDEN.search(path):
        raise InvalidPath(f"control or reserved character in metadata path {path!r}")
    return path


def parent_of(path: str) -> str:
    """``/a/b`` -> ``/a``; ``/a`` -> ``/``."""
    head = path.rsplit("/", 1)[0]
    return head or "/"


def join_path(parent: str, child: str) -> str:
    return parent + child if parent == "/" else f"{parent}/{child}"


def check_value(value: bytes) -> bytes:
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise TypeError(f"a metadata value is bytes, not {type(value).__name__}")
    if len(value) > MAX_VALUE_SIZE:
        raise ValueTooLarge(f"metadata value of {len(value)} bytes is over the {MAX_VALUE_SIZE}-byte limit")
    return bytes(value)


def check_ops(ops: Sequence[Op]) -> list[Op]:
    """Validate a commit's ops up front (paths, types, total size) so a bad one changes nothing."""
    ops = list(ops)
    total = 0
    for op in ops:
        if not isinstance(op, (Put, Delete, Check)):
            raise TypeError(f"a commit takes Put, Delete and Check ops, not {type(op).__name__}")
        validate_path(op.path)
        if isinstance(op, Put):
            total += len(check_value(op.value))
        if isinstance(op, Check) and op.version < 0:
            raise BadVersion(f"Check of {op.path!r} needs a version >= 0, not {op.version}")
    if total > MAX_VALUE_SIZE:
        raise ValueTooLarge(f"the values of one commit total {total} bytes, over {MAX_VALUE_SIZE}")
    return ops


# --- choosing an implementation ---------------------------------------------------------------

#: URL scheme -> (module, class): imported only when chosen (pyiceberg's habit), so kazoo is
#: needed only by brokers that use ZooKeeper
_IMPLEMENTATIONS = {
    "memory": ("compactmq.storage.metadata_store.memory", "MemoryMetadataStore"),
    "sqlite": ("compactmq.storage.metadata_store.sqlite", "SqliteMetadataStore"),
    "zk": ("compactmq.storage.metadata_store.zookeeper", "ZKMetadataStore"),
}


def create_metadata_store(
    url: str | None,
    *,
    data_dir: str | Path,
    session_timeout_ms: int = DEFAULT_SESSION_TIMEOUT_MS,
    operation_timeout_s: float = DEFAULT_OPERATION_TIMEOUT_S,
) -> MetadataStore:
    """Open the store ``url`` names (``metadataStoreUrl``); empty or ``None``: the embedded default.

    Raises:
        InvalidConfiguration: an unknown scheme or a malformed URL (one line saying which).
        StoreUnavailable: the store cannot be reached within ``operation_timeout_s``.
    """
    url = (url or "").strip() or f"sqlite:{DEFAULT_SQLITE_FILE}"
    scheme, sep, rest = url.partition(":")
    if not sep or scheme not in _IMPLEMENTATIONS:
        known = ", ".join(f"{s}:" for s in _IMPLEMENTATIONS)
        raise InvalidConfiguration(f"metadataStoreUrl {url!r}: unknown scheme (known: {known})")
    if session_timeout_ms <= 0 or operation_timeout_s <= 0:
        raise InvalidConfiguration(
            "metadataStoreSessionTimeoutMillis and metadataStoreOperationTimeoutSeconds must be > 0"
        )
    module_name, class_name = _IMPLEMENTATIONS[scheme]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise InvalidConfiguration(
            f"metadataStoreUrl {scheme}: needs the Python package {exc.name!r}, which is not installed "
            f"(pip install {exc.name})"
        ) from exc
    cls = getattr(module, class_name)
    return cls.from_url(
        rest,
        data_dir=Path(data_dir),
        session_timeout_ms=session_timeout_ms,
        operation_timeout_s=operation_timeout_s,
    )


def store_from_config(config: Mapping[str, Any], *, configuration: bool = False) -> MetadataStore:
    """Open the store Pulsar's keys name in ``config`` (a plain mapping: tests pass dicts).

    ``configuration=True`` opens ``configurationMetadataStoreUrl`` (Pulsar's store of tenants,
    namespaces and policies shared across clusters), which defaults to ``metadataStoreUrl``.
    """
    url = str(config.get("metadataStoreUrl") or "")
    if configuration:
        url = str(config.get("configurationMetadataStoreUrl") or "") or url
    return create_metadata_store(
        url,
        data_dir=str(config.get("dataDir") or "data"),
        session_timeout_ms=int(config.get("metadataStoreSessionTimeoutMillis") or DEFAULT_SESSION_TIMEOUT_MS),
        operation_timeout_s=float(
            config.get("metadataStoreOperationTimeoutSeconds") or DEFAULT_OPERATION_TIMEOUT_S
        ),
    )


__all__ = [
    "NEW",
    "MAX_VALUE_SIZE",
    "BadVersion",
    "Check",
    "Delete",
    "GetResult",
    "InvalidPath",
    "KeyNotFound",
    "MetadataStore",
    "MetadataStoreError",
    "NotEmpty",
    "Notification",
    "NotificationType",
    "Op",
    "Put",
    "SessionEvent",
    "Stat",
    "StoreUnavailable",
    "ValueTooLarge",
    "Watch",
    "create_metadata_store",
    "store_from_config",
]
