"""A broker killed with SIGKILL at each step of an offload, and while it deletes the objects of
ledgers that retention trimmed or of a deleted topic: after a restart nothing is lost, no object
is orphaned (the store holds exactly what the metadata store names), and the work finishes.

The broker (run through ``tests/storage/offload_fault.py``, ``ProbedBroker``) kills itself at the
step named by ``COMPACTMQ_OFFLOAD_FAULT`` (set only here, for the one broker process)."""

from __future__ import annotations

import signal

import pytest

pytest.importorskip("pulsar")

from admin.harness import BrokerProcess, Http, start_broker, topic_path, web_url  # noqa: E402
from admin.test_offload_rest import (  # noqa: E402
    ledger_files,
    new_namespace,
    offload_settings,
    produce,
    read_all,
    wait_until,
)
from compactmq.storage.metadata_store import create_metadata_store  # noqa: E402
from compactmq.storage.offload import DEAD_DELETE_FAULT, FAULT_POINTS  # noqa: E402
from compactmq.storage.resources import OffloadRecordResources  # noqa: E402

from storage.offload_fault import FAULT_ENV  # noqa: E402

pytestmark = [pytest.mark.integration]


class ProbedBroker(BrokerProcess):
    """A broker process whose offloader kills it at the step ``COMPACTMQ_OFFLOAD_FAULT`` names."""

    def command(self) -> list[str]:
        return ["tests.storage.offload_fault" if a == "compactmq.cli.main" else a for a in super().command()]


BROKER_CONF = {
    "managedLedgerMaxEntriesPerLedger": "20",
    "retentionCheckIntervalInSeconds": "1",
    "managedLedgerOffloadDeletionLagMs": "0",
    "defaultRetentionTimeInMinutes": "-1",
    "defaultRetentionSizeInMB": "-1",
}


def catalog(broker) -> set[str]:
    """The object keys the offload records name (read from the broker's embedded metadata store)."""
    store = create_metadata_store("", data_dir=broker.data_dir)
    try:
        return {k for r in OffloadRecordResources(store).all() for k in (r["data_key"], r["index_key"])}
    finally:
        store.close()


def stored(objects) -> set[str]:
    """Keys in the store, without the data directory's prefix (as the catalog names them)."""
    return {k.split("/", 1)[1] for k in objects()}


def wait_killed(broker, timeout: float = 60.0) -> None:
    wait_until(lambda: broker.proc.poll() is not None, timeout, what="the broker killed itself")
    assert broker.stop() == -signal.SIGKILL


@pytest.fixture(params=["filesystem", "S3"])
def driver(request, tmp_path):
    return offload_settings(request, tmp_path, request.param)


@pytest.mark.parametrize("point", FAULT_POINTS)
def test_sigkill_at_each_offload_step(tmp_path, driver, point, monkeypatch):
    conf, objects = driver
    monkeypatch.setenv(FAULT_ENV, point)
    broker = start_broker(tmp_path / "data", process=ProbedBroker, **BROKER_CONF, **conf)
    try:
        http = Http(web_url(broker))
        ns = new_namespace(http)
        topic = f"persistent://{ns}/crash"
        sent = produce(broker, topic, 70)
        stats = http.ok("GET", topic_path(topic) + "/internalStats")
        last = stats["ledgers"][-1]["ledgerId"]
        http.ok("PUT", topic_path(topic) + "/offload", {"ledgerId": last, "entryId": 0})
        wait_killed(broker)
        assert objects(), "the kill came after something was written"

        monkeypatch.delenv(FAULT_ENV)
        broker.start(timeout=60)
        found = stored(objects)
        assert found == catalog(broker), f"orphans after a kill at {point}: {sorted(found - catalog(broker))}"
        assert [(k, v) for k, v, _ in read_all(broker, topic)] == sent

        # the offload finishes after the restart, local copies go, everything still reads
        stats = http.ok("GET", topic_path(topic) + "/internalStats")
        sealed = [led["ledgerId"] for led in stats["ledgers"][:-1]]
        http.ok(
            "PUT",
            topic_path(topic) + "/offload",
            {"ledgerId": stats["ledgers"][-1]["ledgerId"], "entryId": 0},
        )
        wait_until(
            lambda: http.ok("GET", topic_path(topic) + "/offload")["status"] == "SUCCESS",
            what="offload SUCCESS",
        )
        stats = http.ok("GET", topic_path(topic) + "/internalStats")
        assert [led["ledgerId"] for led in stats["ledgers"] if led["offloaded"]] == sealed
        wait_until(
            lambda: all(
                led["localCopyDeleted"]
                for led in http.ok("GET", topic_path(topic) + "/internalStats")["ledgers"]
                if led["offloaded"]
            ),
            what="local copies deleted",
        )
        assert len(ledger_files(broker, topic)) == 1
        found = stored(objects)
        assert found == catalog(broker) and len(found) == 2 * len(sealed)
        assert [(k, v) for k, v, _ in read_all(broker, topic)] == sent
    finally:
        broker.stop()


@pytest.mark.parametrize("how", ["retention", "topic-deletion"])
def test_sigkill_while_deleting_dead_objects(tmp_path, driver, how, monkeypatch):
    conf, objects = driver
    monkeypatch.setenv(FAULT_ENV, DEAD_DELETE_FAULT)
    broker = start_broker(tmp_path / "data", process=ProbedBroker, **BROKER_CONF, **conf)
    try:
        http = Http(web_url(broker))
        ns = new_namespace(http)
        topic = f"persistent://{ns}/dead"
        keep = f"persistent://{new_namespace(http)}/kept"
        produce(broker, topic, 70)
        kept = produce(broker, keep, 50)
        for t in (topic, keep):
            last = http.ok("GET", topic_path(t) + "/internalStats")["ledgers"][-1]["ledgerId"]
            http.ok("PUT", topic_path(t) + "/offload", {"ledgerId": last, "entryId": 0})
            wait_until(
                lambda t=t: http.ok("GET", topic_path(t) + "/offload")["status"] == "SUCCESS",
                what="offload SUCCESS",
            )
        before = stored(objects)
        kept_objects = {k for k in before if "/kept/" in k}
        assert kept_objects and before - kept_objects and before == catalog(broker)
        if how == "retention":  # no subscription: retention 0 trims every sealed ledger of the namespace
            http.ok(
                "POST",
                f"/admin/v2/namespaces/{ns}/retention",
                {"retentionTimeInMinutes": 0, "retentionSizeInMB": 0},
            )
        else:
            try:  # the broker dies while it answers
                http.call("DELETE", topic_path(topic) + "?force=true")
            except ConnectionError:
                pass
        wait_killed(broker)
        # killed after the metadata store let go of the ledgers, before any of their objects went
        assert stored(objects) == before and catalog(broker) == before

        monkeypatch.delenv(FAULT_ENV)
        broker.start(timeout=60)
        found = stored(objects)
        assert found == catalog(broker) == kept_objects  # the dead objects went at start, live ones stayed
        assert [(k, v) for k, v, _ in read_all(broker, keep)] == kept
    finally:
        broker.stop()
