"""The compacted ledger in tiered storage (the part Pulsar cannot do, apache/pulsar#13559): once
committed it is sealed, so an offload copies it to the object store, the local file goes after the
deletion lag, and readers open the object; a newer compacted ledger makes the old object dead and
the next pass deletes it; a SIGKILL between the upload and the commit leaves an orphan that the
next start sweeps. Driven at the storage layer, against moto's S3 server and the filesystem driver."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from compactmq.compaction.compacted_ledger import CompactedLedgerReader, CompactedLedgerWriter
from compactmq.config import load_config
from compactmq.storage import Position, Storage
from compactmq.storage.offload import FAULT_ENV, open_store

from .test_offload import SMALL, TOPIC, offload_conf, payload  # noqa: F401 - offload_conf is a fixture


def commit_compacted(st: Storage, entries: list[tuple[int, int, bytes]]) -> int:
    """Write a compacted ledger of ``entries`` and commit it as the topic's view."""
    meta = st.metadata
    state = meta.get_compaction_state(TOPIC)
    running = meta.mark_compaction_running(TOPIC, expected_version=state.version)
    cid = meta.allocate_ledger_id()
    w = CompactedLedgerWriter(st.compacted_ledger_path(TOPIC, cid))
    for lid, eid, data in entries:
        w.append(lid, eid, data)
    w.finish()
    meta.commit_compaction(
        TOPIC, cid, Position(*entries[-1][:2]), {"duration_ms": 1}, expected_version=running.version
    )
    return cid


def stored(st: Storage) -> set[str]:
    store = open_store(st.offloader.location_for(TOPIC))
    return set(store.list("ledgers")) | set(store.list("compacted"))


def view(st: Storage, cid: int) -> list:
    reader = CompactedLedgerReader(st.compacted_ledger_location(TOPIC, cid))
    return [(tuple(p), d) for p, d in reader.read(Position(-1, -1), 1000)]


def test_compacted_ledger_is_offloaded_served_from_the_store_and_replaced(tmp_path, clock, offload_conf):
    conf = {**SMALL, **offload_conf}
    st = Storage(tmp_path / "data", load_config(overrides=conf), clock=clock)
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
    path = st.compacted_ledger_path(TOPIC, cid)
    assert not os.path.exists(path)  # deletion lag 0: the local copy is gone
    assert "://" in st.compacted_ledger_location(TOPIC, cid)
    assert view(st, cid) == expected  # read from the object store
    assert stored(st) == st.offloader.catalog.known_keys()

    # a restart still serves it from the store
    st.close()
    st = Storage(tmp_path / "data", load_config(overrides=conf), clock=clock)
    assert view(st, cid) == expected

    # a newer compacted ledger: the old object is dead and goes on the next pass; the new one
    # is offloaded by the next offload
    ml = st.open_managed_ledger(TOPIC)
    second = [(p[0], p[1], d) for p, d in ml.read_entries(Position(-1, -1), 100)][1::4]
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
from compactmq.config import load_config
from compactmq.storage import Storage
st = Storage(sys.argv[1], load_config(overrides=json.loads(sys.argv[2])))
st.offloader.offload_compacted({topic!r})
print("finished")
"""


def test_sigkill_between_upload_and_commit_leaves_nothing_after_restart(tmp_path, clock, offload_conf):
    conf = {**SMALL, **offload_conf}
    st = Storage(tmp_path / "data", load_config(overrides=conf), clock=clock)
    ml = st.open_managed_ledger(TOPIC)
    for i in range(12):
        ml.append(payload(i))
    entries = [(p[0], p[1], d) for p, d in ml.read_entries(Position(-1, -1), 100)]
    cid = commit_compacted(st, entries)
    st.close()
    env = {
        **os.environ,
        FAULT_ENV: "compacted-after-data",
        "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src"),
    }
    proc = subprocess.run(
        [sys.executable, "-c", CHILD.format(topic=TOPIC), str(tmp_path / "data"), json.dumps(conf)],
        env=env,
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    st = Storage(tmp_path / "data", load_config(overrides=conf), clock=clock)  # sweeps at start
    assert st.offloader.compacted_record(cid) is None
    assert not any(k.startswith("compacted/") for k in stored(st))
    assert os.path.exists(st.compacted_ledger_path(TOPIC, cid))
    assert st.offloader.offload_compacted(TOPIC) is not None  # and it goes through now
    assert view(st, cid) == [((lid, eid), d) for lid, eid, d in entries]
    st.close()
