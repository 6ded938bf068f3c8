"""What the client-driven benchmarks share: ``compactmq standalone`` as a subprocess.

The broker listens on free loopback ports with the given data directory and config overrides;
its stdout says "ready" once it accepts connections. ``cpu()`` reads the broker process's
user + system CPU seconds from ``/proc/<pid>/stat`` (fields 14 and 15).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterable

ROOT = Path(__file__).resolve().parents[1]
CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process, from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


class StandaloneBroker:
    def __init__(
        self,
        data_dir: str,
        overrides: Iterable[str] = (),
        src: str | None = None,
        launcher: Iterable[str] = ("-m", "compactmq.cli.main"),
        env: dict[str, str] | None = None,
    ) -> None:
        """``src``: run the broker from another checkout's ``src`` directory (before/after runs).
        ``launcher``: what the interpreter runs, the CLI's arguments following (another script
        that runs the CLI, e.g. ``_profiled_broker.py``); ``env``: added to the environment."""
        self.data_dir = data_dir
        self.port, self.web_port = free_port(), free_port()
        cmd = [
            sys.executable,
            *launcher,
            "standalone",
            "--data-dir",
            data_dir,
            "--broker-port",
            str(self.port),
            "--web-port",
            str(self.web_port),
            "--log-level",
            "WARNING",
        ]
        # no background Spark warm-up unless asked for (compactionSparkWarmup=true among overrides):
        # the client benchmarks measure the broker, not a JVM starting beside it
        for override in ["compactionSparkWarmup=false", *overrides]:
            cmd += ["--config-override", override]
        extra = {**(env or {}), **({"PYTHONPATH": src} if src else {})}
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, cwd=ROOT, env={**os.environ, **extra} if extra else None
        )
        line = self.proc.stdout.readline()
        if b"ready" not in line:
            raise RuntimeError(f"broker did not start: {line!r}")
        self.url = f"pulsar://127.0.0.1:{self.port}"
        self.admin_url = f"http://127.0.0.1:{self.web_port}"

    def cpu(self) -> float:
        return cpu_seconds(self.proc.pid)

    def stop(self, timeout: float = 60) -> float:
        """Stop the broker (SIGTERM, a graceful shutdown); returns the seconds it took.

        A shutdown that outlasts ``timeout`` is reported on stderr and the process is killed, so
        one slow shutdown never loses the figures a long benchmark has already measured."""
        began = time.monotonic()
        self.proc.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            print(
                f"[bench] broker pid {self.proc.pid} still shutting down after {timeout:.0f} s: killed",
                file=sys.stderr,
            )
            self.proc.kill()
            self.proc.wait()
        return time.monotonic() - began
