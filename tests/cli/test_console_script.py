"""The installed ``compactmq`` console script as a process of its own: what the in-process runner
(``harness.cli``) cannot show -- the script's entry point exists and calls ``main``, and ``main``'s
answer becomes the process's exit status (0, 1 for an error, 2 for a usage error).

The other CLI tests run ``main(argv)`` in the test process; these three start Python, on purpose.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from harness.broker import ROOT, free_port

SCRIPT = Path(sys.executable).parent / "compactmq"  # what `pip install` put beside the interpreter


def compactmq(*args: str) -> subprocess.CompletedProcess:
    assert SCRIPT.exists(), f"{SCRIPT} is missing: install the package (scripts/setup.sh)"
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=60, cwd=ROOT)


def test_help_lists_the_commands_and_exits_0():
    proc = compactmq("--help")
    assert proc.returncode == 0, proc.stderr
    for command in ("standalone", "compact-topic", "topics", "namespaces", "tenants", "tokens", "schemas"):
        assert command in proc.stdout, command


def test_an_error_is_one_line_and_exit_status_1():
    unused = free_port()  # nothing listens there
    proc = compactmq("--admin-url", f"http://127.0.0.1:{unused}", "tenants", "list")
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("compactmq: error: cannot reach the admin API"), (
        proc.stderr
    )


def test_a_usage_error_exits_2():
    proc = compactmq("topics", "nosuchcommand")
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "usage: compactmq" in proc.stderr and "nosuchcommand" in proc.stderr
