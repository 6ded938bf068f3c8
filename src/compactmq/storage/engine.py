"""Storage: the entry point to a data directory (ledgers, upper layers' areas, metadata.db)."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

from ..config import Config, float_setting, int_setting, load_config
from ..errors import AlreadyExists, CompactMQError, Conflict, NotFound, StorageError, TopicNotFound
from ..naming import TopicName, canonical
from . import dir_owner
from .managed_ledger import ManagedLedger
from .modes import DIR_MODE, FILE_MODE, private_data_dir
from .metadata_store import DEFAULT_OPERATION_TIMEOUT_S, DEFAULT_SESSION_TIMEOUT_MS, create_metadata_store
from .metadata_store import MetadataStore as KeyValueStore
from .metadata_store.legacy_tables import open_legacy_tables
from .ledger_storage import LedgerStorage
from .object_group_flush import GroupFlush
from .object_group_sweep import SWEEP_INTERVAL_S, sweep_orphan_groups
from .object_ledger_upkeep import wait_merges
from .object_ledgers import ObjectLedgerSettings, ObjectLedgerStorage
from .object_store_url import KEY as OBJECT_STORE_KEY
from .object_store_url import location_of
from .offload import LedgerOffloader
from .offload.blobstore import BlobStore
from .resources import PulsarResources
from .resources.legacy_import import CONFIGURATION_KINDS, LOCAL_KINDS, import_legacy
from .resources.legacy_moves import import_moved
from .resources.fence import NO_FENCE, Fence, Fenced, FenceLease
from .resources.topic_metadata import TopicMetadata
from .seal import SealRequestWatcher, open_ledger_left
from .topic_paths import topic_relpath

log = logging.getLogger(__name__)

LOCK_FILE = "LOCK"
METADATA_FILE = "metadata.db"
LEDGERS_DIR = "ledgers"
#: threads sealing managed ledgers at close: their fsyncs overlap (the disk queues them), and the
#: pool stays small beside the broker's own
CLOSE_THREADS = 8
#: top-level directories upper layers keep per-topic data in (``<area>/<topic relpath>``): made
#: with the data directory, a topic's part deleted with the topic. Storage knows nothing of what
#: they hold; a layer registers its area when it is imported (the compaction layer's views).
TOPIC_AREAS: set[str] = set()


class Storage:
    """One data directory. One read-write ``Storage`` per directory at a time (a lock file
    enforces it); ``read_only=True`` opens it beside the writer (a ``compact-topic`` job):
    ledgers are read as they are, nothing is recovered or deleted, appends are refused,
    while the metadata store stays writable (compaction commits go through it).

    ``clock`` returns milliseconds since the epoch (tests pass a fake one).
    ``bootstrap_defaults=False``: the ``public/default`` namespace is not created here (the
    standalone broker creates it under Pulsar's rule, ``broker.default_namespace``).
    """

    def __init__(
        self,
        data_dir: str | os.PathLike,
        config: Config | None = None,
        *,
        clock: Callable[[], int] | None = None,
        read_only: bool = False,
        bootstrap_defaults: bool = True,
    ):
        self.data_dir = Path(data_dir)
        self.config = config if config is not None else load_config()
        self.read_only = read_only
        self._clock = clock or (lambda: int(time.time() * 1000))
        self._lock = threading.RLock()
        self._mls: dict[str, ManagedLedger] = {}
        self._lock_fd: int | None = None
        self._closed = False
        # objectLedgerStorageUrl: every managed ledger in that object store (None: local disk);
        # checked before anything is opened, so a bad value is one line at start
        location = location_of(str(self.config.get(OBJECT_STORE_KEY) or ""))
        self.object_store: BlobStore | None = None
        if location is not None:
            try:
                self.object_store = BlobStore(location)
            except CompactMQError as e:
                raise StorageError(f"{OBJECT_STORE_KEY}: {e}") from None
        self._object_settings = ObjectLedgerSettings.from_config(self.config)
        self._group_flush: GroupFlush | None = None  # objectLedgerGroupFlushEnabled; made when first used
        self._group_swept_at = 0.0  # monotonic time of the last orphan sweep of shared objects
        #: topic -> its ownership fence (``resources.fence``); a cluster sets this (single node:
        #: no fence). A managed ledger keeps the fence it was opened under until it closes.
        self.fence_provider: Callable[[str], Fence] = lambda topic: NO_FENCE
        self._bound_fences: dict[str, Fence] = {}
        try:
            private_data_dir(self.data_dir)  # owner-only (modes)
            (self.data_dir / LEDGERS_DIR).mkdir(mode=DIR_MODE, exist_ok=True)
            for area in sorted(TOPIC_AREAS):
                (self.data_dir / area).mkdir(mode=DIR_MODE, exist_ok=True)
        except OSError as e:
            raise StorageError(f"cannot create data directory {self.data_dir}: {e}") from e
        if not read_only:
            self._lock_fd = os.open(self.data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, FILE_MODE)
            try:
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(self._lock_fd)
                self._lock_fd = None
                raise StorageError(f"data directory {self.data_dir} is in use by another process") from None
        try:  # a read-only opener never creates the default namespace
            self._open_resources(bootstrap=bootstrap_defaults and not read_only)
        except BaseException:
            for store in self._stores_opened():  # close() is idempotent
                with contextlib.suppress(Exception):  # the error that stopped the opening wins
                    store.close()
            self._release_lock()
            raise
        # tiered storage: reads of offloaded ledgers work whatever the config says today
        self.offloader = LedgerOffloader(
            self.topic_metadata.ledgers,
            self.config,
            self._clock,
            read_only=read_only,
            compacted_view=lambda topic: self.resources.compaction.view_of(TopicName.parse(topic)),
            records=self.resources.offload_records,
            policies=self.policies,
        )
        self._seal_watcher: SealRequestWatcher | None = None
        if not read_only:
            self._sweep_offload()
            # a compact-topic job beside this process asks it to seal a topic (storage.seal)
            self._seal_watcher = SealRequestWatcher(self)

    def _open_resources(self, bootstrap: bool) -> None:
        """The metadata store ``metadataStoreUrl`` names (embedded: ``metadata.db`` here) and the
        resources over it; the tables of an older data directory are imported once."""
        self.metadata_store = self._open_store(str(self.config.get("metadataStoreUrl") or ""))
        self.configuration_store = self.metadata_store
        conf_url = str(self.config.get("configurationMetadataStoreUrl") or "")
        if conf_url and conf_url != str(self.config.get("metadataStoreUrl") or ""):
            try:
                self.configuration_store = self._open_store(conf_url)
            except BaseException:
                self.metadata_store.close()
                raise
        self.resources = PulsarResources(self.metadata_store, self.configuration_store)
        self.policies = self.resources.policies
        if not self.read_only:  # the writer imports; a compact-topic job beside it never does
            self._import_legacy()
        res = self.resources
        self.topic_metadata = TopicMetadata(
            res.managed_ledgers,
            res.ledger_ids,
            res.tenants,
            res.namespaces,
            res.policies,
            read_only=self.read_only,
            mark_delete_rate=float_setting(self.config, "managedLedgerDefaultMarkDeleteRateLimit"),
            flush_interval_s=float_setting(self.config, "managedLedgerCursorPositionFlushSeconds"),
            max_ranges=int_setting(self.config, "managedLedgerMaxUnackedRangesToPersist"),
            clock=self._clock,
        )
        self.topic_metadata.fence_for = self.fence_for
        if bootstrap:  # like a Pulsar standalone without security: the default namespace exists
            self.ensure_namespace("public/default")

    def _stores_opened(self) -> list[KeyValueStore]:
        return [
            s
            for s in (getattr(self, "metadata_store", None), getattr(self, "configuration_store", None))
            if s
        ]

    def _import_legacy(self) -> None:
        """Move what an older data directory's tables hold (``metadata.db`` from before the
        metadata store) into the store, once per kind; a directory without them is left alone."""
        old = open_legacy_tables(self.data_dir / METADATA_FILE)
        if old is None:
            return
        try:
            import_legacy(old, self.configuration_store, CONFIGURATION_KINDS)
            import_moved(old, self.metadata_store, self.configuration_store)
            import_legacy(old, self.metadata_store, LOCAL_KINDS)
            self.resources.ledger_ids.ensure_above(old.last_ledger_id())
        finally:
            old.close()

    def _open_store(self, url: str) -> KeyValueStore:
        return create_metadata_store(
            url,
            data_dir=self.data_dir,
            session_timeout_ms=int(
                self.config.get("metadataStoreSessionTimeoutMillis") or DEFAULT_SESSION_TIMEOUT_MS
            ),
            operation_timeout_s=float(
                self.config.get("metadataStoreOperationTimeoutSeconds") or DEFAULT_OPERATION_TIMEOUT_S
            ),
        )

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    # --- tenants and namespaces ------------------------------------------------------------

    def ensure_namespace(self, namespace: str) -> None:
        """Create ``namespace`` and its tenant (with no info) when missing, as a standalone broker
        does for a topic auto-created in a namespace nobody made."""
        if self.resources.namespaces.exists(namespace):
            return
        tenant = namespace.partition("/")[0]
        for create in (
            lambda: self.resources.tenants.create(tenant, {}),
            lambda: self.resources.namespaces.create(namespace, {}),
        ):
            try:
                create()
            except AlreadyExists:
                pass  # another thread or process made it meanwhile

    def delete_namespace(self, namespace: str) -> None:
        """Delete a namespace that has no topics, with its policies (fields of its value).
        ``Conflict`` when topics remain, ``NotFound`` when it does not exist."""
        if self.topic_metadata.topics(namespace):
            raise Conflict(f"namespace {namespace!r} still has topics")
        if not self.resources.namespaces.exists(namespace):
            raise NotFound(f"namespace {namespace!r} does not exist")
        self.resources.namespaces.delete(namespace)

    # --- partitioned topics (their metadata is in the resources) ----------------------------

    def partitions(self, topic: str) -> int | None:
        """Partitions of a partitioned topic, None when ``topic`` is not one."""
        return self.resources.partitioned_topics.partitions(TopicName.parse(topic))

    def partitioned_topics(self, namespace: str | None = None) -> dict[str, int]:
        """``{name: partitions}`` of the partitioned topics of ``namespace`` (None: of all), sorted."""
        res = self.resources
        if namespace is None:
            namespaces = [n for t in res.tenants.list_tenants() for n in res.namespaces.list_namespaces(t)]
        else:
            namespaces = [namespace]
        found = {}
        for ns in namespaces:
            for domain in ("persistent", "non-persistent"):
                for tn in res.partitioned_topics.list_topics(ns, domain):
                    n = res.partitioned_topics.partitions(tn)
                    if n is not None:  # deleted meanwhile
                        found[str(tn)] = n
        return dict(sorted(found.items()))

    def create_partitioned_topic(self, topic: str, partitions: int) -> None:
        """``AlreadyExists`` when it exists; fewer than one partition is ``InvalidInput``."""
        self.resources.partitioned_topics.create(TopicName.parse(topic), partitions)

    def update_partitioned_topic(self, topic: str, partitions: int) -> None:
        """Partitions can only be added (as in Pulsar); the same number changes nothing."""
        tn = TopicName.parse(topic)
        current = self.resources.partitioned_topics.partitions(tn)
        if current is None:
            raise TopicNotFound(f"partitioned topic {topic} does not exist")
        if partitions == current:
            return
        if partitions < current:
            raise Conflict(f"cannot shrink {topic} from {current} to {partitions} partitions")
        try:
            self.resources.partitioned_topics.update_partitions(tn, partitions)
        except NotFound:
            raise TopicNotFound(f"partitioned topic {topic} does not exist") from None

    def delete_partitioned_topic(self, topic: str) -> None:
        try:
            self.resources.partitioned_topics.delete(TopicName.parse(topic))
        except NotFound:
            raise TopicNotFound(f"partitioned topic {topic} does not exist") from None

    # --- paths -----------------------------------------------------------------------------

    def now_ms(self) -> int:
        """The storage clock (milliseconds since the epoch; tests pass a fake one)."""
        return self._clock()

    def topic_dir(self, topic: str) -> str:
        return str(self.data_dir / LEDGERS_DIR / topic_relpath(canonical(topic)))

    def area_dirs(self, topic: str) -> list[str]:
        """The topic's directories in the upper layers' areas (``TOPIC_AREAS``)."""
        rel = topic_relpath(canonical(topic))
        return [str(self.data_dir / area / rel) for area in sorted(TOPIC_AREAS)]

    # --- managed ledgers -------------------------------------------------------------------

    def open_managed_ledger(self, topic: str, create: bool = True) -> ManagedLedger:
        """The managed ledger of ``topic`` (one object per topic per Storage).

        ``TopicNotFound`` when it does not exist and ``create`` is False (or read-only)."""
        name = canonical(topic)
        with self._lock:
            if self._closed:
                raise StorageError("storage is closed")
            ml = self._mls.get(name)
            stale = ml is not None and self._bound_to_ended_ownership(name)
            if ml is not None and not ml.fenced and not ml.closed and not stale:
                return ml
            if ml is not None:  # a write or sync failed: reopen, which recovers the ledger
                self._close_stale(name, ml) if stale else ml.close()
            if not self.topic_metadata.topic_exists(name):
                if not create or self.read_only:
                    raise TopicNotFound(f"topic {name} does not exist")
                if dir_owner.owned_by_another(self.topic_dir(name), name):
                    dir_owner.claim(self.topic_dir(name), name)  # raises: says whose it is
                self.ensure_namespace(TopicName.parse(name).namespace_name)
                self.topic_metadata.create_topic(name)
            fence = self._bind_fence(name)
            ml = ManagedLedger(
                name,
                self.topic_dir(name),
                self.topic_metadata,  # type: ignore[arg-type]  # the managed ledger's metadata API
                self.config,
                self._clock,
                read_only=self.read_only,
                on_close=self._forget,
                offloader=self.offloader,
                ledger_storage=self._ledger_storage(name, fence),
            )
            self._mls[name] = ml
            return ml

    def _bound_to_ended_ownership(self, topic: str) -> bool:
        """The open managed ledger of ``topic`` was opened under an ownership that is over (lost,
        given up, or followed by a newer one of this broker): none of its commits can pass.
        (Its unload failed -- a close under a lost fence raises -- so it was never forgotten.)"""
        bound = self._bound_fences.get(topic)
        if bound is None or not bound.checks:
            return False
        current = self.fence_provider(topic)
        return bound.lost or bound.revoked or current.lost or bound.checks != current.checks

    def _close_stale(self, topic: str, ml: ManagedLedger) -> None:
        """Close (as far as a lost fence lets it) and forget a ledger of an ended ownership, so
        that the topic is recovered anew under the current one (caller holds the lock)."""
        try:
            ml.close()
        except Exception as e:  # noqa: BLE001 - a commit under the ended fence fails: expected
            log.warning("closing %s, opened under an ownership that ended, failed: %s", topic, e)
        if self._mls.get(topic) is ml:
            del self._mls[topic]
        self._bound_fences.pop(topic, None)

    def _bind_fence(self, topic: str) -> Fence:
        """The fence a managed ledger being opened writes under, kept until it closes (a
        commit of an old instance never passes under a newer ownership of the same broker)."""
        if self.read_only:
            return NO_FENCE
        fence = self.fence_provider(topic)
        if fence.lost:
            raise Fenced(f"topic {topic} is not owned by this broker")
        self._bound_fences[topic] = fence
        return fence

    def fence_for(self, topic: str) -> Fence:
        """The fence commits of ``topic``'s ledger list and cursors carry (``resources.fence``)."""
        bound = self._bound_fences.get(canonical(topic))
        return bound if bound is not None else self.fence_provider(canonical(topic))

    def _ledger_storage(self, topic: str, fence: Fence) -> LedgerStorage | None:
        """Where ``topic``'s ledger bytes go: the object store (``objectLedgerStorageUrl``), its
        keys under the epoch of this process's ownership; None: the local default."""
        if self.object_store is None:
            return None
        storage = ObjectLedgerStorage(
            self.object_store, topic, self._object_settings, fence.epoch, self._group(), fence
        )
        if fence.checks:
            session_s = (
                int(self.config.get("metadataStoreSessionTimeoutMillis") or DEFAULT_SESSION_TIMEOUT_MS) / 1000
            )
            storage.ownership_check = FenceLease(fence, self.metadata_store, session_s / 2).check
        return storage

    def _group(self) -> GroupFlush | None:
        """The process's group flush (``object_group_flush``) when ``objectLedgerGroupFlushEnabled``."""
        if self.object_store is None or not self.config.get("objectLedgerGroupFlushEnabled"):
            return None
        with self._lock:
            if self._group_flush is None:
                s = self._object_settings
                self._group_flush = GroupFlush(self.object_store, self.metadata_store, s.flush_max_bytes)
            return self._group_flush

    def topics(self) -> list[str]:
        return self.topic_metadata.topics()

    def open_managed_ledger_count(self) -> int:
        """Managed ledgers open in this process (``pulsar_ml_count``)."""
        with self._lock:
            return sum(1 for ml in self._mls.values() if not ml.closed)

    def seal_current_ledger(self, topic: str) -> bool:
        """Seal what ``topic`` is writing (a rollover), so that every entry it holds now is in a
        sealed ledger; True when a ledger was sealed. A topic no one has open needs nothing, unless
        a crash left a ledger OPEN: opening it runs the recovery, which seals that ledger."""
        name = canonical(topic)
        with self._lock:
            ml = self._mls.get(name)
        if ml is None or ml.closed or ml.fenced:
            if not self.topic_metadata.topic_exists(name):
                raise TopicNotFound(f"topic {name} does not exist")
            if (ml is None or ml.closed) and not open_ledger_left(self.topic_metadata, name):
                return False
            ml = self.open_managed_ledger(name, create=False)
        try:
            return ml.rollover()
        except StorageError:
            if ml.closed:  # closed meanwhile: closing sealed it
                return True
            raise

    def delete_managed_ledger(self, topic: str) -> None:
        """Delete a topic: its metadata in one transaction, then its files. ``TopicNotFound``
        when absent. (Callers check for subscriptions first; this deletes them too.)"""
        name = canonical(topic)
        with self._lock:
            ml = self._mls.pop(name, None)
        if ml is not None:
            ml.close()
        if not self.topic_metadata.topic_exists(name):
            raise TopicNotFound(f"topic {name} does not exist")
        # the compaction state first: a crash in between leaves a topic never compacted, not a
        # deleted topic's view pointer waiting for a topic of the same name
        self.resources.compaction.delete(TopicName.parse(name))
        self.topic_metadata.delete_topic(name)
        for d in (self.topic_dir(name), *self.area_dirs(name)):
            if dir_owner.owned_by_another(d, name):  # never another topic's files
                log.warning("not deleting %s: it belongs to another topic", d)
                continue
            shutil.rmtree(d, ignore_errors=True)
        self._delete_objects(name)
        try:  # its offloaded objects are dead now; a failure here is retried by maintenance
            self.offloader.delete_dead(name)
        except CompactMQError as e:
            log.warning("deleting the offloaded objects of %s failed (retried later): %s", name, e)

    def _delete_objects(self, topic: str) -> None:
        """A deleted topic's ledger objects go (a failure leaves orphans a later open of a topic
        of the same name removes: they are not in its ledger list)."""
        if self.object_store is None:
            return
        ols = ObjectLedgerStorage(self.object_store, topic, self._object_settings, group=self._group())
        wait_merges()
        try:
            for ledger_id in sorted(ols.list()):
                ols.delete(ledger_id)
            if ols.group is not None:  # its emptied nodes under the range records' root go too
                ols.group.forget_topic(ols.topic_path)
        except (CompactMQError, OSError) as e:
            log.warning("deleting the ledger objects of %s failed: %s", topic, e)

    def run_maintenance(self) -> dict[str, list[int]]:
        """Roll ledgers past their age and trim every open topic to its retention; the broker
        calls this every ``retentionCheckIntervalInSeconds``. Returns deleted ledger ids per
        topic. A topic that fails is skipped (its error surfaces on its next append/read)."""
        if self.read_only:
            return {}
        with self._lock:
            mls = [ml for ml in self._mls.values() if not ml.closed]
        deleted: dict[str, list[int]] = {}
        for ml in mls:
            try:
                if not ml.fenced:
                    ml.maybe_rollover()
                ids = ml.trim_to_retention()
            except CompactMQError:
                continue
            if ids:
                deleted[ml.topic] = ids
        self.offloader.run_maintenance(mls)
        self._sweep_groups()
        return deleted

    def _sweep_groups(self) -> None:
        """With a group flush, every ``SWEEP_INTERVAL_S`` at most: the orphan sweep of shared
        objects (``object_group_sweep``); any broker may run it, several at once are safe."""
        group = self._group()
        if group is None or time.monotonic() - self._group_swept_at < SWEEP_INTERVAL_S:
            return
        self._group_swept_at = time.monotonic()
        try:
            sweep_orphan_groups(group.store, group.metadata, own=group)
        except CompactMQError as e:
            log.warning("orphan sweep of shared objects failed (retried later): %s", e)

    def _sweep_offload(self) -> None:
        """At start, before any offload runs: objects of interrupted offloads and of ledgers
        deleted before a crash go (an unreachable object store only delays this)."""
        try:
            self.offloader.delete_dead()
            self.offloader.sweep_orphans()
        except CompactMQError as e:
            log.warning("offload clean-up at start failed (retried by maintenance): %s", e)

    def _forget(self, ml: ManagedLedger) -> None:
        with self._lock:
            mine = self._mls.get(ml.topic) is ml
            if mine:
                del self._mls[ml.topic]
            fence = self._bound_fences.get(ml.topic)
        try:  # closed or unloaded: its cursors' positions held back by the rate limit are written
            self.topic_metadata.flush_cursors(ml.topic)  # under the fence it was opened with
        except CompactMQError as e:
            log.warning("writing the cursors of %s at close failed: %s", ml.topic, e)
        if mine:
            with self._lock:  # unless a new open bound its own meanwhile
                if self._bound_fences.get(ml.topic) is fence and ml.topic not in self._mls:
                    self._bound_fences.pop(ml.topic, None)

    def close(self) -> None:
        """Close every managed ledger (sealing current ledgers), the metadata store, the lock."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            mls = list(self._mls.values())
        try:
            if self._seal_watcher is not None:
                self._seal_watcher.stop()
            self.offloader.close()
            self._close_all(mls)
            self.topic_metadata.close()
        finally:
            # whatever a topic's close raised, the store's session and the directory lock go
            if self.configuration_store is not self.metadata_store:
                self.configuration_store.close()
            self.metadata_store.close()
            self._release_lock()

    def _close_all(self, mls: list[ManagedLedger]) -> None:
        """Close many managed ledgers at once: their seals (fsyncs of ledger and index files)
        overlap on up to ``CLOSE_THREADS`` threads, and their ledger-list changes are written in a
        few metadata-store commits rather than one per topic (``TopicMetadata.shared_batch``)."""

        def close(ml: ManagedLedger) -> None:
            try:
                ml.close()
            except Exception as e:  # e.g. Fenced: another broker owns the topic now
                log.warning("closing %s: %s (its last writes belong to the new owner)", ml.topic, e)

        if not mls:
            return
        with self.topic_metadata.shared_batch():
            if len(mls) == 1:
                close(mls[0])
                return
            try:
                with ThreadPoolExecutor(min(CLOSE_THREADS, len(mls)), thread_name_prefix="ml-close") as pool:
                    list(pool.map(close, mls))
            except RuntimeError:  # the interpreter is exiting: no new threads; close here
                for ml in mls:
                    close(ml)  # a managed ledger's close is idempotent

    def __enter__(self) -> "Storage":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
