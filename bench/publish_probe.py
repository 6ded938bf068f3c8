"""Where the CPU of an unbatched publish goes, broker and client, counted per message.

One producer (batching off, ``send_async`` of ``--messages`` x ``--size`` bytes, max_pending
10,000: the publish phase of ``vs_pulsar_lite.py``) against each broker in turn: this checkout,
optionally another checkout's ``src`` (``--main-src``) and pulsar-lite (``--pulsar-lite``).
Once the run is warm (``--warm`` seconds in) a window of ``--window`` seconds is measured:

- messages acknowledged in the window (the receipt callbacks counted);
- per thread, of the broker and of this (the client's) process: CPU from
  ``/proc/<pid>/task/<tid>/schedstat`` (nanoseconds on the CPU) and context switches
  (``/proc/<pid>/task/<tid>/status``), grouped by thread name;
- system calls by kind and context switches of the broker and of the client, from
  ``perf stat`` on the syscall tracepoints (kernel counters: they barely slow the process,
  unlike strace), per message;
- with ``--sizes``, a second window records the sizes of the broker's socket reads and writes
  (``perf record`` on the ``sys_exit_*`` tracepoints of read/recvfrom and write/writev/sendmsg)
  and of the client's, as histograms.

Everything is a count or CPU time, which holds up on a busy machine; msg/s is printed beside
it but compare it only within one run. Writes ``bench/results/publish_probe[_NAME].json``.

    .venv/bin/python bench/publish_probe.py --main-src /tmp/main41/src \\
        --pulsar-lite /tmp/plite-venv/lib/python3.11/site-packages/pulsar_lite/bin/pulsar-lite
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from standalone import ROOT, StandaloneBroker  # noqa: E402

RESULTS = ROOT / "bench" / "results"

SYSCALLS = (
    "read",
    "recvfrom",
    "recvmsg",
    "readv",
    "write",
    "writev",
    "sendto",
    "sendmsg",
    "pwrite64",
    "pwritev",
    "pwritev2",
    "fdatasync",
    "fsync",
    "epoll_wait",
    "epoll_pwait",
    "epoll_ctl",
    "futex",
    "poll",
    "ppoll",
    "select",
    "clock_gettime",
    "getpid",
    "lseek",
    "fstat",
    "newfstatat",
    "mmap",
    "munmap",
    "madvise",
    "brk",
    "sched_yield",
    "nanosleep",
    "clock_nanosleep",
)


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def threads_of(pid: int) -> dict[int, tuple[str, int, int, int]]:
    """tid -> (name, ns on the CPU, voluntary, involuntary context switches)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        base = f"/proc/{pid}/task/{tid}"
        try:
            with open(f"{base}/comm") as f:
                name = f.read().strip()
            with open(f"{base}/schedstat") as f:
                ns = int(f.read().split()[0])
            vol = invol = 0
            with open(f"{base}/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches"):
                        vol = int(line.split()[1])
                    elif line.startswith("nonvoluntary_ctxt_switches"):
                        invol = int(line.split()[1])
        except OSError:
            continue
        out[int(tid)] = (name, ns, vol, invol)
    return out


def proc_cpu(pid: int) -> float:
    """CPU seconds of every thread of a process so far (schedstat: nanoseconds, not ticks)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except OSError:
            continue
    return total / 1e9


def thread_delta(before: dict, after: dict, messages: int, pid: int) -> dict:
    """CPU and context switches per message by thread name (digits folded: sync-0, sync-1 ...
    are one ``sync-N`` line; the process's first thread is ``main``, and threads of one name
    are told apart by their rank when they all share it, as a C++ library's threads do)."""
    groups: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0, 0, 0])
    for tid, (name, ns, vol, invol) in sorted(after.items()):
        ns0, vol0, invol0 = before[tid][1:] if tid in before else (0, 0, 0)
        key = "main" if tid == pid else re.sub(r"\d+", "N", name)
        if key == "python" and ns - ns0 > 0:  # the client library's threads: one line each
            key = f"python-{tid - pid}"
        g = groups[key]
        g[0] += ns - ns0
        g[1] += vol - vol0
        g[2] += invol - invol0
        g[3] += 1
    total = sum(g[0] for g in groups.values())
    return {
        "total_cpu_us_per_msg": round(total / 1e3 / messages, 2),
        "threads": {
            k: {
                "cpu_us_per_msg": round(g[0] / 1e3 / messages, 2),
                "vol_cs_per_msg": round(g[1] / messages, 3),
                "invol_cs_per_msg": round(g[2] / messages, 3),
                "threads": g[3],
            }
            for k, g in sorted(groups.items(), key=lambda kv: -kv[1][0])
            if g[0] > 0
        },
    }


def perf_stat(pid: int, seconds: float) -> subprocess.Popen:
    events = ["raw_syscalls:sys_enter", "context-switches"] + [f"syscalls:sys_enter_{s}" for s in SYSCALLS]
    available = [e for e in events if _event_ok(e)]
    cmd = ["perf", "stat", "-x", ",", "-e", ",".join(available), "-p", str(pid), "--", "sleep", str(seconds)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


_EVENT_OK: dict[str, bool] = {}


def _event_ok(event: str) -> bool:
    if event not in _EVENT_OK:
        if ":" not in event:
            _EVENT_OK[event] = True
        else:
            sub, name = event.split(":")
            _EVENT_OK[event] = os.path.exists(f"/sys/kernel/tracing/events/{sub}/{name}")
    return _EVENT_OK[event]


def perf_counts(proc: subprocess.Popen, messages: int) -> dict:
    _, err = proc.communicate()
    counts = {}
    for line in err.splitlines():
        parts = line.split(",")
        if len(parts) < 3 or not parts[0].strip().isdigit():
            continue
        name = parts[2].replace("syscalls:sys_enter_", "").replace("raw_syscalls:sys_enter", "all_syscalls")
        counts[name] = int(parts[0])
    return {k: round(v / messages, 3) for k, v in sorted(counts.items(), key=lambda kv: -kv[1]) if v}


SIZE_CALLS = ("read", "recvfrom", "write", "writev", "sendto", "sendmsg", "pwrite64", "pwritev")


def perf_sizes(pid: int, seconds: float, workdir: str) -> subprocess.Popen:
    data = os.path.join(workdir, f"sizes-{pid}-{time.monotonic_ns()}.data")
    events = [f"syscalls:sys_exit_{s}" for s in SIZE_CALLS if _event_ok(f"syscalls:sys_exit_{s}")]
    cmd = [
        "perf",
        "record",
        "-q",
        "-o",
        data,
        "-e",
        ",".join(events),
        "-p",
        str(pid),
        "--",
        "sleep",
        str(seconds),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    proc.data = data  # type: ignore[attr-defined]
    return proc


def size_histograms(proc: subprocess.Popen) -> dict:
    """Per call: count, bytes, and a histogram of sizes in powers of two."""
    proc.wait()
    out = subprocess.run(
        ["perf", "script", "-i", proc.data, "-F", "comm,tid,event,trace"],  # type: ignore[attr-defined]
        capture_output=True,
        text=True,
    ).stdout
    os.unlink(proc.data)  # type: ignore[attr-defined]
    hist: dict[str, dict] = {}
    for line in out.splitlines():
        m = re.search(r"sys_exit_(\w+):.*0x([0-9a-f]+)\s*$", line)
        if m is None:
            continue
        call, ret = m.group(1), int(m.group(2), 16)
        comm = line.split()[0]
        if ret >= 1 << 63:
            ret -= 1 << 64
        key = f"{comm}:{call}"
        h = hist.setdefault(key, {"calls": 0, "bytes": 0, "errors": 0, "sizes": collections.Counter()})
        h["calls"] += 1
        if ret < 0:
            h["errors"] += 1
            continue
        h["bytes"] += ret
        h["sizes"][1 << max(0, ret.bit_length() - 1) if ret else 0] += 1
    for h in hist.values():
        h["sizes"] = {str(k): v for k, v in sorted(h["sizes"].items())}
    return hist


class PulsarLite:
    def __init__(self, binary: str, data_dir: str) -> None:
        import socket

        from standalone import free_port

        self.port = free_port()
        self.proc = subprocess.Popen(
            [binary, "--addr", f"127.0.0.1:{self.port}", "--db-path", os.path.join(data_dir, "db")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=data_dir,
            env={**os.environ, "RUST_LOG": "warn"},
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        self.url = f"pulsar://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


class NullBroker:
    """``null_broker.py`` (receipts at once, nothing stored): the ceiling any broker could reach."""

    def __init__(self, hold_ms: float = 0.0) -> None:
        from standalone import free_port

        self.port = free_port()
        script = str(Path(__file__).resolve().parent / "null_broker.py")
        self.proc = subprocess.Popen(
            [sys.executable, script, "--port", str(self.port), "--hold-ms", str(hold_ms)],
            stdout=subprocess.PIPE,
            cwd=ROOT,
        )
        line = self.proc.stdout.readline()
        if b"ready" not in line:
            raise RuntimeError(f"null broker did not start: {line!r}")
        self.url = f"pulsar://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def probe(
    label: str, broker, n: int, size: int, warm: float, window: float, sizes: bool, workdir: str
) -> dict:
    import pulsar

    client = pulsar.Client(
        broker.url, operation_timeout_seconds=60, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    )
    topic = f"persistent://public/default/probe-{time.monotonic_ns()}"
    producer = client.create_producer(
        topic, batching_enabled=False, max_pending_messages=10000, block_if_queue_full=True
    )
    payload = b"x" * size
    acked = [0]
    failures = []

    def done(res, _mid) -> None:
        acked[0] += 1
        if res != pulsar.Result.Ok:
            failures.append(res)

    bpid, cpid = broker.proc.pid, os.getpid()
    found: dict = {}

    def measure() -> None:
        time.sleep(warm)
        b0, c0, a0, t0 = threads_of(bpid), threads_of(cpid), acked[0], time.perf_counter()
        pb, pc = perf_stat(bpid, window), perf_stat(cpid, window)
        time.sleep(window)
        b1, c1, a1, t1 = threads_of(bpid), threads_of(cpid), acked[0], time.perf_counter()
        msgs = max(1, a1 - a0)
        found["window"] = {
            "messages": a1 - a0,
            "seconds": round(t1 - t0, 3),
            "msgs_per_s": round(msgs / (t1 - t0)),
        }
        found["broker_threads"] = thread_delta(b0, b1, msgs, bpid)
        found["client_threads"] = thread_delta(c0, c1, msgs, cpid)
        found["broker_syscalls_per_msg"] = perf_counts(pb, msgs)
        found["client_syscalls_per_msg"] = perf_counts(pc, msgs)
        if sizes:
            a2 = acked[0]
            sb, sc = perf_sizes(bpid, 1.0, workdir), perf_sizes(cpid, 1.0, workdir)
            sb.wait()
            sc.wait()
            msgs2 = max(1, acked[0] - a2)
            found["sizes_messages"] = msgs2
            found["broker_sizes"] = size_histograms(sb)
            found["client_sizes"] = size_histograms(sc)

    series: list[tuple[float, int, float, float]] = []  # (s, acked, broker CPU s, client CPU s)
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            series.append((time.perf_counter() - t0, acked[0], proc_cpu(bpid), proc_cpu(cpid)))
            stop.wait(0.25)

    watcher = threading.Thread(target=measure)
    sampler = threading.Thread(target=sample)
    t0 = time.perf_counter()
    cpu0 = proc_cpu(bpid)
    sampler.start()
    watcher.start()
    for _ in range(n):
        producer.send_async(payload, done)
    producer.flush()
    secs = time.perf_counter() - t0
    run_cpu = proc_cpu(bpid) - cpu0
    stop.set()
    sampler.join()
    watcher.join()
    producer.close()
    client.close()
    if failures:
        raise SystemExit(f"{label}: {len(failures)} sends failed")
    found["run"] = {
        "messages": n,
        "seconds": round(secs, 3),
        "msgs_per_s": round(n / secs),
        "broker_cpu_us_per_msg": round(run_cpu / n * 1e6, 2),
    }
    # per quarter second: messages acknowledged, broker and client CPU us per message
    found["series"] = [
        (round(b[0], 2), b[1] - a[1], round((b[2] - a[2]) * 1e6 / max(1, b[1] - a[1]), 1),
         round((b[3] - a[3]) * 1e6 / max(1, b[1] - a[1]), 1))
        for a, b in zip(series, series[1:])
    ]  # fmt: skip
    if found.get("window", {}).get("seconds", 0) and secs < warm + window:
        found["note"] = "the run ended before the window did: make --messages larger"
    bt, ct = found["broker_threads"], found["client_threads"]
    say(
        f"{label:8s} {found['run']['msgs_per_s']} msg/s, broker {found['run']['broker_cpu_us_per_msg']} us/msg "
        f"over the run; window {found['window']['msgs_per_s']} msg/s: broker "
        f"{bt['total_cpu_us_per_msg']} us/msg, client {ct['total_cpu_us_per_msg']} us/msg, broker syscalls "
        f"{found['broker_syscalls_per_msg'].get('all_syscalls')}/msg, client "
        f"{found['client_syscalls_per_msg'].get('all_syscalls')}/msg"
    )
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--warm", type=float, default=2.0, help="seconds into the run before the window")
    ap.add_argument("--window", type=float, default=4.0, help="seconds measured")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--sizes", action="store_true", help="also record read/write sizes (a second window)")
    ap.add_argument("--main-src", help="also run compactmq from this checkout's src (label 'main')")
    ap.add_argument("--pulsar-lite", help="also run this pulsar-lite binary")
    ap.add_argument(
        "--null",
        action="store_true",
        help="also null_broker.py: receipts at once, nothing stored (the ceiling)",
    )
    ap.add_argument(
        "--null-hold",
        type=float,
        action="append",
        default=[],
        help="also the null broker holding reads this many ms",
    )
    ap.add_argument("--only", help="comma-separated labels to run (this, main, plite)")
    ap.add_argument("--override", action="append", default=[], help="config override for 'this'")
    ap.add_argument(
        "--nosync", action="store_true", help="also this checkout with managedLedgerSyncData=false"
    )
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        help="LABEL=key=value[,key=value]: also this checkout with these config overrides",
    )
    ap.add_argument("--data-root", help="where the brokers' data directories go (default: the temp dir)")
    ap.add_argument("--name", default="", help="suffix of the result file")
    args = ap.parse_args()

    workdir = tempfile.mkdtemp(prefix="publish-probe-", dir=args.data_root)
    brokers: dict = {}
    try:
        brokers["this"] = StandaloneBroker(os.path.join(workdir, "this"), args.override)
        if args.nosync:  # receipts as soon as written: the fastest delivery this broker has
            brokers["nosync"] = StandaloneBroker(
                os.path.join(workdir, "nosync"), [*args.override, "managedLedgerSyncData=false"]
            )
        for variant in args.variant:  # LABEL=key=value[,key=value...]: this checkout, other settings
            label, _, settings = variant.partition("=")
            brokers[label] = StandaloneBroker(
                os.path.join(workdir, label), [*args.override, *settings.split(",")]
            )
        if args.main_src:
            brokers["main"] = StandaloneBroker(os.path.join(workdir, "main"), src=args.main_src)
        if args.pulsar_lite:
            os.makedirs(os.path.join(workdir, "plite"))
            brokers["plite"] = PulsarLite(args.pulsar_lite, os.path.join(workdir, "plite"))
        if args.null:
            brokers["null"] = NullBroker()
        for hold in args.null_hold:  # the null broker with its reads held apart
            brokers[f"null{hold:g}ms"] = NullBroker(hold)
        only = set(args.only.split(",")) if args.only else set(brokers)
        results: dict = {label: [] for label in brokers if label in only}
        for r in range(args.rounds):
            for label in results:
                results[label].append(
                    probe(
                        label,
                        brokers[label],
                        args.messages,
                        args.size,
                        args.warm,
                        args.window,
                        args.sizes,
                        workdir,
                    )
                )
    finally:
        for b in brokers.values():
            b.stop()
        shutil.rmtree(workdir, ignore_errors=True)  # each broker's topics: ~200 MB a run
    out = {
        "benchmark": "publish_probe",
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": platform.node(),
        "load_avg": os.getloadavg(),
        "args": vars(args),
        "results": results,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"publish_probe{'_' + args.name if args.name else ''}.json"
    path.write_text(json.dumps(out, indent=1))
    say(f"wrote {path}")


if __name__ == "__main__":
    main()
