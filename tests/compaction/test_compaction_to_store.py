"""Compaction where the data is: with tiered storage configured, the phase-two tasks upload their
parts of the new compacted ledger straight to the object store, the driver writes a small
manifest beside them and commits it with its catalog row in the compaction commit's transaction;
the view is served from the store, the previous ledger's objects are deleted, and a run killed
(SIGKILL) between the upload and the commit leaves objects that the next start deletes. Against
moto's S3 server and the filesystem driver.

Each run is a job beside the test's read-write Storage, on a read-only Storage of its own (what
``compact-topic`` does). A run that is killed goes in a process of their own with a Spark session
started there. The other runs go through this process's one SparkSession, whose executors find
the S3 server's dummy credentials in the environment the standard way (``tests/conftest.py`` sets
them before any JVM starts): a JVM per run would cost a quarter of a minute each and prove
nothing more."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from compactmq.compaction import object_chain, tiered
from compactmq.compaction.compacted_ledger import MANIFEST_NAME, compacted_ledger_path
from compactmq.compaction.entry_scan import hash_key_py
from compactmq.compaction.jobs import SparkCompactionService
from compactmq.compaction.state import states_of
from compactmq.compaction.jobs.session import TEST_CONF
from compactmq.config import load_config
from compactmq.storage import Storage
from compactmq.storage.offload import COMPACTED, open_store

import uuid

import pytest

from . import entries as E

SRC = str(Path(__file__).resolve().parents[2] / "src")
TOPIC = "persistent://public/default/compact-to-store"

# a killed run starts a JVM in a process of its own: on a loaded machine that takes a minute
pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]


@pytest.fixture(params=["filesystem", "S3"])
def offload_conf(request, tmp_path):
    if request.param == "filesystem":
        return {"managedLedgerOffloadDriver": "filesystem", "fileSystemURI": f"file://{tmp_path}/offload"}
    server = request.getfixturevalue("s3_server")
    return server.offload_config(server.create_bucket(f"b-{uuid.uuid4().hex[:12]}"))


def compacted_objects(st: Storage) -> list[str]:
    return open_store(st.offloader.location_for(TOPIC)).list("compacted")


def view(service) -> list:
    return [E.decode(b)[1][0][1:3] for _, b in service.read_compacted_entries((0, 0), 1000)]


CHILD = """
import json, os, signal, sys
from compactmq.compaction.jobs import SparkCompactionService
from compactmq.compaction.jobs.session import TEST_CONF, get_session
from compactmq.config import load_config
from compactmq.storage import Storage
data_dir, topic, conf, kill_at = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
get_session(TEST_CONF)
cfg = load_config(overrides=conf)
st = Storage(data_dir, cfg, read_only=True)  # a compact-topic job beside the writer
def hook(point):
    if point == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
r = SparkCompactionService(st, topic, cfg, spark_conf=TEST_CONF, abort_hook=hook).compact()
print(json.dumps({"id": r.compacted_ledger_id, "previous": r.previous_ledger_id}))
"""


def compact_in_child(data, conf: dict, kill_at: str = "") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", CHILD, str(data), TOPIC, json.dumps(conf), kill_at],
        env={**os.environ, "PYTHONPATH": SRC},
        capture_output=True,
        text=True,
        timeout=300,
    )


def compact(data, conf: dict, spark=None) -> dict:
    """One committed run; in this process on ``spark`` (the session) when given, else in a child
    process."""
    if spark is None:
        proc = compact_in_child(data, conf)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])
    st = Storage(data, load_config(overrides=conf), read_only=True)  # a job beside the writer
    try:
        r = SparkCompactionService(st, TOPIC, st.config, spark_conf=TEST_CONF).compact()
    finally:
        st.close()
    return {"id": r.compacted_ledger_id, "previous": r.previous_ledger_id}


@pytest.fixture
def session(request, offload_conf):
    """The test process's SparkSession, for the runs of every store (see the module docstring)."""
    return request.getfixturevalue("spark")


@pytest.mark.parametrize("chains", [True, False], ids=["chain", "parts"])
def test_the_compacted_ledger_is_written_to_the_store_and_served_from_it(
    tmp_path, offload_conf, session, chains
):
    conf = {"managedLedgerSyncData": False, "managedLedgerMaxEntriesPerLedger": 20, **offload_conf}
    conf["compactionObjectStoreChains"] = chains  # a chain of segments, or parts (one view a run)
    data = tmp_path / "data"
    st = Storage(data, load_config(overrides=conf))
    try:
        ml = st.open_managed_ledger(TOPIC)
        ml.append_many([E.single(f"k{i % 7}", b"v%d" % i) for i in range(60)] + [E.single("k0", b"")])
        ml.rollover()
        service = SparkCompactionService(st, TOPIC, st.config)  # the broker's read side
        cid = compact(data, conf, session)["id"]
        # nothing on the local disk: the catalog names a manifest and the parts' prefix
        assert not os.path.exists(compacted_ledger_path(st.data_dir, TOPIC, cid))
        rec = st.offloader.compacted_record(cid)
        keys = compacted_objects(st)
        if chains:  # the row names the chain manifest; segments and sidecar beside it
            assert rec is not None and object_chain.is_chain_record(rec) and rec.data_key in keys
            base = object_chain.chain_prefix(rec) + "/"
            assert any(k.startswith(base) and k.endswith(".seg") for k in keys)
            assert any(k.startswith(base + f"{cid:012d}/keys/keys-") for k in keys)
        else:
            assert rec is not None and rec.kind == COMPACTED and rec.index_key.endswith("/")
            assert rec.data_key in keys and rec.data_key.endswith("/" + MANIFEST_NAME)
            assert any(k.startswith(rec.index_key + "part-") for k in keys)
            # the key sidecar the next run reads went up with the parts, under the same prefix
            assert any(k.startswith(rec.index_key + "keys/keys-") and k.endswith(".parquet") for k in keys)
        assert dict(view(service)) == {f"k{i}": b"v%d" % (56 + i if i < 4 else 49 + i) for i in range(1, 7)}

        # a second run reads the previous compacted ledger from the store, and its objects go
        ml.append_many([E.single("k1", b"newer"), E.single("k9", b"nine")])
        ml.rollover()
        second = compact(data, conf, session)
        assert second["previous"] == cid
        assert st.offloader.compacted_record(cid) is None
        keys = compacted_objects(st)
        rec = st.offloader.compacted_record(second["id"])
        if chains:  # the chain extended: the old manifest gone, its segment still named
            assert rec.data_key in keys and object_chain.chain_prefix(rec) + "/" == base
            assert object_chain.read_manifest(open_store(rec.location), rec.data_key).runs == 2
            assert all(k.startswith(base) for k in keys)
        else:
            assert keys and all(k.startswith(rec.index_key) for k in keys)
        got = dict(view(service))
        assert got["k1"] == b"newer" and got["k9"] == b"nine" and "k0" not in got
        # a key lookup's index of the view comes from the sidecar in the store, not a parse
        index = service.open_view().key_index()
        assert index.source == "sidecar" and len(index) == len(got)
        assert index.find(*hash_key_py(b"k9")) is not None and index.find(*hash_key_py(b"k0")) is None
    finally:
        st.close()
    # after a restart the broker's read side still opens it from the store
    st = Storage(tmp_path / "data", load_config(overrides=conf))
    try:
        service = SparkCompactionService(st, TOPIC, st.config)
        assert dict(view(service)) == got
        assert compacted_objects(st) == keys  # the start's sweep kept the committed objects
    finally:
        st.close()


# a JVM child per store (the killed run, a minute on a loaded machine): S3's is left to
# ``-m slow`` (the kill point and the sweep are the same code for every store; S3 is tested with
# the committed runs above)
@pytest.mark.parametrize(
    "offload_conf", ["filesystem", pytest.param("S3", marks=pytest.mark.slow)], indirect=True
)
@pytest.mark.parametrize(
    "chains", [True, pytest.param(False, marks=pytest.mark.slow)], ids=["chain", "parts"]
)
def test_a_run_killed_between_upload_and_commit_leaves_nothing_after_the_next_start(
    tmp_path, offload_conf, session, chains
):
    conf = {"managedLedgerSyncData": False, "compactionObjectStoreChains": chains, **offload_conf}
    data = tmp_path / "data"
    st = Storage(data, load_config(overrides=conf))
    try:
        ml = st.open_managed_ledger(TOPIC)
        ml.append_many([E.single(f"k{i % 5}", b"v%d" % i) for i in range(40)])
        ml.rollover()
        service = SparkCompactionService(st, TOPIC, st.config)
        cid = compact(data, conf, session)["id"]
        committed = compacted_objects(st)
        before = view(service)
        ml.append_many([E.single("k0", b"lost")])
        ml.rollover()
        # the parts and the manifest are uploaded, nothing is committed: SIGKILL
        proc = compact_in_child(data, conf, kill_at="before-commit")
        assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
        # the dead run's manifest and parts are in the store, named by no one; the view is the old one
        left = [k for k in compacted_objects(st) if k not in committed]
        if chains:  # its segment and manifest, in the chain of the view in force
            assert any(k.endswith(object_chain.MANIFEST_SUFFIX) for k in left)
            assert any(k.endswith(".seg") for k in left)
        else:
            assert any(k.endswith(MANIFEST_NAME) for k in left) and any("/part-" in k for k in left)
        assert states_of(st).get(TOPIC).compacted_ledger_id == cid
        assert view(service) == before
    finally:
        st.close()
    st = Storage(data, load_config(overrides=conf))
    try:
        tiered.sweep_all_view_orphans(st)  # what the broker's compaction monitor does at start
        assert compacted_objects(st) == committed
        service = SparkCompactionService(st, TOPIC, st.config)
        assert view(service) == before
        st.open_managed_ledger(TOPIC).rollover()
        compact(data, conf, session)  # and the next run goes on from there
        assert dict(view(service))["k0"] == b"lost"
    finally:
        st.close()


def test_a_chained_local_view_is_written_whole_to_the_store_once_offload_is_configured(spark, tmp_path):
    """Chains are local: two runs without tiered storage leave a chain of two runs on disk; once
    an offload location is configured the next run writes a fresh view to the store and deletes
    every local segment and manifest of the chain."""
    from compactmq.compaction import chain
    from compactmq.compaction.compacted_ledger import topic_dir

    local = {"managedLedgerSyncData": False, "managedLedgerMaxEntriesPerLedger": 20}
    data = tmp_path / "data"
    st = Storage(data, load_config(overrides=local))
    try:
        ml = st.open_managed_ledger(TOPIC)
        ml.append_many([E.single(f"k{i % 7}", b"v%d" % i) for i in range(30)])
        service = SparkCompactionService(st, TOPIC, st.config)
        service.compact()
        ml.append_many([E.single("k1", b"newer"), E.single("k8", b"eight")])
        service.compact()
        assert service.compacted_ledger().manifest.runs == 2
    finally:
        st.close()
    conf = {
        **local,
        "managedLedgerOffloadDriver": "filesystem",
        "fileSystemURI": f"file://{tmp_path}/offload",
    }
    st = Storage(data, load_config(overrides=conf))
    try:
        ml = st.open_managed_ledger(TOPIC)
        ml.append_many([E.single("k2", b"two")])
        service = SparkCompactionService(st, TOPIC, st.config)
        cid = service.compact().compacted_ledger_id
        assert st.offloader.compacted_record(cid) is not None
        names = os.listdir(topic_dir(data, TOPIC))
        assert not [n for n in names if chain.SEGMENT_NAME.match(n) or n.endswith(".compacted")]
        got = dict(view(service))
        assert got["k1"] == b"newer" and got["k8"] == b"eight" and got["k2"] == b"two"
        assert got["k3"] == b"v24" and len(got) == 8
    finally:
        st.close()
