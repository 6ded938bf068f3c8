"""Shared fixtures, and the rule that marks Spark tests.

A test that needs Spark says so by depending on a fixture: ``spark`` (the in-process
SparkSession) or ``spark_in_broker`` (the broker subprocess it talks to compacts with Spark, so
a JVM starts there). ``pytest_collection_modifyitems`` marks every such test ``spark``, directly
or through other fixtures, so ``-m "not spark"`` starts no JVM without anyone remembering a mark.

Two things here keep the default run short (CI has two cores and a time limit):

- ``SPARK_SUBMIT_OPTS``: every Spark driver JVM the tests start (the in-process session, the
  brokers that compact, ``compact-topic`` and crash children: they inherit the environment) runs
  with the C1 compiler only and the serial collector. These JVMs live seconds to minutes on small
  data, where C2's compile threads and the parallel collector cost more CPU than they win back:
  start-up plus a first job takes about half the CPU. They also map Spark's classes from a
  class-data-sharing archive that ``scripts/test.sh`` records once per virtualenv
  (``harness.jvm_archive``): a session's start and first job take about 5 s of JVM CPU less.
  Production keeps the JVM's defaults.
- ledgers roll as soon as they reach the entry/size limits a test sets: the test process's
  default ``managedLedgerMinLedgerRolloverTimeMinutes`` is 0 (set below; test brokers get it as
  an override in ``broker/conftest.py``), as Pulsar's own tests set it. Production keeps
  Pulsar's 10 minutes; the tests of the minimum itself set it explicitly.
- the run is split over pytest-xdist workers by module (``scripts/test.sh``: ``--dist loadfile``,
  so a module's broker is started once, and ``--no-loadscope-reorder``), except that the modules
  that start a JVM in the test process run in "Spark lanes" on half the workers
  (``harness.spark_lanes``), so only those start a session JVM. A worker takes the next
  module in the queue when it is done with one, so the queue is longest first (LPT): the modules
  of ``LONG_MODULES`` (measured seconds) by weight, then the other modules that start a JVM, then
  the rest; the workers then finish within a short module of each other. A module missing
  from the table only costs balance; refresh it from a run's ``--junitxml`` when the order drifts.
"""

from __future__ import annotations

import os

import pytest

from harness import jvm_archive, spark_lanes

#: JVM flags for the short-lived Spark drivers of the test run (see the module docstring), with
#: the class-data-sharing archive of Spark's classes when scripts/test.sh made one (``harness.jvm_archive``)
os.environ.setdefault("SPARK_SUBMIT_OPTS", jvm_archive.jvm_opts())


def _roll_ledgers_at_once_in_tests() -> None:
    import dataclasses

    from compactmq.config import SETTINGS

    key = "managedLedgerMinLedgerRolloverTimeMinutes"
    SETTINGS[key] = dataclasses.replace(SETTINGS[key], default=0)


_roll_ledgers_at_once_in_tests()


def _dummy_object_store_credentials() -> None:
    """The S3 test servers' dummy credentials (``s3_server.DUMMY_CREDENTIALS``), in the
    environment from the start: a JVM a test worker starts keeps the environment of that moment,
    and its Python workers (the compaction tasks that upload a view's parts) inherit it, so a
    worker's one SparkSession must already see them when an in-process broker's compaction
    writes to S3 later in the run."""
    from s3_server import DUMMY_CREDENTIALS

    for key, value in DUMMY_CREDENTIALS.items():
        os.environ.setdefault(key, value)


_dummy_object_store_credentials()

#: fixtures whose use means a JVM starts (in this process or in a broker subprocess)
SPARK_FIXTURES = ("spark", "spark_in_broker")

#: the modules of 7 s and more in the default run and their seconds in one xdist worker (the junit XML
#: of a fresh-clone CI run, the sum of its test cases' times, 4 workers on the 2-core machine, 27 Nov,
#: 6 min 40 s): queued first, longest first; also the weights that balance the Spark lanes
LONG_MODULES = {
    "tests/broker/test_read_compacted.py": 110,
    "tests/compaction/test_parity.py": 99,
    "tests/security/test_wire_auth.py": 61,
    "tests/admin/test_offload_crash.py": 55,
    "tests/compaction/test_crash.py": 37,
    "tests/spark/test_auth.py": 37,
    "tests/spark/test_stream.py": 35,
    "tests/compaction/test_joint_topics_parity.py": 30,
    "tests/security/test_policy_values.py": 29,
    "tests/security/test_tls.py": 29,
    "tests/admin/test_zk_crash.py": 28,
    "tests/broker/test_broker_client.py": 28,
    "tests/broker/test_broker_lifecycle.py": 28,
    "tests/broker/test_compaction_warmup.py": 25,
    "tests/compaction/test_compaction_to_store.py": 24,
    "tests/broker/test_cluster_failover.py": 23,
    "tests/spark/test_batch_read.py": 23,
    "tests/security/test_preauth_binary.py": 22,
    "tests/spark/test_broker_columns.py": 21,
    "tests/spark/test_columns_spark.py": 21,
    "tests/storage/test_offload.py": 21,
    "tests/broker/test_cluster.py": 20,
    "tests/broker/test_inactive_topics.py": 20,
    "tests/admin/test_admin_rest.py": 19,
    "tests/broker/test_listeners.py": 19,
    "tests/storage/test_object_ledgers.py": 19,
    "tests/admin/test_process_and_cache_metrics.py": 17,
    "tests/compaction/test_partitioned_parity.py": 16,
    "tests/spark/test_broker_entries_secured.py": 16,
    "tests/spark/test_write.py": 16,
    "tests/admin/test_offload_rest.py": 15,
    "tests/broker/test_nonpersistent.py": 15,
    "tests/compaction/test_cli.py": 15,
    "tests/compat/test_rollover_under_a_reader.py": 15,
    "tests/admin/test_metadata_store_topics.py": 14,
    "tests/storage/test_crash.py": 14,
    "tests/admin/test_compaction_lag.py": 13,
    "tests/admin/test_metadata_store_url.py": 13,
    "tests/broker/test_key_shared_hash.py": 13,
    "tests/broker/test_cluster_object_store.py": 12,
    "tests/broker/test_dedup.py": 12,
    "tests/cli/test_cli_e2e.py": 12,
    "tests/compaction/test_failover_regressions.py": 11,
    "tests/spark/test_pushdown.py": 11,
    "tests/broker/test_limits.py": 10,
    "tests/spark/test_pushdown_topics.py": 10,
    "tests/storage/test_compaction_state_zk.py": 10,
    "tests/storage/test_ledger_storage_contract.py": 10,
    "tests/storage/test_offload_compacted.py": 10,
    "tests/broker/test_read_compacted_retention.py": 9,
    "tests/compaction/test_object_chain.py": 9,
    "tests/security/test_admin_auth.py": 9,
    "tests/security/test_cli_auth.py": 9,
    "tests/security/test_preauth_http.py": 9,
    "tests/admin/test_offload_auto.py": 8,
    "tests/broker/test_table_view.py": 8,
    "tests/compaction/test_large_views.py": 8,
    "tests/compat/test_batch_index_ack_setting.py": 8,
    "tests/compat/test_pulsar_conf_files.py": 8,
    "tests/protocol/test_wire.py": 8,
    "tests/security/test_standalone_conf.py": 8,
    "tests/security/test_topic_dirs_secured.py": 8,
    "tests/spark/test_export.py": 8,
    "tests/storage/test_cursor.py": 8,
    "tests/compaction/test_entry_scan.py": 7,
    "tests/storage/metadata_store/test_sessions.py": 7,
}


def pytest_collection_modifyitems(config, items):
    spark_modules = set()
    for item in items:
        if any(name in getattr(item, "fixturenames", ()) for name in SPARK_FIXTURES):
            item.add_marker(pytest.mark.spark)
        if item.get_closest_marker("spark") is not None:
            spark_modules.add(item.nodeid.split("::", 1)[0])

    def queue_order(item) -> tuple:
        module = item.nodeid.split("::", 1)[0]
        if module in LONG_MODULES:
            return (0, -LONG_MODULES[module])
        return (1 if module in spark_modules else 2, 0)

    # stable: the order within a module, and among the modules of one rank, stays the collection's
    items.sort(key=queue_order)
    _tell_the_controller_the_spark_modules(config, items, spark_modules)


def _tell_the_controller_the_spark_modules(config, items, spark_modules) -> None:
    """An xdist worker writes its Spark modules, in queue order, for the controller's lanes."""
    path = getattr(config, "workerinput", {}).get(spark_lanes.SPARK_MODULES_KEY)
    if path:
        ordered = dict.fromkeys(item.nodeid.split("::", 1)[0] for item in items)
        spark_lanes.write_spark_modules(path, [m for m in ordered if m in spark_modules])


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """The controller names the file each worker writes its Spark modules to."""
    node.workerinput[spark_lanes.SPARK_MODULES_KEY] = _spark_modules_file(node.config)


def _spark_modules_file(config) -> str:
    if not hasattr(config, "_compactmq_spark_modules_file"):
        import tempfile

        config._compactmq_spark_modules_file = os.path.join(tempfile.mkdtemp(prefix="cmq-lanes-"), "spark")
    return config._compactmq_spark_modules_file


def pytest_unconfigure(config):
    path = getattr(config, "_compactmq_spark_modules_file", None)
    if path:
        import shutil

        shutil.rmtree(os.path.dirname(path), ignore_errors=True)


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` keeps the Spark modules on few workers (``harness.spark_lanes``)."""
    if config.getvalue("dist") != "loadfile":
        return None
    return spark_lanes.SparkLaneScheduling(
        config, log, modules_file=_spark_modules_file(config), weights=LONG_MODULES
    )


@pytest.fixture(scope="session")
def _spark_run():
    """Stops the worker's SparkSession at the end of the run (``spark`` makes it on first use)."""
    yield
    from pyspark.sql import SparkSession

    session = SparkSession._instantiatedSession
    if session is not None:
        from harness.spark_session import discard, probe

        reason = probe(session)
        if reason is None:
            session.stop()
        else:  # a broken session's stop could wait on an out-of-step answer
            discard(session, f"{reason} (at the end of the run)")


@pytest.fixture
def spark(_spark_run):
    """ONE local SparkSession per test worker (compaction's test profile: local[2], UI off, few
    shuffle partitions), probed before each test and replaced when a test left it broken
    (``harness.spark_session``: a timed-out py4j call, a stopped context, a dead JVM), so only
    that test fails. In-process compaction reuses it through ``getOrCreate``."""
    from harness.spark_session import healthy_session

    return healthy_session()


@pytest.fixture
def spark_in_broker():
    """Declares that the test makes its broker subprocess compact with Spark (marks it ``spark``)."""
    return None


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A real S3-compatible server (moto) on 127.0.0.1 for the whole run; see ``s3_server.py``."""
    from s3_server import start_s3_server, stop_s3_server

    server = start_s3_server(str(tmp_path_factory.getbasetemp()))
    yield server
    stop_s3_server(server)


@pytest.fixture(scope="session")
def seaweedfs():
    """SeaweedFS (``weed server -s3``) on 127.0.0.1 for the whole run; see ``seaweedfs_server.py``."""
    from seaweedfs_server import start_seaweedfs, stop_seaweedfs

    server = start_seaweedfs()
    yield server
    stop_seaweedfs(server)


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory):
    """A Google Cloud Storage emulator on 127.0.0.1 for the whole run; see ``gcs_server.py``."""
    from gcs_server import start_gcs_server, stop_gcs_server

    server = start_gcs_server(str(tmp_path_factory.getbasetemp()))
    yield server
    stop_gcs_server(server)
