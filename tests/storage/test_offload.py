"""Tiered storage at the storage layer: offload sealed ledgers to a real object store (moto's S3
server on 127.0.0.1, and the ``filesystem`` driver), read them back transparently, delete local
copies after the lag, clean up on retention and topic deletion, survive a SIGKILL at each step."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest

from compactmq.config import load_config
from compactmq.storage import Position, Storage
from compactmq.storage.offload import FAULT_POINTS, open_store
from compactmq.storage.offload import blocks as bk

from .offload_fault import FAULT_ENV

TOPIC = "persistent://public/default/tiered"
SMALL = {
    "managedLedgerMaxEntriesPerLedger": 10,
    "managedLedgerMinLedgerRolloverTimeMinutes": 0,  # the child process too (tests/conftest.py)
    "managedLedgerOffloadDeletionLagMs": 0,
    "s3ManagedLedgerOffloadReadBufferSizeInBytes": 4096,
}


def payload(i: int) -> bytes:
    return f"entry-{i:05d}-".encode() * (1 + i % 7)


@pytest.fixture(params=["filesystem", "S3", "GCS"])
def offload_conf(request, tmp_path):
    if request.param == "filesystem":
        return {"managedLedgerOffloadDriver": "filesystem", "fileSystemURI": f"file://{tmp_path}/offload"}
    server = request.getfixturevalue("s3_server" if request.param == "S3" else "gcs_server")
    return server.offload_config(server.create_bucket(f"b-{uuid.uuid4().hex[:12]}"))


def objects(st: Storage) -> set[str]:
    loc = st.offloader.location_for(TOPIC)
    return set(open_store(loc).list("ledgers"))


def catalog_keys(st: Storage) -> set[str]:
    return st.offloader.catalog.known_keys()


def test_plan_blocks_end_on_records_and_respect_the_size():
    offsets = np.array([24, 124, 224, 10_224, 10_324], np.int64)
    table = bk.plan_blocks(offsets, 10_424, 250)
    assert table["offset"][0] == 0
    ends = (table["offset"] + table["length"]).tolist()
    assert ends[-1] == 10_424
    assert all(int(e) in set(offsets.tolist()) | {10_424} for e in ends)
    # a record larger than a block gets a block of its own
    assert (10_224 - 224) in table["length"].tolist()


def test_offload_then_read_everything_back_from_the_object_store(tmp_path, clock, offload_conf):
    st = Storage(tmp_path / "data", load_config(overrides={**SMALL, **offload_conf}), clock=clock)
    ml = st.open_managed_ledger(TOPIC)
    for i in range(55):
        ml.append(payload(i), publish_time_ms=1000 + i)
    sealed = ml.sealed_ledgers_to_offload()
    assert len(sealed) == 5
    done = st.offloader.offload(ml)
    assert done == sealed
    status = st.offloader.status(TOPIC)
    assert status["status"] == "SUCCESS" and status["firstUnoffloadedMessage"] == Position(
        ml.ledgers()[-1].ledger_id, 0
    )
    # deletion lag 0: the local copies are gone, the objects are named in the catalog
    for lid in sealed:
        assert not os.path.exists(ml.ledger_path(lid))
    assert objects(st) == catalog_keys(st) and len(objects(st)) == 2 * len(sealed)

    got = ml.read_entries(Position(-1, -1), 1000)
    assert [d for _, d in got] == [payload(i) for i in range(55)]
    assert ml.read_entry(Position(sealed[2], 3)) == payload(23)
    assert ml.find_position_by_publish_time(1000 + 17) == Position(sealed[1], 7)

    # a restart reads from the object store too (indexes and all)
    st.close()
    st = Storage(tmp_path / "data", load_config(overrides={**SMALL, **offload_conf}), clock=clock)
    ml = st.open_managed_ledger(TOPIC)
    c = ml.open_cursor("sub", initial_position="earliest")
    seen = []
    while True:
        batch = c.read_entries(7)
        if not batch:
            break
        seen += [d for _, d in batch]
    assert seen == [payload(i) for i in range(55)]
    assert ml.ledgers_with_offload()[0][1] is True
    st.close()


def test_a_read_of_one_entry_fetches_one_small_range(tmp_path, clock, offload_conf):
    conf = {**SMALL, **offload_conf, "managedLedgerMaxEntriesPerLedger": 2000}
    st = Storage(tmp_path / "data", load_config(overrides=conf), clock=clock)
    ml = st.open_managed_ledger(TOPIC)
    ml.append_many([os.urandom(1000) for _ in range(1000)])
    assert ml.rollover()  # sealed now, whatever its age
    (lid,) = ml.sealed_ledgers_to_offload()
    st.offloader.offload(ml)
    st.offloader.cache.__init__(1 << 30)  # cold cache
    before = ml.read_entry(Position(lid, 500))
    assert len(before) == 1000
    # one or two 4 KiB chunks of a ~1 MB object were fetched, in one ranged read
    assert st.offloader.cache.size <= 2 * 4096 and st.offloader.cache.misses <= 2
    st.close()


def test_deletion_lag_keeps_the_local_copy_until_it_passes(tmp_path, clock, offload_conf):
    conf = {
        **SMALL,
        **offload_conf,
        "managedLedgerOffloadDeletionLagMs": 60_000,
        "defaultRetentionTimeInMinutes": -1,
        "defaultRetentionSizeInMB": -1,
    }
    st = Storage(tmp_path / "data", load_config(overrides=conf), clock=clock)
    ml = st.open_managed_ledger(TOPIC)
    for i in range(25):
        ml.append(payload(i))
    ids = st.offloader.offload(ml)
    assert ids and all(os.path.exists(ml.ledger_path(i)) for i in ids)
    clock.advance(60_001)
    st.run_maintenance()
    assert not any(os.path.exists(ml.ledger_path(i)) for i in ids)
    assert [d for _, d in ml.read_entries(Position(-1, -1), 100)] == [payload(i) for i in range(25)]
    st.close()


def test_retention_and_topic_deletion_delete_offloaded_objects(tmp_path, clock, offload_conf):
    st = Storage(tmp_path / "data", load_config(overrides={**SMALL, **offload_conf}), clock=clock)
    ml = st.open_managed_ledger(TOPIC)
    for i in range(35):
        ml.append(payload(i))
    st.offloader.offload(ml)
    n = len(objects(st))
    assert n == 6
    clock.advance(10 * 60_000)
    trimmed = ml.trim_to_retention(retention_time_minutes=1, retention_size_mb=-1)
    assert trimmed
    assert len(objects(st)) == n - 2 * len(trimmed) and objects(st) == catalog_keys(st)
    st.delete_managed_ledger(TOPIC)
    assert objects(st) == set() and catalog_keys(st) == set()
    st.close()


def test_orphans_of_an_interrupted_offload_are_swept_at_start(tmp_path, clock, offload_conf):
    st = Storage(tmp_path / "data", load_config(overrides={**SMALL, **offload_conf}), clock=clock)
    ml = st.open_managed_ledger(TOPIC)
    for i in range(15):
        ml.append(payload(i))
    st.offloader.offload(ml)
    store = open_store(st.offloader.location_for(TOPIC))
    store.put("ledgers/persistent/public/default/tiered/000000000999-dead.data", [b"half an upload"])
    assert len(objects(st)) == 3
    st.close()
    st = Storage(tmp_path / "data", load_config(overrides={**SMALL, **offload_conf}), clock=clock)
    assert objects(st) == catalog_keys(st) and len(objects(st)) == 2
    st.close()


CHILD = """
import sys
from tests.storage.offload_fault import install
install()  # SIGKILL at the step COMPACTMQ_OFFLOAD_FAULT names
from compactmq.config import load_config
from compactmq.storage import Storage
import json
conf = json.loads(sys.argv[2])
st = Storage(sys.argv[1], load_config(overrides=conf))
ml = st.open_managed_ledger({topic!r})
for i in range(45):
    ml.append(f"entry-{{i:05d}}-".encode() * (1 + i % 7))
st.offloader.offload(ml)
print("finished")
"""


@pytest.mark.parametrize("point", FAULT_POINTS)
def test_sigkill_at_each_offload_step_loses_nothing_and_orphans_nothing(tmp_path, offload_conf, point):
    import json

    data = tmp_path / "data"
    conf = {**SMALL, **offload_conf}
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, FAULT_ENV: point, "PYTHONPATH": os.pathsep.join([str(root / "src"), str(root)])}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD.format(topic=TOPIC), str(data), json.dumps(conf)],
        env=env,
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    st = Storage(data, load_config(overrides=conf))
    ml = st.open_managed_ledger(TOPIC)
    assert [d for _, d in ml.read_entries(Position(-1, -1), 1000)] == [payload(i) for i in range(45)]
    assert objects(st) == catalog_keys(st)  # no orphan, nothing named that is missing
    # and offload completes after the restart
    st.offloader.offload(ml)
    assert [d for _, d in ml.read_entries(Position(-1, -1), 1000)] == [payload(i) for i in range(45)]
    offloaded = [info.ledger_id for info, off in ml.ledgers_with_offload() if off]
    assert len(offloaded) == 5  # 4 full ledgers and the one recovery sealed after the kill
    assert objects(st) == catalog_keys(st) and len(objects(st)) == 2 * len(offloaded)
    st.close()


def test_an_object_url_names_its_store_and_key_again(tmp_path):
    """``location_from_url`` inverts ``OffloadLocation.url`` (a reader given only the URI of an
    offloaded compacted ledger finds its store, and the parts beside it)."""
    from compactmq.storage.offload import OffloadLocation, location_from_url

    for loc in (
        OffloadLocation("s3", "bkt", "eu-west-1", "http://127.0.0.1:9000", "inst"),
        OffloadLocation("aws-s3", "bkt", "", "", "inst"),
        OffloadLocation("google-cloud-storage", "bkt", prefix="inst"),
        OffloadLocation("google-cloud-storage", "bkt", endpoint="http://127.0.0.1:4443", prefix="inst"),
        OffloadLocation("filesystem", str(tmp_path / "off"), prefix="inst"),
        OffloadLocation("filesystem", "hdfs://nn:8020/offload", prefix="inst"),
    ):
        url = loc.url("compacted/a/b/c/d/000000000007-x/ledger.compacted")
        back, key = location_from_url(url)
        assert key.endswith("inst/compacted/a/b/c/d/000000000007-x/ledger.compacted") and back.url(key) == url
        # the objects of a bucket share one location (one client), whatever their directory
        assert location_from_url(loc.url("ledgers/other"))[0] == back
    with pytest.raises(Exception, match="names no object"):
        location_from_url("s3://bucket/")


def test_offload_records_in_zookeeper(tmp_path, clock, zookeeper):
    """The records live in the store metadataStoreUrl names: offload, restart and read back from the
    object store, then retention and topic deletion delete the objects with their records."""
    conf = {
        **SMALL,
        "managedLedgerOffloadDriver": "filesystem",
        "fileSystemURI": f"file://{tmp_path}/offload",
        "metadataStoreUrl": f"zk:{zookeeper.hosts}/offload{uuid.uuid4().hex[:8]}",
    }
    st = Storage(tmp_path / "data", load_config(overrides=conf), clock=clock)
    try:
        ml = st.open_managed_ledger(TOPIC)
        for i in range(35):
            ml.append(payload(i))
        sealed = st.offloader.offload(ml)
        assert len(sealed) == 3 and objects(st) == catalog_keys(st)
        assert st.metadata_store.get_children("/compactmq/offload/ledgers") == [
            f"ledger-{lid:020d}" for lid in sealed
        ]
    finally:
        st.close()
    st = Storage(tmp_path / "data", load_config(overrides=conf), clock=clock)
    try:
        ml = st.open_managed_ledger(TOPIC)
        assert [d for _, d in ml.read_entries(Position(-1, -1), 100)] == [payload(i) for i in range(35)]
        assert not os.path.exists(ml.ledger_path(sealed[0]))  # read from the object store
        clock.advance(10 * 60_000)
        trimmed = ml.trim_to_retention(retention_time_minutes=1, retention_size_mb=-1)
        assert set(sealed) <= set(trimmed) and objects(st) == catalog_keys(st) == set()
        assert st.metadata_store.get_children("/compactmq/offload/ledgers") == []
        st.delete_managed_ledger(TOPIC)
        assert objects(st) == set() and catalog_keys(st) == set()
    finally:
        st.close()


def test_a_driver_is_never_guessed_to_be_a_local_directory(tmp_path, monkeypatch):
    """A location whose driver is upper-case S3 (Pulsar's spelling) is an S3 store, and one whose
    driver is unknown is refused: read as a filesystem root it would write objects to a local
    directory named after the bucket, silently (the review found that fallback)."""
    from pyarrow import fs

    from compactmq.storage.offload import OffloadLocation
    from compactmq.storage.offload.blobstore import BlobStore

    monkeypatch.chdir(tmp_path)
    store = BlobStore(OffloadLocation("S3", "bkt", "us-east-1", "http://127.0.0.1:9", "inst"))
    assert isinstance(store.fs, fs.S3FileSystem)
    with pytest.raises(Exception, match="unknown offload driver 'azureblob'"):
        BlobStore(OffloadLocation("azureblob", "bkt", prefix="inst"))
    assert not os.listdir(tmp_path)


def test_a_passing_store_failure_is_tried_again_and_a_lasting_one_is_not(tmp_path, monkeypatch):
    """``BlobStore.put`` writes a list of chunks again after a failure the store calls passing
    (SeaweedFS answered one UploadPart with INTERNAL_FAILURE under load in CI); any other failure,
    or a stream of chunks that cannot be read twice, fails at once."""
    from compactmq.errors import StorageError
    from compactmq.storage.offload import OffloadLocation
    from compactmq.storage.offload import blobstore

    monkeypatch.setattr(blobstore.time, "sleep", lambda s: None)
    store = blobstore.BlobStore(OffloadLocation("filesystem", str(tmp_path / "objs")))
    real, failures = store._put_once, []

    def flaky(key, chunks, message="AWS Error INTERNAL_FAILURE during UploadPart: please try again"):
        if len(failures) < 2:
            failures.append(key)
            raise StorageError(message)
        return real(key, chunks)

    monkeypatch.setattr(store, "_put_once", flaky)
    assert store.put("a", [b"abc", b"de"]) == 5 and store.read_all("a") == b"abcde"
    assert failures == ["a", "a"]
    failures.clear()
    with pytest.raises(StorageError):
        store.put("b", iter([b"x"]))  # a stream: one attempt
    monkeypatch.setattr(store, "_put_once", lambda key, chunks: flaky(key, chunks, "AccessDenied"))
    failures.clear()
    with pytest.raises(StorageError, match="AccessDenied"):
        store.put("c", [b"x"])
    assert failures == ["c"]
