"""Pushdown over random topics: for random histories (batched and not, tombstones, keyless
messages, event times, several ledgers, a compaction at a random point, a tail after it) and
random pushed filters on ``__key``, ``__publishTime``, ``__eventTime`` and ``__messageId``, the
rows the source returns, filtered as Spark filters them, equal every row of the unfiltered read
filtered the same way -- never a row lost -- and the source decodes no more messages than the
unfiltered read (fewer where the filters let it skip: the key index, the ledger index, the id
prefixes). Topics are written straight into a data directory and compacted in this process."""

from __future__ import annotations

import contextlib
import datetime as dt
import shutil
import tempfile

import pytest
from compaction import entries as E
from hypothesis import HealthCheck, Phase, given, settings, strategies as st
from pyspark.sql.datasource import EqualTo, GreaterThan, GreaterThanOrEqual, In, LessThan, LessThanOrEqual

from compactmq.config import load_config
from compactmq.protocol import pulsar_pb2 as pb
from compactmq.spark import pushdown
from compactmq.spark.messages import serialize_message_id
from compactmq.spark.prune import side
from compactmq.storage import Storage

from .helpers import source_schema

TOPIC = "persistent://public/default/pushdown-topics"
UTC = dt.timezone.utc
T0 = 1_700_000_000_000  # ms
KEYS = ["a", "b", "c", "dd", "e"]
OPS = {
    EqualTo: lambda a, b: a == b,
    GreaterThan: lambda a, b: a > b,
    GreaterThanOrEqual: lambda a, b: a >= b,
    LessThan: lambda a, b: a < b,
    LessThanOrEqual: lambda a, b: a <= b,
}


def at(ms: int, us: int = 0) -> dt.datetime:
    return dt.datetime(1970, 1, 1, tzinfo=UTC) + dt.timedelta(milliseconds=ms, microseconds=us)


def micros(value: dt.datetime | None) -> int | None:
    if value is None:
        return None
    return (value - dt.datetime(1970, 1, 1, tzinfo=UTC)) // dt.timedelta(microseconds=1)


def spark_keeps(row: dict, f) -> bool:
    """Spark's verdict on one row (a null compared with anything is not kept)."""
    column = f.attribute[0]
    value = row[column]
    if column in ("__publishTime", "__eventTime"):
        value = micros(value)
    if value is None:
        return False
    if isinstance(f, In):
        wanted = [micros(v) if isinstance(v, dt.datetime) else v for v in f.value]
        return value in wanted
    bound = micros(f.value) if isinstance(f.value, dt.datetime) else f.value
    return OPS[type(f)](value, bound)


def spark_filter(rows: list, filters: list) -> list:
    return sorted((r for r in rows if all(spark_keeps(r, f) for f in filters)), key=repr)


SCHEMA = source_schema()  # the source's schema of a topic without a schema


# --- random topics ----------------------------------------------------------------------------

message = st.tuples(st.sampled_from([*KEYS, None]), st.sampled_from([b"", b"v", b"value"]), st.integers(0, 3))


@st.composite
def entries(draw):
    """``(entry bytes, publish ms)``: single messages and batches, publish times that mostly grow."""
    out = []
    t = T0
    for _ in range(draw(st.integers(1, 30))):
        t += draw(st.sampled_from([0, 1, 7, 1000, 60_000]))
        if draw(st.booleans()):
            key, value, et = draw(message)
            out.append((E.single(key, value, event_time=et and T0 + et * 500, publish_time=t), t))
        else:
            ms = [
                (k, v, et and T0 + et * 500) for k, v, et in draw(st.lists(message, min_size=1, max_size=4))
            ]
            out.append((E.batch(ms, codec=draw(st.sampled_from([pb.NONE, pb.LZ4])), publish_time=t), t))
    return out


@contextlib.contextmanager
def topic_dir(per_ledger: int):
    data_dir = tempfile.mkdtemp(prefix="cmq-pushdown-")
    cfg = load_config(
        overrides={"managedLedgerMaxEntriesPerLedger": per_ledger, "managedLedgerSyncData": False}
    )
    storage = Storage(data_dir, cfg)
    try:
        yield storage, cfg
    finally:
        storage.close()
        shutil.rmtree(data_dir, ignore_errors=True)


def write(storage, cfg, before: list, after: list, compact: bool, per_ledger: int) -> None:
    """Append ``before``, compact (when ``compact``), append ``after``: ``per_ledger`` entries
    per append (one append lands in one ledger, so ledgers roll over between appends)."""
    from compactmq.compaction.jobs import SparkCompactionService

    ml = storage.open_managed_ledger(TOPIC)

    def append(items):
        for i in range(0, len(items), per_ledger):
            part = items[i : i + per_ledger]
            ml.append_many([e for e, _ in part], [t for _, t in part])

    append(before)
    if compact:
        SparkCompactionService(storage, TOPIC, cfg).compact()
    append(after)


def source_rows(data_dir: str, view: str, filters: list, columnar: bool = True) -> tuple[list, int]:
    """(rows the source returns for pushed ``filters``, messages it decoded)."""
    from compactmq.spark.options import parse_read_options
    from compactmq.spark.source import CompactMQFilteringReader, topic_schema

    opts = parse_read_options(
        {"topic": TOPIC, "view": view, "path": data_dir, "columnar": str(columnar).lower()}
    )
    schema = SCHEMA
    reader = CompactMQFilteringReader(opts, schema, topic_schema(opts))
    assert list(reader.pushFilters(filters)) == filters  # all handed back to Spark
    before = pushdown.STATS["messages_read"]
    rows = []
    for part in reader.partitions():
        for batch in reader.read(part):
            rows += batch.to_pylist()
    return rows, pushdown.STATS["messages_read"] - before


# --- random filters, at the topic's own values -----------------------------------------------


def filters_near(times: list, events: list):
    """Filters whose values sit on and next to the topic's own keys, publish and event times and
    ids (where an off-by-one in the source would show). A fresh data directory numbers its
    ledgers from 0 up, so small ledger and entry ids are the topic's own."""
    near = st.sampled_from([-1000, -1, 0, 1, 999, 1000])

    def timestamp(pool):
        return st.builds(lambda ms, d: at(ms, d), st.sampled_from(sorted(set(pool)) or [T0]), near)

    an_id = st.builds(
        lambda lid, eid, bi, cut: serialize_message_id(lid, eid, bi)[: -1 if cut else None],
        st.integers(0, 12),
        st.integers(0, 8),
        st.sampled_from([-1, 0, 1, 3]),
        st.booleans(),  # cut: a shorter id (a prefix)
    )
    op = st.sampled_from(list(OPS))
    key = st.sampled_from([*KEYS, "zz"])
    return st.one_of(
        st.builds(lambda k: EqualTo(("__key",), k), key),
        st.builds(lambda ks: In(("__key",), tuple(ks)), st.lists(key, min_size=1, max_size=3)),
        st.builds(lambda o, v: o(("__publishTime",), v), op, timestamp(times)),
        st.builds(lambda o, v: o(("__eventTime",), v), op, timestamp(events)),
        st.builds(lambda o, v: o(("__messageId",), v), op, an_id),
        st.builds(lambda vs: In(("__messageId",), tuple(vs)), st.lists(an_id, min_size=1, max_size=3)),
    )


@st.composite
def histories(draw):
    """``(before, after, per_ledger, compact, queries)``: a topic and filter sets near its values."""
    before, after = draw(entries()), draw(entries())
    times = [t for _, t in before + after]
    events = [T0 + et * 500 for et in range(1, 4)]
    queries = draw(
        st.lists(st.lists(filters_near(times, events), min_size=1, max_size=3), min_size=6, max_size=10)
    )
    return before, after, draw(st.integers(1, 6)), draw(st.booleans()), queries


@pytest.mark.spark
@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    phases=[Phase.explicit, Phase.reuse, Phase.generate],  # each example compacts: no shrinking
)
@given(history=histories())
def test_pushed_reads_equal_the_unfiltered_read_filtered_by_spark(spark, history):
    before, after, per_ledger, compact, queries = history
    with topic_dir(per_ledger) as (storage, cfg):
        write(storage, cfg, before, after, compact, per_ledger)
        data_dir = str(storage.data_dir)
        for view in ("raw", "compacted", "latest"):
            everything, read_all = source_rows(data_dir, view, [])
            for fs in queries:
                got, read = source_rows(data_dir, view, fs)
                assert spark_filter(got, fs) == spark_filter(everything, fs), (view, fs)
                assert read <= read_all, (view, fs)
                assert len(got) <= len(everything)


# --- what is skipped --------------------------------------------------------------------------


@settings(max_examples=500, deadline=None)
@given(st.binary(min_size=1, max_size=6), st.binary(max_size=8), st.binary(max_size=4))
def test_side_says_where_every_extension_of_a_prefix_sorts(prefix, bound, rest):
    s = side(prefix, bound)
    x = prefix + rest + b"\x00"  # an id is always longer than its ledger or entry prefix
    if s < 0:
        assert x < bound
    elif s > 0:
        assert x > bound


@pytest.mark.spark
def test_keys_time_windows_and_ids_read_only_what_they_need(spark):
    """Ten keys of a compacted topic are read through its key index (not a scan of the view); a
    time window skips the ledgers outside it; an id range skips ledgers by their id prefix."""
    per_key = [
        (E.single(f"k{i % 50}", f"v{i}".encode(), publish_time=T0 + i * 1000), T0 + i * 1000)
        for i in range(400)
    ]
    with topic_dir(40) as (storage, cfg):
        write(storage, cfg, per_key, [], True, 40)
        data_dir = str(storage.data_dir)
        wanted = In(("__key",), tuple(f"k{i}" for i in range(10)))
        for view in ("compacted", "latest"):
            rows, read = source_rows(data_dir, view, [wanted])
            assert sorted(r["__key"] for r in rows) == sorted(f"k{i}" for i in range(10))
            assert read == 10, view  # the ten entries the key index named, nothing else
            assert source_rows(data_dir, view, [wanted], columnar=False)[0] == rows
        window = [
            GreaterThanOrEqual(("__publishTime",), at(T0 + 99_500)),
            LessThan(("__publishTime",), at(T0 + 139_500)),
        ]
        rows, read = source_rows(data_dir, "raw", window)
        assert len(rows) == 40 and read == 40  # 10 ledgers of 40 entries: one read, no more
        ledgers = sorted({r["__messageId"][:2] for r in source_rows(data_dir, "raw", [])[0]})
        third = source_rows(data_dir, "raw", [])[0][85]["__messageId"]
        rows, read = source_rows(data_dir, "raw", [GreaterThanOrEqual(("__messageId",), third)])
        assert len(rows) == len([r for r in source_rows(data_dir, "raw", [])[0] if r["__messageId"] >= third])
        assert read < 400 and len(ledgers) > 2
