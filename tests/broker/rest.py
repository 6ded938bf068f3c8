"""Small helpers for integration tests that drive the broker's public HTTP and CLI interfaces:
``rest(broker, METHOD, path, body)`` answers (status, parsed JSON body or None), ``cli(broker,
*args)`` runs the ``compactmq`` command as a subprocess against the broker's admin URL."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any, Callable

from .conftest import ROOT

_NO_BODY = object()


def web(broker) -> str:
    return f"http://127.0.0.1:{broker.web_port}"


def rest(
    broker,
    method: str,
    path: str,
    body: Any = _NO_BODY,
    raw: bytes | None = None,
    content_type: str = "application/json",
) -> tuple[int, Any]:
    data = raw
    if body is not _NO_BODY:
        data = json.dumps(body).encode()
    req = urllib.request.Request(
        web(broker) + path,
        data=data,
        method=method,
        headers={"Content-Type": content_type} if data is not None else {},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            status, payload = resp.status, resp.read()
    except urllib.error.HTTPError as e:
        status, payload = e.code, e.read()
    try:
        return status, json.loads(payload) if payload else None
    except ValueError:
        return status, payload.decode(errors="replace")


def ok(result: tuple[int, Any]) -> Any:
    status, body = result
    assert 200 <= status < 300, (status, body)
    return body


def cli(broker, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "compactmq.cli.main", "--admin-url", web(broker), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)


def wait_until(predicate: Callable[[], Any], timeout: float = 15.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
