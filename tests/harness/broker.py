"""A real standalone broker for integration tests: a subprocess on free ports, a temp data dir.

``BrokerProcess(data_dir, overrides)`` runs ``compactmq standalone`` (the same entry point an
operator runs) with ``--config-override KEY=VALUE`` for each override, and ``start()`` returns
once the broker has printed ``ready``. ``stop()`` sends SIGTERM (the ordered shutdown) and
answers the exit status; ``restart()`` starts it again on the same ports and data dir. The
broker's log goes to ``broker-<port>.log`` beside the data dir (a failed start shows its tail).

Test brokers run without the background Spark warm-up (a JVM each otherwise) unless an override
turns ``compactionSparkWarmup`` on. ``children.keep`` makes each broker die with the test process
that started it (see ``tests/children.py``).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import children  # tests/ is on sys.path

#: the repository root: the working directory of every process a test starts
ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class BrokerProcess:
    def __init__(
        self, data_dir: Path, overrides: dict[str, str] | None = None, extra_args: list[str] | None = None
    ) -> None:
        self.data_dir = data_dir
        self.extra_args = list(extra_args or [])
        self.port = free_port()
        self.web_port = free_port()
        self.overrides = dict(overrides or {})
        self.proc: subprocess.Popen | None = None
        self.log_path = data_dir.parent / f"broker-{self.port}.log"

    @property
    def url(self) -> str:
        return f"pulsar://127.0.0.1:{self.port}"

    @property
    def web_url(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    def command(self) -> list[str]:
        cmd = [
            sys.executable,
            "-m",
            "compactmq.cli.main",
            "standalone",
            "--data-dir",
            str(self.data_dir),
            "--broker-port",
            str(self.port),
            "--web-port",
            str(self.web_port),
            "--log-level",
            "WARNING",
        ]
        # no background Spark warm-up in test brokers (a JVM each otherwise); a test that wants it
        # sets compactionSparkWarmup=true in its overrides. Ledgers roll by their limits at once
        # (managedLedgerMinLedgerRolloverTimeMinutes=0, as in the test process: tests/conftest.py)
        defaults = {"compactionSparkWarmup": "false", "managedLedgerMinLedgerRolloverTimeMinutes": "0"}
        for k, v in {**defaults, **self.overrides}.items():
            cmd += ["--config-override", f"{k}={v}"]
        return cmd + self.extra_args

    def start(self, timeout: float = 30.0) -> None:
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            self.command(),
            **children.keep(
                stdout=subprocess.PIPE, stderr=log, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"}
            ),
        )
        log.close()  # the child has its own copy
        deadline = time.monotonic() + timeout
        line = b""
        while time.monotonic() < deadline:  # readline blocks: not a poll, a read of the ready line
            line = self.proc.stdout.readline()
            if b"ready" in line:
                return
            if not line and self.proc.poll() is not None:
                break
        raise RuntimeError(f"broker did not start: {line!r}; log: {self.log_path.read_text()[-2000:]}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self.proc.stdout.close()
        self.proc = None
        return rc

    def restart(self) -> None:
        self.stop()
        self.start()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def make_client(url: str, **kw):
    """The official client, its C++ logging at warnings, a 15 s operation timeout by default."""
    import pulsar

    kw.setdefault("operation_timeout_seconds", 15)
    return pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn), **kw)
