"""Topics as Spark tables: how fast the ``compactmq`` source feeds Spark, per path and view.

Starts ``compactmq standalone`` with a fresh data directory, publishes ``--messages`` messages
(batched, ``--size`` bytes, key ``i % keys``), has the broker seal the topic's ledger and compacts
once (in this process, on the same local Spark session: a run reads sealed ledgers only), then for
each view (``compacted``, ``raw``) and each path:

* ``direct``: ledger / compacted-ledger files of the data directory (``load(data_dir)``), parsed
  as columns (``entry_columns``);
* ``direct-rows``: the same files through the per-message row path (``columnar=false``), the
  scan before the columnar one, measured in the same run for the ratio;
* ``broker``: through the broker (``service.url`` / ``admin.url``): whole entries over the binary
  protocol, parsed as columns like the direct path (``broker_entries``);
* ``broker-rows``: the same through the official client, one message object at a time
  (``columnar=false``: the broker path before ``broker_entries``);
* ``parquet``: ``spark.read.parquet`` of a Parquet copy of the same rows, written first (the
  yardstick: Spark's fastest native reader);

times a query that must touch every row's value (``sum(length(value))`` and ``count``; a bare
``count()`` on Parquet would read only footers). Reported: seconds (median of ``--repeat``), rows,
rows/s and rows/s per core (``local[--cores]``), and each path's speed as a fraction of Parquet's.

    .venv/bin/python bench/spark_source_bench.py               # 200,000 messages, 20,000 keys
    .venv/bin/python bench/spark_source_bench.py --full        # 10,000,000 messages, 1,000,000 keys
Then the pushdown queries (``--no-pushdown`` skips them), each against the full scan it narrows,
through Spark with the pushdown reader (``register(spark, pushdown=True)``, one DataFrame per
query): ten keys of the ``latest`` view (looked up in the view's key index), and a publish-time
window of 1/24 of the topic's publish-time span on ``raw`` -- "one hour out of a day", scaled to
the span this run's publishing took (ledgers are kept to ``--entries-per-ledger`` entries so that
the window can skip whole ledgers). Besides seconds and rows, each reports the messages the source
decoded (the same read planned and run in this process, ``pushdown.STATS``).

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
    p.add_argument("--entries-per-ledger", type=int, default=50, help="managedLedgerMaxEntriesPerLedger")
    p.add_argument("--no-pushdown", action="store_true", help="skip the pushdown queries")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--work", default=None, help="scratch directory (default: a temp dir)")
    p.add_argument("--out", default=None)
    p.add_argument("--reuse", action="store_true", help="with --work: skip publishing if the topic is there")
    p.add_argument(
        "--paths",
        default="direct,direct-rows,broker,broker-rows,parquet",
        help="comma-separated paths to time (direct, direct-rows, broker, broker-rows, parquet)",
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
    overrides = [
        *RETENTION_OVERRIDES,
        f"managedLedgerMaxEntriesPerLedger={args.entries_per_ledger}",
        "managedLedgerMinLedgerRolloverTimeMinutes=0",  # roll over by entries alone
    ]
    broker = StandaloneBroker(data_dir, overrides)
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
            "entries_per_ledger": args.entries_per_ledger,
            "results": results,
            "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
            "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
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
            r = r.option("service.url", broker.url).option("admin.url", broker.admin_url)
            return (r.option("columnar", "false") if path == "broker-rows" else r).load()

        for view in ("compacted", "raw"):
            copy = os.path.join(work, f"{view}.parquet")
            source(view, "direct").select("value", "__key", "__messageId", "__publishTime").write.mode(
                "overwrite"
            ).parquet(copy)
            wanted = args.paths.split(",")
            frames = {
                path: spark.read.parquet(copy) if path == "parquet" else source(view, path)
                for path in ("direct", "direct-rows", "broker", "broker-rows", "parquet")
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
                    for done in ("direct", "direct-rows", "broker", "broker-rows"):
                        if done in results[view]:
                            results[view][done]["fraction_of_parquet_speed"] = round(
                                parquet / results[view][done]["seconds"], 4
                            )
                for fast in ("direct", "broker"):
                    if f"{fast}-rows" in results[view] and fast in results[view]:
                        results[view][fast]["speedup_over_rows"] = round(
                            results[view][f"{fast}-rows"]["seconds"] / results[view][fast]["seconds"], 2
                        )
                write(out, report)
        if not args.no_pushdown:
            report["pushdown"] = pushdown_queries(
                spark, data_dir, topic, os.path.join(work, "raw.parquet"), args
            )
            write(out, report)
    finally:
        broker.stop()
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {out}")
    return 0


def pushdown_queries(spark, data_dir: str, topic: str, raw_copy: str, args) -> dict:
    """Ten keys of ``latest`` and 1/24 of the publish-time span of ``raw``, each against the full
    scan of that view, through Spark with the pushdown reader (one DataFrame per query)."""
    import compactmq.spark

    span = (
        spark.read.parquet(raw_copy)
        .selectExpr("min(unix_millis(__publishTime)) AS lo", "max(unix_millis(__publishTime)) AS hi")
        .collect()[0]
    )
    lo, hi = int(span["lo"]), int(span["hi"])
    part = max(1, (hi - lo) // 24)
    w_lo = lo + 11 * part  # the 12th "hour" of the "day"
    keys = [f"key-{k * (args.keys // 10)}" for k in range(10)]
    key_list = ", ".join(f"'{k}'" for k in keys)
    queries = {
        "latest_10_keys": ("latest", f"__key IN ({key_list})"),
        "raw_one_24th_of_the_span": (
            "raw",
            f"__publishTime >= timestamp_millis({w_lo}) AND __publishTime < timestamp_millis({w_lo + part})",
        ),
    }
    compactmq.spark.register(spark, pushdown=True)
    out: dict = {"publish_span_ms": hi - lo, "window_ms": part}
    try:
        for name, (view, cond) in queries.items():

            def load():
                return (
                    spark.read.format("compactmq")
                    .option("topic", topic)
                    .option("view", view)
                    .option("minPartitions", str(args.cores))
                    .load(data_dir)
                )

            full = [scan(load()) for _ in range(args.repeat)]
            pushed = [scan(load().where(cond)) for _ in range(args.repeat)]
            f_secs = statistics.median(x for x, _ in full)
            p_secs = statistics.median(x for x, _ in pushed)
            out[name] = {
                "view": view,
                "filter": cond,
                "full_scan": {"seconds": round(f_secs, 3), "rows": full[0][1]},
                "pushed": {"seconds": round(p_secs, 3), "rows": pushed[0][1]},
                "speedup": round(f_secs / p_secs, 2),
                "messages_decoded": decoded(data_dir, topic, view, cond_filters(name, keys, w_lo, part)),
                "load_average_after": [round(x, 2) for x in os.getloadavg()],
            }
            print(
                f"pushdown {name}: full {f_secs:.2f}s ({full[0][1]} rows), pushed {p_secs:.2f}s "
                f"({pushed[0][1]} rows), {out[name]['messages_decoded']}",
                flush=True,
            )
    finally:
        compactmq.spark.register(spark)
    return out


def cond_filters(name: str, keys: list, w_lo: int, part: int) -> list:
    """The Spark filters of a pushdown query as the source receives them."""
    import datetime as dt

    from pyspark.sql.datasource import GreaterThanOrEqual, In, LessThan

    if name == "latest_10_keys":
        return [In(("__key",), tuple(keys))]
    utc = dt.timezone.utc
    at = lambda ms: dt.datetime.fromtimestamp(ms / 1000, utc)  # noqa: E731
    return [GreaterThanOrEqual(("__publishTime",), at(w_lo)), LessThan(("__publishTime",), at(w_lo + part))]


def decoded(data_dir: str, topic: str, view: str, filters: list) -> dict:
    """Messages the source decodes (and rows it returns) with and without ``filters``, read in
    this process (a Spark task's counts stay in its worker)."""
    from pyspark.sql.types import BinaryType, MapType, StringType, StructField, StructType, TimestampType

    from compactmq.spark import pushdown
    from compactmq.spark.options import parse_read_options
    from compactmq.spark.source import CompactMQFilteringReader, topic_schema

    opts = parse_read_options({"topic": topic, "view": view, "path": data_dir})
    schema = StructType(
        [
            StructField("value", BinaryType()),
            StructField("__key", StringType()),
            StructField("__topic", StringType()),
            StructField("__messageId", BinaryType()),
            StructField("__publishTime", TimestampType()),
            StructField("__eventTime", TimestampType()),
            StructField("__messageProperties", MapType(StringType(), StringType())),
        ]
    )
    out = {}
    for label, fs in (("full", []), ("pushed", filters)):
        reader = CompactMQFilteringReader(opts, schema, topic_schema(opts))
        reader.pushFilters(fs)
        before = dict(pushdown.STATS)
        parts = reader.partitions()
        for part in parts:
            for _ in reader.read(part):
                pass
        out[label] = {
            "splits": len(parts),
            "messages_decoded": pushdown.STATS["messages_read"] - before.get("messages_read", 0),
            "rows_returned": pushdown.STATS["rows_returned"] - before.get("rows_returned", 0),
        }
    return out


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
