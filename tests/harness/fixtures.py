"""The pytest fixtures of a test broker; a package's ``conftest.py`` imports those it uses.

- ``compaction_factory`` (module): the ``compactionServiceFactoryClassName`` of the module's
  broker; None runs the configured default. A module overrides it (``tests/broker/factories.py``
  runs its tests against the Spark and the Arrow factory).
- ``broker`` (module): one broker per test module, started before its first test and stopped
  after its last: an ``InProcessBroker`` (no Python process to start, and a compaction in it runs
  on the worker's warm SparkSession instead of a JVM of its own), or a ``BrokerProcess`` when the
  module sets ``BROKER_IN_PROCESS = False`` (a test that kills it or reads its process).
- ``client`` (function): a ``pulsar.Client`` of that broker, closed after the test.
- ``topic`` (function): a fresh persistent topic name per test.
"""

from __future__ import annotations

import time

import pytest

from .broker import BrokerProcess, InProcessBroker, make_client


@pytest.fixture(scope="module")
def compaction_factory():
    """The compaction service factory of the module's broker (None: the configured default)."""
    return None


@pytest.fixture(scope="module")
def broker(request, tmp_path_factory, compaction_factory):
    overrides = {"compactionServiceFactoryClassName": compaction_factory} if compaction_factory else {}
    kind = InProcessBroker if getattr(request.module, "BROKER_IN_PROCESS", True) else BrokerProcess
    b = kind(tmp_path_factory.mktemp("broker") / "data", overrides)
    b.start()
    yield b
    b.stop()


@pytest.fixture
def client(broker):
    c = make_client(broker.url)
    yield c
    c.close()


@pytest.fixture
def topic(request):
    """A fresh topic name per test."""
    name = request.node.name.replace("[", "-").replace("]", "")
    return f"persistent://public/default/{name}-{time.monotonic_ns()}"
