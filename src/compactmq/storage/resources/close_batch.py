"""Writing the ledger-list changes of many topics in a few metadata-store commits.

When a storage closes (a broker stopping), every loaded topic seals its current ledger and
records it CLOSED (or drops it when empty) in its ``ManagedLedgerInfo``. Written one topic at a
time, that is one metadata-store transaction per topic, and with the embedded store each one
fsyncs its write-ahead log: a broker holding 1,000 topics spent most of its stop in these
fsyncs. ``TopicMetadata.shared_batch()`` instead collects the changes of every thread while the
topics close, and on exit hands them to ``write_ledger_changes``, which turns them into
compare-and-set ``Put``s (each topic's value read, its changes applied, its version expected)
and commits them together, in chunks that stay well under the store's size limit for one
commit. The cursor positions still pending when their topics close (held back by the
mark-delete rate limit) join the same commits (``BatchItem``: a put, what to record once it is
committed, how to write it alone). A stop therefore costs a handful of transactions whatever
the topic count.

Nothing about durability changes: a topic's change is either in a committed chunk or, when a
chunk fails (a version moved under it, a value grew past the limit), written again on its own
through the usual compare-and-set path (a cursor's keeps the further-ahead position). A ledger
change that could not be written at all leaves the ledger OPEN in the store, exactly as a crash
before the close would, and the next open recovers it by scanning its bytes. Topics whose writes carry an ownership fence (cluster mode) are
written on their own, under their fence.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

from ...errors import CompactMQError
from ...naming import TopicName
from ..metadata_store import MetadataStore, Put, Stat
from .base import Json, dumps, loads
from .managed_ledgers import managed_ledger_path

log = logging.getLogger(__name__)

LedgerOp = Callable[[list[Json]], list[Json]]

#: bytes of values in one commit: a quarter of the store's per-commit limit (MAX_VALUE_SIZE),
#: so a chunk never fails for its size while still carrying hundreds of topics
CHUNK_BYTES = 250_000
#: ops in one commit (ZooKeeper's multi is one request: keep it moderate)
CHUNK_OPS = 500


def apply_ledger_ops(info: Json, ops: Sequence[LedgerOp]) -> Json:
    """``info`` with its ledger list passed through ``ops`` in order."""
    ledgers = list(info.get("ledgerInfo", []))
    for op in ops:
        ledgers = op(ledgers)
    return {**info, "ledgerInfo": ledgers}


@dataclass
class BatchItem:
    """One key's write in a batch: the compare-and-set ``put``, what to do once it is committed
    (``done`` gets its new ``Stat``) and how to write it alone when its chunk fails."""

    put: Put
    done: Callable[[Stat], None]
    alone: Callable[[], None]


def write_ledger_changes(
    store: MetadataStore,
    changes: dict[str, list[LedgerOp]],
    write_one: Callable[[str, list[LedgerOp]], None],
    fenced: Callable[[str], bool],
    more: Sequence[BatchItem] = (),
) -> int:
    """Write every topic's changes, then ``more`` (cursor positions); returns the number of
    multi-key commits made.

    ``write_one(topic, ops)`` is the single-topic path (compare-and-set with retries, under the
    topic's fence); it is used for fenced topics and for the topics of a chunk that failed."""
    items: list[BatchItem] = []
    for topic, ops in changes.items():
        put = None if fenced(topic) else _prepare(store, topic, ops)
        if put is None:  # fenced, or unreadable here: the single path writes it (or says why)
            _write_alone(write_one, topic, ops)
        else:
            items.append(BatchItem(put, _nothing, partial(_write_alone, write_one, topic, ops)))
    return commit_in_chunks(store, [*items, *more])


def commit_in_chunks(store: MetadataStore, items: Sequence[BatchItem]) -> int:
    """Commit ``items`` in chunks of bounded size; a failed chunk's items are written alone."""
    commits = 0
    chunk: list[BatchItem] = []
    size = 0
    for item in items:
        if chunk and (size + len(item.put.value) > CHUNK_BYTES or len(chunk) >= CHUNK_OPS):
            commits += _commit_chunk(store, chunk)
            chunk, size = [], 0
        chunk.append(item)
        size += len(item.put.value)
    if chunk:
        commits += _commit_chunk(store, chunk)
    return commits


def _nothing(_: Stat) -> None:
    pass


def _prepare(store: MetadataStore, topic: str, ops: list[LedgerOp]) -> Put | None:
    path = managed_ledger_path(TopicName.parse(topic))
    try:
        got = store.get(path)
        if got is None:
            return None
        new = apply_ledger_ops(copy.deepcopy(loads(got.value, path)), ops)
        return Put(path, dumps(new), got.stat.version)
    except Exception as e:  # noqa: BLE001 - an op that refuses (e.g. ledger gone) fails alone
        log.debug("preparing the ledger list of %s for a batch: %s", topic, e)
        return None


def _commit_chunk(store: MetadataStore, chunk: list[BatchItem]) -> int:
    try:
        stats = store.commit([item.put for item in chunk])
    except CompactMQError as e:
        # one moved version fails the whole chunk: each key is written again on its own path
        log.info("a batch of %d metadata writes failed (%s); writing them one by one", len(chunk), e)
        for item in chunk:
            item.alone()
        return 1
    for item, stat in zip(chunk, stats):
        assert stat is not None
        item.done(stat)
    return 1


def _write_alone(write_one: Callable[[str, list[LedgerOp]], None], topic: str, ops: list[LedgerOp]) -> None:
    try:
        write_one(topic, ops)
    except Exception as e:  # noqa: BLE001 - the ledger stays OPEN in the store: the next open recovers it
        log.warning("recording the closed ledgers of %s failed (recovered at its next open): %s", topic, e)
