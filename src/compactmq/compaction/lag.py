"""Time in compaction: how old the oldest uncompacted message is, and where a run may stop.

Two topic policies (else namespace policies, else broker settings) bring time into compaction,
as Kafka's ``max.compaction.lag.ms`` and ``min.compaction.lag.ms`` do (Pulsar has neither):

* ``compactionMaxLagSeconds`` (broker default ``brokerServiceCompactionMaxLagInSeconds``, 0 =
  off): the broker's compaction monitor compacts a topic whose oldest uncompacted message is
  older than this, whatever its backlog. That bounds how long a deleted key stays readable:
  max lag + the monitor's interval + one run.
* ``compactionMinLagSeconds`` (``brokerServiceCompactionMinLagInSeconds``, 0 = off): a message
  younger than this is not compacted yet -- the run's horizon stops at the last entry published
  at least that long ago, so a consumer that is a little behind still sees every version.

The *age* of a message is now minus its publish time, as the managed ledger's entry index keeps
it (the producer's ``publish_time``, taken per entry: for a batch, the batch's). The *oldest
uncompacted message* is the first entry after the horizon (the first entry of the topic when it
was never compacted). Publish times are not required to grow: a run stops before the first entry
younger than the minimum lag, so an older entry behind it waits for a later run (conservative).

Plain functions of a managed ledger and a horizon: the monitor (broker) and every compaction
service call the same ones, and neither needs to know how compacted views are kept.
"""

from __future__ import annotations

from typing import Any, Optional

from ..storage.position import Position


def first_uncompacted(ml, horizon) -> Optional[Position]:
    """The first entry after ``horizon`` (None: there is none yet)."""
    last = ml.last_position()
    if last is None:
        return None
    if horizon is None:
        return ml.first_position()
    if tuple(last) <= tuple(horizon):
        return None
    nxt = ml.next_position(Position(*horizon))
    return nxt if tuple(nxt) <= tuple(last) else None


def oldest_uncompacted_publish_ms(ml, horizon) -> Optional[int]:
    """Publish time (ms) of the first entry after ``horizon``; None when everything is compacted."""
    pos = first_uncompacted(ml, horizon)
    return None if pos is None else ml.publish_time_of(pos)


def compaction_lag_ms(ml, horizon, now_ms: int) -> int:
    """Age of the oldest uncompacted message in ms (0 when everything is compacted)."""
    oldest = oldest_uncompacted_publish_ms(ml, horizon)
    return 0 if oldest is None else max(0, int(now_ms) - oldest)


def last_compactable(ml, min_lag_seconds: int, now_ms: int) -> Optional[Position]:
    """The last entry a run may compact: the topic's last entry, or with a minimum lag the entry
    just before the first one published less than ``min_lag_seconds`` ago; None: no such entry."""
    last = ml.last_position()
    if last is None or min_lag_seconds <= 0:
        return last
    cut = ml.find_position_by_publish_time(int(now_ms) - int(min_lag_seconds) * 1000 + 1)
    return entry_before(ml, cut)


def entry_before(ml, position) -> Optional[Position]:
    """The last entry with an id below ``position`` (across ledgers), or None."""
    lid, eid = int(position[0]), int(position[1])
    best = None
    for info in ml.ledgers():
        if info.entry_count <= 0 or info.ledger_id > lid:
            continue
        if info.ledger_id == lid:
            if eid > 0:
                best = Position(lid, min(eid, info.entry_count) - 1)
        else:
            best = Position(info.ledger_id, info.entry_count - 1)
    return best


def lag_seconds_setting(meta, topic: str, key: str, default: Any) -> int:
    """A lag policy in force for ``topic`` (topic, namespace, broker default), in whole seconds;
    a stored value that is not a number reads as 0 (off)."""
    value = meta.effective_policy(topic, key, default)
    try:
        return max(0, int(value or 0))
    except (TypeError, ValueError):
        return 0
