"""Draw the benchmark results in bench/results/*.json as PNGs beside them.

    .venv/bin/pip install matplotlib   # only the plots need it (pip install -e ".[bench]")
    .venv/bin/python bench/plot.py

One figure per benchmark, for the comparisons a person would rather see than read: compaction
time against its baselines, read-compacted against plain rewinds, broker throughput, and
storage against plain file I/O. A result file that is missing is skipped with a note.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def _load(name: str):
    path = RESULTS / f"{name}.json"
    if not path.exists():
        print(f"skip {name}: {path} not found (run bench/{name}_bench.py first)")
        return None
    return json.loads(path.read_text())


def _bars(ax, labels, values, fmt):
    bars = ax.bar(labels, values, color=["#4c72b0", "#dd8452", "#55a868", "#c44e52"][: len(values)])
    for bar, v in zip(bars, values):
        ax.annotate(
            fmt(v),
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=8,
        )


def _seconds(lay: dict, *path: str):
    """``lay[path[0]][path[1]]...`` as a number, or None when an older (or newer) result file
    does not record it."""
    value = lay
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value if isinstance(value, (int, float)) else None


def plot_compaction(plt, d) -> None:
    """Compaction time per layout against its baselines; a bar whose figure the result file
    lacks (the baselines were dropped from later runs, the incremental run added) is left out."""
    layouts = d.get("layouts") or {}
    if not layouts:
        print("skip compaction: no layouts in the result file")
        return
    fig, axes = plt.subplots(1, len(layouts), figsize=(5 * len(layouts), 4), squeeze=False)
    for ax, (name, lay) in zip(axes[0], layouts.items()):
        bars = [
            ("read input\nonce", _seconds(lay, "read_input_once", "seconds")),
            ("Spark\n(warm median)", _seconds(lay, "full_median_seconds")),
            ("incremental\n(+1 % new)", _seconds(lay, "incremental_median_seconds")),
            ("plain Python\ntwo-pass dict", _seconds(lay, "python_dict_dedup", "seconds")),
        ]
        present = [(label, v) for label, v in bars if v is not None]
        _bars(ax, [label for label, _ in present], [v for _, v in present], lambda v: f"{v:.1f}s")
        rate = _seconds(lay, "full_median_messages_per_second")
        ax.set_title(name if rate is None else f"{name}: {rate / 1e6:.1f} M msg/s")
        ax.set_ylabel("seconds")
        ax.tick_params(axis="x", labelsize=8)
    p = d.get("params") or {}
    if "messages" in p and "keys" in p:
        fig.suptitle(f"compaction of {p['messages'] / 1e6:.0f} M messages, {p['keys'] / 1e6:.0f} M keys")
    _save(plt, fig, "compaction")


def plot_read_compacted(plt, d) -> None:
    rows = d["results"]
    fig, ax = plt.subplots(figsize=(6, 4))
    labels, values = [], []
    for r in rows:
        labels += [f"plain\n{r['mode']}", f"compacted\n{r['mode']}"]
        values += [r["plain_reader"]["seconds"], r["compacted_reader"]["seconds"]]
    _bars(ax, labels, values, lambda v: f"{v:.2f}s")
    ax.set_ylabel("seconds from earliest to end")
    first = rows[0]
    ax.set_title(
        f"rewind {first['messages'] / 1e6:.0f} M messages, {first['keys']:,} keys: "
        + ", ".join(f"{r['mode']} {r['speedup']:.0f}x" for r in rows)
    )
    _save(plt, fig, "read_compacted")


def plot_broker(plt, d) -> None:
    rows = d["results"]
    fig, ax = plt.subplots(figsize=(6, 4))
    _bars(
        ax,
        [r["scenario"].replace("_", "\n") for r in rows],
        [r["msgs_per_s"] / 1000 for r in rows],
        lambda v: f"{v:.0f}k",
    )
    ax.set_ylabel("thousand messages/s (official client)")
    ax.set_title("broker throughput, 100-byte messages")
    _save(plt, fig, "broker")


def plot_storage(plt, d) -> None:
    res = d["results"]
    fig, ax = plt.subplots(figsize=(7, 4))
    # reads compare with a plain reader that also cuts the file into one bytes object per entry
    labels = [
        k.replace("_", "\n") + ("\n(vs plain split)" if "ratio_vs_plain_split_median" in v else "")
        for k, v in res.items()
    ]
    values = [v.get("ratio_vs_plain_split_median", v["ratio_median"]) for v in res.values()]
    _bars(ax, labels, values, lambda v: f"{v:.2f}x")
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax.set_ylabel("storage / plain file I/O (median)")
    ax.set_title("storage engine against plain file I/O, same sync policy")
    _save(plt, fig, "storage")


def plot_latest_value(plt, d, name: str = "latest_value") -> None:
    """GET latency percentiles of ``latest_value_bench`` against the issue's goal (p50 2 ms, p99 20 ms)."""
    r = d["result"]
    cdf = r["get"].get("cdf_ms")
    if not cdf:
        print(f"skip {name}: no latency percentiles (rerun bench/latest_value_bench.py)")
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([float(p) for p in cdf], list(cdf.values()), marker="o", label="GET .../latest/{key}")
    ax.scatter([50, 99], [2, 20], color="#c44e52", marker="x", zorder=3, label="goal (p50, p99)")
    ax.set_yscale("log")
    ax.set_xlabel("percentile")
    ax.set_ylabel("ms per key (HTTP round trip)")
    ax.set_title(
        f"latest value: {r['messages']:,} messages, {r['keys']:,} keys, "
        f"{r['tail_messages']:,} in the tail, load {r['load_average_1m']}",
        fontsize=9,
    )
    ax.legend(fontsize=8)
    _save(plt, fig, name)


def plot_many_topics(plt, d) -> None:
    """Total time from the policy to the last SUCCESS against the number of due topics, per mode."""
    fig, ax = plt.subplots(figsize=(6, 4))
    modes: dict = {}
    for r in d["runs"]:
        modes.setdefault(r["mode"], []).append((r["topics"], r["policy_to_all_success_seconds"]))
    for mode, points in modes.items():
        points.sort()
        xs, ys = [p[0] for p in points], [p[1] for p in points]
        ax.plot(xs, ys, marker="o", label=mode)
        for x, y in points:
            ax.annotate(f"{y:.1f}s", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("topics due at once")
    ax.set_ylabel("seconds, policy to the last SUCCESS")
    p = d["params"]
    ax.set_title(
        f"{p['messages_per_topic']:,} messages / {p['keys_per_topic']:,} keys per topic", fontsize=10
    )
    ax.legend(fontsize=8)
    _save(plt, fig, "many_topics")


def plot_spark_source(plt, d, name: str = "spark_source") -> None:
    """``spark_source_bench``: rows/s/core per path and view (Parquet of the same rows beside),
    and the pushdown queries against the full scans they narrow."""
    views = [v for v in ("raw", "compacted") if v in d["results"]]
    pushdown = {k: v for k, v in (d.get("pushdown") or {}).items() if isinstance(v, dict)}
    fig, axes = plt.subplots(
        1, len(views) + (1 if pushdown else 0), figsize=(5 * (len(views) + 1), 4), squeeze=False
    )
    for ax, view in zip(axes[0], views):
        res = d["results"][view]
        labels = list(res)
        _bars(
            ax,
            [label.replace("-", "\n") for label in labels],
            [res[p]["rows_per_s_per_core"] for p in labels],
            lambda v: f"{v / 1000:.0f}k",
        )
        ax.set_title(f"{view}: {res[labels[0]]['rows']:,} rows", fontsize=9)
        ax.set_ylabel("rows/s/core")
        ax.tick_params(axis="x", labelsize=8)
    if pushdown:
        ax = axes[0][-1]
        labels, values = [], []
        for q, r in pushdown.items():
            labels += [f"{q}\nfull scan", f"{q}\npushed"]
            values += [r["full_scan"]["seconds"], r["pushed"]["seconds"]]
        _bars(ax, [label.replace("_", " ") for label in labels], values, lambda v: f"{v:.1f}s")
        ax.set_ylabel("seconds")
        ax.set_title("pushdown against the full scan", fontsize=9)
        ax.tick_params(axis="x", labelsize=6)
    load = d.get("load_average_at_start")
    fig.suptitle(
        f"compactmq Spark source, {d['messages']:,} messages, {d['keys']:,} keys, local[{d['cores']}]"
        + (f", load {load[0]} at start" if load else ""),
        fontsize=10,
    )
    _save(plt, fig, name)


def plot_cluster(plt, d, name: str = "cluster") -> None:
    """``cluster_bench``: publish throughput and latency, single node against the cluster; the
    spread of topics over the brokers; each failover (SIGKILL to the next publish)."""
    single, cl = d["single_node"], d["cluster"]
    fig, axes = plt.subplots(1, 4, figsize=(19, 4))
    labels = ["single node\n1 topic, batched", "cluster\n1 topic, batched"]
    values = [single["throughput"]["msgs_per_s"] / 1000, cl["throughput"]["msgs_per_s"] / 1000]
    title = f"publish: {cl['throughput']['object_writes_per_s']:.0f} object writes/s (1 topic)"
    if "many_topics" in cl:
        n = cl["many_topics"]["topics"]
        labels += [f"single node\n{n} topics", f"cluster\n{n} topics"]
        values += [single["many_topics"]["msgs_per_s"] / 1000, cl["many_topics"]["msgs_per_s"] / 1000]
        title += f", {cl['many_topics']['object_writes_per_s']:.0f}/s ({n} topics)"
    _bars(axes[0], labels, values, lambda v: f"{v:.1f}k")
    axes[0].set_ylabel("thousand messages/s")
    axes[0].tick_params(axis="x", labelsize=7)
    axes[0].set_title(title, fontsize=9)
    labels, values = [], []
    for q in ("p50", "p99"):
        labels += [f"single\n{q}", f"cluster\n{q}"]
        values += [single["latency"][f"{q}_ms"], cl["latency"][f"{q}_ms"]]
    _bars(axes[1], labels, values, lambda v: f"{v:.1f}")
    axes[1].set_ylabel("ms per synchronous send")
    axes[1].set_title(f"publish latency, {cl['latency']['sends']:,} sends, batching off", fontsize=9)
    ax = axes[2]
    width = 0.8 / len(cl["spread"])
    for k, sp in enumerate(cl["spread"]):
        xs = [i + k * width for i in range(len(sp["topics_per_broker"]))]
        ax.bar(xs, sp["topics_per_broker"], width, label=f"{sp['namespace']} ({sp['bundles']} bundles)")
    ax.set_xticks(
        [i + width * (len(cl["spread"]) - 1) / 2 for i in range(3)], ["broker 0", "broker 1", "broker 2"]
    )
    ax.set_ylabel("topics owned (by lookup)")
    ax.set_title(f"spread of {cl['spread'][0]['topics']} topics", fontsize=9)
    ax.legend(fontsize=7)
    fo = cl["failover"]
    ax = axes[3]
    ax.plot(range(1, len(fo["failover_s"]) + 1), fo["failover_s"], marker="o")
    ax.axhline(fo["failover_median_s"], color="grey", linestyle="--", linewidth=0.8)
    ax.axhline(cl["session_timeout_ms"] / 1000, color="#c44e52", linestyle=":", linewidth=0.8)
    ax.set_xticks(range(1, len(fo["failover_s"]) + 1))
    ax.set_xlabel("SIGKILL of the owner")
    ax.set_ylabel("s to the next publish")
    ax.set_title(
        f"failover: median {fo['failover_median_s']:.2f} s (session {cl['session_timeout_ms'] / 1000:g} s), "
        f"lost {fo['lost']}, dup {fo['duplicated']}",
        fontsize=9,
    )
    stored = cl["stored_after_unload"]
    fig.suptitle(
        f"compactmq cluster ({d['mode']} run, {d['params']['message_bytes']}-byte messages): "
        f"{stored['objects_per_gb']} objects/GB once sealed "
        f"({cl['stored_after_publish']['objects_per_gb']} while open); "
        f"load {d['load_average_before']} on {d['cpus']} CPUs",
        fontsize=10,
    )
    _save(plt, fig, name)


def plot_publish_ceiling(plt, d, name: str = "publish_probe_null_ceiling") -> None:
    """``publish_probe.py --null --null-hold ...``: the official client's unbatched publish
    rate against each broker of the run (every round a dot, the median a bar), with the client's
    CPU per message beside it -- what a broker that stores nothing lets the client reach."""
    results = d["results"]
    labels = list(results)
    rates = [[r["run"]["msgs_per_s"] / 1000 for r in results[k]] for k in labels]
    client = [[r["client_threads"]["total_cpu_us_per_msg"] for r in results[k]] for k in labels]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for ax, series, title, fmt in (
        (ax1, rates, "publish, batching off (k msg/s, whole run)", lambda v: f"{v:.1f}"),
        (ax2, client, "official client's CPU per message (us)", lambda v: f"{v:.0f}"),
    ):
        medians = [statistics.median(v) for v in series]
        _bars(ax, labels, medians, fmt)
        for i, values in enumerate(series):
            ax.plot([i] * len(values), values, "k.", markersize=4)
        ax.set_title(title, fontsize=10)
        ax.tick_params(axis="x", labelrotation=20)
    fig.suptitle("the client's ceiling: a null broker (answers at once, or reads held N ms) and this broker")
    _save(plt, fig, name)


def _save(plt, fig, name: str) -> None:
    fig.tight_layout()
    out = RESULTS / f"{name}.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    print(f"wrote {out}")


def main() -> int:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("bench/plot.py needs matplotlib: .venv/bin/pip install matplotlib", file=sys.stderr)
        return 1
    only = set(sys.argv[1:])  # names of the results to draw (none: all)
    for name, draw in (
        ("compaction", plot_compaction),
        ("read_compacted", plot_read_compacted),
        ("broker", plot_broker),
        ("storage", plot_storage),
        ("latest_value", plot_latest_value),
        ("latest_value_quick", lambda plt, d: plot_latest_value(plt, d, "latest_value_quick")),
        ("many_topics", plot_many_topics),
        ("spark_source_1m", lambda plt, d: plot_spark_source(plt, d, "spark_source_1m")),
        ("cluster", plot_cluster),
        ("publish_probe_null_ceiling", plot_publish_ceiling),
    ):
        if only and name not in only:
            continue
        d = _load(name)
        if d is None:
            continue
        try:
            draw(plt, d)
        except (
            KeyError,
            TypeError,
            IndexError,
        ) as e:  # a result file of another shape: the others still draw
            print(f"skip {name}: the result file lacks a field the figure needs ({type(e).__name__}: {e})")
            plt.close("all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
