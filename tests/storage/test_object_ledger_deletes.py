"""Object deletes of the object ledgers that must never remove bytes a committed list names
(issue 26: the chaos test lost acknowledged messages -- 'ledger N holds no bytes [24, ...)').

Against SeaweedFS and a real metadata store (SQLite), as ``test_object_group_flush``. The races
are forced by running the other process's step (a fold, a merge) inside the real call of the
process under test, at the moment the race needs; nothing is stubbed.

* A ledger's view is its range records THEN its objects: a fold (or a merge) that lands
  between the two reads must not hide both its new object and the records it dropped.
* ``discard_partial_writes`` deletes only objects another object provably holds (inside the
  layout's bytes), never one past a gap -- a view that ends early is not proof.
* A merge never deletes a merged object of a newer epoch (a new owner's cut), nor writes over it.
* A merged object supersedes every range record: a range record that lands during a merge (a
  group commit whose outcome was unknown, then applied) is never superseded nor released, and a
  broker whose fence is over writes no merged object and releases no record.
"""

from __future__ import annotations

import pytest

from compactmq.storage import ledger_file as lf
from compactmq.storage import object_ledger_writer
from compactmq.storage.object_group_flush import GroupFlush
from compactmq.storage.object_ledgers import ObjectLedgerSettings, ObjectLedgerStorage
from compactmq.storage.metadata_store import Check
from compactmq.storage.offload.blobstore import BlobStore
from compactmq.storage.resources.fence import NO_FENCE, Fence, Fenced

BUCKET = "object-deletes"
TOPIC = "persistent://public/default/deletes"


@pytest.fixture
def place(seaweedfs, object_location, sqlite_meta):
    return seaweedfs, object_location(BUCKET), sqlite_meta


def _storage(loc, meta, epoch: int, solo: bool = True, fence: Fence = NO_FENCE) -> ObjectLedgerStorage:
    """One broker's storage of TOPIC (its own client and group flush, as another process)."""
    store = BlobStore(loc)
    settings = ObjectLedgerSettings(flush_interval_ms=60_000)
    group = GroupFlush(store, meta, solo=solo)
    return ObjectLedgerStorage(store, TOPIC, settings, epoch=epoch, group=group, fence=fence)


def _record(entry_id: int) -> bytes:
    data = b"entry-%d" % entry_id
    return lf.encode_record_header(entry_id, 1000 + entry_id, data) + data


def _append(writer, entry_id: int) -> bytes:
    rec = _record(entry_id)
    writer.write(rec, writer.written_end)
    writer.flush(writer.written_end)  # durable and visible: acknowledged from here on
    return rec


def _keys(server, loc, storage, ledger_id: int) -> list[str]:
    return sorted(
        k.rsplit("/", 1)[1] for k in server.keys(BUCKET, f"{loc.prefix}/{storage.ledger_prefix(ledger_id)}/")
    )


def _between_the_two_reads(monkeypatch, other: ObjectLedgerStorage, step) -> list[int]:
    """Run ``step`` (the writer's next flush: a fold) once, between ``other``'s two reads of a
    ledger's view -- its LIST of the objects and its read of the range records, in whichever
    order it makes them: the moment a reader that reads them in the wrong order loses."""
    ran: list[int] = []
    calls: list[str] = []

    def wrap(name: str):
        real = getattr(other, name)

        def call(ledger_id: int):
            calls.append(name)
            if len(calls) == 2 and not ran:
                ran.append(1)
                step()
            return real(ledger_id)

        monkeypatch.setattr(other, name, call)

    wrap("_objects")
    wrap("shared_ranges")
    return ran


def test_a_fold_between_listing_and_records_hides_no_acknowledged_bytes(place, monkeypatch):
    """Another process reads a ledger being written while its writer folds: every byte flushed
    before the read began is in its view (listing first hid the fold object and the records)."""
    _server, loc, meta = place
    monkeypatch.setattr(object_ledger_writer, "FOLD_RANGES", 3)
    writer_storage = _storage(loc, meta, epoch=1, solo=False)  # every flush a range record
    w = writer_storage.create(5)
    acked = [_append(w, i) for i in range(2)]  # two ranges; the third flush folds them
    reader = _storage(loc, meta, epoch=2)
    ran = _between_the_two_reads(monkeypatch, reader, lambda: acked.append(_append(w, 2)))
    buf = reader.read_all(5)
    assert ran
    assert buf is not None and buf.startswith(lf.encode_file_header(5) + b"".join(acked[:2]))
    w.close()


def test_discard_partial_writes_keeps_objects_past_a_gap(place):
    """An object past the first gap of a ledger's chain is not provably superseded (the view
    may be early, or the gap a range whose record this reader missed): it stays."""
    server, loc, meta = place
    st = _storage(loc, meta, epoch=1)
    w = st.create(7)
    _append(w, 0)
    w.close()
    rec = _record(1)
    lo = 500  # past the ledger's end: a gap before it
    st.put_object(st.flush_key(7, lo, lo + len(rec)), rec)
    other = _storage(loc, meta, epoch=2)
    other.discard_partial_writes()
    assert st.flush_key(7, lo, lo + len(rec)).rsplit("/", 1)[1] in _keys(server, loc, st, 7)


def test_a_stale_merge_deletes_no_newer_merged_object(place, monkeypatch):
    """A zombie's merge of a ledger that the new owner cuts meanwhile (a merged object of a
    newer epoch, written between the merge's read of the layout and its writes) writes nothing
    and deletes nothing: the new owner's object stays the ledger."""
    server, loc, meta = place
    old = _storage(loc, meta, epoch=1)
    w = old.create(8)
    recs = [_append(w, i) for i in range(3)]
    w.close()
    new = _storage(loc, meta, epoch=2)
    whole = new.read_all(8)
    assert whole is not None
    cut_end = lf.FILE_HEADER_SIZE + len(recs[0]) + len(recs[1])
    newer = new._merged_key(8, cut_end)
    real = old._objects
    calls: list[int] = []

    def listing(ledger_id: int) -> dict[str, int]:
        got = real(ledger_id)
        calls.append(ledger_id)
        if len(calls) == 1:  # the merge read its layout; now the new owner's recovery cuts
            new.store.put(newer, [whole[:cut_end]])
        return got

    monkeypatch.setattr(old, "_objects", listing)
    assert old.merge(8) is False
    names = _keys(server, loc, old, 8)
    assert newer.rsplit("/", 1)[1] in names
    assert not any(n.startswith("m-") and n.endswith("e0000000001") for n in names)
    assert _storage(loc, meta, epoch=3).read_all(8) == whole[:cut_end]


def test_a_range_record_landing_during_a_merge_is_neither_superseded_nor_released(place, monkeypatch):
    """The chaos test's lost ledger ('ledger 98 holds no bytes [24, 1730)'): a group commit of
    the ledger's bytes [24, ...) ended on a ConnectionLoss (outcome unknown) and landed; a merge
    of the same broker, whose view of the ledger was read before the record was there, saw the
    24-byte header only. It wrote a 24-byte merged object (which every reader takes as the
    ledger) and released every range record -- the landed one too. The record lands here in the
    merge's real call, between its read of the layout and its write; the merge takes its object
    back, releases nothing, and the ledger still holds the bytes."""
    server, loc, meta = place
    writer_storage = _storage(loc, meta, epoch=1, solo=False)  # every flush a range record
    w = writer_storage.create(9)
    merger = _storage(loc, meta, epoch=1)  # the broker's storage after the topic's reopen
    acked: list[bytes] = []
    real = merger._objects

    def listing(ledger_id: int) -> dict[str, int]:
        if not acked:  # the merge read the (empty) range records: now the commit lands
            acked.append(_append(w, 0))
        return real(ledger_id)

    monkeypatch.setattr(merger, "_objects", listing)
    merged = merger.merge(9)
    assert acked
    assert _storage(loc, meta, epoch=2).read_all(9) == lf.encode_file_header(9) + acked[0]
    assert writer_storage.shared_ranges(9), "the landed range record was released"
    assert merged is False
    assert not any(n.startswith("m-") for n in _keys(server, loc, merger, 9))
    w.close()
    # the next merge (at the next open) takes the landed bytes in
    fresh = _storage(loc, meta, epoch=1)
    assert fresh.merge(9) is True
    assert fresh.shared_ranges(9) == []
    assert _storage(loc, meta, epoch=2).read_all(9) == lf.encode_file_header(9) + acked[0]


def test_a_cut_under_an_ended_fence_supersedes_and_releases_nothing(place):
    """Recovery cuts a ledger before its fenced commit: a broker whose ownership ended (a
    zombie, its view of the ledger stale or torn) must not write a shorter merged object, which
    every reader would take as the ledger, nor release the new owner's range records."""
    server, loc, meta = place
    meta.put("/fence-cut", b"")
    fence = Fence(checks=(Check("/fence-cut", 0),), epoch=1, what="bundle cut")
    owner = _storage(loc, meta, epoch=1, solo=False, fence=fence)
    w = owner.create(10)
    recs = [_append(w, i) for i in range(2)]
    w.close()
    meta.put("/fence-cut", b"taken")  # another broker took the bundle
    zombie = _storage(loc, meta, epoch=1, solo=False, fence=fence)
    with pytest.raises(Fenced):
        zombie.cut(10, lf.FILE_HEADER_SIZE + len(recs[0]))
    assert not any(n.startswith("m-") for n in _keys(server, loc, owner, 10))
    assert len(owner.shared_ranges(10)) == 2
    assert _storage(loc, meta, epoch=2).read_all(10) == lf.encode_file_header(10) + b"".join(recs)


def test_a_seal_under_an_ended_fence_replaces_no_index(place):
    """A topic unloaded after its broker's session was lost seals its ledger before the ledger
    list's commit fails: its index (which replaces the ledger's whole) must not replace the one
    the next owner's recovery wrote."""
    _server, loc, meta = place
    meta.put("/fence-seal", b"")
    fence = Fence(checks=(Check("/fence-seal", 0),), epoch=1, what="bundle seal")
    old = _storage(loc, meta, epoch=1, solo=False, fence=fence)
    w = old.create(12)
    _append(w, 0)
    w.close()
    meta.put("/fence-seal", b"taken")
    new = _storage(loc, meta, epoch=2)
    new.write_index(12, b"the new owner's index")
    with pytest.raises(Fenced):
        old.write_index(12, b"a zombie's index")
    assert new.read_index(12) == b"the new owner's index"
    new.wait_merged(30)


def test_the_offload_orphan_sweep_deletes_no_object_ledger(seaweedfs, tmp_path):
    """In cluster mode the offload catalog names the object-ledger store (compacted views are
    written beside the ledgers), so the offloader's start-up sweep of ``ledgers/`` there saw every
    live ledger object as an orphan of an interrupted offload and deleted it (the chaos test: 651
    objects at one broker restart). It deletes only keys an offload writes."""
    import uuid

    from compactmq.config import load_config
    from compactmq.storage.engine import Storage
    from compactmq.storage.offload import COMPACTED, OffloadRecord
    from compactmq.storage.offload.blobstore import open_store

    bucket = seaweedfs.create_bucket("offload-sweep")
    url = f"s3://{bucket}/{uuid.uuid4().hex[:10]}?region=us-east-1&endpoint={seaweedfs.endpoint}"
    config = load_config(
        overrides={
            "metadataStoreUrl": f"memory:s{uuid.uuid4().hex[:8]}",
            "objectLedgerStorageUrl": url,
            "managedLedgerMinLedgerRolloverTimeMinutes": 0,
        }
    )
    s = Storage(tmp_path / "broker", config)
    try:
        ml = s.open_managed_ledger(TOPIC)
        positions = [ml.append(b"acked-%d" % i) for i in range(3)]
        assert s.object_store is not None
        loc = s.object_store.location
        store = open_store(loc)
        ledger_keys = [k for k in store.list("ledgers")]
        assert ledger_keys
        # a compacted view's row, as a cluster-mode compaction run publishes it (its objects
        # live in the object-ledger store's location); and a true offload orphan there
        view_key = "compacted/persistent/public/default/deletes/000000000077/view.data"
        store.put(view_key, [b"view"])
        s.offloader.catalog.add(OffloadRecord(view_key, view_key, COMPACTED, TOPIC, 77, loc, 4, 1, 1))
        orphan = "ledgers/persistent/public/default/deletes/000000000999-dead.data"
        store.put(orphan, [b"half an upload"])
        removed = s.offloader.sweep_orphans()
        assert removed == [orphan]
        assert sorted(store.list("ledgers")) == sorted(ledger_keys)
        assert [d for _, d in ml.read_entries(positions[0], 10)] == [b"acked-%d" % i for i in range(3)]
    finally:
        s.close()
