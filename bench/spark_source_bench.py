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
* ``direct-pruned`` / ``broker-pruned``: the same reads with ``spark.read.schema("value
  binary")``: Spark 4.3 tells a Python data source no required columns, so the JVM converts every
  column of every row it is given; naming the one column the query reads is how a user prunes
  (Parquet prunes by itself);
* ``parquet``: ``spark.read.parquet`` of a Parquet copy of the same rows, written first (the
  yardstick: Spark's fastest native reader);

times a query that must touch every row's value (``sum(length(value))`` and ``count``; a bare
``count()`` on Parquet would read only footers). Reported: seconds (median of ``--repeat``), rows,
rows/s and rows/s per core (``local[--cores]``), and each path's speed as a fraction of Parquet's;
and, per run, where the CPU went (``cpu``): the Spark JVM, its Python workers (the daemon and the
workers it forks, from ``/proc/<pid>/stat``), the broker process and this driver -- CPU seconds depend
much less than wall time on how busy the machine is, so ``fraction_of_parquet_cpu`` (Parquet's CPU seconds over
the path's) is the figure to compare across machines; wall-clock fractions need a quiet one.
The row paths are run ``--rows-repeat`` times (1: at 10 M they take minutes each).

    .venv/bin/python bench/spark_source_bench.py               # 200,000 messages, 20,000 keys
    .venv/bin/python bench/spark_source_bench.py --full        # 10,000,000 messages, 1,000,000 keys
    .venv/bin/python bench/spark_source_bench.py --plot bench/results/spark_source_full.json
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
The plot (``--plot JSON``, which also recomputes the JSON's derived figures; drawn after every run
when matplotlib is installed) is the JSON's name with ``.png``: rows/s/core per path and view, the CPU split per million rows, the pushdown queries.
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

sys.path.insert(0, str(ROOT))
from tests.spark.helpers import source_schema  # noqa: E402  (the source's schema, as the tests build it)


def scan(df) -> tuple[float, int]:
    t0 = time.perf_counter()
    row = df.selectExpr("count(*) AS n", "sum(length(value)) AS b").collect()[0]
    return time.perf_counter() - t0, int(row["n"])


CLK_TCK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[str, int, int, int]:
    """(command name, parent pid, own CPU ticks, CPU ticks of waited-for children)."""
    with open(f"/proc/{pid}/stat") as f:
        text = f.read()
    comm = text[text.index("(") + 1 : text.rindex(")")]
    fields = text.rsplit(")", 1)[1].split()
    return comm, int(fields[1]), int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14])


def _processes() -> dict:
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                out[int(name)] = _stat(int(name))
            except (OSError, ValueError):  # gone meanwhile
                pass
    return out


class CpuSplit:
    """CPU seconds of the Spark JVM (a child ``java`` of this process), of its Python workers
    (every process below the JVM: the daemon, the workers it forks, and the workers that already
    exited, whose time the daemon holds as its children's), of the broker and of this process."""

    def __init__(self, broker_pid: int | None):
        self.broker_pid = broker_pid
        procs = _processes()
        me = os.getpid()
        self.jvm = next((p for p, (c, pp, _, _) in procs.items() if c == "java" and pp == me), None)

    def snapshot(self) -> dict:
        procs = _processes()
        below = {self.jvm}
        grew = True
        while grew:
            grew = False
            for pid, (_, ppid, _, _) in procs.items():
                if ppid in below and pid not in below:
                    below.add(pid)
                    grew = True
        t = os.times()
        return {
            "jvm": procs[self.jvm][2] / CLK_TCK if self.jvm in procs else 0.0,
            "python_workers": sum(sum(procs[p][2:]) for p in below - {self.jvm} if p in procs) / CLK_TCK,
            "broker": procs[self.broker_pid][2] / CLK_TCK if self.broker_pid in procs else 0.0,
            "driver_python": t.user + t.system,
        }

    @staticmethod
    def spent(before: dict, after: dict, runs: int) -> dict:
        """CPU seconds per run of each process group between two snapshots."""
        return {f"{k}_cpu_seconds": round((after[k] - before[k]) / runs, 3) for k in before}


def totals(path: str, r: dict) -> None:
    """A measurement's CPU total: the JVM, its Python workers and this driver, and the broker
    for the broker paths only (it idles through the others)."""
    cpu = r["cpu"]
    parts = ["jvm", "python_workers", "driver_python"] + (["broker"] if path.startswith("broker") else [])
    total = sum(cpu[f"{k}_cpu_seconds"] for k in parts)
    cpu["total_cpu_seconds"] = round(total, 3)
    cpu["total_cpu_seconds_per_million_rows"] = round(total / max(r["rows"], 1) * 1e6, 3)


def derive(results: dict) -> None:
    """The figures computed from the measured ones: CPU totals, fractions of Parquet's speed
    (wall clock) and CPU, speed-ups of the columnar paths over the row paths."""
    for res in results.values():
        for path, r in res.items():
            if "cpu" in r:
                totals(path, r)
        parquet = res.get("parquet")
        for path, r in res.items():
            if parquet is None or path == "parquet":
                continue
            r["fraction_of_parquet_speed"] = round(parquet["seconds"] / r["seconds"], 4)
            if "cpu" in r and "cpu" in parquet:
                r["fraction_of_parquet_cpu"] = round(
                    parquet["cpu"]["total_cpu_seconds"] / r["cpu"]["total_cpu_seconds"], 4
                )
        for fast in ("direct", "broker"):
            if f"{fast}-rows" in res and fast in res:
                res[fast]["speedup_over_rows"] = round(
                    res[f"{fast}-rows"]["seconds"] / res[fast]["seconds"], 2
                )


PATHS = ("direct", "direct-pruned", "direct-rows", "broker", "broker-pruned", "broker-rows", "parquet")


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
    p.add_argument("--rows-repeat", type=int, default=1, help="runs of the row paths (slow)")
    p.add_argument("--plot", default=None, metavar="JSON", help="only draw the plot of a result file")
    p.add_argument("--work", default=None, help="scratch directory (default: a temp dir)")
    p.add_argument("--out", default=None)
    p.add_argument("--reuse", action="store_true", help="with --work: skip publishing if the topic is there")
    p.add_argument(
        "--paths",
        default=",".join(PATHS),
        help=f"comma-separated paths to time ({', '.join(PATHS)})",
    )
    args = p.parse_args(argv)
    if args.plot:  # the derived figures again (their formulas may be newer than the file), then the plot
        done = json.loads(Path(args.plot).read_text())
        derive(done["results"])
        write(Path(args.plot), done)
        plot(Path(args.plot), done)
        return 0
    if args.full:
        args.messages, args.keys = 10_000_000, 1_000_000
    out = Path(
        args.out
        or ROOT / "bench" / "results" / ("spark_source_full.json" if args.full else "spark_source.json")
    )
    started = time.perf_counter()
    work = args.work or tempfile.mkdtemp(prefix="spark-source-bench-")
    data_dir = os.path.join(work, "data")

    import compactmq.spark
    from compactmq.compaction.jobs.session import get_session

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
        cpu = CpuSplit(broker.proc.pid)

        def source(view: str, path: str):
            r = spark.read.format("compactmq")
            if path.endswith("-pruned"):
                r = r.schema("value binary")
                path = path.removesuffix("-pruned")
            r = r.option("topic", topic).option("view", view).option("minPartitions", str(args.cores))
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
            if view == "compacted":  # untimed: the JVM compiles the scan and aggregate code once,
                scan(source(view, "direct"))  # not inside the first path measured
                scan(spark.read.parquet(copy))
            wanted = args.paths.split(",")
            frames = {
                path: spark.read.parquet(copy) if path == "parquet" else source(view, path)
                for path in PATHS
                if path in wanted
            }
            results[view] = {}
            for path, df in frames.items():
                load_before = [round(x, 2) for x in os.getloadavg()]
                repeat = args.rows_repeat if path.endswith("-rows") else args.repeat
                cpu_before = cpu.snapshot()
                runs = [scan(df) for _ in range(repeat)]
                secs = statistics.median(s for s, _ in runs)
                rows = runs[0][1]
                results[view][path] = {
                    "cpu": CpuSplit.spent(cpu_before, cpu.snapshot(), repeat),
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
                derive(results)
                write(out, report)
        if not args.no_pushdown:
            report["pushdown"] = pushdown_queries(
                spark, data_dir, topic, os.path.join(work, "raw.parquet"), args
            )
            write(out, report)
        report["seconds_total"] = round(time.perf_counter() - started, 1)
        write(out, report)
    finally:
        broker.stop()
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {out}")
    plot(out, report)
    return 0


def plot(out: Path, d: dict) -> None:
    """``out`` with ``.png``: rows/s/core per path and view (Parquet of the same rows beside),
    CPU seconds per million rows split JVM / Python workers / broker, the pushdown queries."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no plot: matplotlib is not installed", file=sys.stderr)
        return
    views = [v for v in ("raw", "compacted") if v in d["results"]]
    pushdown = {k: v for k, v in (d.get("pushdown") or {}).items() if isinstance(v, dict)}
    ncols = max(1, len(views) + (1 if pushdown else 0))
    fig, axes = plt.subplots(2, ncols, figsize=(5.5 * ncols, 8), squeeze=False)
    for col, view in enumerate(views):
        res = d["results"][view]
        labels = list(res)
        ax = axes[0][col]
        speeds = [res[p]["rows_per_s_per_core"] for p in labels]
        ax.bar(
            range(len(labels)), speeds, color=["tab:gray" if p == "parquet" else "tab:blue" for p in labels]
        )
        for i, p in enumerate(labels):
            frac = res[p].get("fraction_of_parquet_speed")
            ax.text(
                i,
                speeds[i],
                f"{speeds[i] / 1000:.0f}k" + (f"\n{frac:.2f}x" if frac else ""),
                ha="center",
                va="bottom",
                fontsize=7,
            )
        ax.set_xticks(range(len(labels)), [p.replace("-", "\n") for p in labels], fontsize=7)
        ax.set_ylabel("rows/s/core (wall clock)")
        ax.set_title(f"{view}: {res[labels[0]]['rows']:,} rows", fontsize=9)
        ax = axes[1][col]
        bottom = [0.0] * len(labels)
        for part, color in (
            ("jvm", "tab:orange"),
            ("python_workers", "tab:green"),
            ("broker", "tab:purple"),
            ("driver_python", "tab:gray"),
        ):
            vals = [
                res[p]["cpu"][f"{part}_cpu_seconds"] / max(res[p]["rows"], 1) * 1e6 if "cpu" in res[p] else 0
                for p in labels
            ]
            ax.bar(range(len(labels)), vals, bottom=bottom, color=color, label=part.replace("_", " "))
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax.set_xticks(range(len(labels)), [p.replace("-", "\n") for p in labels], fontsize=7)
        ax.set_ylabel("CPU seconds per million rows")
        ax.set_title(f"{view}: where the CPU went", fontsize=9)
        ax.legend(fontsize=7)
    if pushdown:
        ax = axes[0][-1]
        labels, values = [], []
        for q, r in pushdown.items():
            labels += [f"{q}\nfull scan", f"{q}\npushed"]
            values += [r["full_scan"]["seconds"], r["pushed"]["seconds"]]
        ax.bar(range(len(labels)), values)
        ax.set_xticks(range(len(labels)), [label.replace("_", " ") for label in labels], fontsize=6)
        ax.set_ylabel("seconds")
        ax.set_title("pushdown against the full scan", fontsize=9)
        axes[1][-1].axis("off")
    load = d.get("load_average_at_start")
    fig.suptitle(
        f"compactmq Spark source, {d['messages']:,} messages, {d['keys']:,} keys, local[{d['cores']}]"
        + (f", load {load[0]} at start" if load else ""),
        fontsize=10,
    )
    fig.tight_layout()
    png = out.with_suffix(".png")
    fig.savefig(png, dpi=100)
    plt.close(fig)
    print(f"wrote {png}")


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

    from compactmq.spark import pushdown
    from compactmq.spark.options import parse_read_options
    from compactmq.spark.source import CompactMQFilteringReader, topic_schema

    opts = parse_read_options({"topic": topic, "view": view, "path": data_dir})
    schema = source_schema()
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
