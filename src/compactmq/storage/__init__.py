"""Storage: durable managed ledgers on local disk, cursors, and the metadata store with its resources.

A topic is a *managed ledger*: an ordered list of *ledgers*, each an append-only file of
entries. An entry holds the bytes a producer sent, untouched (see the contract: magic, CRC,
metadata size, MessageMetadata, payload), so batches, compression and encryption survive.
An entry is addressed by ``Position(ledger_id, entry_id)``; ledger ids are unique in a data
directory (shared with upper layers: ``resources.ledger_ids``) and entry ids
count from 0 in each ledger.

On-disk layout
--------------
::

    data_dir/
      LOCK                      flock'ed by the one read-write Storage of this directory
      metadata.db (+ -wal, -shm) SQLite in WAL mode: the embedded metadata store (versioned
                                keys in ``store_*`` tables: topics with their ledger lists,
                                cursors, policies, tenants/namespaces, partitioned topics,
                                schemas, compaction state, offload records, seal requests --
                                see ``resources``); absent with ``metadataStoreUrl=zk:...``.
                                A directory written by an older compactmq also has the old
                                tables here: read once at start, never written
                                (``metadata_store.legacy_tables``, ``resources.legacy_import``)
      ledgers/<domain>/<tenant>/<namespace>/<topic>/
        000000000042.log        ledger file: header, then one CRC32C-checked record per entry
        000000000042.idx        entry index (record offsets + publish times), written at close
      <area>/<domain>/<tenant>/<namespace>/<topic>/
                                per-topic data of an upper layer (``engine.TOPIC_AREAS``;
                                storage only makes and deletes the directories)

Name parts are percent-encoded (dots too), so any valid topic name is one safe directory.
The byte formats are documented at the top of ``ledger_file.py``, whose functions are pure
(bytes and file objects in, arrays out) so Spark tasks read ledgers without a ``Storage``.

Durability rules
----------------
* An append returns only once its entry is durable: with ``managedLedgerSyncData=true`` (the
  default) after an ``fdatasync`` that started after its record was written; concurrent
  appends and ``append_many`` share syncs (group commit: one sync covers every record written
  before it, waiting at most ``managedLedgerGroupCommitMaxDelayMicros`` for writers mid-write).
  With ``false``, after the write reached the page cache (safe from a process crash only).
* Readers see only durable entries, so nothing a reader saw can vanish in a crash.
* A ledger is closed by: fsync its file, write its index (tmp + fsync + rename), then ONE
  compare-and-set write of the topic's managed-ledger info marks it CLOSED and records the next
  ledger OPEN; then the next file is created and fsynced with its directory. The embedded
  store commits it with ``synchronous=FULL``.
* The compaction state (status, horizon, view pointer) is the compaction service's, written by
  compare-and-set in the metadata store (``compaction.state``). Cursor positions are written at most
  ``managedLedgerDefaultMarkDeleteRateLimit`` times a second per cursor, and when the topic
  closes (``resources.topic_metadata``): after a crash a cursor may step back (messages are
  redelivered), never forward.

Crash recovery (``Storage.open_managed_ledger``)
------------------------------------------------
Every ledger the metadata store still records OPEN is scanned from its header; the first
record that is short, out of sequence or fails its CRC32C marks the torn tail, which is cut
off (``ftruncate`` + fsync). Records before it were all written completely, so every
acknowledged entry survives and no damaged or half-written one is ever returned. The ledger
gets its index and is recorded CLOSED; empty ledgers and files unknown to the metadata store
(a crash between the file step and the metadata step) are deleted; a damaged or missing
index of a CLOSED ledger is rebuilt from its file. A new ledger is then opened for appends.

A write or sync that fails *fences* the managed ledger (appends refuse, reads go on);
``Storage.open_managed_ledger`` then reopens it, which runs the recovery above.

``ManagedLedger`` is a facade over parts with one job each (its module docstring maps them:
recovery, appender, reader, cursors, retention, offload state); they reach ledger bytes only
through ``ledger_storage.LedgerStorage`` (local files today) and the metadata store only
through the calls named by ``ledger_metadata.LedgerMetadata``.

Retention follows Pulsar: see ``ManagedLedger.trim_to_retention``; the broker calls
``Storage.run_maintenance()`` every ``retentionCheckIntervalInSeconds`` (it also rolls idle
ledgers by age).

Using it (synchronous and thread-safe; the broker calls it from a thread pool)::

    storage = Storage(data_dir, load_config())        # takes data_dir/LOCK
    ml = storage.open_managed_ledger("my-topic")       # recovers, opens a new ledger
    pos = ml.append(entry_bytes)                       # durable when it returns
    sub = ml.open_cursor("sub", initial_position="earliest")
    for pos, data in sub.read_entries(100): ...
    sub.ack_individual([pos])                          # persisted at a bounded rate
    storage.close()                                    # seals current ledgers

A compaction job beside the broker opens ``Storage(data_dir, cfg, read_only=True)``: it reads
ledgers as they are, repairs and deletes nothing, and commits its compacted view through the
metadata store (``storage.resources``, compare-and-set).

Public API: ``Storage``, ``ManagedLedger``, ``Cursor``, ``Position``,
``LedgerInfo`` and the policy-key constants (``policy_keys``); the file format in
``ledger_file``. Errors are ``compactmq.errors`` classes: ``StorageError`` (I/O, damage,
fenced), ``MetadataError``, ``TopicNotFound``, ``NotFound`` (no such entry), ``Conflict``, ``AlreadyExists``, ``InvalidInput`` (entry too large).
"""

from .cursor import Cursor
from .engine import Storage
from .managed_ledger import ManagedLedger
from .policy_keys import (
    COMPACTION_CURSOR,
    COMPACTION_MAX_LAG,
    COMPACTION_MIN_LAG,
    COMPACTION_RETENTION_MODE,
    COMPACTION_TOMBSTONE_RETENTION,
    COMPACTED_VIEW_KEY_TTL,
    COMPACTION_STRATEGY,
    COMPACTION_THRESHOLD,
    RETAIN_NULL_KEY,
    RETENTION_SIZE_MB,
    RETENTION_TIME_MINUTES,
)
from .position import EARLIEST, LEDGER_CLOSED, LEDGER_OPEN, LedgerInfo, Position

__all__ = [
    "COMPACTION_CURSOR",
    "COMPACTION_MAX_LAG",
    "COMPACTION_MIN_LAG",
    "COMPACTION_RETENTION_MODE",
    "COMPACTION_TOMBSTONE_RETENTION",
    "COMPACTED_VIEW_KEY_TTL",
    "COMPACTION_STRATEGY",
    "COMPACTION_THRESHOLD",
    "Cursor",
    "EARLIEST",
    "LEDGER_CLOSED",
    "LEDGER_OPEN",
    "LedgerInfo",
    "ManagedLedger",
    "Position",
    "RETAIN_NULL_KEY",
    "RETENTION_SIZE_MB",
    "RETENTION_TIME_MINUTES",
    "Storage",
]
