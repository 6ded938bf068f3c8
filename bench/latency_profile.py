"""Where the broker's CPU goes at a fixed low rate with a consumer: figures per message that
hold up on a busy machine.

``compactmq standalone`` (this checkout, and with ``--main-src`` another checkout's ``src``) is
driven like ``vs_pulsar_lite.py``'s latency run: one producer (batching off), one Exclusive
consumer acknowledging each message, ``--rate`` messages/s (5,000). Three phases per broker,
each on a fresh topic, the brokers taking turns phase by phase:

- ``cpu``: broker user and system CPU microseconds per message (``/proc/<pid>/stat``), context
  switches per message summed over the broker's threads (``/proc/<pid>/task/*/status``), and
  the client's publish and publish-to-consume p50/p99 (noisy: the machine is shared);
- ``syscalls``: system calls per message by name over all threads (``perf trace -s -p``;
  ``strace -c -f`` slowed the broker enough to change its batching). ``epoll_pwait`` counts
  the loop's polls;
- ``profile``: Python calls per message on the event-loop thread (cProfile, enabled and dumped
  by signals sent to the broker, ``_profiled_broker.py``), grouped by the part of the path the
  function belongs to (send, sync, dispatch, ack, loop/other), and the top functions.

    .venv/bin/python bench/latency_profile.py --seconds 20 --main-src /tmp/main41/src
Writes bench/results/latency_profile[_<name>].json (``--out`` to change).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import pstats
import signal
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from standalone import CLK_TCK, ROOT, StandaloneBroker  # noqa: E402
from vs_pulsar_lite import run_latency  # noqa: E402

RESULTS = ROOT / "bench" / "results"

# which part of the path a function belongs to, by file (then by function name for the shared
# files); the first match wins
PARTS = (
    ("ack", ("consumer_commands.py", "cursor", "limits.py", "acks")),
    (
        "dispatch",
        (
            "dispatchers.py",
            "subscriptions.py",
            "entry_source.py",
            "entry_cache.py",
            "flow.py",
            "selectors.py",
        ),
    ),
    ("sync", ("appender.py", "sync_threads.py", "ledger_file.py", "ledger_storage.py", "managed_ledger.py")),
    (
        "send",
        (
            "producer_commands.py",
            "producers.py",
            "topics.py",
            "topic_producers.py",
            "connection.py",
            "handlers.py",
            "frames.py",
            "wire",
        ),
    ),
)


class Broker(StandaloneBroker):
    """``StandaloneBroker`` run through ``_profiled_broker.py`` (cProfile on signals), with the
    per-thread CPU and context-switch readings this benchmark reports."""

    def __init__(self, data_dir: str, src: str | None, profile_out: str) -> None:
        launcher = [str(Path(__file__).resolve().parent / "_profiled_broker.py")]
        super().__init__(data_dir, src=src, launcher=launcher, env={"PROFILE_OUT": profile_out})
        self.profile_out = profile_out

    def cpu_split(self) -> tuple[float, float]:
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK

    def switches(self) -> tuple[int, int]:
        vol = invol = 0
        for path in glob.glob(f"/proc/{self.proc.pid}/task/*/status"):
            try:
                with open(path) as f:
                    for line in f:
                        if line.startswith("voluntary_ctxt_switches"):
                            vol += int(line.split()[1])
                        elif line.startswith("nonvoluntary_ctxt_switches"):
                            invol += int(line.split()[1])
            except OSError:
                pass  # a thread that ended meanwhile
        return vol, invol

    def thread_cpu(self) -> dict[str, float]:
        """CPU seconds per thread name (the loop is the process's own name)."""
        out: dict[str, float] = {}
        for path in glob.glob(f"/proc/{self.proc.pid}/task/*/stat"):
            try:
                with open(path) as f:
                    text = f.read()
            except OSError:
                continue
            name = text[text.index("(") + 1 : text.rindex(")")]
            fields = text.rsplit(")", 1)[1].split()
            out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / CLK_TCK
        return out

    def threads(self) -> int:
        return len(glob.glob(f"/proc/{self.proc.pid}/task/*"))


def run_closed(label: str, broker, rate: int, seconds: float, size: int) -> dict:
    """The quiet extreme whatever the load: each message alone (a synchronous send, then its
    receive and acknowledgement before the next one), ``rate * seconds / 10`` messages; the
    broker's work per message is then what one message costs when nothing shares its reads,
    syncs or writes, as at 5,000 msg/s on a quiet machine."""
    import pulsar

    from vs_pulsar_lite import _client

    client = _client(broker.url)
    topic = f"persistent://public/default/closed-{time.monotonic_ns()}"
    consumer = client.subscribe(topic, "lat", receiver_queue_size=1000)
    producer = client.create_producer(topic, batching_enabled=False)
    n = int(rate * seconds / 10)
    pad = b"x" * (size - 8)
    for i in range(50):  # warm-up, not counted (the caller measures around this call)
        producer.send(struct.pack(">q", i) + pad)
        consumer.acknowledge(consumer.receive(60_000))
    global _closed_mark
    _closed_mark()
    for i in range(n):
        producer.send(struct.pack(">q", i) + pad)
        consumer.acknowledge(consumer.receive(60_000))
    producer.close()
    consumer.close()
    client.close()
    del pulsar
    return {"messages": n, "publish_ms": None, "publish_to_consume_ms": None}


def _no_mark() -> None:
    pass


_closed_mark = _no_mark
KEEP_PROFILES: str | None = None
DRIVERS = {"open": run_latency, "closed": run_closed}


def phase_cpu(b: Broker, rate: int, seconds: float) -> dict:
    global _closed_mark
    marks: dict = {}

    def mark() -> None:
        marks["at"] = (b.cpu_split(), b.switches(), b.thread_cpu())

    _closed_mark = mark
    mark()
    out = DRIVER("cpu", b, rate, seconds, 100)
    (u0, s0), (v0, i0), t0 = marks["at"]
    (u1, s1), (v1, i1), t1 = b.cpu_split(), b.switches(), b.thread_cpu()
    n = out["messages"]
    per_thread = {k: round((v - t0.get(k, 0.0)) / n * 1e6, 1) for k, v in t1.items()}
    return {
        "user_us_per_msg": round((u1 - u0) / n * 1e6, 1),
        "sys_us_per_msg": round((s1 - s0) / n * 1e6, 1),
        "cpu_us_per_msg": round((u1 - u0 + s1 - s0) / n * 1e6, 1),
        "voluntary_switches_per_msg": round((v1 - v0) / n, 2),
        "involuntary_switches_per_msg": round((i1 - i0) / n, 2),
        "threads_after": b.threads(),
        "cpu_us_per_msg_by_thread": {k: v for k, v in per_thread.items() if v},
        "publish_ms": out["publish_ms"],
        "publish_to_consume_ms": out["publish_to_consume_ms"],
    }


def phase_syscalls(b: Broker, rate: int, seconds: float, tmp: str) -> dict:
    """System calls per message by name, over every thread of the broker (``perf trace -s``:
    far less intrusive than strace, which slowed the broker enough to change its batching)."""
    path = os.path.join(tmp, f"perf-trace-{b.proc.pid}-{time.monotonic_ns()}.txt")
    tracer = subprocess.Popen(
        ["perf", "trace", "-s", "-p", str(b.proc.pid), "-o", path],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1.0)
    out = DRIVER("syscalls", b, rate, seconds, 100)
    tracer.send_signal(signal.SIGINT)
    tracer.wait(60)
    n = out["messages"]
    calls: dict[str, int] = {}
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 8 and parts[1].isdigit() and parts[0].replace("_", "").isalnum():
                calls[parts[0]] = calls.get(parts[0], 0) + int(parts[1])
    per = {k: round(v / n, 3) for k, v in sorted(calls.items(), key=lambda kv: -kv[1]) if v / n >= 0.001}
    return {"syscalls_per_msg": round(sum(calls.values()) / n, 2), "by_name": per}


def _part(filename: str) -> str:
    for part, keys in PARTS:
        if any(k in filename for k in keys):
            return part
    return "loop/other"


def phase_profile(b: Broker, rate: int, seconds: float) -> dict:
    if os.path.exists(b.profile_out):
        os.unlink(b.profile_out)
    os.kill(b.proc.pid, signal.SIGUSR1)
    out = DRIVER("profile", b, rate, seconds, 100)
    os.kill(b.proc.pid, signal.SIGUSR2)
    for _ in range(100):
        if os.path.exists(b.profile_out):
            break
        time.sleep(0.1)
    time.sleep(0.5)
    n = out["messages"]
    if KEEP_PROFILES:
        import shutil

        shutil.copy(b.profile_out, os.path.join(KEEP_PROFILES, os.path.basename(b.profile_out)))
    stats = pstats.Stats(b.profile_out)
    parts: dict[str, list[float]] = {}
    rows = []
    for (filename, _line, func), (_cc, nc, tt, _ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        part = _part(filename)
        acc = parts.setdefault(part, [0, 0.0])
        acc[0] += nc
        acc[1] += tt
        rows.append((nc, tt, f"{Path(filename).name}:{func}"))
    by_time = sorted(rows, key=lambda r: -r[1])
    rows.sort(reverse=True)
    return {
        "python_calls_per_msg": round(sum(p[0] for p in parts.values()) / n, 1),
        "by_part_calls_per_msg": {k: round(v[0] / n, 1) for k, v in sorted(parts.items())},
        "by_part_profiled_us_per_msg": {k: round(v[1] / n * 1e6, 1) for k, v in sorted(parts.items())},
        "top_calls_per_msg": [(name, round(nc / n, 2), round(tt / n * 1e6, 2)) for nc, tt, name in rows[:40]],
        "top_time_per_msg": [
            (name, round(nc / n, 2), round(tt / n * 1e6, 2)) for nc, tt, name in by_time[:40]
        ],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=int, default=5000)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--rounds", type=int, default=1, help="cpu phases per broker (each on a fresh topic)")
    ap.add_argument("--main-src", help="also profile this checkout's src (label 'main')")
    ap.add_argument("--phases", default="cpu,syscalls,profile")
    ap.add_argument("--out", help="JSON path (default bench/results/latency_profile.json)")
    ap.add_argument(
        "--driver",
        choices=sorted(DRIVERS),
        default="closed",
        help="closed: each message alone (load-independent); open: the fixed-rate run of vs_pulsar_lite",
    )
    ap.add_argument(
        "--keep-profiles", help="copy each broker's cProfile stats (<label>.prof) into this directory"
    )
    args = ap.parse_args(argv)
    global KEEP_PROFILES
    KEEP_PROFILES = args.keep_profiles
    global DRIVER
    DRIVER = DRIVERS[args.driver]
    phases = args.phases.split(",")
    result: dict = {
        "driver": args.driver,
        "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "rate": args.rate,
        "seconds": args.seconds,
    }
    with tempfile.TemporaryDirectory(prefix="latprof-") as tmp:
        srcs = {"this": None} | ({"main": args.main_src} if args.main_src else {})
        brokers = {
            label: Broker(os.path.join(tmp, label), src, os.path.join(tmp, f"{label}.prof"))
            for label, src in srcs.items()
        }
        try:
            for label in brokers:
                result[label] = {"cpu": []}
            for r in range(args.rounds):
                order = list(brokers.items()) if r % 2 == 0 else list(reversed(brokers.items()))
                for label, b in order:
                    if "cpu" in phases:
                        got = phase_cpu(b, args.rate, args.seconds)
                        print(f"[{time.strftime('%H:%M:%S')}] {label} cpu round {r + 1}: {got}", flush=True)
                        result[label]["cpu"].append(got)
            for label, b in brokers.items():
                if "syscalls" in phases:
                    result[label]["syscalls"] = phase_syscalls(b, args.rate, args.seconds, tmp)
                    print(
                        f"[{time.strftime('%H:%M:%S')}] {label} syscalls: {result[label]['syscalls']}",
                        flush=True,
                    )
                if "profile" in phases:
                    result[label]["profile"] = phase_profile(b, args.rate, args.seconds)
                    print(f"[{time.strftime('%H:%M:%S')}] {label} profile:", flush=True)
                    print(json.dumps(result[label]["profile"], indent=1), flush=True)
        finally:
            for b in brokers.values():
                b.stop()
    out = Path(args.out) if args.out else RESULTS / "latency_profile.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
