"""Reading a split through the broker as whole entries, parsed as columns like the direct path.

The official client hands a reader one message at a time, each a Python object with a dozen
accessor calls: through the broker the source spent most of its time in that loop. But what the
broker sends a consumer is the stored entry itself (a MESSAGE command followed by the entry's
metadata and payload, a whole batch at once), which is exactly what ``entry_columns.parse_entries``
parses for the direct path. So this module speaks the binary protocol itself, with the project's
own sans-I/O pieces (``protocol.frames``: ``FrameDecoder``, ``encode_command``), over one blocking
socket per task:

1. CONNECT, then LOOKUP: the broker must serve the topic itself (``Connect``, not a redirect);
2. SUBSCRIBE a non-durable exclusive subscription (a reader: nothing is left on the topic) at the
   split's first entry -- a start id ``(L, E)`` delivers from entry ``E`` itself -- with
   ``read_compacted`` for a compacted split;
3. GET_LAST_MESSAGE_ID: the last message this consumer can receive (for a read-compacted consumer,
   the broker answers the last one of its view), so the read knows when it has everything;
4. FLOW permits, then MESSAGE frames, received in bulk (``entry_stream``: frames walked in one
   receive buffer, no object per message): their entries are gathered into chunks of up to
   ``CHUNK_ENTRIES`` entries / ``CHUNK_BYTES`` bytes, and each chunk is one ``parse_entries``
   call; permits are counted per message (a batch entry uses its ``num_messages_in_batch``, as
   the broker counts them) in a window of ``PERMITS`` sized for throughput, topped up once half
   are used (the broker's write buffer and TCP's window bound what is in flight);
5. stop at the split's end id or the last id, CLOSE_CONSUMER, close the socket.

A compacted entry may hold ``compacted_out`` placeholders; the broker sends the entry as stored and
``parse_entries`` skips them, as the client would. A ``pulsar+ssl://`` URL, TLS options and token,
basic or TLS authentication are applied here (``broker_connect``: the same ``pulsar.client.*``
options as the official client, credentials never in an error); another authentication plugin or
a broker that redirects the lookup make ``open_reader`` raise ``Unsupported`` before anything is
read, and the caller reads the split with the official client instead (``source.read_split_batches``).
A broker that refuses the credential or the role fails the read with one line naming the options
to set (``BrokerReadError``), as the official client path would.
"""

from __future__ import annotations

import collections
import itertools
import ssl
import uuid
from collections.abc import Iterator

from ..errors import CompactMQError
from ..protocol import commands
from ..protocol import pulsar_pb2 as pb
from ..protocol.frames import FrameDecoder, encode_command
from .broker_connect import Connection, Unsupported, connection
from .entry_stream import Chunk, EntryStream
from .plan import Split

CHUNK_ENTRIES = 2048
CHUNK_BYTES = 4 << 20
# messages granted at a time (a batch entry counts as its messages): a window for throughput, the
# broker's write buffer bounds what is in flight (see entry_stream)
PERMITS = 1_000_000
T = pb.BaseCommand.Type
CLIENT_VERSION = "compactmq-spark"


class BrokerReadError(CompactMQError):
    """The broker refused or broke off the read."""


class EntryReader:
    """One non-durable subscription read as raw entries over one socket."""

    def __init__(self, conn: Connection, topic: str, start: tuple, compacted: bool):
        self.conn = conn
        self.topic = topic
        self.sock = conn.open()
        self.decoder = FrameDecoder(64 << 20)
        self.pending: collections.deque = collections.deque()
        self.start = (int(start[0]), int(start[1]))
        self.ids = itertools.count(1)
        self.consumer_id = 1
        try:
            self._handshake(start, compacted)
        except BaseException:
            self.sock.close()
            raise

    # --- frames ----------------------------------------------------------------------------

    def send(self, command: pb.BaseCommand) -> None:
        self.sock.sendall(encode_command(command))

    def next_frame(self):
        while not self.pending:
            data = self.sock.recv(1 << 20)
            if not data:
                raise BrokerReadError(f"{self.topic}: the broker closed the connection")
            self.pending.extend(self.decoder.feed(data))
        return self.pending.popleft()

    def control(self, cmd) -> bool:
        """Answer a frame that is no reply (PING, AUTH_CHALLENGE); False: not one of those."""
        if cmd.type == T.PING:
            self.send(pb.BaseCommand(type=T.PONG, pong=pb.CommandPong()))
        elif cmd.type == T.AUTH_CHALLENGE:  # an expiring credential: send it again (as the client)
            self.send(
                pb.BaseCommand(
                    type=T.AUTH_RESPONSE,
                    authResponse=pb.CommandAuthResponse(
                        client_version=CLIENT_VERSION,
                        protocol_version=commands.PROTOCOL_VERSION,
                        response=pb.AuthData(
                            auth_method_name=self.conn.method or "none", auth_data=self.conn.credential
                        ),
                    ),
                )
            )
        elif cmd.type != T.ACTIVE_CONSUMER_CHANGE:
            return False
        return True

    def refused(self, code: int, message: str, what: str) -> BrokerReadError:
        """One line for a refusal, naming the options to set (and never the credential)."""
        name = pb.ServerError.Name(code) if code in pb.ServerError.values() else str(code)
        hint = ""
        if code == pb.AuthenticationError:
            hint = (
                " (check pulsar.client.authParams)"
                if self.conn.method
                else " (the broker requires authentication: set pulsar.client.authPluginClassName "
                "and pulsar.client.authParams)"
            )
        elif code == pb.AuthorizationError:
            hint = " (the role needs the consume permission on the topic's namespace)"
        return BrokerReadError(self.conn.scrub(f"{self.topic}: {what} refused: {name} {message}{hint}"))

    def answer(self, request_id: int, *types: int):
        """The reply to request ``request_id`` (PINGs answered, anything else unexpected)."""
        while True:
            frame = self.next_frame()
            cmd = frame.command
            if cmd.type == T.ERROR and cmd.error.request_id == request_id:
                raise self.refused(cmd.error.error, cmd.error.message, T.Name(types[0]))
            if cmd.type in types:
                return cmd
            if not self.control(cmd):
                raise BrokerReadError(f"{self.topic}: unexpected {T.Name(cmd.type)}")

    def _connect(self) -> None:
        connect = pb.CommandConnect(
            client_version=CLIENT_VERSION,
            protocol_version=commands.PROTOCOL_VERSION,
            feature_flags=pb.FeatureFlags(supports_auth_refresh=True),
        )
        if self.conn.method:
            connect.auth_method_name = self.conn.method
            connect.auth_data = self.conn.credential
        self.send(pb.BaseCommand(type=T.CONNECT, connect=connect))
        cmd = self.next_frame().command
        while cmd.type == T.AUTH_CHALLENGE or cmd.type == T.PING:
            self.control(cmd)
            cmd = self.next_frame().command
        if cmd.type == T.ERROR:
            raise self.refused(cmd.error.error, cmd.error.message, "CONNECT")
        if cmd.type != T.CONNECTED:
            raise Unsupported(f"{self.topic}: CONNECT answered {T.Name(cmd.type)}")

    def _handshake(self, start: tuple, compacted: bool) -> None:
        self._connect()
        rid = next(self.ids)
        self.send(
            pb.BaseCommand(
                type=T.LOOKUP,
                lookupTopic=pb.CommandLookupTopic(topic=self.topic, request_id=rid, authoritative=False),
            )
        )
        lookup = self.answer(rid, T.LOOKUP_RESPONSE).lookupTopicResponse
        if lookup.response == pb.CommandLookupTopicResponse.Failed:
            raise self.refused(lookup.error, lookup.message, "LOOKUP")
        if lookup.response != pb.CommandLookupTopicResponse.Connect or lookup.proxy_through_service_url:
            raise Unsupported(f"{self.topic}: the lookup redirects (read with the official client)")
        rid = next(self.ids)
        sub = pb.CommandSubscribe(
            topic=self.topic,
            subscription=f"compactmq-spark-{uuid.uuid4().hex[:12]}",
            subType=pb.CommandSubscribe.Exclusive,
            consumer_id=self.consumer_id,
            request_id=rid,
            durable=False,
            read_compacted=compacted,
            start_message_id=commands.message_id(int(start[0]), int(start[1])),
        )
        self.send(pb.BaseCommand(type=T.SUBSCRIBE, subscribe=sub))
        self.answer(rid, T.SUCCESS)
        rid = next(self.ids)
        self.send(
            pb.BaseCommand(
                type=T.GET_LAST_MESSAGE_ID,
                getLastMessageId=pb.CommandGetLastMessageId(consumer_id=self.consumer_id, request_id=rid),
            )
        )
        last = self.answer(rid, T.GET_LAST_MESSAGE_ID_RESPONSE).getLastMessageIdResponse.last_message_id
        lid, eid = commands.to_signed64(last.ledgerId), commands.to_signed64(last.entryId)
        self.last = (lid, eid) if lid >= 0 and eid >= 0 else None  # None: nothing to receive

    def flow(self, permits: int) -> None:
        self.send(
            pb.BaseCommand(
                type=T.FLOW, flow=pb.CommandFlow(consumer_id=self.consumer_id, messagePermits=permits)
            )
        )

    def chunks(self, stop: tuple) -> Iterator[Chunk]:
        """``entry_stream.Chunk`` s of the entries from the start until ``stop`` (exclusive,
        ``(ledger, entry)``) or the last receivable entry, whichever comes first."""
        if self.last is None:
            return
        end = min(tuple(stop), (self.last[0], self.last[1] + 1))
        if max(self.start, (0, 0)) >= end:
            return
        while self.pending:  # frames that came with the handshake's answers (a PING, say)
            cmd = self.pending.popleft().command
            if not self.control(cmd):
                raise self._unexpected(cmd)
        # the handshake's decoder may hold the start of a frame: the stream goes on from there
        leftover = self.decoder.take_unread()
        stream = EntryStream(self.sock, leftover, self.control, self._unexpected, self.flow)
        yield from stream.chunks(end, PERMITS, CHUNK_ENTRIES, CHUNK_BYTES)

    def _unexpected(self, cmd) -> BrokerReadError:
        if cmd.type == T.CLOSE_CONSUMER:
            return BrokerReadError(f"{self.topic}: the broker closed the consumer")
        if cmd.type == T.ERROR:
            return self.refused(cmd.error.error, cmd.error.message, "the read")
        return BrokerReadError(f"{self.topic}: unexpected {T.Name(cmd.type)}")

    def close(self) -> None:
        try:
            rid = next(self.ids)
            self.send(commands.close_consumer(self.consumer_id, rid))
        except OSError:
            pass
        finally:
            self.sock.close()


def bounds(split: Split) -> tuple[tuple, tuple]:
    """``(start, stop)`` entry positions of a live or compacted split read through the broker
    (what ``broker.read_split`` reads with the official client)."""
    if split.kind == "live":
        return (split.ledger_id, split.lo), (split.ledger_id, split.hi + 1)
    start = (-1, -1) if split.ledger_id < 0 else (split.ledger_id, split.lo)
    stop = (split.next_ledger, 0) if split.next_ledger is not None else tuple(split.end_id[:2])
    if split.next_ledger is None and split.end_id[2] >= 0:  # an end inside a batch: read that entry too
        stop = (stop[0], stop[1] + 1)
    return start, stop


def open_reader(split: Split, service_url: str, client_options: dict) -> EntryReader:
    """A reader positioned at the split's start (``Unsupported``: read it with the official client)."""
    start, _ = bounds(split)
    compacted = split.kind == "compacted" and split.view != "raw"
    conn = connection(service_url, client_options)
    try:
        return EntryReader(conn, split.topic, start, compacted)
    except ssl.SSLCertVerificationError as e:
        raise BrokerReadError(
            f"broker {conn.host}:{conn.port}: the TLS certificate was refused ({e.verify_message}; "
            "check pulsar.client.tlsTrustCertsFilePath and tlsHostnameVerificationEnable)"
        ) from None
    except OSError as e:
        raise BrokerReadError(conn.scrub(f"broker {conn.host}:{conn.port}: {e}")) from None


def read_split_columns(reader: EntryReader, split: Split, properties: bool = True) -> Iterator:
    """``entry_columns.MessageColumns`` of the split, chunk by chunk, within its bounds (without
    the properties when ``properties`` is False)."""
    from .entry_columns import parse_entries

    _, stop = bounds(split)
    try:
        for c in reader.chunks(stop):
            cols = parse_entries(
                c.data,
                c.offsets,
                c.lengths,
                c.ledger_ids,
                c.entry_ids,
                split.start_time,
                split.end_time,
                properties=properties,
            )
            keep = cols.within(split.start_id, split.end_id, split.start_time, split.end_time)
            yield cols if keep.all() else cols.take(keep)
    except OSError as e:  # a timeout, a reset, a broken stream
        raise BrokerReadError(
            reader.conn.scrub(f"{split.topic}: reading from the broker failed: {e}")
        ) from None
    finally:
        reader.close()
