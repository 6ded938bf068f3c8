"""How a read is cut into Spark tasks: equal shares of a compacted view through the broker too.

The direct path cuts a compacted view by index in the compacted ledger; the broker shows no index,
so a broker split is a range of source entry ids, cut where probes found the view's entries
(``broker.probe_view``). A view whose survivors gather at the end of the log must still be shared
evenly between tasks, and the pieces together must hold exactly the view.
"""

from __future__ import annotations

import pytest

from compactmq.spark import plan as P

from .helpers import compact, produce, read_all, source_schema

T = "persistent://public/default/t"


def broker_split(lo, hi, spans, ledger=3):
    return P.Split(T, -1, "compacted", ledger_id=ledger, lo=lo, hi=hi, view="compacted", spans=spans)


def test_a_probed_split_is_cut_at_equal_shares_of_its_view_entries():
    # 1000 source entries, the view's entries in the last 100: two tasks get 50 each, not 0 and 100
    s = broker_split(0, 1000, ((900, 1000),))
    pieces = P.balance([s], 2, 0)
    assert [(p.lo, p.hi) for p in pieces] == [(0, 950), (950, 1000)]
    assert [P._size(p) for p in pieces] == [50, 50]
    assert pieces[0].end_id == (3, 950, -1) and pieces[1].end_id == s.end_id
    # two dense stretches: the shares follow the entries, not the ids
    s = broker_split(0, 1000, ((100, 140), (800, 1000)))
    assert [P._size(p) for p in P.balance([s], 4, 0)] == [60, 60, 60, 60]
    # maxRecordsPerPartition counts the view's entries too
    assert [P._size(p) for p in P.balance([s], 0, 100)] == [80, 80, 80]
    # not probed: cut evenly by ids, as before
    assert [(p.lo, p.hi) for p in P.balance([broker_split(0, 1000, None)], 2, 0)] == [(0, 500), (500, 1000)]


def test_splits_that_hold_nothing_do_not_count_towards_min_partitions():
    # the view's part before the first retained ledger (never cut, size 0) and a ledger the probes
    # found empty leave the one ledger with entries to be cut in two
    before = broker_split(0, 0, None, ledger=-1)
    empty = broker_split(0, 500, (), ledger=2)
    full = broker_split(0, 1000, ((0, 1000),))
    pieces = P.balance([before, empty, full], 2, 0)
    assert [(p.ledger_id, p.lo, p.hi) for p in pieces] == [
        (-1, 0, 0),
        (2, 0, 500),
        (3, 0, 500),
        (3, 500, 1000),
    ]


@pytest.mark.spark
@pytest.mark.integration
def test_a_view_gathered_at_the_end_of_the_log_is_shared_evenly_through_the_broker(
    spark, broker, client, topic, monkeypatch
):
    from compactmq.spark import broker as B
    from compactmq.spark.options import parse_read_options
    from compactmq.spark.source import backend_args, open_backend, plan_read, read_split_batches
    from compactmq.spark.values import TopicSchema

    # 30 keys written four times, one message per entry: the view is the last 30 of 120 entries
    produce(client, topic, [(f"k{i % 30}", b"v%d" % i) for i in range(120)])
    compact(broker, topic)
    expected = sorted(read_all(client, topic, compacted=True), key=lambda x: x[2:])
    assert len(expected) == 30
    monkeypatch.setattr(B, "PROBE_MIN_ENTRIES", 1)  # probe a view this small
    opts = parse_read_options(
        {
            "topic": topic,
            "view": "compacted",
            "minPartitions": "3",
            "service.url": broker.url,
            "admin.url": f"http://127.0.0.1:{broker.web_port}",
        }
    )
    backend = open_backend(opts)
    try:
        splits = plan_read(opts, backend)
        args = backend_args(backend)
    finally:
        backend.close()
    schema = source_schema()
    from compactmq.spark.messages import deserialize_message_id

    per_split = []
    for s in splits:
        rows = []
        for batch in read_split_batches(s, args, schema, TopicSchema()):
            for r in batch.to_pylist():
                ledger, entry, index, _ = deserialize_message_id(r["__messageId"])
                rows.append((r["__key"], r["value"], ledger, entry, index))
        per_split.append(rows)
    assert sorted((r for rows in per_split for r in rows), key=lambda x: x[2:]) == expected
    sizes = sorted(len(rows) for rows in per_split if rows)
    assert sizes == [10, 10, 10], [(s.ledger_id, s.lo, s.hi, s.spans) for s in splits]
