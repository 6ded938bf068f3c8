"""Producers attached to a topic, and the access-mode rule (PIP-68, as Pulsar answers).

* *Shared* producers coexist; one is refused with ProducerBusy while an exclusive producer is
  attached or waiting.
* *Exclusive* is refused with ProducerFenced while any other producer is attached (exclusive:
  "Topic has an existing exclusive producer", shared: "Topic has existing shared producers")
  or waiting. The official clients do not retry ProducerFenced.
* *WaitForExclusive* queues: PRODUCER_SUCCESS with ``producer_ready=false`` at once and a
  second one, ready, when the topic is free (first come, first served).
* *ExclusiveWithFencing* takes over: the producers attached are closed by the broker and the
  waiting ones fail with ProducerFenced. A closed producer reconnects, is refused with
  ProducerFenced and from then on fails every send with ProducerFenced.

Topic epochs. Each time an exclusive producer (any of the three exclusive modes) takes the
topic, the topic's epoch grows by one; PRODUCER_SUCCESS carries it and the client sends it back
when it reconnects. A producer that comes back with an epoch older than the topic's has been
replaced meanwhile and is fenced. The epoch is kept in the topic's properties in the metadata
store, so it only grows, across restarts too.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

from ..errors import CompactMQError, ProducerBusy, ServerError

if TYPE_CHECKING:  # pragma: no cover
    from .topics import Topic

SHARED, EXCLUSIVE, WAIT_FOR_EXCLUSIVE, EXCLUSIVE_WITH_FENCING = 0, 1, 2, 3
ACCESS_MODE_NAMES = {0: "Shared", 1: "Exclusive", 2: "WaitForExclusive", 3: "ExclusiveWithFencing"}

_serials = itertools.count()


class Producer:
    def __init__(
        self,
        topic: "Topic",
        connection: Any,
        producer_id: int,
        name: str,
        access_mode: int = SHARED,
        schema_version: bytes = b"",
    ) -> None:
        self.topic = topic
        self.connection = connection
        self.producer_id = producer_id
        self.name = name
        self.access_mode = access_mode
        self.schema_version = schema_version
        self.topic_epoch: int | None = None  # the epoch the client knew (request), then granted
        self.serial = next(_serials)
        self.closed = False
        self.messages_in = 0
        self.bytes_in = 0

    def __repr__(self) -> str:
        return f"Producer({self.name!r}, id={self.producer_id}, topic={self.topic.name})"

    @property
    def exclusive(self) -> bool:
        return self.access_mode != SHARED


class ProducerFenced(CompactMQError):
    """A newer exclusive producer owns the topic (wire code ProducerFenced)."""

    server_error = ServerError.ProducerFenced
    http_status = 409
    peer_fault = True


class MustWait(Exception):
    """A WaitForExclusive producer has to queue (not an error: it is told to wait)."""


def check_access(
    existing: list[Producer], access_mode: int, name: str, others_waiting: bool = False
) -> list[Producer]:
    """Raise when a producer in ``access_mode`` may not join ``existing`` now: ProducerBusy or
    ProducerFenced as Pulsar answers, MustWait for a WaitForExclusive producer that has to
    queue. ``others_waiting``: WaitForExclusive producers are queued already.

    Returns the producers to fence (close) first: only ExclusiveWithFencing fences.
    """
    for p in existing:
        if p.name == name and not p.closed:
            raise ProducerBusy(f"producer with name {name!r} is already connected to topic {p.topic.name}")
    live = [p for p in existing if not p.closed]
    exclusive = next((p for p in live if p.exclusive), None)
    if access_mode == EXCLUSIVE_WITH_FENCING:
        return live
    if access_mode == WAIT_FOR_EXCLUSIVE:
        if live or others_waiting:
            raise MustWait()
        return []
    if access_mode == EXCLUSIVE:
        if exclusive is not None or others_waiting:
            owner = exclusive.name if exclusive is not None else "(waiting)"
            raise ProducerFenced(f"Topic has an existing exclusive producer: {owner}")
        if live:
            raise ProducerFenced("Topic has existing shared producers")
        return []
    if exclusive is not None or others_waiting:
        owner = exclusive.name if exclusive is not None else "(waiting)"
        raise ProducerBusy(f"Topic has an existing exclusive producer: {owner}")
    return []


def check_epoch(producer: Producer, topic_epoch: int) -> None:
    """An exclusive producer that reconnects with an epoch older than the topic's was replaced."""
    if producer.topic_epoch is not None and producer.topic_epoch < topic_epoch:
        raise ProducerFenced(
            f"Topic epoch has already moved. Current epoch: {topic_epoch}, "
            f"Producer epoch: {producer.topic_epoch}"
        )
