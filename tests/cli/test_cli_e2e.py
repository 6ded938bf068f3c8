"""The ``compactmq`` CLI against a running standalone broker (one broker for the module; each command runs in this process through ``main(argv)``, ``harness.cli``, its output and
exit status captured as a subprocess would have them): pulsar-admin-shaped commands with global
options first, ``--output json``, sizes and durations with units, errors as one line with exit
status 1, ``compact --wait`` and ``compaction-status -w`` with progress, 409 on a concurrent
trigger, automatic compaction. ``tests/cli/test_console_script.py`` runs the installed command
as its own process.

The subject is the CLI, not the compaction engine: the broker compacts with the test suite's Arrow
factory (``broker.factories``), so the module starts no JVM. Its gate (``arrow_compaction.GATE_ENV``)
is open (the file exists) except while the 409 test holds a run RUNNING on purpose."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

pytest.importorskip("pulsar")

from admin.harness import open_gate, poke_policy, publish, start_gated_broker  # noqa: E402
from harness.cli import CliResult, admin_cli  # noqa: E402
from harness.wait import wait_until  # noqa: E402

pytestmark = pytest.mark.integration

NS = "public/default"


@pytest.fixture(scope="module")
def gate(tmp_path_factory) -> Path:
    return open_gate(tmp_path_factory)


@pytest.fixture(scope="module")
def broker(tmp_path_factory, gate):
    b = start_gated_broker(tmp_path_factory.mktemp("cli") / "data", gate)
    yield b
    b.stop()


@pytest.fixture(scope="module")
def cli(broker):
    return admin_cli(broker)


def ok(proc: CliResult) -> str:
    assert proc.returncode == 0, (proc.args, proc.returncode, proc.stdout, proc.stderr)
    return proc.stdout


def fails(proc: CliResult, *fragments: str) -> str:
    assert proc.returncode == 1, (proc.args, proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert lines and lines[-1].startswith("compactmq: error: "), proc.stderr
    for f in fragments:
        assert f in proc.stderr, (f, proc.stderr)
    return proc.stderr


def as_json(proc: CliResult):
    return json.loads(ok(proc))


def test_compact_twice_is_409_then_status_waits_with_progress(broker, gate, cli):
    topic = "persistent://public/default/cli-compact"
    publish(broker, topic, 3000, keys=30)
    gate.unlink()  # the run holds after its first read: RUNNING until the gate opens again
    opener = threading.Timer(2.0, gate.touch)  # opens while ``-w`` below is already waiting
    try:
        assert "compaction triggered" in ok(cli("topics", "compact", topic))
        fails(cli("topics", "compact", topic), "already running", "HTTP 409")
        opener.start()
        proc = cli("topics", "compaction-status", "-w", topic)
    finally:
        opener.cancel()  # it has fired, unless the test failed before
        gate.touch()
    assert ok(proc).strip() == "SUCCESS"
    assert "RUNNING" in proc.stderr  # the progress lines, one per change (stderr is not a tty)
    status = as_json(cli("topics", "compaction-status", topic, output="json"))
    assert status == {"status": "SUCCESS", "lastError": ""}
    stats = as_json(cli("topics", "stats", topic, output="json"))
    assert stats["compaction"]["lastCompactionRemovedEventCount"] == 3000 - 30
    internal = as_json(cli("topics", "internal-stats", topic, output="json"))
    assert internal["compactedLedger"]["ledgerId"] > 0
    # compact --wait on the next round: progress on stderr, the final status on stdout
    publish(broker, topic, 300, keys=30, prefix="w")
    assert ok(cli("topics", "compact", "--wait", topic)).strip() == "SUCCESS"


def test_threshold_set_by_cli_compacts_automatically(broker, cli):
    topic = "persistent://public/default/cli-auto"
    publish(broker, topic, 500, keys=5)
    ok(cli("topics", "set-compaction-threshold", topic, "--threshold", "1K"))
    assert as_json(cli("topics", "get-compaction-threshold", topic, output="json")) == 1024
    wait_until(
        lambda: as_json(cli("topics", "compaction-status", topic, output="json"))["status"] == "SUCCESS",
        60,
        "the automatic compaction to succeed",
        interval=0.5,
    )
    assert "__compaction" in as_json(cli("topics", "internal-stats", topic, output="json"))["cursors"]


def test_failed_compaction_exits_1_with_the_reason(broker, cli):
    topic = "persistent://public/default/cli-failing"
    publish(broker, topic, 20, keys=2)
    poke_policy(broker.data_dir, "topic", topic, "compactionRetentionMode", "bogus")
    fails(cli("topics", "compact", "--wait", topic), "compaction failed", "bogus")
    proc = cli("topics", "compaction-status", topic, output="json")
    assert proc.returncode == 1
    body = json.loads(proc.stdout)
    assert body["status"] == "ERROR" and "bogus" in body["lastError"]


def test_tenants_namespaces_and_topics(cli):
    ok(cli("tenants", "create", "clitenant"))
    assert "clitenant" in as_json(cli("tenants", "list", output="json"))
    ok(cli("namespaces", "create", "clitenant/ns1"))
    assert as_json(cli("namespaces", "list", "clitenant", output="json")) == ["clitenant/ns1"]
    t = "persistent://clitenant/ns1/orders"
    assert ok(cli("topics", "create", t)).strip() == f"created {t}"
    assert as_json(cli("topics", "create", t + "-x", output="json"))["result"] == "ok"
    assert ok(cli("topics", "list", "clitenant/ns1")).split() == [t, t + "-x"]
    ok(cli("topics", "create-partitioned-topic", t + "-p", "-p", "2"))
    assert as_json(cli("topics", "list-partitioned-topics", "clitenant/ns1", output="json")) == [t + "-p"]
    stats = as_json(cli("topics", "stats", t, output="json"))
    assert set(stats["compaction"]) == {
        "lastCompactionRemovedEventCount",
        "lastCompactionSucceedTimestamp",
        "lastCompactionFailedTimestamp",
        "lastCompactionDurationTimeInMills",
        # ours (issue 13): the view in force, the lag, the last run's phases
        "compactedKeys",
        "compactedTombstones",
        "compactedEntries",
        "compactedSize",
        "compactionLagInMillis",
        "lastCompactionPhaseTimesInMillis",
        "lastCompactionJob",  # ours: the Spark job group of the last run
        "lastCompactionRun",  # ours (issue 30): the last run in this broker, its job's topics
        "maxLag",  # ours (issue 30): with a compactionMaxLagSeconds, whether the monitor keeps it
    }
    assert "ledgers" in as_json(cli("topics", "stats-internal", t, output="json"))
    fails(cli("namespaces", "delete", "clitenant/ns1"), "HTTP 409")
    ok(cli("topics", "delete", t))
    ok(cli("topics", "delete", t + "-x", "--force"))
    ok(cli("topics", "delete-partitioned-topic", t + "-p"))
    ok(cli("namespaces", "delete", "clitenant/ns1"))
    ok(cli("tenants", "delete", "clitenant"))
    assert "clitenant" not in as_json(cli("tenants", "list", output="json"))


def test_policies_with_units(cli):
    ok(cli("namespaces", "create", "public/clipol"))
    ok(cli("namespaces", "set-compaction-threshold", "public/clipol", "--threshold", "100M"))
    assert (
        as_json(cli("namespaces", "get-compaction-threshold", "public/clipol", output="json"))
        == 100 * 1024**2
    )
    assert "100.0 MiB" in ok(cli("namespaces", "get-compaction-threshold", "public/clipol"))
    ok(cli("namespaces", "remove-compaction-threshold", "public/clipol"))
    assert (
        ok(cli("namespaces", "get-compaction-threshold", "public/clipol")).strip()
        == "no compaction threshold set"
    )
    ok(cli("namespaces", "set-retention", "public/clipol", "--size", "10G", "--time", "3h"))
    assert as_json(cli("namespaces", "get-retention", "public/clipol", output="json")) == {
        "retentionSizeInMB": 10240,
        "retentionTimeInMinutes": 180,
    }
    ok(cli("namespaces", "set-compaction-strategy", "public/clipol", "-s", "keep-first"))
    assert (
        as_json(cli("namespaces", "get-compaction-strategy", "public/clipol", output="json")) == "keep-first"
    )
    ok(cli("namespaces", "set-retain-null-key", "public/clipol", "--retain", "true"))
    assert ok(cli("namespaces", "get-retain-null-key", "public/clipol")).strip() == "true"

    t = "persistent://public/clipol/t"
    ok(cli("topics", "create", t))
    ok(cli("topics", "set-retention", t, "--size", "-1", "--time", "1d"))
    assert as_json(cli("topics", "get-retention", t, output="json")) == {
        "retentionSizeInMB": -1,
        "retentionTimeInMinutes": 1440,
    }
    ok(cli("topics", "set-compaction-strategy", t, "-s", "event-time"))
    ok(cli("topics", "remove-compaction-strategy", t))
    assert ok(cli("topics", "get-compaction-strategy", t)).strip() == "no compaction strategy set"
    fails(
        cli("topics", "set-compaction-strategy", t, "-s", "nonsense"),
        "is not allowed on this broker",
        "HTTP 412",
    )
    ok(cli("topics", "delete", t))
    ok(cli("namespaces", "delete", "public/clipol"))


def test_errors_are_one_line_with_exit_status_1(broker, cli):
    missing = "persistent://public/default/cli-missing"
    fails(cli("topics", "compaction-status", missing), "does not exist", "HTTP 404")
    fails(cli("topics", "compact", missing), "HTTP 404")
    fails(cli("topics", "compact", "non-persistent://public/default/x"), "HTTP 405")
    fails(cli("topics", "stats", missing), "HTTP 404")
    fails(cli("namespaces", "create", "nosuchtenant/ns"), "HTTP 404")
    fails(cli("tenants", "create", "public"), "HTTP 409")
    fails(cli("namespaces", "set-compaction-threshold", NS, "--threshold", "12Q"), "invalid size")
    fails(cli("topics", "set-retention", missing, "--size", "1G", "--time", "soon"), "invalid duration")
    fails(cli("topics", "create", "persistent://public/default/a/b/c"), "invalid")
    fails(cli("tenants", "list", url="http://127.0.0.1:9"), "cannot reach the admin API")
    proc = cli("topics", "nosuchcommand")
    assert proc.returncode == 2  # usage errors, as argparse
