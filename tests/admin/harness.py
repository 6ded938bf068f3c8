"""What the admin and CLI end-to-end tests share: a broker subprocess with a short compaction
monitor interval and the test Spark profile, a tiny HTTP client, and helpers to publish keyed
messages with the official client and to wait for a compaction status.

A module imports the fixtures it shares from here: ``http`` (an ``Http`` of the module's
``broker``) and ``topic`` (a fresh topic named after the test); ``open_gate`` and
``start_gated_broker`` build a broker whose compaction runs a test can hold part-way (the Arrow
test factory's gate, ``broker/arrow_compaction.py``)."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

from compactmq.compaction.jobs.session import TEST_CONF

from harness.broker import (
    ROOT as ROOT_DIR,
    BrokerProcess,
    InProcessBroker,
    make_client,
)  # tests/ is on sys.path
from harness.http import Http
from harness.wait import wait_until

__all__ = ["ROOT_DIR", "BrokerProcess", "Http", "make_client", "wait_until"]  # re-exported for the tests

MONITOR_INTERVAL_SECONDS = 2


def start_broker(
    data_dir: Path,
    *,
    in_process: bool = False,
    process: type[BrokerProcess] = BrokerProcess,
    **overrides: str,
) -> BrokerProcess | InProcessBroker:
    """A broker with the admin tests' settings; ``in_process`` runs it in this process
    (``InProcessBroker``: its compaction runs on the worker's warm SparkSession), otherwise it is a
    subprocess (a test that kills it, or whose subject is the process), of class ``process``."""
    settings = {
        "brokerServiceCompactionMonitorIntervalInSeconds": str(MONITOR_INTERVAL_SECONDS),
        **TEST_CONF,  # the compaction test profile, as config overrides
        **overrides,
    }
    b = InProcessBroker(data_dir, settings) if in_process else process(data_dir, settings)
    b.start(timeout=60)
    return b


def open_gate(tmp_path_factory) -> Path:
    """The file whose absence holds the Arrow test factory's compaction runs (open: it exists)."""
    path = tmp_path_factory.mktemp("gate") / "open"
    path.touch()
    return path


def start_gated_broker(data_dir: Path, gate: Path, **overrides: str) -> BrokerProcess:
    """A broker subprocess compacting with the test suite's Arrow factory (no JVM), its runs held
    part-way while ``gate`` is missing. The gate is set in the environment of this start only: a
    ``restart()`` later runs ungated."""
    from broker.arrow_compaction import GATE_ENV
    from broker.factories import ARROW_FACTORY

    with pytest.MonkeyPatch.context() as mp:  # the broker subprocess inherits the environment
        mp.setenv(GATE_ENV, str(gate))
        return start_broker(data_dir, compactionServiceFactoryClassName=ARROW_FACTORY, **overrides)


@pytest.fixture(scope="module")
def http(broker) -> Http:
    """The admin REST API of the module's broker."""
    return Http(web_url(broker))


@pytest.fixture
def topic(request) -> str:
    """A fresh topic named after the test (characters a topic name cannot hold made ``-``)."""
    name = re.sub(r"[^\w-]", "-", request.node.name)
    return f"persistent://public/default/{name}-{time.monotonic_ns() % 10**9}"


def monitor_checks(http: Http) -> int:
    """How many periodic compaction checks the broker's monitor has done (from /metrics)."""
    status, text = http.call("GET", "/metrics")
    assert status == 200, status
    for line in text.splitlines():
        if line.startswith("compactmq_compaction_monitor_checks_total{"):
            return int(float(line.rsplit(" ", 1)[1]))
    raise AssertionError("no compactmq_compaction_monitor_checks_total in /metrics")


def wait_monitor_checks(http: Http, n: int, timeout: float = 60.0) -> None:
    """Wait until the monitor has done ``n`` more complete checks (each then triggered what it
    found due), so a test can assert that a check did NOT trigger a run."""
    target = monitor_checks(http) + n
    wait_until(lambda: monitor_checks(http) >= target, timeout, f"the compaction monitor to check {n} times")


def web_url(broker: BrokerProcess | InProcessBroker) -> str:
    return f"http://127.0.0.1:{broker.web_port}"


def topic_path(topic: str) -> str:
    domain, rest = topic.split("://", 1)
    return f"/admin/v2/{domain}/{rest}"


def publish(
    broker: BrokerProcess, topic: str, n: int, keys: int, prefix: str = "v", batching: bool = True
) -> None:
    c = make_client(broker.url)
    try:
        p = c.create_producer(
            topic, batching_enabled=batching, block_if_queue_full=True, batching_max_publish_delay_ms=5
        )
        for i in range(n):
            p.send_async(f"{prefix}{i}".encode(), None, partition_key=f"k{i % keys}")
        p.flush()
        p.close()
    finally:
        c.close()


def read_compacted(broker: BrokerProcess | InProcessBroker, topic: str) -> dict[str, list[bytes]]:
    """What a read-compacted reader from the earliest message sees: the values of each key, in
    order (one per key once compacted)."""
    import pulsar

    c = make_client(broker.url)
    seen: dict[str, list[bytes]] = {}
    try:
        reader = c.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
        while reader.has_message_available():
            msg = reader.read_next(timeout_millis=10_000)
            seen.setdefault(msg.partition_key(), []).append(msg.data())
        reader.close()
    finally:
        c.close()
    return seen


def wait_status(http: Http, topic: str, want: str, timeout: float = 120.0, running_ok: bool = True) -> dict:
    """Wait until the topic's compaction status is ``want`` and answer the status body; with
    ``running_ok`` False, any status other than RUNNING and ``want`` fails at once."""

    def reached():
        body = http.ok("GET", topic_path(topic) + "/compaction")
        if not running_ok:
            assert body["status"] in ("RUNNING", want), f"{topic}: status {body} never became {want}"
        return body if body["status"] == want else None

    return wait_until(reached, timeout, f"{topic}: compaction status {want}", interval=0.1)


def poke_policy(data_dir: Path, scope: str, name: str, key: str, value: Any) -> None:
    """Write a policy straight into the metadata store (beside the running broker: the embedded
    store is made for several processes), to store a value the REST API would refuse -- the way
    to make a compaction run fail."""
    from compactmq.storage.metadata_store import create_metadata_store
    from compactmq.storage.resources import PulsarResources

    store = create_metadata_store("", data_dir=data_dir)
    try:
        PulsarResources(store).policies.set_policies(scope, name, {key: value})
    finally:
        store.close()
