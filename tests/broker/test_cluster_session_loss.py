"""A broker whose store session ended lets go of its clients at once.

Three brokers on a real ZooKeeper (session timeout 2 s), ledgers in one shared ``file://``
object store, the official client given all three. A producer and a consumer work on a topic
of a one-bundle namespace owned by broker A; A is frozen (``SIGSTOP``) past its session, the
bundle goes to another broker meanwhile (a lookup there takes it), and A is resumed. A must not
keep the clients it can no longer serve: they are sent ``CloseProducer``/``CloseConsumer`` (or
their requests are refused with a retriable error), look the topic up again, and reach the new
owner. What is measured is the time from the resume to the first acknowledged send and the
first message received -- seconds, not the client's operation timeout or a backoff grown to
tens of seconds.

A send made while A is frozen sits in A's socket; it too must be acknowledged (by the new
owner, after the client resent it) within the same bound.

The other way to lose a session is to be cut off from ZooKeeper while the clients still reach
the broker: A's store connection goes through a proxy in this process, which the test cuts.
kazoo learns that its session expired only when it reaches ZooKeeper again, so A declares the
session lost itself once it was disconnected for the session timeout (as Pulsar's session
watcher does): it lets go of its bundles and tells their clients, who look up again and reach
the broker that took the bundle. Without that, a consumer on A (nothing to write, so no failed
write to tell it) would wait on A for as long as the cut lasts.
"""

from __future__ import annotations

import signal
import threading
import time
import uuid
from urllib.parse import urlsplit

import pytest

pulsar = pytest.importorskip("pulsar")

from harness.sockets import CuttableProxy  # noqa: E402
from harness.wait import wait_until  # noqa: E402
from storage.metadata_store.zk_server import zookeeper  # noqa: E402,F401  (tests/ is on sys.path)

from .conftest import BrokerProcess, make_client  # noqa: E402
from .rest import ok, rest  # noqa: E402
from .test_cluster import broker_id, service_url, start_cluster  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SESSION_TIMEOUT_MS = 2000
#: from the resume to a send acknowledged by the new owner: the resumed broker learns that its
#: session is gone (kazoo reconnects, ZooKeeper says expired), closes the topic's clients, the
#: client looks up again (100 ms backoff) and reconnects; well under the client's 30 s timeouts
MOVE_BOUND_S = 8.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, zookeeper):  # noqa: F811
    objects = tmp_path_factory.mktemp("session-loss-objects")
    brokers = start_cluster(
        tmp_path_factory,
        zookeeper,
        objectLedgerStorageUrl=f"file://{objects}",
        metadataStoreSessionTimeoutMillis=str(SESSION_TIMEOUT_MS),
    )
    yield brokers
    for b in brokers:
        if b.proc is not None and b.proc.poll() is None:
            b.proc.send_signal(signal.SIGCONT)
        b.stop(signal.SIGKILL)


def _owner(brokers: list[BrokerProcess], topic: str, via: BrokerProcess) -> BrokerProcess:
    local = topic.split("://", 1)[1]
    port = urlsplit(ok(rest(via, "GET", f"/lookup/v2/topic/persistent/{local}"))["httpUrl"]).port
    return next(b for b in brokers if b.web_port == port)


def _registered(via: BrokerProcess) -> list:
    return ok(rest(via, "GET", "/admin/v2/brokers/standalone"))


def test_clients_of_a_broker_whose_session_ended_move_to_the_new_owner_at_once(cluster):
    ns = f"public/sl{uuid.uuid4().hex[:8]}"
    ok(rest(cluster[0], "PUT", f"/admin/v2/namespaces/{ns}", {"bundles": {"numBundles": 1}}))
    topic = f"persistent://{ns}/t"
    client = make_client(service_url(cluster), connection_timeout_ms=2000, operation_timeout_seconds=30)
    owner = None
    try:
        consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer(topic, batching_enabled=False, send_timeout_millis=30000)
        producer.send(b"before")
        first = consumer.receive(timeout_millis=15000)
        assert first.data() == b"before"
        consumer.acknowledge(first)
        owner = _owner(cluster, topic, cluster[0])
        others = [b for b in cluster if b is not owner]

        owner.proc.send_signal(signal.SIGSTOP)
        in_flight = threading.Event()
        result: dict = {}

        def sent(res, _msg_id) -> None:
            result["res"], result["at"] = res, time.monotonic()
            in_flight.set()

        producer.send_async(b"during", sent)  # waits in the frozen broker's socket
        wait_until(
            lambda: broker_id(owner) not in _registered(others[0]),
            timeout=20,
            what="the frozen broker's session to expire",
        )
        wait_until(  # another broker takes the bundle (a lookup there assigns it)
            lambda: _owner(cluster, topic, others[0]) is not owner,
            timeout=20,
            what="the bundle to leave the frozen broker",
        )
        new_owner = _owner(cluster, topic, others[0])
        resumed = time.monotonic()
        owner.proc.send_signal(signal.SIGCONT)

        assert in_flight.wait(MOVE_BOUND_S + 30), "the send made during the freeze never completed"
        assert result["res"] == pulsar.Result.Ok, result
        in_flight_s = result["at"] - resumed
        producer.send(b"after")
        send_s = time.monotonic() - resumed
        got = []
        while len(got) < 2:
            msg = consumer.receive(timeout_millis=int((MOVE_BOUND_S + 30) * 1000))
            consumer.acknowledge(msg)
            if msg.data() != b"before":  # its acknowledgement may not have been persisted on A
                got.append(msg.data())
        receive_s = time.monotonic() - resumed
        print(
            f"after the resume: in-flight send acknowledged in {in_flight_s:.2f} s, next send in "
            f"{send_s:.2f} s, both received in {receive_s:.2f} s"
        )
        assert got == [b"during", b"after"]
        assert _owner(cluster, topic, owner) is new_owner  # the resumed broker serves it no more
        assert in_flight_s < MOVE_BOUND_S, f"the in-flight send took {in_flight_s:.1f} s after the resume"
        assert send_s < MOVE_BOUND_S, f"a send took {send_s:.1f} s after the resume"
        assert receive_s < MOVE_BOUND_S, f"the consumer took {receive_s:.1f} s to move"
        producer.close()
        consumer.close()
    finally:
        if owner is not None and owner.alive():
            owner.proc.send_signal(signal.SIGCONT)
        client.close()


def test_a_broker_cut_off_from_zookeeper_past_its_session_lets_its_clients_go(tmp_path_factory, zookeeper):  # noqa: F811
    host, port = zookeeper.hosts.split(",")[0].rsplit(":", 1)
    proxy = CuttableProxy((host, int(port)))
    chroot = f"/c{uuid.uuid4().hex[:10]}"
    objects = tmp_path_factory.mktemp("cut-objects")
    brokers = []
    for i in range(3):
        hosts = f"127.0.0.1:{proxy.port}" if i == 0 else zookeeper.hosts
        b = BrokerProcess(tmp_path_factory.mktemp(f"cut-b{i}") / "data")
        b.overrides = {
            "metadataStoreUrl": f"zk:{hosts}{chroot}",
            "metadataStoreSessionTimeoutMillis": str(SESSION_TIMEOUT_MS),
            "loadBalancerReportUpdateMinIntervalMillis": "300",
            "objectLedgerStorageUrl": f"file://{objects}",
        }
        brokers.append(b)
    client = None
    try:
        for b in brokers:
            b.start()
        cut, others = brokers[0], brokers[1:]
        ns = f"public/cut{uuid.uuid4().hex[:8]}"
        ok(rest(others[0], "PUT", f"/admin/v2/namespaces/{ns}", {"bundles": {"numBundles": 1}}))
        topic = f"persistent://{ns}/t"
        ok(rest(cut, "GET", f"/lookup/v2/topic/persistent/{ns}/t?authoritative=true"))  # A takes it
        assert _owner(brokers, topic, others[0]) is cut
        client = make_client(service_url(brokers), connection_timeout_ms=2000, operation_timeout_seconds=30)
        consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer(topic, batching_enabled=False, send_timeout_millis=30000)
        producer.send(b"before")
        first = consumer.receive(timeout_millis=15000)
        assert first.data() == b"before"
        consumer.acknowledge(first)

        proxy.cut()
        t0 = time.monotonic()
        wait_until(
            lambda: broker_id(cut) not in _registered(others[0]),
            timeout=20,
            what="the cut-off broker's session to expire",
        )
        expired_s = time.monotonic() - t0
        other = make_client(service_url(others), operation_timeout_seconds=30)
        try:  # another broker takes the bundle, and another producer writes there
            elsewhere = other.create_producer(topic, batching_enabled=False)
            elsewhere.send(b"elsewhere")
            elsewhere.close()
        finally:
            other.close()
        new_owner = _owner(brokers, topic, others[0])
        assert new_owner is not cut
        msg = consumer.receive(timeout_millis=int((MOVE_BOUND_S + 30) * 1000))
        consumer.acknowledge(msg)
        if msg.data() == b"before":  # its acknowledgement may not have been persisted on A
            msg = consumer.receive(timeout_millis=int((MOVE_BOUND_S + 30) * 1000))
            consumer.acknowledge(msg)
        receive_s = time.monotonic() - t0
        assert msg.data() == b"elsewhere"
        producer.send(b"after")
        send_s = time.monotonic() - t0
        print(
            f"after the cut: session expired in {expired_s:.2f} s, the consumer got the new "
            f"owner's message at {receive_s:.2f} s, a send acknowledged at {send_s:.2f} s"
        )
        assert consumer.receive(timeout_millis=15000).data() == b"after"
        assert receive_s - expired_s < MOVE_BOUND_S, f"the consumer took {receive_s:.1f} s to move"
        assert send_s - expired_s < MOVE_BOUND_S, f"the producer took {send_s:.1f} s to move"
        proxy.restore()
        # reconnected: the cut-off broker registers again and sends clients to the new owner
        wait_until(lambda: broker_id(cut) in _registered(others[0]), timeout=30, what="re-registration")
        assert _owner(brokers, topic, cut) is new_owner
    finally:
        if client is not None:
            client.close()
        for b in brokers:
            b.stop(signal.SIGKILL)
        proxy.close()
