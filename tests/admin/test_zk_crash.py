"""SIGKILL of a broker on the ZooKeeper store during compaction commits and ledger rollovers.

A broker with ``metadataStoreUrl=zk:...`` (the session's real ZooKeeper, a chroot per test), small
ledgers (``managedLedgerMaxEntriesPerLedger``, rollover at once) and the Arrow test compaction
factory (no Spark) takes keyed messages from the official client while another thread triggers
compactions over REST. At a random moment the broker is SIGKILLed; it starts again on the same
data directory and ZooKeeper chroot, several cycles. Between and after the cycles:

* the compaction state read straight from ZooKeeper (through the resources layer) never has a
  horizon older than one observed before (the compacted view never moves backwards);
* every ledger the ZooKeeper ledger list names has its file, and after recovery no ledger file in
  the topic's directory is missing from the list (no orphan);
* at the end every acknowledged message is read back once, in publish order, and a
  read-compacted reader sees exactly the latest value per key of what the topic holds up to the
  horizon, then everything after it.

The default variant runs three short cycles; ``test_sigkill_many_cycles`` (slow) runs more.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from pathlib import Path

import pytest

pulsar = pytest.importorskip("pulsar")

from storage.metadata_store.zk_server import zookeeper  # noqa: E402,F401  (tests/ is on sys.path)

from compactmq.naming import TopicName  # noqa: E402
from compactmq.storage.metadata_store import create_metadata_store  # noqa: E402
from compactmq.storage.position import Position  # noqa: E402
from compactmq.storage.resources import PulsarResources  # noqa: E402

from .harness import Http, make_client, start_broker, topic_path, wait_until, web_url  # noqa: E402

pytestmark = pytest.mark.integration

TOPIC = "persistent://public/default/zk-crash"
ARROW = "tests.broker.arrow_compaction.ArrowCompactionServiceFactory"
KEYS = 13


def _conf(zk_url: str) -> dict[str, str]:
    return {
        "metadataStoreUrl": zk_url,
        "metadataStoreOperationTimeoutSeconds": "10",
        # the killed broker's session (and its bundle ownership) expires soon after the kill
        "metadataStoreSessionTimeoutMillis": "2000",
        "compactionServiceFactoryClassName": ARROW,
        "managedLedgerMaxEntriesPerLedger": "7",  # a rollover every few messages
        "managedLedgerMinLedgerRolloverTimeMinutes": "0",
    }


class Publisher(threading.Thread):
    """Sends keyed messages one by one until stopped or the broker goes away; records each
    acknowledged (key, value, message id) in publish order."""

    def __init__(self, url: str, cycle: int, acked: list) -> None:
        super().__init__(daemon=True)
        self.url, self.cycle, self.acked = url, cycle, acked
        self.stop = threading.Event()

    def run(self) -> None:
        client = make_client(self.url, operation_timeout_seconds=5)
        try:
            producer = client.create_producer(TOPIC, batching_enabled=False, send_timeout_millis=3000)
            i = 0
            while not self.stop.is_set():
                key, value = f"k{random.randrange(KEYS)}", f"c{self.cycle}-{i}".encode()
                try:
                    mid = producer.send(value, partition_key=key)
                except Exception:  # the broker was killed: what was not acknowledged may be lost
                    return
                self.acked.append((key, value, (mid.ledger_id(), mid.entry_id())))
                i += 1
        finally:
            try:
                client.close()
            except Exception:
                pass


class Trigger(threading.Thread):
    """Asks for a compaction over REST every few tens of milliseconds (409 while one runs)."""

    def __init__(self, web: str) -> None:
        super().__init__(daemon=True)
        self.http = Http(web)
        self.stop = threading.Event()
        self.horizons: list[Position] = []  # what internalStats reported, in order

    def run(self) -> None:
        while not self.stop.wait(0.05):
            try:
                self.http.call("PUT", topic_path(TOPIC) + "/compaction")
                status, stats = self.http.call("GET", topic_path(TOPIC) + "/internalStats")
            except Exception:  # the broker is gone
                return
            if status == 200 and isinstance(stats, dict) and stats.get("compactionHorizon"):
                self.horizons.append(_pos(stats["compactionHorizon"]))


def _internal_stats_once_owned(http: Http) -> dict:
    """internalStats, once this broker owns the topic's bundle: the killed broker's ownership
    (an ephemeral key) lasts until its ZooKeeper session expires, and until then the request is
    redirected to the dead broker."""
    got: list = []

    def served() -> bool:
        try:
            status, body = http.call("GET", topic_path(TOPIC) + "/internalStats")
        except OSError:  # redirected to the killed broker
            return False
        if status == 200:
            got.append(body)
        return status == 200

    wait_until(served, timeout=30, what="the restarted broker to own the topic")
    return got[-1]


def _pos(text: str) -> Position:
    ledger, entry = text.split(":")
    return Position(int(ledger), int(entry))


def _zk_view(zk_url: str, data: Path):
    """(horizon, view id, ledger list) as ZooKeeper holds them, read by a store of our own."""
    kv = create_metadata_store(zk_url, data_dir=data, operation_timeout_s=10)
    try:
        res = PulsarResources(kv)
        tn = TopicName.parse(TOPIC)
        state = res.compaction.get(tn)
        info = res.managed_ledgers.get(tn)
    finally:
        kv.close()
    horizon = view = None
    if state is not None and state[0].get("horizon") is not None:
        h = state[0]["horizon"]
        horizon = _pos(h) if isinstance(h, str) else Position(*h)
        view = state[0].get("compactedLedgerId")
    ledgers = info[0]["ledgerInfo"] if info is not None else []
    return horizon, view, ledgers


def _ledger_files(data: Path) -> set[int]:
    return {int(p.stem) for p in (data / "ledgers").rglob("*.log")}


def _read_all(url: str, compacted: bool) -> list[tuple[str, bytes, tuple[int, int]]]:
    client = make_client(url)
    try:
        reader = client.create_reader(TOPIC, pulsar.MessageId.earliest, is_read_compacted=compacted)
        got = []
        while reader.has_message_available():
            m = reader.read_next(timeout_millis=10_000)
            mid = m.message_id()
            got.append((m.partition_key(), m.data(), (mid.ledger_id(), mid.entry_id())))
        reader.close()
        return got
    finally:
        client.close()


def _crash_cycles(tmp_path: Path, zookeeper, cycles: int, seed: int) -> None:  # noqa: F811
    rng = random.Random(seed)
    zk_url = f"zk:{zookeeper.hosts}/crash{uuid.uuid4().hex[:10]}"
    data = tmp_path / "data"
    acked: list = []
    seen: Position | None = None  # the newest horizon observed so far
    for cycle in range(cycles):
        broker = start_broker(data, **_conf(zk_url))
        try:
            http = Http(web_url(broker))
            if cycle == 0:  # a subscription from the start holds every ledger (no trimming)
                c = make_client(broker.url)
                c.subscribe(TOPIC, "keep-all", initial_position=pulsar.InitialPosition.Earliest).close()
                c.close()
            stats = _internal_stats_once_owned(http)  # the topic loaded: recovery has run
            listed = [led["ledgerId"] for led in stats["ledgers"]]
            files = _ledger_files(data)
            assert set(listed) <= files, (
                f"cycle {cycle}: listed ledgers without a file: {set(listed) - files}"
            )
            assert files <= set(listed), f"cycle {cycle}: orphan ledger files: {files - set(listed)}"
            if stats.get("compactionHorizon") and seen is not None:
                assert _pos(stats["compactionHorizon"]) >= seen, (cycle, stats["compactionHorizon"], seen)
            pub, trig = Publisher(broker.url, cycle, acked), Trigger(web_url(broker))
            pub.start()
            trig.start()
            time.sleep(rng.uniform(1.0, 3.0))
            broker.stop(sig=9)  # SIGKILL, mid-publish, mid-rollover, maybe mid-commit
            pub.stop.set()
            trig.stop.set()
            pub.join(30)
            trig.join(30)
            for h in trig.horizons:  # what the broker reported moved forward only
                assert seen is None or h >= seen, (cycle, h, seen)
                seen = h
        finally:
            broker.stop(sig=9)
        horizon, view, ledgers = _zk_view(zk_url, data)
        assert seen is None or (horizon is not None and horizon >= seen), (cycle, horizon, seen)
        seen = horizon
        # a ledger is recorded OPEN before its file is made (appender, recovery): an OPEN one may
        # have no file yet (recovery drops it); a CLOSED one always has its bytes
        closed = {int(j["ledgerId"]) for j in ledgers if j.get("state") != "OPEN"}
        missing = closed - _ledger_files(data)
        assert not missing, f"cycle {cycle}: ZooKeeper lists closed ledgers with no file: {missing}"
    print(f"{cycles} kills: {len(acked)} messages acknowledged, horizon {seen}")
    assert len(acked) > 50 * cycles // 2, len(acked)  # the cycles did publish
    _final_checks(tmp_path, data, zk_url, acked, seen)


def _final_checks(tmp_path: Path, data: Path, zk_url: str, acked: list, seen) -> None:
    broker = start_broker(data, **_conf(zk_url))
    try:
        http = Http(web_url(broker))
        stats = _internal_stats_once_owned(http)
        listed = {led["ledgerId"] for led in stats["ledgers"]}
        assert listed == _ledger_files(data), "orphan or missing ledger files after recovery"
        raw = _read_all(broker.url, compacted=False)
        values = [v for _, v, _ in raw]
        assert len(values) == len(set(values)), "a message was stored twice"
        by_value = {v: (k, mid) for k, v, mid in raw}
        for k, v, mid in acked:
            assert v in by_value, f"acknowledged message {v!r} at {mid} is lost"
            assert by_value[v] == (k, mid), (v, by_value[v], (k, mid))
        order = [mid for _, _, mid in raw]
        assert order == sorted(order)
        acked_order = [values.index(v) for _, v, _ in acked]
        assert acked_order == sorted(acked_order), "acknowledged messages read out of order"
        # one more compaction on a quiet topic, then the read-compacted reader against a reference
        http.ok("PUT", topic_path(TOPIC) + "/compaction")
        wait_until(
            lambda: http.ok("GET", topic_path(TOPIC) + "/compaction")["status"] == "SUCCESS",
            timeout=60,
            what="the final compaction",
        )
        stats = http.ok("GET", topic_path(TOPIC) + "/internalStats")
        horizon = _pos(stats["compactionHorizon"])
        assert seen is None or horizon >= seen
        latest: dict = {}
        for k, v, mid in raw:
            if Position(*mid) <= horizon:
                latest[k] = (k, v, mid)
        reference = sorted(latest.values(), key=lambda t: t[2])
        reference += [t for t in raw if Position(*t[2]) > horizon]
        assert _read_all(broker.url, compacted=True) == reference
    finally:
        broker.stop()


def test_sigkill_during_commits_and_rollovers_on_zookeeper(tmp_path, zookeeper):  # noqa: F811
    _crash_cycles(tmp_path, zookeeper, cycles=3, seed=25)


@pytest.mark.slow
def test_sigkill_many_cycles(tmp_path, zookeeper):  # noqa: F811
    _crash_cycles(tmp_path, zookeeper, cycles=12, seed=int(time.time()))
