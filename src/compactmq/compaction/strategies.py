"""Compaction strategies: which of two values of one key survives.

A strategy answers ``should_keep_left(prev, cur)`` for two non-tombstone messages of the same key,
``prev`` published before ``cur`` (PIP-215's ``TopicCompactionStrategy``). The fold that uses it
is described in the package docstring; tombstones are handled by the fold, not by strategies.

The three built-ins carry a ``native`` name so the Spark pipeline runs them as plain aggregates
(no Python per message); any other class is folded in Python workers, one call per pair.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..errors import InvalidConfiguration
from . import load_class


@dataclass(frozen=True)
class Message:
    """A message as a strategy sees it. ``message_id`` is (ledger_id, entry_id, batch_index)."""

    key: str
    payload: bytes
    message_id: tuple
    publish_time: int = 0
    event_time: int = 0  # 0 when the producer set none
    properties: dict = field(default_factory=dict)


class TopicCompactionStrategy:
    """Base of strategies. ``native`` names a built-in the Spark engine evaluates itself."""

    native: Optional[str] = None

    def should_keep_left(self, prev: Message, cur: Message) -> bool:  # pragma: no cover
        raise NotImplementedError


class KeepLatestStrategy(TopicCompactionStrategy):
    """The newest value of a key wins (Pulsar's default)."""

    native = "keep-latest"

    def should_keep_left(self, prev: Message, cur: Message) -> bool:
        return False


class KeepFirstStrategy(TopicCompactionStrategy):
    """PIP-215: the first value of a key stands until a tombstone deletes the key."""

    native = "keep-first"

    def should_keep_left(self, prev: Message, cur: Message) -> bool:
        return True


class EventTimeStrategy(TopicCompactionStrategy):
    """The newest ``event_time`` wins; on equal times the later message (publish order) wins.
    A message without an event time counts as time 0."""

    native = "event-time"

    def should_keep_left(self, prev: Message, cur: Message) -> bool:
        return prev.event_time > cur.event_time


BUILTIN = {
    "keep-latest": KeepLatestStrategy,
    "keep-first": KeepFirstStrategy,
    "event-time": EventTimeStrategy,
}


def resolve_strategy(name: Optional[str]) -> TopicCompactionStrategy:
    """A strategy from a short name (keep-latest, keep-first, event-time) or a dotted class name.

    Raises:
        InvalidConfiguration: unknown name, or a class without ``should_keep_left``.
    """
    name = (name or "keep-latest").strip()
    if name in BUILTIN:
        return BUILTIN[name]()
    if "." not in name:
        raise InvalidConfiguration(
            f"unknown compaction strategy {name!r}: use keep-latest, keep-first, event-time "
            "or a dotted class name"
        )
    cls = load_class(name, "topicCompactionStrategy")
    strategy = cls() if isinstance(cls, type) else cls
    if not callable(getattr(strategy, "should_keep_left", None)):
        raise InvalidConfiguration(f"compaction strategy {name!r} has no should_keep_left(prev, cur)")
    return strategy


def fold(messages, strategy: TopicCompactionStrategy):
    """The survivor of one key's messages (given in id order), or None when a tombstone ends
    them. Plain Python: the user-strategy path and the tests' reference model use it."""
    state = None
    for cur in messages:
        if len(cur.payload) == 0:  # a tombstone
            state = None
        elif state is None or not strategy.should_keep_left(state, cur):
            state = cur
    return state
