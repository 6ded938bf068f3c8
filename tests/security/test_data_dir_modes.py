"""Other local users cannot read a broker's data: ``compactmq standalone`` (started here under a
permissive umask) keeps its data directory 0700 and everything it writes in it owner-only,
including what libraries write (SQLite's WAL, the topic's ledgers and indexes)."""

from __future__ import annotations

import os
import stat
import time

import pulsar

from broker.conftest import BrokerProcess, make_client  # tests/ is on sys.path


def test_the_broker_writes_nothing_other_users_can_read(tmp_path):
    old = os.umask(0o022)  # what the broker inherits: it must not rely on it
    try:
        broker = BrokerProcess(tmp_path / "data")
        broker.start()
    finally:
        os.umask(old)
    try:
        client = make_client(broker.url)
        try:
            topic = f"persistent://public/default/modes-{time.monotonic_ns()}"
            consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
            producer = client.create_producer(topic)
            for i in range(10):
                producer.send(f"secret-{i}".encode())
            consumer.acknowledge(consumer.receive(10_000))
        finally:
            client.close()
    finally:
        broker.stop()
    data = tmp_path / "data"
    assert stat.S_IMODE(os.stat(data).st_mode) == 0o700
    entries = [os.path.join(d, n) for d, dirs, files in os.walk(data) for n in dirs + files]
    assert any(p.endswith(".log") for p in entries) and any(p.endswith("metadata.db") for p in entries)
    loose = {p: oct(stat.S_IMODE(os.stat(p).st_mode)) for p in entries if os.stat(p).st_mode & 0o077}
    assert not loose, loose
