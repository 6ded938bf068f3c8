"""Unauthenticated connections held open: what they cost the broker, whether the handshake
deadline closes them, and whether authenticated clients keep their publish rate meanwhile.

Starts ``compactmq standalone`` with token authentication (HS256) and authorization on, and
``keepAliveIntervalSeconds`` = ``--deadline`` (the CONNECT deadline, see broker/admission.py).
Then:

1. warm-up: an authenticated producer (official client, token of the superuser) publishes for
   a moment, so the broker's own publish-path allocations are in the baseline;
2. ``baseline``: the authenticated publish rate over ``--seconds``, then broker RSS (VmRSS of
   /proc/<pid>/status; after the publishing, so what it allocates is in the baseline);
3. ``held``: ``--connections`` raw TCP connections are opened and held; in ``--mode silent``
   they send nothing (the issue's case), in ``--mode partial`` each sends the first
   ``--partial-bytes`` of a frame that would be within the pre-CONNECT limit and stops (the
   worst a stranger can make the broker buffer per connection). Broker RSS once all are open,
   and the authenticated publish rate over ``--seconds`` while they are held;
4. ``closed``: how many of the held connections the broker closed, and when (seconds after
   they were opened), waiting up to twice the deadline; broker RSS afterwards.

Publishing: one producer, batching on, ``send_async`` of 100-byte messages with at most 1,000
in flight, counting acknowledged messages. Client, broker and the held sockets share the
machine, so the rates are lower bounds; the RSS figures are the broker's own.

    .venv/bin/python bench/preauth_bench.py --quick     # deadline 10 s, 3 s phases
    .venv/bin/python bench/preauth_bench.py             # deadline 30 s (the default), 10 s phases
Writes bench/results/preauth.json (``--out`` to change).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import platform
import socket
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from standalone import ROOT, StandaloneBroker as Broker  # noqa: E402

sys.path.insert(0, str(ROOT / "tests"))
from harness.sockets import closed_by_peer  # noqa: E402

import jwt  # noqa: E402
import pulsar  # noqa: E402

MiB = 1024 * 1024


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError("no VmRSS")


def socket_fds(pid: int) -> int:
    """Sockets the process holds open (its accepted connections among them)."""
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            count += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return count


def wait_settled(pid: int, timeout: float = 20.0) -> int:
    """Wait until the broker's socket count stops changing for a second; that count."""
    deadline = time.monotonic() + timeout
    last, since = socket_fds(pid), time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - since < 1.0:
        time.sleep(0.05)
        now = socket_fds(pid)
        if now != last:
            last, since = now, time.monotonic()
    return last


def publish_rate(client: pulsar.Client, topic: str, seconds: float) -> dict:
    """Messages acknowledged per second by one batching producer over ``seconds``."""
    producer = client.create_producer(topic, batching_enabled=True, max_pending_messages=1000)
    done = threading.Semaphore(0)
    acked = [0]
    in_flight = threading.BoundedSemaphore(1000)

    def callback(res, _msg_id) -> None:
        if res == pulsar.Result.Ok:
            acked[0] += 1
        in_flight.release()
        done.release()

    payload = b"x" * 100
    start = time.perf_counter()
    sent = 0
    while time.perf_counter() - start < seconds:
        in_flight.acquire()
        producer.send_async(payload, callback)
        sent += 1
    producer.flush()
    for _ in range(sent):
        done.acquire(timeout=30)
    secs = time.perf_counter() - start
    producer.close()
    return {"messages": acked[0], "seconds": round(secs, 2), "msgs_per_s": round(acked[0] / secs)}


def open_held(port: int, count: int, mode: str, partial_bytes: int) -> list[socket.socket]:
    socks = []
    frame_start = struct.pack(">I", 64 * 1024 - 16) + b"\0" * max(0, partial_bytes - 4)
    for _ in range(count):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        if mode == "partial":
            s.sendall(frame_start[:partial_bytes])
        socks.append(s)
    return socks


def wait_closed(socks: list[socket.socket], opened_at: float, limit: float, deadline: float) -> dict:
    """Wait up to ``limit`` seconds for the broker to close ``socks``: how many it did, when."""
    closed_after, open_ = closed_by_peer(socks, opened_at, limit)
    for s in socks:
        s.close()
    return {
        "closed_by_broker": len(closed_after),
        # before the handshake deadline: over a limit or the pre-CONNECT buffer budget
        "closed_before_deadline": sum(1 for t in closed_after if t < deadline - 0.5),
        "still_open_after_wait": len(open_),
        "first_closed_after_s": round(min(closed_after), 2) if closed_after else None,
        "last_closed_after_s": round(max(closed_after), 2) if closed_after else None,
    }


def run(args) -> dict:
    secret = os.urandom(32)
    token = jwt.encode({"sub": "admin"}, secret, algorithm="HS256")
    with tempfile.TemporaryDirectory(prefix="preauth-bench-") as tmp:
        overrides = [
            "authenticationEnabled=true",
            "authorizationEnabled=true",
            "authenticationProviders=org.apache.pulsar.broker.authentication.AuthenticationProviderToken",
            "superUserRoles=admin",
            "tokenSecretKey=data:;base64," + base64.b64encode(secret).decode(),
            f"keepAliveIntervalSeconds={args.deadline}",
            # the broker's own admin client creates public/default only with a superuser's
            # credentials, as a Pulsar standalone does (broker/default_namespace.py)
            "brokerClientAuthenticationPlugin=org.apache.pulsar.client.impl.auth.AuthenticationToken",
            f"brokerClientAuthenticationParameters=token:{token}",
        ]
        broker = Broker(os.path.join(tmp, "data"), overrides)
        client = pulsar.Client(
            broker.url,
            authentication=pulsar.AuthenticationToken(token),
            logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
            operation_timeout_seconds=30,
        )
        topic = "persistent://public/default/preauth-bench"
        try:
            publish_rate(client, topic, 1.0)  # warm-up
            baseline = publish_rate(client, topic, args.seconds)
            time.sleep(0.5)
            base_rss = rss_mib(broker.proc.pid)  # after publishing: its caches are in the baseline
            base_sockets = socket_fds(broker.proc.pid)
            opened_at = time.monotonic()
            socks = open_held(broker.port, args.connections, args.mode, args.partial_bytes)
            held_by_broker = wait_settled(broker.proc.pid) - base_sockets
            open_seconds = time.monotonic() - opened_at
            held_rss = rss_mib(broker.proc.pid)
            during = publish_rate(client, topic, min(args.seconds, max(1.0, args.deadline * 0.6)))
            closing = wait_closed(socks, opened_at, args.deadline * 2 + 5, args.deadline)
            time.sleep(0.5)
            after_rss = rss_mib(broker.proc.pid)
        finally:
            client.close()
            broker.stop()
    return {
        "benchmark": "preauth",
        "mode": args.mode,
        "partial_bytes": args.partial_bytes if args.mode == "partial" else 0,
        "connections": args.connections,
        "deadline_s": args.deadline,
        "held_by_broker_once_settled": held_by_broker,
        "seconds_to_open_and_settle": round(open_seconds, 2),
        "broker_rss_mib": {"baseline": base_rss, "held": held_rss, "after_close": after_rss},
        "rss_added_by_held_mib": round(held_rss - base_rss, 1),
        "publish": {"baseline": baseline, "while_held": during},
        "publish_rate_ratio": round(during["msgs_per_s"] / max(1, baseline["msgs_per_s"]), 3),
        "closing": closing,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--connections", type=int, default=1000)
    p.add_argument("--mode", choices=("silent", "partial"), default="silent")
    p.add_argument("--partial-bytes", type=int, default=16 * 1024)
    p.add_argument("--deadline", type=int, default=30, help="keepAliveIntervalSeconds")
    p.add_argument("--seconds", type=float, default=10.0, help="length of each publish phase")
    p.add_argument("--quick", action="store_true", help="deadline 10 s, 3 s publish phases")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "preauth.json"))
    args = p.parse_args()
    if args.quick:
        args.deadline, args.seconds = 10, 3.0
    result = run(args)
    result["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version()}
    print(json.dumps(result, indent=2))
    out = Path(args.out)
    runs = json.loads(out.read_text()) if out.exists() else []
    runs = [
        r for r in runs if (r.get("mode"), r.get("connections")) != (result["mode"], result["connections"])
    ]
    out.write_text(json.dumps([*runs, result], indent=2) + "\n")


if __name__ == "__main__":
    main()
