"""Per-call cost of ``ManagedLedger.append`` and ``append_many``, counted rather than timed.

The broker's publish path ends in these two calls, so a refactoring of storage must not make
them do more. Timings on a shared machine are noise; these counts are not:

- ``py_calls`` / ``c_calls``: Python and C functions entered during one call (``sys.setprofile``);
- ``bytecodes``: Python bytecode instructions executed during one call (``f_trace_opcodes``);
- ``best_us``: best-of-``--repeat`` wall time per call, for orientation only.

``try_write_many`` (the broker's write on its event loop; its sync runs apart, in
``sync_written``) is measured too when the checkout has it.
Each is measured with ``managedLedgerSyncData`` off (pure Python work) and on (group commit
and one fdatasync per call when alone), on a warm ledger large enough not to roll over.
``--src`` measures another checkout's ``src`` (e.g. an export of ``main``), and ``--label``
files the result under a name in the output JSON, so before/after sit side by side.

    .venv/bin/python bench/append_cost_bench.py --label ml-split
    git archive main src | tar -x -C /tmp/main && \\
        .venv/bin/python bench/append_cost_bench.py --src /tmp/main/src --label main

``--cpu-vs SRC`` instead measures the CPU seconds of the storage path: ``--entries`` (200 k)
x ``--size`` (100 B) entries appended through ``append_many`` in batches of ``--batch``, sync
off and on, in a fresh process per run (``time.process_time`` around the appends only: user +
system CPU, the fdatasyncs included), alternating SRC ("before"), this checkout ("after") and
this checkout with ``COMPACTMQ_NATIVE=0`` ("after-python") for ``--rounds`` rounds, so a busy
machine slows all of them alike. Each run also counts the Python and C calls of one batch.
Results go to ``append_cpu.json`` beside ``--out``; the median per variant is what to compare.

    git archive HEAD~1 src | tar -x -C /tmp/before && \\
        .venv/bin/python bench/append_cost_bench.py --cpu-vs /tmp/before/src --label append-path
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def counts(fn) -> dict[str, int]:
    calls = [0, 0]

    def profiler(frame, event, arg):
        if event == "call":
            calls[0] += 1
        elif event == "c_call":
            calls[1] += 1

    sys.setprofile(profiler)
    fn()
    sys.setprofile(None)
    ops = [0]

    def tracer(frame, event, arg):
        frame.f_trace_opcodes = True
        if event == "opcode":
            ops[0] += 1
        return tracer

    sys.settrace(tracer)
    fn()
    sys.settrace(None)
    return {"py_calls": calls[0], "c_calls": calls[1], "bytecodes": ops[0]}


def best_us(fn, repeat: int, k: int = 200) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(k):
            fn()
        best = min(best, (time.perf_counter() - t0) / k)
    return round(best * 1e6, 2)


def measure(sync: bool, repeat: int) -> dict:
    from compactmq.config import load_config
    from compactmq.storage import Storage

    conf = {"managedLedgerSyncData": sync, "managedLedgerMaxEntriesPerLedger": 10**9}
    with tempfile.TemporaryDirectory() as d:
        st = Storage(Path(d) / "data", load_config(overrides=conf))
        try:
            ml = st.open_managed_ledger("persistent://public/default/append-cost")
            batch = [b"x" * 100] * 10
            for _ in range(100):  # warm: arrays grown, caches filled
                ml.append_many(batch)
                ml.append(b"y" * 100)
            out = {}
            calls = [
                ("append_many_10x100B", lambda: ml.append_many(batch)),
                ("append_100B", lambda: ml.append(b"y" * 100)),
            ]
            if hasattr(ml, "try_write_many"):  # the broker's write on its event loop (pipelined commit)
                times = [None] * len(batch)
                calls.append(("try_write_many_10x100B", lambda: ml.try_write_many(batch, times)))
            for name, fn in calls:
                out[name] = {
                    **counts(fn),
                    "best_us": best_us(fn, repeat if not sync else 2, 200 if not sync else 20),
                }
            return out
        finally:
            st.close()


def cpu_run(sync: bool, entries: int, size: int, batch: int) -> dict:
    """One storage-path CPU measurement, in this process (a child of ``cpu_compare``)."""
    from compactmq.config import load_config
    from compactmq.storage import Storage

    conf = {"managedLedgerSyncData": sync, "managedLedgerMaxEntriesPerLedger": 10**9}
    with tempfile.TemporaryDirectory() as d:
        st = Storage(Path(d) / "data", load_config(overrides=conf))
        try:
            ml = st.open_managed_ledger("persistent://public/default/append-cpu")
            batches = [
                [bytes([i % 251]) * size for i in range(k, k + batch)] for k in range(0, entries, batch)
            ]
            ml.append_many(batches[0])  # warm
            per_batch = counts(lambda: ml.append_many(batches[0]))
            t0 = time.process_time()
            for b in batches:
                ml.append_many(b)
            cpu = time.process_time() - t0
        finally:
            st.close()
    try:
        from compactmq.storage import ledger_file

        impl = getattr(ledger_file, "RECORD_IMPLEMENTATION", "python (before frame_records)")
    except ImportError:  # pragma: no cover
        impl = "?"
    return {
        "cpu_s": round(cpu, 4),
        "cpu_us_per_entry": round(cpu / entries * 1e6, 3),
        "py_calls_per_entry": round(per_batch["py_calls"] / batch, 2),
        "c_calls_per_entry": round(per_batch["c_calls"] / batch, 2),
        "bytecodes_per_entry": round(per_batch["bytecodes"] / batch, 1),
        "record_implementation": impl,
    }


def cpu_compare(args) -> dict:
    """Alternate before / after / after-python child processes; medians per variant."""
    import os
    import statistics
    import subprocess

    variants = {
        "before": (args.cpu_vs, {}),
        "after": (args.src, {}),
        "after-python": (args.src, {"COMPACTMQ_NATIVE": "0"}),
    }
    runs: dict[str, dict[str, list]] = {v: {"sync=False": [], "sync=True": []} for v in variants}
    for rnd in range(args.rounds):
        for sync in (False, True):
            for name, (src, env) in variants.items():
                cmd = [sys.executable, __file__, "--src", src, "--child-cpu", str(sync)]
                cmd += ["--entries", str(args.entries), "--size", str(args.size), "--batch", str(args.batch)]
                out = subprocess.run(
                    cmd, env={**os.environ, **env}, check=True, capture_output=True, text=True
                )
                res = json.loads(out.stdout)
                runs[name][f"sync={sync}"].append(res)
                print(f"round {rnd} sync={sync} {name}: {res}", file=sys.stderr)
    summary: dict = {}
    for name, by_sync in runs.items():
        summary[name] = {}
        for key, rs in by_sync.items():
            med = statistics.median(r["cpu_us_per_entry"] for r in rs)
            summary[name][key] = {
                "median_cpu_us_per_entry": round(med, 3),
                "cpu_us_per_entry_runs": [r["cpu_us_per_entry"] for r in rs],
                **{k: rs[-1][k] for k in ("py_calls_per_entry", "c_calls_per_entry", "bytecodes_per_entry")},
                "record_implementation": rs[-1]["record_implementation"],
            }
    return {
        "entries": args.entries,
        "size": args.size,
        "batch": args.batch,
        "rounds": args.rounds,
        "python": sys.version.split()[0],
        "variants": summary,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", default=str(ROOT / "src"), help="the src directory to measure")
    ap.add_argument("--label", default="this-checkout")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "append_cost.json"))
    ap.add_argument("--cpu-vs", metavar="SRC", help="compare storage-path CPU against this src")
    ap.add_argument("--entries", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child-cpu", choices=("True", "False"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    sys.path.insert(0, args.src)
    if args.child_cpu is not None:
        print(json.dumps(cpu_run(args.child_cpu == "True", args.entries, args.size, args.batch)))
        return
    if args.cpu_vs:
        result = cpu_compare(args)
        out = Path(args.out).with_name("append_cpu.json")
        data = json.loads(out.read_text()) if out.exists() else {}
        data[args.label] = result
        out.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        print(json.dumps({args.label: result["variants"]}, indent=1))
        return
    result = {f"sync={s}": measure(s, args.repeat) for s in (False, True)}
    out = Path(args.out)
    data = json.loads(out.read_text()) if out.exists() else {}
    data[args.label] = {"python": sys.version.split()[0], **result}
    out.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(json.dumps({args.label: result}, indent=1))


if __name__ == "__main__":
    main()
