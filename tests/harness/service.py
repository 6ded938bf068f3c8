"""A broker service without a socket: ``BrokerService`` over a real ``Storage`` in a test's own
directory, for tests that drive topics, producers and commits directly (no client, no event loop
of a broker process).

``make_service(data_dir, **overrides)`` returns ``(service, storage)`` with the default namespace
created and fsync on (``managedLedgerSyncData``: the durability the broker promises), the
overrides on top; ``close_service`` stops its storage threads and closes the storage. The
``service`` fixture of a module is the two around one test.
"""

from __future__ import annotations

from pathlib import Path

from compactmq.broker.server import BrokerService
from compactmq.config import load_config
from compactmq.storage import Storage
from compactmq.broker.default_namespace import ensure_default_namespace


def make_service(data_dir: Path, **overrides) -> tuple[BrokerService, Storage]:
    cfg = load_config(overrides={"managedLedgerSyncData": True, **overrides})
    storage = Storage(str(data_dir), cfg)
    ensure_default_namespace(storage.resources, cfg, None)
    return BrokerService(cfg, storage, "pulsar://127.0.0.1:1"), storage


def close_service(service: BrokerService, storage: Storage) -> None:
    service.sync_threads.shutdown()
    service.executor.shutdown()
    storage.close()
