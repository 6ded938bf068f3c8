"""``LedgerOffloader``: copies sealed ledgers to object storage, reads them back, deletes them.

One per ``Storage``. What it does, and in which order (each step is crash-safe on its own):

Offload of one sealed ledger (``offload``; a topic runs one offload at a time)
    1. write the data object (the ledger file in blocks), then the index object, under names
       no one has used (``<ledger id>-<uuid>``);
    2. create the ledger's offload record (the commit point; a ledger has at most one), then check
       that the ledger still exists: if retention deleted it meanwhile, the record is dead and its
       objects and the record go at once (or, after a crash, by the next ``delete_dead``);
    3. the managed ledger now knows the ledger is offloaded; its local copy stays until the
       deletion lag has passed (``managedLedgerOffloadDeletionLagMs``, namespace policy
       ``offloadDeletionLagMs``), then the files are unlinked and the row stamped.
    A crash after 1 leaves orphans (objects no row names): ``sweep_orphans`` deletes them when
    the storage opens. A crash after 2 leaves a committed offload and the local copy: both
    serve reads, and the deletion lag is simply honoured later.

Reads (``read_range``) go through ``blocks.read_range``: one ranged read per missing run of
chunks, the process-wide ``ReadCache`` in front. Other layers' per-topic data (``Companion``: the
compaction layer's views) is offloaded with the topic's ledgers by the companion itself, recorded
in the same catalog, and read by its own layer through the same cache.

Deletion: retention, topic deletion and compaction delete ledger rows (or swap the compacted
ledger) first; ``delete_dead`` then deletes the objects of catalog rows that no longer name a
live ledger, then the rows. Every maintenance pass runs it again, so a crash in between only
delays the deletion.

Automatic offload follows Pulsar: checked after each ledger rollover and on every maintenance
pass (``retentionCheckIntervalInSeconds``). A topic keeps at most ``offloadThreshold`` bytes
locally (namespace policy, else ``offloadPolicies``, else
``managedLedgerOffloadAutoTriggerSizeThresholdBytes``; -1 never, 0 offload every sealed ledger),
and sealed ledgers older than ``offloadThresholdInSeconds`` are offloaded.

Each step an offload or a dead-object deletion completes is reported to ``LedgerOffloader.probe``
by name (``FAULT_POINTS``, ``DEAD_DELETE_FAULT``), when one is set: the crash tests set one that
kills the process there (``tests/offload_fault.py``); production sets none.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
import uuid
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Protocol

from ...config import policy_keys
from ...errors import CompactMQError, Conflict, InvalidConfiguration, StorageError
from .. import ledger_file as lf
from ..position import LedgerInfo, Position
from ..topic_paths import topic_relpath
from . import blocks as bk
from .blobstore import OffloadLocation, check_location_allowed, location_from_settings, open_store
from ..metadata_store import BadVersion
from ..resources.offload_records import OffloadRecordResources
from .catalog import COMPACTED, LEDGER, OffloadCatalog, OffloadRecord

log = logging.getLogger(__name__)

FAULT_POINTS = ("after-data", "after-index", "after-commit", "after-local-delete")
# the step between the metadata store letting go of a ledger (retention, topic deletion, a newer
# compacted ledger) and the deletion of its objects
DEAD_DELETE_FAULT = "before-dead-delete"

# namespace policy keys (Pulsar's admin names)
OFFLOAD_THRESHOLD = policy_keys.OFFLOAD_THRESHOLD
OFFLOAD_THRESHOLD_SECONDS = policy_keys.OFFLOAD_THRESHOLD_SECONDS
OFFLOAD_DELETION_LAG = policy_keys.OFFLOAD_DELETION_LAG
OFFLOAD_POLICIES = policy_keys.OFFLOAD_POLICIES

NOT_RUN, RUNNING, SUCCESS, ERROR = "NOT_RUN", "RUNNING", "SUCCESS", "ERROR"
MAX_CACHED_INDEXES = 64


class Companion(Protocol):
    """Per-topic data another layer keeps beside the ledgers and offloads with them (the
    compaction layer's views): the offloader calls these at the points where it handles the
    topic's own ledgers, and records what they copy in its catalog as they tell it."""

    def offload(self, topic: str, loc: OffloadLocation) -> None:
        """Copy what is not offloaded yet to ``loc`` (called during the topic's offload)."""

    def pending(self, topic: str) -> bool:
        """Whether something of ``topic`` waits to be offloaded (an automatic offload starts)."""

    def delete_local(self, topic: str, lag_ms: int) -> None:
        """Delete local copies offloaded longer than ``lag_ms`` ago."""


#: the last part of an offloaded ledger's key (``_offload_one``): ``<ledger id>-<uuid>.data`` or
#: ``.index``; an object ledger's objects (``object_ledgers``: ``<ledger id>/f-...``, ``m-...``,
#: ``index``) never match
_OFFLOAD_NAME = re.compile(r"^[0-9]+-[^/]+\.(data|index)$")


def is_offload_key(key: str) -> bool:
    """True for a key an offload writes (``ledgers/<topic>/<ledger id>-<uuid>.data|.index``)."""
    return bool(_OFFLOAD_NAME.match(key.rsplit("/", 1)[-1]))


def _relpath(topic: str) -> str:
    return topic_relpath(topic).replace(os.sep, "/")


class LedgerOffloader:
    #: called with the name of each step reached (module docstring); None: nothing is called
    probe: Callable[[str], None] | None = None

    def __init__(
        self,
        ledgers: Callable[[str], list[LedgerInfo]],
        config,
        clock: Callable[[], int],
        read_only: bool = False,
        compacted_view: Callable[[str], int | None] | None = None,
        *,
        records: OffloadRecordResources,
        policies: Any = None,
    ):
        """``ledgers(topic)``: the topic's ledger list (``TopicMetadata.ledgers``), asked whether a
        ledger is alive; ``records``: where the offload records live; ``policies``: namespace
        policies (``resources.PolicyResources``)."""
        self._ledgers = ledgers
        # topic -> the id of its compacted view in force (the compaction service's pointer), or None
        self.compacted_view = compacted_view or (lambda topic: None)
        # set by ``compaction.tiered.attach``: topic -> the topic's compaction lock (``release()``),
        # or None while a run holds it. Dead compacted rows are deleted only under it; unset,
        # they are kept (a run may be about to commit the view a row names).
        self.compacted_lock: Callable[[str], Any] | None = None
        # set by the layers that keep per-topic data of their own beside the ledgers (the compaction
        # layer's views, ``compaction.tiered.attach``): each is offloaded, and its local copy
        # deleted after the lag, with the topic's ledgers (``Companion``). Storage knows nothing of
        # what they hold, where they keep it, or its format.
        self.companions: list[Companion] = []
        self.policies = policies
        self.config = config
        self.clock = clock
        self.read_only = read_only
        self.catalog = OffloadCatalog(records, self._alive)
        self.instance = self.catalog.instance_id()
        self.max_block = max(1 << 16, int(config["s3ManagedLedgerOffloadMaxBlockSizeInBytes"]))
        self.chunk = max(4096, int(config["s3ManagedLedgerOffloadReadBufferSizeInBytes"]))
        # one read cache per process, shared with the readers of offloaded compacted ledgers
        bk.configure_reads(int(config["managedLedgerOffloadReadCacheSizeInBytes"]), self.chunk)
        self.cache = bk.shared_cache()
        self._lock = threading.Lock()
        self._running: set[str] = set()
        self._queued: set[str] = set()  # triggered over REST, not started yet
        self._status: dict[str, dict[str, Any]] = {}
        self._indexes: OrderedDict[str, bk.OffloadedIndex] = OrderedDict()
        self._pool: ThreadPoolExecutor | None = None
        self._closed = False

    # --- configuration ------------------------------------------------------------------------

    def _policies(self, topic: str) -> dict[str, Any]:
        from ...naming import TopicName

        return self.policies.get_namespace_policies(TopicName.parse(topic).namespace_name)

    def location_for(self, topic: str) -> OffloadLocation | None:
        """Where ``topic`` offloads to: its namespace's ``offloadPolicies``, else broker.conf."""
        pol = self._policies(topic).get(OFFLOAD_POLICIES) or {}
        if not pol.get("managedLedgerOffloadDriver"):
            return location_from_settings(self.config, prefix=self.instance)
        loc = location_from_settings(pol, prefix=self.instance)
        if loc is not None:  # a tenant's policy, maybe stored before the allowlist: checked at use too
            check_location_allowed(loc, self.config)
        return loc

    def settings_for(self, topic: str) -> dict[str, int]:
        """thresholdBytes, thresholdSeconds, deletionLagMs in force for ``topic``."""
        ns = self._policies(topic)
        pol = ns.get(OFFLOAD_POLICIES) or {}

        def pick(ns_key, pol_key):
            """The namespace's own policy, else its offloadPolicies field, else the broker's."""
            for value in (ns.get(ns_key), pol.get(pol_key)):
                if value is not None:
                    return int(value)
            return int(self.config[policy_keys.DEFAULT_SETTINGS[ns_key]])

        return {
            "thresholdBytes": pick(OFFLOAD_THRESHOLD, "managedLedgerOffloadThresholdInBytes"),
            "thresholdSeconds": pick(OFFLOAD_THRESHOLD_SECONDS, "managedLedgerOffloadThresholdInSeconds"),
            "deletionLagMs": pick(OFFLOAD_DELETION_LAG, "managedLedgerOffloadDeletionLagInMillis"),
        }

    def _alive(self, rec: OffloadRecord) -> bool:
        """Whether the ledger ``rec`` names still exists: a ledger of its topic, or the topic's
        compacted view in force (the compaction service's pointer, ``compacted_view``)."""
        if rec.kind == LEDGER:
            return any(li.ledger_id == rec.ledger_id for li in self._ledgers(rec.topic))
        return self.compacted_view(rec.topic) == rec.ledger_id

    def commit_record(self, rec: OffloadRecord, store) -> bool:
        """Create ``rec`` (the commit point of an offload), then check its ledger is still alive;
        False when it is not (or another offload recorded it first): our objects are deleted."""
        try:
            self.catalog.add(rec)
        except BadVersion:  # the ledger was offloaded by another run meanwhile: ours are orphans
            for key in {rec.data_key, rec.index_key}:
                store.delete(key)
            return False
        if not self._alive(rec):  # deleted while we copied: the record is dead, delete it now
            self.delete_objects(rec)
            return False
        return True

    def reached(self, point: str) -> None:
        """Report step ``point`` to the ``probe`` (module docstring)."""
        if self.probe is not None:
            self.probe(point)

    # --- offloading -----------------------------------------------------------------------------

    def offload(self, ml, before: Position | None = None, ledger_ids: list[int] | None = None) -> list[int]:
        """Offload the sealed, not yet offloaded ledgers of ``ml`` whose id is below
        ``before.ledger_id`` (all sealed ones when None), or exactly ``ledger_ids``. Runs in the
        caller's thread; ``Conflict`` when an offload of this topic is already running."""
        if self.read_only:
            raise StorageError("offload needs the broker's read-write storage")
        loc = self.location_for(ml.topic)
        if loc is None:
            raise InvalidConfiguration(
                f"{ml.topic}: no offload driver is configured "
                "(managedLedgerOffloadDriver or the namespace's offloadPolicies)"
            )
        with self._lock:
            if ml.topic in self._running:
                raise Conflict(f"an offload of {ml.topic} is already running")
            self._running.add(ml.topic)
            self._status[ml.topic] = {"status": RUNNING, "lastError": "", "firstUnoffloadedMessage": None}
        done: list[int] = []
        try:
            candidates = ml.sealed_ledgers_to_offload()
            if ledger_ids is not None:
                wanted = set(ledger_ids)
                candidates = [c for c in candidates if c in wanted]
            elif before is not None:
                candidates = [c for c in candidates if c < before[0]]
            for ledger_id in candidates:
                if self._offload_one(ml, ledger_id, loc):
                    done.append(ledger_id)
            self.offload_companions(ml.topic, loc)
            self.delete_local_copies(ml)
            status = {"status": SUCCESS, "lastError": ""}
        except BaseException as e:
            status = {"status": ERROR, "lastError": f"{type(e).__name__}: {e}"}
            log.error("offload of %s failed: %s", ml.topic, status["lastError"])
            raise
        finally:
            # the managed ledger's lock is taken OUTSIDE ours: a rollover holds its lock and then
            # takes ours (maybe_auto_offload), so the other order would deadlock
            try:
                status["firstUnoffloadedMessage"] = ml.first_unoffloaded_position()
            except CompactMQError:
                status["firstUnoffloadedMessage"] = None
            with self._lock:
                self._running.discard(ml.topic)
                self._status[ml.topic] = status
        return done

    def _offload_one(self, ml, ledger_id: int, loc: OffloadLocation) -> bool:
        src = ml.offload_source(ledger_id)
        if src is None:  # trimmed or already offloaded meanwhile
            return False
        path, index = src
        store = open_store(loc)
        base = f"ledgers/{_relpath(ml.topic)}/{ledger_id:012d}-{uuid.uuid4().hex}"
        data_key, index_key = base + ".data", base + ".index"
        table = bk.plan_blocks(index.offsets, index.data_end, self.max_block)
        fd = os.open(path, os.O_RDONLY)
        try:
            size = store.put(data_key, bk.iter_blocks(fd, table))
        finally:
            os.close(fd)
        self.reached("after-data")
        store.put(index_key, [bk.encode_index(ledger_id, table, lf.encode_index(*index), size)])
        self.reached("after-index")
        rec = OffloadRecord(data_key, index_key, LEDGER, ml.topic, ledger_id, loc, size, self.clock())
        if not self.commit_record(rec, store):
            return False
        self.reached("after-commit")
        ml.attach_offload(rec)
        log.info("offloaded ledger %d of %s to %s (%d bytes)", ledger_id, ml.topic, store.uri(data_key), size)
        return True

    def offload_companions(self, topic: str, loc: OffloadLocation | None = None) -> None:
        """Offload what the companions keep of ``topic`` (``Companion.offload``)."""
        if self.read_only:
            return
        loc = loc or self.location_for(topic)
        if loc is not None:
            for companion in self.companions:
                companion.offload(topic, loc)

    def trigger(self, ml, before: Position | None) -> None:
        """Start ``offload`` in the background; ``Conflict`` when one is running already."""
        if self.location_for(ml.topic) is None:
            raise InvalidConfiguration(
                f"{ml.topic}: no offload driver is configured "
                "(managedLedgerOffloadDriver or the namespace's offloadPolicies)"
            )
        with self._lock:
            if ml.topic in self._running or ml.topic in self._queued:
                raise Conflict(f"an offload of {ml.topic} is already running")
            # RUNNING from now on, so that a status read right after the trigger never sees the
            # previous run's outcome
            self._queued.add(ml.topic)
            self._status[ml.topic] = {"status": RUNNING, "lastError": "", "firstUnoffloadedMessage": None}
        self._submit(self._offload_queued, ml, before)

    def _offload_queued(self, ml, before) -> None:
        with self._lock:
            self._queued.discard(ml.topic)
        self._offload_quietly(ml, before)

    def _offload_quietly(self, ml, before=None, ledger_ids=None) -> None:
        try:
            self.offload(ml, before, ledger_ids)
        except Conflict:
            pass
        except Exception:  # recorded in the status; the broker goes on
            pass

    def _submit(self, fn, *args) -> None:
        with self._lock:
            if self._closed:
                return
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="offload")
            self._pool.submit(fn, *args)

    def status(self, topic: str) -> dict[str, Any]:
        """Pulsar's OffloadProcessStatus: status, lastError, firstUnoffloadedMessage."""
        with self._lock:
            st = dict(
                self._status.get(topic)
                or {"status": NOT_RUN, "lastError": "", "firstUnoffloadedMessage": None}
            )
        return st

    # --- automatic offload and deletion lag ----------------------------------------------------

    def auto_offload_candidates(self, ml) -> list[int]:
        """Sealed ledgers the topic's thresholds say to offload now (Pulsar's rules)."""
        try:
            if self.location_for(ml.topic) is None:
                return []
        except InvalidConfiguration:
            return []
        s = self.settings_for(ml.topic)
        by_size, by_age = s["thresholdBytes"], s["thresholdSeconds"]
        if by_size < 0 and by_age < 0:
            return []
        sealed = set(ml.sealed_ledgers_to_offload())
        now = self.clock()
        kept = 0
        out = []
        for info, offloaded in reversed(ml.ledgers_with_offload()):
            if not offloaded:
                kept += info.size
            if info.ledger_id not in sealed:
                continue
            old = by_age >= 0 and info.closed_ms is not None and now - info.closed_ms >= by_age * 1000
            if (by_size >= 0 and kept > by_size) or old:
                out.append(info.ledger_id)
        return sorted(out)

    def maybe_auto_offload(self, ml) -> None:
        """After a rollover (called under the managed ledger's lock): check in the background."""
        if self.read_only:
            return
        self._submit(self._auto, ml)

    def _auto(self, ml) -> None:
        if ml.closed:
            return
        try:
            ids = self.auto_offload_candidates(ml)
        except CompactMQError:
            return
        if ids or self._companion_pending(ml.topic):
            self._offload_quietly(ml, None, ids)

    def _companion_pending(self, topic: str) -> bool:
        """A companion has something of a topic with an offload threshold to offload."""
        s = self.settings_for(topic)
        if s["thresholdBytes"] < 0 and s["thresholdSeconds"] < 0:
            return False
        return any(c.pending(topic) for c in self.companions)

    def delete_local_copies(self, ml) -> list[int]:
        """Delete local copies of offloaded ledgers past the deletion lag."""
        lag = self.settings_for(ml.topic)["deletionLagMs"]
        if lag < 0:
            return []
        for companion in self.companions:
            companion.delete_local(ml.topic, lag)
        now = self.clock()
        out = []
        for rec in ml.offloaded_with_local_copy():
            if now - rec.offloaded_ms >= lag and ml.release_local_copy(rec.ledger_id):
                self.reached("after-local-delete")
                self.catalog.mark_local_deleted(rec, now)
                out.append(rec.ledger_id)
        return out

    def run_maintenance(self, mls) -> None:
        """The monitor's pass: dead objects, deletion lag, automatic offload (in the background)."""
        if self.read_only:
            return
        try:
            self.delete_dead()
        except CompactMQError as e:
            log.warning("deleting offloaded objects of deleted ledgers failed: %s", e)
        for ml in mls:
            if ml.closed:
                continue
            try:
                self.delete_local_copies(ml)
            except CompactMQError as e:
                log.warning("deleting local copies of offloaded ledgers of %s failed: %s", ml.topic, e)
            self.maybe_auto_offload(ml)

    # --- reading --------------------------------------------------------------------------------

    def index(self, rec: OffloadRecord) -> bk.OffloadedIndex:
        with self._lock:
            idx = self._indexes.get(rec.index_key)
            if idx is not None:
                self._indexes.move_to_end(rec.index_key)
                return idx
        idx = bk.decode_index(open_store(rec.location).read_all(rec.index_key))
        with self._lock:
            self._indexes[rec.index_key] = idx
            while len(self._indexes) > MAX_CACHED_INDEXES:
                self._indexes.popitem(last=False)
        return idx

    def read_range(self, rec: OffloadRecord, lo: int, hi: int) -> bytes:
        return bk.read_range(
            open_store(rec.location), self.cache, rec.data_key, rec.data_size, lo, hi, self.chunk
        )

    def compacted_record(self, ledger_id: int) -> OffloadRecord | None:
        return self.catalog.get(COMPACTED, ledger_id)

    # --- deleting -------------------------------------------------------------------------------

    def delete_objects(self, rec: OffloadRecord) -> None:
        store = open_store(rec.location)
        self.cache.drop_object(bk.object_id(store, rec.data_key))
        store.delete(rec.data_key)
        if rec.index_key.endswith("/"):  # an object stored as parts under a prefix
            store.delete_prefix(rec.index_key.rstrip("/"))
        elif rec.index_key != rec.data_key:
            store.delete(rec.index_key)
        self.catalog.remove(rec)

    def delete_dead(self, topic: str | None = None, *, compaction_locked: bool = False) -> int:
        """Delete the objects of catalog rows whose ledger is gone, then the rows.

        A compacted-ledger row is dead when the topic's view pointer names another view. A run
        adds its row just before its commit names it, holding the topic's compaction lock, so a
        compacted row is judged only under that lock (``compaction_locked``: the caller, a run
        that just committed, holds it)."""
        n = 0
        for rec in self.catalog.dead(topic):
            self.reached(DEAD_DELETE_FAULT)
            self.delete_objects(rec)
            n += 1
        by_topic: dict[str, list[OffloadRecord]] = {}
        for rec in self.catalog.compacted(topic):
            by_topic.setdefault(rec.topic, []).append(rec)
        for name, recs in by_topic.items():
            n += self._delete_dead_compacted(name, recs, compaction_locked)
        return n

    def _delete_dead_compacted(self, topic: str, recs: list[OffloadRecord], locked: bool) -> int:
        if all(rec.ledger_id == self.compacted_view(topic) for rec in recs):
            return 0
        lock = None
        if not locked:
            if self.compacted_lock is None:
                return 0  # no compaction layer attached: it cannot tell, so nothing goes
            lock = self.compacted_lock(topic)
            if lock is None:
                return 0  # a run of this topic may be about to commit one of them: later
        try:
            view = self.compacted_view(topic)  # again, under the lock
            n = 0
            for rec in recs:
                if rec.ledger_id != view:
                    self.reached(DEAD_DELETE_FAULT)
                    self.delete_objects(rec)
                    n += 1
            return n
        finally:
            if lock is not None:
                lock.release()

    def sweep_orphans(self) -> list[str]:
        """Delete offloaded ledger objects no catalog row names (a crash between the write and the
        commit). Run when the read-write storage opens, before any offload starts. (Objects of
        compacted views are the compaction layer's to sweep: ``compaction.tiered``.)

        Only keys an offload writes (``is_offload_key``): in cluster mode the catalog names the
        object-ledger store too (compacted views live beside the ledgers), whose ``ledgers/``
        keys are the live ledgers of every topic -- this sweep once deleted all of them at each
        broker start (issue 26's chaos test: hundreds of objects, 'ledger N unreadable')."""
        known = self.catalog.known_keys()
        removed = []
        for loc in self.locations():
            store = open_store(loc)
            for key in store.list("ledgers"):
                if key not in known and is_offload_key(key):
                    store.delete(key)
                    removed.append(key)
        if removed:
            log.warning("deleted %d orphaned offload object(s) left by an interrupted offload", len(removed))
        return removed

    def locations(self) -> set[OffloadLocation]:
        """Every location objects may be in: those the catalog names, and broker.conf's."""
        locations = set(self._row_locations())
        try:
            loc = location_from_settings(self.config, prefix=self.instance)
        except InvalidConfiguration:
            loc = None
        if loc is not None:
            locations.add(loc)
        return locations

    def _row_locations(self) -> set[OffloadLocation]:
        return self.catalog.locations()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def wait_idle(offloader: LedgerOffloader, topic: str, timeout: float = 30.0) -> dict:
    """Block until ``topic`` has no offload running (for callers that triggered one)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = offloader.status(topic)
        if st["status"] != RUNNING:
            return st
        time.sleep(0.05)
    raise StorageError(f"offload of {topic} still running after {timeout}s")
