"""Group flush: ONE object write for the unflushed bytes of many ledgers, of many topics.

Without it, each object ledger's writer (``object_ledger_writer.ObjectLedgerWriter``) writes its own
flush object per flush: with 30 topics publishing, 30 PUTs per flush interval. With a
``GroupFlush`` (one per process and object store; ``objectLedgerGroupFlushEnabled``), a
writer's flush instead *joins the group*. One write is in flight at a time: a flush that finds
none and nothing else waiting is written at once by its own thread; flushes that come during a
write wait for it, then a daemon thread (the *PUT stage*) takes every one waiting. Nothing
waits for a timer (the writer's own linger, ``objectLedgerFlushIntervalMillis``, already ran):
flushes group by themselves while the store is busy, as one ledger's appends do during its
PUT. What is taken is written one of two ways:

* **alone** (one flush, ``solo``): as the ledger's own flush object, then the ownership
  fence's lease is checked -- exactly the per-ledger path (``ObjectLedgerStorage.write_flush``
  without a group): one PUT, no metadata-store write, so a lone producer pays nothing for the
  group. Its guarantees are that path's: nothing is acknowledged once the fence is lost, and a
  new owner's recovery seals the ledger, so a zombie's later objects are never part of it;
* **as a group** (several flushes):

  1. their bytes, one after the other, as ONE shared object
     ``groups/<incarnation:019d>/<counter:016d>`` -- ``incarnation`` a random 62-bit integer
     drawn when the process starts (the broker's identity for keys: two processes never share
     one), ``counter`` counting this process's groups, so a key never repeats and no write
     replaces another (pyarrow's S3 client cannot make a conditional PUT);
  2. (the *commit stage*, its own thread: the next group's PUT runs meanwhile) in ONE
     metadata-store ``commit`` (a ZooKeeper ``multi``), one *range record* per member ledger --
     ``<RANGES_ROOT>/<topic>/<ledger_id:012d>/<start:016d>-e<epoch:010d>``, value ``{"end",
     "key", "offset", "member"}``: ledger bytes ``[start, end)`` are the shared object's bytes
     from ``offset`` -- and per member an empty key ``<GROUPS_ROOT>/<incarnation>-<counter>/
     <member:06d>`` (the object's reference count, which every process can read), together with
     the version checks of every member's ownership fence (``resources.fence``). A member whose
     fence fails is told ``Fenced`` and the commit is tried again without it, so a zombie's bytes
     never become visible and never hold up the others;
  3. only then answers each member (its flush returns: the entries may be acknowledged).

  At most ``PIPELINE`` groups are past their PUT and not yet committed, so a slow metadata
  store makes groups larger, not more numerous.

Reading: a ledger's layout (``object_layout.resolve_layout``) chains its own objects and its
range records (``ranges``); a range's part name is ``g:<epoch>:<offset>:<member>:<key>``
(``object_layout.shared_part``), read by ranged GETs of the shared object. A new owner after a
SIGKILL finds the records the same way: a flush whose commit did not happen left an object
nobody references and no record, so nothing of it is visible.

Sealing: the merge (``object_ledger_upkeep``) copies the ledger's ranges into its ``m-`` object,
then ``release`` deletes the ledger's records with their member keys in one commit; whoever
leaves a shared object's group key without children (any process: a new owner after a
failover too) deletes the object, then the group key. A ledger being written *folds* its ranges
into an object of its own every ``FOLD_RANGES`` ranges (``object_ledger_writer``) and releases them
the same way, so records stay few. Left for the orphan sweep (``object_group_sweep``): an object
written by a process that died before its commit (no records, no group key), and a crash between
the last release and the object's delete; it removes both once older than a grace period (a
group's commit creates its group node only if new, so a commit that comes after the sweep
decided fails rather than naming a deleted object).

Thread safety: ``flush`` from any thread (it blocks until its bytes are durable and visible);
the PUT stage writes one object at a time, the commit stage commits one group at a time.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import CompactMQError, StorageError
from .metadata_store import NEW, BadVersion, Check, Delete, KeyNotFound, MetadataStore, NotEmpty, Op, Put
from .object_layout import delete_log, delete_object
from .offload.blobstore import BlobStore
from .resources.fence import NO_FENCE, Fence, Fenced

log = logging.getLogger(__name__)

#: where range records live in the metadata store (under it: the topic's encoded name)
RANGES_ROOT = "/object-ledger-ranges"
#: per shared object, a child per member range still naming it (its reference count)
GROUPS_ROOT = "/object-ledger-groups"
#: the shared objects' key prefix in the object store
GROUPS_PREFIX = "groups"
#: most ranges in one group: its commit (2 keys per range, ~300 bytes) stays far below the
#: metadata store's MAX_VALUE_SIZE for one commit; more wait for the next group, due at once
MAX_GROUP_MEMBERS = 256
#: attempts of one group's commit (each without the members whose fence failed)
COMMIT_ATTEMPTS = 4
#: groups past their PUT and not yet committed, at most: the PUT stage writes the next group
#: while one commits, then waits -- a slow metadata store makes groups larger, not more
PIPELINE = 1


@dataclass
class _Member:
    topic_path: str  # the topic's encoded name, as its ledgers' key prefix has it
    ledger_id: int
    start: int
    end: int
    epoch: int
    data: bytes
    fence: Fence
    #: writes the bytes as the ledger's own flush object, fence checked; returns its part name
    #: (used when the member is alone: ``GroupFlush.solo``); None: always in a shared object
    solo: Callable[[], str] | None = None
    done: threading.Event = field(default_factory=threading.Event)
    name: str = ""  # the part name, once committed
    error: BaseException | None = None

    @property
    def record_path(self) -> str:
        return record_path(self.topic_path, self.ledger_id, self.start, self.epoch)


@dataclass
class _Group:
    """A shared object written and waiting for (or in) its commit."""

    key: str
    counter: int
    members: list[_Member]
    offsets: list[int]


def record_path(topic_path: str, ledger_id: int, start: int, epoch: int) -> str:
    return f"{RANGES_ROOT}/{topic_path}/{int(ledger_id):012d}/{int(start):016d}-e{int(epoch):010d}"


def part_name(epoch: int, offset: int, member: int, key: str) -> str:
    return f"g:{int(epoch)}:{int(offset)}:{int(member)}:{key}"


def group_node(key: str) -> str:
    """The metadata-store key whose children are the members naming shared object ``key``."""
    _, incarnation, counter = key.split("/")
    return f"{GROUPS_ROOT}/{incarnation}-{counter}"


def member_path(key: str, member: int) -> str:
    return f"{group_node(key)}/{int(member):06d}"


def _answer(members: list[_Member], e: BaseException) -> None:
    """Every member not answered yet gets ``e`` (whatever happened, each must be answered)."""
    for m in members:
        if not m.done.is_set():
            m.error = e if isinstance(e, CompactMQError) else StorageError(str(e))
            m.done.set()


class GroupFlush:
    """The process's group flush over ``store`` and ``metadata`` (see the module docstring).
    ``max_bytes`` bounds one shared object (a flush bigger than it is a group of its own);
    ``solo`` False puts even a lone flush in a shared object (tests of the shared path)."""

    def __init__(
        self,
        store: BlobStore,
        metadata: MetadataStore,
        max_bytes: int = 4 * 1024 * 1024,
        incarnation: int | None = None,
        solo: bool = True,
    ) -> None:
        self.store = store
        self.metadata = metadata
        self.max_bytes = max(1, int(max_bytes))
        self.incarnation = secrets.randbits(62) if incarnation is None else int(incarnation)
        self.solo = solo
        self._counter = 0
        self._cond = threading.Condition()
        self._pending: list[_Member] = []
        self._busy = False  # a write (PUT) is in flight: flushes asked meanwhile wait for it
        self._committing: list[_Group] = []  # written, waiting for (or in) their commit
        self._in_flight: set[int] = set()  # counters of groups being written or committed
        self._threads: list[threading.Thread] = []
        self.groups_written = 0  # shared objects written (tests, stats)
        self.solo_written = 0  # flushes written alone, as the ledger's own object (tests, stats)

    @property
    def counter(self) -> int:
        """The counter of the oldest group being written or committed (else the last one): the
        orphan sweep leaves this process's groups from it on alone."""
        with self._cond:
            return min(self._in_flight, default=self._counter)

    # --- writing ---------------------------------------------------------------------------

    def flush(
        self,
        topic_path: str,
        ledger_id: int,
        start: int,
        end: int,
        epoch: int,
        data: bytes,
        fence: Fence,
        solo: Callable[[], str] | None = None,
    ) -> str:
        """Make ledger bytes ``[start, end)`` durable and visible -- alone through ``solo`` when
        nothing else waits, else as part of the next group; returns the part name (``f-...``,
        or ``g:...`` once the group's object is written and its range committed). Raises
        ``Fenced`` when the member's fence failed, ``StorageError`` when the write or the
        commit failed."""
        m = _Member(topic_path, ledger_id, start, end, epoch, data, fence or NO_FENCE, solo)
        with self._cond:
            # nothing written, nothing waiting: this thread writes it alone, now (no hand-off to
            # the PUT stage: a lone producer's flush is the per-ledger path, to the thread);
            # flushes that come meanwhile wait for it, as for any write in flight
            alone = self.solo and solo is not None and not self._busy and not self._pending
            if alone:
                self._busy = True
            else:
                self._pending.append(m)
                self._cond.notify_all()
                self._start_threads()
        if alone:
            try:
                self._write_alone(m)
            except BaseException as e:
                _answer([m], e)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()
        m.done.wait()
        if m.error is not None:
            raise m.error
        return m.name

    def _start_threads(self) -> None:
        if not self._threads:
            for target, name in ((self._put_stage, "put"), (self._commit_stage, "commit")):
                t = threading.Thread(target=target, name=f"object-group-{name}", daemon=True)
                self._threads.append(t)
                t.start()

    def _ready(self) -> bool:
        """The PUT stage may take the flushes waiting (called holding ``_cond``): no write in
        flight, and at most ``PIPELINE`` groups waiting for their commit."""
        return bool(self._pending) and not self._busy and len(self._committing) <= PIPELINE

    def _take(self) -> list[_Member]:
        """The flushes of the next write (holding ``_cond``): every one waiting, up to
        ``MAX_GROUP_MEMBERS`` and ``max_bytes`` (at least one); the rest go in the next."""
        n, size = 0, 0
        while n < min(len(self._pending), MAX_GROUP_MEMBERS):
            size += len(self._pending[n].data)
            if n and size > self.max_bytes:
                break
            n += 1
        batch, self._pending = self._pending[:n], self._pending[n:]
        return batch

    def _put_stage(self) -> None:
        while True:
            with self._cond:
                while not self._ready():
                    self._cond.wait()
                batch = self._take()
                self._busy = True
                alone = len(batch) == 1 and self.solo and batch[0].solo is not None
                if not alone:
                    self._counter += 1
                    counter = self._counter
                    self._in_flight.add(counter)
            try:
                if alone:
                    self._write_alone(batch[0])
                else:
                    self._put_group(counter, batch)
            except BaseException as e:  # every member must be answered, whatever happened
                _answer(batch, e)
                if not alone:
                    with self._cond:
                        self._in_flight.discard(counter)
            finally:
                with self._cond:
                    self._busy = False

    def _write_alone(self, m: _Member) -> None:
        """A lone flush: the ledger's own object, its fence checked (the per-ledger path)."""
        if not self._refuse_early(m):
            assert m.solo is not None
            m.name = m.solo()
            self.solo_written += 1
            m.done.set()

    def _put_group(self, counter: int, batch: list[_Member]) -> None:
        """Write one group's shared object, then hand it to the commit stage."""
        key = f"{GROUPS_PREFIX}/{self.incarnation:019d}/{counter:016d}"
        live = [m for m in batch if not self._refuse_early(m)]
        if not live:
            with self._cond:
                self._in_flight.discard(counter)
            return
        offsets, pos = [], 0
        for m in live:
            offsets.append(pos)
            pos += len(m.data)
        written = self.store.put(key, [b"".join(m.data for m in live)])
        if written != pos:
            raise StorageError(f"group object {key}: {written} of {pos} bytes written")
        self.groups_written += 1
        for i, (m, off) in enumerate(zip(live, offsets)):
            m.name = part_name(m.epoch, off, i, key)
        with self._cond:
            self._committing.append(_Group(key, counter, live, offsets))
            self._cond.notify_all()

    def _commit_stage(self) -> None:
        while True:
            with self._cond:
                while not self._committing:
                    self._cond.wait()
                group = self._committing[0]
            try:
                if self._commit(group.key, group.members, group.offsets) == []:
                    self._delete_quietly(
                        group.key, "group commit refused"
                    )  # surely not committed: nobody names it
                for m in group.members:
                    m.done.set()
            except BaseException as e:  # every member must be answered, whatever happened
                _answer(group.members, e)
            finally:
                with self._cond:
                    self._committing.pop(0)
                    self._in_flight.discard(group.counter)
                    self._cond.notify_all()

    @staticmethod
    def _refuse_early(m: _Member) -> bool:
        if m.fence.lost or m.fence.revoked:
            m.error = Fenced(f"{m.fence.what}: ownership epoch {m.fence.epoch} was given up")
            m.done.set()
            return True
        return False

    def _commit(self, key: str, members: list[_Member], offsets: list[int]) -> list[_Member] | None:
        """Commit the members' range records with their fences' checks; a member whose fence
        fails gets ``Fenced`` and the rest are tried again. Returns the members committed, or
        None when the outcome is unknown: a commit that failed on the connection (ZooKeeper's
        ConnectionLoss, a timeout) may have been applied, its records naming the object, so the
        object must stay -- deleting it made every ledger it holds unreadable, the topic
        unloadable on any broker (the chaos test found it). Its members are answered with the
        error (nothing acknowledged); if the commit did not land, the orphan sweep deletes it."""
        todo = [(i, m, off) for i, (m, off) in enumerate(zip(members, offsets))]
        for _ in range(COMMIT_ATTEMPTS):
            if not todo:
                return []
            # the group node is created here, and only if new: after an orphan sweep made it (a
            # tombstone: ``object_group_sweep``), a commit this late fails instead of naming a
            # deleted object
            ops: list[Op] = [Put(group_node(key), b"", expected_version=NEW)]
            checks: dict[tuple[str, int], Check] = {}
            for i, m, off in todo:
                value = json.dumps({"end": m.end, "key": key, "offset": off, "member": i}).encode()
                # both keys are new (a record names its ledger's start and this ownership's
                # epoch, and a writer whose commit failed flushes that ledger no more; a member
                # key sits under the group node created here): NEW, so that ZooKeeper is not
                # asked first whether each exists
                ops.append(Put(m.record_path, value, expected_version=NEW))
                ops.append(Put(member_path(key, i), b"", expected_version=NEW))  # the reference count
                for c in m.fence.checks:
                    checks[(c.path, c.version)] = c
            try:
                self.metadata.commit_no_stats([*ops, *checks.values()])  # no stats: no reads back
                return [m for _i, m, _off in todo]
            except (BadVersion, KeyNotFound):
                if self.metadata.exists(group_node(key)):  # swept: the object is gone or going
                    for _i, m, _off in todo:
                        m.error = StorageError(f"group {key}: swept as an orphan before its commit")
                    return []
                todo = self._without_fenced(todo)
            except CompactMQError as e:
                for _i, m, _off in todo:
                    m.error = e
                log.warning("group object %s: commit outcome unknown, the object stays: %s", key, e)
                return None
        for _i, m, _off in todo:
            m.error = StorageError(f"group {key}: commit kept failing on fences")
        return []

    def _without_fenced(self, todo: list[tuple[int, _Member, int]]) -> list[tuple[int, _Member, int]]:
        holds: dict[int, bool] = {}  # one store check per fence
        keep = []
        for i, m, off in todo:
            if id(m.fence) not in holds:
                holds[id(m.fence)] = m.fence.holds(self.metadata)
            if holds[id(m.fence)]:
                keep.append((i, m, off))
            else:
                m.error = Fenced(f"{m.fence.what}: ownership epoch {m.fence.epoch} is over")
        return keep

    def _delete_quietly(self, key: str, reason: str) -> None:
        try:
            delete_object(self.store, key, reason)
        except (OSError, CompactMQError) as e:
            log.warning("group object %s: delete failed (an orphan now): %s", key, e)

    # --- reading and releasing -------------------------------------------------------------

    def ranges(self, topic_path: str, ledger_id: int) -> list[tuple[int, int, int, str]]:
        """A ledger's committed ranges: ``(start, end, epoch, part name)``."""
        base = f"{RANGES_ROOT}/{topic_path}/{int(ledger_id):012d}"
        out = []
        try:
            for child in self.metadata.get_children(base):
                got = self.metadata.get(f"{base}/{child}")
                start, _, epoch = child.partition("-e")
                if got is None or not start.isdigit() or not epoch.isdigit():
                    continue
                v = json.loads(got.value)
                name = part_name(int(epoch), v["offset"], v["member"], v["key"])
                out.append((int(start), int(v["end"]), int(epoch), name))
        except CompactMQError as e:
            raise StorageError(f"reading the ranges of ledger {ledger_id}: {e}") from e
        return out

    def release(
        self, topic_path: str, ledger_id: int, fence: Fence = NO_FENCE, upto: int | None = None
    ) -> None:
        """Delete a ledger's range records (its bytes are in its merged object now, or the
        ledger is deleted): those ending by ``upto`` (the merged object's size), or all (None);
        under ``fence`` (a broker that lost the topic deletes nothing: ``Fenced``). A shared
        object no record names any more goes. A record past ``upto`` stays: a commit that landed
        after the merge read the ledger holds bytes the merged object does not."""
        base = f"{RANGES_ROOT}/{topic_path}/{int(ledger_id):012d}"
        ranges = self.ranges(topic_path, ledger_id)
        held = [(start, name) for start, end, _ep, name in ranges if upto is None or end <= upto]
        if held:
            self.release_parts(topic_path, ledger_id, held, fence)
        if len(held) < len(ranges):
            return
        try:
            self.metadata.commit([Delete(base)])
        except CompactMQError:
            pass  # not there, or a record was added meanwhile

    def release_parts(
        self, topic_path: str, ledger_id: int, parts: list[tuple[int, str]], fence: Fence = NO_FENCE
    ) -> None:
        """Delete the range records of ``(start, part name)`` of one ledger (their bytes are in
        an object of the ledger's own now); shared objects left unnamed go. Under ``fence``
        (a fold): a broker that lost the topic deletes nothing (``Fenced``)."""
        delete_log.debug(
            "range records released: topic=%s ledger=%d epoch=%d parts=%s",
            topic_path,
            ledger_id,
            fence.epoch,
            [start for start, _n in parts],
        )
        deletes: list[list[Op]] = []  # per range: its record and its member key, together
        keys = set()
        for start, name in parts:
            _, epoch, _offset, member, key = name.split(":", 4)
            path = record_path(topic_path, ledger_id, start, int(epoch))
            deletes.append([Delete(path), Delete(member_path(key, int(member)))])
            keys.add(key)
        try:
            fence.commit(self.metadata, [op for pair in deletes for op in pair])  # one round trip
        except KeyNotFound:  # one was gone already: the others one by one
            for pair in deletes:
                try:
                    fence.commit(self.metadata, pair)
                except KeyNotFound:  # gone already (a lost fence raises Fenced)
                    pass
        for key in sorted(keys):
            self._drop_if_unnamed(key)

    def forget_topic(self, topic_path: str) -> None:
        """After a topic's ledgers were deleted: remove its emptied nodes under ``RANGES_ROOT``
        (the ledger nodes, the topic's, then its namespace's and tenant's while empty). A node
        that still has children stays (``NotEmpty``): another topic's, or a record added
        meanwhile; the root itself stays."""
        base = f"{RANGES_ROOT}/{topic_path}"
        try:
            for child in self.metadata.get_children(base):
                self._delete_if_empty(f"{base}/{child}")
        except CompactMQError as e:
            log.warning("%s: removing its emptied range nodes failed: %s", topic_path, e)
            return
        node = base
        while node != RANGES_ROOT and node.startswith(RANGES_ROOT + "/"):
            if not self._delete_if_empty(node):
                return
            node = node.rsplit("/", 1)[0]

    def _delete_if_empty(self, node: str) -> bool:
        """Delete ``node`` unless it has children; True when it is gone."""
        try:
            self.metadata.delete(node)
        except KeyNotFound:
            return True
        except NotEmpty:
            return False
        return True

    def _drop_if_unnamed(self, key: str) -> None:
        """Delete shared object ``key`` once no member key names it (any process's ranges):
        the object first, then its group key -- a crash between leaves an empty group key, a
        crash before the object's delete an object whose group key is empty (a sweep's)."""
        node = group_node(key)
        if self.metadata.get_children(node):
            return
        self._delete_quietly(key, "last range reference released")
        try:
            self.metadata.commit([Delete(node)])
        except CompactMQError:
            pass  # gone already
