"""Filters pushed into the source: what ``pushdown.push`` keeps, that a pushed read returns fewer
rows from the source, and that a filtered query equals the unfiltered one filtered afterwards."""

from __future__ import annotations

import datetime as dt
import time

import pytest
from hypothesis import given, settings, strategies as st
from pyspark.sql.datasource import EqualTo, GreaterThan, GreaterThanOrEqual, In, LessThan, LessThanOrEqual

from compactmq.spark.pushdown import Pushed, push

UTC = dt.timezone.utc
EVENT_T0 = 1_600_000_000_000
OPS = {
    GreaterThan: lambda a, b: a > b,
    GreaterThanOrEqual: lambda a, b: a >= b,
    LessThan: lambda a, b: a < b,
    LessThanOrEqual: lambda a, b: a <= b,
    EqualTo: lambda a, b: a == b,
}


def at(micros: int) -> dt.datetime:
    return dt.datetime(1970, 1, 1, tzinfo=UTC) + dt.timedelta(microseconds=micros)


def test_key_filters_intersect_and_other_filters_are_ignored():
    got = push(
        [
            In(("__key",), ("a", "b", None, "c")),
            EqualTo(("__key",), "b"),
            EqualTo(("value",), b"x"),
            GreaterThan(("__key",), "a"),
        ],
        "raw",
    )
    assert got == Pushed(keys=frozenset({"b"}))
    assert push([In(("__key",), ("a",)), In(("__key",), ("b",))], "latest").keys == frozenset()


def test_time_filters_are_not_pushed_into_latest_nor_read_from_naive_times():
    t = at(5_000_000)
    assert push([GreaterThan(("__publishTime",), t)], "latest") == Pushed()
    assert push([GreaterThan(("__publishTime",), t.replace(tzinfo=None))], "raw") == Pushed()
    assert push([GreaterThan(("__publishTime",), t)], "compacted").time_lo is not None


def test_event_times_and_message_ids_are_pushed_outside_latest_only():
    t = at(7_000_000)
    lo, hi = b"\x08\x03\x10\x01", b"\x08\x05"
    got = push(
        [
            GreaterThanOrEqual(("__eventTime",), t),
            LessThan(("__eventTime",), at(9_000_000)),
            GreaterThan(("__messageId",), lo),
            In(("__messageId",), (hi, b"\x08\x04", lo)),
        ],
        "compacted",
    )
    assert (got.event_lo, got.event_hi) == (6_999, 9_002)
    assert (got.id_lo, got.id_hi) == (lo, hi)  # the larger lower bound, the smaller upper one
    assert push([GreaterThan(("__eventTime",), t), EqualTo(("__messageId",), lo)], "latest") == Pushed()
    assert push([In(("__messageId",), (lo, "not bytes"))], "raw") == Pushed()


def test_a_key_that_shows_replacement_characters_is_not_pushed():
    """A key whose stored bytes are not UTF-8 reaches Spark with U+FFFD: its bytes are not what
    the string encodes to, so the source must not select by it (Spark filters it alone)."""
    assert push([EqualTo(("__key",), "a\ufffd")], "raw").keys is None
    assert push([In(("__key",), ("a", "b\ufffd"))], "raw").keys is None
    assert push([In(("__key",), ("a", None))], "raw").keys == frozenset({"a"})


@settings(max_examples=300, deadline=None)
@given(
    st.integers(0, 2**42),
    st.integers(-3000, 3000),
    st.sampled_from(list(OPS)),
    st.sampled_from(list(OPS)),
    st.integers(-3000, 3000),
)
def test_the_time_window_holds_every_row_spark_keeps(publish_ms, d1, op1, op2, d2):
    """Spark keeps a row when ``publish_ms * 1000 <op> micros`` for every filter: such a row is
    always inside the pushed window (a superset; Spark checks again)."""
    micros1 = publish_ms * 1000 + d1
    micros2 = publish_ms * 1000 + d2
    filters = [op1(("__publishTime",), at(micros1)), op2(("__publishTime",), at(micros2))]
    pushed = push(filters, "raw")
    if OPS[op1](publish_ms * 1000, micros1) and OPS[op2](publish_ms * 1000, micros2):
        assert pushed.time_lo is None or publish_ms >= pushed.time_lo
        assert pushed.time_hi is None or publish_ms < pushed.time_hi


@pytest.fixture
def pushing_spark(cmq_spark):
    """The session with the pushdown reader registered whatever the Spark version (restored after)."""
    import compactmq.spark

    compactmq.spark.register(cmq_spark, pushdown=True)
    yield cmq_spark
    compactmq.spark.register(cmq_spark)


@pytest.mark.spark
@pytest.mark.integration
def test_a_dataframe_filtered_once_still_reads_every_row_after(cmq_spark, broker, client, topic):
    """Spark up to 4.3 reuses a filtered scan's plan for a later unfiltered scan of the same
    DataFrame: ``register`` turns pushdown on only where it does not (and forcing it on shows why)."""
    import compactmq.spark

    from .helpers import produce

    produce(client, topic, [(f"k{i}", b"v") for i in range(5)])

    def counts():
        df = cmq_spark.read.format("compactmq").option("topic", topic).load(str(broker.data_dir))
        return df.where("__key = 'k1'").count(), df.count()

    assert counts() == (1, 5)
    scoped = compactmq.spark.pushdown_is_scan_scoped(cmq_spark)
    compactmq.spark.register(cmq_spark, pushdown=True)
    try:
        assert counts() == (1, 5 if scoped else 1)
    finally:
        compactmq.spark.register(cmq_spark)


# --- through the source -----------------------------------------------------------------------


def source_rows(broker, topic, view, filters, columnar=True):
    """Rows the source itself returns (before Spark filters again) for pushed ``filters``."""
    from compactmq.spark.options import parse_read_options
    from compactmq.spark.source import CompactMQFilteringReader, topic_schema

    opts = parse_read_options(
        {"topic": topic, "view": view, "path": str(broker.data_dir), "columnar": str(columnar).lower()}
    )
    from .helpers import source_schema

    schema = source_schema()
    reader = CompactMQFilteringReader(opts, schema, topic_schema(opts))
    assert list(reader.pushFilters(filters)) == filters  # all handed back to Spark
    rows = []
    for part in reader.partitions():
        for batch in reader.read(part):
            rows += batch.to_pylist()
    return rows


@pytest.mark.spark
@pytest.mark.integration
def test_pushed_filters_read_less_and_change_no_result(pushing_spark, broker, client, topic):
    from .helpers import compact, produce

    cmq_spark = pushing_spark
    items = [(f"k{i % 20}", f"a{i}".encode()) for i in range(100)]
    produce(client, topic, items, batching=True, event_times=[EVENT_T0 + i for i in range(100)])
    time.sleep(0.05)
    cut = dt.datetime.now(UTC)
    time.sleep(0.05)
    produce(client, topic, [(f"k{i % 10}", f"b{i}".encode()) for i in range(60)])
    compact(broker, topic)
    produce(client, topic, [(f"k{i % 7}", f"c{i}".encode()) for i in range(30)], batching=True)

    keys = In(("__key",), ("k3", "k11", "nope"))
    late = GreaterThanOrEqual(("__publishTime",), cut)
    for view in ("raw", "compacted", "latest"):
        everything = source_rows(broker, topic, view, [])
        for filters in ([keys], [late], [keys, late]):
            if view == "latest" and filters == [late]:
                continue
            pushed = source_rows(broker, topic, view, filters)
            assert len(pushed) < len(everything), (view, filters)
            assert source_rows(broker, topic, view, filters, columnar=False) == pushed

        def load():  # one DataFrame per query (see ``compactmq.spark.pushdown_is_scan_scoped``)
            return (
                cmq_spark.read.format("compactmq")
                .option("topic", topic)
                .option("view", view)
                .load(str(broker.data_dir))
                .selectExpr("*", "unix_micros(__publishTime) AS us", "unix_millis(__eventTime) AS et")
            )

        cut_us = (cut - dt.datetime(1970, 1, 1, tzinfo=UTC)) // dt.timedelta(microseconds=1)
        cond = "__key in ('k3', 'k11', 'nope')"
        if view != "latest":
            cond += f" and __publishTime >= timestamp_micros({cut_us})"
        filtered = load().where(cond)
        print(filtered._jdf.queryExecution().executedPlan().toString())
        got = sorted(map(tuple, filtered.collect()), key=repr)
        every = load().collect()
        want = [r for r in every if r["__key"] in ("k3", "k11") and (view == "latest" or r["us"] >= cut_us)]
        assert got == sorted(map(tuple, want), key=repr), view
        assert got
        if view == "latest":
            continue
        # event times and message ids (binary, compared byte by byte) through Spark itself
        ids = sorted(r["__messageId"] for r in every if r["et"] is not None)
        mid = ids[len(ids) // 2]
        cond = f"__messageId >= X'{mid.hex()}' and __eventTime >= timestamp_millis({EVENT_T0 + 40})"
        got = sorted(map(tuple, load().where(cond).collect()), key=repr)
        want = [
            r for r in every if r["__messageId"] >= mid and r["et"] is not None and r["et"] >= EVENT_T0 + 40
        ]
        assert got == sorted(map(tuple, want), key=repr), view
        assert got and len(got) < len(ids)
        pushed = source_rows(
            broker,
            topic,
            view,
            [
                GreaterThanOrEqual(("__messageId",), mid),
                GreaterThanOrEqual(("__eventTime",), dt.datetime.fromtimestamp((EVENT_T0 + 40) / 1000, UTC)),
            ],
        )
        assert len(got) <= len(pushed) < len(everything)


@pytest.mark.spark
@pytest.mark.integration
def test_a_time_window_skips_entries_by_the_ledger_index(broker, client, topic, monkeypatch):
    from compactmq.spark import entry_columns

    from .helpers import produce

    produce(client, topic, [(f"k{i}", b"early") for i in range(40)])
    time.sleep(0.05)
    cut = dt.datetime.now(UTC)
    time.sleep(0.05)
    produce(client, topic, [(f"k{i}", b"late") for i in range(25)])
    parsed = []
    real = entry_columns.parse_entries

    def counting(buf, offsets, *rest):
        parsed.append(len(offsets))
        return real(buf, offsets, *rest)

    monkeypatch.setattr(entry_columns, "parse_entries", counting)
    rows = source_rows(broker, topic, "raw", [GreaterThanOrEqual(("__publishTime",), cut)])
    assert sorted(r["value"] for r in rows) == [b"late"] * 25
    assert sum(parsed) == 25  # one entry per message: the 40 early ones were never parsed
    assert (
        source_rows(broker, topic, "raw", [GreaterThanOrEqual(("__publishTime",), cut)], columnar=False)
        == rows
    )
