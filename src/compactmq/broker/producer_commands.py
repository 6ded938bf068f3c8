"""The producer side of a connection's commands: PRODUCER, SEND, CLOSE_PRODUCER.

``ProducerCommands`` is a part of ``handlers.CommandHandler`` (a mixin: the handler owns the
state declared below and dispatches the commands here). PRODUCER attaches a ``Producer`` to a
topic (a retried request gets the same answer; an exclusive claim held by a silent peer is
taken over, see ``peer_liveness``; WaitForExclusive answers "not ready" first). SEND is the hot
path: the entry's checksum is verified, deduplication decides, and the topic persists it; the
receipt (``_Receipts``) is written when the entry is persisted, or a SEND_ERROR when it
failed. The SENDs of one producer that a socket read brings together arrive as a
``frames.SendRun`` (checksums verified while decoding): ``on_send_run`` queues them as one run
(``Topic.publish_run``) with one ``_Receipts``, which writes all their receipts in one go;
with deduplication on they go one by one through ``on_send``, each with its own.
"""

from __future__ import annotations

import itertools
import time
from typing import TYPE_CHECKING, Any

from ..errors import CompactMQError, InvalidInput, NotAllowed, ServerError
from ..naming import TopicName
from ..protocol import commands, frames, wire
from ..protocol import entry_format
from ..protocol import pulsar_pb2 as pb
from ..storage.position import Position
from . import security
from .peer_liveness import evict_dead_peers
from .producers import MustWait, Producer

if TYPE_CHECKING:  # pragma: no cover
    from .connection import ServerConnection

_producer_names = itertools.count()


class ProducerCommands:
    """PRODUCER, SEND and CLOSE_PRODUCER of one connection (state set by ``CommandHandler``)."""

    conn: ServerConnection
    service: Any
    producers: dict[int, Producer]
    _creating_producers: set[int]
    _cancelled_producers: set[int]

    async def on_producer(self, cmd: pb.CommandProducer, frame) -> None:
        try:
            await self._create_producer(cmd)
        finally:
            self._creating_producers.discard(cmd.producer_id)
            self._cancelled_producers.discard(cmd.producer_id)

    async def _create_producer(self, cmd: pb.CommandProducer) -> None:
        await security.authorize(self.conn, "produce", cmd.topic)
        existing = self.producers.get(cmd.producer_id)
        if existing is not None and not existing.closed:
            if existing.topic.name == str(TopicName.parse(cmd.topic)):
                # the client retried a request that already succeeded: same answer again
                self.conn.send_command(
                    commands.producer_success(
                        cmd.request_id,
                        existing.name,
                        last_sequence_id=existing.topic.last_sequence_ids.get(existing.name, -1),
                        schema_version=existing.schema_version,
                    )
                )
                return
            raise InvalidInput(f"producer id {cmd.producer_id} is already used on this connection")
        topic = await self.service.topics.get_topic(cmd.topic, create=True)
        await topic.dedup.refresh()  # a policy set since the topic loaded applies from now on
        schema_version = await self.service.schemas.get_or_create(
            topic.name, cmd.schema if cmd.HasField("schema") else None
        )
        if cmd.HasField("producer_name") and cmd.producer_name:
            name = cmd.producer_name
        else:
            name = f"{self.service.cluster_name}-{self.service.instance_id}-{next(_producer_names)}"
        producer = Producer(topic, self.conn, cmd.producer_id, name, cmd.producer_access_mode, schema_version)
        if cmd.HasField("topic_epoch"):  # a reconnecting exclusive producer: the epoch it was given
            producer.topic_epoch = cmd.topic_epoch
        # a producer of that name (or an exclusive one) on another connection may be a client
        # that reconnected before the broker noticed its old socket died: check, evict if dead
        await evict_dead_peers(
            self.conn,
            (
                p.connection
                for p in list(topic.producers.values())
                if p.name == name or p.exclusive or producer.exclusive
            ),
            self.service.config["keepAliveIntervalSeconds"],
        )
        if self.conn.closed or cmd.producer_id in self._cancelled_producers:
            return
        try:
            topic.add_producer(producer)
        except MustWait:
            # WaitForExclusive: "queued" now, a ready PRODUCER_SUCCESS when the topic is free
            self.producers[cmd.producer_id] = producer
            self.conn.send_command(
                commands.producer_success(
                    cmd.request_id, name, schema_version=schema_version, producer_ready=False
                )
            )
            try:
                await topic.wait_for_exclusive(producer)
            except BaseException:
                if self.producers.get(cmd.producer_id) is producer:
                    del self.producers[cmd.producer_id]
                raise
            if producer.closed or self.conn.closed:
                topic.remove_producer(producer)
                return
        self.producers[cmd.producer_id] = producer
        if producer.exclusive:
            await topic.save_epoch()
        self.conn.send_command(
            commands.producer_success(
                cmd.request_id,
                name,
                last_sequence_id=topic.last_sequence_ids.get(name, -1),
                schema_version=schema_version,
                topic_epoch=producer.topic_epoch if producer.exclusive else None,
            )
        )

    def on_send(self, cmd: "pb.CommandSend | wire.SendCommand", frame) -> None:
        producer = self.producers.get(cmd.producer_id)
        if producer is None or producer.closed:
            raise NotAllowed(f"producer {cmd.producer_id} is not attached on this connection")
        # ChecksumError, MalformedEntry (undecodable metadata) -> SEND_ERROR, stay up
        entry, publish_time = entry_format.checksummed_with_publish_time(frame.entry)
        publish_time = publish_time or int(time.time() * 1000)
        num = cmd.num_messages  # default 1
        sequence_id = cmd.sequence_id
        highest = cmd.highest_sequence_id or None  # 0 = not sent
        last_seq = highest if highest is not None else sequence_id + max(num, 1) - 1
        topic = producer.topic
        dedup = topic.dedup
        if dedup.enabled and dedup.check(producer.name, last_seq) != "new":
            self._answer_duplicate(producer, sequence_id, highest, last_seq)
            return
        size = len(entry)
        self.conn.reads.add(size)
        producer.messages_in += num
        producer.bytes_in += size
        topic.publish(
            entry,
            publish_time,
            _Receipts(self.conn, producer, wire.pack_receipt(sequence_id, highest), last_seq, size),
        )

    def on_send_run(self, buf: bytes, start: int, run: tuple) -> None:
        """Plain SENDs of one producer, read in one go: ``run`` is what ``wire.split_sends``
        read from ``buf`` at ``start`` (the fields of a ``frames.SendRun``; the connection
        hands over a read that is nothing else without making one). Their checksums are
        verified, and they are queued as one run with one receipt object, which writes all
        their receipts at once. With deduplication on, or no such producer, each SEND takes
        ``on_send`` as before. The caller answers what this raises (``answer_run_error``)."""
        _, producer_id, entries, times, receipts, messages, size, last_seq = run
        producer = self.producers.get(producer_id)
        topic = producer.topic if producer is not None else None
        if producer is None or producer.closed or topic.dedup.enabled:  # type: ignore[union-attr]
            handle = self.handle  # type: ignore[attr-defined]
            for frame in frames.SendRun(buf, start, run).frames():
                handle(frame)
            return
        if 0 in times:  # no publish time from the producer: now, as on_send does
            now = int(time.time() * 1000)
            times = [t or now for t in times]
        conn = self.conn
        reads = conn.reads
        pending = reads.pending + size
        if pending > reads.high_water:
            reads.add(size)  # reading may pause (flow.ReadPauser)
        else:  # ReadPauser.add, inlined: below the high water nothing else happens
            reads.pending = pending
        producer.messages_in += messages
        producer.bytes_in += size
        topic.publish_run(  # type: ignore[union-attr]
            entries, times, _Receipts(conn, producer, receipts, last_seq, size)
        )

    def _answer_duplicate(
        self, producer: Producer, sequence_id: int, highest: int | None, last_seq: int
    ) -> None:
        """A message deduplication recognised: a receipt with -1:-1 (Pulsar's answer) once
        every earlier SEND of the topic is answered; a SEND_ERROR if the original failed."""
        conn, topic = self.conn, producer.topic

        def answer(position, exc) -> None:
            if topic.dedup.is_persisted(producer.name, last_seq):
                conn.send_command(
                    commands.send_receipt(
                        producer.producer_id,
                        sequence_id,
                        -1,
                        -1,
                        partition=topic.partition_index,
                        highest_sequence_id=highest,
                    )
                )
            else:
                conn.send_command(
                    commands.send_error(
                        producer.producer_id,
                        sequence_id,
                        ServerError.PersistenceError,
                        "the message this one duplicates was not persisted; send it again",
                    )
                )

        topic.publish_marker(answer)

    def on_close_producer(self, cmd: pb.CommandCloseProducer, frame) -> None:
        producer = self.producers.pop(cmd.producer_id, None)
        if producer is not None:
            producer.topic.remove_producer(producer)
        elif cmd.producer_id in self._creating_producers:
            self._cancelled_producers.add(cmd.producer_id)
        self.conn.send_command(commands.success(cmd.request_id))

    def forget_producer(self, producer: Producer) -> None:
        if self.producers.get(producer.producer_id) is producer:
            del self.producers[producer.producer_id]
        producer.topic.remove_producer(producer)


class _Receipts:
    """The answers to the SENDs of one ``Topic.publish`` (one SEND, ``on_send``) or
    ``Topic.publish_run`` (a run, ``on_send_run``): called by the topic once, with the position
    of the first entry (the others follow it, one entry id apart) or with the error that failed
    them all. One small object instead of a closure (whose function object and a cell per
    captured variable cost more to build and to collect); the receipts are encoded on the wire
    in one call (``wire.send_receipt_frames``) and queued with the other frames of this loop
    turn, written in one go.

    ``receipts``: 16 bytes a SEND, its sequence id and highest sequence id (``frames.SendRun``'s
    ``receipts``; ``wire.pack_receipt`` for one SEND).
    """

    __slots__ = ("conn", "producer", "receipts", "last_seq", "size")

    def __init__(
        self, conn: "ServerConnection", producer: Producer, receipts: bytes, last_seq: int, size: int
    ) -> None:
        self.conn = conn
        self.producer = producer
        self.receipts = receipts
        self.last_seq = last_seq
        self.size = size

    def __call__(self, position: Position | None, exc: BaseException | None) -> None:
        conn, producer = self.conn, self.producer
        reads = conn.reads
        if reads.paused:
            reads.release(self.size)  # reading may resume (flow.ReadPauser)
        else:  # ReadPauser.release, inlined: while not paused nothing else happens
            reads.pending -= self.size
        topic = producer.topic
        if exc is not None:
            topic.dedup.failed(producer.name)
            code = exc.server_error if isinstance(exc, CompactMQError) else ServerError.PersistenceError
            text = str(exc)
            for sequence_id, _ in wire.receipt_fields(self.receipts):
                conn.send_command(commands.send_error(producer.producer_id, sequence_id, code, text))
            return
        seqs = topic.last_sequence_ids
        if seqs.get(producer.name, -1) < self.last_seq:
            seqs[producer.name] = self.last_seq
        ledger_id, first = position  # type: ignore[misc]
        dedup = topic.dedup
        if dedup.enabled:  # count each entry
            for i in range(len(self.receipts) // 16):
                dedup.entry_persisted(Position(ledger_id, first + i))
        # a persistent topic flushes once it answered what the sync covered (Topic._release)
        write = conn.write_released if topic.flushes_after_receipts else conn.write
        write(
            wire.send_receipt_frames(
                producer.producer_id, topic.partition_index, ledger_id, first, self.receipts
            )
        )
