"""Where a broker's memory goes under a steady load: Python objects or the C heap.

Runs ``compactmq standalone`` under a small launcher (this file with ``--serve``) that answers
SIGUSR2 with ``gc.collect()``, ``malloc_trim(0)`` (glibc gives freed memory back) and, with
``--tracemalloc DEPTH``, a tracemalloc snapshot. The driver publishes and consumes on
``--topics`` topics (one producer, one acknowledging Shared consumer each, batching off) in
``--phases`` phases of ``--seconds``; with ``--rounds`` it runs ``vs_pulsar_lite``'s rounds
instead (two fresh topics a round, ``--messages`` each, batching off and on, each read back by a
durable subscription). After each phase it prints the broker's RSS, the RSS after the trim
(with RssAnon/RssFile and the thread count) and Python's allocated blocks; at the end, what grew
from the third snapshot (or the first) to the last: gc-tracked objects per type (a weak
reference with the type it points to, or ``dead``), resident KiB per mapping (smaps) and, with
tracemalloc, the lines whose Python memory grew most. ``--json`` writes all of it.

Reading it: allocated blocks flat while RSS-after-trim grows means the C heap (a native
library, allocator arenas) or the size of a few large Python buffers (tracemalloc names them);
blocks growing with messages is a Python leak; RSS growing but not RSS-after-trim is freed
memory the allocator kept, which it reuses.

    .venv/bin/python bench/memory_trace.py --phases 5 --seconds 8                  # ~1.5 min
    .venv/bin/python bench/memory_trace.py --phases 5 --seconds 8 --tracemalloc 1  # slower broker
    .venv/bin/python bench/memory_trace.py --rounds --phases 10 --messages 20000 \
        --override brokerDeleteInactiveTopicsFrequencySeconds=10 --json out.json   # ~1.5 min
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import gc
import json
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import time
import uuid
import weakref
from pathlib import Path

BENCH = Path(__file__).resolve().parent


def _kind(o: object) -> str:
    """An object's type; for a weak reference, the type it refers to too."""
    kind = f"{type(o).__module__}.{type(o).__qualname__}"
    if type(o) is weakref.ReferenceType:
        target = o()  # type: ignore[operator]
        kind += f"->{type(target).__qualname__ if target is not None else 'dead'}"
    return kind


def _sqlite_memory_used() -> int:
    """Bytes SQLite's allocator holds in this process (its page caches, statements), or -1 where
    the sqlite3 module does not use a shared ``libsqlite3`` that ctypes can ask."""
    import _sqlite3  # noqa: F401 - loads the library the broker's connections use

    try:
        lib = ctypes.CDLL("libsqlite3.so.0")
    except OSError:
        return -1
    lib.sqlite3_memory_used.restype = ctypes.c_int64
    return int(lib.sqlite3_memory_used())


def _pymalloc_stats(path: str) -> None:
    """``sys._debugmallocstats()`` (pymalloc's arenas, pools and blocks; it prints to the C
    stderr) written to ``path``."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "w") as f:
        os.dup2(f.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def _pymalloc_figures(text: str) -> dict:
    """Arenas held and the bytes in used / free blocks, from ``_debugmallocstats``' text."""
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition("=")
        name = name.strip()
        value = value.strip().replace(",", "")
        if name == "# arenas allocated current":
            out["pymalloc_arenas"] = int(value)
        elif name.startswith("# bytes in allocated blocks"):
            out["pymalloc_used_mib"] = round(int(value) / 2**20, 1)
        elif name.startswith("# bytes in available blocks"):
            out["pymalloc_free_mib"] = round(int(value) / 2**20, 1)
    return out


def serve(argv: list[str]) -> None:
    """The launcher: the standalone broker with a SIGUSR2 handler (see the module docstring)."""
    import tracemalloc

    depth = int(os.environ.get("MEMORY_TRACE_DEPTH", "0"))
    snap_dir = os.environ["MEMORY_TRACE_DIR"]
    if depth:
        tracemalloc.start(depth)
    libc = ctypes.CDLL("libc.so.6")
    count = [0]

    def on_signal(*_):
        gc.collect()
        count[0] += 1
        if depth:  # before the trim: what the snapshot itself allocates is given back too
            tracemalloc.take_snapshot().dump(os.path.join(snap_dir, f"snap_{count[0]}.pickle"))
        libc.malloc_trim(0)
        _pymalloc_stats(os.path.join(snap_dir, f"pymalloc_{count[0]}.txt"))
        kinds = collections.Counter(_kind(o) for o in gc.get_objects())
        with open(os.path.join(snap_dir, f"types_{count[0]}.json"), "w") as f:
            json.dump(kinds, f)
        with open(os.path.join(snap_dir, f"sqlite_{count[0]}"), "w") as f:
            f.write(str(_sqlite_memory_used()))
        with open(os.path.join(snap_dir, f"blocks_{count[0]}"), "w") as f:
            f.write(str(sys.getallocatedblocks()))

    signal.signal(signal.SIGUSR2, on_signal)
    sys.argv = ["compactmq", *argv]
    runpy.run_module("compactmq.cli.main", run_name="__main__")


def _measure(broker, tmp: str, k: int, rows: list) -> str:
    """RSS, then SIGUSR2 (collect, snapshot, trim), RSS after the trim and Python's blocks;
    the figures are appended to ``rows`` and returned as one line of text."""
    from memory_bench import rss_bytes

    rss = rss_bytes(broker.pid) / 2**20
    os.kill(broker.pid, signal.SIGUSR2)
    blocks = Path(tmp, f"blocks_{k}")
    deadline = time.monotonic() + 120
    while not blocks.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(0.5)
    trimmed = rss_bytes(broker.pid) / 2**20
    kinds = _status(broker.pid, ("RssAnon", "RssFile", "RssShmem", "Threads"))
    Path(tmp, f"maps_{k}.json").write_text(json.dumps(_rss_by_mapping(broker.pid)))
    row = {"k": k, "rss_mib": round(rss, 1), "rss_after_trim_mib": round(trimmed, 1)}
    threads = kinds.pop("Threads", 0)
    row.update({f"{name}_mib": round(kib / 1024, 1) for name, kib in kinds.items()})
    row["threads"] = threads
    row["python_blocks"] = int(blocks.read_text())
    row.update(_pymalloc_figures(Path(tmp, f"pymalloc_{k}.txt").read_text()))
    row.update(_broker_figures(broker.web_port))
    sqlite_used = int(Path(tmp, f"sqlite_{k}").read_text())
    row["sqlite_memory_used_mib"] = round(sqlite_used / 2**20, 2) if sqlite_used >= 0 else None
    rows.append(row)
    return (
        f"RSS {rss:.1f} MiB, after trim {trimmed:.1f} MiB ("
        + ", ".join(f"{name} {kib / 1024:.1f}" for name, kib in kinds.items())
        + f"), Python blocks {row['python_blocks']}, threads {threads}, "
        + f"SQLite {row['sqlite_memory_used_mib']} MiB, managed ledgers open {row.get('pulsar_ml_count')}, "
        + f"pymalloc arenas {row.get('pymalloc_arenas')} (used {row.get('pymalloc_used_mib')} MiB, "
        + f"free {row.get('pymalloc_free_mib')} MiB), "
        + f"entry cache {row.get('pulsar_ml_cache_used_size', 0) / 2**20:.1f} MiB"
    )


#: the broker's own figures read from /metrics at each measurement
BROKER_FIGURES = ("pulsar_ml_count", "pulsar_ml_cache_used_size", "pulsar_ml_cache_entries")


def _broker_figures(web_port: int) -> dict:
    """The broker's ``BROKER_FIGURES`` from its ``/metrics`` (summed over labels)."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{web_port}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    out: dict = {}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in BROKER_FIGURES:
            out[name] = out.get(name, 0) + int(float(line.rsplit(" ", 1)[1]))
    return out


def _status(pid: int, names: tuple[str, ...]) -> dict[str, int]:
    """The named KiB figures of ``/proc/<pid>/status``."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key = line.split(":", 1)[0]
            if key in names:
                out[key] = int(line.split()[1])
    return out


def _rss_by_mapping(pid: int) -> dict[str, int]:
    """Resident KiB per mapped file (``[heap]``, ``[anon]`` for unnamed mappings) from smaps."""
    out: dict[str, int] = collections.Counter()
    name = "?"
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and ":" not in head[0]:
                name = head[5] if len(head) > 5 else "[anon]"
            elif head and head[0] == "Rss:":
                out[name] += int(head[1])
    return dict(out)


def _steady(client, broker, tmp: str, args, rows: list) -> None:
    """The same ``--topics`` topics in every phase, for ``--seconds`` each."""
    from memory_bench import Traffic

    prefix = uuid.uuid4().hex[:6]
    topics = [f"persistent://public/default/trace-{prefix}-{i}" for i in range(args.topics)]
    traffic = Traffic(client, topics, 1, 100)
    sent = 0
    for k in range(1, args.phases + 1):
        traffic.publish(until=time.monotonic() + args.seconds)
        sent += traffic.sent
        traffic.wait_received()
        time.sleep(2)
        print(
            f"phase {k}: {sent} messages, received {traffic.received}, {_measure(broker, tmp, k, rows)}",
            flush=True,
        )
    traffic.close()


def _rounds(client, broker, tmp: str, args, rows: list) -> None:
    """``vs_pulsar_lite``'s rounds: per round two fresh topics, ``--messages`` published with
    batching off to one and on to the other, each read back by a new durable subscription."""
    from broker_bench import consume, publish

    for k in range(1, args.phases + 1):
        for batching in (False, True):
            topic = f"persistent://public/default/trace-{'b' if batching else 'n'}-{k}-{uuid.uuid4().hex[:6]}"
            producer, run, failures = publish(client, topic, args.messages, 100, batching)
            run()
            producer.close()
            if failures:
                raise SystemExit(f"{len(failures)} sends failed")
            consume(client, topic, args.messages)()
        time.sleep(args.settle)
        print(f"round {k}: {_measure(broker, tmp, k, rows)}", flush=True)


def _fresh(client, broker, tmp: str, args, rows: list) -> None:
    """``memory_bench --mode rounds``: per round ``--topics`` fresh topics, one producer and one
    acknowledging Shared consumer each (attached while publishing), ``--messages`` per topic."""
    from memory_bench import Traffic

    for k in range(1, args.phases + 1):
        prefix = uuid.uuid4().hex[:6]
        topics = [f"persistent://public/default/fresh-{k}-{prefix}-{i}" for i in range(args.topics)]
        traffic = Traffic(client, topics, 1, 100)
        traffic.publish(per_producer=args.messages)
        traffic.wait_received()
        traffic.close()
        if traffic.received != traffic.sent:
            raise SystemExit(f"round {k}: sent {traffic.sent}, received {traffic.received}")
        time.sleep(args.settle)
        print(f"round {k}: {_measure(broker, tmp, k, rows)}", flush=True)


def _diff_types(tmp: str, first: int, last: int) -> dict:
    a = json.loads(Path(tmp, f"types_{first}.json").read_text())
    b = json.loads(Path(tmp, f"types_{last}.json").read_text())
    grew = sorted(((b.get(t, 0) - a.get(t, 0), t) for t in set(a) | set(b)), reverse=True)
    print(f"gc-tracked objects that grew most, snapshot {first} to {last}:")
    objects = {t: n for n, t in grew[:15] if n > 0}
    for t, n in objects.items():
        print(f"  {t}: +{n} ({b.get(t, 0)})")
    a = json.loads(Path(tmp, f"maps_{first}.json").read_text())
    b = json.loads(Path(tmp, f"maps_{last}.json").read_text())
    grew = sorted(((b.get(m, 0) - a.get(m, 0), m) for m in set(a) | set(b)), reverse=True)
    print(f"resident KiB per mapping that grew most, snapshot {first} to {last}:")
    mappings = {m: n for n, m in grew[:8] if n > 0}
    for m, n in mappings.items():
        print(f"  {m}: +{n} ({b.get(m, 0)})")
    return {"objects": objects, "resident_kib_per_mapping": mappings}


def _write_json(args, rows: list[dict], first: int, grew: dict) -> None:
    import platform

    out = {
        "benchmark": "memory_trace",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "mode": "fresh" if args.fresh else "rounds" if args.rounds else "steady",
        "messages_per_topic": args.messages if args.rounds else None,
        "settle_seconds": args.settle,
        "overrides": args.override,
        "malloc_arena_max": os.environ.get("MALLOC_ARENA_MAX"),
        "note": args.note,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "loadavg_1m": os.getloadavg()[0],
        },
        "measurements": rows,
        f"grew_from_{first}_to_{args.phases}": grew,
    }
    Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.json}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--phases", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--topics", type=int, default=10)
    ap.add_argument("--rounds", action="store_true", help="vs_pulsar_lite's rounds of fresh topics")
    ap.add_argument("--fresh", action="store_true", help="memory_bench's rounds (--topics new topics each)")
    ap.add_argument("--messages", type=int, default=20_000, help="messages per topic with --rounds")
    ap.add_argument("--settle", type=float, default=2.0, help="seconds after a round before measuring")
    ap.add_argument("--tracemalloc", type=int, default=0, help="frames per trace (0: off)")
    ap.add_argument("--override", action="append", default=[], help="broker config key=value")
    ap.add_argument("--json", help="write the measurements and what grew to this JSON file")
    ap.add_argument("--note", default="", help="a note stored in the JSON")
    args = ap.parse_args()
    sys.path.insert(0, str(BENCH))
    from memory_bench import _client
    from standalone import ROOT, free_port

    with tempfile.TemporaryDirectory(prefix="memory-trace-") as tmp:
        port, web = free_port(), free_port()
        cmd = [sys.executable, __file__, "--serve", "standalone", "--data-dir", os.path.join(tmp, "data")]
        cmd += ["--broker-port", str(port), "--web-port", str(web), "--log-level", "WARNING"]
        for override in ["compactionSparkWarmup=false", *args.override]:
            cmd += ["--config-override", override]
        env = {**os.environ, "MEMORY_TRACE_DIR": tmp, "MEMORY_TRACE_DEPTH": str(args.tracemalloc)}
        broker = subprocess.Popen(cmd, stdout=subprocess.PIPE, cwd=ROOT, env=env)
        broker.web_port = web  # type: ignore[attr-defined]
        try:
            if b"ready" not in broker.stdout.readline():
                raise SystemExit("broker did not start")
            client = _client(f"pulsar://127.0.0.1:{port}")
            rows: list[dict] = []
            (_fresh if args.fresh else _rounds if args.rounds else _steady)(client, broker, tmp, args, rows)
            client.close()
            first = min(3, args.phases)
            grew = _diff_types(tmp, first, args.phases) if args.phases >= 2 else {}
            if args.json:
                _write_json(args, rows, first, grew)
            if args.tracemalloc and args.phases >= 2:
                import tracemalloc

                a = tracemalloc.Snapshot.load(os.path.join(tmp, f"snap_{first}.pickle"))
                b = tracemalloc.Snapshot.load(os.path.join(tmp, f"snap_{args.phases}.pickle"))
                print(f"Python memory that grew most, snapshot {first} to {args.phases}:")
                for stat in b.compare_to(a, "lineno")[:15]:
                    print(" ", stat)
        finally:
            broker.terminate()
            broker.wait(60)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        serve(sys.argv[2:])
    else:
        main()
