"""Tiered storage: sealed ledgers (and compacted ledgers) offloaded to object storage.

A topic can outgrow the broker's disk: once a ledger is sealed it never changes, so it can be
copied to an object store (S3 or any S3-compatible service, Google Cloud Storage, HDFS or a
mounted filesystem), and its local copy deleted after ``managedLedgerOffloadDeletionLagMs``.
Readers cannot tell the difference: ``ManagedLedger`` reads an offloaded ledger through the
offloader, with the same record format and CRC checks, so readers, consumers, seeks and
read-compacted consumers go on unchanged. Configuration and admin use Pulsar's names
(``managedLedgerOffloadDriver``, ``s3ManagedLedgerOffload*``, ``fileSystemURI``; the namespace
policies ``offloadThreshold``, ``offloadThresholdInSeconds``, ``offloadDeletionLagMs``,
``offloadPolicies``).

The modules, bottom up:

``blobstore``   one filesystem abstraction (``pyarrow.fs``) over every driver; an
                ``OffloadLocation`` (picklable, no secrets) names a store, so another process or a
                Spark executor rebuilds it
``blocks``      the object format: the ledger file written in large blocks, an index object, and
                ranged reads through a read cache (a read of one entry is one ranged GET);
                ``RangedObject`` reads any object so (offloaded compacted ledgers too)
``catalog``     rows in the metadata store naming each committed object pair
``offloader``   ``LedgerOffloader``: offload (write, commit, later delete the local copy), reads,
                deletion of dead objects, orphan sweeps, automatic offload

Crash safety is the atomic-switch discipline of compaction: write new objects under fresh
names, commit their names in one metadata transaction, and only then delete anything old.
See ``offloader`` for each step and what a crash between two of them leaves.
"""

from .blobstore import BlobStore, OffloadLocation, location_from_settings, location_from_url, open_store
from .blocks import RangedObject, ReadCache, open_url, shared_cache
from .catalog import COMPACTED, LEDGER, OffloadCatalog, OffloadRecord
from .offloader import (
    DEAD_DELETE_FAULT,
    ERROR,
    FAULT_POINTS,
    NOT_RUN,
    OFFLOAD_DELETION_LAG,
    OFFLOAD_POLICIES,
    OFFLOAD_THRESHOLD,
    OFFLOAD_THRESHOLD_SECONDS,
    RUNNING,
    SUCCESS,
    LedgerOffloader,
    wait_idle,
)

__all__ = [
    "BlobStore",
    "COMPACTED",
    "DEAD_DELETE_FAULT",
    "ERROR",
    "FAULT_POINTS",
    "LEDGER",
    "LedgerOffloader",
    "NOT_RUN",
    "OFFLOAD_DELETION_LAG",
    "OFFLOAD_POLICIES",
    "OFFLOAD_THRESHOLD",
    "OFFLOAD_THRESHOLD_SECONDS",
    "OffloadCatalog",
    "OffloadLocation",
    "OffloadRecord",
    "RUNNING",
    "RangedObject",
    "ReadCache",
    "SUCCESS",
    "location_from_settings",
    "location_from_url",
    "open_store",
    "open_url",
    "shared_cache",
    "wait_idle",
]
