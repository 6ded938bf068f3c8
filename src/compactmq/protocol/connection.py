"""The broker side of a Pulsar connection as a state table (no I/O, no clock).

A connection goes through three states:

``AWAITING_CONNECT``
    Fresh socket. The client must speak first, and only CONNECT is allowed: anything else is a
    protocol error (Pulsar brokers close such connections).
``CONNECTING``
    CONNECT received; the broker is deciding. It answers CONNECTED (-> ``CONNECTED``), or an
    ERROR (-> ``CLOSED``). With authentication it may first exchange AUTH_CHALLENGE /
    AUTH_RESPONSE, staying in ``CONNECTING``.
``CONNECTED``
    Every client command except a second CONNECT is allowed (AUTH_RESPONSE too: clients
    refresh credentials). The broker may send every broker command.
``CLOSED``
    Nothing more in either direction.

Independently of the state, a command that only a broker sends (CONNECTED, MESSAGE,
SEND_RECEIPT, ...) arriving from the client is a protocol error, and the broker sending a
client-only command is a bug on our side. A (state, direction, command) not allowed by the
table raises :class:`~compactmq.errors.ProtocolError`: ``peer_fault`` is True for what we
received and False for what we tried to send.

Usage: the broker calls :meth:`BrokerConnectionState.receive` for every decoded frame before
handling it, and :meth:`BrokerConnectionState.send` before writing a command.
"""

from __future__ import annotations

import enum

from compactmq.errors import ProtocolError, ServerError
from compactmq.protocol import pulsar_pb2 as pb

T = pb.BaseCommand.Type


class State(enum.Enum):
    AWAITING_CONNECT = "awaiting-connect"
    CONNECTING = "connecting"
    CONNECTED = "connected"
    CLOSED = "closed"


# Commands a client sends (ping/pong and the two CLOSE_* go both ways).
CLIENT_COMMANDS = frozenset(
    {
        T.CONNECT,
        T.SUBSCRIBE,
        T.PRODUCER,
        T.SEND,
        T.ACK,
        T.FLOW,
        T.UNSUBSCRIBE,
        T.CLOSE_PRODUCER,
        T.CLOSE_CONSUMER,
        T.PING,
        T.PONG,
        T.REDELIVER_UNACKNOWLEDGED_MESSAGES,
        T.PARTITIONED_METADATA,
        T.LOOKUP,
        T.CONSUMER_STATS,
        T.SEEK,
        T.GET_LAST_MESSAGE_ID,
        T.GET_TOPICS_OF_NAMESPACE,
        T.GET_SCHEMA,
        T.AUTH_RESPONSE,
        T.GET_OR_CREATE_SCHEMA,
        T.NEW_TXN,
        T.ADD_PARTITION_TO_TXN,
        T.ADD_SUBSCRIPTION_TO_TXN,
        T.END_TXN,
        T.END_TXN_ON_PARTITION,
        T.END_TXN_ON_SUBSCRIPTION,
        T.TC_CLIENT_CONNECT_REQUEST,
        T.WATCH_TOPIC_LIST,
        T.WATCH_TOPIC_LIST_CLOSE,
    }
)

# Commands a broker sends.
BROKER_COMMANDS = frozenset(
    {
        T.CONNECTED,
        T.SEND_RECEIPT,
        T.SEND_ERROR,
        T.MESSAGE,
        T.SUCCESS,
        T.ERROR,
        T.CLOSE_PRODUCER,
        T.CLOSE_CONSUMER,
        T.PRODUCER_SUCCESS,
        T.PING,
        T.PONG,
        T.PARTITIONED_METADATA_RESPONSE,
        T.LOOKUP_RESPONSE,
        T.CONSUMER_STATS_RESPONSE,
        T.REACHED_END_OF_TOPIC,
        T.GET_LAST_MESSAGE_ID_RESPONSE,
        T.ACTIVE_CONSUMER_CHANGE,
        T.GET_TOPICS_OF_NAMESPACE_RESPONSE,
        T.GET_SCHEMA_RESPONSE,
        T.AUTH_CHALLENGE,
        T.ACK_RESPONSE,
        T.GET_OR_CREATE_SCHEMA_RESPONSE,
        T.NEW_TXN_RESPONSE,
        T.ADD_PARTITION_TO_TXN_RESPONSE,
        T.ADD_SUBSCRIPTION_TO_TXN_RESPONSE,
        T.END_TXN_RESPONSE,
        T.END_TXN_ON_PARTITION_RESPONSE,
        T.END_TXN_ON_SUBSCRIPTION_RESPONSE,
        T.TC_CLIENT_CONNECT_RESPONSE,
        T.WATCH_TOPIC_LIST_SUCCESS,
        T.WATCH_TOPIC_UPDATE,
        T.TOPIC_MIGRATED,
    }
)

_ANY_CLIENT = "any client command but CONNECT"
_ANY_BROKER = "any broker command"

# (state, direction, command or wildcard) -> next state.
_RECEIVE: dict[tuple[State, object], State] = {
    (State.AWAITING_CONNECT, T.CONNECT): State.CONNECTING,
    (State.CONNECTING, T.AUTH_RESPONSE): State.CONNECTING,
    (State.CONNECTED, _ANY_CLIENT): State.CONNECTED,
}
_SEND: dict[tuple[State, object], State] = {
    (State.CONNECTING, T.CONNECTED): State.CONNECTED,
    (State.CONNECTING, T.AUTH_CHALLENGE): State.CONNECTING,
    (State.CONNECTING, T.ERROR): State.CLOSED,
    (State.CONNECTED, _ANY_BROKER): State.CONNECTED,
}


def _name(command_type: int) -> str:
    try:
        return T.Name(command_type)
    except ValueError:
        return f"type {command_type}"


class BrokerConnectionState:
    """Where a broker-side connection stands; see the module notes for the table."""

    def __init__(self) -> None:
        self.state = State.AWAITING_CONNECT
        self.protocol_version: int | None = None

    def receive(self, command_type: int) -> State:
        """Account for a command received from the client; returns the new state."""
        if command_type not in CLIENT_COMMANDS:
            raise self._error(f"a client may not send {_name(command_type)}", command_type, peer=True)
        key = _ANY_CLIENT if command_type != T.CONNECT else command_type
        nxt = _RECEIVE.get((self.state, command_type)) or _RECEIVE.get((self.state, key))
        if nxt is None:
            raise self._error(
                f"{_name(command_type)} is not allowed while {self.state.value}", command_type, peer=True
            )
        self.state = nxt
        return nxt

    def send(self, command_type: int) -> State:
        """Account for a command about to be sent to the client; returns the new state."""
        if command_type not in BROKER_COMMANDS:
            raise self._error(f"a broker may not send {_name(command_type)}", command_type, peer=False)
        nxt = _SEND.get((self.state, command_type)) or _SEND.get((self.state, _ANY_BROKER))
        if nxt is None:
            raise self._error(
                f"sending {_name(command_type)} is not allowed while {self.state.value}",
                command_type,
                peer=False,
            )
        self.state = nxt
        return nxt

    def close(self) -> None:
        self.state = State.CLOSED

    @property
    def connected(self) -> bool:
        return self.state is State.CONNECTED

    def _error(self, message: str, command_type: int, *, peer: bool) -> ProtocolError:
        err = ProtocolError(message)
        err.peer_fault = peer
        err.command = None
        err.command_type = command_type
        err.server_error = ServerError.NotAllowedError if peer else ServerError.UnknownError
        return err
