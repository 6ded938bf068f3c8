"""A real standalone broker for integration tests: a subprocess on free ports, a temp data dir.

``BrokerProcess(data_dir, overrides)`` runs ``compactmq standalone`` (the same entry point an
operator runs) with ``--config-override KEY=VALUE`` for each override, and ``start()`` returns
once the broker has printed ``ready``. ``stop()`` sends SIGTERM (the ordered shutdown) and
answers the exit status; ``restart()`` starts it again on the same ports and data dir. The
broker's log goes to ``broker-<port>.log`` beside the data dir (a failed start shows its tail).

Test brokers run without the background Spark warm-up (a JVM each otherwise) unless an override
turns ``compactionSparkWarmup`` on. ``children.keep`` makes each broker die with the test process
that started it (see ``tests/children.py``).

Ports are picked free (``free_port``) and bound a moment later by the broker; in between, any
process of the run may take one (an outgoing connection's local port comes from the same range),
and more xdist workers make that likelier. A first ``start()`` whose bind fails with "address
already in use" therefore tries again on fresh ports (``ports.START_ATTEMPTS``), unless the test already
wrote those ports into the broker's configuration (an advertised listener names them); a
``restart()`` keeps its ports, since the test's clients know them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import children  # tests/ is on sys.path
from ports import START_ATTEMPTS, PortTaken, says_port_taken

#: the repository root: the working directory of every process a test starts
ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: settings a test may give a port from ``free_port`` alone: picked again with the others on a
#: retry, so a fixture reads them back from ``overrides`` after ``start`` (never keeps its own copy)
REPICKED_PORT_KEYS = ("brokerServicePortTls", "webServicePortTls")


def _start_on_free_ports(broker, start_once, timeout: float) -> None:
    """``start_once(timeout)``, again on fresh ports when a picked port was taken meanwhile
    (the module docstring): only on a first start, and only while no other configured value
    names the ports (``REPICKED_PORT_KEYS`` holding a bare port are picked again too)."""
    for attempt in range(START_ATTEMPTS):
        try:
            return start_once(timeout)
        except PortTaken:
            repicked = [k for k in REPICKED_PORT_KEYS if str(broker.overrides.get(k, "")).isdigit()]
            ports = (str(broker.port), str(broker.web_port), *(str(broker.overrides[k]) for k in repicked))
            others = [v for k, v in broker.overrides.items() if k not in repicked]
            named = [
                v for v in [*others, *getattr(broker, "extra_args", [])] if any(p in str(v) for p in ports)
            ]
            if broker.started_once or named or attempt == START_ATTEMPTS - 1:
                raise
            broker.port, broker.web_port = free_port(), free_port()
            for k in repicked:
                broker.overrides[k] = str(free_port())


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
        self.started_once = False

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
        # COMPACTMQ_BROKER_DEBUG_LOGS: comma-separated compactmq loggers every test broker logs at
        # DEBUG (e.g. compactmq.storage.object_deletes, to follow a chaos run's deletes)
        for name in filter(None, os.environ.get("COMPACTMQ_BROKER_DEBUG_LOGS", "").split(",")):
            cmd += ["--debug-log", name.strip()]
        # no background Spark warm-up in test brokers (a JVM each otherwise); a test that wants it
        # sets compactionSparkWarmup=true in its overrides. Ledgers roll by their limits at once
        # (managedLedgerMinLedgerRolloverTimeMinutes=0, as in the test process: tests/conftest.py)
        defaults = {"compactionSparkWarmup": "false", "managedLedgerMinLedgerRolloverTimeMinutes": "0"}
        for k, v in {**defaults, **self.overrides}.items():
            cmd += ["--config-override", f"{k}={v}"]
        return cmd + self.extra_args

    def start(self, timeout: float = 30.0) -> None:
        _start_on_free_ports(self, self._start_once, timeout)
        self.started_once = True

    def _start_once(self, timeout: float) -> None:
        log = open(self.log_path, "ab")
        log_start = log.tell()
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
            if not line:  # end of its stdout: the broker is exiting; its status tells why
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(10)
                break
        tail = self.log_path.read_bytes()[log_start:].decode(errors="replace")
        if self.proc.poll() is not None and says_port_taken(tail):
            self.proc.stdout.close()
            self.proc = None
            raise PortTaken(f"broker did not start: {tail[-2000:]}")
        raise RuntimeError(f"broker did not start: {line!r}; log: {tail[-2000:]}")

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


class StandaloneInHome:
    """``compactmq standalone`` started as an operator starts it: from a home directory holding
    its configuration file, which is the test's subject (``tests/compat``'s upstream CI set-up,
    ``tests/security``'s standalone.conf). A subclass prepares ``home`` and ``log_path`` and
    calls ``launch`` with the command line; ``stop`` is SIGTERM, then SIGKILL after 30 s."""

    home: Path
    log_path: Path
    proc: subprocess.Popen | None = None
    #: the line the broker printed when it was ready
    ready_line = ""

    def launch(self, cmd: list[str], extra_env: dict[str, str], timeout: float) -> None:
        """Run ``cmd`` in ``home`` (stderr to ``log_path``) until it prints ``ready``."""
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **extra_env}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                cmd, **children.keep(cwd=self.home, stdout=subprocess.PIPE, stderr=log, env=env)
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline().decode()
            if "ready" in line:
                self.ready_line = line
                return
            if not line and self.proc.poll() is not None:
                break
        raise RuntimeError(f"standalone did not start; log: {self.log_path.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc is None:
            return
        children.stop(self.proc, 30)
        self.proc.stdout.close()
        self.proc = None


def make_client(url: str, **kw):
    """The official client, its C++ logging at warnings, a 15 s operation timeout by default."""
    import pulsar

    kw.setdefault("operation_timeout_seconds", 15)
    return pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn), **kw)


def drain_acked(consumer, quiet_ms: int, what=lambda msg: msg.data()) -> list:
    """``what`` (the payload) of everything ``consumer`` receives until nothing comes for
    ``quiet_ms``, each message acknowledged as it comes."""
    import pulsar

    got = []
    while True:
        try:
            msg = consumer.receive(quiet_ms)
        except pulsar.Timeout:
            return got
        got.append(what(msg))
        consumer.acknowledge(msg)


class InProcessBroker:
    """The same broker as ``BrokerProcess`` (``BrokerServer`` with the web adapter and the
    post-compaction hooks ``compactmq standalone`` wires in), run on an event loop thread of the
    test process instead of a subprocess, with the same attributes and ``start``/``stop``/
    ``restart``.

    What it is for: a broker that compacts with Spark gets the test worker's SparkSession
    (``get_session`` is a ``getOrCreate``), warm after the first module, instead of starting a
    JVM of its own -- a cold JVM and first job cost some 13 s of CPU per broker subprocess. Use it
    where the subject is what the broker does, not that it is a process: a test that kills the
    broker (SIGKILL), reads its stdout, checks its umask or the console script starts a
    ``BrokerProcess``. ``stop()`` is the ordered shutdown (the SIGTERM path of the subprocess);
    any other signal is refused rather than pretended.
    """

    proc = None  # no subprocess: code that inspects ``proc`` is for BrokerProcess

    def __init__(self, data_dir: Path, overrides: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.web_port = free_port()
        self.overrides = dict(overrides or {})
        self.log_path = data_dir.parent / f"broker-{self.port}.log"  # compactmq's log records, WARNING up
        self._log_handler = None
        self.server = None
        self._loop = None
        self._thread = None
        self.started_once = False

    url = BrokerProcess.url
    web_url = BrokerProcess.web_url

    def config(self):
        from compactmq.config import load_config

        defaults = {"compactionSparkWarmup": "false", "managedLedgerMinLedgerRolloverTimeMinutes": "0"}
        flags = {
            "dataDir": str(self.data_dir),
            "bindAddress": "127.0.0.1",
            "brokerServicePort": str(self.port),
            "webServicePort": str(self.web_port),
        }
        return load_config(None, {**defaults, **self.overrides, **flags})

    def start(self, timeout: float = 30.0) -> None:
        _start_on_free_ports(self, self._start_once, timeout)
        self.started_once = True

    def on_loop(self, coro, timeout: float = 30.0):
        """Run ``coro`` on the broker's event loop and return its result (from the test's thread)."""
        import asyncio

        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def _start_once(self, timeout: float) -> None:
        import asyncio
        import threading

        from .spark_session import discard_if_broken

        discard_if_broken()  # its compactions take the worker's session: not one a test broke

        from compactmq.cli.standalone import build_server  # the entry point's wiring, as it runs

        try:
            import uvloop  # as ``compactmq standalone`` runs when the "fast" extra is installed
        except ImportError:
            uvloop = None
        self._loop = uvloop.new_event_loop() if uvloop is not None else asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"broker-{self.port}", daemon=True
        )
        self._thread.start()
        import logging

        self._log_handler = logging.FileHandler(self.log_path)
        self._log_handler.setLevel(logging.WARNING)
        self._log_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logging.getLogger("compactmq").addHandler(self._log_handler)

        async def build_and_start():
            server = await build_server(self.config())
            await server.start()
            return server

        try:
            server = asyncio.run_coroutine_threadsafe(build_and_start(), self._loop).result(timeout)
        except BaseException as e:
            self._close_loop()
            if isinstance(e, Exception) and says_port_taken(str(e)):
                raise PortTaken(str(e)) from e
            raise
        self.server = server

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int:
        import asyncio

        if sig != signal.SIGTERM:
            raise ValueError(
                "an in-process broker only stops in order (SIGTERM); a kill needs a BrokerProcess"
            )
        if self.server is None:
            return 0
        server, self.server = self.server, None
        try:
            asyncio.run_coroutine_threadsafe(server.shutdown(), self._loop).result(timeout)
        finally:
            self._close_loop()
        return 0

    def _close_loop(self) -> None:
        import asyncio

        loop = self._loop

        async def cancel_the_rest() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            asyncio.run_coroutine_threadsafe(cancel_the_rest(), loop).result(10)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            self._thread.join(10)
            loop.close()
            self._loop = self._thread = None
            import logging

            logging.getLogger("compactmq").removeHandler(self._log_handler)
            self._log_handler.close()

    def restart(self) -> None:
        self.stop()
        self.start()

    def alive(self) -> bool:
        return self.server is not None


@contextlib.contextmanager
def zk_in_process_broker(data_dir: Path, zk_hosts: str, prefix: str, overrides: dict[str, str] | None = None):
    """An ``InProcessBroker`` on ZooKeeper under a fresh chroot (``/<prefix><random>``, so tests
    sharing one server see nothing of each other) with a 4 s session, started and stopped."""
    import uuid

    b = InProcessBroker(
        data_dir,
        {
            "metadataStoreUrl": f"zk:{zk_hosts}/{prefix}{uuid.uuid4().hex[:10]}",
            "metadataStoreSessionTimeoutMillis": "4000",
            **(overrides or {}),
        },
    )
    b.start()
    try:
        yield b
    finally:
        b.stop()
