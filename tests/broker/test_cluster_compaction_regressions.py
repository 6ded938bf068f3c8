"""Pulsar's compaction-with-failover regressions on two brokers, ZooKeeper and SeaweedFS.

The single-broker versions (``tests/compaction/test_failover_regressions.py``) move a topic by
unloading and reloading it on the same broker. Here the topic really moves: two broker processes
share a ZooKeeper and a SeaweedFS bucket (``objectLedgerStorageUrl``: ledgers and compacted views
in the object store), each scenario has a namespace of one bundle, and a move is Pulsar's bundle
unload with ``destinationBroker``. The brokers compact with the default service (Spark in the
broker, ``local[1]``) through ``gated_compaction``, which can hold a run at a named point of the
runner, so a run certainly straddles a move. Clients are the official ``pulsar-client`` given
both brokers in one service URL, and the admin REST API.

* apache/pulsar#21074 -- a topic unloaded during compaction: a run held after its parts are in the
  object store while the bundle moves; it must neither commit nor leave objects behind, the new
  owner compacts, and a subscription loses and repeats nothing.
* apache/pulsar#25118 -- a broker closing (SIGTERM) during phase two: on the new owner the view,
  its horizon and the ``__compaction`` hold are those of one commit, never an older position.
* apache/pulsar#12698 -- compaction properties kept across a move: a reset of ``__compaction`` on
  the new owner loses neither the horizon nor a compacted key.
* apache/pulsar#25294 -- a read-compacted reader part-way through the view when the topic moves
  resumes inside the view on the new owner: nothing skipped, nothing read twice.
* apache/pulsar#26486 -- the view never moves backwards across a reload: a run that straddles a
  move cannot commit its older view over the new owner's newer one, and the view read after each
  move is the last one committed.

Every test here starts Spark in a broker (a JVM per broker process), so all are ``slow``.
"""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import pytest

pulsar = pytest.importorskip("pulsar")

from compactmq.storage.topic_paths import topic_relpath  # noqa: E402
from harness.broker import drain_acked  # noqa: E402
from harness.wait import wait_until  # noqa: E402
from storage.metadata_store.zk_server import zookeeper  # noqa: E402,F401  (tests/ is on sys.path)

from .conftest import BrokerProcess, make_client  # noqa: E402
from .gated_compaction import GATE_DIR_ENV  # noqa: E402
from .rest import ok, rest  # noqa: E402
from .test_cluster import service_url, start_cluster  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.spark]

GATED_FACTORY = "tests.broker.gated_compaction.GatedSparkCompactionServiceFactory"
BUCKET = "cluster-compaction-regressions"
WHOLE_BUNDLE = "0x00000000_0xffffffff"
KEYS = 6


class Cluster:
    def __init__(self, brokers: list[BrokerProcess], gate_dir: Path, seaweedfs, bucket: str, prefix: str):
        self.brokers = brokers
        self.gate_dir = gate_dir
        self.seaweedfs = seaweedfs
        self.bucket = bucket
        self.prefix = prefix

    def client(self):
        return make_client(
            service_url(self.brokers), connection_timeout_ms=2000, operation_timeout_seconds=30
        )

    def owner(self, topic: str, via: BrokerProcess | None = None) -> BrokerProcess:
        """The owner of ``topic``'s bundle by HTTP lookup (asked of ``via``, else a live broker)."""
        local = topic.split("://", 1)[1]
        asker = via or next(b for b in self.brokers if b.alive())
        port = urlsplit(ok(rest(asker, "GET", f"/lookup/v2/topic/persistent/{local}"))["httpUrl"]).port
        return next(b for b in self.brokers if b.web_port == port)

    def other(self, broker: BrokerProcess) -> BrokerProcess:
        return next(b for b in self.brokers if b is not broker)

    def move(self, topic: str, to: BrokerProcess) -> None:
        """Unload the topic's bundle (one per namespace here) with ``destinationBroker=to``."""
        ns = topic.split("://", 1)[1].rsplit("/", 1)[0]
        owner = self.owner(topic)
        assert owner is not to, "already there"
        dest = f"127.0.0.1:{to.web_port}"
        ok(rest(owner, "PUT", f"/admin/v2/namespaces/{ns}/{WHOLE_BUNDLE}/unload?destinationBroker={dest}"))
        wait_until(lambda: self.owner(topic) is to, 30, f"the bundle of {topic} on {to.web_port}")

    # --- the gate of gated_compaction ---------------------------------------------------------

    def close_gate(self, point: str) -> None:
        for f in [*self.gate_dir.glob("reached-*"), *self.gate_dir.glob("ended-*")]:
            f.unlink()
        (self.gate_dir / "closed").write_text(point)

    def open_gate(self) -> None:
        (self.gate_dir / "closed").unlink(missing_ok=True)

    def wait_held(self, broker: BrokerProcess) -> None:
        reached = self.gate_dir / f"reached-{broker.proc.pid}"
        wait_until(reached.exists, 240, f"a run on {broker.web_port} to reach the gate")

    def wait_ended(self, broker: BrokerProcess, pid: int) -> str:
        """The outcome of the held run of ``broker`` (process ``pid``), once it is over."""
        ended = self.gate_dir / f"ended-{pid}"
        wait_until(ended.exists, 120, f"the held run on {broker.web_port} to end")
        return ended.read_text()

    # --- the object store ---------------------------------------------------------------------

    def view_objects(self, topic: str) -> set[str]:
        """The keys of ``topic``'s view objects in the bucket, relative to its directory there."""
        base = f"{self.prefix}/compacted/{topic_relpath(topic).replace(os.sep, '/')}/"
        return {k[len(base) :] for k in self.seaweedfs.keys(self.bucket, base)}

    def view_dirs(self, topic: str) -> set[str]:
        """The view directories (``<id>-<uuid>``) of ``topic`` in the bucket: one per view of
        the parts layout, one per chain (named by its first view) of chained views."""
        return {k.split("/", 1)[0] for k in self.view_objects(topic)}

    def only_view(self, topic: str, view_id: int) -> bool:
        """Whether the bucket holds view ``view_id``'s objects and no other view's: one
        directory, and in it the one chain manifest of that view (a chain: earlier views of
        the chain leave their segments to it, not their manifests), or the directory of that
        view (parts)."""
        objects = self.view_objects(topic)
        dirs = {k.split("/", 1)[0] for k in objects}
        if len(dirs) != 1:
            return False
        (only,) = dirs
        manifests = sorted(k for k in objects if k.endswith(".chain"))
        if manifests:
            return manifests == [f"{only}/{view_id:012d}.chain"]
        return only.split("-")[0] == f"{view_id:012d}"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, zookeeper, seaweedfs):  # noqa: F811
    bucket = seaweedfs.create_bucket(BUCKET)
    prefix = uuid.uuid4().hex[:10]
    url = f"s3://{bucket}/{prefix}?region=us-east-1&endpoint={seaweedfs.endpoint}"
    gate_dir = tmp_path_factory.mktemp("gate")
    mp = pytest.MonkeyPatch()
    mp.setenv(GATE_DIR_ENV, str(gate_dir))  # the broker subprocesses (and restarts) inherit it
    brokers = start_cluster(
        tmp_path_factory,
        zookeeper,
        n=2,
        objectLedgerStorageUrl=url,
        metadataStoreSessionTimeoutMillis="3000",
        compactionServiceFactoryClassName=GATED_FACTORY,
        brokerServiceCompactionMonitorIntervalInSeconds="0",  # only the runs a test triggers
        managedLedgerDefaultMarkDeleteRateLimit="0",  # every ack written
        **{"spark.master": "local[1]"},
    )
    yield Cluster(brokers, gate_dir, seaweedfs, bucket, prefix)
    (gate_dir / "closed").unlink(missing_ok=True)
    for b in brokers:
        b.stop(signal.SIGKILL)
    mp.undo()


@pytest.fixture
def topic(cluster):
    ns = f"public/cr{uuid.uuid4().hex[:8]}"
    ok(rest(cluster.brokers[0], "PUT", f"/admin/v2/namespaces/{ns}", {"bundles": {"numBundles": 1}}))
    return f"persistent://{ns}/t"


@pytest.fixture
def client(cluster):
    c = cluster.client()
    yield c
    c.close()


def local(topic: str) -> str:
    return topic.split("://", 1)[1]


def published(n: int, prefix: str = "v", keys: int = KEYS) -> list[tuple[str, bytes]]:
    return [(f"k{i % keys}", f"{prefix}{i}".encode()) for i in range(n)]


def send(client, topic: str, items: list[tuple[str, bytes]]) -> None:
    producer = client.create_producer(topic, batching_enabled=False, send_timeout_millis=60000)
    try:
        for key, value in items:
            producer.send(value, partition_key=key)
    finally:
        producer.close()


def latest(items: list[tuple[str, bytes]]) -> dict[str, bytes]:
    return dict(items)


def read_compacted(client, topic: str) -> list[tuple[str, bytes]]:
    reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
    out = []
    try:
        while reader.has_message_available():
            msg = reader.read_next(20000)
            out.append((msg.partition_key(), msg.data()))
    finally:
        reader.close()
    return out


def trigger(cluster: Cluster, topic: str, via: BrokerProcess | None = None) -> BrokerProcess:
    """``PUT .../compaction`` on the owner (urllib follows a 307 for GET only)."""
    owner = cluster.owner(topic, via)
    ok(rest(owner, "PUT", f"/admin/v2/persistent/{local(topic)}/compaction"))
    return owner


def status(cluster: Cluster, topic: str, via: BrokerProcess | None = None) -> dict:
    return ok(rest(cluster.owner(topic, via), "GET", f"/admin/v2/persistent/{local(topic)}/compaction"))


def compact(cluster: Cluster, topic: str, via: BrokerProcess | None = None) -> dict:
    """A run on the owner (found by asking ``via``), to its end; it must succeed."""
    trigger(cluster, topic, via)
    body = wait_until(
        lambda: (s := status(cluster, topic, via))["status"] in ("SUCCESS", "ERROR") and s,
        300,
        f"the compaction of {topic} to end",
    )
    assert body["status"] == "SUCCESS", body
    return body


def internal_stats(cluster: Cluster, topic: str, via: BrokerProcess | None = None) -> dict:
    return ok(rest(cluster.owner(topic, via), "GET", f"/admin/v2/persistent/{local(topic)}/internalStats"))


def position(text) -> tuple[int, int]:
    assert text, f"no position: {text!r}"
    ledger, entry = text.split(":")[:2]
    return int(ledger), int(entry)


def view_of(cluster: Cluster, topic: str, via: BrokerProcess | None = None) -> tuple[int, tuple[int, int]]:
    """(compacted ledger id, horizon) as the owner reports them."""
    stats = internal_stats(cluster, topic, via)
    return int(stats["compactedLedger"]["ledgerId"]), position(stats["compactionHorizon"])


def backlog(cluster: Cluster, topic: str, sub: str) -> int:
    stats = ok(rest(cluster.owner(topic), "GET", f"/admin/v2/persistent/{local(topic)}/stats"))
    return int(stats["subscriptions"][sub]["msgBacklog"])


# --- apache/pulsar#21074 ------------------------------------------------------------------------


def test_topic_moved_during_compaction_commits_nothing_and_loses_nothing(cluster, client, topic):
    consumer = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Exclusive)
    before = published(300)
    send(client, topic, before)
    assert drain_acked(consumer, 3000) == [v for _, v in before]
    wait_until(lambda: backlog(cluster, topic, "sub") == 0, 30, "every acknowledgement persisted")
    a = cluster.owner(topic)
    b = cluster.other(a)
    cluster.close_gate("before-commit")  # its view is in the object store, not yet committed
    try:
        trigger(cluster, topic)
        cluster.wait_held(a)
        held = cluster.view_objects(topic)
        assert len(cluster.view_dirs(topic)) == 1, held  # the held run's upload, the topic's first view
        cluster.move(topic, b)
        after = published(12, "after", keys=3)  # k0..k2 only: k3..k5 keep their last value
        send(client, topic, after)
        # the subscription goes on on B: the new messages, once, none of those acknowledged on A
        assert drain_acked(consumer, 3000) == [v for _, v in after]
    finally:
        cluster.open_gate()  # A's run goes on under an ownership it lost
    # it must not commit (the fence) and must not leave its objects behind
    wait_until(lambda: not (cluster.view_objects(topic) & held), 60, "the deposed run's objects deleted")
    assert cluster.owner(topic) is b
    body = status(cluster, topic)
    assert body["status"] != "SUCCESS", body  # nothing committed on B's topic by A
    compact(cluster, topic)  # the new owner compacts everything
    view_id, _ = view_of(cluster, topic)
    assert cluster.only_view(topic, view_id), cluster.view_objects(topic)
    assert latest(read_compacted(client, topic)) == latest(before + after)
    assert drain_acked(consumer, 1500) == []  # no redelivery loop
    consumer.close()


# --- apache/pulsar#25118 ------------------------------------------------------------------------


def test_owner_closing_in_phase_two_never_moves_the_view_or_the_hold_back(cluster, client, topic):
    first = published(24)
    send(client, topic, first)
    compact(cluster, topic)
    view1, horizon1 = view_of(cluster, topic)
    second = published(12, "second")
    send(client, topic, second)
    a = cluster.owner(topic)
    b = cluster.other(a)
    cluster.close_gate("before-commit")  # phase two done, its view uploaded, before the commit
    try:
        trigger(cluster, topic)
        cluster.wait_held(a)
        a.proc.send_signal(signal.SIGTERM)  # a graceful close: it hands its bundles back first
        wait_until(lambda: cluster.owner(topic, via=b) is b, 60, "the bundle on the other broker")
    finally:
        cluster.open_gate()
    assert a.stop() == 0  # a clean exit
    try:
        stats = internal_stats(cluster, topic)
        view, horizon = int(stats["compactedLedger"]["ledgerId"]), position(stats["compactionHorizon"])
        if view != view1:  # the run committed before A lost the bundle: a newer view
            assert horizon > horizon1
        else:
            assert horizon == horizon1
        # the hold is where the commit in force put it: never an older position
        assert position(stats["cursors"]["__compaction"]["markDeletePosition"]) == horizon
        assert latest(read_compacted(client, topic)) == latest(first + second)
        third = published(2, "third", keys=2)
        send(client, topic, third)
        compact(cluster, topic)  # compaction goes on on B
        view3, horizon3 = view_of(cluster, topic)
        assert horizon3 > horizon and view3 != view
        assert latest(read_compacted(client, topic)) == latest(first + second + third)
        wait_until(lambda: cluster.only_view(topic, view3), 60, "only the view in force in the object store")
    finally:
        a.start(timeout=60)


# --- apache/pulsar#12698 ------------------------------------------------------------------------


def test_cursor_reset_on_the_new_owner_keeps_the_horizon_and_every_key(cluster, client, topic):
    first = published(30)
    send(client, topic, first)
    compact(cluster, topic)
    view1, horizon1 = view_of(cluster, topic)
    a = cluster.owner(topic)
    cluster.move(topic, cluster.other(a))
    # what Pulsar's compactor did on a freshly loaded topic: its consumer on ``__compaction``
    # seeks to the earliest position (a cursor reset that dropped the cursor's properties)
    compactor = client.subscribe(topic, "__compaction", consumer_type=pulsar.ConsumerType.Exclusive)
    compactor.seek(pulsar.MessageId.earliest)
    compactor.close()
    assert view_of(cluster, topic) == (view1, horizon1)
    cluster.move(topic, a)  # and back: the first owner reloads it from the stores
    assert view_of(cluster, topic) == (view1, horizon1)
    late = published(3, "late", keys=3)  # k0..k2 change; k3..k5 live only in the view
    send(client, topic, late)
    compact(cluster, topic)
    got = read_compacted(client, topic)
    assert len(got) == KEYS and latest(got) == latest(first + late)


# --- apache/pulsar#25294 ------------------------------------------------------------------------


def test_read_compacted_reader_resumes_on_the_new_owner(cluster, client, topic):
    # 20 keys, three values each, then a fourth for every other key: the view is not a suffix of
    # the topic (a reader that left the view for the topic would read superseded values)
    history = [(f"k{i % 20}", f"v{i}".encode()) for i in range(60)]
    history += [(f"k{i}", f"w{i}".encode()) for i in range(0, 20, 2)]
    send(client, topic, history)
    compact(cluster, topic)
    # a small queue: the reader has not prefetched the view when the topic moves
    reader = client.create_reader(
        topic, pulsar.MessageId.earliest, is_read_compacted=True, receiver_queue_size=2
    )
    try:
        first = [reader.read_next(20000) for _ in range(8)]  # part-way through the compacted view
        cluster.move(topic, cluster.other(cluster.owner(topic)))
        new = [(f"k{i}", f"new{i}".encode()) for i in range(5)]
        send(client, topic, new)
        rest_ = []
        while reader.has_message_available():
            rest_.append(reader.read_next(20000))
    finally:
        reader.close()
    got = [(m.partition_key(), m.data()) for m in first + rest_]
    order = {value: i for i, (_, value) in enumerate(history)}
    view = sorted(latest(history).items(), key=lambda kv: order[kv[1]])
    assert got == view + new  # the rest of the view, then the new messages: no skip, no repeat


# --- apache/pulsar#26486 ------------------------------------------------------------------------


def test_view_never_moves_backwards_across_moves_and_a_straddling_run(cluster, client, topic):
    history = published(24)
    send(client, topic, history)
    compact(cluster, topic)
    assert latest(read_compacted(client, topic)) == latest(history)  # A has the first view open
    more = published(12, "more")
    send(client, topic, more)
    history += more
    a = cluster.owner(topic)
    b = cluster.other(a)
    before = cluster.view_objects(topic)
    cluster.close_gate("before-commit")
    try:
        trigger(cluster, topic)  # A's run holds a view of everything so far, not yet committed
        cluster.wait_held(a)
        held = cluster.view_objects(topic) - before  # its upload (a chain's: beside the view's)
        assert held
        cluster.move(topic, b)
        newer = published(6, "newer")
        send(client, topic, newer)
        history += newer
        cluster.close_gate("never")  # B's runs pass; A's stays where it is
        compact(cluster, topic)  # B's view: newer than anything A's held run can commit
        view_b, horizon_b = view_of(cluster, topic)
    finally:
        cluster.open_gate()  # A's run goes on and tries its commit
    # A's older view is never committed over B's (nor left in the store)
    wait_until(lambda: not (cluster.view_objects(topic) & held), 60, "the deposed run's objects deleted")
    assert view_of(cluster, topic) == (view_b, horizon_b)
    assert latest(read_compacted(client, topic)) == latest(history)
    cluster.move(topic, a)  # a reload on the first owner: the same view, never an older one
    assert view_of(cluster, topic) == (view_b, horizon_b)
    assert latest(read_compacted(client, topic)) == latest(history)
    assert cluster.only_view(topic, view_b), cluster.view_objects(topic)


# --- failover with compaction: an unload, a freeze past the session ---------------------------


def read_table(client, topic: str) -> dict[str, bytes]:
    view = client.create_table_view(topic)
    try:
        table: dict[str, bytes] = {}
        view.for_each(lambda k, v: table.__setitem__(k, v))
        return table
    finally:
        view.close()


def live(items: list[tuple[str, bytes]]) -> dict[str, bytes]:
    """Keep-latest with tombstones (b"" deletes the key)."""
    out: dict[str, bytes] = {}
    for key, value in items:
        if value == b"":
            out.pop(key, None)
        else:
            out[key] = value
    return out


def compaction_goes_on_after(cluster: Cluster, client, topic: str, move) -> None:
    """Keyed messages (tombstones among them) compacted on A; a second run held on A after its
    view is uploaded; ``move(a, b)`` hands the topic to B; more keyed messages through the
    client ``move`` answers; the gate opens (A's run goes on under an ownership it lost); B compacts.
    Then B's view is in force and alone in the store, and a read-compacted reader and a
    TableView hold exactly the latest value of each key."""
    sent = [(f"k{i}", b"a%d-%d" % (r, i)) for r in range(3) for i in range(10)] + [("k3", b""), ("k7", b"")]
    send(client, topic, sent)
    compact(cluster, topic)
    second = [(f"k{i}", b"b-%d" % i) for i in range(0, 10, 3)]
    send(client, topic, second)
    sent += second
    a = cluster.owner(topic)
    b = cluster.other(a)
    before = cluster.view_objects(topic)
    cluster.close_gate("before-commit")
    try:
        trigger(cluster, topic)
        cluster.wait_held(a)
        held = cluster.view_objects(topic) - before  # the held run's upload
        assert held
        sender = move(a, b)  # the client to send with while A is away
        third = [(f"k{i}", b"c-%d" % i) for i in range(0, 12, 2)] + [("k2", b""), ("k3", b"back-3")]
        send(sender, topic, third)
        sent += third
    finally:
        cluster.open_gate()
    a.proc.send_signal(signal.SIGCONT)  # (a no-op unless it was frozen)
    outcome = cluster.wait_ended(a, a.proc.pid)
    assert outcome != "ok", "the deposed broker's run committed"
    assert cluster.owner(topic, via=b) is b
    compact(cluster, topic, via=b)  # compaction goes on on the new owner (and sweeps what A left)
    assert not (cluster.view_objects(topic) & held), "the deposed run's objects are still there"
    view_b, horizon_b = view_of(cluster, topic, via=b)
    want = live(sent)
    assert "k2" not in want and "k7" not in want and want["k3"] == b"back-3"  # the scenario meant
    got = read_compacted(client, topic)
    assert sorted(got) == sorted(want.items())  # one message per live key, no tombstone, no older
    assert read_table(client, topic) == want
    # the deposed broker, running again, has made nothing visible: B's view, alone in the store
    lookup = f"/lookup/v2/topic/persistent/{local(topic)}"
    wait_until(lambda: rest(a, "GET", lookup)[0] == 200, 60, "the resumed broker answering lookups")
    assert cluster.owner(topic, via=a) is b
    assert view_of(cluster, topic, via=a) == (view_b, horizon_b)
    assert cluster.only_view(topic, view_b), cluster.view_objects(topic)


def test_compaction_goes_on_after_an_unload(cluster, client, topic):
    def unload(a: BrokerProcess, b: BrokerProcess) -> None:
        ns = topic.split("://", 1)[1].rsplit("/", 1)[0]
        ok(rest(a, "PUT", f"/admin/v2/namespaces/{ns}/{WHOLE_BUNDLE}/unload"))  # no destination
        wait_until(lambda: cluster.owner(topic, via=b) is b, 30, "the bundle on the other broker")
        return client

    compaction_goes_on_after(cluster, client, topic, unload)


def test_compaction_goes_on_after_the_owner_froze_past_its_session(cluster, client, topic):
    clients = []

    def freeze(a: BrokerProcess, b: BrokerProcess):
        a.proc.send_signal(signal.SIGSTOP)  # its ZooKeeper session expires (3 s)
        wait_until(lambda: cluster.owner(topic, via=b) is b, 60, "the bundle to leave the frozen broker")
        # a lookup on the frozen broker would hang: while it is frozen, send through B alone
        clients.append(make_client(b.url, operation_timeout_seconds=30))
        return clients[0]

    try:
        compaction_goes_on_after(cluster, client, topic, freeze)
    finally:
        for c in clients:
            c.close()
