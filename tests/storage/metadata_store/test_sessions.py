"""Sessions: ephemeral keys of a killed process expire; a store that lost its session says so and
goes on with a new one; watches see other processes' changes. Real processes, real servers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from compactmq.storage.metadata_store import NEW, NotificationType, SessionEvent, create_metadata_store

from .test_contract import Recorder, wait_until

#: a process that opens the store, writes a persistent and an ephemeral key, and waits to be killed
CHILD = """
import sys, time
from compactmq.storage.metadata_store import create_metadata_store, NEW
store = create_metadata_store(sys.argv[1], data_dir=sys.argv[2], session_timeout_ms=1000)
store.put("/brokers/child", b"persistent")
store.put("/owners/topic", b"child", NEW, ephemeral=True)
print("ready", flush=True)
time.sleep(600)
"""


def start_child(url, data_dir):
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, url, str(data_dir)],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
    )
    assert proc.stdout.readline().strip() == "ready"
    return proc


class Events:
    def __init__(self):
        self.seen: list[SessionEvent] = []
        self.cond = threading.Condition()

    def __call__(self, event):
        with self.cond:
            self.seen.append(event)
            self.cond.notify_all()

    def wait_for(self, event, timeout=20):
        with self.cond:
            assert self.cond.wait_for(lambda: event in self.seen, timeout), f"no {event}; saw {self.seen}"


@pytest.mark.parametrize("kind", ["sqlite", "zk"])
def test_ephemeral_keys_of_a_killed_process_expire(kind, tmp_path, request):
    if kind == "zk":
        url = f"zk:{request.getfixturevalue('zookeeper').hosts}/killed"
    else:
        url = "sqlite:meta.db"
    survivor = create_metadata_store(url, data_dir=tmp_path, session_timeout_ms=1000)
    try:
        recorder = Recorder()
        survivor.watch("/brokers/child", recorder)
        survivor.watch("/owners/topic", recorder)
        child = start_child(url, tmp_path)
        recorder.wait_for(NotificationType.CREATED, "/brokers/child")  # another process's change
        recorder.wait_for(NotificationType.CREATED, "/owners/topic")
        assert survivor.get("/owners/topic").stat.ephemeral
        child.send_signal(signal.SIGKILL)
        child.wait()
        killed_at = time.monotonic()
        recorder.wait_for(NotificationType.DELETED, "/owners/topic", timeout=20)
        assert time.monotonic() - killed_at < 15  # within a few session timeouts
        assert survivor.get("/brokers/child").value == b"persistent"
        survivor.put("/owners/topic", b"survivor", NEW, ephemeral=True)  # the takeover
    finally:
        survivor.close()


#: a process that holds an ephemeral key, reports its session events, and takes the key back
#: once it has a new session
HUNG_CHILD = """
import sys, time
from compactmq.storage.metadata_store import create_metadata_store, NEW, SessionEvent
store = create_metadata_store(sys.argv[1], data_dir=sys.argv[2], session_timeout_ms=1000)
def on_event(event):
    print(event.value, flush=True)
    if event is SessionEvent.SESSION_REESTABLISHED:
        store.put("/owners/t", b"child again", NEW, ephemeral=True)
        print("retaken", flush=True)
store.register_session_listener(on_event)
store.put("/owners/t", b"child", NEW, ephemeral=True)
print("ready", flush=True)
time.sleep(600)
"""


def test_sqlite_store_that_hung_past_its_timeout_gets_a_new_session(tmp_path):
    survivor = create_metadata_store("sqlite:meta.db", data_dir=tmp_path, session_timeout_ms=1000)
    child = subprocess.Popen(
        [sys.executable, "-c", HUNG_CHILD, "sqlite:meta.db", str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        assert survivor.get("/owners/t").stat.ephemeral
        child.send_signal(signal.SIGSTOP)  # hung: no heartbeat
        wait_until(lambda: not survivor.exists("/owners/t"))  # expired by the survivor
        child.send_signal(signal.SIGCONT)
        lines = [child.stdout.readline().strip() for _ in range(3)]
        assert lines == ["SessionLost", "SessionReestablished", "retaken"]
        got = survivor.get("/owners/t")
        assert got.value == b"child again" and got.stat.ephemeral and not got.stat.created_by_self
    finally:
        child.kill()
        child.wait()
        survivor.close()


def test_zk_session_expiry_is_reported_and_the_store_goes_on(zookeeper, tmp_path):
    from kazoo.client import KazooClient

    url = f"zk:{zookeeper.hosts}/expiry"
    a = create_metadata_store(url, data_dir=tmp_path, session_timeout_ms=2000)
    b = create_metadata_store(url, data_dir=tmp_path, session_timeout_ms=2000)
    try:
        events, recorder = Events(), Recorder()
        a.register_session_listener(events)
        a.watch("/watched", recorder)
        a.put("/owners/t", b"a", NEW, ephemeral=True)
        # ZooKeeper's way to expire a session: another client joins it, then closes it
        session_id, password = a._zk.client_id
        thief = KazooClient(hosts=zookeeper.hosts, client_id=(session_id, password))
        thief.start(timeout=10)
        thief.stop()
        thief.close()
        events.wait_for(SessionEvent.SESSION_LOST)
        wait_until(lambda: not b.exists("/owners/t"))
        events.wait_for(SessionEvent.SESSION_REESTABLISHED)
        assert a.session_id != session_id
        b.put("/watched", b"after")  # watches were armed again on the new session
        recorder.wait_for(NotificationType.CREATED, "/watched")
        assert a.put("/owners/t", b"a", NEW, ephemeral=True).created_by_self
    finally:
        a.close()
        b.close()


def test_zk_chroots_are_separate_and_created(zookeeper, tmp_path):
    with (
        create_metadata_store(f"zk:{zookeeper.hosts}/c1/deep", data_dir=tmp_path) as one,
        create_metadata_store(f"zk:{zookeeper.hosts}/c2", data_dir=tmp_path) as two,
        create_metadata_store(f"zk:{zookeeper.hosts}", data_dir=tmp_path) as root,
    ):
        one.put("/k", b"1")
        assert not two.exists("/k") and two.get_children("/") == []
        assert root.get("/c1/deep/k").value == b"1"
        assert "zookeeper" not in root.get_children("/")  # the server's own subtree is hidden


def test_zk_store_cut_off_past_its_session_declares_it_lost_and_comes_back(zookeeper, tmp_path):
    """kazoo hears of an expired session only from the server, once it reaches one again; a
    store cut off from ZooKeeper (a network partition) declares the session lost itself after
    the session timeout, as Pulsar's session watcher does, so its owner stops serving what the
    server already handed to others. Once the cut ends: a new session, reported."""
    from harness.sockets import CuttableProxy

    host, port = zookeeper.hosts.split(",")[0].rsplit(":", 1)
    proxy = CuttableProxy((host, int(port)))
    store = create_metadata_store(
        f"zk:127.0.0.1:{proxy.port}/cut", data_dir=tmp_path, session_timeout_ms=2000
    )
    try:
        events = Events()
        store.register_session_listener(events)
        assert store.connected
        proxy.cut()
        cut = time.monotonic()
        events.wait_for(SessionEvent.CONNECTION_LOST, timeout=10)
        assert not store.connected
        events.wait_for(SessionEvent.SESSION_LOST, timeout=10)
        lost_after = time.monotonic() - cut
        assert 1.5 < lost_after < 6, f"declared lost {lost_after:.1f} s after the cut"
        proxy.restore()
        events.wait_for(SessionEvent.SESSION_REESTABLISHED, timeout=20)
        assert store.connected
        assert events.seen.count(SessionEvent.SESSION_LOST) == 1  # kazoo's own LOST: not again
        store.put("/after", b"x")
    finally:
        store.close()
        proxy.close()
