"""What an HTTP peer can hold on the web port (raw sockets against a broker with token, basic
and TLS authentication and authorization on): headers and bodies must arrive in time and be
bounded in size.
"""

from __future__ import annotations

import json
import socket
import time

import pytest

from harness.sockets import closed_by_peer  # tests/ is on sys.path

from .adminhttp import start_secured_broker

HEADER_TIMEOUT = 2
BODY_TIMEOUT = 2
HEADER_SIZE = 4096
BODY_SIZE = 64 * 1024


@pytest.fixture(scope="module")
def secured(tmp_path_factory, pki):
    s = start_secured_broker(
        tmp_path_factory.mktemp("http-limits"),
        pki,
        httpRequestHeaderTimeoutSeconds=str(HEADER_TIMEOUT),
        httpRequestBodyTimeoutSeconds=str(BODY_TIMEOUT),
        httpMaxRequestHeaderSize=str(HEADER_SIZE),
        httpMaxRequestSize=str(BODY_SIZE),
    )
    yield s
    s.broker.stop()


def open_raw(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    return s


def read_response(s: socket.socket, timeout: float) -> tuple[bytes, bool]:
    """Everything the server sends within ``timeout`` and whether it closed the socket."""
    got = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            data = s.recv(65536)
        except TimeoutError:
            return got, False
        except ConnectionResetError:
            return got, True
        if not data:
            return got, True
        got += data
    return got, False


def status_and_body(raw: bytes) -> tuple[int, bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def test_200_half_sent_requests_are_closed_by_the_deadline(secured):
    socks = []
    try:
        for _ in range(200):
            s = open_raw(secured.broker.web_port)
            s.sendall(b"GET /admin/v2/tenants HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            socks.append(s)
        _, open_ = closed_by_peer(socks, time.monotonic(), HEADER_TIMEOUT + 8)
        assert not open_, f"{len(open_)} half-sent requests still open after {HEADER_TIMEOUT + 8} s"
    finally:
        for s in socks:
            s.close()


def test_a_trickled_header_does_not_extend_the_deadline(secured):
    request = b"GET /admin/v2/tenants HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 200
    with open_raw(secured.broker.web_port) as s:
        started = time.monotonic()
        closed = False
        for i in range(len(request)):
            try:
                s.sendall(request[i : i + 1])
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            _, closed = read_response(s, 0.3)
            if closed:
                break
        assert closed
        assert time.monotonic() - started < HEADER_TIMEOUT + 3


def test_a_body_that_does_not_arrive_in_time_is_a_408_and_closes(secured):
    with open_raw(secured.broker.web_port) as s:
        s.sendall(
            b"PUT /admin/v2/tenants/slow HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b'Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"allowedClusters"'
        )
        started = time.monotonic()
        raw, closed = read_response(s, BODY_TIMEOUT + 5)
        assert closed and time.monotonic() - started < BODY_TIMEOUT + 4
        status, body = status_and_body(raw)
        assert status == 408 and "did not arrive" in json.loads(body)["reason"]


def test_headers_over_the_size_limit_are_refused(secured):
    with open_raw(secured.broker.web_port) as s:
        s.sendall(
            b"GET /admin/v2/tenants HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: "
            + b"a" * (HEADER_SIZE + 100)
            + b"\r\n\r\n"
        )
        raw, _ = read_response(s, 5)
        assert status_and_body(raw)[0] in (400, 431)


def test_a_body_over_the_size_limit_is_a_413_with_a_reason(secured):
    as_admin = secured.as_token("admin")
    status, out, _ = as_admin.call("PUT", "/admin/v2/tenants/big", {"allowedClusters": ["x" * BODY_SIZE]})
    assert status == 413, (status, out)
    assert "httpMaxRequestSize" in out["reason"]


def test_ordinary_requests_still_work(secured):
    as_admin = secured.as_token("admin")
    as_admin.ok("PUT", "/admin/v2/tenants/ordinary", {"allowedClusters": ["standalone"]})
    assert "ordinary" in as_admin.ok("GET", "/admin/v2/tenants")
    # the anonymous caller is still told to authenticate (the body was read, nothing else done)
    status, _, _ = secured.anonymous().call("PUT", "/admin/v2/tenants/nobody", {"allowedClusters": []})
    assert status == 401
