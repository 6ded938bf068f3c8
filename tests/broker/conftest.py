"""A real standalone broker for integration tests: a subprocess on free ports, a temp data dir.

``broker`` is module-scoped (one broker per test module); ``BrokerProcess.restart()`` stops it
with SIGTERM (the ordered shutdown) and starts it again on the same port and data dir.
``client`` is a pulsar.Client with the C++ client's logging turned down to warnings.

``compaction_factory`` is the ``compactionServiceFactoryClassName`` the module's broker runs with
(the default). A module that imports ``compaction_factory`` from ``factories`` runs every test
against each factory: the default (Spark) one and a deliberately different one kept in tests.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import children  # tests/ is on sys.path

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
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

    def start(self, timeout: float = 30.0) -> None:
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
        cmd += self.extra_args
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            cmd,
            **children.keep(
                stdout=subprocess.PIPE, stderr=log, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"}
            ),
        )
        deadline = time.monotonic() + timeout
        line = b""
        while time.monotonic() < deadline:
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


@pytest.fixture(scope="module")
def compaction_factory():
    """The compaction service factory of the module's broker (None: the configured default)."""
    return None


@pytest.fixture(scope="module")
def broker(tmp_path_factory, compaction_factory):
    overrides = {"compactionServiceFactoryClassName": compaction_factory} if compaction_factory else {}
    b = BrokerProcess(tmp_path_factory.mktemp("broker") / "data", overrides)
    b.start()
    yield b
    b.stop()


def subscription_stats(broker: "BrokerProcess", topic: str, subscription: str) -> dict:
    """The subscription's entry in the broker's admin topic stats."""
    path = topic.replace("://", "/", 1)
    with urllib.request.urlopen(f"http://127.0.0.1:{broker.web_port}/admin/v2/{path}/stats", timeout=10) as r:
        return json.loads(r.read())["subscriptions"][subscription]


def subscription_backlog(broker: "BrokerProcess", topic: str, subscription: str) -> int:
    """The subscription's msgBacklog (entries) from the broker's admin stats."""
    return subscription_stats(broker, topic, subscription)["msgBacklog"]


def wait_unacked(
    broker: "BrokerProcess", topic: str, subscription: str, unacked: int, timeout: float = 15.0
) -> None:
    """Wait until the subscription's unackedMessages (messages, batch indexes counted one by one,
    as on Pulsar) is ``unacked``: the broker has the acknowledgements the client grouped."""
    deadline = time.monotonic() + timeout
    while (got := subscription_stats(broker, topic, subscription)["unackedMessages"]) != unacked:
        assert time.monotonic() < deadline, f"{subscription} has {got} unacked messages, not {unacked}"
        time.sleep(0.05)


def wait_backlog(
    broker: "BrokerProcess", topic: str, subscription: str, backlog: int, timeout: float = 15.0
) -> None:
    """Wait until the broker has the subscription's acknowledgements (the client groups them)."""
    deadline = time.monotonic() + timeout
    while (got := subscription_backlog(broker, topic, subscription)) != backlog:
        assert time.monotonic() < deadline, (
            f"backlog of {subscription} is {got}, not {backlog}, after {timeout} s"
        )
        time.sleep(0.05)


def make_client(url: str, **kw):
    import pulsar

    kw.setdefault("operation_timeout_seconds", 15)
    return pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn), **kw)


@pytest.fixture
def client(broker):
    c = make_client(broker.url)
    yield c
    c.close()


@pytest.fixture
def topic(request):
    """A fresh topic name per test."""
    return f"persistent://public/default/{request.node.name.replace('[', '-').replace(']', '')}-{time.monotonic_ns()}"
