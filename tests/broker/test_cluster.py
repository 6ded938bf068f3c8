"""Three brokers, one ZooKeeper: membership, bundles, ownership, lookups, redirects, unload.

Each broker is its own process (``compactmq standalone``) with its own data directory, on its own
ports, sharing a real ZooKeeper (``metadataStoreUrl=zk:...``, a chroot per cluster). Clients are
the official ``pulsar-client`` given all three brokers in one service URL.

Topics here are fresh for each check: a topic's entries stay on the disk of the broker that wrote
them until ledgers move to object storage, so data does not follow a bundle to its next owner.

The default run shares one cluster per module; the scenarios that kill or stop a broker are
``slow`` and start their own.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import sys
import urllib.request
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import pytest

pulsar = pytest.importorskip("pulsar")

from compactmq.broker.cluster.bundles import boundaries_for, bundle_of, bundles_data, topic_hash  # noqa: E402
from compactmq.errors import ServerError  # noqa: E402
from harness.cli import run_cli  # noqa: E402
from harness.wait import wait_until  # noqa: E402
from storage.metadata_store.zk_server import zookeeper  # noqa: E402,F401  (tests/ is on sys.path)

from .conftest import BrokerProcess, make_client  # noqa: E402
from .rest import ok, rest  # noqa: E402

pytestmark = pytest.mark.integration

NS = "public/default"
BOUNDARIES = boundaries_for(4)


def start_cluster(tmp_path_factory, zookeeper, n: int = 3, **overrides) -> list[BrokerProcess]:
    store = f"zk:{zookeeper.hosts}/c{uuid.uuid4().hex[:10]}"
    brokers = []
    for i in range(n):
        b = BrokerProcess(tmp_path_factory.mktemp(f"cluster-b{i}") / "data")
        b.overrides = {
            "metadataStoreUrl": store,
            "loadBalancerReportUpdateMinIntervalMillis": "300",
            **overrides,
        }
        brokers.append(b)
    try:
        for b in brokers:
            b.start()
    except BaseException:
        for b in brokers:
            b.stop(signal.SIGKILL)
        raise
    return brokers


def broker_id(b: BrokerProcess) -> str:
    return f"127.0.0.1:{b.web_port}"


def service_url(brokers: list[BrokerProcess]) -> str:
    return "pulsar://" + ",".join(f"127.0.0.1:{b.port}" for b in brokers)


def get_raw(b: BrokerProcess, path: str, method: str = "GET") -> tuple[int, dict, bytes]:
    """One request, redirects NOT followed: (status, headers, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", b.web_port, timeout=30)
    try:
        conn.request(method, path)
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def owner_web_port(brokers: list[BrokerProcess], topic: str) -> int:
    """The owner of ``topic``'s bundle, by HTTP lookup (redirects followed), as its web port."""
    local = topic.split("://", 1)[1]
    data = ok(rest(brokers[0], "GET", f"/lookup/v2/topic/persistent/{local}"))
    return urlsplit(data["httpUrl"]).port


def topics_in(bundle_lower: int, count: int, prefix: str) -> list[str]:
    """``count`` fresh topic names of public/default whose bundle starts at ``bundle_lower``."""
    out = []
    while len(out) < count:
        name = f"persistent://{NS}/{prefix}-{uuid.uuid4().hex[:8]}"
        if bundle_of(NS, BOUNDARIES, name).lower == bundle_lower:
            out.append(name)
    return out


def produce_consume(client, topic: str, n: int = 3) -> list[bytes]:
    consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(topic)
    sent = [f"{topic}-{i}".encode() for i in range(n)]
    for payload in sent:
        producer.send(payload)
    got = []
    for _ in sent:
        msg = consumer.receive(timeout_millis=15000)
        consumer.acknowledge(msg)
        got.append(msg.data())
    producer.close()
    consumer.close()
    assert got == sent
    return got


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, zookeeper):  # noqa: F811
    brokers = start_cluster(tmp_path_factory, zookeeper)
    yield brokers
    for b in brokers:
        b.stop()


@pytest.fixture(scope="module")
def client(cluster):
    c = make_client(service_url(cluster))
    yield c
    c.close()


def test_bundle_ranges_and_hash_are_pulsars():
    # Pulsar's getBundles(4) and its CRC-32 topic hash (Guava's crc32 of the UTF-8 name)
    assert bundles_data(BOUNDARIES) == {
        "boundaries": ["0x00000000", "0x40000000", "0x80000000", "0xc0000000", "0xffffffff"],
        "numBundles": 4,
    }
    assert bundles_data(boundaries_for(3))["boundaries"][1:3] == ["0x55555555", "0xaaaaaaaa"]
    assert topic_hash("123456789") == 0xCBF43926  # the CRC-32 check value
    assert bundle_of(NS, BOUNDARIES, "x").range in {"0x00000000_0x40000000", "0x40000000_0x80000000",
                                                    "0x80000000_0xc0000000", "0xc0000000_0xffffffff"}  # fmt: skip


def test_every_broker_registers_and_lists_the_cluster(cluster):
    expected = sorted(broker_id(b) for b in cluster)
    for b in cluster:
        assert ok(rest(b, "GET", "/admin/v2/brokers/standalone")) == expected
    leaders = {ok(rest(b, "GET", "/admin/v2/brokers/leaderBroker"))["brokerId"] for b in cluster}
    assert len(leaders) == 1 and leaders <= set(expected)
    assert rest(cluster[0], "GET", "/admin/v2/brokers/other-cluster")[0] == 404
    assert ok(rest(cluster[1], "GET", f"/admin/v2/namespaces/{NS}/bundles")) == bundles_data(BOUNDARIES)
    assert rest(cluster[1], "PUT", f"/admin/v2/namespaces/{NS}/0x1_0x2/unload")[0] == 412  # not a bundle
    assert rest(cluster[1], "GET", "/admin/v2/namespaces/public/nope/bundles")[0] == 404
    out = run_cli(
        *["--admin-url", f"http://127.0.0.1:{cluster[2].web_port}", "brokers", "list", "standalone"]
    )
    assert out.returncode == 0 and sorted(out.stdout.split()) == expected
    admin = ["--admin-url", f"http://127.0.0.1:{cluster[0].web_port}"]
    assert run_cli(*admin, "brokers", "leader-broker").stdout.strip() in expected
    bundles = run_cli(*admin, "namespaces", "bundles", NS).stdout.split()
    assert bundles == [
        "0x00000000_0x40000000",
        "0x40000000_0x80000000",
        "0x80000000_0xc0000000",
        "0xc0000000_0xffffffff",
    ]


def test_a_namespace_created_with_its_bundle_count_keeps_it(cluster, client):
    ns = f"public/split{uuid.uuid4().hex[:6]}"
    admin = ["--admin-url", f"http://127.0.0.1:{cluster[0].web_port}"]
    assert run_cli(*admin, "namespaces", "create", ns, "--bundles", "2").returncode == 0
    body = ok(rest(cluster[2], "GET", f"/admin/v2/namespaces/{ns}/bundles"))
    assert body == {"boundaries": ["0x00000000", "0x80000000", "0xffffffff"], "numBundles": 2}
    produce_consume(client, f"persistent://{ns}/t", 1)
    bad = f"/admin/v2/namespaces/public/bad{uuid.uuid4().hex[:6]}"
    assert rest(cluster[1], "PUT", bad, {"bundles": {"numBundles": 0}})[0] == 412
    assert rest(cluster[1], "PUT", bad, {"bundles": {"boundaries": ["0x00000000", "0x10"]}})[0] == 412
    assert rest(cluster[1], "GET", bad + "/bundles")[0] == 404  # nothing was created


def test_topics_spread_over_the_brokers_and_a_multi_host_client_uses_them_all(cluster, client):
    # one fresh topic in each of the 4 bundles: 3 brokers, the least-loaded assignment covers all
    topics = [topics_in(lo, 1, "spread")[0] for lo in BOUNDARIES[:-1]]
    for t in topics:
        produce_consume(client, t)
    owners = {owner_web_port(cluster, t) for t in topics}
    # spread: the bundles other tests of this module made count toward each broker's load (and a
    # load report may lag under a busy machine), so "all three" is not guaranteed; more than one is
    assert len(owners) >= 2 and owners <= {b.web_port for b in cluster}
    owned = {}
    for b in cluster:
        body = ok(rest(b, "GET", f"/admin/v2/brokers/standalone/{broker_id(b)}/ownedNamespaces"))
        owned[b.web_port] = {name for name in body if name.startswith(f"{NS}/")}
    assert sum(len(v) for v in owned.values()) == 4  # each bundle of public/default exactly once
    assert len(set().union(*owned.values())) == 4


def test_a_partitioned_topic_spreads_its_partitions_and_works_through_any_broker(cluster, client):
    while True:  # a name whose 6 partitions fall into all 4 bundles
        topic = f"persistent://{NS}/parts-{uuid.uuid4().hex[:8]}"
        if len({bundle_of(NS, BOUNDARIES, f"{topic}-partition-{i}") for i in range(6)}) == 4:
            break
    local = topic.split("://", 1)[1]
    assert rest(cluster[1], "PUT", f"/admin/v2/persistent/{local}/partitions", 6)[0] == 204
    producer = client.create_producer(topic)
    consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
    sent = {f"k{i}".encode() for i in range(24)}
    for i, payload in enumerate(sorted(sent)):
        producer.send(payload, partition_key=str(i))
    got = set()
    for _ in sent:
        msg = consumer.receive(timeout_millis=15000)
        consumer.acknowledge(msg)
        got.add(msg.data())
    producer.close()
    consumer.close()
    assert got == sent
    owners = {owner_web_port(cluster, f"{topic}-partition-{i}") for i in range(6)}
    # 4 bundles over 3 brokers (other tests' bundles count toward the load): more than one serves
    assert len(owners) >= 2 and owners <= {b.web_port for b in cluster}


def test_a_client_given_one_broker_over_http_reaches_the_owner(cluster):
    http_client = make_client(f"http://127.0.0.1:{cluster[2].web_port}")
    try:
        for lo in BOUNDARIES[:-1]:  # a fresh topic in every bundle: some are owned elsewhere
            produce_consume(http_client, topics_in(lo, 1, "http")[0], 1)
    finally:
        http_client.close()


def test_lookup_and_admin_calls_reach_the_owner(cluster, client):
    topic = topics_in(BOUNDARIES[0], 1, "lookup")[0]
    produce_consume(client, topic, 1)
    owner = next(b for b in cluster if b.web_port == owner_web_port(cluster, topic))
    other = next(b for b in cluster if b is not owner)
    local = topic.split("://", 1)[1]
    # HTTP lookup on a broker that does not own it: the owner's URLs
    status, _, body = get_raw(other, f"/lookup/v2/topic/persistent/{local}")
    assert status == 200
    assert json.loads(body)["brokerUrl"] == f"pulsar://127.0.0.1:{owner.port}"
    # an admin call about the topic on a non-owner: 307 to the owner, same path
    path = f"/admin/v2/persistent/{local}/stats"
    status, headers, _ = get_raw(other, path)
    assert status == 307
    location = urlsplit(headers["Location"])
    assert location.port == owner.web_port and location.path == path
    assert ok(rest(other, "GET", path))["publishers"] == []  # urllib follows a GET's 307
    out = run_cli("--admin-url", f"http://127.0.0.1:{other.web_port}", "topics", "lookup", topic)
    assert out.stdout.strip() == f"pulsar://127.0.0.1:{owner.port}"
    # partitioned metadata (what a client's HTTP lookup asks first): any broker answers itself
    status, _, body = get_raw(other, f"/admin/v2/persistent/{local}/partitions?checkAllowAutoCreation=true")
    assert status == 200 and json.loads(body) == {"partitions": 0}


def test_a_producer_on_a_broker_that_does_not_own_the_topic_gets_service_not_ready(cluster, client):
    from tests.broker.test_broker_client import RawClient
    from tests.protocol import client_commands as commands

    topic = topics_in(BOUNDARIES[1], 1, "notready")[0]
    produce_consume(client, topic, 1)
    owner_port = owner_web_port(cluster, topic)
    other = next(b for b in cluster if b.web_port != owner_port)
    raw = RawClient(other.port)
    try:
        raw.send(commands.producer(topic, 1, 1))
        answer = raw.recv()
        assert answer.type == 14  # ERROR
        assert answer.error.error == ServerError.ServiceNotReady
        # its LOOKUP answers Connect to the owner (Pulsar's answer when the bundle is owned)
        raw.send(commands.lookup(topic, 2))
        found = raw.recv().lookupTopicResponse
        assert found.response == found.Connect and found.authoritative
        assert found.brokerServiceUrl.endswith(str(next(b.port for b in cluster if b.web_port == owner_port)))
    finally:
        raw.close()


def test_bundle_unload_moves_ownership_to_the_destination(cluster, client):
    before = topics_in(BOUNDARIES[2], 1, "unload-a")[0]
    produce_consume(client, before, 1)
    owner_port = owner_web_port(cluster, before)
    owner = next(b for b in cluster if b.web_port == owner_port)
    dest = next(b for b in cluster if b is not owner)
    asker = next(b for b in cluster if b is not owner and b is not dest)
    bundle = bundle_of(NS, BOUNDARIES, before).range
    # asked of a broker that does not own it: the CLI follows the 307 to the owner
    out = run_cli(*[
        "--admin-url", f"http://127.0.0.1:{asker.web_port}",
        "namespaces", "unload", NS, "--bundle", bundle, "--destinationBroker", broker_id(dest),
    ])  # fmt: skip
    assert out.returncode == 0, out.stderr
    after = topics_in(BOUNDARIES[2], 1, "unload-b")[0]  # a fresh topic: data stays with the old owner
    produce_consume(client, after, 2)
    assert owner_web_port(cluster, after) == dest.web_port
    owned = ok(rest(dest, "GET", f"/admin/v2/brokers/standalone/{broker_id(dest)}/ownedNamespaces"))
    assert f"{NS}/{bundle}" in owned


def test_topic_unload_closes_it_on_its_owner(cluster, client):
    topic = topics_in(BOUNDARIES[3], 1, "tunload")[0]
    producer = client.create_producer(topic)
    producer.send(b"one")
    some = cluster[0]
    out = run_cli(*["--admin-url", f"http://127.0.0.1:{some.web_port}", "topics", "unload", topic])
    assert out.returncode == 0, out.stderr
    producer.send(b"two")  # the client reconnected after the broker closed its producer
    producer.close()


def test_namespace_unload_hands_every_bundle_back(cluster, client):
    for lo in BOUNDARIES[:-1]:
        produce_consume(client, topics_in(lo, 1, "nsunload")[0], 1)

    def owned_anywhere() -> int:
        names = []
        for b in cluster:
            names += ok(rest(b, "GET", f"/admin/v2/brokers/standalone/{broker_id(b)}/ownedNamespaces"))
        return len([n for n in names if n.startswith(f"{NS}/")])

    assert owned_anywhere() == 4
    out = run_cli("--admin-url", f"http://127.0.0.1:{cluster[0].web_port}", "namespaces", "unload", NS)
    assert out.returncode == 0, out.stderr
    assert owned_anywhere() == 0  # each owner gave its bundles up before the call answered
    produce_consume(client, topics_in(BOUNDARIES[0], 1, "after-nsunload")[0], 1)


# --- slow: a broker dies or leaves -------------------------------------------------------------


@pytest.mark.slow
def test_a_broker_frozen_past_its_session_loses_its_bundles_and_refuses_them_when_resumed(
    tmp_path_factory,
    zookeeper,  # noqa: F811
):
    brokers = start_cluster(tmp_path_factory, zookeeper, metadataStoreSessionTimeoutMillis="2000")
    client = make_client(service_url(brokers))
    frozen = None
    try:
        topic = topics_in(BOUNDARIES[0], 1, "freeze")[0]
        produce_consume(client, topic, 1)
        frozen = next(b for b in brokers if b.web_port == owner_web_port(brokers, topic))
        others = [b for b in brokers if b is not frozen]
        frozen.proc.send_signal(signal.SIGSTOP)
        wait_until(
            lambda: broker_id(frozen) not in ok(rest(others[0], "GET", "/admin/v2/brokers/standalone")),
            timeout=20,
            what="the frozen broker's registration to expire",
        )
        fresh = topics_in(BOUNDARIES[0], 1, "after-freeze")[0]
        c2 = make_client(service_url(others))
        try:
            produce_consume(c2, fresh, 1)  # another broker took the bundle
        finally:
            c2.close()
        new_owner = owner_web_port(others, fresh)
        assert new_owner != frozen.web_port
        frozen.proc.send_signal(signal.SIGCONT)
        frozen_id = broker_id(frozen)
        # resumed: it learns its session is gone, registers again, and serves nothing it lost
        wait_until(
            lambda: frozen_id in ok(rest(others[0], "GET", "/admin/v2/brokers/standalone")),
            timeout=20,
            what="the resumed broker to register again",
        )
        owned = ok(rest(frozen, "GET", f"/admin/v2/brokers/standalone/{frozen_id}/ownedNamespaces"))
        assert f"{NS}/{bundle_of(NS, BOUNDARIES, fresh).range}" not in owned
        assert owner_web_port(brokers, fresh) == new_owner
    finally:
        if frozen is not None and frozen.alive():
            frozen.proc.send_signal(signal.SIGCONT)
        client.close()
        for b in brokers:
            b.stop(signal.SIGKILL)


@pytest.mark.slow
def test_killed_broker_frees_its_bundles_after_the_session_timeout(tmp_path_factory, zookeeper):  # noqa: F811
    brokers = start_cluster(tmp_path_factory, zookeeper, metadataStoreSessionTimeoutMillis="2000")
    client = make_client(service_url(brokers))
    try:
        topics = [topics_in(lo, 1, "kill")[0] for lo in BOUNDARIES[:-1]]
        for t in topics:
            produce_consume(client, t, 1)
        victim = next(b for b in brokers if b.web_port == owner_web_port(brokers, topics[0]))
        survivors = [b for b in brokers if b is not victim]
        victim.stop(signal.SIGKILL)

        def listed() -> list:
            return ok(rest(survivors[0], "GET", "/admin/v2/brokers/standalone"))

        wait_until(lambda: broker_id(victim) not in listed(), timeout=20, what="the killed broker to go")
        survivor_client = make_client(service_url(survivors))
        try:
            fresh = topics_in(BOUNDARIES[0], 1, "after-kill")[0]
            produce_consume(survivor_client, fresh, 2)
            assert owner_web_port(survivors, fresh) in {b.web_port for b in survivors}
        finally:
            survivor_client.close()
    finally:
        client.close()
        for b in brokers:
            b.stop(signal.SIGKILL)


@pytest.mark.slow
def test_graceful_shutdown_hands_its_bundles_back_at_once(tmp_path_factory, zookeeper):  # noqa: F811
    # a 60 s session: only the shutdown's own release can free the bundles within the test
    brokers = start_cluster(tmp_path_factory, zookeeper, metadataStoreSessionTimeoutMillis="60000")
    client = make_client(service_url(brokers))
    try:
        topics = [topics_in(lo, 1, "leave")[0] for lo in BOUNDARIES[:-1]]
        for t in topics:
            produce_consume(client, t, 1)
        leaving = next(b for b in brokers if b.web_port == owner_web_port(brokers, topics[0]))
        staying = [b for b in brokers if b is not leaving]
        assert leaving.stop() == 0
        assert broker_id(leaving) not in ok(rest(staying[0], "GET", "/admin/v2/brokers/standalone"))
        fresh = topics_in(BOUNDARIES[0], 1, "after-leave")[0]
        c2 = make_client(service_url(staying))
        try:
            produce_consume(c2, fresh, 1)
        finally:
            c2.close()
        assert owner_web_port(staying, fresh) in {b.web_port for b in staying}
    finally:
        client.close()
        for b in brokers:
            b.stop(signal.SIGKILL)


@pytest.mark.slow
def test_lookups_answer_the_owners_named_listener_and_its_advertised_address(tmp_path_factory, zookeeper):  # noqa: F811
    store = f"zk:{zookeeper.hosts}/c{uuid.uuid4().hex[:10]}"
    brokers = [BrokerProcess(tmp_path_factory.mktemp(f"listen-b{i}") / "data") for i in range(2)]
    for b in brokers:  # two names for one socket, so the address answered is visible
        b.overrides = {
            "metadataStoreUrl": store,
            "advertisedListeners": f"internal:pulsar://127.0.0.1:{b.port},external:pulsar://localhost:{b.port}",
            "internalListenerName": "internal",
        }
    named = BrokerProcess(tmp_path_factory.mktemp("listen-named") / "data")
    named.overrides = {"metadataStoreUrl": store, "advertisedAddress": "localhost"}
    try:
        for b in brokers:
            b.start()
        topics = [topics_in(lo, 1, "listen")[0] for lo in BOUNDARIES[:-1]]
        client = make_client(service_url(brokers), listener_name="external")
        try:
            for t in topics:
                produce_consume(client, t, 1)
        finally:
            client.close()
        for t in topics:
            owner = next(b for b in brokers if b.web_port == owner_web_port(brokers, t))
            local = t.split("://", 1)[1]
            for asked in brokers:
                path = f"/lookup/v2/topic/persistent/{local}?listenerName=external"
                assert ok(rest(asked, "GET", path))["brokerUrl"] == f"pulsar://localhost:{owner.port}"
        named.start()  # advertisedAddress names the broker in the cluster and in its URLs
        listed = ok(rest(brokers[0], "GET", "/admin/v2/brokers/standalone"))
        assert f"localhost:{named.web_port}" in listed
    finally:
        for b in [*brokers, named]:
            b.stop(signal.SIGKILL)


@pytest.mark.slow
def test_cluster_script_starts_zookeeper_and_three_brokers_and_stops_them(tmp_path):
    import subprocess

    from .conftest import ROOT, free_port

    def weed_port() -> int:  # SeaweedFS listens on the port and on the port + 10000 (gRPC)
        while True:
            port = free_port()
            if port < 55000:
                return port

    env = {
        **os.environ,
        "ZK_PORT": str(free_port()),
        "WEED_PORTS": " ".join(str(weed_port()) for _ in range(4)),
        "BROKER_PORTS": " ".join(str(free_port()) for _ in range(3)),
        "WEB_PORTS": " ".join(str(free_port()) for _ in range(3)),
        "COMPACTMQ": str(Path(sys.executable).parent / "compactmq"),
    }
    script = [str(ROOT / "scripts" / "cluster.sh")]
    started = subprocess.run(
        [*script, "start", str(tmp_path)], env=env, capture_output=True, text=True, timeout=180
    )
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        info = json.loads((tmp_path / "cluster.json").read_text())
        roles = [p["role"] for p in info["processes"]]
        assert roles == ["zookeeper", "objectstore", "broker", "broker", "broker"]
        client = make_client(info["serviceUrl"])
        try:
            for lo in BOUNDARIES[:-1]:
                produce_consume(client, topics_in(lo, 1, "script")[0], 1)
        finally:
            client.close()
        web = info["processes"][2]["webServiceUrl"]
        with urllib.request.urlopen(f"{web}/admin/v2/brokers/standalone", timeout=10) as resp:
            assert len(json.loads(resp.read())) == 3
    finally:
        stopped = subprocess.run(
            [*script, "stop", str(tmp_path)], env=env, capture_output=True, text=True, timeout=120
        )
    assert stopped.returncode == 0, stopped.stderr
    for p in info["processes"]:
        with pytest.raises(ProcessLookupError):
            os.kill(p["pid"], 0)
