"""The harness itself: the in-process CLI runner answers what a child process would, and leaves
nothing behind; ``wait_until`` returns the first truthy value and names what it waited for."""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys

import pytest

import compactmq.cli.main as cli_main
from harness.broker import BrokerProcess, InProcessBroker, make_client
from harness.cli import run_cli
from harness.wait import wait_until


def test_exit_status_and_streams_are_a_process_s():
    usage = run_cli("topics", "nosuchcommand")
    assert usage.returncode == 2 and usage.stdout == "" and "usage: compactmq" in usage.stderr
    assert usage.args == ["compactmq", "topics", "nosuchcommand"]
    helped = run_cli("--help")
    assert helped.returncode == 0 and "compact-topic" in helped.stdout and helped.stderr == ""
    failed = run_cli("--admin-url", "http://127.0.0.1:9", "tenants", "list")
    assert failed.returncode == 1 and failed.stderr.startswith("compactmq: error: cannot reach")


def test_raw_bytes_on_stdout_and_stdin():
    raw = run_cli("tokens", "create-secret-key", text=False)
    assert raw.returncode == 0 and isinstance(raw.stdout, bytes) and len(raw.stdout) == 32
    token = run_cli("tokens", "create", "-s", "alice", "-sk", f"data:;base64,{'a' * 44}").stdout.strip()
    shown = run_cli("tokens", "show", "--stdin", input=token + "\n")
    assert shown.returncode == 0 and shown.stdout.endswith('---\n{"sub":"alice"}\n')


def test_an_uncaught_exception_is_a_traceback_and_status_1(monkeypatch):
    def boom(argv):
        raise RuntimeError("a bug")

    monkeypatch.setattr(cli_main, "main", boom)
    proc = run_cli("tenants", "list")
    assert proc.returncode == 1 and "Traceback" in proc.stderr and "RuntimeError: a bug" in proc.stderr


def test_nothing_outlives_the_call(monkeypatch):
    def meddle(argv):
        os.environ["HARNESS_PROBE"] = "changed"
        logging.getLogger().addHandler(logging.NullHandler())
        logging.getLogger().setLevel(logging.DEBUG)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("out")
        sys.exit("a message")

    streams = (sys.stdin, sys.stdout, sys.stderr)
    root = logging.getLogger()
    handlers, level, sigterm = list(root.handlers), root.level, signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(cli_main, "main", meddle)
    proc = run_cli("x", env={"HARNESS_PROBE": "set"})
    assert (proc.returncode, proc.stdout, proc.stderr) == (1, "out\n", "a message\n")
    assert "HARNESS_PROBE" not in os.environ
    assert (sys.stdin, sys.stdout, sys.stderr) == streams
    assert (root.handlers, root.level, signal.getsignal(signal.SIGTERM)) == (handlers, level, sigterm)


def test_standalone_is_refused_but_not_a_topic_named_so():
    with pytest.raises(ValueError, match="harness.broker"):
        run_cli("--admin-url", "http://127.0.0.1:9", "standalone", "--data-dir", "/nonexistent")
    proc = run_cli("--admin-url", "http://127.0.0.1:9", "topics", "stats", "standalone")
    assert proc.returncode == 1 and "cannot reach" in proc.stderr


def test_wait_until_returns_the_first_truthy_value_or_names_what_it_waited_for():
    values = iter([0, None, [], "done", "later"])
    assert wait_until(lambda: next(values), timeout=5, interval=0) == "done"
    with pytest.raises(AssertionError, match=r"waiting for the moon \(last: False\)"):
        wait_until(lambda: False, timeout=0.05, what="the moon", interval=0.01)


@pytest.mark.parametrize(
    "kind, which",
    [(InProcessBroker, "port"), (InProcessBroker, "web_port"), (BrokerProcess, "web_port")],
    ids=["in-process-port", "in-process-web_port", "process-web_port"],
)
def test_a_first_start_moves_off_a_port_taken_meanwhile_but_a_restart_keeps_its_ports(tmp_path, kind, which):
    with socket.socket() as taker:  # what another process of the run may do between pick and bind
        taker.bind(("127.0.0.1", 0))
        taker.listen()
        broker = kind(tmp_path / "data")
        setattr(broker, which, taker.getsockname()[1])
        broker.start()
        try:
            assert getattr(broker, which) != taker.getsockname()[1] and broker.alive()
            client = make_client(broker.url)
            try:
                client.create_producer("persistent://public/default/moved").send(b"x")
            finally:
                client.close()
            if kind is InProcessBroker:  # (a restart is the same code for a process; it costs one)
                ports = (broker.port, broker.web_port)
                broker.restart()
                assert (broker.port, broker.web_port) == ports and broker.alive()
        finally:
            broker.stop()


def test_a_port_the_configuration_names_is_not_moved(tmp_path):
    with socket.socket() as taker:
        taker.bind(("127.0.0.1", 0))
        taker.listen()
        broker = InProcessBroker(tmp_path / "data")
        broker.port = taker.getsockname()[1]
        broker.overrides["advertisedListeners"] = f"internal:pulsar://127.0.0.1:{broker.port}"
        broker.overrides["internalListenerName"] = "internal"
        with pytest.raises(RuntimeError, match="(?i)address already in use"):
            broker.start()


def test_a_tls_port_given_alone_is_picked_again_and_read_back(tmp_path):
    from harness.broker import free_port
    from security.helpers import make_pki

    pki = make_pki(tmp_path / "pki")
    with socket.socket() as taker:
        taker.bind(("127.0.0.1", 0))
        taker.listen()
        taken = taker.getsockname()[1]
        broker = InProcessBroker(tmp_path / "data")
        broker.overrides.update(
            {
                "brokerServicePortTls": str(taken),
                "webServicePortTls": str(free_port()),
                "tlsCertificateFilePath": str(pki.server.cert),
                "tlsKeyFilePath": str(pki.server.key),
            }
        )
        broker.start()
        try:
            port = int(broker.overrides["brokerServicePortTls"])
            assert port != taken and broker.alive()
            with socket.create_connection(("127.0.0.1", port), timeout=5):
                pass  # the broker listens where its settings now say
        finally:
            broker.stop()
