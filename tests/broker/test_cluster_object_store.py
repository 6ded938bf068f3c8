"""``objectLedgerStorageUrl``: managed ledgers in an object store, on one broker too.

The URL is checked at start (one line naming what is wrong); a valid one puts every managed
ledger of the data directory in the store (nothing under ``ledgers/`` on disk), and a second
``Storage`` over another directory, with the same metadata and store, reads them back: the data
does not live with the broker.
"""

from __future__ import annotations

import os

import pytest

from compactmq.config import load_config
from compactmq.errors import InvalidConfiguration
from compactmq.storage.engine import LEDGERS_DIR, Storage
from compactmq.storage.object_store_url import location_of

TOPIC = "persistent://public/default/object-store"


@pytest.mark.parametrize(
    "url, why",
    [
        ("s3://Bad_Bucket/x", "bucket"),
        ("s3://bucket/../etc", "not plain"),
        ("s3://bucket/p%2Fq", "not plain"),
        ("s3://key:secret@bucket/x", "credentials"),
        ("s3://bucket/x?endpoint=ftp://h:1", "endpoint"),
        ("s3://bucket/x?endpoint=http://h:1/path", "endpoint"),
        ("s3://bucket/x?endpoint=http://u@h:1", "user info"),
        ("s3://bucket/x?acl=public", "unknown parameter"),
        ("file://host/dir", "file:///absolute"),
        ("file:///", "root directory"),
        ("http://example.com/x", "expected s3://"),
    ],
)
def test_a_bad_url_is_one_line_naming_the_fault(url, why):
    with pytest.raises(InvalidConfiguration) as err:
        location_of(url)
    assert why in str(err.value) and "\n" not in str(err.value)
    assert str(err.value).startswith("objectLedgerStorageUrl=")


def test_good_urls():
    assert location_of("") is None
    loc = location_of("s3://my-bucket/a/b?region=eu-west-1&endpoint=http://127.0.0.1:8333")
    assert (loc.driver, loc.root, loc.region, loc.endpoint, loc.prefix) == (
        "s3", "my-bucket", "eu-west-1", "http://127.0.0.1:8333", "a/b"
    )  # fmt: skip
    loc = location_of("s3://my-bucket?endpoint_override=h:9000&scheme=http")
    assert (loc.endpoint, loc.prefix) == ("http://h:9000", "")
    assert location_of("file:///tmp/x/y").root == "/tmp/x/y"


def test_storage_refuses_a_bad_url_at_start(tmp_path):
    config = load_config(overrides={"objectLedgerStorageUrl": "s3://x"})
    with pytest.raises(InvalidConfiguration):
        Storage(tmp_path / "data", config)


def _append(storage: Storage, n: int, start: int = 0) -> None:
    ml = storage.open_managed_ledger(TOPIC)
    for i in range(start, start + n):
        ml.append(f"m{i}".encode())


def _read_all(storage: Storage) -> list[bytes]:
    ml = storage.open_managed_ledger(TOPIC, create=False)
    out = []
    for info in ml.ledgers():
        out += [e for _, e in ml.read_entries((info.ledger_id, 0), info.entry_count)]
    return out


def test_ledgers_live_in_the_store_not_on_disk(tmp_path, seaweedfs):
    bucket = seaweedfs.create_bucket("object-store-single")
    url = f"s3://{bucket}/{tmp_path.name}?region=us-east-1&endpoint={seaweedfs.endpoint}"
    meta = f"memory:{tmp_path.name}"
    config = load_config(overrides={"objectLedgerStorageUrl": url, "metadataStoreUrl": meta})
    with Storage(tmp_path / "a", config) as first:
        _append(first, 5)
    assert not any(files for _, _, files in os.walk(tmp_path / "a" / LEDGERS_DIR))
    assert seaweedfs.keys(bucket, f"{tmp_path.name}/ledgers/")
    # another directory, the same metadata and store: the entries are there, appends go on
    with Storage(tmp_path / "b", config) as second:
        assert _read_all(second) == [f"m{i}".encode() for i in range(5)]
        _append(second, 2, 5)
        assert _read_all(second) == [f"m{i}".encode() for i in range(7)]
        second.delete_managed_ledger(TOPIC)
    assert not seaweedfs.keys(bucket, f"{tmp_path.name}/ledgers/")


def test_a_file_url_works_the_same(tmp_path):
    store = tmp_path / "objects"
    config = load_config(overrides={"objectLedgerStorageUrl": f"file://{store}"})
    with Storage(tmp_path / "data", config) as storage:
        _append(storage, 3)
        assert _read_all(storage) == [b"m0", b"m1", b"m2"]
    assert any(files for _, _, files in os.walk(store / "ledgers"))


@pytest.mark.slow
def test_a_single_broker_serves_from_the_store_across_a_restart(tmp_path, seaweedfs):
    pulsar = pytest.importorskip("pulsar")
    from harness.broker import BrokerProcess, make_client

    bucket = seaweedfs.create_bucket("object-store-broker")
    url = f"s3://{bucket}/{tmp_path.name}?region=us-east-1&endpoint={seaweedfs.endpoint}"
    broker = BrokerProcess(tmp_path / "data", {"objectLedgerStorageUrl": url})
    broker.start()
    try:
        client = make_client(broker.url)
        producer = client.create_producer(TOPIC)
        for i in range(10):
            producer.send(b"m%d" % i)
        client.close()
        broker.restart()  # every ledger is read back from the store
        client = make_client(broker.url)
        consumer = client.subscribe(TOPIC, "s", initial_position=pulsar.InitialPosition.Earliest)
        got = [consumer.receive(timeout_millis=15000).data() for _ in range(10)]
        client.close()
    finally:
        broker.stop()
    assert got == [b"m%d" % i for i in range(10)]
    assert not any(files for _, _, files in os.walk(tmp_path / "data" / LEDGERS_DIR))
    assert seaweedfs.keys(bucket, f"{tmp_path.name}/ledgers/")


def test_a_topic_whose_write_failed_reloads_and_loses_nothing(tmp_path):
    """A flush that fails leaves the managed ledger refusing appends; the topic unloads itself
    (as Pulsar closes a topic whose ledger was fenced), the producer's pending send goes again
    after the reload -- which recovers the ledger -- and nothing is lost or duplicated."""
    pulsar = pytest.importorskip("pulsar")
    from harness.broker import BrokerProcess, make_client
    from harness.wait import wait_until

    store = tmp_path / "objects"
    overrides = {"objectLedgerStorageUrl": f"file://{store}", "brokerDeduplicationEnabled": "true"}
    broker = BrokerProcess(tmp_path / "data", overrides)
    broker.start()
    topic = f"{TOPIC}-reload"
    try:
        client = make_client(broker.url, operation_timeout_seconds=30)
        producer = client.create_producer(topic, producer_name="p", send_timeout_millis=30000)
        for i in range(5):
            producer.send(b"m%d" % i)
        topic_dir = store / "ledgers" / "persistent" / "public" / "default" / "object-store-reload"
        current = max(topic_dir.iterdir())
        current.rename(tmp_path / "aside")
        current.write_bytes(b"")  # a file where the ledger's directory was: the next flush fails
        done = []
        producer.send_async(b"m5", lambda res, mid: done.append(res))
        wait_until(lambda: "unloading it" in broker.log_path.read_text(), timeout=30, what="the unload")
        current.unlink()
        (tmp_path / "aside").rename(current)  # the store is whole again: the reload recovers
        wait_until(lambda: done, timeout=30, what="the pending send")
        assert done == [pulsar.Result.Ok]
        producer.send(b"m6")
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        got = []
        while reader.has_message_available():
            got.append(reader.read_next(timeout_millis=15000).data())
        client.close()
    finally:
        broker.stop()
    assert got == [b"m%d" % i for i in range(7)]


def test_metrics_count_the_objects_the_broker_writes(tmp_path):
    """``compactmq_object_store_*_total`` count what the broker really wrote: the counters
    agree with the objects the store holds (listed on disk, not through the code under test)."""
    pytest.importorskip("pulsar")
    from harness.broker import BrokerProcess, make_client
    from harness.http import object_store_counters

    store = tmp_path / "objects"
    broker = BrokerProcess(tmp_path / "data", {"objectLedgerStorageUrl": f"file://{store}"})
    broker.start()
    try:
        assert object_store_counters(broker) == {"puts": 0, "put_bytes": 0, "deletes": 0}
        client = make_client(broker.url)
        producer = client.create_producer(f"{TOPIC}-counted", batching_enabled=False)
        for i in range(10):
            producer.send(b"m%d" % i)  # acknowledged once durable: one flush object each
        counters = object_store_counters(broker)
        files = [f for f in store.rglob("*") if f.is_file()]
        size = sum(f.stat().st_size for f in files)
        client.close()
    finally:
        broker.stop()
    assert counters["puts"] >= 11  # the ledger's header object, then a flush per synchronous send
    assert counters["puts"] - counters["deletes"] == len(files)
    if counters["deletes"] == 0:
        assert counters["put_bytes"] == size
