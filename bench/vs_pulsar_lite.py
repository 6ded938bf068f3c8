"""compactmq side by side with pulsar-lite, in one run, with the official client.

Starts both brokers on free loopback ports with fresh data directories -- ``compactmq
standalone`` from this checkout (and, with ``--main-src``, a second one from another checkout's
``src``, for before/after figures in the same run) and the ``pulsar-lite`` binary (0.2.0, a Rust
broker on RocksDB from PyPI) -- then drives them alternately, so load on a shared machine hits
all of them alike:

- ``--rounds`` rounds (10; 2 with ``--quick``). In each round, each broker gets four fresh
  topics: ``publish_nobatch`` / ``publish_batch`` (one producer, ``send_async`` of ``--messages``
  messages of ``--size`` bytes until every receipt is back) and ``read_nobatch`` / ``read_batch``
  (an Exclusive consumer reads that topic from the earliest position and acknowledges all).
  Per phase: messages/s, and broker CPU microseconds per message (user + system time of the
  broker process from ``/proc/<pid>/stat``, the figure that holds up when the machine is busy).
  After each round: the broker's RSS (``/proc/<pid>/status``).
- ``latency``: one producer (batching off) and one consumer at a fixed ``--rate`` (5,000 msg/s)
  for ``--latency-seconds`` (120; 10 with ``--quick``): publish latency (send to receipt) and
  publish-to-consume latency (send to receive) p50/p99/p99.9, after a 2 s warm-up. Beside it,
  the fdatasync floor of the file system at that moment (one append + fdatasync, p50/p99): a
  receipt given only after an fsync cannot come sooner. ``--strace`` also counts each broker's
  fsync-family calls during its run (pulsar-lite 0.2.0 makes none: its receipts do not wait
  for the disk). A broker whose latency run fails has its error recorded; the others go on.
  ``--no-rounds`` / ``--no-latency`` run one part only.
- ``--variant LABEL=KEY=VALUE[,...]`` adds this checkout's broker with those broker.conf
  overrides, e.g. ``nosync=managedLedgerSyncData=false``: the same path without its fsync,
  which tells how much of a latency is the disk and how much the client and the Python path.

Durability: compactmq runs with its defaults, ``managedLedgerSyncData=true`` (an fsync before a
receipt, shared by the appends of one group commit). pulsar-lite 0.2.0 exposes no sync setting
(its config keys are the connection limits, rates and buffer marks); it runs with its defaults.

pulsar-lite: ``pip install pulsar-lite==0.2.0`` (into this venv or any other) ships the binary
as ``pulsar_lite/bin/pulsar-lite``; it is found from the package when importable here, or given
with ``--pulsar-lite PATH`` (or ``PULSAR_LITE_BIN``).

    .venv/bin/python bench/vs_pulsar_lite.py --quick --pulsar-lite /tmp/plite/.../bin/pulsar-lite
    .venv/bin/python bench/vs_pulsar_lite.py --main-src /tmp/main/src     # the full run
Writes bench/results/vs_pulsar_lite.json (``_quick`` with --quick) and a plot next to it
(matplotlib: pip install -e ".[bench]") of throughput, CPU per message and RSS per round.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import platform
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from broker_bench import consume, publish  # noqa: E402
from standalone import ROOT, StandaloneBroker, cpu_seconds, free_port  # noqa: E402

RESULTS = ROOT / "bench" / "results"
PHASES = ("publish_nobatch", "read_nobatch", "publish_batch", "read_batch")


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    return 0.0


class PulsarLite:
    """The pulsar-lite binary on a free port, its RocksDB under ``data_dir``."""

    def __init__(self, binary: str, data_dir: str) -> None:
        os.makedirs(data_dir, exist_ok=True)
        self.port = free_port()
        self.log = open(os.path.join(data_dir, "pulsar-lite.log"), "ab")
        self.proc = subprocess.Popen(
            [binary, "--addr", f"127.0.0.1:{self.port}", "--db-path", os.path.join(data_dir, "db")],
            stdout=self.log,
            stderr=self.log,
            cwd=data_dir,  # it looks for an optional pulsar-lite.toml here; none is there
            env={**os.environ, "RUST_LOG": "warn"},
        )
        deadline = time.monotonic() + 30
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"pulsar-lite exited at start (log: {self.log.name})")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("pulsar-lite did not listen within 30 s") from None
                time.sleep(0.1)
        self.url = f"pulsar://127.0.0.1:{self.port}"

    def cpu(self) -> float:
        return cpu_seconds(self.proc.pid)

    def stop(self, timeout: float = 30) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def find_pulsar_lite(given: str | None) -> str:
    path = given or os.environ.get("PULSAR_LITE_BIN")
    if not path:
        spec = importlib.util.find_spec("pulsar_lite")
        if spec is not None and spec.origin:
            path = str(Path(spec.origin).parent / "bin" / "pulsar-lite")
    if not path or not os.access(path, os.X_OK):
        raise SystemExit(
            "pulsar-lite not found: pip install pulsar-lite==0.2.0 (here or in another venv) and pass "
            "--pulsar-lite <site-packages>/pulsar_lite/bin/pulsar-lite"
        )
    return path


def _client(url: str):
    import pulsar

    return pulsar.Client(
        url, operation_timeout_seconds=60, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    )


def _phase(broker, name: str, n: int, fn) -> dict:
    cpu0, t0 = broker.cpu(), time.perf_counter()
    fn()
    secs = time.perf_counter() - t0
    cpu = broker.cpu() - cpu0
    return {
        "phase": name,
        "messages": n,
        "seconds": round(secs, 3),
        "msgs_per_s": round(n / secs),
        "broker_cpu_us_per_msg": round(cpu / n * 1e6, 2),
    }


def run_round(label: str, broker, r: int, n: int, size: int) -> dict:
    client = _client(broker.url)
    phases = []
    try:
        for batching in (False, True):
            kind = "batch" if batching else "nobatch"
            topic = f"persistent://public/default/vs-{kind}-{r}-{time.monotonic_ns()}"
            producer, run, failures = publish(client, topic, n, size, batching)
            phases.append(_phase(broker, f"publish_{kind}", n, run))
            producer.close()
            if failures:
                raise SystemExit(f"{label}: {len(failures)} sends failed: {failures[:3]}")
            phases.append(_phase(broker, f"read_{kind}", n, consume(client, topic, n)))
    finally:
        client.close()
    time.sleep(1)  # let the broker settle before reading its RSS
    out = {"round": r, "phases": phases, "rss_mib": rss_mib(broker.proc.pid)}
    say(
        f"{label:12s} round {r}: "
        + ", ".join(f"{p['phase']} {p['msgs_per_s']}/s {p['broker_cpu_us_per_msg']}us" for p in phases)
        + f", RSS {out['rss_mib']} MiB"
    )
    return out


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))], 3)


def run_latency(
    label: str, broker, rate: int, seconds: float, size: int, samples: dict | None = None
) -> dict:
    """Fixed-rate publish with a consumer attached; latencies in milliseconds. ``samples``:
    a dict whose lists ``publish_ms`` / ``publish_to_consume_ms`` get every measurement too
    (a caller merging several runs)."""
    import pulsar

    client = _client(broker.url)
    topic = f"persistent://public/default/vs-latency-{time.monotonic_ns()}"
    consumer = client.subscribe(topic, "lat", receiver_queue_size=1000)
    producer = client.create_producer(
        topic, batching_enabled=False, max_pending_messages=10000, block_if_queue_full=True
    )
    warm = time.perf_counter_ns() + 2_000_000_000
    publish_ms: list[float] = []
    e2e_ms: list[float] = []
    failures: list = []
    total = int(rate * seconds)
    received = threading.Event()

    def done(t0: int, res, _mid) -> None:
        if res != pulsar.Result.Ok:
            failures.append(res)
        elif t0 >= warm:
            publish_ms.append((time.perf_counter_ns() - t0) / 1e6)

    def receive() -> None:
        for _ in range(total):
            msg = consumer.receive(60_000)
            now = time.perf_counter_ns()
            (t0,) = struct.unpack_from(">q", msg.data())
            if t0 >= warm:
                e2e_ms.append((now - t0) / 1e6)
            consumer.acknowledge(msg)
        received.set()

    reader = threading.Thread(target=receive, daemon=True)
    reader.start()
    pad = b"x" * max(0, size - 8)
    start = time.perf_counter()
    cpu0 = broker.cpu()
    for i in range(total):
        due = start + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        t0 = time.perf_counter_ns()
        producer.send_async(struct.pack(">q", t0) + pad, functools.partial(done, t0))
    producer.flush()
    sent_secs = time.perf_counter() - start
    ok = received.wait(120)
    cpu = broker.cpu() - cpu0
    producer.close()
    consumer.close()
    client.close()
    if failures or not ok:
        raise SystemExit(f"{label}: latency run failed ({len(failures)} send errors, all received: {ok})")
    if samples is not None:
        samples.setdefault("publish_ms", []).extend(publish_ms)
        samples.setdefault("publish_to_consume_ms", []).extend(e2e_ms)
    out = {
        "rate_target": rate,
        "rate_achieved": round(total / sent_secs),
        "seconds": seconds,
        "messages": total,
        "broker_cpu_us_per_msg": round(cpu / total * 1e6, 2),
        "publish_ms": {
            "p50": _pct(publish_ms, 0.5),
            "p99": _pct(publish_ms, 0.99),
            "p999": _pct(publish_ms, 0.999),
        },
        "publish_to_consume_ms": {
            "p50": _pct(e2e_ms, 0.5),
            "p99": _pct(e2e_ms, 0.99),
            "p999": _pct(e2e_ms, 0.999),
        },
    }
    say(
        f"{label:12s} latency at {rate}/s: publish {out['publish_ms']}, end to end {out['publish_to_consume_ms']}"
    )
    return out


def fdatasync_floor(directory: str, n: int = 500, size: int = 130) -> dict:
    """p50/p99 of one ``fdatasync`` after appending ``size`` bytes, in ``directory`` (the
    broker's file system), in milliseconds: the least a receipt given only after an fsync can
    cost. Taken right before a broker's latency run, so it sees the same machine load."""
    path = os.path.join(directory, "fdatasync-floor")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    out = []
    try:
        for _ in range(n):
            os.write(fd, b"x" * size)
            t0 = time.perf_counter()
            os.fdatasync(fd)
            out.append((time.perf_counter() - t0) * 1e3)
    finally:
        os.close(fd)
        os.unlink(path)
    return {"p50": _pct(out, 0.5), "p99": _pct(out, 0.99)}


class SyncCalls:
    """``strace -c`` on a broker process (all threads) while it runs: how many fsync-family
    calls it makes, to show what "durable" means for each broker (``--strace``)."""

    CALLS = "fsync,fdatasync,sync_file_range,msync,syncfs"

    def __init__(self, pid: int, out: str) -> None:
        self.out = out
        self.proc = subprocess.Popen(
            ["strace", "-f", "-c", "-o", out, "-e", f"trace={self.CALLS}", "-p", str(pid)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1.0)  # attached to every thread before the run starts

    def stop(self) -> dict:
        self.proc.terminate()
        self.proc.wait(30)
        counts: dict[str, int] = {name: 0 for name in self.CALLS.split(",")}
        with open(self.out) as f:
            for line in f:
                parts = line.split()  # % time, seconds, usecs/call, calls, [errors,] syscall
                if len(parts) >= 5 and parts[-1] in counts:
                    counts[parts[-1]] = int(parts[3])
        return counts


def summarize(rounds: list[dict]) -> dict:
    """Per phase: median msgs/s and median broker CPU us/msg over the rounds."""
    out = {}
    for phase in PHASES:
        rows = [p for r in rounds for p in r["phases"] if p["phase"] == phase]
        out[phase] = {
            "median_msgs_per_s": statistics.median(p["msgs_per_s"] for p in rows),
            "median_broker_cpu_us_per_msg": statistics.median(p["broker_cpu_us_per_msg"] for p in rows),
        }
    return out


def plot(result: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print('no plot: matplotlib is missing (pip install -e ".[bench]")')
        return
    brokers = list(result["brokers"])
    if not all(result["brokers"][label]["rounds"] for label in brokers):
        print("no plot: no rounds were run (--no-rounds)")
        return
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    width = 0.8 / len(brokers)
    for i, label in enumerate(brokers):
        summary = result["brokers"][label]["summary"]
        xs = [j + i * width for j in range(len(PHASES))]
        axes[0].bar(xs, [summary[p]["median_msgs_per_s"] for p in PHASES], width, label=label)
        axes[1].bar(xs, [summary[p]["median_broker_cpu_us_per_msg"] for p in PHASES], width, label=label)
        rounds = result["brokers"][label]["rounds"]
        axes[2].plot([r["round"] for r in rounds], [r["rss_mib"] for r in rounds], marker="o", label=label)
    for ax, title in zip(axes[:2], ("messages/s (median of rounds)", "broker CPU us per message (median)")):
        ax.set_xticks([j + width * (len(brokers) - 1) / 2 for j in range(len(PHASES))])
        ax.set_xticklabels(PHASES, rotation=15)
        ax.set_title(title)
        ax.legend()
    axes[2].set_title("broker RSS (MiB) after each round")
    axes[2].set_xlabel("round")
    axes[2].set_ylim(bottom=0)
    axes[2].legend()
    fig.suptitle(
        f"compactmq vs pulsar-lite: {result['messages_per_phase']} x {result['message_bytes']} B per phase, "
        f"{result['rounds']} rounds ({result['when']})"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def _latency_of(label: str, broker, args, seconds: float, tmp: str) -> dict:
    """One broker's latency run, with the fdatasync floor of the file system beside it; a
    broker that fails it (a send timed out) gets its error recorded, and the run goes on."""
    floor = fdatasync_floor(tmp)
    say(f"latency: {label}, {args.rate} msg/s for {seconds:g} s (fdatasync floor now {floor})")
    tracer = SyncCalls(broker.proc.pid, os.path.join(tmp, f"strace-{label}.txt")) if args.strace else None
    try:
        out = run_latency(label, broker, args.rate, seconds, args.size)
    except (SystemExit, Exception) as exc:  # noqa: BLE001 - recorded; the other brokers still run
        say(f"{label}: latency run failed: {exc}")
        out = {"error": str(exc)}
    finally:
        if tracer is not None:
            calls = tracer.stop()
    out["fdatasync_floor_ms"] = floor
    if tracer is not None:
        out["sync_calls"] = calls
        say(f"{label}: sync calls during the latency run: {calls}")
    return out


def _interleaved_latency(brokers: dict, args, seconds: float, tmp: str) -> dict:
    """``--latency-segments``: each broker's latency run cut into segments, the brokers taking
    turns (the order reversed every other segment), so load on a shared machine hits them
    alike; percentiles over every segment's measurements, the broker CPU and the fdatasync
    floor as the median of the segments', each segment's own figures kept beside them."""
    k = args.latency_segments
    samples: dict[str, dict] = {label: {} for label in brokers}
    segments: dict[str, list] = {label: [] for label in brokers}
    failed: dict[str, str] = {}
    for seg in range(k):
        order = list(brokers.items()) if seg % 2 == 0 else list(reversed(brokers.items()))
        for label, broker in order:
            if label in failed:
                continue
            floor = fdatasync_floor(tmp)
            say(f"latency segment {seg + 1}/{k}: {label} for {seconds / k:g} s (fdatasync floor now {floor})")
            try:
                out = run_latency(label, broker, args.rate, seconds / k, args.size, samples[label])
            except (SystemExit, Exception) as exc:  # noqa: BLE001 - recorded; the others still run
                say(f"{label}: latency run failed: {exc}")
                failed[label] = str(exc)
                continue
            out["fdatasync_floor_ms"] = floor
            segments[label].append(out)
    result: dict[str, dict] = {}
    for label in brokers:
        if label in failed:
            result[label] = {"error": failed[label], "segments": segments[label]}
            continue
        pub, e2e = samples[label]["publish_ms"], samples[label]["publish_to_consume_ms"]
        segs = segments[label]
        result[label] = {
            "rate_target": args.rate,
            "seconds": seconds,
            "segments_count": k,
            "messages": sum(s["messages"] for s in segs),
            "broker_cpu_us_per_msg": statistics.median(s["broker_cpu_us_per_msg"] for s in segs),
            "publish_ms": {"p50": _pct(pub, 0.5), "p99": _pct(pub, 0.99), "p999": _pct(pub, 0.999)},
            "publish_to_consume_ms": {
                "p50": _pct(e2e, 0.5),
                "p99": _pct(e2e, 0.99),
                "p999": _pct(e2e, 0.999),
            },
            "fdatasync_floor_ms": {
                q: statistics.median(s["fdatasync_floor_ms"][q] for s in segs) for q in ("p50", "p99")
            },
            "segments": segs,
        }
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2 rounds of 20,000 messages, 10 s of latency")
    ap.add_argument("--rounds", type=int, help="rounds (default 10; 2 with --quick)")
    ap.add_argument("--messages", type=int, help="messages per phase (default 200,000; 20,000 with --quick)")
    ap.add_argument("--size", type=int, default=100, help="payload bytes (default 100)")
    ap.add_argument("--rate", type=int, default=5000, help="messages/s of the latency run (default 5,000)")
    ap.add_argument(
        "--latency-seconds", type=float, help="length of the latency run (default 120; 10 with --quick)"
    )
    ap.add_argument("--no-rounds", action="store_true", help="skip the rounds (throughput, CPU, RSS)")
    ap.add_argument("--no-latency", action="store_true", help="skip the fixed-rate latency run")
    ap.add_argument(
        "--latency-segments",
        type=int,
        default=1,
        help="cut each broker's latency run into this many segments, the brokers taking turns "
        "(A/B on a shared machine; default 1: one run each, one after the other; no --strace)",
    )
    ap.add_argument(
        "--strace",
        action="store_true",
        help="count each broker's fsync-family calls during its latency run (strace -c; slows it)",
    )
    ap.add_argument("--pulsar-lite", help="the pulsar-lite binary (default: from the pulsar_lite package)")
    ap.add_argument("--main-src", help="also run compactmq from this checkout's src directory (label 'main')")
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="LABEL=KEY=VALUE[,KEY=VALUE]",
        help="also run this checkout's compactmq with these broker.conf overrides under LABEL "
        "(e.g. nosync=managedLedgerSyncData=false: the floor of the path without its fsync)",
    )
    ap.add_argument("--out", help="JSON path (default bench/results/vs_pulsar_lite[_quick].json)")
    args = ap.parse_args(argv)
    rounds = args.rounds or (2 if args.quick else 10)
    n = args.messages or (20_000 if args.quick else 200_000)
    latency_seconds = args.latency_seconds or (10.0 if args.quick else 120.0)
    binary = find_pulsar_lite(args.pulsar_lite)
    out_path = (
        Path(args.out)
        if args.out
        else RESULTS / ("vs_pulsar_lite_quick.json" if args.quick else "vs_pulsar_lite.json")
    )

    load_before = os.getloadavg()
    brokers: dict[str, object] = {}
    data: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="compactmq-vs-") as tmp:
        try:
            say(f"starting brokers: compactmq ({ROOT}), pulsar-lite ({binary})")
            brokers["compactmq"] = StandaloneBroker(os.path.join(tmp, "compactmq"))
            if args.main_src:
                brokers["main"] = StandaloneBroker(os.path.join(tmp, "main"), src=args.main_src)
            for variant in args.variant:
                label, _, overrides = variant.partition("=")
                if not label or "=" not in overrides:
                    ap.error(f"--variant {variant!r}: expected LABEL=KEY=VALUE[,KEY=VALUE]")
                brokers[label] = StandaloneBroker(os.path.join(tmp, label), overrides.split(","))
            brokers["pulsar-lite"] = PulsarLite(binary, os.path.join(tmp, "pulsar-lite"))
            for label, broker in brokers.items():
                data[label] = {"rounds": [], "rss_mib_start": rss_mib(broker.proc.pid)}  # type: ignore[attr-defined]
            for r in range(1, (0 if args.no_rounds else rounds) + 1):
                say(f"round {r}/{rounds}: {n} messages x {args.size} B per phase")
                for label, broker in brokers.items():
                    data[label]["rounds"].append(run_round(label, broker, r, n, args.size))
            if not args.no_latency and args.latency_segments > 1:
                for label, out in _interleaved_latency(brokers, args, latency_seconds, tmp).items():
                    data[label]["latency"] = out
            for label, broker in ({} if args.no_latency or args.latency_segments > 1 else brokers).items():
                data[label]["latency"] = _latency_of(label, broker, args, latency_seconds, tmp)
        finally:
            for broker in brokers.values():
                broker.stop()  # type: ignore[attr-defined]
    for label in data:
        data[label]["summary"] = summarize(data[label]["rounds"]) if data[label]["rounds"] else {}
    ref = data["pulsar-lite"]["summary"]
    ratios = (
        {}
        if not ref
        else {
            label: {
                p: round(data[label]["summary"][p]["median_msgs_per_s"] / ref[p]["median_msgs_per_s"], 3)
                for p in PHASES
            }
            for label in data
            if label != "pulsar-lite"
        }
    )
    result = {
        "benchmark": "vs_pulsar_lite",
        "quick": args.quick,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "rounds": rounds,
        "messages_per_phase": n,
        "message_bytes": args.size,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "loadavg_1m_before": round(load_before[0], 2),
            "loadavg_1m_after": round(os.getloadavg()[0], 2),
        },
        "notes": (
            "brokers driven alternately in one run; broker CPU from /proc/<pid>/stat (user+system); "
            "compactmq with managedLedgerSyncData=true (fsync per group commit); pulsar-lite 0.2.0 with its "
            "defaults (no sync setting exposed); client and brokers share the machine"
        ),
        "throughput_ratio_vs_pulsar_lite": ratios,
        "brokers": data,
    }
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=2) + "\n")
    say(f"wrote {out_path}")
    plot(result, out_path.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
