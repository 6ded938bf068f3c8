"""The broker-side handshake table."""

from __future__ import annotations

import pytest

from compactmq.errors import ProtocolError
from compactmq.protocol import pulsar_pb2 as pb
from compactmq.protocol.connection import (
    BROKER_COMMANDS,
    CLIENT_COMMANDS,
    BrokerConnectionState,
    State,
)

T = pb.BaseCommand


def test_normal_handshake():
    c = BrokerConnectionState()
    assert c.receive(T.CONNECT) is State.CONNECTING
    assert c.send(T.CONNECTED) is State.CONNECTED
    assert c.connected
    for t in (T.PARTITIONED_METADATA, T.LOOKUP, T.PRODUCER, T.SEND, T.PING, T.AUTH_RESPONSE):
        assert c.receive(t) is State.CONNECTED
    for t in (T.PRODUCER_SUCCESS, T.SEND_RECEIPT, T.MESSAGE, T.PONG, T.PING):
        assert c.send(t) is State.CONNECTED


@pytest.mark.parametrize("t", sorted(CLIENT_COMMANDS - {T.CONNECT}))
def test_nothing_but_connect_before_connected(t):
    c = BrokerConnectionState()
    with pytest.raises(ProtocolError) as info:
        c.receive(t)
    assert info.value.peer_fault and info.value.command_type == t


def test_commands_while_connecting_are_refused():
    c = BrokerConnectionState()
    c.receive(T.CONNECT)
    with pytest.raises(ProtocolError):
        c.receive(T.PRODUCER)
    c.receive(T.AUTH_RESPONSE)  # part of an authentication exchange
    assert c.send(T.AUTH_CHALLENGE) is State.CONNECTING


def test_second_connect_is_refused():
    c = BrokerConnectionState()
    c.receive(T.CONNECT)
    c.send(T.CONNECTED)
    with pytest.raises(ProtocolError):
        c.receive(T.CONNECT)


def test_refused_connect_closes():
    c = BrokerConnectionState()
    c.receive(T.CONNECT)
    assert c.send(T.ERROR) is State.CLOSED
    with pytest.raises(ProtocolError):
        c.receive(T.PING)


@pytest.mark.parametrize("t", sorted(BROKER_COMMANDS - CLIENT_COMMANDS))
def test_client_may_not_send_broker_commands(t):
    c = BrokerConnectionState()
    c.receive(T.CONNECT)
    c.send(T.CONNECTED)
    with pytest.raises(ProtocolError) as info:
        c.receive(t)
    assert info.value.peer_fault


def test_sending_out_of_turn_is_our_fault():
    c = BrokerConnectionState()
    with pytest.raises(ProtocolError) as info:
        c.send(T.SEND_RECEIPT)
    assert not info.value.peer_fault
    with pytest.raises(ProtocolError) as info:
        c.send(T.CONNECT)
    assert not info.value.peer_fault


def test_every_type_has_a_direction():
    assert CLIENT_COMMANDS | BROKER_COMMANDS == set(T.Type.values())
