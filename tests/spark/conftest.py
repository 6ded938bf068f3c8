"""Fixtures of the Spark source tests: a real broker (in this process), the shared SparkSession with the
format registered, and helpers that produce, compact and read with the official client (the oracle).
"""

from __future__ import annotations

import time
import weakref

import pytest
from harness.broker import InProcessBroker
from harness.fixtures import client  # noqa: F401 - the module broker's client, closed after each test


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    # infinite retention: the raw view is compared with the whole log, and a ledger sealed for a
    # compaction run would otherwise be trimmed (no subscription holds it) while a test reads.
    # In this process: a compaction it runs uses the worker's SparkSession (harness.broker)
    b = InProcessBroker(
        tmp_path_factory.mktemp("broker") / "data",
        {"defaultRetentionTimeInMinutes": "-1", "defaultRetentionSizeInMB": "-1"},
    )
    b.start()
    yield b
    b.stop()


#: the sessions the ``compactmq`` format is registered in (a replaced session needs it again)
_REGISTERED: "weakref.WeakSet" = weakref.WeakSet()


@pytest.fixture
def cmq_spark(spark):
    import compactmq.spark

    if spark not in _REGISTERED:
        compactmq.spark.register(spark)
        _REGISTERED.add(spark)
    return spark


@pytest.fixture
def topic(request):
    name = request.node.name.replace("[", "-").replace("]", "").replace("_", "-")
    return f"persistent://public/default/{name}-{time.monotonic_ns()}"
