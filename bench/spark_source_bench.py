"""Topics as Spark tables: how fast the ``compactmq`` source feeds Spark, per path and view.

Starts ``compactmq standalone`` with a fresh data directory, publishes ``--messages`` messages
(batched, ``--size`` bytes, key ``i % keys``), has the broker seal the topic's ledger and compacts
once (in this process, on the same local Spark session: a run reads sealed ledgers only), then for
each view (``compacted``, ``raw``) and each path:

* ``direct``: ledger / compacted-ledger files of the data directory (``load(data_dir)``), parsed
  as columns (``entry_columns``);
* ``direct-rows``: the same files through the per-message row path (``columnar=false``), the
  scan before the columnar one, measured in the same run for the ratio;
* ``broker``: the official client and the admin REST API (``service.url`` / ``admin.url``);
* ``parquet``: ``spark.read.parquet`` of a Parquet copy of the same rows, written first (the
  yardstick: Spark's fastest native reader);

times a query that must touch every row's value (``sum(length(value))`` and ``count``; a bare
``count()`` on Parquet would read only footers). Reported: seconds (median of ``--repeat``), rows,
rows/s and rows/s per core (``local[--cores]``), and each path's speed as a fraction of Parquet's.

    .venv/bin/python bench/spark_source_bench.py               # 200,000 messages, 20,000 keys
    .venv/bin/python bench/spark_source_bench.py --full        # 10,000,000 messages, 1,000,000 keys
Writes bench/results/spark_source.json (spark_source_full.json with --full; --out to change),
after every measurement (a run stopped early leaves what it measured). ``--work DIR --reuse``
keeps the data directory and skips publishing when DIR already holds the topic, and compacting
when its view already reaches the last entry (a long publish and compaction are paid once).
Each measurement records the load averages before and after it (the machine may be shared).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from read_compacted_bench import RETENTION_OVERRIDES, compact, publish
from standalone import ROOT, StandaloneBroker


def scan(df) -> tuple[float, int]:
    t0 = time.perf_counter()
    row = df.selectExpr("count(*) AS n", "sum(length(value)) AS b").collect()[0]
    return time.perf_counter() - t0, int(row["n"])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="compactmq Spark source throughput")
    p.add_argument("--messages", type=int, default=200_000)
    p.add_argument("--keys", type=int, default=20_000)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--quick", action="store_true", help="the default (small) size, as the other benches")
    p.add_argument("--full", action="store_true", help="10,000,000 messages over 1,000,000 keys")
    p.add_argument("--cores", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--work", default=None, help="scratch directory (default: a temp dir)")
    p.add_argument("--out", default=None)
    p.add_argument("--reuse", action="store_true", help="with --work: skip publishing if the topic is there")
    p.add_argument(
        "--paths",
        default="direct,direct-rows,broker,parquet",
        help="comma-separated paths to time (direct, direct-rows, broker, parquet)",
    )
    args = p.parse_args(argv)
    if args.full:
        args.messages, args.keys = 10_000_000, 1_000_000
    out = Path(
        args.out
        or ROOT / "bench" / "results" / ("spark_source_full.json" if args.full else "spark_source.json")
    )
    work = args.work or tempfile.mkdtemp(prefix="spark-source-bench-")
    data_dir = os.path.join(work, "data")

    import compactmq.spark
    from compactmq.compaction.spark.session import get_session

    topic = "persistent://public/default/spark-source-bench"
    reused = args.reuse and os.path.isdir(os.path.join(data_dir, "ledgers", topic.replace("://", "/")))
    broker = StandaloneBroker(data_dir, RETENTION_OVERRIDES)
    results: dict = {}
    report: dict = {}
    try:
        if reused:
            publish_secs = None
            print(f"reusing the published topic in {data_dir}", flush=True)
        else:
            publish_secs = publish(broker.url, topic, args.messages, args.keys, args.size, True)
            print(f"published {args.messages} messages in {publish_secs:.1f}s", flush=True)
        spark = get_session({"spark.master": f"local[{args.cores}]"})
        from compactmq.config import load_config
        from compactmq.storage.seal import seal_before_compaction

        print(f"seal: {seal_before_compaction(data_dir, load_config(), topic)}", flush=True)
        if reused and compacted_to_the_end(data_dir, topic):
            compaction = "reused (the view already reaches the last entry)"
        else:
            compaction = compact(data_dir, topic)
        print(f"compacted: {compaction}", flush=True)
        report = {
            "bench": "spark_source",
            "messages": args.messages,
            "keys": args.keys,
            "size": args.size,
            "cores": args.cores,
            "repeat": args.repeat,
            "publish_seconds": round(publish_secs, 3) if publish_secs is not None else "reused",
            "compaction": compaction,
            "results": results,
            "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        }
        compactmq.spark.register(spark)

        def source(view: str, path: str):
            r = (
                spark.read.format("compactmq")
                .option("topic", topic)
                .option("view", view)
                .option("minPartitions", str(args.cores))
            )
            if path == "direct-rows":
                return r.option("columnar", "false").load(data_dir)
            if path == "direct":
                return r.load(data_dir)
            return r.option("service.url", broker.url).option("admin.url", broker.admin_url).load()

        for view in ("compacted", "raw"):
            copy = os.path.join(work, f"{view}.parquet")
            source(view, "direct").select("value", "__key", "__messageId", "__publishTime").write.mode(
                "overwrite"
            ).parquet(copy)
            wanted = args.paths.split(",")
            frames = {
                path: spark.read.parquet(copy) if path == "parquet" else source(view, path)
                for path in ("direct", "direct-rows", "broker", "parquet")
                if path in wanted
            }
            results[view] = {}
            for path, df in frames.items():
                load_before = [round(x, 2) for x in os.getloadavg()]
                runs = [scan(df) for _ in range(args.repeat)]
                secs = statistics.median(s for s, _ in runs)
                rows = runs[0][1]
                results[view][path] = {
                    "seconds": round(secs, 3),
                    "rows": rows,
                    "rows_per_s": round(rows / secs),
                    "rows_per_s_per_core": round(rows / secs / args.cores),
                    "runs": [round(s, 3) for s, _ in runs],
                    # a shared machine: 1/5/15-minute load averages before and after the runs
                    "load_average_before": load_before,
                    "load_average_after": [round(x, 2) for x in os.getloadavg()],
                }
                print(
                    f"{view:9} {path:11} {rows:>10} rows {secs:8.2f}s "
                    f"{rows / secs / args.cores:>12,.0f} rows/s/core (load {os.getloadavg()[0]:.1f})",
                    flush=True,
                )
                if "parquet" in results[view]:
                    parquet = results[view]["parquet"]["seconds"]
                    for done in ("direct", "direct-rows", "broker"):
                        if done in results[view]:
                            results[view][done]["fraction_of_parquet_speed"] = round(
                                parquet / results[view][done]["seconds"], 4
                            )
                if "direct-rows" in results[view] and "direct" in results[view]:
                    results[view]["direct"]["speedup_over_rows"] = round(
                        results[view]["direct-rows"]["seconds"] / results[view]["direct"]["seconds"], 2
                    )
                write(out, report)
    finally:
        broker.stop()
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {out}")
    return 0


def compacted_to_the_end(data_dir: str, topic: str) -> bool:
    """True when the topic's compacted view already covers its last entry (a reused data
    directory compacted by an earlier run: compacting again would read it all for nothing)."""
    from compactmq.compaction.state import states_of
    from compactmq.config import load_config
    from compactmq.storage import Storage

    storage = Storage(data_dir, load_config(), read_only=True)
    try:
        horizon = states_of(storage).get(topic).horizon
        last = storage.open_managed_ledger(topic, create=False).last_position()
        return horizon is not None and last is not None and tuple(horizon) >= tuple(last)
    finally:
        storage.close()


def write(out: Path, report: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
