"""Shared fixtures."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def spark():
    """ONE local SparkSession per test run (compaction's test profile: local[2], UI off, few
    shuffle partitions). In-process compaction reuses it through ``getOrCreate``."""
    from compactmq.compaction.spark.session import testing_session

    session = testing_session()
    yield session
    session.stop()
