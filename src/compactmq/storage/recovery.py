"""Opening a managed ledger: recovery after a crash, or a read-only view of another writer's.

Opening for writing recovers (``recover``): every ledger still OPEN in the metadata store (the
broker stopped without closing it) is scanned, its torn tail (a record that is short or fails
its CRC, ``ledger_file``) cut off durably, its index written and the ledger recorded CLOSED.
Empty ledgers, and ledger bytes the metadata store does not know (a crash between steps) or
half-written files, are removed. Then a new ledger is opened for writing, as Pulsar does. The
metadata changes are ONE transaction: recovered ledgers CLOSED, empty ones gone, the new one
OPEN; bytes are deleted only after it commits, so a crash anywhere repeats recovery at worst.

Opening read-only (``load_read_only``: a ``compact-topic`` job beside the broker) touches
nothing: CLOSED ledgers are taken as recorded and the OPEN one is read up to its last complete
record; ``ManagedLedger.refresh`` repeats this to pick up what the writer added since.
"""

from __future__ import annotations

from typing import Callable

from ..errors import StorageError
from . import ledger_file as lf
from .appender import Appender
from .ledger_metadata import LedgerMetadata
from .ledger_state import LedgerList, LedgerState
from .ledger_storage import LedgerStorage
from .position import LEDGER_CLOSED, LEDGER_OPEN, LedgerInfo
from .reader import IndexCache


def recover(
    ledgers: LedgerList,
    storage: LedgerStorage,
    metadata: LedgerMetadata,
    appender: Appender,
    indexes: IndexCache,
    clock: Callable[[], int],
) -> None:
    """Recover a managed ledger opened for writing and start a new ledger (module docstring)."""
    topic = ledgers.topic
    now = clock()
    infos = metadata.ledgers(topic)
    # bytes no listed ledger owns: listed now, deleted only once our commit went through
    unlisted = storage.list() - {i.ledger_id for i in infos}
    gone: list[int] = []
    closing: list[LedgerInfo] = []
    for info in infos:
        if info.state == LEDGER_OPEN:
            led = _recover_open_ledger(topic, storage, info, now)
            if led is None:
                gone.append(info.ledger_id)
                continue
            closing.append(ledgers.info(led, led.count))
            indexes.touch(led)
        else:
            if info.entry_count == 0:
                gone.append(info.ledger_id)
                continue
            led = LedgerState.from_info(info)
        ledgers.add(led)
    # one transaction: recovered ledgers CLOSED, empty ones gone, a new ledger OPEN
    with metadata.transaction():
        for closed in closing:
            metadata.close_ledger(closed)
        if gone:
            metadata.delete_ledgers(topic, gone)
        new_id = metadata.add_ledger(topic, now)
    for ledger_id in gone:
        storage.delete(ledger_id)
    _remove_orphans(storage, unlisted, metadata, topic)
    # superseded objects go only now, as the orphans: a broker paused past its session before
    # this commit deletes nothing (it once did this first, unfenced)
    storage.discard_partial_writes()
    appender.start_ledger(new_id, now)


def _recover_open_ledger(
    topic: str, storage: LedgerStorage, info: LedgerInfo, now: int
) -> LedgerState | None:
    """Scan a ledger left OPEN, cut its torn tail, write its index; None when empty."""
    try:
        buf = storage.read_all(info.ledger_id)
    except OSError as e:
        raise StorageError(f"{topic}: cannot read ledger {info.ledger_id}: {e}") from e
    if buf is None:
        return None
    try:
        lf.decode_file_header(buf)
    except StorageError:
        # a crash before the header reached the disk: nothing was ever acknowledged here
        return None
    scan = lf.scan_records(buf, verify_crc=True)
    if len(scan.entry_ids) == 0:
        return None
    if scan.torn:
        storage.cut(info.ledger_id, scan.valid_end)
    led = LedgerState(
        info.ledger_id,
        LEDGER_CLOSED,
        info.created_ms,
        now,
        len(scan.entry_ids),
        int(scan.lengths.sum()),
        int(scan.publish_times[0]),
        int(scan.publish_times[-1]),
    )
    led.offsets, led.publish_times, led.data_end = scan.offsets, scan.publish_times, scan.valid_end
    storage.write_index_columns(led.ledger_id, led.offsets, led.publish_times, led.data_end)
    if storage.ranged_index_reads:  # readers read the index just written piece by piece
        led.offsets = led.publish_times = None
    return led


def _remove_orphans(storage: LedgerStorage, unlisted: set[int], metadata: LedgerMetadata, topic: str) -> None:
    """Delete the bytes of ledgers no committed ledger list names: a crash between creating a
    ledger and recording it, or a fenced owner's ledger that never became visible.

    Only after this broker's own commit went through, and only ledgers that existed before it
    (``unlisted``: listed before the commit) and are still missing from the list as it reads
    after the commit. Deleting them before the commit, as this once did, could delete live data
    in a cluster: a broker whose session had lapsed (a zombie, paused mid-recovery) would list
    ledgers the next owner had created and committed since its own read, and delete them -- the
    commit that follows fails on the ownership fence, but the bytes were already gone (issue 26's
    chaos test lost acknowledged messages that way). A commit under the fence proves this broker
    owned the topic at that moment; ledgers created later by another owner are not in
    ``unlisted``; and the list read after the commit includes every ledger committed before it
    (the commit itself was a read-modify-write of that list), so a stale first read cannot make a
    committed ledger look orphaned."""
    if not unlisted:
        return
    for ledger_id in unlisted - {i.ledger_id for i in metadata.ledgers(topic)}:
        storage.delete(ledger_id)


def load_read_only(ledgers: LedgerList, storage: LedgerStorage, metadata: LedgerMetadata) -> None:
    """Another process writes this topic: take CLOSED ledgers as recorded and read the OPEN
    one up to its last complete record, touching nothing."""
    loaded: list[LedgerState] = []
    for info in metadata.ledgers(ledgers.topic):
        led = LedgerState.from_info(info)
        if info.state == LEDGER_OPEN:
            try:
                buf = storage.read_all(info.ledger_id)
                if buf is None:
                    continue
                scan = lf.scan_records(buf, verify_crc=True)
            except (OSError, StorageError):
                continue
            led.count = len(scan.entry_ids)
            led.size = int(scan.lengths.sum())
            led.offsets, led.publish_times, led.data_end = scan.offsets, scan.publish_times, scan.valid_end
            if led.count:
                led.first_pt, led.last_pt = int(scan.publish_times[0]), int(scan.publish_times[-1])
        if led.count:
            loaded.append(led)
    with ledgers.lock:
        storage.close()  # read handles of the ledgers replaced below
        ledgers.replace_all(loaded)
