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


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A real S3-compatible server (moto) on 127.0.0.1 for the whole run; see ``s3_server.py``."""
    from s3_server import start_s3_server, stop_s3_server

    server = start_s3_server(str(tmp_path_factory.getbasetemp()))
    yield server
    stop_s3_server(server)
