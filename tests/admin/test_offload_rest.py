"""Tiered storage end to end, with a real broker, the official client and a real object store
(moto's S3 server on 127.0.0.1, and the ``filesystem`` driver): produce, offload over REST
(``PUT .../offload`` with a message id), watch ``GET .../offload``, delete the local copies once
the namespace's deletion lag says so, restart, read everything back from earliest, seek into the
offloaded range, compact, read compacted; ``internalStats`` says which ledgers are offloaded.
Then the admin errors, the namespace offload policies and the CLI commands."""

from __future__ import annotations

import glob
import os
import uuid
from pathlib import Path

import pytest

pytest.importorskip("pulsar")

from admin.harness import Http, start_broker, topic_path, wait_status, web_url  # noqa: E402
from harness.broker import make_client  # noqa: E402
from harness.cli import CliResult, run_cli  # noqa: E402
from harness.wait import wait_until  # noqa: E402

pytestmark = [pytest.mark.integration]

KEYS = 7
N = 120


def offload_settings(request, tmp_path: Path, driver: str) -> tuple[dict[str, str], callable]:
    """broker.conf overrides for ``driver`` and a function listing the objects in the store."""
    if driver == "filesystem":
        root = tmp_path / "offload"
        root.mkdir()

        def objects() -> set[str]:
            return {
                str(Path(p).relative_to(root))
                for p in glob.glob(f"{root}/**/*", recursive=True)
                if os.path.isfile(p)
            }

        return {"managedLedgerOffloadDriver": "filesystem", "fileSystemURI": f"file://{root}"}, objects
    if driver == "GCS":
        gcs = request.getfixturevalue("gcs_server")
        bucket = gcs.create_bucket(f"b-{uuid.uuid4().hex[:12]}")
        return gcs.offload_config(bucket), lambda: set(gcs.keys(bucket))
    server = request.getfixturevalue("s3_server")
    bucket = server.create_bucket(f"b-{uuid.uuid4().hex[:12]}")
    return server.offload_config(bucket), lambda: set(server.keys(bucket))


@pytest.fixture(params=["filesystem", "S3", "GCS"])
def tiered(request, tmp_path):
    conf, objects = offload_settings(request, tmp_path, request.param)
    broker = start_broker(
        tmp_path / "data",
        in_process=True,  # its compaction runs on the worker's warm SparkSession
        managedLedgerMaxEntriesPerLedger="25",
        retentionCheckIntervalInSeconds="1",
        managedLedgerOffloadDeletionLagMs="0",
        defaultRetentionTimeInMinutes="-1",
        defaultRetentionSizeInMB="-1",
        s3ManagedLedgerOffloadReadBufferSizeInBytes="4096",
        # the places namespace policies below may name (besides the broker's own location)
        managedLedgerOffloadAllowedLocations="filesystem=file:///tmp/elsewhere, filesystem=file:///tmp/x",
        **conf,
    )
    yield broker, Http(web_url(broker)), objects
    broker.stop()


def new_namespace(http: Http) -> str:
    ns = f"public/off-{uuid.uuid4().hex[:8]}"
    http.ok("PUT", f"/admin/v2/namespaces/{ns}")
    return ns


def produce(broker, topic: str, n: int = N) -> list[tuple[str, bytes]]:
    c = make_client(broker.url)
    try:
        p = c.create_producer(topic, batching_enabled=False)
        sent = []
        for i in range(n):
            key, value = f"k{i % KEYS}", f"value-{i:04d}-".encode() * (1 + i % 5)
            p.send(value, partition_key=key)
            sent.append((key, value))
        p.close()
        return sent
    finally:
        c.close()


def read_all(broker, topic: str, compacted: bool = False, start=None, inclusive: bool = False) -> list:
    import pulsar

    c = make_client(broker.url)
    try:
        r = c.create_reader(
            topic,
            start or pulsar.MessageId.earliest,
            is_read_compacted=compacted,
            start_message_id_inclusive=inclusive,
        )
        out = []
        while r.has_message_available():
            m = r.read_next(15_000)
            out.append((m.partition_key(), m.data(), m.message_id()))
        r.close()
        return out
    finally:
        c.close()


def ledger_files(broker, topic: str) -> list[str]:
    rel = topic.replace("://", "/")
    return sorted(glob.glob(str(broker.data_dir / "ledgers" / rel / "*.log")))


@pytest.mark.spark
@pytest.mark.timeout(900)  # two broker restarts and a cold Spark start in the broker
def test_offload_over_rest_restart_read_seek_compact(tiered):
    broker, http, objects = tiered
    ns = new_namespace(http)
    topic = f"persistent://{ns}/tiered"
    sent = produce(broker, topic)
    tp = topic_path(topic)
    st = http.ok("GET", tp + "/offload")
    assert st["status"] == "NOT_RUN" and st["lastError"] == ""

    # keep the local copies for now: the namespace's deletion lag overrides the broker's 0
    http.ok("POST", f"/admin/v2/namespaces/{ns}/offloadDeletionLagMs", 3_600_000)
    assert http.ok("GET", f"/admin/v2/namespaces/{ns}/offloadDeletionLagMs") == 3_600_000
    stats = http.ok("GET", tp + "/internalStats")
    ledgers = [led["ledgerId"] for led in stats["ledgers"]]
    assert len(ledgers) >= 5 and not any(led["offloaded"] for led in stats["ledgers"])
    stop_at = ledgers[-2]  # everything before the last two ledgers
    http.ok("PUT", tp + "/offload", {"ledgerId": stop_at, "entryId": 0})
    st = wait_until(
        lambda: (s := http.ok("GET", tp + "/offload"))["status"] == "SUCCESS" and s,
        60.0,
        "offload SUCCESS",
        interval=0.1,
    )
    assert st["lastError"] == "" and st["firstUnoffloadedMessage"]["ledgerId"] == stop_at

    stats = http.ok("GET", tp + "/internalStats")
    done = [led["ledgerId"] for led in stats["ledgers"] if led["offloaded"]]
    assert done == [lid for lid in ledgers if lid < stop_at]
    assert all(not led["localCopyDeleted"] for led in stats["ledgers"] if led["offloaded"])
    assert len(objects()) == 2 * len(done)  # a data and an index object per ledger
    local_before = ledger_files(broker, topic)

    # the lag passes (policy removed: the broker's 0 applies): the monitor deletes local copies
    http.ok("DELETE", f"/admin/v2/namespaces/{ns}/offloadDeletionLagMs")
    wait_until(
        lambda: all(
            led["localCopyDeleted"]
            for led in http.ok("GET", tp + "/internalStats")["ledgers"]
            if led["offloaded"]
        ),
        60.0,
        "local copies deleted",
        interval=0.1,
    )
    local_after = ledger_files(broker, topic)
    assert len(local_before) - len(local_after) == len(done)
    for lid in done:
        assert not any(f.endswith(f"{lid:012d}.log") for f in local_after)

    broker.restart()
    got = read_all(broker, topic)
    assert [(k, v) for k, v, _ in got] == sent

    # seek into the offloaded range: a reader started at message 30 (inclusive)
    got2 = read_all(broker, topic, start=got[30][2], inclusive=True)
    assert got2[0][2].ledger_id() in done
    assert [(k, v) for k, v, _ in got2] == sent[30:]

    # compact: the run reads offloaded ledgers from the object store
    http.ok("PUT", tp + "/compaction")
    wait_status(http, topic, "SUCCESS", timeout=300)  # a cold Spark start on a busy machine
    latest = {}
    for k, v in sent:
        latest.pop(k, None)
        latest[k] = v
    compacted = read_all(broker, topic, compacted=True)
    assert [(k, v) for k, v, _ in compacted] == list(latest.items())
    stats = http.ok("GET", tp + "/internalStats")
    assert [led["ledgerId"] for led in stats["ledgers"] if led["offloaded"]] == done
    assert all("offloadLocation" in led for led in stats["ledgers"] if led["offloaded"])
    cid = stats["compactedLedger"]["ledgerId"]
    # with tiered storage configured the run wrote the compacted ledger straight to the object
    # store (its tasks uploaded the parts, the driver committed a manifest): no local file at all
    assert cid >= 0 and stats["compactedLedger"]["offloaded"] and stats["compactedLedger"]["localCopyDeleted"]

    # the next offload has nothing to do for it; read-compacted consumers are served from the
    # object store, also after a restart
    last = stats["ledgers"][-1]["ledgerId"]
    http.ok("PUT", tp + "/offload", {"ledgerId": last, "entryId": 0})
    wait_until(
        lambda: (
            (c := http.ok("GET", tp + "/internalStats")["compactedLedger"])["offloaded"]
            and c["localCopyDeleted"]
        ),
        60.0,
        "compacted ledger offloaded",
        interval=0.1,
    )
    assert not glob.glob(str(broker.data_dir / "compacted" / "**" / f"{cid:012d}.compacted"), recursive=True)
    # the view lives in the store as a chain: its manifest names its segments (object_chain)
    assert any(k.endswith(f"{cid:012d}.chain") for k in objects()), sorted(objects())
    broker.restart()
    compacted = read_all(broker, topic, compacted=True)
    assert [(k, v) for k, v, _ in compacted] == list(latest.items())


def test_offload_admin_errors_and_namespace_policies(tiered):
    broker, http, _ = tiered
    ns = new_namespace(http)
    topic = f"persistent://{ns}/errs"
    produce(broker, topic, 30)
    tp = topic_path(topic)
    assert "message id" in http.error("PUT", tp + "/offload", 400, {"ledgerId": 1})
    http.error("PUT", tp + "/offload", 400, raw=b"not json")
    http.error("GET", topic_path(f"persistent://{ns}/missing") + "/offload", 404)
    nsp = f"/admin/v2/namespaces/{ns}"
    for path in ("offloadThreshold", "offloadThresholdInSeconds", "offloadDeletionLagMs", "offloadPolicies"):
        assert http.ok("GET", f"{nsp}/{path}") is None
    http.ok("PUT", f"{nsp}/offloadThreshold", 10 * 1024 * 1024)
    assert http.ok("GET", f"{nsp}/offloadThreshold") == 10 * 1024 * 1024
    http.error("PUT", f"{nsp}/offloadThreshold", 412, -2)
    http.error("PUT", f"{nsp}/offloadThreshold", 400, "ten")
    http.ok("PUT", f"{nsp}/offloadThresholdInSeconds", 3600)
    assert http.ok("GET", f"{nsp}/offloadThresholdInSeconds") == 3600
    http.error("PUT", f"{nsp}/offloadDeletionLagMs", 412, -1)

    pol = {
        "managedLedgerOffloadDriver": "filesystem",
        "fileSystemURI": "file:///tmp/elsewhere",
        "managedLedgerOffloadThresholdInBytes": 1024,
        "managedLedgerOffloadMaxThreads": 2,
    }
    http.ok("POST", f"{nsp}/offloadPolicies", pol)
    got = http.ok("GET", f"{nsp}/offloadPolicies")
    assert got == {k: v for k, v in pol.items() if k != "managedLedgerOffloadMaxThreads"}
    assert "credentials come from" in http.error(
        "POST",
        f"{nsp}/offloadPolicies",
        412,
        {
            "managedLedgerOffloadDriver": "S3",
            "s3ManagedLedgerOffloadBucket": "b",
            "s3ManagedLedgerOffloadCredentialSecret": "x",
        },
    )
    assert "s3ManagedLedgerOffloadBucket" in http.error(
        "POST", f"{nsp}/offloadPolicies", 412, {"managedLedgerOffloadDriver": "aws-s3"}
    )
    # a place the operator did not allow (docs/security.md): refused, whatever the driver
    for where in (
        {"managedLedgerOffloadDriver": "filesystem", "fileSystemURI": f"file://{broker.data_dir}"},
        {"managedLedgerOffloadDriver": "S3", "s3ManagedLedgerOffloadBucket": "mine"},
    ):
        assert "not allowed on this broker" in http.error("POST", f"{nsp}/offloadPolicies", 412, where)
    assert "unknown managedLedgerOffloadDriver" in http.error(
        "POST", f"{nsp}/offloadPolicies", 412, {"managedLedgerOffloadDriver": "tape"}
    )
    http.ok("DELETE", f"{nsp}/removeOffloadPolicies")
    assert http.ok("GET", f"{nsp}/offloadPolicies") is None
    # applied: the broker's driver when the namespace has none
    assert http.ok("GET", f"{nsp}/offloadPolicies?applied=true")["managedLedgerOffloadDriver"] in (
        "filesystem",
        "S3",
        "google-cloud-storage",
    )
    assert broker.alive()


def test_offload_without_a_driver_is_412(tmp_path):
    broker = start_broker(tmp_path / "data", managedLedgerMaxEntriesPerLedger="10")
    try:
        http = Http(web_url(broker))
        topic = "persistent://public/default/nodriver"
        produce(broker, topic, 25)
        reason = http.error("PUT", topic_path(topic) + "/offload", 412, {"ledgerId": 1 << 40, "entryId": 0})
        assert "no offload driver" in reason
        assert http.ok("GET", topic_path(topic) + "/offload")["status"] == "NOT_RUN"
    finally:
        broker.stop()


def cli(broker, *args: str) -> CliResult:
    return run_cli("--admin-url", web_url(broker), *args)


def test_cli_offload_commands(tiered):
    broker, http, objects = tiered
    ns = new_namespace(http)
    topic = f"persistent://{ns}/cli"
    produce(broker, topic, 100)
    st = cli(broker, "topics", "offload-status", topic)
    assert st.returncode == 0 and st.stdout.startswith("NOT_RUN"), st
    bad = cli(broker, "topics", "offload", "--size-threshold", "lots", topic)
    assert bad.returncode == 1 and bad.stderr.strip().startswith("compactmq: error:"), bad
    # keep about one ledger's worth locally
    stats = http.ok("GET", topic_path(topic) + "/internalStats")
    one = max(led["size"] for led in stats["ledgers"])
    r = cli(broker, "topics", "offload", "--size-threshold", str(one), topic)
    assert r.returncode == 0 and "offload triggered" in r.stdout, r
    w = cli(broker, "topics", "offload-status", "-w", topic)
    assert w.returncode == 0 and w.stdout.startswith("SUCCESS"), w
    stats = http.ok("GET", topic_path(topic) + "/internalStats")
    kept = sum(led["size"] for led in stats["ledgers"] if not led["offloaded"])
    assert any(led["offloaded"] for led in stats["ledgers"]) and kept <= 2 * one
    assert len(objects()) >= 2

    for args in (
        ("set-offload-threshold", "--size", "10M", "--time", "1h", ns),
        ("set-offload-deletion-lag", "--lag", "10m", ns),
        ("set-offload-policies", "-d", "filesystem", "--fs-uri", "file:///tmp/x", "-t", "1G", ns),
    ):
        r = cli(broker, "namespaces", *args)
        assert r.returncode == 0, r
    nsp = f"/admin/v2/namespaces/{ns}"
    assert http.ok("GET", f"{nsp}/offloadThreshold") == 10 * 1024 * 1024
    assert http.ok("GET", f"{nsp}/offloadThresholdInSeconds") == 3600
    assert http.ok("GET", f"{nsp}/offloadDeletionLagMs") == 600_000
    assert http.ok("GET", f"{nsp}/offloadPolicies") == {
        "managedLedgerOffloadDriver": "filesystem",
        "fileSystemURI": "file:///tmp/x",
        "managedLedgerOffloadThresholdInBytes": 1024**3,
    }
    r = cli(broker, "namespaces", "get-offload-policies", ns)
    assert "fileSystemURI=file:///tmp/x" in r.stdout
    r = cli(broker, "namespaces", "set-offload-policies", "-d", "S3", ns)
    assert r.returncode == 1 and "s3ManagedLedgerOffloadBucket" in r.stderr, r


@pytest.mark.spark
@pytest.mark.timeout(900)  # a cold Spark start in the broker, then a restart
def test_a_read_compacted_seek_into_a_large_view_in_the_store_fetches_a_few_ranges(request, tmp_path):
    """The view a compaction run's tasks wrote straight to S3 (parts and a manifest), 4 MB, served
    after a restart (cold) to a read-compacted reader of the official client that starts in the
    middle: the S3 server's own request log shows a few ranged GETs of the compacted objects and
    a few per cent of their bytes, never the whole view."""
    server = request.getfixturevalue("s3_server")
    bucket = server.create_bucket(f"b-{uuid.uuid4().hex[:12]}")
    chunk = 16 * 1024
    broker = start_broker(
        tmp_path / "data",
        in_process=True,  # its compaction runs on the worker's warm SparkSession
        managedLedgerMaxEntriesPerLedger="500",
        managedLedgerOffloadDeletionLagMs="0",
        s3ManagedLedgerOffloadReadBufferSizeInBytes=str(chunk),
        **server.offload_config(bucket),
    )
    try:
        http = Http(web_url(broker))
        topic = f"persistent://{new_namespace(http)}/big-view"
        n = 2000
        c = make_client(broker.url)
        try:
            p = c.create_producer(topic, batching_enabled=False)
            sent = []
            for i in range(n):
                value = f"{i:06d}".encode() * 330
                sent.append((f"key-{i:05d}", value, p.send(value, partition_key=f"key-{i:05d}")))
            p.close()
        finally:
            c.close()
        tp = topic_path(topic)
        http.ok("PUT", tp + "/compaction")
        wait_status(http, topic, "SUCCESS", timeout=300)
        view = http.ok("GET", tp + "/internalStats")["compactedLedger"]
        assert view["entries"] == n and view["offloaded"] and view["localCopyDeleted"], view
        size = view["size"]
        assert size > n * 1980

        broker.restart()  # nothing of the view in the broker's memory
        middle = 1234
        c = make_client(broker.url)
        try:
            with server.recording() as rec:
                r = c.create_reader(
                    topic,
                    sent[middle][2],
                    is_read_compacted=True,
                    start_message_id_inclusive=True,
                    receiver_queue_size=10,
                )
                got = []
                for _ in range(10):
                    m = r.read_next(30_000)
                    got.append((m.partition_key(), m.data()))
                r.close()
        finally:
            c.close()
        assert got == [(k, v) for k, v, _ in sent[middle : middle + 10]]
        gets = [g for g in rec.gets(f"/{bucket}/") if "/compacted/" in g.path]
        fetched = sum(g.range_bytes for g in gets)
        # the manifest (the index: 28 bytes an entry), the trailer's chunk, the chunks holding the
        # entries served (and the last one, which the client asks about); not 4 MB
        assert gets and all(g.range is not None for g in gets), gets
        assert len(gets) <= 10 and fetched < n * 28 + 12 * chunk and fetched < size // 10, (
            len(gets),
            fetched,
            size,
        )
        assert broker.alive()
    finally:
        broker.stop()
