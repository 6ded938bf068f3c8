"""A broker never keeps serving a bundle whose ownership (its fence) has ended.

The chaos test's stall: a broker kept a bundle in ``ClusterService.owned`` under a fence that
could no longer hold, so every commit of its topics failed with "ownership epoch N is over" and
a fresh reopen failed too. Each test here drives one way into that state deterministically, on a
real ZooKeeper and one broker in the test process (its cluster service is reached directly so
that a race can be placed exactly), and checks that the broker comes out of it on its own: a
lookup takes the bundle again under a NEW epoch, its fence holds in the store, and the official
client publishes to the bundle's topics within a bounded time.

* a lookup that arrives while the bundle is being unloaded (the lock key still this session's)
* a lookup whose acquisition completes after the session it was won under expired
* the owner key removed behind the broker's back (no session event tells it)
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter

import pytest

pulsar = pytest.importorskip("pulsar")

from compactmq.errors import CompactMQError  # noqa: E402
from compactmq.naming import TopicName  # noqa: E402
from compactmq.storage.metadata_store import SessionEvent  # noqa: E402
from harness.broker import InProcessBroker, make_client, zk_in_process_broker  # noqa: E402
from harness.wait import wait_until  # noqa: E402
from storage.metadata_store.zk_server import zookeeper  # noqa: E402,F401  (tests/ is on sys.path)

pytestmark = pytest.mark.integration


@pytest.fixture
def broker(tmp_path, zookeeper):  # noqa: F811
    with zk_in_process_broker(
        tmp_path / "data", zookeeper.hosts, "r", {"loadBalancerReportUpdateMinIntervalMillis": "300"}
    ) as b:
        yield b


def lookup(b: InProcessBroker, topic: str):
    return b.on_loop(b.server.service.cluster.decide(TopicName.parse(topic), False))


def serving_again(b: InProcessBroker, topic: str, old_epoch: int) -> bool:
    """A lookup answers 'here' and the topic's fence is a newer epoch that holds in the store."""
    cluster = b.server.service.cluster
    try:
        if not lookup(b, topic).own:
            return False
    except CompactMQError:  # ServiceNotReady: the client looks up again
        return False
    fence = cluster.fence_for(topic)
    return fence.epoch > old_epoch and fence.holds(b.server.service.storage.metadata_store)


def publish(b: InProcessBroker, topic: str) -> None:
    client = make_client(b.url, operation_timeout_seconds=30)
    try:
        producer = client.create_producer(topic, send_timeout_millis=20_000)
        producer.send(b"after")
        producer.close()
    finally:
        client.close()


def take(b: InProcessBroker, topic: str) -> tuple:
    """Own the topic's bundle (a lookup) and load the topic: (bundle, epoch)."""
    cluster = b.server.service.cluster
    assert lookup(b, topic).own
    b.on_loop(b.server.service.topics.get_topic(topic))
    bundle = b.on_loop(cluster.bundle_of_topic(TopicName.parse(topic)))
    return bundle, cluster.fences[bundle].epoch


def test_a_lookup_during_the_unload_does_not_keep_the_key_being_deleted(broker):
    topic = f"persistent://public/default/unload-race-{uuid.uuid4().hex[:6]}"
    cluster = broker.server.service.cluster
    bundle, epoch = take(broker, topic)
    hints = cluster.resources.unload_hints
    put = hints.put
    during: list = []

    def put_then_lookup(*args):  # the unload's first store call; the lookup runs meanwhile
        put(*args)
        try:
            during.append(lookup(broker, topic).own)
        except CompactMQError as exc:
            during.append(exc)

    hints.put = put_then_lookup
    try:
        assert broker.on_loop(cluster.unload_bundle(bundle))
    finally:
        hints.put = put
    assert during, "the lookup did not run during the unload"
    wait_until(lambda: serving_again(broker, topic, epoch), timeout=15, what="a new ownership of the bundle")
    publish(broker, topic)


def expire_session(store, hosts: str) -> None:
    """ZooKeeper's way: a second client joins the session, then closes it."""
    from kazoo.client import KazooClient

    session_id, password = store._zk.client_id
    thief = KazooClient(hosts=hosts, client_id=(session_id, password))
    thief.start(timeout=10)
    thief.stop()
    thief.close()


def test_a_bundle_won_under_a_session_that_expired_meanwhile_is_not_kept(broker, zookeeper):  # noqa: F811
    topic = f"persistent://public/default/expiry-race-{uuid.uuid4().hex[:6]}"
    service = broker.server.service
    cluster, store = service.cluster, service.storage.metadata_store
    ownership = cluster.resources.ownership
    fence = ownership.fence
    reestablished = []
    store.register_session_listener(
        lambda e: reestablished.append(e) if e is SessionEvent.SESSION_REESTABLISHED else None
    )
    won: list = []

    def fence_then_expire(*args):  # the lock is won and its fence read; then the session ends
        got = fence(*args)
        won.append(got)
        expire_session(store, zookeeper.hosts)
        wait_until(lambda: reestablished, timeout=20, what="a new session")
        for _ in range(3):  # the broker's session-loss handling has run on its loop
            broker.on_loop(asyncio.sleep(0.05))
        return got

    ownership.fence = fence_then_expire
    try:
        lookup(broker, topic)  # whatever it answers (here or look up again), what follows counts
    except CompactMQError:
        pass
    finally:
        ownership.fence = fence
    assert won and won[0] is not None
    wait_until(lambda: serving_again(broker, topic, won[0].epoch), timeout=15, what="a new ownership")
    publish(broker, topic)


def test_an_owner_key_gone_behind_the_brokers_back_makes_it_give_the_bundle_up(broker, tmp_path):
    from compactmq.storage.metadata_store import create_metadata_store
    from compactmq.storage.resources.cluster import OwnershipResources

    topic = f"persistent://public/default/key-gone-{uuid.uuid4().hex[:6]}"
    service = broker.server.service
    bundle, epoch = take(broker, topic)
    other = create_metadata_store(service.config["metadataStoreUrl"], data_dir=tmp_path)
    try:  # the ephemeral lock disappears; the broker's session lives on, so no event tells it
        path = OwnershipResources(other)._path(bundle.namespace, bundle.range)
        other.delete(path)
    finally:
        other.close()
    fresh = f"persistent://public/default/key-gone-new-{uuid.uuid4().hex[:6]}"
    while broker.on_loop(service.cluster.bundle_of_topic(TopicName.parse(fresh))) != bundle:
        fresh = f"persistent://public/default/key-gone-new-{uuid.uuid4().hex[:6]}"
    publish(broker, fresh)  # its first commit fails on the ended fence; the broker recovers
    assert service.cluster.fence_for(fresh).epoch > epoch
    publish(broker, topic)


def test_a_topic_opened_while_its_bundle_changed_ownership_is_not_kept_under_the_old_fence(broker):
    """The bundle is unloaded and taken again while a topic's ledger opens: the load must not
    end with the topic serving under the first ownership's (revoked) fence."""
    topic = f"persistent://public/default/load-race-{uuid.uuid4().hex[:6]}"
    service = broker.server.service
    cluster, storage = service.cluster, service.storage
    bundle, epoch = take(broker, "persistent://public/default/load-race-first")
    while broker.on_loop(cluster.bundle_of_topic(TopicName.parse(topic))) != bundle:
        topic = f"persistent://public/default/load-race-{uuid.uuid4().hex[:6]}"
    opened = storage.open_managed_ledger

    def open_then_move(name, *args):  # the ledger is bound to this ownership; then it ends
        ml = opened(name, *args)
        if name == topic:
            assert broker.on_loop(cluster.unload_bundle(bundle))
            assert lookup(broker, topic).own
        return ml

    storage.open_managed_ledger = open_then_move
    try:
        broker.on_loop(service.topics.get_topic(topic))
    except CompactMQError:
        pass  # refused: the client looks up again
    finally:
        storage.open_managed_ledger = opened
    assert cluster.fence_for(topic).epoch > epoch
    loaded = service.topics.loaded.get(topic)
    assert loaded is None or storage.fence_for(topic) is cluster.fence_for(topic)


def test_a_lookup_during_an_unload_waits_for_it_rather_than_burning_the_clients_backoff(broker):
    """The official client's reconnect backoff doubles after every failed attempt (100 ms up to
    60 s, reset only on success): each retriable refusal of a lookup during a handoff costs it
    twice the wait of the one before, and a few in a row cost a send tens of seconds (the chaos
    test's 60 s send timeout). A lookup that arrives while the bundle is being unloaded waits
    for the unload to finish, then answers the new owner: the handoff costs one reconnect."""
    topic = f"persistent://public/default/unload-wait-{uuid.uuid4().hex[:6]}"
    cluster = broker.server.service.cluster
    bundle, _ = take(broker, topic)
    ownership = cluster.resources.ownership
    release, lookup_once = ownership.release, cluster.lookup
    refused: list = []
    hold = 3.5  # the key's deletion is slow (a loaded store): the bundle stays in flux this long

    def slow_release(*args):
        time.sleep(hold)
        return release(*args)

    async def counting_lookup(*args):
        try:
            return await lookup_once(*args)
        except CompactMQError as exc:
            refused.append(exc)
            raise

    client = make_client(broker.url, operation_timeout_seconds=30)
    try:
        producer = client.create_producer(topic, send_timeout_millis=30_000)
        producer.send(b"before")
        ownership.release, cluster.lookup = slow_release, counting_lookup
        started = time.monotonic()
        unload = asyncio.run_coroutine_threadsafe(cluster.unload_bundle(bundle), broker._loop)
        wait_until(lambda: bundle not in cluster.owned, timeout=10, what="the unload to start")
        producer.send(b"after")
        took = time.monotonic() - started
        assert unload.result(20)
    finally:
        ownership.release, cluster.lookup = release, lookup_once
        client.close()
    assert not refused, f"{len(refused)} lookups refused during the handoff; the send took {took:.1f} s"
    assert took < hold + 3, f"the first send after the unload took {took:.1f} s"


def test_a_client_reaching_a_broker_before_it_joined_its_cluster_waits_for_the_join(
    tmp_path,
    zookeeper,  # noqa: F811
    monkeypatch,
):
    """A restarted broker binds its ports before it joins its cluster; a client that reaches it
    in between (a multi-host service URL) was refused (the topic's fence is lost until the join:
    ServiceNotReady) and, its backoff doubling at each refusal, came back only seconds after the
    join. Its lookup now waits for the join and then answers: no topic is ever loaded here
    before it (the fence stays), and the first send follows the join at once."""
    import socket
    import threading

    from compactmq.broker import server as server_module
    from compactmq.broker.cluster import ClusterService

    delay = 4.0  # the join is slow (a loaded store); under SETTLE_SECONDS
    start, not_joined = ClusterService.start, server_module._not_joined
    unfenced: list[str] = []

    async def slow_start(self):
        await asyncio.sleep(delay)
        await start(self)

    def counting_not_joined(topic: str):
        unfenced.append(topic)
        return not_joined(topic)

    monkeypatch.setattr(ClusterService, "start", slow_start)
    monkeypatch.setattr(server_module, "_not_joined", counting_not_joined)
    b = InProcessBroker(
        tmp_path / "data",
        {"metadataStoreUrl": f"zk:{zookeeper.hosts}/r{uuid.uuid4().hex[:10]}"},
    )
    starting = threading.Thread(target=b.start, daemon=True)
    starting.start()

    def accepting() -> bool:
        try:
            socket.create_connection(("127.0.0.1", b.port), timeout=0.2).close()
            return True
        except OSError:
            return False

    topic = f"persistent://public/default/early-{uuid.uuid4().hex[:6]}"
    try:
        wait_until(accepting, timeout=30, what="the broker's binary port")
        opened = time.monotonic()
        publish(b, topic)
        took = time.monotonic() - opened
        starting.join(30)
        assert b.server.service.cluster is not None
    finally:
        starting.join(30)
        b.stop()
    assert topic not in unfenced, f"{topic} was loaded before the join (the send took {took:.1f} s)"
    assert took < delay + 1.5, f"the first send took {took:.1f} s after the port opened"


def test_a_lookup_tries_again_while_the_store_is_briefly_unavailable(broker, monkeypatch):
    """A broker resumed after a freeze past its session answered its first lookups with
    "ZooKeeper connection lost (/admin/policies/...): SessionExpiredError" (retriable: the
    namespace check) until its new session was up -- each one doubling the client's backoff
    (the chaos test). A lookup now tries a retriable store failure again, its namespace check
    and the ownership reads alike, within ``SETTLE_SECONDS``, and answers once the store is back."""
    from compactmq.broker import handlers, namespaces
    from compactmq.storage.metadata_store import StoreUnavailable

    topic = f"persistent://public/default/store-away-{uuid.uuid4().hex[:6]}"
    cluster = broker.server.service.cluster
    ownership = cluster.resources.ownership
    facts, owner, lookup_topic = namespaces._namespace_facts, ownership.owner, handlers.lookup_topic
    failures, refused = Counter(), []

    looking_up = [0]  # the namespace check of a LOOKUP (PARTITIONED_METADATA reads it too)

    def away_twice(name, real):
        def call(*args):
            if failures[name] < 2 and looking_up[0]:
                failures[name] += 1
                raise StoreUnavailable(f"ZooKeeper connection lost ({name}, test): SessionExpiredError")
            return real(*args)

        return call

    async def counting_lookup(*args):  # what the client's LOOKUP gets
        looking_up[0] += 1
        try:
            return await lookup_topic(*args)
        except CompactMQError as exc:
            refused.append(exc)
            raise
        finally:
            looking_up[0] -= 1

    monkeypatch.setattr(namespaces, "_namespace_facts", away_twice("namespace", facts))
    monkeypatch.setattr(handlers, "lookup_topic", counting_lookup)
    ownership.owner = away_twice("owner", owner)
    try:
        publish(broker, topic)
    finally:
        ownership.owner = owner
    assert failures == {"namespace": 2, "owner": 2}
    assert not refused, f"lookups refused while the store was away: {refused}"
