"""The compacted ledger in tiered storage (the part Pulsar cannot do, apache/pulsar#13559): once
committed it is sealed, so an offload copies it to the object store, the local file goes after the
deletion lag, and readers open the object; a newer compacted ledger makes the old object dead and
the next pass deletes it; a SIGKILL between the upload and the commit leaves an orphan that the
next start sweeps. Driven at the storage layer, against moto's S3 server and the filesystem driver."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from compactmq.compaction.compacted_ledger import CompactedLedgerReader
from compactmq.compaction.compacted_writer import CompactedLedgerWriter
from compactmq.compaction import tiered
from compactmq.compaction.compacted_ledger import compacted_ledger_path
from compactmq.compaction.state import states_of
from compactmq.compaction.tiered import compacted_location
from compactmq.config import load_config
from compactmq.storage import Position, Storage
from compactmq.storage.offload import open_store

from .offload_fault import FAULT_ENV
from .test_offload import SMALL, TOPIC, offload_conf, payload  # noqa: F401 - offload_conf is a fixture


def _storage(tmp_path, conf, clock) -> Storage:
    """The data directory's storage, its offloader told which compacted views it may copy (what
    the broker's compaction monitor does when it starts)."""
    st = Storage(tmp_path / "data", load_config(overrides=conf), clock=clock)
    tiered.attach(st)
    tiered.sweep_all_view_orphans(st)  # what the broker's compaction monitor does at start
    return st


def commit_compacted(st: Storage, entries: list[tuple[int, int, bytes]]) -> int:
    """Write a compacted ledger of ``entries`` and commit it as the topic's view."""
    running = _mark_running(st)
    cid = st.resources.ledger_ids.allocate()
    w = CompactedLedgerWriter(compacted_ledger_path(st.data_dir, TOPIC, cid))
    for lid, eid, data in entries:
        w.append(lid, eid, data)
    w.finish()
    _commit(st, cid, entries, running)
    return cid


def _mark_running(st: Storage):
    states = states_of(st)
    return states.mark_running(TOPIC, states.get(TOPIC).version)


def _commit(st: Storage, cid: int, entries, running) -> None:
    states_of(st).commit(
        TOPIC, cid, Position(*entries[-1][:2]), expected_version=running.version, stats={"duration_ms": 1}
    )


def stored(st: Storage) -> set[str]:
    store = open_store(st.offloader.location_for(TOPIC))
    return set(store.list("ledgers")) | set(store.list("compacted"))


def view(st: Storage, cid: int) -> list:
    reader = CompactedLedgerReader(compacted_location(st, TOPIC, cid))
    return [(tuple(p), d) for p, d in reader.read(Position(-1, -1), 1000)]


def test_compacted_ledger_is_offloaded_served_from_the_store_and_replaced(tmp_path, clock, offload_conf):
    conf = {**SMALL, **offload_conf}
    st = _storage(tmp_path, conf, clock)
    ml = st.open_managed_ledger(TOPIC)
    for i in range(25):
        ml.append(payload(i))
    first = [(p[0], p[1], d) for p, d in ml.read_entries(Position(-1, -1), 100)][::3]
    cid = commit_compacted(st, first)
    expected = [((lid, eid), d) for lid, eid, d in first]
    assert view(st, cid) == expected

    st.offloader.offload(ml)
    rec = st.offloader.compacted_record(cid)
    assert rec is not None and rec.kind == "compacted"
    path = compacted_ledger_path(st.data_dir, TOPIC, cid)
    assert not os.path.exists(path)  # deletion lag 0: the local copy is gone
    assert "://" in compacted_location(st, TOPIC, cid)
    assert view(st, cid) == expected  # read from the object store
    assert stored(st) == st.offloader.catalog.known_keys()

    # a restart still serves it from the store
    st.close()
    st = _storage(tmp_path, conf, clock)
    assert view(st, cid) == expected

    # a newer compacted ledger: the old object is dead and goes on the next pass; the new one
    # is offloaded by the next offload
    ml = st.open_managed_ledger(TOPIC)
    everything = [(p[0], p[1], d) for p, d in ml.read_entries(Position(-1, -1), 100)]
    second = everything[1::4] + everything[-1:]  # its horizon is not below the first view's
    cid2 = commit_compacted(st, second)
    st.run_maintenance()
    assert st.offloader.compacted_record(cid) is None
    assert not any(k.startswith("compacted/") for k in stored(st))
    st.offloader.offload(ml)
    assert st.offloader.compacted_record(cid2) is not None
    assert [k for k in stored(st) if k.startswith("compacted/")] == [
        st.offloader.compacted_record(cid2).data_key
    ]
    assert view(st, cid2) == [((lid, eid), d) for lid, eid, d in second]
    st.close()


CHILD = """
import json, sys
from tests.storage.offload_fault import install
install()  # SIGKILL at the step COMPACTMQ_OFFLOAD_FAULT names
from compactmq.compaction import tiered
from compactmq.config import load_config
from compactmq.storage import Storage
st = Storage(sys.argv[1], load_config(overrides=json.loads(sys.argv[2])))
tiered.attach(st)
tiered.offload_view(st, {topic!r})
print("finished")
"""


def test_sigkill_between_upload_and_commit_leaves_nothing_after_restart(tmp_path, clock, offload_conf):
    conf = {**SMALL, **offload_conf}
    st = _storage(tmp_path, conf, clock)
    ml = st.open_managed_ledger(TOPIC)
    for i in range(12):
        ml.append(payload(i))
    entries = [(p[0], p[1], d) for p, d in ml.read_entries(Position(-1, -1), 100)]
    cid = commit_compacted(st, entries)
    st.close()
    env = {
        **os.environ,
        FAULT_ENV: "compacted-after-data",
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2] / s) for s in ("src", "")]),
    }
    proc = subprocess.run(
        [sys.executable, "-c", CHILD.format(topic=TOPIC), str(tmp_path / "data"), json.dumps(conf)],
        env=env,
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    st = _storage(tmp_path, conf, clock)  # sweeps at start
    assert st.offloader.compacted_record(cid) is None
    assert not any(k.startswith("compacted/") for k in stored(st))
    assert os.path.exists(compacted_ledger_path(st.data_dir, TOPIC, cid))
    assert tiered.offload_view(st, TOPIC) is not None  # and it goes through now
    assert view(st, cid) == [((lid, eid), d) for lid, eid, d in entries]
    st.close()


# --- a large offloaded compacted view is read by ranges, never whole ---------------------------

BIG = 3000  # entries of 2 000 bytes: a 6 MB compacted ledger
CHUNK = 16 * 1024


def commit_as_parts(st: Storage, entries: list[tuple[int, int, bytes]], nparts: int = 3) -> int:
    """Commit ``entries`` as a compacted ledger stored the way a run's phase-two tasks write it
    straight to the object store (parts and their indexes, uploaded; a manifest beside them),
    with its catalog row added just before the commit."""
    from compactmq.compaction.compacted_writer import PartWriter, write_manifest
    from compactmq.storage.offload import COMPACTED, OffloadRecord

    loc = st.offloader.location_for(TOPIC)
    store = open_store(loc)
    running = _mark_running(st)
    cid = st.resources.ledger_ids.allocate()
    prefix = tiered.new_view_prefix(TOPIC, cid)
    parts = []
    step = -(-len(entries) // nparts)
    for k in range(nparts):
        local = str(st.data_dir / f"part-{k}")
        w = PartWriter(local)
        for lid, eid, data in entries[k * step : (k + 1) * step]:
            w.append(lid, eid, data)
        w.close()
        key = f"{prefix}/part-{k:06d}"
        store.put_file(key + ".idx", local + ".idx")
        store.put_file(key, local)
        parts.append({"path": key, "entries": 1})
    key, size, written = write_manifest(store, prefix, parts)
    assert written == len(entries)
    now = st.now_ms()
    rec = OffloadRecord(key, prefix + "/", COMPACTED, TOPIC, cid, loc, size, now, local_deleted_ms=now)
    st.offloader.catalog.add(rec)  # the row first, then the commit names it (as a run does)
    _commit(st, cid, entries, running)
    return cid


def read_bytes_of_this_process() -> int:
    """Bytes this process has read with read()/pread() so far (Linux ``/proc/self/io``)."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


@contextlib.contextmanager
def measured(request, offload_conf):
    """What the store served inside the block: the requests and ranged bytes the S3 server
    recorded, or for the filesystem driver the bytes this process read (memory maps aside, the
    filesystem driver reads with ``pread``)."""
    out: dict = {}
    if offload_conf["managedLedgerOffloadDriver"] == "S3":
        server = request.getfixturevalue("s3_server")
        bucket = offload_conf["s3ManagedLedgerOffloadBucket"]
        with server.recording() as rec:
            yield out
        gets = rec.gets(f"/{bucket}/")
        out["gets"] = len(gets)
        out["whole_gets"] = sum(1 for r in gets if r.range is None)
        out["bytes"] = sum(r.range_bytes for r in gets)
    else:
        before = read_bytes_of_this_process()
        yield out
        out["bytes"] = read_bytes_of_this_process() - before


@pytest.mark.parametrize("layout", ["offloaded", "written-to-store"])
def test_a_seek_into_a_large_offloaded_compacted_view_fetches_a_few_ranges(
    request, tmp_path, clock, offload_conf, layout
):
    """The broker's read side (``LedgerCompactionService``) opened on a 6 MB compacted view in the
    object store, cold, and asked for ten entries in the middle: it fetches the trailer, the index
    and a chunk, a few ranged reads and a few per cent of the bytes, whatever the view's size; the
    next entries come from the read cache. Both ways a view gets there: offloaded after it was
    written locally (one object), and written by the run's tasks straight to the store (parts and
    a manifest)."""
    from compactmq.compaction.service import LedgerCompactionService
    from compactmq.storage.offload import shared_cache

    if offload_conf["managedLedgerOffloadDriver"] == "google-cloud-storage":
        pytest.skip("the GCS emulator keeps no request log to count by (S3 and filesystem count)")
    conf = {
        **SMALL,
        **offload_conf,
        "managedLedgerMaxEntriesPerLedger": 1000,
        "s3ManagedLedgerOffloadReadBufferSizeInBytes": CHUNK,
        "defaultRetentionTimeInMinutes": -1,
        "defaultRetentionSizeInMB": -1,
    }
    st = _storage(tmp_path, conf, clock)
    ml = st.open_managed_ledger(TOPIC)
    ml.append_many([i.to_bytes(4, "big") * 500 for i in range(BIG)])
    ml.rollover()
    entries = [(p[0], p[1], d) for p, d in ml.read_entries(Position(-1, -1), BIG)]
    assert len(entries) == BIG
    if layout == "offloaded":
        cid = commit_compacted(st, entries)
        st.offloader.offload(ml)  # the topic's ledgers and then the compacted ledger; lag 0
        assert not os.path.exists(compacted_ledger_path(st.data_dir, TOPIC, cid))
    else:
        cid = commit_as_parts(st, entries)
    rec = st.offloader.compacted_record(cid)
    assert rec is not None and "://" in compacted_location(st, TOPIC, cid)
    size = rec.data_size
    assert size > BIG * 2000

    service = LedgerCompactionService(st, TOPIC, st.config)
    shared_cache().clear()
    middle = 1777
    with measured(request, offload_conf) as first:
        got = service.read_compacted_entries(Position(*entries[middle][:2]), 10)
    assert [(tuple(p), d) for p, d in got] == [
        ((lid, eid), d) for lid, eid, d in entries[middle : middle + 10]
    ]
    index_bytes = BIG * 28
    # the index and a handful of chunks, never the object (6 MB)
    assert first["bytes"] < index_bytes + 8 * CHUNK, first
    assert first["bytes"] < size // 20, first
    if "gets" in first:
        # head, trailer (with the end of the index), the rest of the index, the entries' chunk;
        # for parts: the manifest, then the part that holds the entries
        assert first["whole_gets"] == 0 and 1 <= first["gets"] <= 5, first
    # the next entries are in the chunk already read: nothing more from the store
    with measured(request, offload_conf) as second:
        got = service.read_compacted_entries(Position(*entries[middle + 10][:2]), 3)
    assert [d for _, d in got] == [d for _, _, d in entries[middle + 10 : middle + 13]]
    assert second.get("gets", 0) == 0 and second["bytes"] < CHUNK, second
    # the view's size in the stats comes from its trailer, not a download
    with measured(request, offload_conf) as stats:
        assert service.stats().size_bytes == size
    assert stats["bytes"] < CHUNK, stats
    # and the whole view still reads back in order
    reader = service.compacted_ledger()
    assert reader is not None and reader.remote
    assert [d for _, d in reader] == [d for _, _, d in entries]
    st.close()


def test_a_chained_local_view_is_not_offloaded_as_it_stands(tmp_path, clock):
    """A chained view (``compaction.chain``) names local segment files: the offloader does not
    copy its manifest to the store (the next run of a topic with an offload location writes its
    view there whole), and the view stays readable where it is."""
    import numpy as np  # noqa: F401 - the chain module's arrays

    from compactmq.compaction import chain
    from compactmq.compaction.compacted_writer import PartWriter

    conf = {
        **SMALL,
        "managedLedgerOffloadDriver": "filesystem",
        "fileSystemURI": f"file://{tmp_path}/offload",
    }
    st = _storage(tmp_path, conf, clock)
    ml = st.open_managed_ledger(TOPIC)
    for i in range(25):
        ml.append(payload(i))
    entries = [(p[0], p[1], d) for p, d in ml.read_entries(Position(-1, -1), 100)][::4]
    running = _mark_running(st)
    cid = st.resources.ledger_ids.allocate()
    path = compacted_ledger_path(st.data_dir, TOPIC, cid)
    name = chain.segment_name(cid, 0)
    w = PartWriter(os.path.join(os.path.dirname(path), name), complete=True)
    for lid, eid, data in entries:
        w.append(lid, eid, data)
    n = w.close()
    chain.write(
        path, chain.Manifest.fresh([(name, n, os.path.getsize(os.path.join(os.path.dirname(path), name)))])
    )
    _commit(st, cid, entries, running)
    assert tiered.offload_view(st, TOPIC) is None
    assert st.offloader.compacted_record(cid) is None and os.path.exists(path)
    assert view(st, cid) == [((lid, eid), d) for lid, eid, d in entries]
    # nor a manifest with a mask section (its own magic): an entry of the chain keeps batch index 0
    masked = chain.read(path).extended([], [], [], masks=([entries[0][0]], [entries[0][1]], [1], [0]))
    chain.write(path, masked)
    assert chain.read(path).masks.size == 1
    assert tiered.offload_view(st, TOPIC) is None
    assert st.offloader.compacted_record(cid) is None and os.path.exists(path)
    st.close()
