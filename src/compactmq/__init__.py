"""compactmq: a Pulsar-compatible message broker whose headline feature is topic compaction.

Layers, each importing only the ones below it (see the folder names)::

    cli, admin      thin: parse, call a service, render
    broker          asyncio: connections, topics, producers, subscriptions, dispatch
    compaction      TopicCompactionService, strategies, compacted ledger, Spark pipeline
    storage         managed ledgers on disk, cursors, SQLite metadata store
    protocol        sans-I/O Pulsar binary protocol: frames, commands, batches

``errors``, ``naming`` and ``config`` are shared by every layer.
"""

from .config import VERSION as __version__

__all__ = ["__version__"]
