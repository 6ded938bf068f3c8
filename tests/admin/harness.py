"""What the admin and CLI end-to-end tests share: a broker subprocess with a short compaction
monitor interval and the test Spark profile, a tiny HTTP client, and helpers to publish keyed
messages with the official client and to wait for a compaction status."""

from __future__ import annotations

import json
import sqlite3
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from compactmq.compaction.spark.session import TEST_CONF

from broker.conftest import BrokerProcess, make_client  # tests/ is on sys.path (pytest rootdir-less import)

MONITOR_INTERVAL_SECONDS = 2
ROOT_DIR = Path(__file__).resolve().parents[2]


def start_broker(data_dir: Path, **overrides: str) -> BrokerProcess:
    b = BrokerProcess(
        data_dir,
        {
            "brokerServiceCompactionMonitorIntervalInSeconds": str(MONITOR_INTERVAL_SECONDS),
            **TEST_CONF,  # the compaction test profile, as config overrides
            **overrides,
        },
    )
    b.start(timeout=60)
    return b


class Http:
    """``call(method, path, body)`` -> (status, parsed JSON body or text or None)."""

    def __init__(self, base: str) -> None:
        self.base = base.rstrip("/")

    def call(self, method: str, path: str, body: Any = None, raw: bytes | None = None) -> tuple[int, Any]:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        req = urllib.request.Request(
            self.base + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/json"} if data is not None else {},
        )
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                status, payload, ctype = resp.status, resp.read(), resp.headers.get("Content-Type", "")
        except urllib.error.HTTPError as e:
            status, payload, ctype = e.code, e.read(), e.headers.get("Content-Type", "")
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


def monitor_checks(http: Http) -> int:
    """How many periodic compaction checks the broker's monitor has done (from /metrics)."""
    status, text = http.call("GET", "/metrics")
    assert status == 200, status
    for line in text.splitlines():
        if line.startswith("compactmq_compaction_monitor_checks_total{"):
            return int(float(line.rsplit(" ", 1)[1]))
    raise AssertionError("no compactmq_compaction_monitor_checks_total in /metrics")


def wait_monitor_checks(http: Http, n: int, timeout: float = 60.0) -> None:
    """Wait until the monitor has done ``n`` more complete checks (each then triggered what it
    found due), so a test can assert that a check did NOT trigger a run."""
    target = monitor_checks(http) + n
    deadline = time.monotonic() + timeout
    while monitor_checks(http) < target:
        assert time.monotonic() < deadline, f"the compaction monitor did not check {n} times in {timeout} s"
        time.sleep(0.1)


def web_url(broker: BrokerProcess) -> str:
    return f"http://127.0.0.1:{broker.web_port}"


def topic_path(topic: str) -> str:
    domain, rest = topic.split("://", 1)
    return f"/admin/v2/{domain}/{rest}"


def publish(
    broker: BrokerProcess, topic: str, n: int, keys: int, prefix: str = "v", batching: bool = True
) -> None:
    c = make_client(broker.url)
    try:
        p = c.create_producer(
            topic, batching_enabled=batching, block_if_queue_full=True, batching_max_publish_delay_ms=5
        )
        for i in range(n):
            p.send_async(f"{prefix}{i}".encode(), None, partition_key=f"k{i % keys}")
        p.flush()
        p.close()
    finally:
        c.close()


def wait_status(http: Http, topic: str, want: str, timeout: float = 120.0, running_ok: bool = True) -> dict:
    deadline = time.monotonic() + timeout
    body = None
    while time.monotonic() < deadline:
        body = http.ok("GET", topic_path(topic) + "/compaction")
        if body["status"] == want:
            return body
        if not running_ok and body["status"] not in ("RUNNING", want):
            break
        time.sleep(0.2)
    raise AssertionError(f"{topic}: status {body} never became {want}")


def poke_policy(data_dir: Path, scope: str, name: str, key: str, value: Any) -> None:
    """Write a policy straight into the metadata store (WAL: beside the running broker), to
    store a value the REST API would refuse -- the way to make a compaction run fail."""
    db = sqlite3.connect(data_dir / "metadata.db", timeout=30)
    try:
        with db:
            db.execute(
                "INSERT INTO policies(scope, name, key, value) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(scope, name, key) DO UPDATE SET value = excluded.value",
                (scope, name, key, json.dumps(value)),
            )
    finally:
        db.close()
