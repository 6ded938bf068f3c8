"""``compactmq compact-topic`` as its own process beside a read-write Storage (the one test of the
command as a process; its other tests run it in this process, ``harness.cli``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from compactmq.compaction.jobs import SparkCompactionService
from compactmq.config import load_config
from compactmq.storage import Storage

from harness.cli import run_cli

from . import entries as E

pytestmark = [pytest.mark.spark]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_compact_topic_command_commits_and_service_sees_it(spark, tmp_path):
    cfg = load_config(overrides={"managedLedgerSyncData": False})
    storage = Storage(str(tmp_path), cfg)
    try:
        ml = storage.open_managed_ledger("cli-t")
        ml.append_many([E.single(f"k{i % 5}", b"v%d" % i) for i in range(50)] + [E.single("k0", b"")])
        service = SparkCompactionService(storage, "cli-t", cfg)
        assert service.read_compacted_entries((0, 0), 10) == []
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "compactmq.cli.main",
                "--output",
                "json",
                "compact-topic",
                "--topic",
                "cli-t",
                "--data-dir",
                str(tmp_path),
                "--spark-master",
                "local[1]",
                "--config-override",
                "spark.ui.enabled=false",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        body = json.loads(out.stdout)
        assert body["messagesKept"] == 4 and body["messagesRead"] == 51
        assert "compact-topic persistent://public/default/cli-t: done" in out.stderr
        got = [E.decode(b)[1][0][1:3] for _, b in service.read_compacted_entries((0, 0), 10)]
        assert got == [("k1", b"v46"), ("k2", b"v47"), ("k3", b"v48"), ("k4", b"v49")]
    finally:
        storage.close()


def test_bad_topic_is_one_line_error(tmp_path):
    out = run_cli("compact-topic", "--topic", "no-such", "--data-dir", str(tmp_path), "--quiet")
    assert out.returncode == 1 and out.stderr.startswith("compactmq: error:") and "no-such" in out.stderr
