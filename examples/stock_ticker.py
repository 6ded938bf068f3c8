"""Stock ticker: the case topic compaction exists for, end to end with the official client.

A ticker topic receives a price tick per symbol, again and again; a new consumer only wants the
*latest* price of each symbol. Without compaction it must rewind the whole history; with it, a
read-compacted reader (or a TableView) reads one message per symbol plus whatever arrived after
the last compaction.

What this script does:

1. publish ``--ticks`` ticks for ``--symbols`` symbols (key = symbol, value = JSON price);
2. trigger compaction through the admin REST API and wait for it, showing its progress;
3. rewind the topic from the start twice -- a plain reader (the whole history) and a
   read-compacted reader -- and build a TableView; each must give the latest price of every
   symbol;
4. print how much faster the compacted rewind was.

Run it against a running broker (``./scripts/standalone.sh``), or let it start one::

    .venv/bin/python examples/stock_ticker.py                      # broker on 6650 / 8080
    .venv/bin/python examples/stock_ticker.py --start-broker       # a throwaway broker of its own
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import pulsar


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--service-url", default="pulsar://127.0.0.1:6650")
    p.add_argument("--admin-url", default="http://127.0.0.1:8080")
    p.add_argument("--topic", default=None, help="default: a fresh persistent://public/default/ticker-<time>")
    p.add_argument("--symbols", type=int, default=300)
    p.add_argument("--ticks", type=int, default=200_000)
    p.add_argument(
        "--late-ticks",
        type=int,
        default=500,
        help="ticks published after the compaction (served from the topic, after the horizon)",
    )
    p.add_argument(
        "--start-broker",
        action="store_true",
        help="start a standalone broker in a temporary directory for the run",
    )
    return p.parse_args(argv)


# --- a throwaway broker (only with --start-broker) ---------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_broker(args) -> subprocess.Popen:
    data_dir = tempfile.mkdtemp(prefix="stock-ticker-")
    port, web = _free_port(), _free_port()
    cmd = [
        sys.executable,
        "-m",
        "compactmq.cli.main",
        "standalone",
        "--data-dir",
        data_dir,
        "--broker-port",
        str(port),
        "--web-port",
        str(web),
        "--log-level",
        "WARNING",
        "--config-override",
        "spark.ui.showConsoleProgress=false",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if "ready" not in line:
        raise SystemExit(f"the broker did not start: {line!r}")
    args.service_url, args.admin_url = f"pulsar://127.0.0.1:{port}", f"http://127.0.0.1:{web}"
    print(f"started a broker: {args.service_url} {args.admin_url} (data in {data_dir})")
    return proc


# --- admin REST ------------------------------------------------------------------------------------


def admin(args, method: str, path: str):
    req = urllib.request.Request(args.admin_url + path, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as e:
        raise SystemExit(f"{method} {path}: HTTP {e.code}: {e.read().decode()}") from None
    return json.loads(raw) if raw else None


def compact(args, topic: str) -> float:
    """Trigger compaction and wait for it, printing its progress; returns the seconds it took."""
    path = "/admin/v2/" + topic.replace("://", "/", 1) + "/compaction"
    t0 = time.monotonic()
    admin(args, "PUT", path)
    last = None
    while True:
        status = admin(args, "GET", path)
        prog = status.get("progress")
        line = (
            status["status"]
            if not prog
            else (
                f"{status['status']} {prog['phase']}: {prog['entriesProcessed']}/{prog['entriesTotal']} entries"
            )
        )
        if line != last:
            print(f"  compaction: {line}")
            last = line
        if status["status"] != "RUNNING":
            break
        time.sleep(0.5)
    if status["status"] != "SUCCESS":
        raise SystemExit(f"compaction failed: {status.get('lastError')}")
    return time.monotonic() - t0


# --- the case --------------------------------------------------------------------------------------


def publish(client, topic: str, symbols: list[str], ticks: int, latest: dict, seq0: int = 0) -> float:
    producer = client.create_producer(
        topic,
        batching_enabled=True,
        block_if_queue_full=True,
        batching_max_messages=1000,
        batching_max_publish_delay_ms=10,
    )
    rng = random.Random(42 + seq0)
    prices = {s: latest.get(s, {}).get("price", 100.0) for s in symbols}
    t0 = time.monotonic()
    for i in range(ticks):
        symbol = symbols[rng.randrange(len(symbols))]
        prices[symbol] = round(max(1.0, prices[symbol] * (1 + rng.gauss(0, 0.002))), 2)
        tick = {"symbol": symbol, "price": prices[symbol], "seq": seq0 + i}
        producer.send_async(json.dumps(tick).encode(), None, partition_key=symbol)
        latest[symbol] = tick
    producer.flush()
    producer.close()
    return time.monotonic() - t0


def rewind(client, topic: str, read_compacted: bool) -> tuple[dict, int, float]:
    """Read from the earliest message to the end; returns (latest per symbol, messages, seconds)."""
    t0 = time.monotonic()
    reader = client.create_reader(
        topic, pulsar.MessageId.earliest, is_read_compacted=read_compacted, receiver_queue_size=5000
    )
    latest: dict[str, dict] = {}
    n = 0
    try:
        while reader.has_message_available():
            msg = reader.read_next(10_000)
            n += 1
            latest[msg.partition_key()] = json.loads(msg.data())
    finally:
        reader.close()
    return latest, n, time.monotonic() - t0


def table_view(client, topic: str) -> tuple[dict, float]:
    t0 = time.monotonic()
    view = client.create_table_view(topic)
    table: dict[str, dict] = {}
    view.for_each(lambda key, value: table.__setitem__(key, json.loads(value)))
    seconds = time.monotonic() - t0
    view.close()
    return table, seconds


def main(argv=None) -> int:
    args = parse_args(argv)
    broker = start_broker(args) if args.start_broker else None
    topic = args.topic or f"persistent://public/default/ticker-{int(time.time())}"
    symbols = [f"SYM{i:04d}" for i in range(args.symbols)]
    client = pulsar.Client(
        args.service_url, operation_timeout_seconds=60, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    )
    try:
        latest: dict[str, dict] = {}
        print(f"publishing {args.ticks:,} ticks for {len(symbols)} symbols to {topic}")
        secs = publish(client, topic, symbols, args.ticks, latest)
        print(f"  {args.ticks / secs:,.0f} ticks/s")
        print("compacting")
        secs = compact(args, topic)
        print(f"  done in {secs:.1f}s")
        if args.late_ticks:
            # these land after the horizon: a compacted rewind still sees them, from the topic itself
            publish(client, topic, symbols, args.late_ticks, latest, seq0=args.ticks)
            print(f"published {args.late_ticks} more ticks after the compaction")

        full, n_full, t_full = rewind(client, topic, read_compacted=False)
        compacted, n_compacted, t_compacted = rewind(client, topic, read_compacted=True)
        table, t_table = table_view(client, topic)
        for name, view in (
            ("plain reader", full),
            ("read-compacted reader", compacted),
            ("TableView", table),
        ):
            if view != latest:
                wrong = sum(1 for s in latest if view.get(s) != latest[s])
                raise SystemExit(f"{name}: {wrong} of {len(latest)} symbols do not have their latest price")

        print()
        print(f"latest price of {len(latest)} symbols, rebuilt three ways (all agree):")
        print(f"  plain reader, whole history     {n_full:>9,} messages  {t_full:7.2f}s")
        print(f"  read-compacted reader           {n_compacted:>9,} messages  {t_compacted:7.2f}s")
        print(f"  TableView                       {len(table):>9,} keys      {t_table:7.2f}s")
        print(
            f"the compacted rewind was {t_full / max(t_compacted, 1e-6):.1f}x faster "
            f"({n_full / max(n_compacted, 1):.0f}x fewer messages)"
        )
        for s in symbols[:3]:
            print(f"  {s}: {compacted[s]['price']:.2f} (tick #{compacted[s]['seq']})")
    finally:
        client.close()
        if broker is not None:
            broker.terminate()
            broker.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
