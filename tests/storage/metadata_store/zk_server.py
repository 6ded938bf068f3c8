"""A real ZooKeeper server for the tests: Debian's ``zookeeper`` package, started as its own process.

``scripts/setup.sh`` installs the package (``apt-get install zookeeper``: ZooKeeper 3.8 with its
jars in /usr/share/java, no service started). ``ZooKeeperServer.start`` writes a ``zoo.cfg`` for a
standalone server on a free port of 127.0.0.1 with a temporary data directory, runs
``java -cp zookeeper.jar org.apache.zookeeper.server.ZooKeeperServerMain zoo.cfg`` and waits until
the server answers ``ruok``; ``stop`` kills it. ``ZOOKEEPER_JAR`` names another jar (a ZooKeeper
distribution's ``lib/*`` classpath works too).

ZooKeeper missing fails the tests that use it (CI installs it through scripts/setup.sh); on a
machine without it, ``COMPACTMQ_SKIP_ZOOKEEPER=1`` skips them instead, never in CI.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

try:  # tests/ is on sys.path in a test run
    import children
    from ports import PortTaken, listen_ports, start_retrying
except ImportError:  # imported as tests.storage.metadata_store.zk_server by a bench script
    from tests import children
    from tests.ports import PortTaken, listen_ports, start_retrying

DEBIAN_JAR = "/usr/share/java/zookeeper.jar"


def find_classpath() -> str | None:
    """The classpath of an installed ZooKeeper server, or None."""
    jar = os.environ.get("ZOOKEEPER_JAR") or DEBIAN_JAR
    if shutil.which("java") is None:
        return None
    return jar if ("*" in jar or Path(jar).is_file()) else None


def free_port() -> int:
    """A port for a ZooKeeper server: the JVM binds it a second or more after it is picked, so
    it comes from below the ephemeral range (``tests/ports.py``)."""
    return listen_ports(1)[0]


def four_letter(port: int, word: bytes = b"ruok") -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        s.sendall(word)
        out = b""
        while chunk := s.recv(1024):
            out += chunk
        return out


def _bound_elsewhere(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
        return False


class ZooKeeperServer:
    def __init__(self, workdir: Path, classpath: str):
        self.workdir = workdir
        self.classpath = classpath
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 60) -> ZooKeeperServer:
        """Start the server and wait until it answers ``ruok``; a server that exited because its
        port was taken meanwhile is started again on a new one (``ports.start_retrying``)."""
        return start_retrying(lambda: self._start_once(timeout), repick=self._repick)

    def _repick(self) -> None:
        self.port = free_port()

    def _start_once(self, timeout: float) -> ZooKeeperServer:
        data = self.workdir / "data"
        data.mkdir(parents=True, exist_ok=True)
        cfg = self.workdir / "zoo.cfg"
        # tickTime 500: sessions may be as short as 1 s (2 ticks), so expiry tests stay fast
        cfg.write_text(
            f"tickTime=500\ndataDir={data}\nclientPort={self.port}\nclientPortAddress=127.0.0.1\n"
            "maxSessionTimeout=60000\nadmin.enableServer=false\n4lw.commands.whitelist=ruok,srvr\n"
        )
        log = open(self.workdir / "zookeeper.log", "wb")
        self.proc = subprocess.Popen(
            ["java", "-Xmx256m", "-XX:+UseSerialGC", "-cp", self.classpath,
             "org.apache.zookeeper.server.ZooKeeperServerMain", str(cfg)],
            # dies with the thread that started it: a worker that crashed (the official client's
            # C++ library in ``Client.close``) never tears its session fixtures down, and its
            # ZooKeeper used to live on as an orphan
            **children.keep(stdout=log, stderr=subprocess.STDOUT),
        )  # fmt: skip
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = (self.workdir / "zookeeper.log").read_text(errors="replace")[-2000:]
                # its log says nothing of the port (no logging backend on the classpath): that
                # the port is bound by another now tells why it exited
                error = PortTaken if _bound_elsewhere(self.port) else RuntimeError
                raise error(f"ZooKeeper exited: {tail}")
            try:
                if four_letter(self.port) == b"imok":
                    return self
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"ZooKeeper did not answer ruok on {self.hosts} within {timeout} s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory):
    classpath = find_classpath()
    if classpath is None:
        if os.environ.get("COMPACTMQ_SKIP_ZOOKEEPER") == "1" and not os.environ.get("CI"):
            pytest.skip("ZooKeeper not installed and COMPACTMQ_SKIP_ZOOKEEPER=1")
        pytest.fail(
            "ZooKeeper is not installed: run scripts/setup.sh (apt-get install zookeeper), or set "
            "ZOOKEEPER_JAR; COMPACTMQ_SKIP_ZOOKEEPER=1 skips these tests outside CI"
        )
    server = ZooKeeperServer(tmp_path_factory.mktemp("zookeeper"), classpath).start()
    yield server
    server.stop()
