"""A topic's producers: who may attach, in which access mode, and under which topic epoch.

``Topic`` (``topics``) inherits ``TopicProducers``, a mixin: the methods below work on the
topic's own producer table, its queue of WaitForExclusive producers and its epoch, so that
``topics`` stays about moving entries. The rules themselves (which access modes exclude which,
when an epoch fences a producer) are ``producers.check_access`` and ``check_epoch``; this module
applies them to one topic's state as producers come and go.

The topic epoch is Pulsar's: an exclusive producer takes the next epoch (or the one it brings
back on a reconnect, never a lower one), and the epoch is stored in the topic's properties
(``EPOCH_PROPERTY``, raised with one compare-and-set, never lowered) before the producer hears
of it, so that a producer fenced out on one broker stays fenced out on the next owner.
A WaitForExclusive producer queues (``wait_for_exclusive``) and is attached, in arrival order,
once no other producer is left (``_grant_exclusive``, run as producers leave); an
ExclusiveWithFencing producer fails every producer waiting in that queue.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from ..errors import StorageError
from .limits import check_producers
from .producers import EXCLUSIVE_WITH_FENCING, Producer, ProducerFenced, check_access, check_epoch

if TYPE_CHECKING:  # pragma: no cover
    from .server import BrokerService

EPOCH_PROPERTY = "topicEpoch"


class TopicProducers:
    """The producer half of ``Topic`` (a mixin; ``Topic.__init__`` sets these attributes)."""

    service: "BrokerService"
    name: str
    closed: bool
    epoch: int
    last_active: float
    producers: dict[int, Producer]
    closed_producers_in: list[int]
    _exclusive_waiters: list[tuple[Producer, asyncio.Future]]

    def add_producer(self, producer: Producer) -> None:
        """Attach a producer; ProducerBusy / ProducerFenced when its access mode forbids it now,
        MustWait for a WaitForExclusive producer that joins the queue (see
        ``wait_for_exclusive``). An exclusive producer is given the next topic epoch
        (``producer.topic_epoch``; the caller persists it with ``save_epoch``)."""
        if self.closed:
            raise StorageError(f"topic {self.name} is closing")
        check_producers(self.service.config, self.name, len(self.producers))
        fenced = check_access(
            list(self.producers.values()), producer.access_mode, producer.name, bool(self._exclusive_waiters)
        )
        if producer.exclusive:
            check_epoch(producer, self.epoch)
        if producer.access_mode == EXCLUSIVE_WITH_FENCING:
            waiters, self._exclusive_waiters = self._exclusive_waiters, []
            for waiting, fut in waiters:
                if not fut.done():
                    fut.set_exception(ProducerFenced("Fenced out"))
        for old in fenced:
            old.connection.close_producer_by_broker(old)
        self._take_epoch(producer)
        self.producers[producer.serial] = producer
        self.last_active = time.monotonic()

    def _take_epoch(self, producer: Producer) -> None:
        if producer.exclusive:
            # the epoch the client brings back when it reconnects, else the next one
            given = producer.topic_epoch
            self.epoch = given if given is not None and given >= self.epoch else self.epoch + 1
            producer.topic_epoch = self.epoch

    async def save_epoch(self) -> None:
        """Persist the topic epoch (in the topic's properties) before the producer hears of it."""
        await self.service.run_blocking(
            _save_epoch, self.service.storage.topic_metadata, self.name, self.epoch
        )

    @property
    def waiting_producers(self) -> int:
        """WaitForExclusive producers queued for the topic (``waitingPublishers`` in stats)."""
        return sum(1 for _, fut in list(self._exclusive_waiters) if not fut.done())

    async def wait_for_exclusive(self, producer: Producer) -> None:
        """Queue a WaitForExclusive producer; returns once it is attached as the only one."""
        fut = asyncio.get_running_loop().create_future()
        self._exclusive_waiters.append((producer, fut))
        try:
            await fut
        except BaseException:
            self._exclusive_waiters = [(p, f) for p, f in self._exclusive_waiters if f is not fut]
            raise

    def _grant_exclusive(self) -> None:
        while self._exclusive_waiters and not any(not p.closed for p in self.producers.values()):
            producer, fut = self._exclusive_waiters.pop(0)
            if fut.done() or producer.closed or producer.connection.closed:
                continue
            try:
                check_epoch(producer, self.epoch)
            except ProducerFenced as exc:
                fut.set_exception(exc)
                continue
            self._take_epoch(producer)
            self.producers[producer.serial] = producer
            fut.set_result(None)

    def remove_producer(self, producer: Producer) -> None:
        producer.closed = True
        self.last_active = time.monotonic()
        if self.producers.pop(producer.serial, None) is not None:
            # what a closed producer published still counts in the topic's totals (stats, /metrics)
            self.closed_producers_in[0] += producer.messages_in
            self.closed_producers_in[1] += producer.bytes_in
        if self._exclusive_waiters:
            for waiting, fut in self._exclusive_waiters:
                if waiting is producer and not fut.done():
                    fut.cancel()  # it gave up waiting (closed, or its connection went)
            self._exclusive_waiters = [(p, f) for p, f in self._exclusive_waiters if not f.done()]
            self._grant_exclusive()


def _save_epoch(metadata: Any, topic: str, epoch: int) -> None:
    """Raise the stored epoch to ``epoch`` (never lower it): one compare-and-set on the topic."""

    def raise_epoch(props: dict[str, Any]) -> dict[str, Any]:
        if int(props.get(EPOCH_PROPERTY, -1)) < epoch:
            props[EPOCH_PROPERTY] = epoch
        return props

    metadata.update_topic_properties(topic, raise_epoch)
