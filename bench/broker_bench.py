"""Broker throughput with the official client, and the broker's CPU cost per message.

Starts ``compactmq standalone`` as a subprocess on free ports with a fresh data directory,
then, per scenario, drives it with ``pulsar-client``:

- ``publish_nobatch`` / ``publish_batch``: one producer, ``send_async`` of N messages of
  ``--size`` bytes, until every SEND_RECEIPT is back (fsync per group commit, the default);
- ``consume_nobatch`` / ``consume_batch``: one Exclusive consumer reads the topic written by
  the matching publish scenario from the earliest position and acknowledges every message.

- ``publish_*_auth_off`` / ``publish_*_token_auth``: the cost of security on the publish path.
  A second broker runs with token authentication (HS256) and authorization on, the client
  connects with ``AuthenticationToken``; both brokers are published to alternately
  (``--auth-trials`` rounds each), so load on the shared machine hits both alike. Auth is
  checked at CONNECT and PRODUCER only, so the two should not differ beyond noise;
  ``auth_overhead`` gives, per mode, the ratio of the median throughputs and the median
  broker CPU per message of each (the steadier figure when the machine is busy).

For each phase: wall time, messages/s, MiB/s, and the broker process's CPU time (user +
system, from ``/proc/<pid>/stat``) divided by the messages: microseconds of broker CPU per
message. Client and broker share the machine, so throughput is a lower bound of what the
broker alone can do; the CPU figure is the broker's own.

    .venv/bin/python bench/broker_bench.py            # 200,000 messages per scenario
    .venv/bin/python bench/broker_bench.py --quick    # 20,000
Writes bench/results/broker.json (``--out`` to change).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from standalone import ROOT, StandaloneBroker as Broker  # noqa: E402


def measure(broker: Broker, name: str, messages: int, size: int, fn) -> dict:
    cpu0, t0 = broker.cpu(), time.perf_counter()
    fn()
    secs = time.perf_counter() - t0
    cpu = broker.cpu() - cpu0
    result = {
        "scenario": name,
        "messages": messages,
        "message_bytes": size,
        "seconds": round(secs, 3),
        "msgs_per_s": round(messages / secs),
        "mib_per_s": round(messages * size / secs / 2**20, 2),
        "broker_cpu_seconds": round(cpu, 3),
        "broker_cpu_us_per_msg": round(cpu / messages * 1e6, 2),
    }
    print(json.dumps(result), flush=True)
    return result


def publish(client, topic: str, n: int, size: int, batching: bool):
    import pulsar

    producer = client.create_producer(
        topic,
        batching_enabled=batching,
        batching_max_messages=1000,
        batching_max_publish_delay_ms=5,
        max_pending_messages=10000,
        block_if_queue_full=True,
    )
    payload = b"x" * size
    failures = []

    def done(res, _mid):
        if res != pulsar.Result.Ok:
            failures.append(res)

    def run():
        for _ in range(n):
            producer.send_async(payload, done)
        producer.flush()

    return producer, run, failures


def consume(client, topic: str, n: int):
    import pulsar

    def run():
        consumer = client.subscribe(
            topic, "bench", initial_position=pulsar.InitialPosition.Earliest, receiver_queue_size=5000
        )
        for _ in range(n):
            consumer.acknowledge(consumer.receive(30_000))
        consumer.close()

    return run


def token_auth_overrides(secret: bytes, role: str) -> list[str]:
    """A broker that authenticates tokens signed with ``secret`` and authorizes ``role``."""
    import base64

    return [
        "authenticationEnabled=true",
        "authenticationProviders=org.apache.pulsar.broker.authentication.AuthenticationProviderToken",
        "tokenSecretKey=data:;base64," + base64.b64encode(secret).decode(),
        "authorizationEnabled=true",
        f"superUserRoles={role}",
    ]


def auth_comparison(tmp: str, overrides: list[str], n: int, size: int, trials: int) -> tuple[list, dict]:
    """Publish to a broker without auth and to one with token auth, alternately."""
    import statistics

    import jwt
    import pulsar

    secret = os.urandom(32)
    token = jwt.encode({"sub": "bench"}, secret, algorithm="HS256")
    plain = Broker(os.path.join(tmp, "auth-off"), overrides)
    secured = Broker(os.path.join(tmp, "auth-on"), overrides + token_auth_overrides(secret, "bench"))
    results: list[dict] = []
    ratios: dict[str, dict] = {}
    try:
        clients = {
            "auth_off": (
                plain,
                pulsar.Client(
                    plain.url,
                    operation_timeout_seconds=60,
                    logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
                ),
            ),
            "token_auth": (
                secured,
                pulsar.Client(
                    secured.url,
                    operation_timeout_seconds=60,
                    authentication=pulsar.AuthenticationToken(token),
                    logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
                ),
            ),
        }
        for batching in (False, True):
            label = "batch" if batching else "nobatch"
            rates: dict[str, list[float]] = {k: [] for k in clients}
            cpu: dict[str, list[float]] = {k: [] for k in clients}
            for _ in range(trials):
                for mode, (broker, client) in clients.items():
                    topic = f"bench-{mode}-{label}-{time.monotonic_ns()}"
                    producer, run, failures = publish(client, topic, n, size, batching)
                    r = measure(broker, f"publish_{label}_{mode}", n, size, run)
                    producer.close()
                    if failures:
                        raise SystemExit(f"{len(failures)} sends failed ({mode}): {failures[:3]}")
                    results.append(r)
                    rates[mode].append(r["msgs_per_s"])
                    cpu[mode].append(r["broker_cpu_us_per_msg"])
            ratios[f"publish_{label}"] = {
                # throughput is noisy on a shared machine; the broker's CPU per message is not
                "msgs_per_s_ratio": round(
                    statistics.median(rates["token_auth"]) / statistics.median(rates["auth_off"]), 3
                ),
                "median_msgs_per_s": {mode: statistics.median(v) for mode, v in rates.items()},
                "median_broker_cpu_us_per_msg": {mode: statistics.median(v) for mode, v in cpu.items()},
            }
        for _, client in clients.values():
            client.close()
    finally:
        plain.stop()
        secured.stop()
    return results, ratios


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="20,000 messages per scenario")
    ap.add_argument("--messages", type=int, help="messages per scenario (default 200,000)")
    ap.add_argument("--size", type=int, default=100, help="payload bytes (default 100)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "broker.json"))
    ap.add_argument("--config-override", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument(
        "--auth-trials",
        type=int,
        default=3,
        help="publish rounds per broker in the auth on/off comparison (default 3; 0 skips it)",
    )
    args = ap.parse_args(argv)
    n = args.messages or (20_000 if args.quick else 200_000)

    import pulsar

    results = []
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="compactmq-bench-") as tmp:
        broker = Broker(os.path.join(tmp, "data"), args.config_override)
        try:
            client = pulsar.Client(
                broker.url,
                operation_timeout_seconds=60,
                logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
            )
            for batching in (False, True):
                label = "batch" if batching else "nobatch"
                topic = f"bench-{label}-{time.monotonic_ns()}"
                producer, run, failures = publish(client, topic, n, args.size, batching)
                results.append(measure(broker, f"publish_{label}", n, args.size, run))
                producer.close()
                if failures:
                    raise SystemExit(f"{len(failures)} sends failed: {failures[:3]}")
                results.append(measure(broker, f"consume_{label}", n, args.size, consume(client, topic, n)))
            client.close()
        finally:
            broker.stop()
        auth_overhead: dict[str, dict] = {}
        if args.auth_trials > 0:
            auth_results, auth_overhead = auth_comparison(
                tmp, args.config_override, n, args.size, args.auth_trials
            )
            results.extend(auth_results)

    out = {
        "benchmark": "broker",
        "quick": args.quick,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            # other work on the machine lowers throughput; the CPU-per-message figures hold up
            "loadavg_1m_before": round(load_before[0], 2),
            "loadavg_1m_after": round(os.getloadavg()[0], 2),
        },
        "client": f"pulsar-client {pulsar.__version__}"
        if hasattr(pulsar, "__version__")
        else "pulsar-client",
        "config_overrides": args.config_override,
        "notes": "client and broker share the machine; broker CPU from /proc/<pid>/stat (user+system)",
        "results": results,
        # per mode: median msgs/s with token auth on / off, and median broker CPU us/msg of each
        "auth_overhead": auth_overhead,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
