"""``compact-topic`` runs out of process with no network credentials; file permissions on the
data directory are its access control, so it refuses, with one line, a directory it cannot
read or that is not a broker's."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from compactmq.config import load_config
from compactmq.storage import Storage

from broker.conftest import ROOT  # tests/ is on sys.path


def compact_topic(data_dir, *, user: int | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "compactmq.cli.main",
            "compact-topic",
            "--topic",
            "t",
            "--data-dir",
            str(data_dir),
            "--quiet",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=(lambda: os.setuid(user)) if user is not None else None,
    )


def assert_one_line_error(out: subprocess.CompletedProcess, *fragments: str) -> None:
    assert out.returncode == 1, (out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("compactmq: error: cannot compact "), out.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_missing_data_directory(tmp_path):
    assert_one_line_error(compact_topic(tmp_path / "nope"), "does not exist")
    assert not (tmp_path / "nope").exists()  # and nothing was created there


def test_a_file_is_not_a_data_directory(tmp_path):
    (tmp_path / "f").write_text("x")
    assert_one_line_error(compact_topic(tmp_path / "f"), "is not a directory")


def test_a_directory_without_metadata_is_not_a_broker_data_directory(tmp_path):
    assert_one_line_error(compact_topic(tmp_path), "has no metadata.db")
    assert os.listdir(tmp_path) == []  # no ledgers/ or metadata.db made by mistake


def test_unreadable_metadata(tmp_path):
    (tmp_path / "metadata.db").mkdir()
    assert_one_line_error(compact_topic(tmp_path), "cannot be read", "metadata.db")
    (tmp_path / "metadata.db").rmdir()
    (tmp_path / "metadata.db").write_bytes(b"not sqlite at all")
    assert_one_line_error(compact_topic(tmp_path), "not a SQLite database")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the job as another user")
def test_permission_denied_for_another_user(tmp_path):
    """A user who may not read the broker's directory is refused before Spark starts.

    The job runs as nobody against a 0700 data directory; the interpreter must be reachable by
    that user, else the check cannot run and the test says so."""
    try:
        probe = subprocess.run(
            [sys.executable, "-c", "import compactmq.cli.main"],
            cwd=ROOT,
            preexec_fn=lambda: os.setuid(65534),
            capture_output=True,
        ).returncode
    except PermissionError:
        probe = -1
    if probe != 0:
        pytest.skip("the Python interpreter is not readable by user nobody on this machine")
    data = tmp_path / "data"
    Storage(data, load_config(overrides={"managedLedgerSyncData": False})).close()
    os.chmod(data, 0o700)
    assert_one_line_error(compact_topic(data, user=65534), "Permission denied")
