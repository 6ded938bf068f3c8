"""Compaction strategies: which of two values of one key survives.

A strategy answers ``should_keep_left(prev, cur)`` for two non-tombstone messages of the same key,
``prev`` published before ``cur`` (PIP-215's ``TopicCompactionStrategy``). The fold that uses it
is described in the package docstring; tombstones are handled by the fold, not by strategies.

The three built-ins carry a ``native`` name so the Spark pipeline runs them as plain aggregates
(no Python per message); any other class is folded in Python workers, one call per pair.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Collection, Optional

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


#: the longest strategy name a policy may hold
MAX_NAME = 256

BUILTIN = {
    "keep-latest": KeepLatestStrategy,
    "keep-first": KeepFirstStrategy,
    "event-time": EventTimeStrategy,
}


def allowed_strategy_classes(config) -> frozenset[str]:
    """The dotted class names a ``compactionStrategy`` policy may name on this broker: the
    operator's ``topicCompactionStrategyAllowedClasses`` list, plus the broker's own default
    ``topicCompactionStrategy`` when that is a class (the operator chose it). Nothing else is ever
    imported because of a policy (docs/security.md)."""
    from ..config import config_list

    names = set(config_list(config, "topicCompactionStrategyAllowedClasses")) if config else set()
    default = str((config or {}).get("topicCompactionStrategy") or "").strip()
    if default and default not in BUILTIN:
        names.add(default)
    return frozenset(names)


def check_strategy_name(name: Any, allowed: Collection[str]) -> str:
    """``name`` stripped, when it is a built-in or in ``allowed``; ``InvalidConfiguration`` (with
    the list of what is allowed) otherwise. Pure string work: nothing is imported."""
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME:
        raise InvalidConfiguration(
            f"compactionStrategy must be a non-empty string of at most {MAX_NAME} characters"
        )
    name = name.strip()
    if name in BUILTIN or name in allowed:
        return name
    choices = ", ".join([*BUILTIN, *sorted(allowed)])
    raise InvalidConfiguration(
        f"compaction strategy {name[:200]!r} is not allowed on this broker: use one of {choices} "
        "(an operator may allow more classes with topicCompactionStrategyAllowedClasses)"
    )


def resolve_strategy(name: Optional[str], allowed: Collection[str] = ()) -> TopicCompactionStrategy:
    """A strategy from a short name (keep-latest, keep-first, event-time) or a dotted class name
    listed in ``allowed`` (``allowed_strategy_classes``). The name is checked before anything is
    imported: a name from a policy that is not on the list is refused, never imported.

    Raises:
        InvalidConfiguration: a name not allowed, or a class without ``should_keep_left``.
    """
    name = check_strategy_name(name or "keep-latest", allowed)
    if name in BUILTIN:
        return BUILTIN[name]()
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
