"""What an unauthenticated peer can hold on the binary port (raw sockets against a broker with
token, basic and TLS authentication and authorization on).

- ``brokerMaxConnections`` / ``brokerMaxConnectionsPerIp``: a connection over a limit is
  closed at accept (0 = unlimited), per source IP (127.0.0.2 and 127.0.0.3 are other peers).
- Before CONNECT succeeds only frames up to 64 KiB are accepted; after it, maxMessageSize.
- A connection that has not completed CONNECT within ``keepAliveIntervalSeconds`` is closed,
  however it trickles bytes; after CONNECT, bytes of a frame that never completes are not a
  sign of life either.
"""

from __future__ import annotations

import select
import socket
import struct
import time

import pulsar
import pytest

from broker.conftest import make_client  # tests/ is on sys.path
from compactmq.broker.admission import PREAUTH_BUFFER_BUDGET, PREAUTH_MAX_FRAME_SIZE
from compactmq.protocol import frames
from compactmq.protocol import pulsar_pb2 as pb
from tests.protocol import client_commands as commands

from .adminhttp import start_secured_broker

KEEPALIVE = 2  # seconds: the handshake deadline of the ``deadline`` broker


def open_raw(port: int, source_ip: str = "127.0.0.1") -> socket.socket:
    s = socket.socket()
    s.bind((source_ip, 0))
    s.settimeout(10)
    s.connect(("127.0.0.1", port))
    return s


def closed_within(s: socket.socket, seconds: float) -> bool:
    """True when the broker closes ``s`` within ``seconds`` (frames it sends are skipped)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        s.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            if not s.recv(65536):
                return True
        except TimeoutError:
            return False
        except (ConnectionResetError, BrokenPipeError):
            return True
    return False


def refused_at_accept(s: socket.socket, message: str) -> bool:
    """The broker's answer to a connection over a limit, as Pulsar's: ERROR NotAllowedError
    (request id -1) with ``message``, unasked, then the close."""
    error = read_one(s, 5)
    assert error.type == pb.BaseCommand.ERROR, error
    assert error.error.error == pb.NotAllowedError and error.error.message == message, error
    assert error.error.request_id == commands.to_unsigned64(-1)
    return closed_within(s, 5)


def connect_frame(secured, role: str = "admin") -> bytes:
    return frames.encode_command(
        commands.connect(auth_method_name="token", auth_data=secured.token(role).encode())
    )


def read_one(s: socket.socket, timeout: float = 10) -> pb.BaseCommand:
    decoder = frames.FrameDecoder()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s.settimeout(max(0.01, deadline - time.monotonic()))
        got = decoder.feed(s.recv(65536))
        if got:
            return got[0].command
    raise AssertionError("no frame from the broker")


@pytest.fixture(scope="module")
def limited(tmp_path_factory, pki):
    s = start_secured_broker(
        tmp_path_factory.mktemp("limited"), pki, brokerMaxConnections="4", brokerMaxConnectionsPerIp="2"
    )
    yield s
    s.broker.stop()


@pytest.fixture(scope="module")
def deadline(tmp_path_factory, pki):
    s = start_secured_broker(
        tmp_path_factory.mktemp("deadline"), pki, keepAliveIntervalSeconds=str(KEEPALIVE)
    )
    yield s
    s.broker.stop()


def test_connections_over_the_per_ip_and_total_limits_are_closed_at_accept(limited):
    port = limited.broker.port
    held = [open_raw(port), open_raw(port)]
    try:
        assert not any(closed_within(s, 0.3) for s in held)
        third = open_raw(port)
        assert refused_at_accept(third, "Reached the maximum number of connections on address 127.0.0.1")
        other_ip = [open_raw(port, "127.0.0.2"), open_raw(port, "127.0.0.2")]
        held += other_ip
        assert not any(closed_within(s, 0.3) for s in other_ip)  # another peer has its own count
        fifth = open_raw(port, "127.0.0.3")
        assert refused_at_accept(fifth, "Reached the maximum number of connections")  # the total (4)
        held.pop(0).close()  # a slot frees up once a connection closes
        time.sleep(0.3)
        again = open_raw(port, "127.0.0.3")
        held.append(again)
        again.sendall(connect_frame(limited))
        assert read_one(again).type == pb.BaseCommand.CONNECTED
    finally:
        for s in held:
            s.close()


def test_a_refused_peer_does_not_stop_authenticated_clients_afterwards(limited):
    time.sleep(0.3)  # the previous test's sockets are gone
    client = make_client(
        limited.broker.url, authentication=pulsar.AuthenticationToken(limited.token("admin"))
    )
    try:
        producer = client.create_producer(f"persistent://public/default/limits-{time.monotonic_ns()}")
        producer.send(b"ok")
    finally:
        client.close()


def test_frames_before_connect_are_small(limited):
    with open_raw(limited.broker.port) as s:
        # the header of a frame just over the limit: refused before its body is read
        s.sendall(struct.pack(">I", PREAUTH_MAX_FRAME_SIZE + 1))
        assert closed_within(s, 5)


def test_after_connect_frames_may_be_as_large_as_messages(limited):
    client = make_client(
        limited.broker.url, authentication=pulsar.AuthenticationToken(limited.token("admin"))
    )
    try:
        topic = f"persistent://public/default/big-{time.monotonic_ns()}"
        producer = client.create_producer(topic, batching_enabled=False)
        producer.send(b"x" * (1 << 20))  # 1 MiB: 16 times the pre-CONNECT limit
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        assert len(reader.read_next(10_000).data()) == 1 << 20
    finally:
        client.close()


def test_a_silent_stranger_is_closed_at_the_handshake_deadline(deadline):
    with open_raw(deadline.broker.port) as s:
        started = time.monotonic()
        assert closed_within(s, KEEPALIVE + 2)
        assert time.monotonic() - started >= KEEPALIVE - 0.5


def test_a_trickling_stranger_is_closed_at_the_handshake_deadline(deadline):
    frame = connect_frame(deadline)
    with open_raw(deadline.broker.port) as s:
        started = time.monotonic()
        closed = False
        for i in range(len(frame) - 1):  # never the last byte: CONNECT never completes
            try:
                s.sendall(frame[i : i + 1])
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            if closed_within(s, 0.25):
                closed = True
                break
            if time.monotonic() - started > KEEPALIVE * 4:
                break
        assert closed, "a peer sending a byte at a time stayed connected"
        assert time.monotonic() - started < KEEPALIVE + 2


def test_after_connect_a_partial_frame_is_not_a_sign_of_life(deadline):
    ping = frames.encode_command(commands.ping())
    with open_raw(deadline.broker.port) as s:
        s.sendall(connect_frame(deadline))
        assert read_one(s).type == pb.BaseCommand.CONNECTED
        started = time.monotonic()
        closed = False
        i = 0
        while time.monotonic() - started < KEEPALIVE * 5:
            if i < len(ping) - 1:  # a byte of a PING now and then, never the whole frame
                try:
                    s.sendall(ping[i : i + 1])
                except (BrokenPipeError, ConnectionResetError):
                    closed = True
                    break
                i += 1
            if closed_within(s, 0.4):  # PINGs from the broker are read and ignored (no PONG)
                closed = True
                break
        assert closed
        assert time.monotonic() - started < KEEPALIVE * 4


def test_an_authenticated_client_outlives_the_handshake_deadline(deadline):
    client = make_client(
        deadline.broker.url, authentication=pulsar.AuthenticationToken(deadline.token("admin"))
    )
    try:
        topic = f"persistent://public/default/lives-{time.monotonic_ns()}"
        producer = client.create_producer(topic)
        producer.send(b"before")
        time.sleep(KEEPALIVE * 2.5)  # answering the broker's PINGs keeps it connected
        producer.send(b"after")
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        assert [reader.read_next(10_000).data() for _ in range(2)] == [b"before", b"after"]
    finally:
        client.close()


@pytest.fixture(scope="module")
def plain_secured(tmp_path_factory, pki):
    s = start_secured_broker(tmp_path_factory.mktemp("budget"), pki)
    yield s
    s.broker.stop()


def test_partial_frames_of_strangers_share_one_budget(plain_secured):
    """Strangers each holding most of a 64 KiB frame: past PREAUTH_BUFFER_BUDGET in total the
    newcomers are closed, the earlier ones stay, and a real client still connects."""
    part = struct.pack(">I", PREAUTH_MAX_FRAME_SIZE - 16) + b"\0" * (60 * 1024)
    fit = PREAUTH_BUFFER_BUDGET // len(part)
    socks = []
    try:
        for _ in range(fit + 20):
            s = open_raw(plain_secured.broker.port)
            try:
                s.sendall(part)
            except (BrokenPipeError, ConnectionResetError):
                pass
            socks.append(s)
        time.sleep(1.0)  # let the broker read them all
        # which are closed now: one select over all of them, then only the readable ones are read
        # (a socket with nothing to read is open: 20 ms of closed_within each cost seconds here)
        readable = set(select.select(socks, [], [], 0)[0])
        closed = [s in readable and closed_within(s, 0.02) for s in socks]
        assert not any(closed[: fit - 5]), "a stranger within the budget was closed"
        assert sum(closed[fit:]) >= 15, "strangers past the budget stayed connected"
        client = make_client(
            plain_secured.broker.url, authentication=pulsar.AuthenticationToken(plain_secured.token("admin"))
        )
        try:
            client.create_producer(f"persistent://public/default/budget-{time.monotonic_ns()}").send(b"ok")
        finally:
            client.close()
    finally:
        for s in socks:
            s.close()
