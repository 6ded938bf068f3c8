"""The broker package's fixtures: a real standalone broker per module (``harness.fixtures``).

``broker`` is module-scoped (one broker per test module); ``BrokerProcess.restart()`` stops it
with SIGTERM (the ordered shutdown) and starts it again on the same port and data dir.
``client`` is a pulsar.Client with the C++ client's logging turned down to warnings.

``compaction_factory`` is the ``compactionServiceFactoryClassName`` the module's broker runs with
(the default). A module that imports ``compaction_factory`` from ``factories`` runs every test
against each factory: the default (Spark) one and a deliberately different one kept in tests.

The helpers live in ``tests/harness``; the names other modules import from here
(``from broker.conftest import BrokerProcess, make_client``...) stay importable, re-exported.
"""

from __future__ import annotations

from harness.broker import ROOT, BrokerProcess, free_port, make_client
from harness.fixtures import broker, client, compaction_factory, topic
from harness.http import subscription_backlog, subscription_stats, wait_backlog, wait_unacked

__all__ = [
    "ROOT",
    "BrokerProcess",
    "broker",
    "client",
    "compaction_factory",
    "free_port",
    "make_client",
    "subscription_backlog",
    "subscription_stats",
    "topic",
    "wait_backlog",
    "wait_unacked",
]
