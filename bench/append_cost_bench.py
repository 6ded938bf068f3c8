"""Per-call cost of ``ManagedLedger.append`` and ``append_many``, counted rather than timed.

The broker's publish path ends in these two calls, so a refactoring of storage must not make
them do more. Timings on a shared machine are noise; these counts are not:

- ``py_calls`` / ``c_calls``: Python and C functions entered during one call (``sys.setprofile``);
- ``bytecodes``: Python bytecode instructions executed during one call (``f_trace_opcodes``);
- ``best_us``: best-of-``--repeat`` wall time per call, for orientation only.

Each is measured with ``managedLedgerSyncData`` off (pure Python work) and on (group commit
and one fdatasync per call when alone), on a warm ledger large enough not to roll over.
``--src`` measures another checkout's ``src`` (e.g. an export of ``main``), and ``--label``
files the result under a name in the output JSON, so before/after sit side by side.

    .venv/bin/python bench/append_cost_bench.py --label ml-split
    git archive main src | tar -x -C /tmp/main && \\
        .venv/bin/python bench/append_cost_bench.py --src /tmp/main/src --label main
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
            for name, fn in (
                ("append_many_10x100B", lambda: ml.append_many(batch)),
                ("append_100B", lambda: ml.append(b"y" * 100)),
            ):
                out[name] = {
                    **counts(fn),
                    "best_us": best_us(fn, repeat if not sync else 2, 200 if not sync else 20),
                }
            return out
        finally:
            st.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", default=str(ROOT / "src"), help="the src directory to measure")
    ap.add_argument("--label", default="this-checkout")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "append_cost.json"))
    args = ap.parse_args()
    sys.path.insert(0, args.src)
    result = {f"sync={s}": measure(s, args.repeat) for s in (False, True)}
    out = Path(args.out)
    data = json.loads(out.read_text()) if out.exists() else {}
    data[args.label] = {"python": sys.version.split()[0], **result}
    out.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(json.dumps({args.label: result}, indent=1))


if __name__ == "__main__":
    main()
