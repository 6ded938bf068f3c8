"""Data follows ownership: three brokers, ZooKeeper, SeaweedFS, and the official client failing over.

Each broker is its own process with ``objectLedgerStorageUrl`` pointing at one SeaweedFS bucket,
sharing a real ZooKeeper with a short session timeout. A producer (deduplication on) and a
consumer, given all three brokers in one service URL, work on a topic owned by broker A; then A
goes away -- SIGKILL, an unload, a graceful stop (SIGTERM), or SIGSTOP past its session timeout
and SIGCONT -- while the
producer keeps sending. What must hold afterwards:

* every message the producer saw acknowledged is in the topic, once, in the order sent (a
  reader from the earliest position reads the whole topic on the new owner: nothing duplicated,
  so deduplication state moved with the topic, and nothing a zombie wrote became visible);
* the consumer resumes from its acknowledged position: nothing it acknowledged (and the broker
  persisted) before the move comes again, and everything acknowledged to the producer arrives;
* the frozen broker, once resumed, serves the topic no more.

Compaction moves too: a topic compacted on A (Spark in the broker, ``spark.master=local[1]``),
A killed, more keyed messages, compacted again on the new owner; a read-compacted reader and a
TableView then hold exactly the latest acknowledged value of each key.

Each scenario has its own namespace of one bundle, so moving it moves nothing else. The SIGKILL
case runs by default; the others are ``slow``.

The partitioned-stats checks share this cluster (its data follows ownership, so the sums hold
after a move): on any broker, each partition's stats come from its owner, and only from a
broker registered in ZooKeeper.
"""

from __future__ import annotations

import json
import signal
import threading
import time
import uuid
from urllib.parse import urlsplit

import pytest

pulsar = pytest.importorskip("pulsar")

from compactmq.broker.cluster.bundles import boundaries_for, bundle_of  # noqa: E402
from harness.cli import run_cli  # noqa: E402
from harness.wait import wait_until  # noqa: E402
from storage.metadata_store.zk_server import zookeeper  # noqa: E402,F401  (tests/ is on sys.path)

from .conftest import BrokerProcess, make_client  # noqa: E402
from .rest import ok, rest  # noqa: E402
from .test_cluster import get_raw, service_url, start_cluster  # noqa: E402

pytestmark = pytest.mark.integration

SESSION_TIMEOUT_MS = 3000
BUCKET = "cluster-failover"
WHOLE_BUNDLE = "0x00000000_0xffffffff"
BOUNDARIES = boundaries_for(4)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, zookeeper, seaweedfs):  # noqa: F811
    bucket = seaweedfs.create_bucket(BUCKET)
    prefix = uuid.uuid4().hex[:10]
    url = f"s3://{bucket}/{prefix}?region=us-east-1&endpoint={seaweedfs.endpoint}"
    brokers = start_cluster(
        tmp_path_factory,
        zookeeper,
        objectLedgerStorageUrl=url,
        metadataStoreSessionTimeoutMillis=str(SESSION_TIMEOUT_MS),
        brokerDeduplicationEnabled="true",
        managedLedgerDefaultMarkDeleteRateLimit="0",  # every ack written: "acked" is exact
        **{"spark.master": "local[1]"},  # only the compaction test starts Spark: one core of two
    )
    yield brokers
    for b in brokers:
        if b.proc is not None and b.proc.poll() is None:
            b.proc.send_signal(signal.SIGCONT)
        b.stop(signal.SIGKILL)


def _client(brokers: list[BrokerProcess]):
    return make_client(service_url(brokers), connection_timeout_ms=2000, operation_timeout_seconds=30)


def _namespace(brokers: list[BrokerProcess]) -> str:
    ns = f"public/fo{uuid.uuid4().hex[:8]}"
    ok(rest(brokers[0], "PUT", f"/admin/v2/namespaces/{ns}", {"bundles": {"numBundles": 1}}))
    return ns


def _owner(brokers: list[BrokerProcess], topic: str, via: BrokerProcess | None = None) -> BrokerProcess:
    local = topic.split("://", 1)[1]
    asker = via or next(b for b in brokers if b.alive())
    port = urlsplit(ok(rest(asker, "GET", f"/lookup/v2/topic/persistent/{local}"))["httpUrl"]).port
    return next(b for b in brokers if b.web_port == port)


class Publisher(threading.Thread):
    """Sends ``m-<i>`` one at a time (dedup: one producer name, sequence ids from the client);
    ``acked`` lists the indexes the broker acknowledged, ``failed`` the sends that raised."""

    def __init__(self, client, topic: str) -> None:
        super().__init__(daemon=True)
        self.producer = client.create_producer(
            topic,
            producer_name=f"p-{uuid.uuid4().hex[:6]}",
            send_timeout_millis=60000,
            batching_enabled=False,
        )
        self.acked: list[int] = []
        self.failed: list[tuple[int, str]] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        i = 0
        while not self.stopping.is_set():
            try:
                self.producer.send(b"m-%d" % i)
                self.acked.append(i)
            except Exception as exc:  # noqa: BLE001 - recorded; the checks decide
                self.failed.append((i, repr(exc)))
            i += 1
            time.sleep(0.002)

    def stop(self) -> None:
        self.stopping.set()
        self.join(90)
        assert not self.is_alive(), "the producer is stuck"
        self.producer.close()


def _index(msg) -> int:
    return int(msg.data().split(b"-", 1)[1])


def _read_whole_topic(client, topic: str) -> list[int]:
    """The indexes of the topic's ``m-`` messages; checks on the way that entry ids run from 0
    without a gap in each ledger and that ledger ids only grow (none reused after a move)."""
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    out = []
    entries: dict[int, list[int]] = {}
    try:
        while reader.has_message_available():
            msg = reader.read_next(timeout_millis=20000)
            mid = msg.message_id()
            entries.setdefault(mid.ledger_id(), []).append(mid.entry_id())
            if msg.data().startswith(b"m-"):
                out.append(_index(msg))
    finally:
        reader.close()
    assert list(entries) == sorted(entries), "ledger ids out of order"
    for ledger, ids in entries.items():
        assert ids == list(range(len(ids))), f"ledger {ledger}: entry ids {ids[:5]}... not 0, 1, 2..."
    assert len(entries) >= 2, "the move should have started a new ledger"
    return out


def _mark_delete(brokers, topic: str) -> str:
    local = topic.split("://", 1)[1]
    owner = _owner(brokers, topic)
    stats = ok(rest(owner, "GET", f"/admin/v2/persistent/{local}/internalStats"))
    return stats["cursors"]["sub"]["markDeletePosition"]


def _failover(cluster, move) -> dict:
    """Produce and consume on a topic owned by A, ``move(A, topic)``, produce on; check the
    module docstring's promises. Returns measurements for the caller to print."""
    client = _client(cluster)
    topic = f"persistent://{_namespace(cluster)}/t"
    consumer = client.subscribe(
        topic, "sub", initial_position=pulsar.InitialPosition.Earliest, receiver_queue_size=20
    )
    pub = Publisher(client, topic)
    pub.start()
    try:
        wait_until(lambda: len(pub.acked) >= 40, timeout=60, what="40 messages acknowledged before the move")
        first = [consumer.receive(timeout_millis=20000) for _ in range(25)]
        assert [_index(m) for m in first] == list(range(25))
        consumer.acknowledge_cumulative(first[-1])
        want = "%d:%d" % (first[-1].message_id().ledger_id(), first[-1].message_id().entry_id())
        wait_until(lambda: _mark_delete(cluster, topic) == want, timeout=20, what="the ack persisted")
        owner = _owner(cluster, topic)
        before = len(pub.acked)
        t0 = time.monotonic()
        move(owner, topic)
        wait_until(lambda: len(pub.acked) > before + 1, timeout=90, what="a publish after the move")
        first_publish_s = time.monotonic() - t0
        wait_until(lambda: len(pub.acked) >= before + 40, timeout=60, what="40 more acknowledged")
    finally:
        pub.stop()
    after: list[int] = []
    others: list[bytes] = []  # what another producer wrote meanwhile
    acked = set(pub.acked)
    deadline = time.monotonic() + 60
    while not acked <= set(after) | set(range(25)) and time.monotonic() < deadline:
        try:
            msg = consumer.receive(timeout_millis=5000)
        except Exception:  # noqa: BLE001 - a timeout: look again until the deadline
            continue
        consumer.acknowledge(msg)
        if msg.data().startswith(b"m-"):
            after.append(_index(msg))
        else:
            others.append(msg.data())
    consumer.close()
    new_owner = _owner(cluster, topic)
    whole = _read_whole_topic(client, topic)
    client.close()
    assert pub.failed == [], pub.failed[:5]
    assert len(whole) == len(set(whole)), "a message is in the topic twice"
    assert whole == sorted(whole), "messages out of order"
    missing = acked - set(whole)
    assert not missing, f"{len(missing)} acknowledged message(s) lost: {sorted(missing)[:10]}"
    assert min(after) == 25 and not [i for i in after if i < 25], "an acknowledged message came again"
    assert acked <= set(after) | set(range(25)), "the consumer did not get every message"
    return {
        "owner": owner,
        "new_owner": new_owner,
        "first_publish_s": first_publish_s,
        "acked": len(acked),
        "others": others,
        "topic": topic,
    }


def _spread_partitioned_topic(cluster) -> tuple[str, list[str]]:
    """A partitioned topic of 6 partitions in a fresh namespace of 4 bundles, bundle k taken by
    broker k % 3 (an authoritative lookup of an unowned bundle takes it): spread whatever the
    balancer would have chosen. Returns the topic and its partitions."""
    while True:
        ns = f"public/ps{uuid.uuid4().hex[:8]}"
        topic = f"persistent://{ns}/pstats"
        if len({bundle_of(ns, BOUNDARIES, f"{topic}-partition-{i}") for i in range(6)}) == 4:
            break
    ok(rest(cluster[0], "PUT", f"/admin/v2/namespaces/{ns}", {"bundles": {"numBundles": 4}}))
    names = [f"{topic}-partition-{i}" for i in range(6)]
    for name in names:
        k = BOUNDARIES.index(bundle_of(ns, BOUNDARIES, name).lower)
        path = f"/lookup/v2/topic/persistent/{name.split('://', 1)[1]}?authoritative=true"
        ok(rest(cluster[k % 3], "GET", path))
    assert rest(cluster[0], "PUT", f"/admin/v2/persistent/{topic.split('://', 1)[1]}/partitions", 6)[0] == 204
    assert len({_owner(cluster, name) for name in names}) == 3  # no broker owns every partition
    return topic, names


def _partitioned_stats(b: BrokerProcess, local: str, per_partition: str = "true") -> dict:
    status, _, raw = get_raw(
        b, f"/admin/v2/persistent/{local}/partitioned-stats?perPartition={per_partition}"
    )
    assert status == 200, raw[:300]  # answered here: no 307, no 503
    return json.loads(raw)


def test_partitioned_stats_gather_each_partition_from_its_owner(cluster):
    """Pulsar's partitioned-stats on any broker: each partition's stats come from its owner (a
    broker owning only some partitions answered 503 before), summed, and ``perPartition``; the
    same after every bundle was unloaded (each partition assigned on the way: the leader's 307
    followed to the broker it picks), the data following ownership."""
    topic, names = _spread_partitioned_topic(cluster)
    local = topic.split("://", 1)[1]
    client = _client(cluster)
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(24):
        producer.send(b"m%d" % i, partition_key=str(i))
    try:
        for b in cluster:
            body = _partitioned_stats(b, local)
            assert set(body["partitions"]) == set(names)
            assert sum(p["entriesCount"] for p in body["partitions"].values()) == 24
            assert body["entriesCount"] == 24 and body["msgInCounter"] == 24
            assert len(body["publishers"]) == 6  # the producer's, live on each owner
            status, _, raw = get_raw(b, f"/admin/v2/persistent/{local}/partitioned-internalStats")
            assert status == 200, raw[:300]
            internal = json.loads(raw)
            assert internal["metadata"] == {"partitions": 6} and set(internal["partitions"]) == set(names)
            assert sum(p["numberOfEntries"] for p in internal["partitions"].values()) == 24
    finally:
        producer.close()
        client.close()
    assert "partitions" not in _partitioned_stats(cluster[1], local, per_partition="false")
    admin = ("--admin-url", f"http://127.0.0.1:{cluster[2].web_port}", "--output", "json")
    out = json.loads(run_cli(*admin, "topics", "partitioned-stats", "--per-partition", topic).stdout)
    assert out["entriesCount"] == 24 and set(out["partitions"]) == set(names)
    out = json.loads(run_cli(*admin, "topics", "partitioned-stats-internal", topic).stdout)
    assert set(out["partitions"]) == set(names)
    assert rest(cluster[0], "PUT", f"/admin/v2/namespaces/{local.rsplit('/', 1)[0]}/unload")[0] == 204
    body = _partitioned_stats(cluster[1], local)
    assert set(body["partitions"]) == set(names) and body["entriesCount"] == 24


def test_partitioned_stats_ask_only_registered_brokers(cluster, tmp_path):
    """A bundle's ownership record naming a web URL that no registered broker has (a stale or
    forged key) is never asked: the partition answers 503 and that URL gets no request."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from compactmq.storage.metadata_store import create_metadata_store
    from compactmq.storage.resources import PulsarResources

    asked: list[str] = []

    class Recorder(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args) -> None:
            pass

    rogue = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=rogue.serve_forever, daemon=True).start()
    ns = f"public/rogue{uuid.uuid4().hex[:8]}"
    ok(rest(cluster[0], "PUT", f"/admin/v2/namespaces/{ns}", {"bundles": {"numBundles": 1}}))
    local = f"{ns}/t"
    assert rest(cluster[0], "PUT", f"/admin/v2/persistent/{local}/partitions", 2)[0] == 204
    store = create_metadata_store(  # the cluster's ZooKeeper, as another process
        cluster[0].overrides["metadataStoreUrl"], data_dir=tmp_path, operation_timeout_s=10
    )
    try:
        url = f"http://127.0.0.1:{rogue.server_port}"
        record = {"nativeUrl": "pulsar://127.0.0.1:1", "httpUrl": url, "disabled": False}
        assert PulsarResources(store).ownership.try_acquire(ns, WHOLE_BUNDLE, record)[1]
        status, _, raw = get_raw(cluster[1], f"/admin/v2/persistent/{local}/partitioned-stats")
        assert status == 503 and b"not a registered broker" in raw, raw[:300]
        assert asked == []
    finally:
        store.close()
        rogue.shutdown()
        rogue.server_close()


def _kill(owner: BrokerProcess, topic: str) -> None:
    owner.stop(signal.SIGKILL)


def test_sigkill_of_the_owner_loses_nothing_acknowledged(cluster):
    got = _failover(cluster, _kill)
    assert got["new_owner"] is not got["owner"]
    print(f"SIGKILL: first publish on the new owner {got['first_publish_s']:.2f} s after the kill")
    got["owner"].start()  # back for the next scenario


@pytest.fixture(scope="module")
def per_ledger_cluster(tmp_path_factory, zookeeper, seaweedfs):  # noqa: F811
    """The same cluster with the group flush off (``objectLedgerGroupFlushEnabled=false``; on by
    default): each ledger's flush is an object of its own, never a shared one."""
    url = f"s3://{seaweedfs.create_bucket(BUCKET)}/{uuid.uuid4().hex[:10]}?region=us-east-1&endpoint={seaweedfs.endpoint}"
    brokers = start_cluster(
        tmp_path_factory,
        zookeeper,
        objectLedgerStorageUrl=url,
        objectLedgerGroupFlushEnabled="false",
        metadataStoreSessionTimeoutMillis=str(SESSION_TIMEOUT_MS),
        brokerDeduplicationEnabled="true",
        managedLedgerDefaultMarkDeleteRateLimit="0",
    )
    yield brokers
    for b in brokers:
        b.stop(signal.SIGKILL)


@pytest.mark.slow  # a second cluster (about a minute): run with -m slow
def test_sigkill_of_the_owner_loses_nothing_with_per_ledger_objects(per_ledger_cluster):
    got = _failover(per_ledger_cluster, _kill)
    assert got["new_owner"] is not got["owner"]
    got["owner"].start()


@pytest.mark.slow
def test_unload_of_the_bundle_loses_nothing(cluster):
    def unload(owner: BrokerProcess, topic: str) -> None:
        ns = topic.split("://", 1)[1].rsplit("/", 1)[0]
        ok(rest(owner, "PUT", f"/admin/v2/namespaces/{ns}/{WHOLE_BUNDLE}/unload"))

    got = _failover(cluster, unload)
    print(f"unload: first publish on the new owner {got['first_publish_s']:.2f} s after the unload")


@pytest.mark.slow
def test_a_graceful_stop_of_the_owner_loses_nothing(cluster):
    got = _failover(cluster, lambda owner, topic: owner.stop(signal.SIGTERM))
    print(f"SIGTERM: first publish on the new owner {got['first_publish_s']:.2f} s after the stop began")
    got["owner"].start()


@pytest.mark.slow
def test_a_rolling_restart_of_every_broker_loses_nothing(cluster):
    def rolling(owner: BrokerProcess, topic: str) -> None:
        for b in [owner, *(b for b in cluster if b is not owner)]:
            b.stop(signal.SIGTERM)  # hands its bundles back first
            b.start()

    got = _failover(cluster, rolling)
    print(f"rolling restart: {got['acked']} acknowledged, no send failed")


@pytest.mark.slow
def test_a_frozen_owner_writes_nothing_visible_after_its_session_expired(cluster):
    others: list[BrokerProcess] = []

    def freeze(owner: BrokerProcess, topic: str) -> None:
        others[:] = [b for b in cluster if b is not owner]
        owner.proc.send_signal(signal.SIGSTOP)
        try:
            # while A is frozen past its session, the bundle moves (a lookup on another broker
            # assigns it once ZooKeeper expired A's session) and another client writes to it
            wait_until(
                lambda: _owner(cluster, topic, via=others[0]) is not owner,
                timeout=30,
                what="the bundle to leave the frozen broker",
            )
            other = _client(others)
            try:
                producer = other.create_producer(topic, producer_name="during-freeze")
                producer.send(b"x-during-freeze")
                producer.close()
            finally:
                other.close()
        finally:
            owner.proc.send_signal(signal.SIGCONT)

    got = _failover(cluster, freeze)
    assert got["new_owner"] in others
    assert got["others"] == [b"x-during-freeze"]
    # the resumed broker knows it lost the bundle: it sends clients elsewhere
    assert _owner(cluster, got["topic"], via=got["owner"]) is got["new_owner"]
    print(f"SIGSTOP: first publish {got['first_publish_s']:.2f} s after the freeze began")


@pytest.mark.slow
def test_chaos_kills_freezes_and_unloads_lose_nothing(cluster):
    """For ~45 s, every few seconds a random broker is killed (and started again), frozen past
    its session timeout (and resumed), or a random bundle is unloaded, while one producer per
    topic publishes to 6 topics in 2 namespaces of 2 bundles each. At the end every topic is
    served, and each holds every acknowledged message once, in order."""
    import random

    rng = random.Random(26)
    namespaces = []
    for _ in range(2):
        ns = f"public/chaos{uuid.uuid4().hex[:6]}"
        ok(rest(cluster[0], "PUT", f"/admin/v2/namespaces/{ns}", {"bundles": {"numBundles": 2}}))
        namespaces.append(ns)
    topics = [f"persistent://{namespaces[i % 2]}/t{i}" for i in range(6)]
    client = _client(cluster)
    pubs = [Publisher(client, t) for t in topics]
    for p in pubs:
        p.start()
    actions = []
    try:
        deadline = time.monotonic() + 45
        while time.monotonic() < deadline:
            time.sleep(rng.uniform(2, 5))
            victim = rng.choice(cluster)
            action = rng.choice(["kill", "freeze", "unload"])
            actions.append(action)
            if action == "kill":
                victim.stop(signal.SIGKILL)
                time.sleep(1)
                victim.start()
            elif action == "freeze":
                victim.proc.send_signal(signal.SIGSTOP)
                time.sleep(SESSION_TIMEOUT_MS / 1000 + 1)
                victim.proc.send_signal(signal.SIGCONT)
            else:
                ns = rng.choice(namespaces)
                bundle = rng.choice(["0x00000000_0x80000000", "0x80000000_0xffffffff"])
                rest(victim, "PUT", f"/admin/v2/namespaces/{ns}/{bundle}/unload")  # 307 when not its
        counts = [len(p.acked) for p in pubs]
        wait_until(
            lambda: all(len(p.acked) > c + 5 for p, c in zip(pubs, counts)),
            timeout=90,
            what="every topic served after the chaos",
        )
    finally:
        for p in pubs:
            p.stop()
    for p, t in zip(pubs, topics):
        whole = _read_whole_topic(client, t) if p.acked else []
        assert len(whole) == len(set(whole)), f"{t}: a message is in the topic twice"
        assert whole == sorted(whole), f"{t}: messages out of order"
        missing = set(p.acked) - set(whole)
        assert not missing, f"{t}: {len(missing)} acknowledged message(s) lost: {sorted(missing)[:10]}"
        assert p.failed == [], p.failed[:3]
    client.close()
    print(f"chaos: {actions}, {sum(len(p.acked) for p in pubs)} acknowledged, none lost or repeated")


def _compact_on_owner(brokers: list[BrokerProcess], topic: str) -> tuple[BrokerProcess, dict]:
    """``PUT .../compaction`` on the owner (urllib follows a 307 for GET only, so the PUT goes
    to the owner found by lookup), then ``GET .../compaction`` until the run ended."""
    local = topic.split("://", 1)[1]
    owner = _owner(brokers, topic)
    ok(rest(owner, "PUT", f"/admin/v2/persistent/{local}/compaction"))
    status = wait_until(
        lambda: (
            (s := ok(rest(owner, "GET", f"/admin/v2/persistent/{local}/compaction")))["status"]
            in ("SUCCESS", "ERROR")
            and s
        ),
        timeout=300,
        what=f"the compaction of {topic} on {owner.web_port} to end",
    )
    return owner, status


def _send_keyed(producer, items: list[tuple[str, bytes]], sent: list[tuple[str, bytes]]) -> None:
    """Send each (key, value) and record it in ``sent`` once acknowledged; b"" is a tombstone."""
    for key, value in items:
        producer.send(value, partition_key=key)
        sent.append((key, value))


def _latest(sent: list[tuple[str, bytes]]) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for key, value in sent:
        if value == b"":
            out.pop(key, None)
        else:
            out[key] = value
    return out


@pytest.mark.slow
def test_compaction_continues_on_the_new_owner_after_a_sigkill(cluster, spark_in_broker):
    """Keyed messages (tombstones among them) compacted on A, A killed, more keyed messages sent
    through the failed-over producer and compacted again on the new owner: a read-compacted reader
    and a TableView hold exactly the latest acknowledged value of each key, tombstoned keys absent."""
    client = _client(cluster)
    topic = f"persistent://{_namespace(cluster)}/kv"
    producer = client.create_producer(
        topic, producer_name=f"kv-{uuid.uuid4().hex[:6]}", send_timeout_millis=60000, batching_enabled=False
    )
    sent: list[tuple[str, bytes]] = []
    try:
        before = [(f"k{i}", b"a%d-%d" % (r, i)) for r in range(3) for i in range(10)]
        _send_keyed(producer, before + [("k3", b""), ("k7", b"")], sent)
        owner, first = _compact_on_owner(cluster, topic)
        assert first["status"] == "SUCCESS", first
        owner.stop(signal.SIGKILL)
        after = [(f"k{i}", b"b%d-%d" % (r, i)) for r in range(2) for i in range(0, 12, 2)]
        _send_keyed(producer, after + [("k2", b""), ("k3", b"back-3")], sent)
    finally:
        producer.close()
    new_owner, second = _compact_on_owner(cluster, topic)
    assert new_owner is not owner
    assert second["status"] == "SUCCESS", second
    want = _latest(sent)
    assert "k2" not in want and "k7" not in want and want["k3"] == b"back-3"  # the scenario is the one meant
    reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
    try:
        got = []
        while reader.has_message_available():
            got.append(reader.read_next(timeout_millis=20000))
    finally:
        reader.close()
    # the whole topic is compacted now: one message per live key, no tombstone, no older value
    assert sorted((m.partition_key(), m.data()) for m in got) == sorted(want.items())
    view = client.create_table_view(topic)
    try:
        table: dict[str, bytes] = {}
        view.for_each(lambda k, v: table.__setitem__(k, v))
        assert table == want
    finally:
        view.close()
    client.close()
    owner.start()  # back for the next scenario
