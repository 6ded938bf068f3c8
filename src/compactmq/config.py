"""Broker configuration: Pulsar's broker.conf key names where one exists, merged in layers.

``load_config(file, overrides)`` is the one function that merges the layers, in this order:

    built-in defaults  <  config file (broker.conf syntax: ``key=value``, ``#`` comments)  <  overrides

Every key is declared once in ``SETTINGS`` with its type, default and a line of help. An
unknown key or a value of the wrong type is a one-line ``InvalidConfiguration``. Keys that start
with ``spark.`` pass through untouched to the Spark session builder.

Nothing is read at import time: tests pass plain dicts as ``overrides``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from .errors import InvalidConfiguration

SPARK_PREFIX = "spark."


@dataclass(frozen=True)
class Setting:
    type: type
    default: Any
    help: str


def _s(type_: type, default: Any, help_: str) -> Setting:
    return Setting(type_, default, help_)


SETTINGS: dict[str, Setting] = {
    # --- standalone broker -------------------------------------------------------------
    "dataDir": _s(str, "data", "directory holding ledgers, compacted ledgers and metadata.db"),
    "bindAddress": _s(str, "127.0.0.1", "address the broker and web service listen on"),
    "advertisedAddress": _s(str, "", "host name put in lookup answers; empty means bindAddress"),
    "brokerServicePort": _s(int, 6650, "Pulsar binary protocol port"),
    "webServicePort": _s(int, 8080, "admin REST API and /metrics port"),
    "allowAutoTopicCreation": _s(bool, True, "create topics on first use by a client"),
    "allowAutoTopicCreationType": _s(str, "non-partitioned", "non-partitioned or partitioned"),
    "defaultNumPartitions": _s(int, 1, "partitions of an auto-created partitioned topic"),
    "keepAliveIntervalSeconds": _s(int, 30, "PING interval; a peer silent for twice this is dropped"),
    "maxMessageSize": _s(int, 5 * 1024 * 1024, "largest message a producer may send, in bytes"),
    "maxPendingPublishBytesPerConnection": _s(
        int, 16 * 1024 * 1024, "unpersisted bytes per connection above which its socket is paused"
    ),
    "maxConcurrentLookupRequest": _s(int, 50000, "accepted for broker.conf compatibility"),
    # --- storage (managed ledger) ------------------------------------------------------
    "managedLedgerMaxEntriesPerLedger": _s(int, 50000, "roll a ledger after this many entries"),
    "managedLedgerCacheSizeMB": _s(
        int, 256, "memory for recently published entries served to consumers that keep up (all topics)"
    ),
    "managedLedgerMaxSizePerLedgerMbytes": _s(int, 2048, "roll a ledger after this many MiB"),
    "managedLedgerMaxLedgerRolloverTimeMinutes": _s(int, 240, "roll a ledger after this age"),
    "managedLedgerSyncData": _s(bool, True, "fsync before acknowledging an append (journalSyncData)"),
    "managedLedgerGroupCommitMaxDelayMicros": _s(
        int, 1000, "longest an append waits to share an fsync with others (group commit)"
    ),
    "defaultRetentionTimeInMinutes": _s(int, 0, "keep acknowledged messages this long (-1: forever)"),
    "defaultRetentionSizeInMB": _s(int, 0, "keep acknowledged messages up to this size (-1: no limit)"),
    "retentionCheckIntervalInSeconds": _s(int, 120, "how often ledgers past retention are deleted"),
    # --- compaction --------------------------------------------------------------------
    "compactionServiceFactoryClassName": _s(
        str,
        "compactmq.compaction.spark.SparkCompactionServiceFactory",
        "dotted class name of the CompactionServiceFactory (PIP-278)",
    ),
    "brokerServiceCompactionMonitorIntervalInSeconds": _s(
        int, 60, "how often topics are checked against their compaction threshold"
    ),
    "brokerServiceCompactionThresholdInBytes": _s(
        int, 0, "backlog since the horizon that triggers compaction; 0 disables"
    ),
    "compactionMaxConcurrentRuns": _s(int, 1, "compactions running at once in this broker"),
    "topicCompactionRetainNullKey": _s(bool, False, "keep keyless messages in the compacted view"),
    "topicCompactionStrategy": _s(
        str, "keep-latest", "keep-latest, keep-first, event-time, or a dotted class name"
    ),
    "topicCompactionRetentionMode": _s(
        str,
        "retention-bounded",
        "retention-bounded (a message trimmed by retention leaves the compacted view too) "
        "or keep-until-tombstone (keys stay until deleted)",
    ),
    # --- tiered storage (offload), Pulsar's keys; see compactmq.storage.offload ----------
    "managedLedgerOffloadDriver": _s(
        str, "", "where sealed ledgers are offloaded: aws-s3 or S3 (any S3-compatible endpoint), "
        "google-cloud-storage, filesystem (fileSystemURI); empty disables offload"),
    "s3ManagedLedgerOffloadBucket": _s(str, "", "bucket offloaded ledgers go to (aws-s3, S3)"),
    "s3ManagedLedgerOffloadRegion": _s(str, "", "region of the bucket (empty: the SDK's default)"),
    "s3ManagedLedgerOffloadServiceEndpoint": _s(
        str, "", "endpoint of an S3-compatible service, e.g. http://127.0.0.1:9000 (empty: AWS)"),
    "s3ManagedLedgerOffloadMaxBlockSizeInBytes": _s(
        int, 64 * 1024 * 1024, "size of the blocks a ledger is written to the object store in"),
    "s3ManagedLedgerOffloadReadBufferSizeInBytes": _s(
        int, 1024 * 1024, "bytes fetched (one ranged read) and cached per read of an offloaded ledger"),
    "gcsManagedLedgerOffloadBucket": _s(str, "", "bucket offloaded ledgers go to (google-cloud-storage)"),
    "fileSystemURI": _s(
        str, "", "root of the filesystem driver: file:///path, hdfs://host:port/path or a mounted path"),
    "managedLedgerOffloadDeletionLagMs": _s(
        int, 4 * 60 * 60 * 1000, "delete the local copy of an offloaded ledger this long after offload"),
    "managedLedgerOffloadAutoTriggerSizeThresholdBytes": _s(
        int, -1, "offload sealed ledgers while a topic keeps more than this locally (-1: never, 0: at once)"),
    "managedLedgerOffloadThresholdInSeconds": _s(
        int, -1, "offload sealed ledgers older than this (-1: never)"),
    "managedLedgerOffloadReadCacheSizeInBytes": _s(
        int, 64 * 1024 * 1024, "memory for recently read ranges of offloaded ledgers (compactmq's own key)"),
}

SPARK_DEFAULTS: dict[str, str] = {
    "spark.master": "local[*]",
    "spark.app.name": "compactmq-compaction",
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "8",
}

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def _coerce(key: str, value: Any) -> Any:
    setting = SETTINGS[key]
    if setting.type is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise InvalidConfiguration(f"config {key}={value!r}: expected true or false")
    if setting.type is int:
        if isinstance(value, bool):
            raise InvalidConfiguration(f"config {key}={value!r}: expected an integer")
        try:
            return int(str(value).strip())
        except ValueError:
            raise InvalidConfiguration(f"config {key}={value!r}: expected an integer") from None
    return str(value).strip() if not isinstance(value, str) else value.strip()


class Config(Mapping[str, Any]):
    """Merged, validated configuration. Read with ``cfg["key"]``; Spark settings in ``cfg.spark``."""

    def __init__(self, values: dict[str, Any], spark: dict[str, str]):
        self._values = values
        self.spark = spark

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self):
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def with_overrides(self, overrides: Mapping[str, Any]) -> "Config":
        return _merge(dict(self._values), dict(self.spark), overrides, "override")

    @property
    def data_dir(self) -> Path:
        return Path(self["dataDir"])

    def __repr__(self) -> str:
        return f"Config({self._values!r}, spark={self.spark!r})"


def parse_conf_text(text: str, source: str) -> dict[str, str]:
    """broker.conf syntax: ``key=value`` lines, blank lines and ``#`` comments ignored."""
    out: dict[str, str] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if "=" not in line:
            raise InvalidConfiguration(f"{source}:{lineno}: expected key=value, got {line!r}")
        key, value = line.split("=", 1)
        out[key.strip()] = value.strip()
    return out


def parse_override(item: str) -> tuple[str, str]:
    """One ``KEY=VALUE`` from the command line."""
    if "=" not in item:
        raise InvalidConfiguration(f"config override {item!r}: expected KEY=VALUE")
    key, value = item.split("=", 1)
    return key.strip(), value


def _merge(values: dict[str, Any], spark: dict[str, str], layer: Mapping[str, Any], source: str) -> Config:
    for key, value in layer.items():
        if key.startswith(SPARK_PREFIX):
            spark[key] = str(value)
        elif key in SETTINGS:
            values[key] = _coerce(key, value)
        else:
            raise InvalidConfiguration(f"unknown config key {key!r} (from {source})")
    return Config(values, spark)


def load_config(
    file: str | os.PathLike | None = None, overrides: Mapping[str, Any] | None = None
) -> Config:
    """Merge defaults, an optional broker.conf-style file and overrides into a ``Config``."""
    cfg = Config({k: s.default for k, s in SETTINGS.items()}, dict(SPARK_DEFAULTS))
    if file is not None:
        path = Path(file)
        try:
            text = path.read_text()
        except OSError as e:
            raise InvalidConfiguration(f"cannot read config file {path}: {e.strerror}") from None
        cfg = cfg.with_overrides(parse_conf_text(text, str(path))) if text else cfg
    if overrides:
        cfg = cfg.with_overrides(overrides)
    return cfg
