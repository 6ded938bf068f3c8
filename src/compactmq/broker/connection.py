"""The asyncio protocol of one client connection: only an adapter between socket and codec.

Bytes in: ``FrameDecoder`` (sans-I/O) turns them into frames, the connection state table checks
each is allowed now, ``CommandHandler`` acts on it. Once connected, a read that is nothing but
plain SENDs of one producer (a producer's usual read) skips all that: ``wire.split_sends``
reads it in one call and ``on_send_run`` publishes it. Commands out: encoded by the protocol
package and written in one batch per event-loop turn (many MESSAGEs and SEND_RECEIPTs become
one ``write``); a topic that has answered a durable batch writes the receipts out at once
(``ServerState.flush_writes``) instead of waiting for the end of the turn, which would come
only after the loop has polled for, and handled, more input.

Backpressure both ways sits in ``flow``: published bytes not yet persisted pause *reading* this
socket (``ReadPauser``); when the transport's own write buffer is full (``pause_writing``) the
connection stops being ``writable`` and dispatchers skip its consumers until
``resume_writing``.

A framing error (ProtocolError) ends the connection with an ERROR on the wire where a request
id is known; errors of single commands are answered by the handler and the connection stays.
Keep-alive: a PING every ``keepAliveIntervalSeconds``; a peer that sent no complete frame for
twice that is dropped (bytes of a partial frame are not a sign of life).
Before CONNECT succeeds the limits of ``admission`` hold: connection counts checked at accept,
small frames only, and a deadline for the handshake.
``is_alive`` PINGs on demand: a newcomer claiming a producer name or an exclusive subscription
held by this connection gets it if nothing comes back in time (see ``handlers``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from ..errors import CompactMQError, ProtocolError, ServerError
from ..protocol import commands, frames, wire
from ..protocol import pulsar_pb2 as pb
from ..protocol.connection import BrokerConnectionState, State
from . import admission
from .flow import ReadPauser, read_hold_seconds
from .handlers import CommandHandler

if TYPE_CHECKING:  # pragma: no cover
    from ..auth import Principal
    from ..storage.position import Position
    from .producers import Producer
    from .server import BrokerService
    from .subscriptions import Consumer

log = logging.getLogger(__name__)

_BROKER_REQUEST_ID = commands.to_unsigned64(-1)  # broker-initiated CLOSE_* carry no request
_T = pb.BaseCommand
# Client commands the state table allows in every CONNECTED state (it is checked otherwise).
_CONNECTED_FAST_PATH = frozenset({_T.SEND, _T.FLOW, _T.ACK, _T.PING, _T.PONG})
_CONNECTED = State.CONNECTED
_split_sends = wire.split_sends
_SendRun = frames.SendRun


class ServerConnection(asyncio.Protocol):
    def __init__(self, service: "BrokerService") -> None:
        self.service = service
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        # small frames until CONNECT succeeds (admission.PREAUTH_MAX_FRAME_SIZE), then this
        self._max_frame_size = frames.max_frame_size_for(service.config["maxMessageSize"])
        self.decoder = frames.FrameDecoder(
            min(admission.PREAUTH_MAX_FRAME_SIZE, self._max_frame_size), send_runs=True
        )
        self._admitted_ip: str | None = None  # counted by service.connection_counter
        self._handshake_handle: asyncio.TimerHandle | None = None
        self._preauth_charged = 0  # bytes of partial frames charged to the pre-CONNECT budget
        self.state = BrokerConnectionState()
        self.handler = CommandHandler(self)
        self.reads: ReadPauser | None = None
        self.writable = True
        self.closed = False
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._unflushed = service.state.unflushed
        self._server_state = service.state
        self._loop = asyncio.get_event_loop()
        self.last_seen = 0.0
        self._keepalive_handle: asyncio.TimerHandle | None = None
        self._liveness: list[asyncio.Future] = []
        # who the client is (auth.Principal, set at CONNECT) and the refresh state (security)
        self.principal: Principal | None = None
        self.supports_auth_refresh = False
        self.auth_refresh_pending = False
        # frames that arrived while CONNECT was being authenticated off the loop (security)
        self._held: list | None = None

    # --- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        ip = str(peer[0]) if isinstance(peer, tuple) else self.peer
        refused = self.service.connection_counter.admit(ip)  # brokerMaxConnections[PerIp]
        if refused is not None:
            self.closed = True
            error = commands.error(_BROKER_REQUEST_ID, ServerError.NotAllowedError, refused)
            transport.write(frames.encode_command(error))
            transport.close()  # after the ERROR is written
            return
        self._admitted_ip = ip
        self._handshake_handle = self._loop.call_later(
            admission.handshake_deadline_seconds(self.service.config), self._handshake_expired
        )
        config = self.service.config
        self.reads = ReadPauser(
            transport,
            config["maxPendingPublishBytesPerConnection"],
            self._loop,
            read_hold_seconds(config),
        )
        self.last_seen = self._loop.time()
        self.service.state.add_connection(self)
        self._schedule_keepalive()

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        decoder = self.decoder
        if (
            self._handshake_handle is None  # connected, or closing: the state says which
            and self.state.state is _CONNECTED
            and self._held is None
            and data.__class__ is bytes
            and decoder.idle
        ):
            # The common read of a producer: nothing but plain SENDs of one producer. They are
            # read in one C call and handed to the publish path, without frame objects or the
            # dispatch (handle, _handle_frames); what follows a run is decoded as usual.
            size = len(data)
            run = _split_sends(data, 0, size, decoder.max_frame_size)
            if run is not None:
                if run[0] == size:
                    self.last_seen = self._loop.time()  # a sign of life (_heard, inlined)
                    if self._liveness:
                        self._heard()
                    handler = self.handler
                    try:
                        handler.on_send_run(data, 0, run)
                    except Exception as exc:  # noqa: BLE001 - error boundary of these commands
                        handler.answer_run_error(data, 0, run, exc)
                    self.reads.after_sends(self.last_seen, len(run[2]))
                    return
                try:
                    frames_in = decoder.feed_after_run(data, run)
                except ProtocolError as err:
                    self._protocol_failure(err)
                    return
                self._heard()
                self._handle_frames(frames_in)
                self._count_sends(frames_in)
                return
        try:
            frames_in = decoder.feed(data)
        except ProtocolError as err:
            self._protocol_failure(err)
            return
        if self._handshake_handle is not None and not self._charge_preauth():
            log.debug("closing connection from %s: pre-CONNECT buffer budget spent", self.peer)
            self.abort()
            return
        if not frames_in:
            return  # part of a frame: not yet a sign of life (a trickling peer stays silent)
        self._heard()
        self._handle_frames(frames_in)
        self._count_sends(frames_in)

    def _count_sends(self, frames_in: list) -> None:
        """Count a read's SENDs for the read hold (``ReadPauser.after_sends``) when it was not
        the fast path's whole run: a busy producer's read often ends inside a frame (a large
        read on a loaded machine), and the read after it starts with that frame's rest."""
        if (
            self.closed
            or self.reads is None
            or self._held is not None
            or self.state.state is not _CONNECTED
            or not self.handler.producers
        ):
            return  # only a connected producer's reads are held (never during authentication)
        sends = 0
        for frame in frames_in:
            if frame.type == _T.SEND:
                sends += len(frame) if frame.__class__ is _SendRun else 1
        if sends:
            self.reads.after_sends(self._loop.time(), sends)

    def _heard(self) -> None:
        """A complete frame arrived: a sign of life (keep-alive, ``is_alive``)."""
        self.last_seen = self._loop.time()
        if self._liveness:
            for fut in self._liveness:
                if not fut.done():
                    fut.set_result(True)
            self._liveness.clear()

    def handshake_done(self) -> None:
        """CONNECT succeeded: the deadline is off and frames may be as large as messages."""
        if self._handshake_handle is not None:
            self._handshake_handle.cancel()
            self._handshake_handle = None
        self._release_preauth()
        self.decoder.max_frame_size = self._max_frame_size

    def _charge_preauth(self) -> bool:
        """Charge what the decoder holds now to the shared pre-CONNECT budget (admission)."""
        held = self.decoder.buffered
        delta, self._preauth_charged = held - self._preauth_charged, held
        return self.service.connection_counter.charge_preauth(delta)

    def _release_preauth(self) -> None:
        if self._preauth_charged:
            self.service.connection_counter.charge_preauth(-self._preauth_charged)
            self._preauth_charged = 0

    def _handshake_expired(self) -> None:
        self._handshake_handle = None
        if self.closed or self.state.connected:
            self.handshake_done()
            return
        log.info("closing connection from %s: no successful CONNECT in time", self.peer)
        self.abort()

    def _handle_frames(self, frames_in: list) -> None:
        state = self.state
        for frame in frames_in:
            if self.closed:
                return
            # Once connected, the common commands need no trip through the state table.
            if not (state.state is _CONNECTED and frame.type in _CONNECTED_FAST_PATH):
                if self._held is not None:  # CONNECT still being authenticated: keep the order
                    self._held.append(frame)
                    continue
                try:
                    state.receive(frame.type)
                except ProtocolError as err:
                    self._protocol_failure(err, frame.command)
                    return
            self.handler.handle(frame)

    def hold_input(self) -> None:
        """Stop handling input until ``release_input`` (CONNECT is being authenticated on a
        thread); what already arrived is kept, in order, and reading pauses."""
        self._held = []
        self.transport.pause_reading()

    def release_input(self) -> None:
        held, self._held = self._held or [], None
        if not self.transport.is_closing() and not (self.reads is not None and self.reads.stopped):
            self.transport.resume_reading()
        self._handle_frames(held)

    def eof_received(self):
        return False  # close our side too

    def connection_lost(self, exc) -> None:
        self.closed = True
        if self._admitted_ip is None:
            return  # refused at accept: nothing was set up
        self.service.connection_counter.release(self._admitted_ip)
        self._admitted_ip = None
        self._release_preauth()
        if self._handshake_handle is not None:
            self._handshake_handle.cancel()
        if self._keepalive_handle is not None:
            self._keepalive_handle.cancel()
        self.state.close()
        self.handler.connection_closed()
        self.service.state.remove_connection(self)

    def pause_writing(self) -> None:
        self.writable = False

    def resume_writing(self) -> None:
        self.writable = True
        self.handler.wake_consumers()

    # --- output ------------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        if self.closed:
            return
        self._out.append(data)
        if not self._flush_scheduled:
            self._queued(1)

    def write_released(self, data: bytes) -> None:
        """``write`` for a caller that runs ``ServerState.flush_writes`` before it returns (a
        topic answering the SENDs a sync made durable, ``Topic._release``): ``data`` leaves
        with that flush, and no flush of its own is scheduled for the end of the loop turn."""
        if self.closed:
            return
        out = self._out
        out.append(data)
        if len(out) == 1:  # else already listed, or its scheduled flush takes it
            self._unflushed.append(self)

    def flush(self) -> None:
        """Write out what is queued now (one ``writelines``); the scheduled flush then finds
        nothing, or only what was queued after this."""
        out, self._out = self._out, []
        if out and not self.closed and not self.transport.is_closing():
            self.transport.writelines(out)  # one writev (uvloop) instead of a joined copy

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._unflushed:  # the others listed have their own _flush scheduled too (those
            self._unflushed.clear()  # write_released lists are flushed before this can run)
        self.flush()

    def send_command(self, cmd) -> None:
        self.write(frames.encode_command(cmd))

    def send_message(
        self,
        consumer_id: int,
        position: "Position",
        partition: int,
        redelivery_count: int,
        ack_set,
        entry: bytes,
    ) -> None:
        # the MESSAGE command encoded on the wire directly, and the stored entry queued after
        # it as it is: no protobuf object and no copy of the payload on the way out
        self.write(
            wire.message_frame_header(
                consumer_id, position[0], position[1], partition, redelivery_count, ack_set, len(entry)
            )
        )
        self.write(entry)

    def send_messages(self, consumer_id: int, partition: int, items) -> None:
        """MESSAGE frames for ``items`` ((position, redelivery count, ack_set, entry), in order)
        queued in one go: the dispatch of a permit window costs one append per frame part and
        one flush, not a ``write`` call per part."""
        if self.closed or not items:
            return
        header = wire.message_frame_header
        out: list[bytes] = []
        append = out.append
        for position, redelivery_count, ack_set, entry in items:
            append(
                header(
                    consumer_id, position[0], position[1], partition, redelivery_count, ack_set, len(entry)
                )
            )
            append(entry)
        self._out.extend(out)
        if not self._flush_scheduled:
            self._queued(len(out))

    def _queued(self, added: int) -> None:
        """``added`` parts were queued and no flush is scheduled: schedule one for the end of
        the loop turn (``ServerState.flush_writes`` may write them out sooner), unless the code
        running now flushes before it returns (``ServerState.flushing_now``), which needs the
        connection listed only (once: a longer queue was listed with its first part)."""
        if self._server_state.flushing_now:
            if len(self._out) == added:
                self._unflushed.append(self)
            return
        self._flush_scheduled = True
        self._loop.call_soon(self._flush)
        self._unflushed.append(self)

    def send_active_consumer_change(self, consumer_id: int, is_active: bool) -> None:
        self.send_command(commands.active_consumer_change(consumer_id, is_active))

    def close_producer_by_broker(self, producer: "Producer") -> None:
        """Detach a producer and tell the client to reconnect it (topic closing, fencing)."""
        self.handler.forget_producer(producer)
        self.send_command(commands.close_producer(producer.producer_id, _BROKER_REQUEST_ID))

    def close_consumer_by_broker(self, consumer: "Consumer") -> None:
        """Detach a consumer and tell the client to subscribe again (seek, topic closing)."""
        self.handler.forget_consumer(consumer)
        self.send_command(commands.close_consumer(consumer.consumer_id, _BROKER_REQUEST_ID))

    def close(self) -> None:
        """Flush what is queued, then close the socket."""
        if self.transport is None or self.closed:
            return
        self._flush()
        self.closed = True
        self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.closed = True
            self.transport.abort()
            # detach producers and consumers now rather than on the next loop turn, so a
            # caller that evicted this connection can take over its names at once
            self.handler.connection_closed()

    async def is_alive(self, timeout: float) -> bool:
        """PING the peer and wait for any bytes back (Pulsar's connection liveness check)."""
        if self.closed:
            return False
        fut = self._loop.create_future()
        self._liveness.append(fut)
        self.send_command(commands.ping())
        try:
            await asyncio.wait_for(fut, timeout)
            return True
        except asyncio.TimeoutError:
            return False

    # --- failures and keep-alive -------------------------------------------------------------

    def _protocol_failure(self, err: ProtocolError, command=None) -> None:
        command = command if command is not None else getattr(err, "command", None)
        log.warning("closing connection from %s: %s", self.peer, err)
        request_id = _request_id_of(command)
        code = getattr(err, "server_error", ServerError.UnknownError)
        self.send_command(
            commands.error(request_id if request_id is not None else _BROKER_REQUEST_ID, code, str(err))
        )
        self.close()

    def _schedule_keepalive(self) -> None:
        interval = self.service.config["keepAliveIntervalSeconds"]
        if interval > 0 and not self.closed:
            self._keepalive_handle = self._loop.call_later(interval, self._keepalive)

    def _keepalive(self) -> None:
        interval = self.service.config["keepAliveIntervalSeconds"]
        if self.closed:
            return
        if self._loop.time() - self.last_seen > 2 * interval:
            log.info("dropping %s: silent for more than %ss", self.peer, 2 * interval)
            self.abort()
            return
        if self.state.connected:
            self.send_command(commands.ping())
        self._schedule_keepalive()


def _request_id_of(command) -> int | None:
    if command is None:
        return None
    try:
        for desc, value in command.ListFields():
            if desc.name != "type" and hasattr(value, "request_id") and value.HasField("request_id"):
                return value.request_id
    except Exception:  # pragma: no cover - a malformed command: no request id then
        return None
    return None


def error_code(exc: BaseException) -> int:
    return exc.server_error if isinstance(exc, CompactMQError) else ServerError.UnknownError
