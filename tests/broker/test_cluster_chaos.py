"""Chaos: three brokers killed, frozen and unloaded at random while 10 producers, 10 consumers and
the compaction monitor work on 30 topics (issue 26's "Done when").

The cluster is the one of ``test_cluster_failover``: three broker processes over one SeaweedFS
bucket (``objectLedgerStorageUrl``) and a real ZooKeeper with a 3 s session timeout,
deduplication on, every ack persisted, retention unlimited (so the whole topic can be read back at
the end). 30 topics live in 3 namespaces of 4 bundles each, so bundles -- and the topics in them --
move independently.

While the chaos runs
--------------------
* 10 producer threads; thread ``n`` owns topics ``3n .. 3n+2`` and publishes keyed messages
  round-robin over them, one producer per topic (a fixed producer name, so deduplication lets
  the client's retries after a failover land once). Every 17th message is a tombstone (empty
  payload). A message carries its thread-wide index in the property ``i``; only the sends the
  broker acknowledged are recorded, as (index, key, value).
* 10 consumer threads, one per producer thread, each subscribed to its 3 topics with one
  multi-topic consumer (even threads Shared, odd ones Failover), acknowledging each message and
  recording which indexes arrived.
* The compaction monitor compacts: each namespace has a ``compactionThreshold`` policy of a few
  kilobytes and the monitor checks every few seconds.
* Every 2-5 s (a ``random.Random`` seeded from ``COMPACTMQ_CHAOS_SEED`` or at random, the seed
  printed) a random broker is SIGKILLed and started again, or SIGSTOPped past its session
  timeout and SIGCONTed, or asked to unload a random bundle (a 307 when it is not the owner:
  harmless). The run lasts ``COMPACTMQ_CHAOS_SECONDS`` (180 s by default).

What must hold afterwards
-------------------------
* every topic is served: a publish succeeds on each;
* every consumer received every acknowledged message of its topics (redeliveries after a
  failover are allowed: Pulsar consumers are at-least-once);
* each topic holds each acknowledged message exactly once, in the order its producer sent it,
  with entry ids running from 0 in each ledger and ledger ids only growing;
* after a manual ``PUT .../compaction`` on each topic's owner, a read-compacted reader's view
  (key -> value) equals the reference compaction of the topic's whole content read back
  (``compaction.strategies.fold`` with keep-latest, the model the engine parity tests use).

Compaction engine: Spark in each broker with ``spark.master=local[1]`` (one core of two), the
lightest real engine a cluster broker can use. The in-process engine (``compactionInProcessMaxBytes``,
no JVM) would be lighter, but it takes only plans whose files it can measure on local disk
(``compaction.jobs.inprocess.plan_bytes``), and in cluster mode a plan reads the ledgers from the
object store, so every run is a Spark job; a first run here with the in-process engine enabled
confirmed it (all runs had a Spark job). The brokers start Spark only at their first compaction
(``compactionSparkWarmup=false``, the harness default). The test prints which engine committed the
final runs (``lastCompactionJob``: empty for the in-process engine).

Marked ``slow`` (minutes): run it before each stop with
``COMPACTMQ_CHAOS_SECONDS=180 pytest -m slow tests/broker/test_cluster_chaos.py``.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
import uuid
from collections import Counter

import pytest

pulsar = pytest.importorskip("pulsar")

from compactmq.broker.cluster.bundles import boundaries_for  # noqa: E402
from compactmq.compaction.strategies import KeepLatestStrategy, Message, fold  # noqa: E402
from harness.wait import wait_until  # noqa: E402
from storage.metadata_store.zk_server import zookeeper  # noqa: E402,F401  (tests/ is on sys.path)

from .conftest import BrokerProcess  # noqa: E402
from .rest import ok, rest  # noqa: E402
from .test_cluster import start_cluster  # noqa: E402
from .test_cluster_failover import SESSION_TIMEOUT_MS, _client, _compact_on_owner, _owner  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DURATION_S = float(os.environ.get("COMPACTMQ_CHAOS_SECONDS") or 180)
SEED = int(os.environ.get("COMPACTMQ_CHAOS_SEED") or random.SystemRandom().randrange(2**32))
BUCKET = "cluster-chaos"
THREADS = 10
TOPICS_PER_THREAD = 3
NAMESPACES = 3
BOUNDARIES = boundaries_for(4)
BUNDLES = [f"0x{lo:08x}_0x{hi:08x}" for lo, hi in zip(BOUNDARIES, BOUNDARIES[1:])]
KEYS = 23  # per topic: values are overwritten many times, so compaction removes most entries
THRESHOLD_BYTES = 2 * 1024  # a topic takes ~1 KB a few seconds: the monitor compacts during the chaos
SEND_PAUSE_S = 0.01


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, zookeeper, seaweedfs):  # noqa: F811
    bucket = seaweedfs.create_bucket(BUCKET)
    url = f"s3://{bucket}/{uuid.uuid4().hex[:10]}?region=us-east-1&endpoint={seaweedfs.endpoint}"
    brokers = start_cluster(
        tmp_path_factory,
        zookeeper,
        objectLedgerStorageUrl=url,
        metadataStoreSessionTimeoutMillis=str(SESSION_TIMEOUT_MS),
        brokerDeduplicationEnabled="true",
        managedLedgerDefaultMarkDeleteRateLimit="0",
        defaultRetentionTimeInMinutes="-1",  # nothing trimmed: the topic is read back whole
        defaultRetentionSizeInMB="-1",
        brokerServiceCompactionMonitorIntervalInSeconds="5",
        **{"spark.master": "local[1]"},
    )
    yield brokers
    for b in brokers:
        if b.proc is not None and b.proc.poll() is None:
            b.proc.send_signal(signal.SIGCONT)
        b.stop(signal.SIGKILL)


def _prop_index(msg) -> int | None:
    raw = msg.properties().get("i")
    return int(raw) if raw is not None else None


class KeyedProducers(threading.Thread):
    """Publishes keyed messages round-robin over its topics, one synchronous send at a time;
    ``acked[topic]`` lists (index, key, value) of the sends the broker acknowledged."""

    def __init__(self, client, n: int, topics: list[str]) -> None:
        super().__init__(daemon=True, name=f"producers-{n}")
        self.n = n
        self.topics = topics
        self.producers = {
            t: client.create_producer(
                t,
                producer_name=f"chaos-{n}-{j}-{uuid.uuid4().hex[:6]}",
                send_timeout_millis=60000,
                batching_enabled=False,
            )
            for j, t in enumerate(topics)
        }
        self.acked: dict[str, list[tuple[int, str, bytes]]] = {t: [] for t in topics}
        self.failed: list[tuple[str, int, str]] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        i = 0
        while not self.stopping.is_set():
            topic = self.topics[i % len(self.topics)]
            key = f"k{(i * 7 + self.n) % KEYS}"
            value = b"" if i % 17 == 16 else b"v%d-%d" % (self.n, i)
            try:
                self.producers[topic].send(value, partition_key=key, properties={"i": str(i)})
                self.acked[topic].append((i, key, value))
            except Exception as exc:  # noqa: BLE001 - recorded; the checks decide
                self.failed.append((topic, i, repr(exc)))
            i += 1
            time.sleep(SEND_PAUSE_S)

    def stop(self) -> None:
        self.stopping.set()
        self.join(120)
        assert not self.is_alive(), f"producer thread {self.n} is stuck"
        for p in self.producers.values():
            p.close()


class Consuming(threading.Thread):
    """One multi-topic consumer on ``topics`` acknowledging every message; ``got[topic]`` counts
    the indexes received (a redelivery counts again)."""

    def __init__(self, client, n: int, topics: list[str]) -> None:
        super().__init__(daemon=True, name=f"consumer-{n}")
        kind = pulsar.ConsumerType.Shared if n % 2 == 0 else pulsar.ConsumerType.Failover
        self.consumer = client.subscribe(
            topics,
            f"chaos-sub-{n}",
            consumer_type=kind,
            initial_position=pulsar.InitialPosition.Earliest,
            receiver_queue_size=50,
        )
        self.topics = topics
        self.got: dict[str, Counter] = {t: Counter() for t in topics}
        self.errors = 0
        self.stopping = threading.Event()

    def _topic_of(self, msg) -> str:
        name = msg.topic_name()
        return next(t for t in self.topics if name == t or t.endswith("/" + name.rsplit("/", 1)[-1]))

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                msg = self.consumer.receive(timeout_millis=1000)
            except pulsar.Timeout:
                continue
            except Exception:  # noqa: BLE001 - a reconnect under way: try again
                self.errors += 1
                time.sleep(0.2)
                continue
            index = _prop_index(msg)
            if index is not None:
                self.got[self._topic_of(msg)][index] += 1
            try:
                self.consumer.acknowledge(msg)
            except Exception:  # noqa: BLE001 - redelivered later: at-least-once
                self.errors += 1

    def missing(self, acked: dict[str, list[tuple[int, str, bytes]]]) -> dict[str, list[int]]:
        out = {}
        for t in self.topics:
            lost = [i for i, _, _ in acked[t] if self.got[t][i] == 0]
            if lost:
                out[t] = lost
        return out

    def stop(self) -> None:
        self.stopping.set()
        self.join(30)
        assert not self.is_alive(), "a consumer thread is stuck"
        self.consumer.close()


class CompactionWatch(threading.Thread):
    """Polls each topic's ``compaction`` stats; ``runs[topic]`` collects the distinct
    ``lastCompactionSucceedTimestamp`` values seen (a lower bound of the runs committed)."""

    def __init__(self, brokers: list[BrokerProcess], topics: list[str], down: set) -> None:
        super().__init__(daemon=True, name="compaction-watch")
        self.brokers, self.topics, self.down = brokers, topics, down
        self.runs: dict[str, set[int]] = {t: set() for t in topics}
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(3):
            for t in self.topics:
                self.poll(t)

    def poll(self, topic: str) -> None:
        up = [b for b in self.brokers if b not in self.down and b.alive()]
        if not up:
            return
        try:
            status, body = rest(
                random.choice(up), "GET", f"/admin/v2/persistent/{topic.split('://', 1)[1]}/stats"
            )
        except Exception:  # noqa: BLE001 - the owner frozen or gone: next round
            return
        if status == 200 and isinstance(body, dict):
            ts = (body.get("compaction") or {}).get("lastCompactionSucceedTimestamp") or 0
            if ts:
                self.runs[topic].add(ts)

    def stop(self) -> None:
        self.stopping.set()
        self.join(120)


def _setup_topics(brokers: list[BrokerProcess]) -> tuple[list[str], list[str]]:
    namespaces = []
    for _ in range(NAMESPACES):
        ns = f"public/chaos{uuid.uuid4().hex[:6]}"
        ok(rest(brokers[0], "PUT", f"/admin/v2/namespaces/{ns}", {"bundles": {"numBundles": len(BUNDLES)}}))
        ok(rest(brokers[0], "POST", f"/admin/v2/namespaces/{ns}/compactionThreshold", THRESHOLD_BYTES))
        namespaces.append(ns)
    topics = [f"persistent://{namespaces[i % NAMESPACES]}/t{i}" for i in range(THREADS * TOPICS_PER_THREAD)]
    return namespaces, topics


class Chaos:
    """The random actions, one at a time; ``down`` holds the broker being killed or frozen."""

    def __init__(self, brokers: list[BrokerProcess], namespaces: list[str], rng: random.Random) -> None:
        self.brokers, self.namespaces, self.rng = brokers, namespaces, rng
        self.down: set = set()
        self.actions: Counter = Counter()
        self.log: list[str] = []

    def step(self) -> None:
        victim = self.rng.choice(self.brokers)
        action = self.rng.choice(["kill", "freeze", "unload"])
        self.actions[action] += 1
        self.log.append(f"{action}:{victim.web_port}")
        if action == "kill":
            self.down.add(victim)
            victim.stop(signal.SIGKILL)
            time.sleep(1)
            victim.start(timeout=60)
            self.down.discard(victim)
        elif action == "freeze":
            self.down.add(victim)
            victim.proc.send_signal(signal.SIGSTOP)
            time.sleep(SESSION_TIMEOUT_MS / 1000 + 1)
            victim.proc.send_signal(signal.SIGCONT)
            self.down.discard(victim)
        else:
            ns = self.rng.choice(self.namespaces)
            path = f"/admin/v2/namespaces/{ns}/{self.rng.choice(BUNDLES)}/unload"
            rest(victim, "PUT", path)  # 307 when not its: harmless

    def run(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(self.rng.uniform(2, 5))
            self.step()


def _read_topic(client, topic: str, compacted: bool = False) -> list:
    """Every message of ``topic`` from the earliest position (or the read-compacted view)."""
    reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=compacted)
    out = []
    try:
        while reader.has_message_available():
            out.append(reader.read_next(timeout_millis=20000))
    finally:
        reader.close()
    return out


def _check_topic(topic: str, msgs: list, acked: list[tuple[int, str, bytes]]) -> None:
    """Each acknowledged message once, in order, entry ids without gaps, ledger ids growing."""
    entries: dict[int, list[int]] = {}
    for m in msgs:
        mid = m.message_id()
        entries.setdefault(mid.ledger_id(), []).append(mid.entry_id())
    assert list(entries) == sorted(entries), f"{topic}: ledger ids out of order"
    for ledger, ids in entries.items():
        assert ids == list(range(len(ids))), (
            f"{topic}: ledger {ledger}: entry ids {ids[:5]}... not 0, 1, 2..."
        )
    indexes = [i for i in (_prop_index(m) for m in msgs) if i is not None]
    dup = [i for i, c in Counter(indexes).items() if c > 1]
    assert not dup, f"{topic}: {len(dup)} message(s) in the topic more than once: {sorted(dup)[:10]}"
    assert indexes == sorted(indexes), f"{topic}: messages out of order"
    by_index = {_prop_index(m): m for m in msgs}
    lost = [i for i, _, _ in acked if i not in by_index]
    assert not lost, f"{topic}: {len(lost)} acknowledged message(s) lost: {lost[:10]}"
    for i, key, value in acked:
        m = by_index[i]
        assert (m.partition_key(), m.data()) == (key, value), f"{topic}: message {i} altered"


def _reference_view(msgs: list) -> dict[str, bytes]:
    """The keep-latest reference compaction of a topic's whole content (tombstones delete)."""
    per_key: dict[str, list[Message]] = {}
    for m in msgs:
        mid = m.message_id()
        per_key.setdefault(m.partition_key(), []).append(
            Message(m.partition_key(), m.data(), (mid.ledger_id(), mid.entry_id(), mid.batch_index()))
        )
    out = {}
    for key, values in per_key.items():
        survivor = fold(values, KeepLatestStrategy())
        if survivor is not None:
            out[key] = survivor.payload
    return out


def _compacted_view(msgs: list) -> dict[str, bytes]:
    view: dict[str, bytes] = {}
    for m in msgs:
        if m.data() == b"":  # a tombstone the view retained
            view.pop(m.partition_key(), None)
        else:
            view[m.partition_key()] = m.data()
    return view


def _publish_once_on_each(client, topics: list[str]) -> None:
    """Every topic served: a publish (keyed, so it takes part in the compaction) succeeds."""
    for t in topics:
        producer = client.create_producer(
            t, producer_name=f"served-{uuid.uuid4().hex[:6]}", send_timeout_millis=60000
        )
        try:
            producer.send(b"served", partition_key="served")
        finally:
            producer.close()


def _final_compaction(cluster: list[BrokerProcess], topic: str) -> dict:
    """``_compact_on_owner`` once no monitor run of the topic is under way (the monitor is
    turned off first, but a run it started may still be going: the manual PUT would be a 409)."""
    local = topic.split("://", 1)[1]

    def idle() -> bool:
        status = ok(rest(_owner(cluster, topic), "GET", f"/admin/v2/persistent/{local}/compaction"))
        return status["status"] != "RUNNING"

    wait_until(idle, timeout=300, what=f"the monitor's run on {topic} to end")
    return _compact_on_owner(cluster, topic)[1]


@pytest.mark.timeout(int(DURATION_S) + 1200)  # the chaos, the recovery, the drain, 30 final runs
def test_chaos_with_compaction_loses_nothing_and_compacts_right(cluster, spark_in_broker):
    print(f"chaos seed {SEED}, {DURATION_S:.0f} s (COMPACTMQ_CHAOS_SEED / COMPACTMQ_CHAOS_SECONDS)")
    rng = random.Random(SEED)
    namespaces, topics = _setup_topics(cluster)
    client = _client(cluster)
    groups = [topics[n * TOPICS_PER_THREAD : (n + 1) * TOPICS_PER_THREAD] for n in range(THREADS)]
    consumers = [Consuming(client, n, g) for n, g in enumerate(groups)]
    producers = [KeyedProducers(client, n, g) for n, g in enumerate(groups)]
    chaos = Chaos(cluster, namespaces, rng)
    watch = CompactionWatch(cluster, topics, chaos.down)
    for t in [*consumers, *producers, watch]:
        t.start()
    t0 = time.monotonic()
    try:
        chaos.run(DURATION_S)
        chaos_s = time.monotonic() - t0
        counts = [sum(len(a) for a in p.acked.values()) for p in producers]

        def stalled() -> list[str]:
            return [
                f"thread {p.n} {p.topics}"
                for p, c in zip(producers, counts)
                if sum(len(a) for a in p.acked.values()) <= c + 6
            ]

        try:
            wait_until(lambda: not stalled(), timeout=120, what="every producer acknowledged again")
        except AssertionError:
            raise AssertionError(
                f"producer threads {stalled()} acknowledged 6 or fewer in the 120 s after the chaos (seed {SEED})"
            ) from None
    finally:
        for p in producers:
            p.stop()
    recovery_s = time.monotonic() - t0 - chaos_s
    acked = {t: a for p in producers for t, a in p.acked.items()}
    failed = [f for p in producers for f in p.failed]
    _publish_once_on_each(client, topics)
    try:
        wait_until(
            lambda: not any(c.missing(acked) for c in consumers),
            timeout=180,
            what="every consumer to receive every acknowledged message",
        )
    finally:
        for c in consumers:
            c.stop()
    watch.stop()
    for ns in namespaces:  # the monitor off: the final runs are the manual ones
        ok(rest(cluster[0], "POST", f"/admin/v2/namespaces/{ns}/compactionThreshold", 0))
    wholes = {t: _read_topic(client, t) for t in topics}
    for t in topics:
        _check_topic(t, wholes[t], acked[t])
    # sends that failed (never acknowledged: no loss) are judged last, so that a run failing on
    # them still proves the compacted views too
    engines: Counter = Counter()
    for t in topics:
        whole = wholes[t]
        status = _final_compaction(cluster, t)
        assert status["status"] == "SUCCESS", (t, status)
        stats = ok(rest(_owner(cluster, t), "GET", f"/admin/v2/persistent/{t.split('://', 1)[1]}/stats"))
        engines["spark" if stats["compaction"].get("lastCompactionJob") else "in-process"] += 1
        view = _compacted_view(_read_topic(client, t, compacted=True))
        assert view == _reference_view(whole), f"{t}: the compacted view differs from the reference"
    client.close()
    total = sum(len(a) for a in acked.values())
    redelivered = sum(sum(c.got[t].values()) for c in consumers for t in c.topics) - total
    monitor_runs = sum(len(r) for r in watch.runs.values())
    print(
        f"chaos seed {SEED}: {chaos_s:.0f} s of chaos, every producer acknowledged again "
        f"{recovery_s:.0f} s later, {total} acknowledged on {len(topics)} topics, "
        f"actions {dict(chaos.actions)} ({' '.join(chaos.log)}), "
        f"at least {monitor_runs} compaction runs committed during the chaos "
        f"(on {sum(1 for r in watch.runs.values() if r)} topics), "
        f"{max(redelivered, 0)} redeliveries, consumer errors {sum(c.errors for c in consumers)}, "
        f"final runs by engine {dict(engines)}; none lost, none repeated, views equal the reference; "
        f"{len(failed)} send(s) failed"
    )
    assert failed == [], f"{len(failed)} send(s) failed (seed {SEED}): {failed[:3]}"
