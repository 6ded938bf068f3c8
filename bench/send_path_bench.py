"""The broker's work per published message on the SEND path, in process: figures that hold up
on a busy machine.

A real ``BrokerService`` over a real ``Storage`` (fsync on, the default) with a
``ServerConnection`` whose transport only counts bytes; a producer attached with PRODUCER; then
``--messages`` plain SENDs (100 B payloads, metadata as the official client writes it) fed to
``data_received`` ``B`` at a time, for B in ``--per-read`` (how many SENDs one socket read
brings: 1 on an idle broker, tens to hundreds under load). The loop turns between reads and
the topic is drained every 20 reads. Per message:

- ``loop_cpu_us``: CPU time of the event-loop thread (``time.thread_time``; the sync runs in a
  pool thread and is not counted), median of 3 runs;
- ``process_cpu_us``: CPU time of the whole process (``time.process_time``: the sync thread
  too), median of 3 runs;
- ``python_calls``: Python function calls of the loop thread (cProfile's count, built-ins
  included) -- exact, whatever the load.

Each figure twice: keyed ``B``, reads fed back to back (the loop turns between them, the
topic drained every 20 reads: syncs cover several reads), and ``Bc``, closed loop (each read
waits until it is answered: one sync a read, the quiet extreme where a broker's fixed costs
per read and per sync -- thread hops, wake-ups -- are all there is).

``--main-src DIR`` runs the same in a child process with ``PYTHONPATH=DIR`` (another checkout's
``src``) for before/after figures in one run.

    .venv/bin/python bench/send_path_bench.py --main-src /tmp/main/src
Writes bench/results/send_path.json (``--out`` to change).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import platform
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class CountingTransport:
    def __init__(self) -> None:
        self.written = 0
        self.closed = False

    def get_extra_info(self, name):
        return ("127.0.0.1", 1234)

    def write(self, data) -> None:
        self.written += len(data)

    def writelines(self, chunks) -> None:
        for chunk in chunks:
            self.written += len(chunk)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True


def _send(seq: int, payload: bytes) -> bytes:
    from compactmq.protocol import frames
    from compactmq.protocol import pulsar_pb2 as pb

    try:
        from compactmq.protocol import entry_format
    except ImportError:  # an older checkout (--main-src): the entry's bytes lived in frames
        entry_format = frames  # type: ignore[assignment]

    md = pb.MessageMetadata(producer_name="bench-0-1", sequence_id=seq, publish_time=1_795_000_000_000 + seq)
    body = pb.CommandSend(producer_id=1, sequence_id=seq, num_messages=1)
    return frames.encode_with_entry(
        pb.BaseCommand(type=pb.BaseCommand.SEND, send=body), entry_format.build_entry(md, payload)
    )


async def _answered(topic) -> None:
    """``topic.drain()``, but looking again every 10 ms: an older tree (``--src``) can miss
    the wake-up when the loop answered everything before the sync ended (fixed with the send
    runs), which would stall a closed-loop run."""
    loop = asyncio.get_running_loop()
    while topic.publishing:
        fut = loop.create_future()
        topic._idle_waiters.append(fut)
        timer = loop.call_later(0.01, lambda: fut.done() or fut.set_result(None))
        await fut
        timer.cancel()


async def _one(
    service, name: str, per_read: int, n: int, profile: bool, closed: bool = False
) -> tuple[float, float, float]:
    from compactmq.broker.connection import ServerConnection
    from compactmq.protocol import frames
    from compactmq.protocol import pulsar_pb2 as pb

    conn = ServerConnection(service)
    conn.connection_made(CountingTransport())
    connect = pb.CommandConnect(client_version="bench", protocol_version=21)
    conn.data_received(frames.encode_command(pb.BaseCommand(type=pb.BaseCommand.CONNECT, connect=connect)))
    producer = pb.CommandProducer(topic=name, producer_id=1, request_id=1)
    conn.data_received(frames.encode_command(pb.BaseCommand(type=pb.BaseCommand.PRODUCER, producer=producer)))
    while 1 not in conn.handler.producers:
        await asyncio.sleep(0.005)
    topic = conn.handler.producers[1].topic
    sends = [_send(seq, b"x" * 100) for seq in range(n)]
    reads = [b"".join(sends[i : i + per_read]) for i in range(0, n, per_read)]
    prof = cProfile.Profile() if profile else None
    began, began_all = time.thread_time(), time.process_time()
    if prof is not None:
        prof.enable()
    for i, data in enumerate(reads):
        conn.data_received(data)
        if closed:  # the quiet extreme: the next read comes once this one is answered
            await _answered(topic)
            continue
        await asyncio.sleep(0)  # the loop turns: the write, and the sync's answers
        if i % 20 == 19:
            await topic.drain()
    await topic.drain()
    if prof is not None:
        prof.disable()
    cpu, cpu_all = time.thread_time() - began, time.process_time() - began_all
    conn.close()
    calls = pstats.Stats(prof).total_calls if prof is not None else 0  # type: ignore[attr-defined]
    return cpu / n * 1e6, calls / n, cpu_all / n * 1e6


def measure(per_reads: list[int], n: int) -> dict:
    from compactmq.broker.default_namespace import ensure_default_namespace
    from compactmq.broker.server import BrokerService
    from compactmq.config import load_config
    from compactmq.storage import Storage

    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(overrides={"managedLedgerSyncData": True})
        storage = Storage(os.path.join(tmp, "data"), cfg)
        ensure_default_namespace(storage.resources, cfg, None)
        service = BrokerService(cfg, storage, "pulsar://127.0.0.1:1")

        async def run() -> None:
            k = 0
            for per_read in per_reads:

                def topic() -> str:
                    nonlocal k
                    k += 1
                    return f"persistent://public/default/send-path-{per_read}-{k}"

                for closed in (False, True):
                    await _one(service, topic(), per_read, 1000, False, closed)  # warm-up
                    runs = [await _one(service, topic(), per_read, n, False, closed) for _ in range(3)]
                    cpus = [r[0] for r in runs]
                    _, calls, _ = await _one(service, topic(), per_read, max(1000, n // 4), True, closed)
                    out[f"{per_read}{'c' if closed else ''}"] = {
                        "loop_cpu_us": round(statistics.median(cpus), 2),
                        "loop_cpu_us_runs": [round(c, 2) for c in cpus],
                        "process_cpu_us": round(statistics.median(r[2] for r in runs), 2),
                        "python_calls": round(calls, 1),
                    }
            await service.topics.close_all()

        try:
            import uvloop

            uvloop.run(run())
        except ImportError:
            asyncio.run(run())
        if hasattr(service, "sync_threads"):
            service.sync_threads.shutdown()
        service.executor.shutdown()
        storage.close()
    return out


def _median_of(runs: list[dict]) -> dict:
    """Each figure's median over the rounds of one tree."""
    if len(runs) == 1:
        return runs[0]
    out: dict = {}
    for key, first in runs[0].items():
        out[key] = {
            name: round(statistics.median(run[key][name] for run in runs), 2)
            for name, value in first.items()
            if not isinstance(value, list)
        }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=20_000, help="messages per run (default 20,000)")
    ap.add_argument("--per-read", default="1,10,100", help="SENDs per socket read (default 1,10,100)")
    ap.add_argument("--main-src", help="also measure this checkout's src directory (label 'main')")
    ap.add_argument(
        "--src",
        action="append",
        default=[],
        metavar="LABEL=DIR",
        help="also measure another checkout's src directory under LABEL (repeatable)",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="children per tree, the trees interleaved round by round; figures are the median "
        "over the rounds, each round's kept under 'rounds' (default 1)",
    )
    ap.add_argument("--out", help="JSON path (default bench/results/send_path.json)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    per_reads = [int(x) for x in args.per_read.split(",")]
    if args.child:
        print(json.dumps(measure(per_reads, args.messages)))
        return 0
    labels = {"compactmq": str(ROOT / "src")}
    if args.main_src:
        labels["main"] = args.main_src
    for given in args.src:
        label, _, src = given.partition("=")
        labels[label] = src
    rounds: dict = {label: [] for label in labels}
    for _ in range(args.rounds):
        for label, src in labels.items():
            child = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--child",
                    "--messages",
                    str(args.messages),
                    "--per-read",
                    args.per_read,
                ],
                env={**os.environ, "PYTHONPATH": src},
                capture_output=True,
                text=True,
                check=True,
            )
            rounds[label].append(json.loads(child.stdout.strip().splitlines()[-1]))
            print(label, json.dumps(rounds[label][-1]), flush=True)
    results = {label: _median_of(runs) for label, runs in rounds.items()}
    out = {
        "benchmark": "send_path",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "messages": args.messages,
        "payload_bytes": 100,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "loadavg_1m": round(os.getloadavg()[0], 2),
        },
        "notes": "in process: BrokerService + Storage (fsync on), SENDs fed per_read at a time to "
        "ServerConnection.data_received (keys 'B': back to back, a drain every 20 reads; 'Bc': closed loop, "
        "each read answered before the next); loop_cpu_us = event-loop thread CPU per message (median of 3), "
        "process_cpu_us = whole process CPU per message (median of 3), python_calls = loop-thread cProfile "
        "calls per message",
        "rounds": args.rounds,
        "trees": labels,
        "per_read": results,
        "per_round": rounds if args.rounds > 1 else None,
    }
    path = Path(args.out) if args.out else ROOT / "bench" / "results" / "send_path.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
