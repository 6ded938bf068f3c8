"""The one module of the Spark source that knows how a compacted view is read.

Everything else in ``compactmq.spark`` asks this module three things: what a topic's compacted view
looks like right now (``describe``: the compacted ledger in force, the horizon, the retention floor,
the strategy and the keyless-message setting), the entries of a slice of the compacted ledger
(``read_slice``, on an executor, from the file alone), and how to fold one key's messages
(``fold``). They go through the public read API of the compaction layer
(``LedgerCompactionService`` / ``CompactedLedgerReader`` / ``topic_settings`` / strategies); if that
API changes, this is the module to adapt.

A compacted view, as the broker serves it to a read-compacted consumer, is the compacted ledger's
entries (ids <= horizon; in ``retention-bounded`` mode only those at or after the topic's first
retained entry) followed by the live topic after the horizon.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class CompactedView:
    """A snapshot of a topic's compacted view (picklable: it travels to executors)."""

    path: str | None  # compacted ledger file in force, None before the first compaction
    horizon: tuple | None  # (ledger, entry) of the last compacted entry, None when none
    floor: tuple | None  # first retained position in retention-bounded mode, else None
    strategy: str  # strategy name (built-in or dotted class path)
    retain_null_key: bool
    ledger_ids: tuple = ()  # source ledger of each compacted entry, grouped: ((ledger, first, stop), ...)
    # through the broker (which shows no index of the view): where the view's entries are
    # estimated to sit among the source entries, ((ledger, first entry, stop entry), ...) spans
    # (``broker.probe_view``); empty when not probed
    spans: tuple = ()


def checked_strategy(name, allowed) -> str:
    """The strategy name of a topic's policy, when this read may use it: a built-in, or a class the
    reader listed in its ``compactionStrategyClasses`` option (``allowed``). Anything else is one
    clear ``InvalidConfiguration``, raised on the driver before any import: a tenant admin's
    policy never makes a reader import code the reader did not choose (docs/security.md)."""
    from ..compaction.strategies import check_strategy_name

    return check_strategy_name(name or "keep-latest", allowed)


def describe(storage, topic: str, config) -> CompactedView:
    """The compacted view of ``topic`` as the metadata store names it now (driver side). Its
    ``strategy`` is the policy's name as stored: a ``latest`` read checks it (``checked_strategy``)."""
    from ..compaction.runner import topic_settings
    from ..compaction.service import LedgerCompactionService
    from ..config import RETENTION_BOUNDED

    settings = topic_settings(storage, topic, config)
    service = LedgerCompactionService(storage, topic, config)
    try:
        horizon = service.get_last_compacted_position()
        reader = service.compacted_ledger()
    finally:
        service.close()
    floor = None
    if settings["retention_mode"] == RETENTION_BOUNDED:
        ml = storage.open_managed_ledger(topic, create=False)
        first = ml.first_position()
        floor = tuple(first) if first is not None else None
    groups: list = []
    path = None
    if reader is not None:
        path = reader.path
        i = reader.find(floor) if floor is not None else 0
        for lid, count in zip(*(a.tolist() for a in reader.ledger_runs(i))):
            groups.append((lid, i, i + count))
            i += count
    return CompactedView(
        path,
        tuple(horizon) if horizon is not None else None,
        floor,
        settings["strategy"] or "keep-latest",
        settings["retain_null_key"],
        tuple(groups),
    )


def read_slice(path: str, first: int, stop: int) -> Iterator[tuple[int, int, bytes]]:
    """``(ledger_id, entry_id, entry bytes)`` of compacted-ledger entries ``first`` .. ``stop - 1``."""
    yield from read_slices(path, [(first, stop)])


def read_slices(path: str, runs) -> Iterator[tuple[int, int, bytes]]:
    """``read_slice`` of each ``(first, stop)`` of ``runs`` in turn, the ledger opened once."""
    from ..compaction.compacted_ledger import CompactedLedgerReader

    reader = CompactedLedgerReader(path)
    for first, stop in runs:
        yield from _slice(reader, first, stop)


def _slice(reader, first: int, stop: int) -> Iterator[tuple[int, int, bytes]]:
    stop = min(stop, len(reader))
    for i in range(first, stop, 4096):  # a range at a time (one read), not the whole index
        j = min(stop, i + 4096)
        lids, eids = reader.columns(i, j)[:2]
        yield from zip(lids.tolist(), eids.tolist(), reader.entries(i, j))


def strategy(name: str):
    """The strategy object of a name in a split. Splits are planned by this reader's own driver,
    which let only ``checked_strategy`` names into them, so the name is resolved as given."""
    from ..compaction.strategies import resolve_strategy

    return resolve_strategy(name, (name,))


def fold(messages, strat):
    """The survivor of one key's messages (``messages.Message`` in id order) or None (deleted),
    by the same left fold compaction uses (``compaction.strategies.fold``)."""
    from ..compaction.strategies import Message as StrategyMessage
    from ..compaction.strategies import fold as strategy_fold

    as_strategy = [
        StrategyMessage(m.key, m.value, m.message_id, m.publish_time, m.event_time, m.properties)
        for m in messages
    ]
    survivor = strategy_fold(as_strategy, strat)
    if survivor is None:
        return None
    return next(m for m, s in zip(messages, as_strategy) if s is survivor)


def reducible(strat) -> bool:
    """True when only a key's last tail message matters (keep-latest): the tail can be shrunk."""
    return getattr(strat, "native", None) == "keep-latest"
