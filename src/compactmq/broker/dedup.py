"""Message deduplication: a message whose sequence id its producer already published is
acknowledged without being stored again (Pulsar's ``MessageDeduplication``).

The rule. A producer numbers its messages; a client that reconnects resends what it had not
seen acknowledged, so after a broker restart or a lost receipt the same message arrives twice.
With deduplication on, the broker keeps, per producer *name*, two numbers:

* ``pushed``: the highest sequence id accepted for publishing (maybe not yet persisted);
* ``persisted``: the highest sequence id whose entry is stored (``Topic.last_sequence_ids``,
  the value PRODUCER_SUCCESS answers as ``last_sequence_id``).

A SEND whose last sequence id (``highest_sequence_id`` for a batch) is above ``pushed`` is new.
At or below ``persisted`` it is a duplicate: the receipt carries ``-1:-1``, as Pulsar answers,
and nothing is stored. In between it is a copy of a message still being written: its answer
waits behind that write (``Topic.publish_marker``) and is a duplicate receipt if the write
succeeded, a SEND_ERROR (the client reconnects and resends) if it failed.

Durability. The numbers live in memory and are snapshotted into the properties of a durable
cursor named ``pulsar.dedup`` (Pulsar's name) every ``brokerDeduplicationEntriesInterval``
entries and when the topic closes: the snapshot goes first, then the cursor's mark-delete
position moves to the entry it covers. When the topic loads, the snapshot is read and every
entry after the mark-delete position is replayed (its metadata carries producer name and
sequence ids), so the numbers are exact after a restart or a SIGKILL. Replaying with "keep
the maximum" is idempotent, which is why a crash between the two snapshot steps is harmless.
The cursor also keeps retention from deleting entries not yet covered by a snapshot.

Whether it is on: the topic policy ``deduplicationEnabled``, else the namespace policy (same
key, set at ``/namespaces/{t}/{ns}/deduplication``), else ``brokerDeduplicationEnabled``.
Turning it off deletes the cursor, as Pulsar does.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from ..config import policy_keys
from ..protocol.batch import message_count
from ..protocol.entry_format import parse_metadata
from ..storage.position import Position

if TYPE_CHECKING:  # pragma: no cover
    from .topics import Topic

log = logging.getLogger(__name__)

DEDUP_CURSOR = "pulsar.dedup"
POLICY_KEY = policy_keys.DEDUPLICATION_ENABLED
NEW, DUPLICATE, UNKNOWN = "new", "duplicate", "unknown"
# entries read per call while replaying the tail after the snapshot
REPLAY_CHUNK = 1000


def entry_sequence(entry: bytes) -> tuple[str, int] | None:
    """(producer name, last sequence id) of a stored entry; None when it cannot be read."""
    try:
        md = parse_metadata(entry)
    except Exception:  # noqa: BLE001 - a damaged entry only costs its producer's number
        return None
    n = message_count(md)
    seq = md.highest_sequence_id if md.highest_sequence_id > 0 else md.sequence_id + max(n, 1) - 1
    return md.producer_name, seq


def recover(ledger: Any) -> dict[str, int] | None:
    """The persisted sequence ids from the ``pulsar.dedup`` snapshot plus the entries after it
    (runs in the thread pool). None when the topic has no such cursor."""
    cursor = ledger.get_cursor(DEDUP_CURSOR)
    if cursor is None:
        return None
    seqs = {str(k): int(v) for k, v in cursor.properties.items()}
    last = ledger.last_position()
    pos = ledger.next_position(cursor.mark_delete_position)
    while last is not None and pos <= last:
        chunk = ledger.read_entries(pos, REPLAY_CHUNK)
        if not chunk:
            break
        for _, entry in chunk:
            found = entry_sequence(entry)
            if found is not None and seqs.get(found[0], -1) < found[1]:
                seqs[found[0]] = found[1]
        pos = ledger.next_position(chunk[-1][0])
    return seqs


def _snapshot(ledger: Any, seqs: dict[str, int], position: Position | None) -> None:
    # runs in the pool: the snapshot first, then the position it covers (see the module notes)
    cursor = ledger.open_cursor(DEDUP_CURSOR, True, "latest")
    cursor.set_properties(seqs)
    if position is not None:
        cursor.ack_cumulative(position)


def _drop_cursor(ledger: Any) -> None:
    if ledger.get_cursor(DEDUP_CURSOR) is not None:
        ledger.delete_cursor(DEDUP_CURSOR)


class Deduplication:
    """The deduplication state of one topic."""

    def __init__(self, topic: "Topic") -> None:
        self.topic = topic
        self.enabled = False
        self.pushed: dict[str, int] = {}
        self._unsnapshotted = 0
        self._last_snapshot = time.monotonic()
        self._snapshot_running = False

    @property
    def persisted(self) -> dict[str, int]:
        return self.topic.last_sequence_ids

    def _config(self, key: str) -> int:
        return int(self.topic.service.config[key])

    # --- turning it on and off ------------------------------------------------------------------

    async def load(self) -> None:
        """At topic load: read the policy in force, recover the numbers when it is on."""
        enabled = await self._policy()
        if enabled:
            seqs = await self.topic.run_blocking(recover, self.topic.ledger)
            if seqs is not None:
                for name, seq in seqs.items():
                    if self.persisted.get(name, -1) < seq:
                        self.persisted[name] = seq
        await self._apply(enabled)

    async def refresh(self) -> None:
        """The policy may have changed (admin API): apply it to this loaded topic."""
        await self._apply(await self._policy())

    async def _policy(self) -> bool:
        topic = self.topic
        default = bool(topic.service.config[policy_keys.DEFAULT_SETTINGS[POLICY_KEY]])
        value = await topic.run_blocking(
            topic.service.storage.policies.effective_policy, topic.name, POLICY_KEY, default
        )
        return bool(value)

    async def _apply(self, enabled: bool) -> None:
        if enabled == self.enabled:
            return
        self.enabled = enabled
        if enabled:
            # from now on the persisted numbers are the floor; nothing in flight is counted
            self.pushed = dict(self.persisted)
            await self.topic.run_blocking(
                _snapshot, self.topic.ledger, dict(self.persisted), self.topic.last_position
            )
            log.info("deduplication enabled on %s", self.topic.name)
        else:
            self.pushed = {}
            await self.topic.run_blocking(_drop_cursor, self.topic.ledger)
            log.info("deduplication disabled on %s", self.topic.name)

    # --- per message ------------------------------------------------------------------------------

    def check(self, producer_name: str, last_sequence_id: int) -> str:
        """NEW (and counted as pushed), DUPLICATE, or UNKNOWN (a copy of one still being written)."""
        if last_sequence_id > self.pushed.get(producer_name, self.persisted.get(producer_name, -1)):
            self.pushed[producer_name] = last_sequence_id
            return NEW
        if last_sequence_id <= self.persisted.get(producer_name, -1):
            return DUPLICATE
        return UNKNOWN

    def is_persisted(self, producer_name: str, last_sequence_id: int) -> bool:
        return last_sequence_id <= self.persisted.get(producer_name, -1)

    def failed(self, producer_name: str) -> None:
        """A write failed: what was pushed after the last persisted id may be sent again."""
        if self.enabled:
            self.pushed[producer_name] = self.persisted.get(producer_name, -1)

    def entry_persisted(self, position: Position) -> None:
        """Count one stored entry; snapshot when the interval (entries or seconds) is reached."""
        if not self.enabled:
            return
        self._unsnapshotted += 1
        due = self._unsnapshotted >= max(
            1, self._config("brokerDeduplicationEntriesInterval")
        ) or time.monotonic() - self._last_snapshot >= max(
            1, self._config("brokerDeduplicationSnapshotIntervalSeconds")
        )
        if due and not self._snapshot_running:
            self._snapshot_running = True
            self.topic.spawn(self._take_snapshot(position))

    async def _take_snapshot(self, position: Position) -> None:
        try:
            self._unsnapshotted = 0
            self._last_snapshot = time.monotonic()
            await self.topic.run_blocking(_snapshot, self.topic.ledger, dict(self.persisted), position)
        except Exception:  # noqa: BLE001 - the next interval tries again; replay covers the gap
            log.exception("deduplication snapshot of %s failed", self.topic.name)
        finally:
            self._snapshot_running = False

    async def close(self) -> None:
        """Topic closing: one last snapshot, so the next load replays nothing."""
        if self.enabled and self._unsnapshotted and self.topic.last_position is not None:
            try:
                await self.topic.run_blocking(
                    _snapshot, self.topic.ledger, dict(self.persisted), self.topic.last_position
                )
            except Exception:  # noqa: BLE001 - replay at the next load covers it
                log.exception("deduplication snapshot of %s failed", self.topic.name)
