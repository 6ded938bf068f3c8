"""Producers attached to a topic, and the access-mode rule (Shared / Exclusive).

Pulsar's access modes: *Shared* producers coexist; an *Exclusive* producer is refused while any
other producer is attached, and while it is attached every other producer is refused
(ProducerBusy, which clients do not retry). *WaitForExclusive* queues instead: the client gets
PRODUCER_SUCCESS with ``producer_ready=false`` at once and a second one, ready, when the topic
is free (first come, first served). *ExclusiveWithFencing* closes the others and takes over.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

from ..errors import ProducerBusy

if TYPE_CHECKING:  # pragma: no cover
    from .topics import Topic

SHARED, EXCLUSIVE, WAIT_FOR_EXCLUSIVE, EXCLUSIVE_WITH_FENCING = 0, 1, 2, 3
ACCESS_MODE_NAMES = {0: "Shared", 1: "Exclusive", 2: "WaitForExclusive", 3: "ExclusiveWithFencing"}

_serials = itertools.count()


class Producer:
    def __init__(self, topic: "Topic", connection: Any, producer_id: int, name: str,
                 access_mode: int = SHARED, schema_version: bytes = b"") -> None:
        self.topic = topic
        self.connection = connection
        self.producer_id = producer_id
        self.name = name
        self.access_mode = access_mode
        self.schema_version = schema_version
        self.serial = next(_serials)
        self.closed = False
        self.messages_in = 0
        self.bytes_in = 0

    def __repr__(self) -> str:
        return f"Producer({self.name!r}, id={self.producer_id}, topic={self.topic.name})"

    @property
    def exclusive(self) -> bool:
        return self.access_mode != SHARED


class MustWait(Exception):
    """A WaitForExclusive producer has to queue (not an error: it is told to wait)."""


def check_access(existing: list[Producer], access_mode: int, name: str) -> list[Producer]:
    """Raise ProducerBusy when a producer in ``access_mode`` may not join ``existing``
    (MustWait for a WaitForExclusive producer that has to queue).

    Returns the producers to fence (close) first: only ExclusiveWithFencing fences.
    """
    for p in existing:
        if p.name == name and not p.closed:
            raise ProducerBusy(f"producer with name {name!r} is already connected to topic {p.topic.name}")
    live = [p for p in existing if not p.closed]
    if access_mode == EXCLUSIVE_WITH_FENCING:
        return live
    if access_mode == WAIT_FOR_EXCLUSIVE and live:
        raise MustWait()
    if access_mode != SHARED and live:
        raise ProducerBusy(
            f"topic has {len(live)} producer(s) attached; {ACCESS_MODE_NAMES[access_mode]} access refused"
        )
    for p in live:
        if p.exclusive:
            raise ProducerBusy(f"topic has an exclusive producer {p.name!r}")
    return []
