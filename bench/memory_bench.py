"""Broker memory under load: resident memory (RSS) over time, rounds of fresh topics and a soak.

Starts ``compactmq standalone`` as a subprocess (``standalone.StandaloneBroker``) and samples its
RSS from ``/proc/<pid>/status`` every ``--sample`` seconds while the official client drives it:

- ``rounds``: each round publishes ``--messages`` messages of ``--size`` bytes (batching off) to
  ``--topics`` *new* topics, one producer and one Shared consumer per topic that acknowledges
  everything; producers and consumers then close. RSS is read ``--settle`` seconds after each
  round (past the cache's age threshold, so what is left is what the broker keeps for good).
- ``idle``: ``--idle-topics`` topics with one idle producer each (one client connection); the
  figure of merit is the broker's RSS per topic (KiB), read once the producers are attached.
- ``connections``: ``--idle-connections`` client connections (CONNECT/CONNECTED on plain
  sockets, nothing else); the figures of merit are KiB per connection and connections per MiB.
- ``soak``: ``--soak-producers`` producers and as many consumers (Shared, acknowledging) on
  ``--soak-topics`` topics for ``--soak-seconds``; the figure of merit is the RSS growth over the
  last half of the run (flat: a few percent), first to last sample and along a fitted line; the
  plot shades that half.

``--compare SRC`` runs the same scenarios first against another checkout's ``src`` directory
(for example a ``git worktree`` of main), in the same invocation, so before and after share the
machine's conditions. Every message is checked: sent = received, no duplicates.

    .venv/bin/python bench/memory_bench.py --quick                      # ~1 minute per broker
    .venv/bin/python bench/memory_bench.py --quick --compare /tmp/main/src
Writes bench/results/memory.json and memory.png (matplotlib: pip install -e ".[bench]").
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from standalone import ROOT, StandaloneBroker  # noqa: E402

RESULTS = ROOT / "bench" / "results"


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class RssSampler(threading.Thread):
    """(seconds since start, RSS MiB) every ``interval`` seconds, with a label per phase."""

    def __init__(self, pid: int, interval: float) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.samples: list[tuple[float, float, str]] = []
        self.phase = "start"
        self.t0 = time.monotonic()
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                self.samples.append(
                    (round(time.monotonic() - self.t0, 2), round(rss_bytes(self.pid) / 2**20, 1), self.phase)
                )
            except OSError:
                return
            self._halt.wait(self.interval)

    def stop(self) -> None:
        self._halt.set()
        self.join()


class Traffic:
    """Producers and acknowledging Shared consumers on some topics; counts and checks ids."""

    def __init__(self, client, topics: list[str], producers_per_topic: int, size: int) -> None:
        import pulsar

        self.received = 0
        self.duplicates = 0
        self._seen: set[tuple[str, bytes]] = set()
        self._lock = threading.Lock()
        self.consumers = [
            client.subscribe(
                t, "bench", consumer_type=pulsar.ConsumerType.Shared, message_listener=self._on_message
            )
            for t in topics
            for _ in range(producers_per_topic)
        ]
        self.producers = [
            client.create_producer(
                t, batching_enabled=False, max_pending_messages=1000, block_if_queue_full=True
            )
            for t in topics
            for _ in range(producers_per_topic)
        ]
        self.sent = 0
        self.failed = 0
        self.payload = b"x" * size

    def _on_message(self, consumer, msg) -> None:
        key = (msg.topic_name(), msg.message_id().serialize())
        consumer.acknowledge(msg)
        with self._lock:
            if key in self._seen:
                self.duplicates += 1
            else:
                self._seen.add(key)
                self.received += 1

    def _done(self, res, _mid) -> None:
        import pulsar

        if res != pulsar.Result.Ok:
            with self._lock:
                self.failed += 1

    def publish(self, per_producer: int | None = None, until: float | None = None) -> None:
        """Each producer in its own thread: ``per_producer`` messages, or until ``until``."""
        counts = [0] * len(self.producers)

        def run(i: int, producer) -> None:
            while (per_producer is None or counts[i] < per_producer) and (
                until is None or time.monotonic() < until
            ):
                producer.send_async(self.payload, self._done)
                counts[i] += 1
            producer.flush()

        threads = [threading.Thread(target=run, args=(i, p)) for i, p in enumerate(self.producers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.sent = sum(counts)

    def wait_received(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while self.received < self.sent - self.failed and time.monotonic() < deadline:
            time.sleep(0.1)

    def close(self) -> None:
        for p in self.producers:
            p.close()
        for c in self.consumers:
            c.close()
        self._seen.clear()

    def summary(self) -> dict:
        return {
            "sent": self.sent,
            "received": self.received,
            "failed": self.failed,
            "duplicates": self.duplicates,
        }


def _client(url: str):
    import pulsar

    return pulsar.Client(
        url, operation_timeout_seconds=30, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    )


def run_rounds(broker: StandaloneBroker, sampler: RssSampler, args) -> list[dict]:
    out = []
    for r in range(args.rounds):
        sampler.phase = f"round {r + 1}"
        client = _client(broker.url)
        prefix = uuid.uuid4().hex[:8]
        topics = [f"persistent://public/default/mem-round-{prefix}-{i}" for i in range(args.topics)]
        traffic = Traffic(client, topics, 1, args.size)
        cpu0, t0 = broker.cpu(), time.perf_counter()
        traffic.publish(per_producer=args.messages // args.topics)
        traffic.wait_received()
        secs = time.perf_counter() - t0
        cpu = broker.cpu() - cpu0
        traffic.close()
        client.close()
        time.sleep(args.settle)
        row = {
            "round": r + 1,
            "rss_mib": round(rss_bytes(broker.proc.pid) / 2**20, 1),
            "seconds": round(secs, 2),
            "msgs_per_s": round(traffic.sent / secs),
            "broker_cpu_us_per_msg": round(cpu / max(1, traffic.sent) * 1e6, 1),
            **traffic.summary(),
        }
        print(json.dumps(row), flush=True)
        out.append(row)
    return out


def run_soak(broker: StandaloneBroker, sampler: RssSampler, args) -> dict:
    sampler.phase = "soak"
    client = _client(broker.url)
    prefix = uuid.uuid4().hex[:8]
    topics = [f"persistent://public/default/mem-soak-{prefix}-{i}" for i in range(args.soak_topics)]
    traffic = Traffic(client, topics, args.soak_producers // args.soak_topics, args.size)
    start = time.monotonic() - sampler.t0
    cpu0 = broker.cpu()
    traffic.publish(until=time.monotonic() + args.soak_seconds)
    end = time.monotonic() - sampler.t0
    behind_at_end = traffic.sent - traffic.received
    drain0 = time.monotonic()
    traffic.wait_received(args.drain_timeout)
    drain = time.monotonic() - drain0
    cpu = broker.cpu() - cpu0
    traffic.close()
    client.close()
    soak = [(t, m) for t, m, phase in sampler.samples if phase == "soak" and start <= t <= end]
    half = [m for t, m in soak if t >= start + (end - start) / 2]
    growth = (half[-1] - half[0]) / half[0] if len(half) >= 2 else None
    fitted = _fitted_growth([(t, m) for t, m in soak if t >= start + (end - start) / 2])
    row = {
        "seconds": round(end - start, 1),
        "rss_mib_first": soak[0][1] if soak else None,
        "rss_mib_last": soak[-1][1] if soak else None,
        "rss_mib_max": max((m for _, m in soak), default=None),
        "growth_last_half": round(growth, 4) if growth is not None else None,
        "growth_last_half_fitted": round(fitted, 4) if fitted is not None else None,
        "last_half_from_s": round(start + (end - start) / 2, 1),
        "last_half_to_s": round(end, 1),
        "msgs_per_s": round(traffic.sent / max(1e-9, end - start)),
        "broker_cpu_us_per_msg": round(cpu / max(1, traffic.sent) * 1e6, 1),
        "bytes_per_msg_growth": round((soak[-1][1] - soak[0][1]) * 2**20 / max(1, traffic.sent), 1)
        if soak
        else None,
        "behind_at_end": behind_at_end,
        "drain_seconds": round(drain, 1),
        **traffic.summary(),
    }
    print(json.dumps({"soak": row}), flush=True)
    return row


def _fitted_growth(samples: list[tuple[float, float]]) -> float | None:
    """Growth over ``samples`` along their least-squares line (end over start of the line),
    less sensitive than the first and last sample to the allocator's momentary swings."""
    if len(samples) < 3:
        return None
    n = len(samples)
    mt = sum(t for t, _ in samples) / n
    mm = sum(m for _, m in samples) / n
    var = sum((t - mt) ** 2 for t, _ in samples)
    slope = sum((t - mt) * (m - mm) for t, m in samples) / var if var else 0.0
    first = mm + slope * (samples[0][0] - mt)
    last = mm + slope * (samples[-1][0] - mt)
    return (last - first) / first if first else None


def run_idle(broker: StandaloneBroker, sampler: RssSampler, args) -> dict:
    sampler.phase = "idle topics"
    client = _client(broker.url)
    prefix = uuid.uuid4().hex[:8]
    time.sleep(args.settle)
    before = rss_bytes(broker.proc.pid)
    t0 = time.perf_counter()
    producers = [
        client.create_producer(f"persistent://public/default/mem-idle-{prefix}-{i}", batching_enabled=False)
        for i in range(args.idle_topics)
    ]
    secs = time.perf_counter() - t0
    time.sleep(args.settle)
    after = rss_bytes(broker.proc.pid)
    for p in producers:
        p.close()
    client.close()
    row = {
        "topics": args.idle_topics,
        "rss_mib_before": round(before / 2**20, 1),
        "rss_mib_after": round(after / 2**20, 1),
        "kib_per_topic": round((after - before) / 1024 / args.idle_topics, 1),
        "seconds_to_attach": round(secs, 1),
    }
    print(json.dumps({"idle": row}), flush=True)
    return row


def _connect_frame() -> bytes:
    from compactmq.protocol import pulsar_pb2 as pb
    from compactmq.protocol.frames import encode_command

    cmd = pb.BaseCommand(type=pb.BaseCommand.CONNECT)
    cmd.connect.client_version = "memory-bench"
    cmd.connect.protocol_version = 20
    return encode_command(cmd)


def run_connections(broker: StandaloneBroker, sampler: RssSampler, args) -> dict:
    """``--idle-connections`` connections that only said CONNECT: what one costs the broker."""
    import socket

    sampler.phase = "idle connections"
    time.sleep(args.settle)
    before = rss_bytes(broker.proc.pid)
    frame = _connect_frame()
    socks = []
    try:
        for _ in range(args.idle_connections):
            s = socket.create_connection(("127.0.0.1", broker.port), timeout=30)
            s.sendall(frame)
            socks.append(s)
        for s in socks:  # every one answered CONNECTED (any answer at all: the broker holds it)
            if not s.recv(4096):
                raise RuntimeError("the broker closed a connection instead of CONNECTED")
        time.sleep(args.settle)
        after = rss_bytes(broker.proc.pid)
    finally:
        for s in socks:
            s.close()
    kib = (after - before) / 1024 / max(1, args.idle_connections)
    row = {
        "connections": args.idle_connections,
        "rss_mib_before": round(before / 2**20, 1),
        "rss_mib_after": round(after / 2**20, 1),
        "kib_per_connection": round(kib, 1),
        "connections_per_mib": round(1024 / kib, 1) if kib > 0 else None,
    }
    print(json.dumps({"connections": row}), flush=True)
    return row


def run_broker(label: str, src: str | None, args) -> dict:
    with tempfile.TemporaryDirectory(prefix="memory-bench-") as tmp:
        broker = StandaloneBroker(os.path.join(tmp, "data"), args.override, src=src)
        sampler = RssSampler(broker.proc.pid, args.sample)
        sampler.start()
        try:
            print(f"--- {label} ({src or 'this checkout'})", flush=True)
            result: dict = {"label": label, "src": src or "this checkout"}
            if args.mode in ("rounds", "both"):
                result["rounds"] = run_rounds(broker, sampler, args)
            if args.mode in ("soak", "both"):
                result["soak"] = run_soak(broker, sampler, args)
            if args.mode in ("idle", "many"):
                result["idle"] = run_idle(broker, sampler, args)
            if args.mode in ("connections", "many"):
                result["connections"] = run_connections(broker, sampler, args)
        finally:
            sampler.stop()
            broker.stop()
        result["rss_samples"] = sampler.samples
        return result


def plot(results: list[dict], path: Path, note: str = "") -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print('no plot: matplotlib is missing (pip install -e ".[bench]")')
        return
    with_rounds = any(res.get("rounds") for res in results)
    if with_rounds:
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    else:  # a soak alone: one panel
        fig, ax1 = plt.subplots(1, 1, figsize=(8, 4.5))
        ax2 = None
    for res in results:
        ts = [t for t, _, _ in res["rss_samples"]]
        label = res["label"]
        soak = res.get("soak")
        if soak and soak.get("growth_last_half") is not None:
            label += f" (soak: {soak['growth_last_half']:+.1%} over the last half)"
            ax1.axvspan(soak["last_half_from_s"], soak["last_half_to_s"], alpha=0.08)
        ax1.plot(ts, [m for _, m, _ in res["rss_samples"]], label=label)
        if res.get("rounds") and ax2 is not None:
            ax2.plot(
                [r["round"] for r in res["rounds"]],
                [r["rss_mib"] for r in res["rounds"]],
                "o-",
                label=res["label"],
            )
    ax1.set_xlabel("seconds")
    ax1.set_ylabel("broker RSS (MiB)")
    ax1.set_title(
        "RSS over the run (rounds, then soak; shaded: the soak's last half)" + (f"\n{note}" if note else ""),
        fontsize=10,
    )
    ax1.legend()
    if ax2 is not None:
        ax2.set_xlabel("round (fresh topics each)")
        ax2.set_ylabel("broker RSS after the round (MiB)")
        ax2.set_title("RSS per round")
        ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"wrote {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--mode",
        choices=("rounds", "soak", "both", "idle", "connections", "many"),
        default="both",
        help="both: rounds then soak; many: idle topics then idle connections",
    )
    ap.add_argument(
        "--idle-connections",
        type=int,
        default=2000,
        help="client connections that only CONNECT (connections)",
    )
    ap.add_argument(
        "--idle-topics", type=int, default=10_000, help="topics with one idle producer each (idle)"
    )
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--topics", type=int, default=4, help="new topics per round")
    ap.add_argument("--messages", type=int, default=200_000, help="messages per round")
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--settle", type=float, default=3.0, help="seconds before reading RSS after a round")
    ap.add_argument("--soak-seconds", type=float, default=600)
    ap.add_argument("--soak-topics", type=int, default=10)
    ap.add_argument("--soak-producers", type=int, default=20)
    ap.add_argument(
        "--drain-timeout",
        type=float,
        default=60,
        help="seconds the soak waits, once publishing stops, for consumers to receive everything",
    )
    ap.add_argument("--sample", type=float, default=0.5, help="seconds between RSS samples")
    ap.add_argument("--quick", action="store_true", help="4 rounds of 20,000 messages, a 25 s soak")
    ap.add_argument("--override", action="append", default=[], help="broker config key=value (repeatable)")
    ap.add_argument("--compare", help="another checkout's src directory, run first (the 'before')")
    ap.add_argument("--out", default=str(RESULTS / "memory.json"))
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.messages, args.soak_seconds, args.settle = 4, 20_000, 25, 2.0
        args.idle_topics = min(args.idle_topics, 500)
        args.idle_connections = min(args.idle_connections, 200)
    runs = []
    if args.compare:
        runs.append(run_broker("before", args.compare, args))
    runs.append(run_broker("after" if args.compare else "compactmq", None, args))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "benchmark": "memory",
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "settings": {k: v for k, v in vars(args).items() if k not in ("out",)},
        "runs": runs,
    }
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out}")
    plot(runs, out.with_suffix(".png"), " ".join(args.override))


if __name__ == "__main__":
    main()
