"""Where a broker's memory goes under a steady load: Python objects or the C heap.

Runs ``compactmq standalone`` under a small launcher (this file with ``--serve``) that answers
SIGUSR2 with ``gc.collect()``, ``malloc_trim(0)`` (glibc gives freed memory back) and, with
``--tracemalloc DEPTH``, a tracemalloc snapshot. The driver publishes and consumes on
``--topics`` topics (one producer, one acknowledging Shared consumer each, batching off) in
``--phases`` phases of ``--seconds``; after each phase it prints the broker's RSS, the RSS
after the trim, and Python's allocated blocks; at the end, the lines whose Python memory grew
most between the first and the last snapshot.

Reading it: allocated blocks flat while RSS-after-trim grows means the C heap (a native
library, allocator arenas) or the size of a few large Python buffers (tracemalloc names them);
blocks growing with messages is a Python leak; RSS growing but not RSS-after-trim is freed
memory the allocator kept, which it reuses.

    .venv/bin/python bench/memory_trace.py --phases 5 --seconds 8                  # ~1.5 min
    .venv/bin/python bench/memory_trace.py --phases 5 --seconds 8 --tracemalloc 1  # slower broker
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

BENCH = Path(__file__).resolve().parent


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
        with open(os.path.join(snap_dir, f"blocks_{count[0]}"), "w") as f:
            f.write(str(sys.getallocatedblocks()))

    signal.signal(signal.SIGUSR2, on_signal)
    sys.argv = ["compactmq", *argv]
    runpy.run_module("compactmq.cli.main", run_name="__main__")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--phases", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--topics", type=int, default=10)
    ap.add_argument("--tracemalloc", type=int, default=0, help="frames per trace (0: off)")
    ap.add_argument("--override", action="append", default=[], help="broker config key=value")
    args = ap.parse_args()
    sys.path.insert(0, str(BENCH))
    from memory_bench import Traffic, _client, rss_bytes
    from standalone import ROOT, free_port

    with tempfile.TemporaryDirectory(prefix="memory-trace-") as tmp:
        port, web = free_port(), free_port()
        cmd = [sys.executable, __file__, "--serve", "standalone", "--data-dir", os.path.join(tmp, "data")]
        cmd += ["--broker-port", str(port), "--web-port", str(web), "--log-level", "WARNING"]
        for override in ["compactionSparkWarmup=false", *args.override]:
            cmd += ["--config-override", override]
        env = {**os.environ, "MEMORY_TRACE_DIR": tmp, "MEMORY_TRACE_DEPTH": str(args.tracemalloc)}
        broker = subprocess.Popen(cmd, stdout=subprocess.PIPE, cwd=ROOT, env=env)
        try:
            if b"ready" not in broker.stdout.readline():
                raise SystemExit("broker did not start")
            client = _client(f"pulsar://127.0.0.1:{port}")
            prefix = uuid.uuid4().hex[:6]
            topics = [f"persistent://public/default/trace-{prefix}-{i}" for i in range(args.topics)]
            traffic = Traffic(client, topics, 1, 100)
            sent = 0
            for k in range(1, args.phases + 1):
                traffic.publish(until=time.monotonic() + args.seconds)
                sent += traffic.sent
                traffic.wait_received()
                time.sleep(2)
                rss = rss_bytes(broker.pid) / 2**20
                os.kill(broker.pid, signal.SIGUSR2)
                blocks = Path(tmp, f"blocks_{k}")
                deadline = time.monotonic() + 120
                while not blocks.exists() and time.monotonic() < deadline:
                    time.sleep(0.2)
                time.sleep(0.5)
                trimmed = rss_bytes(broker.pid) / 2**20
                print(
                    f"phase {k}: {sent} messages, received {traffic.received}, RSS {rss:.1f} MiB, "
                    f"after trim {trimmed:.1f} MiB, Python blocks {blocks.read_text()}",
                    flush=True,
                )
            traffic.close()
            client.close()
            if args.tracemalloc and args.phases >= 2:
                import tracemalloc

                first = tracemalloc.Snapshot.load(os.path.join(tmp, "snap_1.pickle"))
                last = tracemalloc.Snapshot.load(os.path.join(tmp, f"snap_{args.phases}.pickle"))
                print("Python memory that grew most, first to last phase:")
                for stat in last.compare_to(first, "lineno")[:15]:
                    print(" ", stat)
        finally:
            broker.terminate()
            broker.wait(60)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        serve(sys.argv[2:])
    else:
        main()
