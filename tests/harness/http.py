"""The broker's admin REST API as tests see it: real HTTP over 127.0.0.1 with the stdlib.

Two shapes, both kept because both read well where they are used:

- ``Http(base)``: an object per broker; ``call(method, path, body)`` answers (status, parsed
  JSON or text or None), ``ok`` asserts the status a success has, ``error`` asserts an error
  status with a JSON ``reason``;
- ``rest(broker, method, path, body)`` and ``ok(result)``: the same as functions of a broker.

``subscription_stats``, ``wait_backlog`` and ``wait_unacked`` ask a broker's topic stats about a
subscription, the way a test waits for acknowledgements the client sends in groups;
``object_store_counters`` reads what the broker says it wrote to its object store.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from .wait import wait_until

_NO_BODY = object()


def web(broker) -> str:
    """The broker's admin base URL."""
    return f"http://127.0.0.1:{broker.web_port}"


def _send(url: str, method: str, data: bytes | None, content_type: str) -> tuple[int, bytes, str]:
    req = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": content_type} if data is not None else {}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read(), resp.headers.get("Content-Type", "")
    except urllib.error.HTTPError as e:
        return e.code, e.read(), e.headers.get("Content-Type", "")


def rest(
    broker,
    method: str,
    path: str,
    body: Any = _NO_BODY,
    raw: bytes | None = None,
    content_type: str = "application/json",
) -> tuple[int, Any]:
    """(status, the JSON body parsed, or its text when it is not JSON, or None when empty)."""
    data = raw
    if body is not _NO_BODY:
        data = json.dumps(body).encode()
    status, payload, _ = _send(web(broker) + path, method, data, content_type)
    try:
        return status, json.loads(payload) if payload else None
    except ValueError:
        return status, payload.decode(errors="replace")


def ok(result: tuple[int, Any]) -> Any:
    """The body of a 2xx answer (asserts the status)."""
    status, body = result
    assert 200 <= status < 300, (status, body)
    return body


class Http:
    """``call(method, path, body)`` -> (status, parsed JSON body or text or None)."""

    def __init__(self, base: str) -> None:
        self.base = base.rstrip("/")

    def call(self, method: str, path: str, body: Any = None, raw: bytes | None = None) -> tuple[int, Any]:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        status, payload, ctype = _send(self.base + path, method, data, "application/json")
        if not payload:
            return status, None
        if "json" in ctype:
            return status, json.loads(payload)
        return status, payload.decode()

    def ok(self, method: str, path: str, body: Any = None, expect: int | None = None) -> Any:
        status, out = self.call(method, path, body)
        want = expect or (204 if method in ("PUT", "POST", "DELETE") else 200)
        assert status == want, (method, path, status, out)
        return out

    def error(self, method: str, path: str, status: int, body: Any = None, raw: bytes | None = None) -> str:
        got, out = self.call(method, path, body, raw)
        assert got == status, (method, path, got, out)
        assert isinstance(out, dict) and isinstance(out.get("reason"), str) and out["reason"], out
        return out["reason"]


def subscription_stats(broker, topic: str, subscription: str) -> dict:
    """The subscription's entry in the broker's admin topic stats."""
    path = topic.replace("://", "/", 1)
    return ok(rest(broker, "GET", f"/admin/v2/{path}/stats"))["subscriptions"][subscription]


def subscription_backlog(broker, topic: str, subscription: str) -> int:
    """The subscription's msgBacklog (entries) from the broker's admin stats."""
    return subscription_stats(broker, topic, subscription)["msgBacklog"]


def wait_unacked(broker, topic: str, subscription: str, unacked: int, timeout: float = 15.0) -> None:
    """Wait until the subscription's unackedMessages (messages, batch indexes counted one by one,
    as on Pulsar) is ``unacked``: the broker has the acknowledgements the client grouped."""
    wait_until(
        lambda: subscription_stats(broker, topic, subscription)["unackedMessages"] == unacked,
        timeout,
        f"{subscription} to have {unacked} unacked messages",
    )


def wait_backlog(broker, topic: str, subscription: str, backlog: int, timeout: float = 15.0) -> None:
    """Wait until the broker has the subscription's acknowledgements (the client groups them)."""
    wait_until(
        lambda: subscription_backlog(broker, topic, subscription) == backlog,
        timeout,
        f"the backlog of {subscription} to be {backlog}",
    )


def object_store_counters(broker) -> dict[str, int]:
    """The broker's ``compactmq_object_store_{puts,put_bytes,deletes}_total`` from its ``/metrics``
    (those it exports: none before it has an object store)."""
    with urllib.request.urlopen(f"{web(broker)}/metrics", timeout=60) as resp:
        text = resp.read().decode()
    out = {}
    for line in text.splitlines():
        for name in ("puts", "put_bytes", "deletes"):
            if line.startswith(f"compactmq_object_store_{name}_total{{"):
                out[name] = int(float(line.rsplit(" ", 1)[1]))
    return out
