"""The Spark source's scan in one Python process, without Spark: rows/s of a Python worker.

``spark_source_bench.py`` times whole queries, where Spark's own costs (planning in a Python
worker, Arrow into the JVM) weigh as much as the scan at small sizes. This bench times only what
a task does -- ``source.read_split_batches`` over every split of a read -- for the columnar scan
(``entry_columns`` + ``arrow_columns``: with the C scanner and with its numpy reference,
``COMPACTMQ_NATIVE=0``) and the per-message row path (``columnar=false``), in the same run, on
the data directory a ``spark_source_bench.py --work DIR`` run left::

    .venv/bin/python bench/spark_source_bench.py --work /tmp/ssb --paths parquet --repeat 1
    .venv/bin/python bench/spark_columns_bench.py --work /tmp/ssb

Writes bench/results/spark_columns.json (``--out`` to change): per view and path the median
seconds of ``--repeat`` runs, rows, rows/s (one core), and the speed-up over the row path.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from spark_source_bench import source_schema  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TOPIC = "persistent://public/default/spark-source-bench"


def time_read(data_dir: str, view: str, columnar: bool, repeat: int) -> tuple[list[float], int]:
    from compactmq.spark.options import parse_read_options
    from compactmq.spark.source import backend_args, open_backend, plan_read, read_split_batches, topic_schema

    opts = parse_read_options(
        {"topic": TOPIC, "view": view, "path": data_dir, "columnar": "true" if columnar else "false"}
    )
    backend = open_backend(opts)
    try:
        splits, args = plan_read(opts, backend), backend_args(backend, opts)
    finally:
        backend.close()
    schema, ts = source_schema(), topic_schema(opts)
    runs, rows = [], 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        rows = sum(b.num_rows for s in splits for b in read_split_batches(s, args, schema, ts))
        runs.append(time.perf_counter() - t0)
    return runs, rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="compactmq Spark source: a worker's scan, without Spark")
    p.add_argument("--work", required=True, help="the --work directory of a spark_source_bench run")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "spark_columns.json"))
    args = p.parse_args(argv)
    data_dir = os.path.join(args.work, "data")
    if not os.path.exists(os.path.join(data_dir, "metadata.db")):
        print(f"no data directory in {args.work}: run spark_source_bench.py --work {args.work} first")
        return 2
    results: dict = {}
    for view in ("compacted", "raw"):
        results[view] = {}
        for path, columnar, native in (
            ("columns", True, "1"),
            ("columns-numpy", True, "0"),
            ("rows", False, "1"),
        ):
            os.environ["COMPACTMQ_NATIVE"] = native
            load = os.getloadavg()[0]
            runs, rows = time_read(data_dir, view, columnar, args.repeat)
            secs = statistics.median(runs)
            results[view][path] = {
                "seconds": round(secs, 4),
                "rows": rows,
                "rows_per_s": round(rows / secs),
                "runs": [round(r, 4) for r in runs],
                "load_average_before": round(load, 2),
            }
            print(f"{view:9} {path:13} {rows:>9} rows {secs:7.3f}s {rows / secs:>12,.0f} rows/s", flush=True)
        for path in ("columns", "columns-numpy"):
            results[view][path]["speedup_over_rows"] = round(
                results[view]["rows"]["seconds"] / results[view][path]["seconds"], 2
            )
    os.environ.pop("COMPACTMQ_NATIVE", None)
    report = {
        "bench": "spark_columns",
        "repeat": args.repeat,
        "results": results,
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
