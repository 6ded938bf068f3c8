"""Stock ticker on Spark: the latest price of every symbol as a DataFrame, joined with a static table.

The ticker topic (key = symbol, value = JSON tick, as in ``stock_ticker.py``) is read with the
``compactmq`` Spark format and ``view=latest``: one row per symbol, right whether or not compaction
has run yet. The JSON value is parsed into columns and joined with a small static table of companies
(sector, shares outstanding) to get each sector's market value. No client loop, no JVM jar.

    .venv/bin/python examples/stock_ticker_spark.py --start-broker         # a throwaway broker
    .venv/bin/python examples/stock_ticker_spark.py                        # broker on 6650 / 8080
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pulsar
from stock_ticker import publish, start_broker

SECTORS = ("tech", "energy", "health", "finance")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--service-url", default="pulsar://127.0.0.1:6650")
    p.add_argument("--admin-url", default="http://127.0.0.1:8080")
    p.add_argument("--symbols", type=int, default=50)
    p.add_argument("--ticks", type=int, default=20_000)
    p.add_argument("--start-broker", action="store_true", help="start a throwaway broker of its own")
    args = p.parse_args(argv)
    proc = start_broker(args) if args.start_broker else None
    try:
        return run(args)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)


def run(args) -> int:
    from pyspark.sql import functions as F

    import compactmq.spark
    from compactmq.compaction.jobs.session import get_session

    topic = f"persistent://public/default/ticker-spark-{int(time.time())}"
    symbols = [f"SYM{i:03d}" for i in range(args.symbols)]
    client = pulsar.Client(args.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    latest: dict = {}
    publish(client, topic, symbols, args.ticks, latest)
    client.close()
    print(f"published {args.ticks} ticks for {len(symbols)} symbols to {topic}")

    spark = get_session()  # local; Python workers run this interpreter (PYSPARK_PYTHON)
    compactmq.spark.register(spark)
    prices = (
        spark.read.format("compactmq")
        .option("service.url", args.service_url)
        .option("admin.url", args.admin_url)
        .option("topic", topic)
        .option("view", "latest")
        .load()
        .select(
            F.from_json(F.col("value").cast("string"), "symbol string, price double, seq long").alias("tick"),
            "__publishTime",
        )
        .select("tick.*", "__publishTime")
    )
    companies = spark.createDataFrame(
        [(s, SECTORS[i % len(SECTORS)], 1_000_000 * (i + 1)) for i, s in enumerate(symbols)],
        "symbol string, sector string, shares long",
    )
    board = prices.join(companies, "symbol").withColumn("market_value", F.col("price") * F.col("shares"))
    board.orderBy(F.desc("market_value")).show(5)
    board.groupBy("sector").agg(
        F.count("*").alias("symbols"), F.sum("market_value").alias("market_value")
    ).orderBy("sector").show()

    got = {r["symbol"]: r["price"] for r in prices.collect()}
    want = {s: t["price"] for s, t in latest.items()}
    ok = got == want
    print(f"latest price of every symbol matches what was published last: {ok}")
    spark.stop()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
